/* pcr/hold.h: streamed requests held at the router while their pod's prefill queue is full.
 *
 * Past a pool's knee, a pod's queue is where time to first token goes: vLLM prefills in arrival
 * order, so a short prompt waits behind every long one that came first. The router holds the
 * queue instead (routing.hold_tokens): a pod that has that many uncached prompt tokens sent and
 * not yet at their first token takes no more streamed requests for now; they wait at the router,
 * each already routed to that pod, and as its prefill drains they go one at a time, highest
 * pcr_hold_rank first. That is the highest response ratio next rule, (waited + own prefill) /
 * own prefill: a short prompt passes long ones, and a long one's rank grows as it waits, so
 * none waits forever; but a held request goes before one that counts on the blocks it brings
 * (pcr_hold_depends), and before the rank come the tenants' priority bands and their fairness
 * (pcr_hold_before). Routing is unchanged: a held request counts on its pod as if sent.
 *
 * Pure; implemented in hashring/hold.c. The router (router/upstream/upstream.c) and the offline
 * simulator (bench/sim/offline_run.c) order their held requests with it. */
#ifndef PCR_HOLD_H
#define PCR_HOLD_H

#include <stdint.h>

/* routing.hold_tokens' default: at the simulator's 70 us a token, 1.4 s of prefill queued on a
 * pod (bench/sweep.py chose it; docs/TUNING.md says why). 0 turns holding off. */
#define PCR_HOLD_TOKENS_DEFAULT 20480

/* Tokens added to every prefill in the ratio, for the fixed part of a first token (the default
 * ttft_overhead_us, 20 ms, is about 290 tokens at 70 us a token), so that a fully cached prompt
 * does not rank as if it took no time. */
#define PCR_HOLD_BASE_TOKENS 256

/* The rank of a request that has waited `waited_us` and whose uncached prefill on its pod is
 * `prefill_tokens`: waited / (prefill + PCR_HOLD_BASE_TOKENS). Higher goes first; equal ranks
 * go in arrival order (the caller's tie-break). */
double pcr_hold_rank(uint64_t waited_us, uint64_t prefill_tokens);

/* A held request's place in the order, strictest first: its band (its tenant's priority,
 * higher first: a held interactive request goes before every held batch one), its tenant's
 * fairness counter within the band (the flow queue's virtual token counter, pcr/flowq.h, lower
 * first; equal when there is none), the requests its client has on pod connections (fewer
 * first, so one client's many streams do not keep the pod from the others), and its
 * pcr_hold_rank (higher first). */
typedef struct {
    int priority;
    double fair;
    unsigned busy;
    double rank;
} pcr_hold_key_t;

/* Whether `a` goes before `b`; on a full tie not (the caller passes the older as `b`). */
static inline int pcr_hold_before(const pcr_hold_key_t *a, const pcr_hold_key_t *b)
{
    if (a->priority != b->priority)
        return a->priority > b->priority;
    if (a->fair != b->fair)
        return a->fair < b->fair;
    if (a->busy != b->busy)
        return a->busy < b->busy;
    return a->rank > b->rank;
}

/* Whether a pod with `sent_tokens` of uncached prefill in flight takes another streamed request
 * under a budget of `budget_tokens` (0: no budget, always). Whatever its size, a request goes
 * while the pod is under the budget, so one larger than the budget is never stuck. */
static inline int pcr_hold_open(uint64_t sent_tokens, uint64_t budget_tokens)
{
    return budget_tokens == 0 || sent_tokens < budget_tokens;
}

/* Whether a stream with `prefill_tokens` of its own uncached prefill goes to its pod whatever
 * the budget says: at most PCR_HOLD_BASE_TOKENS (a short prompt, or one the pod holds all but
 * the tail of). It adds less to the pod's queue than a first token's fixed part, so holding it
 * spares the others nothing, while its wait at the router gives the pod time to evict any
 * prefix it counts on (the pod refreshes those blocks only when the request reaches it). One
 * held because it counts on a held stream's blocks (pcr_hold_depends) waits for the budget all
 * the same, so that it reaches the pod after that stream's prefill. */
static inline int pcr_hold_small(uint64_t prefill_tokens)
{
    return prefill_tokens <= PCR_HOLD_BASE_TOKENS;
}

/* Whether request 2, whose key `blocks2` (`n2` chained block hashes) matched `matched2` blocks
 * on its pod, counts as cached what request 1 (key `blocks1`, `n1` blocks) brings there: the
 * blocks from `added_from1` on, which that pod did not hold when request 1 was routed
 * (pcr_policy_commit). Chained hashes: equal at one index, equal prefixes up to it. While
 * request 1 is held, request 2 must not reach the pod first: it would prefill those blocks
 * itself, and request 1 after it would find them. */
static inline int pcr_hold_depends(const uint64_t *blocks2, uint32_t n2, uint32_t matched2,
                                   const uint64_t *blocks1, uint32_t n1, uint32_t added_from1)
{
    return added_from1 < n1 && added_from1 < matched2 && added_from1 < n2 &&
           blocks2[added_from1] == blocks1[added_from1];
}

#endif
