/* hashring/ttft.c: the online fit of a backend's prefill rate (include/pcr/ttft.h).
 *
 * The overhead c is fixed; the fit chooses the slope a that minimises, over the decayed
 * observations (x tokens, y us) and the prior slope a0,
 *
 *   sum w_i (y_i - c - a x_i)^2  +  k X0^2 (a - a0)^2
 *
 * where k is PCR_TTFT_PRIOR_WEIGHT and X0 a typical request's prefill, so the prior counts
 * like k observations of that size: a = (k X0^2 a0 + sum w x (y - c)) / (k X0^2 + sum w x^2),
 * two running sums, O(1) per observation, no allocation. Large observations weigh most, which
 * is right: a long prefill measures the rate best. */
#include <math.h>

#include "pcr/ttft.h"

#define X0 2048.0                 /* tokens: the scale the prior's slope is held at */
#define MAX_TOKENS 1e9
#define MAX_US 3.6e9              /* an hour */
#define SLOPE_RANGE 64.0
#define CLIP_FLOOR_US 1000.0      /* residuals under 1 ms are never clipped */

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
    /* Before any residual is seen, "typical" is the prior's own answer for a typical request. */
    t->spread = overhead_us + us_per_token * X0;
}

void pcr_ttft_observe(pcr_ttft_t *t, double x, double y)
{
    if (!isfinite(x) || !isfinite(y) || x < PCR_TTFT_MIN_TOKENS || y < 0 || x > MAX_TOKENS ||
        y > MAX_US)
        return;
    double lim = PCR_TTFT_CLIP * t->spread + CLIP_FLOOR_US;
    double r = clamp(y - pcr_ttft_estimate(t, x), -lim, lim);
    double keep = 1.0 - 1.0 / PCR_TTFT_WINDOW;
    t->spread = keep * t->spread + (1.0 - keep) * fabs(r);
    y = pcr_ttft_estimate(t, x) + r - t->c;   /* the part the rate has to explain */
    t->sxx = keep * t->sxx + x * x;
    t->sxy = keep * t->sxy + x * y;
    t->n++;
    t->a = pcr_ttft_rate_toward(t, t->prior_a);
}

double pcr_ttft_rate_toward(const pcr_ttft_t *t, double center)
{
    double kx = PCR_TTFT_PRIOR_WEIGHT * X0 * X0;
    double a = (kx * center + t->sxy) / (kx + t->sxx);
    return clamp(a, t->prior_a / SLOPE_RANGE, t->prior_a * SLOPE_RANGE);
}

double pcr_ttft_rate_observed(const pcr_ttft_t *t)
{
    if (!(t->sxx > 0))
        return t->prior_a;
    return clamp(t->sxy / t->sxx, t->prior_a / SLOPE_RANGE, t->prior_a * SLOPE_RANGE);
}
