/* hashring/ttft.c: the sums and fits of a backend's time to first token (include/pcr/ttft.h).
 *
 * For an overhead c, the rate minimising, over the decayed observations (x tokens, y us) and a
 * centre a0,
 *
 *   sum w_i (y_i - c - a x_i)^2  +  k X0^2 (a - a0)^2
 *
 * is a = (k X0^2 a0 + sum w x y - c sum w x) / (k X0^2 + sum w x^2), where k is
 * PCR_TTFT_PRIOR_WEIGHT and X0 a typical request's prefill, so the centre counts like k
 * observations of that size. Large observations weigh most, which is right: a long prefill
 * measures the rate best. Each backend b contributes to a shared overhead, with its own rate
 * a_b = (Sxy_b - c Sx_b) / Sxx_b, the terms num_b = Sy_b - Sx_b Sxy_b / Sxx_b and
 * den_b = S0_b - Sx_b^2 / Sxx_b of c = sum num / sum den (setting the derivative in c to zero).
 * All O(1) per observation, no allocation. */
#include <math.h>

#include "pcr/ttft.h"

#define X0 2048.0                 /* tokens: the scale the prior's slope is held at */
#define MAX_TOKENS 1e9
#define MAX_US 3.6e9              /* an hour */
#define SLOPE_RANGE 64.0

static double clamp(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

void pcr_ttft_init(pcr_ttft_t *t, double us_per_token, double overhead_us)
{
    if (!(us_per_token > 0) || !isfinite(us_per_token))
        us_per_token = 70.0;
    if (!(overhead_us >= 0) || !isfinite(overhead_us))
        overhead_us = 20000.0;
    *t = (pcr_ttft_t){.prior_a = us_per_token, .a = us_per_token, .c = overhead_us};
}

void pcr_ttft_observe(pcr_ttft_t *t, double x, double y)
{
    if (!isfinite(x) || !isfinite(y) || x < PCR_TTFT_MIN_TOKENS || y < 0 || x > MAX_TOKENS ||
        y > MAX_US)
        return;
    /* Clipped as a rate, against the current one, once there is one: against the prior, a
     * pod ten times faster than it would have its long observations (the most telling)
     * clipped back toward the guess. */
    if (t->n >= PCR_TTFT_WARMUP)
        y = t->c + x * clamp((y - t->c) / x, t->a / PCR_TTFT_CLIP, t->a * PCR_TTFT_CLIP);
    double keep = 1.0 - 1.0 / PCR_TTFT_WINDOW;
    t->s0 = keep * t->s0 + 1.0;
    t->sx = keep * t->sx + x;
    t->sy = keep * t->sy + y;
    t->sxx = keep * t->sxx + x * x;
    t->sxy = keep * t->sxy + x * y;
    t->n++;
    t->a = pcr_ttft_rate(t, t->c, t->prior_a);
}

double pcr_ttft_rate(const pcr_ttft_t *t, double c, double centre)
{
    double kx = PCR_TTFT_PRIOR_WEIGHT * X0 * X0;
    double a = (kx * centre + t->sxy - c * t->sx) / (kx + t->sxx);
    return clamp(a, t->prior_a / SLOPE_RANGE, t->prior_a * SLOPE_RANGE);
}

double pcr_ttft_rate_observed(const pcr_ttft_t *t, double c)
{
    if (!(t->sxx > 0))
        return t->prior_a;
    return clamp((t->sxy - c * t->sx) / t->sxx, t->prior_a / SLOPE_RANGE,
                 t->prior_a * SLOPE_RANGE);
}

void pcr_ttft_overhead_terms(const pcr_ttft_t *t, double *num, double *den)
{
    if (!(t->sxx > 0))
        return;
    double d = t->s0 - t->sx * t->sx / t->sxx;
    if (d <= 1e-9 * t->s0)
        return;   /* all of one size, up to rounding: no say on the overhead */
    *num += t->sy - t->sx * t->sxy / t->sxx;
    *den += d;
}
