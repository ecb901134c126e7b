/* bench/kv/bench_common.h: what the two KV benches share: a monotonic clock in seconds, a
 * xorshift generator (the same stream every run), and the median of a run's figures. */
#ifndef PCR_BENCH_KV_COMMON_H
#define PCR_BENCH_KV_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static inline uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static inline int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v (n figures) and returns the middle one. */
static inline double median(double *v, size_t n)
{
    qsort(v, n, sizeof(v[0]), cmp_d);
    return v[n / 2];
}

#endif
