/* pcr/ring.h: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2016).
 *
 * Each backend gets vnodes * weight points on a 64-bit ring, placed by XXH3-64 of its name
 * seeded with the replica index, so two routers built from the same names agree. A lookup
 * walks clockwise from the key and takes the first usable backend whose load, plus the
 * request being placed, stays within pcr_ring_bound(). Implemented in hashring/ring.c. */
#ifndef PCR_RING_H
#define PCR_RING_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/common.h"

#define PCR_RING_MAX_POINTS (1u << 24)

typedef struct pcr_ring pcr_ring_t;

/* names[n], weights[n] (NULL = all 1), vnodes >= 1 points per unit of weight. A backend of
 * weight 0 gets no point (its name may be NULL): the slot of one that left. NULL when out of
 * memory, when an argument is invalid, when no backend has a weight or when the ring would exceed
 * PCR_RING_MAX_POINTS points. */
pcr_ring_t *pcr_ring_new(const char *const *names, const uint32_t *weights, size_t n,
                         unsigned vnodes);
void pcr_ring_free(pcr_ring_t *r);  /* NULL is a no-op */
size_t pcr_ring_points(const pcr_ring_t *r);

/* The most load a backend of `weight` may carry after taking one more request, when the usable
 * backends carry `total_load` and weigh `total_weight`: ceil(c * (total_load + 1) * weight /
 * total_weight). With c >= 1 some backend is always under it. */
uint64_t pcr_ring_bound(uint64_t total_load, uint32_t weight, uint64_t total_weight, double c);

/* The backend for `key`: the first clockwise whose usable[b] is nonzero (usable NULL = all) and
 * whose load[b] + 1 <= bound (load NULL = all zero; c <= 0 = no bound). When every usable
 * backend is over the bound (c < 1), the first usable one. -1 when none is usable. */
int pcr_ring_lookup(const pcr_ring_t *r, uint64_t key, const uint64_t *load,
                    const unsigned char *usable, double c);

#endif
