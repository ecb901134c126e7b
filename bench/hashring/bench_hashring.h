/* bench_hashring.h: what the parts of bench_hashring share: the clock, a PRNG, the pre-filled
 * index's traffic. */
#ifndef PCR_BENCH_HASHRING_H
#define PCR_BENCH_HASHRING_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/policy.h"

#define NB 16                  /* backends */
#define PREFILL_PAIRS 1000000u /* (block, backend) pairs in the index before measuring */

uint64_t rnd(void);
double now_s(void);
uint64_t now_ns(void);
int cmp_u64(const void *a, const void *b);
const char *verdict(int ok);

typedef void (*insert_fn)(void *ctx, unsigned b, const uint64_t *k, size_t n, uint64_t now);

/* Chat-shaped traffic until `target` pairs are stored; returns the next `now`. */
uint64_t prefill(insert_fn ins, void *ctx, uint64_t (*pairs)(void *ctx), uint64_t target);
void ins_policy(void *ctx, unsigned b, const uint64_t *k, size_t n, uint64_t now);
uint64_t pairs_policy(void *ctx);

/* bench_decision.c */
void bench_decisions(void);

#endif
