/* pcr/ttft.h: one backend's time to first token, learned online from what the router sees.
 *
 * The model is a line: ttft_us = overhead_us + us_per_token * tokens, where `tokens` is the
 * uncached prefill queued ahead of a request on the pod plus its own (a pod prefills in
 * arrival order, so a request waits for everything ahead of it). Observations (tokens, time to
 * first byte) of at least PCR_TTFT_MIN_TOKENS (shorter ones measure the overhead more than the
 * rate) go into exponentially weighted sums that forget at 1/PCR_TTFT_WINDOW per observation,
 * so a fit follows a pod whose speed changes. After PCR_TTFT_WARMUP observations, the rate
 * each one implies is clipped to within PCR_TTFT_CLIP times the current rate, so one request
 * that waited for something else (a full batch, a slow network) moves the sums little.
 *
 * The fits are ridge regressions on those sums, pulled toward a centre with the weight of
 * PCR_TTFT_PRIOR_WEIGHT observations, so that a few observations, or only short ones, leave
 * them sane: the rate given an overhead (pcr_ttft_rate), and each backend's part of an overhead
 * shared by a pool (pcr_ttft_overhead_terms). A pool fits one overhead for all its backends and
 * one rate each (hashring/policy.c): a per-backend overhead soaks up the waiting no token count
 * explains (decode slots, KV blocks) on whichever pod was busiest, stays high there, turns
 * traffic away and, with no new observations, never comes down; and a wrong fixed one (a
 * time-scaled benchmark, a slower model) biases each rate by the sizes its pod happens to see.
 * Alone, pcr_ttft_observe keeps `c` as given and fits `a` toward the prior.
 *
 * Pure and deterministic: the same observations in the same order give the same sums.
 * An embedded value (pcr_ttft_init, no _dispose); implemented in hashring/ttft.c. */
#ifndef PCR_TTFT_H
#define PCR_TTFT_H

#include <stdint.h>

#define PCR_TTFT_WINDOW 64.0
#define PCR_TTFT_PRIOR_WEIGHT 8.0
#define PCR_TTFT_CLIP 4.0
#define PCR_TTFT_WARMUP 8
#define PCR_TTFT_MIN_TOKENS 1024.0

typedef struct {
    double prior_a;                  /* us per token before any observation */
    double s0, sx, sy, sxx, sxy;     /* decayed sums of 1, x, y, x^2, x y */
    double a, c;                     /* the current line: us per token, overhead in us */
    uint64_t n;                      /* observations taken */
} pcr_ttft_t;

/* Starts from the prior rate `us_per_token` > 0 with the overhead `overhead_us` >= 0 (other
 * values are replaced by 70 us and 20 ms). */
void pcr_ttft_init(pcr_ttft_t *t, double us_per_token, double overhead_us);

/* One response: `tokens` of prefill (queued ahead + own) took `ttft_us` to a first byte; the
 * implied rate is clipped against the current line (a, c). Fewer than PCR_TTFT_MIN_TOKENS tokens,
 * and values that are not finite, negative or absurd (over 10^9 tokens or an hour) are
 * ignored. Then a = pcr_ttft_rate(t, c, prior). */
void pcr_ttft_observe(pcr_ttft_t *t, double tokens, double ttft_us);

/* The rate that best explains the observations with overhead `c`, pulled toward `centre`;
 * within [prior / 64, prior * 64]. */
double pcr_ttft_rate(const pcr_ttft_t *t, double c, double centre);

/* The same with no pull (the observations alone); the prior before any observation. */
double pcr_ttft_rate_observed(const pcr_ttft_t *t, double c);

/* Adds this backend's terms of the overhead shared by a pool, each backend with a rate of its
 * own: the common overhead is sum(num) / sum(den) (plus a prior's terms). A backend whose
 * observations are all of one size says nothing of the overhead (den adds 0). */
void pcr_ttft_overhead_terms(const pcr_ttft_t *t, double *num, double *den);

/* The expected time to first token, in us, behind `tokens` of prefill. */
static inline double pcr_ttft_estimate(const pcr_ttft_t *t, double tokens)
{
    return t->c + t->a * tokens;
}

#endif
