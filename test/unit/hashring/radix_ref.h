/* radix_ref.h: a naive reference model of the prefix index (include/pcr/index.h), for tests.
 *
 * Every prefix a backend holds is its own record (backend, blocks, last use), kept in a flat
 * array and searched linearly: too slow for anything but tests, and simple enough to be
 * right by reading. test_radix.c compares the index with it under random operations, and
 * test/fuzz/fuzz_radix.c under operations a fuzzer chooses. Keys are at most RADIX_REF_MAXLEN
 * blocks; the caller keeps the number of records under RADIX_REF_MAX (`full` says it did not). */
#ifndef PCR_RADIX_REF_H
#define PCR_RADIX_REF_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/index.h"

#define RADIX_REF_MAXLEN 6     /* longest key: at most 4 * (3 + 9 + ... + 729) prefixes */
#define RADIX_REF_MAXB 8       /* backends */
#define RADIX_REF_MAX 8192     /* records */

typedef struct {
    unsigned b;
    size_t len;
    uint64_t seq[RADIX_REF_MAXLEN];
    uint64_t time;
} radix_ref_rec_t;

typedef struct {
    radix_ref_rec_t r[RADIX_REF_MAX];
    size_t n;
    size_t nb;
    uint64_t cap[RADIX_REF_MAXB];
    int full;                  /* an insert found no room for a record: the model is wrong */
} radix_ref_t;

/* Empty, `nb` (<= RADIX_REF_MAXB) backends of unlimited capacity. */
void radix_ref_init(radix_ref_t *m, size_t nb);
/* The record of b's prefix seq[0..len), or -1. */
int radix_ref_find(const radix_ref_t *m, unsigned b, const uint64_t *seq, size_t len);
uint64_t radix_ref_count(const radix_ref_t *m, unsigned b);
/* Drops b's least recently used leaf records down to its capacity. */
void radix_ref_evict(radix_ref_t *m, unsigned b);
void radix_ref_set_capacity(radix_ref_t *m, unsigned b, uint64_t cap);
/* What pcr_index_insert does; returns what it returns in *added_from. */
size_t radix_ref_insert(radix_ref_t *m, unsigned b, const uint64_t *k, size_t n, uint64_t now);
void radix_ref_erase(radix_ref_t *m, unsigned b, const uint64_t *k, size_t n, size_t from);
void radix_ref_remove(radix_ref_t *m, unsigned b);
void radix_ref_match(const radix_ref_t *m, const uint64_t *k, size_t n, uint32_t *out);
/* What pcr_index_last_use gives: the last use of b's record of k[0..n), or 0. */
uint64_t radix_ref_last_use(const radix_ref_t *m, unsigned b, const uint64_t *k, size_t n);
/* What pcr_index_evict_older does: drops b's records used at or before `time` that no newer
 * record of b needs, until none; returns how many. */
uint64_t radix_ref_evict_older(radix_ref_t *m, unsigned b, uint64_t time);
/* 1 when the index holds the same blocks, by counts and a match of every record. */
int radix_ref_same(const pcr_index_t *ix, const radix_ref_t *m);

#endif
