/* pcr/tenancy.h: the decisions of sharing one pool between tenants, pure (no I/O, no clock,
 * no threads): a tenant's rate limits, the pool's saturation, and a session's pod.
 *
 * Rate limits are the generic cell rate algorithm (GCRA, the token bucket written as one
 * number): a tenant's state is its "theoretical arrival time" `tat`, when its bucket would be
 * full again. A request of cost c (in time: c units times the interval of one unit) passes when
 * max(tat, now) + c - now <= tolerance (the burst, in time); then tat = max(tat, now) + c. One
 * word of state, so a caller may keep it in an atomic and update it with compare-and-swap.
 *
 * Saturation follows llm-d's detector: a pod is saturated when its waiting queue, its KV-cache
 * usage, or the router's own count of requests in flight on it or of the prefill it sent there
 * and that has not reached its first token, reaches its threshold; the pool
 * is saturated when every usable pod is. The level is the least loaded usable pod's highest
 * ratio to a threshold, clipped to 0..1: 1 means saturated.
 *
 * A session's pod: a table of 64-bit words that the caller owns (and may keep atomic), each
 * word a session's hash tag, its backend and when it was last seen; two ways per set, the
 * older (or expired) way replaced. Whether to keep a session on its pod is pcr_affinity_keep. */
#ifndef PCR_TENANCY_H
#define PCR_TENANCY_H

#include <stddef.h>
#include <stdint.h>

/* GCRA: returns 1 and sets *new_tat when a request of `cost` passes at `now`; else 0 and sets
 * *retry_after (in `now` units) to when it would pass. A cost above `tolerance` is taken as
 * `tolerance` (it passes when the bucket is full), so no request is refused forever. */
int pcr_gcra_take(uint64_t tat, uint64_t now, uint64_t cost, uint64_t tolerance,
                  uint64_t *new_tat, uint64_t *retry_after);

typedef struct {
    int usable;                   /* up, not ejected: counts toward the pool */
    uint32_t inflight;            /* the router's requests on it */
    uint32_t waiting;             /* the pod's queue (vllm:num_requests_waiting) */
    double kv_usage;              /* 0..1, < 0 unknown */
    uint64_t prefill;             /* the router's uncached prefill on it, tokens, until first
                                     tokens (held streams included) */
} pcr_sat_pod_t;

typedef struct {
    double queue_threshold;       /* waiting requests; <= 0 off (llm-d: 5) */
    double kv_threshold;          /* KV usage, 0..1; <= 0 off (llm-d: 0.8) */
    double inflight_threshold;    /* requests in flight per pod; <= 0 off */
    double prefill_threshold;     /* prefill tokens per pod; <= 0 off */
} pcr_sat_opts_t;

/* The pool's level, 0..1 (1: saturated). No usable pod, or no threshold on: 0. */
double pcr_saturation(const pcr_sat_pod_t *pods, size_t n, const pcr_sat_opts_t *o);

/* The session table: `nsets` x 2 words, nsets a power of two. Words are 0 when empty. */
#define PCR_AFFINITY_WAYS 2
/* The index of the first way of `h`'s set. */
size_t pcr_affinity_set(uint64_t h, size_t nsets);
/* The word that says session `h` is on `backend` (0..4095) since `now_s` (seconds). */
uint64_t pcr_affinity_word(uint64_t h, int backend, uint64_t now_s);
/* The backend `word` names for session `h`, or -1 (another session, or older than ttl_s). */
int pcr_affinity_backend(uint64_t word, uint64_t h, uint64_t now_s, uint64_t ttl_s);
/* Which of a set's two words `h` is to be written into: its own, an empty or expired one, else
 * the older. */
int pcr_affinity_victim(const uint64_t w[PCR_AFFINITY_WAYS], uint64_t h, uint64_t now_s,
                        uint64_t ttl_s);
/* Whether a session stays on its pod: `inflight` there is within `factor` times the mean of
 * the usable pods' (plus one), and the pod is not saturated (`pod_level` < 1). */
int pcr_affinity_keep(uint32_t inflight, double mean_inflight, double factor, double pod_level);
/* One pod's level as pcr_saturation counts it (unclipped). */
double pcr_saturation_pod(const pcr_sat_pod_t *p, const pcr_sat_opts_t *o);

/* Pods that schedule by priority (vLLM's priority scheduling: lower served first) serve a
 * request before every request of a strictly worse pod priority, preempting their prefill for
 * it; so, for the saturation a request of pod priority `p` sees, their prefill leaves no pod
 * full. Of n classes (n <= 64; class i of pod priority prio[i]), the set whose prefill `p`
 * passes: bit i set when prio[i] > p. */
uint64_t pcr_pod_preemptible(const int *prio, size_t n, int p);

#endif
