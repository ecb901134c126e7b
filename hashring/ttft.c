/* hashring/ttft.c: the online fit of a backend's time to first token (include/pcr/ttft.h).
 *
 * The fit minimises, over the decayed observations (x tokens, y us) and the prior (a0, c0):
 *
 *   sum w_i (y_i - c - a x_i)^2  +  k ((c - c0)^2 + X0^2 (a - a0)^2)
 *
 * where k is PCR_TTFT_PRIOR_WEIGHT and X0 a typical request's prefill, so the prior counts
 * like k observations of that size. Setting both derivatives to zero gives two linear
 * equations in (c, a), solved in closed form after every observation: O(1), no allocation. */
#include <math.h>

#include "pcr/ttft.h"

#define X0 2048.0                 /* tokens: the scale the prior's slope is held at */
#define MAX_TOKENS 1e9
#define MAX_US 3.6e9              /* an hour */
#define MAX_OVERHEAD_US 60e6
#define SLOPE_RANGE 64.0
#define CLIP_FLOOR_US 1000.0      /* residuals under 1 ms are never clipped */

static double clamp(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static void fit(pcr_ttft_t *t)
{
    double k = PCR_TTFT_PRIOR_WEIGHT, kx = k * X0 * X0;
    double m11 = t->s0 + k, m12 = t->sx, m22 = t->sxx + kx;
    double r1 = t->sy + k * t->prior_c, r2 = t->sxy + kx * t->prior_a;
    double det = m11 * m22 - m12 * m12;
    if (!(det > 0) || !isfinite(det))
        return;   /* cannot happen with k > 0 (the matrix is positive definite); keep the fit */
    double c = (r1 * m22 - m12 * r2) / det;
    double a = (m11 * r2 - m12 * r1) / det;
    double alo = t->prior_a / SLOPE_RANGE, ahi = t->prior_a * SLOPE_RANGE;
    /* Out of bounds: hold that one at its bound and take the best value of the other. */
    if (c < 0 || c > MAX_OVERHEAD_US) {
        c = clamp(c, 0.0, MAX_OVERHEAD_US);
        a = (r2 - m12 * c) / m22;
    }
    if (a < alo || a > ahi) {
        a = clamp(a, alo, ahi);
        c = clamp((r1 - m12 * a) / m11, 0.0, MAX_OVERHEAD_US);
    }
    t->a = a;
    t->c = c;
}

void pcr_ttft_init(pcr_ttft_t *t, double us_per_token, double overhead_us)
{
    if (!(us_per_token > 0) || !isfinite(us_per_token))
        us_per_token = 70.0;
    if (!(overhead_us >= 0) || !isfinite(overhead_us))
        overhead_us = 20000.0;
    *t = (pcr_ttft_t){.prior_a = us_per_token, .prior_c = overhead_us};
    t->a = us_per_token;
    t->c = overhead_us;
    /* Before any residual is seen, "typical" is the prior's own answer for a typical request. */
    t->spread = overhead_us + us_per_token * X0;
}

void pcr_ttft_observe(pcr_ttft_t *t, double x, double y)
{
    if (!isfinite(x) || !isfinite(y) || x < 0 || y < 0 || x > MAX_TOKENS || y > MAX_US)
        return;
    double lim = PCR_TTFT_CLIP * t->spread + CLIP_FLOOR_US;
    double r = clamp(y - pcr_ttft_estimate(t, x), -lim, lim);
    y = pcr_ttft_estimate(t, x) + r;
    double keep = 1.0 - 1.0 / PCR_TTFT_WINDOW;
    t->spread = keep * t->spread + (1.0 - keep) * fabs(r);
    t->s0 = keep * t->s0 + 1.0;
    t->sx = keep * t->sx + x;
    t->sy = keep * t->sy + y;
    t->sxx = keep * t->sxx + x * x;
    t->sxy = keep * t->sxy + x * y;
    t->n++;
    fit(t);
}
