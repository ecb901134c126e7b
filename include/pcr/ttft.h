/* pcr/ttft.h: one backend's time to first token, its prefill rate learned online.
 *
 * The model is a line: ttft_us = overhead_us + us_per_token * tokens, where `tokens` is the
 * uncached prefill queued ahead of a request on the pod plus its own (a pod prefills in
 * arrival order, so a request waits for everything ahead of it). The overhead is fixed (the
 * scheduling step and the first decode step, which tokens do not explain); the rate is learned
 * from observations (tokens, time to first byte) of at least PCR_TTFT_MIN_TOKENS (shorter ones
 * measure the overhead more than the rate) by exponentially weighted least squares that
 * forget at 1/PCR_TTFT_WINDOW per observation, so it follows a pod whose speed changes. It is
 * pulled toward a prior, as a ridge regression with the weight of PCR_TTFT_PRIOR_WEIGHT
 * observations, so that a few observations, or only short ones, leave it sane. Each
 * observation's residual is clipped at PCR_TTFT_CLIP times the typical residual, so one
 * request that waited for something else (a full batch, a slow network) moves it little.
 * The rate stays within [prior / 64, prior * 64].
 *
 * Why not learn the overhead too: a pod past its capacity makes requests wait for decode slots
 * and KV blocks, time that no token count explains; a learned intercept soaks it up, stays
 * high on the pod that happened to be busiest, turns traffic away from it and, with no new
 * observations there, never comes down. A rate only scales the work a pod is given.
 *
 * Pure and deterministic: the same observations in the same order give the same estimate.
 * An embedded value (pcr_ttft_init, no _dispose); implemented in hashring/ttft.c. */
#ifndef PCR_TTFT_H
#define PCR_TTFT_H

#include <stdint.h>

#define PCR_TTFT_WINDOW 64.0
#define PCR_TTFT_PRIOR_WEIGHT 8.0
#define PCR_TTFT_CLIP 4.0
#define PCR_TTFT_MIN_TOKENS 1024.0

typedef struct {
    double prior_a;                  /* us per token before any observation */
    double sxx, sxy;                 /* decayed sums of x^2 and x (y - c) */
    double spread;                   /* decayed mean absolute residual, us */
    double a, c;                     /* the rate learned (us per token), the fixed overhead (us) */
    uint64_t n;                      /* observations taken */
} pcr_ttft_t;

/* Starts from the prior rate `us_per_token` > 0 with the overhead `overhead_us` >= 0 (other
 * values are replaced by 70 us and 20 ms). */
void pcr_ttft_init(pcr_ttft_t *t, double us_per_token, double overhead_us);

/* One response: `tokens` of prefill (queued ahead + own) took `ttft_us` to a first byte.
 * Fewer than PCR_TTFT_MIN_TOKENS tokens, and values that are not finite, negative or absurd
 * (over 10^9 tokens or an hour) are ignored. */
void pcr_ttft_observe(pcr_ttft_t *t, double tokens, double ttft_us);

/* The rate the observations alone give (no prior), within the clamp; the prior's rate before
 * any observation. A pool takes the median of these as its centre. */
double pcr_ttft_rate_observed(const pcr_ttft_t *t);

/* The rate fitted with `center` as the prior (the same ridge, another anchor): a backend with
 * few observations then looks like the pool, not like the configured guess. */
double pcr_ttft_rate_toward(const pcr_ttft_t *t, double center);

/* The expected time to first token, in us, behind `tokens` of prefill. */
static inline double pcr_ttft_estimate(const pcr_ttft_t *t, double tokens)
{
    return t->c + t->a * tokens;
}

#endif
