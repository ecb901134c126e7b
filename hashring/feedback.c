/* hashring/feedback.c: pcr_policy_feedback, the index corrected by what the pods delivered.
 *
 * A pod reports, per request, the prompt tokens it served from its cache. The index had
 * predicted d->matched_blocks for the chosen backend. Three outcomes:
 *
 *  - Short: the pod no longer held block D (the first it did not deliver), which the index
 *    last saw it use at d->matched_time or later. A pod evicts least recently used first, so
 *    everything it used at or before d->matched_time is gone too: the index drops all of it
 *    (pcr_index_evict_older). What is left is as much as the pod can really keep, so the
 *    backend's capacity in the index becomes that. This is what recovers the hit rate when
 *    the configured capacity is too large: one short answer removes a whole stale generation
 *    of prefixes, instead of one per wrong prediction.
 *  - Long: the pod held blocks the index had let go (its capacity was too small, or another
 *    router sent them there): the capacity grows by the difference.
 *  - As predicted: the capacity grows back by 1/CAP_GROW of itself toward the configured
 *    one, so a short answer caused by a passing squeeze (a burst of long outputs holds KV
 *    blocks) is not remembered for ever. Slowly: a confirmed prediction says nothing of how
 *    much more the pod could hold, and at 1/256 a few hundred confirmed answers (a busy pod's
 *    minute) brought the wrong capacity back before the index had used the right one.
 *
 * The index does not record the served prompt again as last used now, although the pod does
 * hold it at the end of the request: stamping every answered prompt with the end-of-request
 * clock while commits stamp the decision's clock mixed two clocks in one LRU order, and cost
 * hit rate even with the capacity told right (docs/TUNING.md). The commit's record stands.
 *
 * A short answer is evidence of an eviction only when the pod had the missing block to evict:
 * when the request that last committed it (at d->matched_time) had reached its first token
 * before this one was sent (the caller's `settled_before`). A conversation's next turn or a
 * shared system prompt's next user often comes while the request that brings the prefix is
 * still in the pod's queue, or held in the router; vLLM reuses only blocks it has scheduled
 * for computation (it caches them as it allocates them to a step), so that answer is short
 * without any eviction. Taken as one, it made the index forget everything older on that pod
 * and cut the pod's capacity in the index to a fraction, from a single answer.
 *
 * Token counts: a pod counts its own tokens, the index 4 bytes of canonical prompt per token
 * (the simulator's rule, and a close one for English text); a pod always computes the last
 * prompt token, so a fully cached prompt delivers up to one block less than it holds, and a
 * pod whose blocks are larger than the index's rounds down further: a shortfall of one block
 * beyond that is not counted as short. */
#include "policy_int.h"

#define CAP_GROW 4096u         /* a confirmed prediction grows the capacity by 1/4096 */
#define CAP_FLOOR_DIV 64u      /* the learned capacity never drops under 1/64 of the configured */
#define CAP_FLOOR_MIN 16u      /* ... nor under 16 blocks */

static uint64_t cap_floor(uint64_t conf)
{
    uint64_t f = conf == PCR_INDEX_UNLIMITED ? CAP_FLOOR_MIN : conf / CAP_FLOOR_DIV;
    return f < CAP_FLOOR_MIN ? CAP_FLOOR_MIN : f;
}

static uint64_t grow(uint64_t cap, uint64_t by, uint64_t conf)
{
    if (cap == PCR_INDEX_UNLIMITED || conf - cap <= by)   /* conf >= cap always */
        return conf;
    return cap + by;
}

int pcr_policy_feedback(pcr_policy_t *p, const pcr_key_t *key, const pcr_decision_t *d,
                        uint64_t delivered_tokens, uint64_t settled_before)
{
    if (p == NULL || key == NULL || d == NULL || d->backend < 0 || (size_t)d->backend >= p->n ||
        key->nblocks > p->max_blocks || (key->nblocks > 0 && key->blocks == NULL))
        return PCR_ERR_INVAL;
    /* A precise decision was made on what the pods said they hold: nothing to correct. In
     * precise mode the approximate index underneath is not corrected either: its few
     * decisions (tokens that did not come in time) could only shrink its capacity, which the
     * precise ones, giving no feedback, would never grow back, and the pods' events say what
     * they hold. */
    if (p->index == NULL || key->nblocks == 0 || d->precise || p->kvt != NULL)
        return 0;
    unsigned b = (unsigned)d->backend;
    uint64_t bb = p->o.block_bytes;
    uint64_t predicted = d->matched_blocks < key->nblocks ? d->matched_blocks : key->nblocks;
    if (delivered_tokens > key->prompt_tokens)
        delivered_tokens = key->prompt_tokens;   /* bounds the product below as well */
    uint64_t delivered = delivered_tokens * 4 / bb;
    if (delivered > key->nblocks)
        delivered = key->nblocks;
    uint64_t most = key->prompt_tokens > 0 ? (key->prompt_tokens * 4 - 1) / bb : 0;
    uint64_t expected = predicted < most ? predicted : most;

    uint64_t conf = p->cap_conf[b], cap = p->cap_eff[b];
    if (delivered + 1 < expected) {
        if (d->matched_time >= settled_before)
            return 0;   /* its bringer may not have been prefilled: no evidence */
        pcr_index_evict_older(p->index, b, d->matched_time);
        uint64_t held = pcr_index_backend_blocks(p->index, b), floor = cap_floor(conf);
        if (held < cap)
            cap = held > floor ? held : floor;
    } else if (delivered > predicted) {
        cap = grow(cap, delivered - predicted, conf);
    } else if (predicted > 0) {
        uint64_t by = cap / CAP_GROW;
        cap = grow(cap, by ? by : 1, conf);
    }
    if (cap != p->cap_eff[b]) {
        p->cap_eff[b] = cap;
        pcr_index_set_capacity(p->index, b, cap);
    }
    return 0;
}
