/* router/config/config_policy.c: what the config says the routing policy is: the options every
 * worker's replica is made with, and that a reload tunes them to. */
#include "config.h"

void pcr_config_policy_opts(const pcr_config_t *cfg, unsigned nworkers, pcr_policy_opts_t *o)
{
    pcr_policy_opts_default(o);
    o->kind = cfg->routing.policy;
    o->block_bytes = cfg->routing.block_bytes;
    o->max_prefix_bytes = cfg->routing.max_prefix_bytes;
    o->index_max_bytes = cfg->routing.index_max_bytes;
    o->load_factor = cfg->routing.load_factor;
    o->load_weight = cfg->routing.load_weight;
    o->zone_penalty = cfg->routing.zone_penalty;
    o->zone = cfg->routing.zone;
    o->vnodes = cfg->routing.vnodes;
    o->unavailable_keep = (uint64_t)cfg->routing.unavailable_keep_ms * 1000; /* now is in us */
    o->index_events = cfg->routing.index_events;
    o->kv_block_tokens = cfg->routing.kv_block_tokens;
    /* The workers' replicas see each other's decisions only at their next one: two at the same
     * moment may both take a pod's last request under the share bound, so each keeps one
     * request in hand per other worker (what was seen live: docs/TUNING.md). */
    o->share_margin = nworkers > 1 ? nworkers - 1 : 0;
}
