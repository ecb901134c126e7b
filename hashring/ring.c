/* hashring/ring.c: the bounded-load consistent-hash ring (include/pcr/ring.h).
 *
 * The ring is a sorted array of points (position, backend); a lookup is a binary search and a
 * clockwise walk. Equal positions sort by backend index, so the order is total and two rings
 * built from the same names and weights are identical. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "pcr/ring.h"

typedef struct {
    uint64_t pos;
    uint32_t backend;
} point_t;

struct pcr_ring {
    size_t n, npoints;
    uint32_t *weight;
    point_t *points;
};

static int point_cmp(const void *a, const void *b)
{
    const point_t *x = a, *y = b;
    if (x->pos != y->pos)
        return x->pos < y->pos ? -1 : 1;
    return x->backend < y->backend ? -1 : x->backend > y->backend;
}

pcr_ring_t *pcr_ring_new(const char *const *names, const uint32_t *weights, size_t n,
                         unsigned vnodes)
{
    uint64_t total = 0;
    pcr_ring_t *r;

    if (names == NULL || n == 0 || n > UINT32_MAX || vnodes == 0)
        return NULL;
    for (size_t b = 0; b < n; b++) {
        uint32_t w = weights ? weights[b] : 1;
        if (w > 0 && names[b] == NULL)
            return NULL;
        total += (uint64_t)w * vnodes;
        if (total > PCR_RING_MAX_POINTS)
            return NULL;
    }
    if (total == 0)
        return NULL;
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->n = n;
    r->npoints = (size_t)total;
    r->weight = malloc(n * sizeof(*r->weight));
    r->points = malloc(r->npoints * sizeof(*r->points));
    if (r->weight == NULL || r->points == NULL) {
        pcr_ring_free(r);
        return NULL;
    }
    size_t k = 0;
    for (size_t b = 0; b < n; b++) {
        r->weight[b] = weights ? weights[b] : 1;
        if (r->weight[b] == 0)
            continue; /* a slot with no backend: no points */
        size_t len = strlen(names[b]);
        for (uint64_t i = 0; i < (uint64_t)r->weight[b] * vnodes; i++) {
            r->points[k].pos = XXH3_64bits_withSeed(names[b], len, i);
            r->points[k].backend = (uint32_t)b;
            k++;
        }
    }
    qsort(r->points, r->npoints, sizeof(*r->points), point_cmp);
    return r;
}

void pcr_ring_free(pcr_ring_t *r)
{
    if (r == NULL)
        return;
    free(r->weight);
    free(r->points);
    free(r);
}

size_t pcr_ring_points(const pcr_ring_t *r)
{
    return r != NULL ? r->npoints : 0;
}

uint64_t pcr_ring_bound(uint64_t total_load, uint32_t weight, uint64_t total_weight, double c)
{
    if (total_weight == 0)
        return 0;
    return (uint64_t)ceil(c * (double)(total_load + 1) * (double)weight / (double)total_weight);
}

int pcr_ring_lookup(const pcr_ring_t *r, uint64_t key, const uint64_t *load,
                    const unsigned char *usable, double c)
{
    uint64_t total_load = 0, total_weight = 0;
    int first_usable = -1;

    if (r == NULL)
        return -1;
    for (size_t b = 0; b < r->n; b++) {
        if (usable != NULL && !usable[b])
            continue;
        total_weight += r->weight[b];
        total_load += load != NULL ? load[b] : 0;
    }
    if (total_weight == 0)
        return -1;
    /* First point at or after the key, wrapping around. */
    size_t lo = 0, hi = r->npoints;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->points[mid].pos < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t k = 0; k < r->npoints; k++) {
        uint32_t b = r->points[(lo + k) % r->npoints].backend;
        if (usable != NULL && !usable[b])
            continue;
        if (first_usable < 0)
            first_usable = (int)b;
        if (c <= 0 || load == NULL)
            return (int)b;
        if (load[b] + 1 <= pcr_ring_bound(total_load, r->weight[b], total_weight, c))
            return (int)b;
    }
    return first_usable;
}
