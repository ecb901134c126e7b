/* hashring/lb_simple.c: the round_robin and least_loaded baselines. They keep no index: they
 * exist so benchmarks can compare cache_aware against them in the same run. */
#include "policy_int.h"

static void rr_decide(pcr_policy_t *p, const pcr_key_t *key, const pcr_backend_load_t *loads,
                      uint64_t now, pcr_decision_t *out)
{
    (void)key;
    (void)now;
    for (size_t k = 0; k < p->n; k++) {
        size_t b = (size_t)((p->rotation + k) % p->n);
        if (loads[b].usable) {
            p->rotation = b + 1;
            out->backend = (int)b;
            out->reason = PCR_REASON_ROUND_ROBIN;
            return;
        }
    }
}

int pcr_policy_least_inflight(pcr_policy_t *p, const pcr_backend_load_t *loads)
{
    int best = -1;
    size_t start = (size_t)(p->rotation++ % p->n);
    for (size_t k = 0; k < p->n; k++) {
        size_t b = (start + k) % p->n;
        if (loads[b].usable && (best < 0 || loads[b].inflight < loads[best].inflight))
            best = (int)b;
    }
    return best;
}

static void ll_decide(pcr_policy_t *p, const pcr_key_t *key, const pcr_backend_load_t *loads,
                      uint64_t now, pcr_decision_t *out)
{
    (void)key;
    (void)now;
    out->backend = pcr_policy_least_inflight(p, loads);
    out->reason = PCR_REASON_LEAST_LOADED;
}

const pcr_lb_ops_t pcr_lb_round_robin = {rr_decide};
const pcr_lb_ops_t pcr_lb_least_loaded = {ll_decide};
