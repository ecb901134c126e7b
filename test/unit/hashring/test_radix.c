/* test_radix.c: hashring/radix.c, the prefix index. Hand-written cases first, then a
 * randomised comparison with a naive reference model (every prefix of every backend kept as
 * its own record) operation by operation, then allocation failures and the memory cap. */
#include <stdlib.h>

#include "pcr/index.h"
#include "pcr_test.h"
#include "radix_ref.h"

static char errbuf[256];

#define CHECK_VALID(ix) do { \
    errbuf[0] = '\0'; \
    int rc_ = pcr_index_check((ix), errbuf, sizeof(errbuf)); \
    if (rc_ != 0) printf("# invalid: %s\n", errbuf); \
    PCR_CHECK_EQ_INT(rc_, 0); } while (0)

static pcr_index_t *new_index(size_t nb, size_t max_bytes)
{
    pcr_index_opts_t o = {.nbackends = nb, .max_bytes = max_bytes};
    return pcr_index_new(&o);
}

static void test_insert_and_match(void)
{
    pcr_index_t *ix = new_index(4, 0);
    uint32_t m[4];
    size_t from;
    const uint64_t a[] = {10, 11, 12, 13, 14, 15};
    const uint64_t b[] = {10, 11, 12, 99, 98};

    PCR_CHECK_EQ_INT(pcr_index_insert(ix, 0, a, 6, 1, &from), 0);
    PCR_CHECK_EQ_INT(from, 0);
    PCR_CHECK_EQ_INT(pcr_index_insert(ix, 1, b, 5, 2, &from), 0);
    PCR_CHECK_EQ_INT(from, 0);
    PCR_CHECK_EQ_INT(pcr_index_insert(ix, 0, a, 4, 3, &from), 0);
    PCR_CHECK_EQ_INT(from, 4);  /* held all four already */
    PCR_CHECK_EQ_INT(pcr_index_insert(ix, 1, a, 5, 4, &from), 0);
    PCR_CHECK_EQ_INT(from, 3);
    CHECK_VALID(ix);
    PCR_CHECK_EQ_INT(pcr_index_match(ix, a, 6, m), 6);
    PCR_CHECK_EQ_INT(m[0], 6);
    PCR_CHECK_EQ_INT(m[1], 5);
    PCR_CHECK_EQ_INT(m[2], 0);
    PCR_CHECK_EQ_INT(pcr_index_match(ix, b, 5, m), 5);
    PCR_CHECK_EQ_INT(m[0], 3);
    PCR_CHECK_EQ_INT(m[1], 5);
    const uint64_t c[] = {10, 11, 77};
    PCR_CHECK_EQ_INT(pcr_index_match(ix, c, 3, m), 2);
    PCR_CHECK_EQ_INT(m[0], 2);
    PCR_CHECK_EQ_INT(m[1], 2);
    PCR_CHECK_EQ_INT(pcr_index_match(ix, c + 2, 1, m), 0);
    PCR_CHECK_EQ_U64(pcr_index_backend_blocks(ix, 0), 6);
    PCR_CHECK_EQ_U64(pcr_index_backend_blocks(ix, 1), 7);
    PCR_CHECK_EQ_U64(pcr_index_pairs(ix), 13);
    PCR_CHECK(pcr_index_nodes(ix) >= 4);
    pcr_index_free(ix);
}

static void test_bad_arguments(void)
{
    pcr_index_opts_t o = {.nbackends = 0};
    uint64_t k[1] = {1};
    size_t from = 7;
    PCR_CHECK(pcr_index_new(&o) == NULL);
    PCR_CHECK(pcr_index_new(NULL) == NULL);
    pcr_index_t *ix = new_index(2, 0);
    PCR_CHECK_EQ_INT(pcr_index_insert(ix, 2, k, 1, 1, &from), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_index_insert(ix, 0, NULL, 1, 1, &from), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_index_insert(ix, 0, k, 0, 1, &from), 0);
    PCR_CHECK_EQ_INT(from, 0);
    PCR_CHECK_EQ_INT(pcr_index_set_capacity(ix, 5, 1), PCR_ERR_INVAL);
    pcr_index_erase(ix, 9, k, 1, 0);
    pcr_index_remove_backend(ix, 9);
    CHECK_VALID(ix);
    pcr_index_free(ix);
    pcr_index_free(NULL);
}

static void test_erase_undoes_insert(void)
{
    pcr_index_t *ix = new_index(2, 0);
    uint32_t m[2];
    size_t from, nodes;
    const uint64_t a[] = {1, 2, 3, 4};
    const uint64_t b[] = {1, 2, 3, 4, 5, 6, 7};

    pcr_index_insert(ix, 0, a, 4, 1, &from);
    nodes = pcr_index_nodes(ix);
    pcr_index_insert(ix, 0, b, 7, 2, &from);
    PCR_CHECK_EQ_INT(from, 4);
    pcr_index_erase(ix, 0, b, 7, from);
    CHECK_VALID(ix);
    pcr_index_match(ix, b, 7, m);
    PCR_CHECK_EQ_INT(m[0], 4);
    PCR_CHECK_EQ_INT(pcr_index_nodes(ix), nodes);
    /* A block another of the backend's prefixes needs is kept. */
    const uint64_t c[] = {1, 2, 9};
    pcr_index_insert(ix, 1, b, 6, 3, &from);
    pcr_index_insert(ix, 1, c, 3, 4, &from);
    pcr_index_erase(ix, 1, b, 6, 0);
    CHECK_VALID(ix);
    pcr_index_match(ix, c, 3, m);
    PCR_CHECK_EQ_INT(m[1], 3);
    pcr_index_match(ix, b, 6, m);
    PCR_CHECK_EQ_INT(m[1], 2);
    PCR_CHECK_EQ_INT(m[0], 4);
    /* Erasing the middle of a run trims it. */
    pcr_index_erase(ix, 0, a, 4, 2);
    pcr_index_match(ix, a, 4, m);
    PCR_CHECK_EQ_INT(m[0], 2);
    CHECK_VALID(ix);
    pcr_index_free(ix);
}

static void test_capacity_evicts_lru(void)
{
    pcr_index_t *ix = new_index(2, 0);
    uint32_t m[2];
    size_t from;
    const uint64_t a[] = {1, 2, 3, 4, 5, 6};
    const uint64_t b[] = {7, 8, 9, 10, 11, 12};
    const uint64_t c[] = {13, 14, 15};

    pcr_index_set_capacity(ix, 0, 10);
    pcr_index_insert(ix, 0, a, 6, 1, &from);
    pcr_index_insert(ix, 0, b, 6, 2, &from);
    CHECK_VALID(ix);
    PCR_CHECK_EQ_U64(pcr_index_backend_blocks(ix, 0), 10);
    pcr_index_match(ix, a, 6, m);
    PCR_CHECK_EQ_INT(m[0], 4);  /* the oldest prefix lost its last two blocks */
    PCR_CHECK_EQ_U64(pcr_index_evictions(ix), 2);
    pcr_index_match(ix, b, 6, m);
    PCR_CHECK_EQ_INT(m[0], 6);
    /* Using a makes b the oldest. */
    pcr_index_insert(ix, 0, a, 4, 3, &from);
    pcr_index_insert(ix, 0, c, 3, 4, &from);
    pcr_index_match(ix, b, 6, m);
    PCR_CHECK_EQ_INT(m[0], 3);
    pcr_index_match(ix, a, 6, m);
    PCR_CHECK_EQ_INT(m[0], 4);
    PCR_CHECK_EQ_U64(pcr_index_evictions(ix), 5);
    /* Forgetting on request is not an eviction. */
    pcr_index_erase(ix, 0, c, 3, 2);
    PCR_CHECK_EQ_U64(pcr_index_evictions(ix), 5);
    /* Shrinking the capacity evicts at once; the other backend is untouched. */
    pcr_index_insert(ix, 1, a, 6, 5, &from);
    PCR_CHECK_EQ_INT(pcr_index_set_capacity(ix, 0, 2), 0);
    PCR_CHECK_EQ_U64(pcr_index_backend_blocks(ix, 0), 2);
    PCR_CHECK_EQ_U64(pcr_index_evictions(ix), 5 + 7);
    pcr_index_match(ix, a, 6, m);
    PCR_CHECK_EQ_INT(m[1], 6);
    CHECK_VALID(ix);
    pcr_index_free(ix);
}

static void test_remove_backend(void)
{
    pcr_index_t *ix = new_index(300, 0);
    uint32_t m[300];
    size_t from;
    uint64_t k[40];
    for (int i = 0; i < 40; i++)
        k[i] = 1000 + (uint64_t)i;
    for (unsigned b = 0; b < 300; b++)
        pcr_index_insert(ix, b, k, 1 + b % 40, b, &from);
    CHECK_VALID(ix);
    pcr_index_match(ix, k, 40, m);
    PCR_CHECK_EQ_INT(m[0], 1);
    PCR_CHECK_EQ_INT(m[299], 1 + 299 % 40);
    pcr_index_remove_backend(ix, 299);
    pcr_index_remove_backend(ix, 0);
    CHECK_VALID(ix);
    pcr_index_match(ix, k, 40, m);
    PCR_CHECK_EQ_INT(m[0], 0);
    PCR_CHECK_EQ_INT(m[299], 0);
    PCR_CHECK_EQ_INT(m[39], 40);
    for (unsigned b = 0; b < 300; b++)
        pcr_index_remove_backend(ix, b);
    PCR_CHECK_EQ_U64(pcr_index_nodes(ix), 0);
    PCR_CHECK_EQ_U64(pcr_index_pairs(ix), 0);
    CHECK_VALID(ix);
    pcr_index_free(ix);
}

/* A pod that evicted a block used at time t has evicted everything it used before. */
static void test_last_use_and_evict_older(void)
{
    pcr_index_t *ix = new_index(2, 0);
    uint32_t m[2];
    size_t from;
    const uint64_t sys_a[] = {1, 2, 3, 4};     /* a shared head, then a's own blocks */
    const uint64_t sys_b[] = {1, 2, 5, 6, 7};
    const uint64_t c[] = {8, 9};

    pcr_index_insert(ix, 0, sys_a, 4, 10, &from);
    pcr_index_insert(ix, 0, sys_b, 5, 20, &from);
    pcr_index_insert(ix, 0, c, 2, 30, &from);
    pcr_index_insert(ix, 1, sys_a, 4, 5, &from);
    PCR_CHECK_EQ_U64(pcr_index_last_use(ix, 0, sys_a, 4), 10);
    PCR_CHECK_EQ_U64(pcr_index_last_use(ix, 0, sys_a, 2), 20);   /* the head is newer */
    PCR_CHECK_EQ_U64(pcr_index_last_use(ix, 0, sys_b, 3), 20);   /* inside a run */
    PCR_CHECK_EQ_U64(pcr_index_last_use(ix, 1, sys_a, 4), 5);
    PCR_CHECK_EQ_U64(pcr_index_last_use(ix, 1, sys_b, 3), 0);    /* not held */
    const uint64_t off[] = {1, 2, 3, 99};
    PCR_CHECK_EQ_U64(pcr_index_last_use(ix, 0, off, 4), 0);      /* not in the tree */
    PCR_CHECK_EQ_U64(pcr_index_last_use(ix, 0, off, 0), 0);

    PCR_CHECK_EQ_U64(pcr_index_evict_older(ix, 0, 9), 0);
    PCR_CHECK_EQ_U64(pcr_index_evict_older(ix, 0, 10), 2);       /* a's tail: 3, 4 */
    pcr_index_match(ix, sys_a, 4, m);
    PCR_CHECK_EQ_INT(m[0], 2);
    PCR_CHECK_EQ_INT(m[1], 4);                                   /* the other pod keeps it */
    PCR_CHECK_EQ_U64(pcr_index_evict_older(ix, 0, 25), 5);       /* b with its head */
    pcr_index_match(ix, sys_b, 5, m);
    PCR_CHECK_EQ_INT(m[0], 0);
    pcr_index_match(ix, c, 2, m);
    PCR_CHECK_EQ_INT(m[0], 2);
    PCR_CHECK_EQ_U64(pcr_index_backend_blocks(ix, 0), 2);
    CHECK_VALID(ix);
    PCR_CHECK_EQ_U64(pcr_index_evict_older(ix, 7, 25), 0);
    PCR_CHECK_EQ_U64(pcr_index_last_use(ix, 7, c, 2), 0);
    pcr_index_free(ix);
}

/* ---- against the naive reference model (radix_ref.c) ---------------------------------- */

#define RL RADIX_REF_MAXLEN

static uint64_t rng_state = 0x12345678;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static size_t random_key(uint64_t *k)
{
    size_t n = 1 + rnd() % RL;
    for (size_t i = 0; i < n; i++)
        k[i] = 1 + rnd() % 3;
    return n;
}

static void test_random_against_reference(void)
{
    static radix_ref_t m;
    const unsigned nb = 4;
    pcr_index_t *ix = new_index(nb, 0);
    uint64_t k[RL];
    uint32_t got[8], want[8];
    int mismatches = 0, invalid = 0;

    radix_ref_init(&m, nb);
    for (uint64_t step = 1; step <= 20000 && !mismatches && !invalid; step++) {
        unsigned b = (unsigned)(rnd() % nb);
        size_t n = random_key(k);
        unsigned op = (unsigned)(rnd() % 100);
        if (op < 55) {
            size_t from;
            size_t want_from = radix_ref_insert(&m, b, k, n, step);
            pcr_index_insert(ix, b, k, n, step, &from);
            mismatches += from != want_from;
        } else if (op < 80) {
            radix_ref_match(&m, k, n, want);
            pcr_index_match(ix, k, n, got);
            mismatches += memcmp(got, want, nb * sizeof(uint32_t)) != 0;
            size_t upto = 1 + rnd() % n;
            mismatches += pcr_index_last_use(ix, b, k, upto) != radix_ref_last_use(&m, b, k, upto);
        } else if (op < 84) {
            uint64_t t = step > 40 ? step - 1 - rnd() % 40 : 0;
            mismatches += pcr_index_evict_older(ix, b, t) != radix_ref_evict_older(&m, b, t);
        } else if (op < 92) {
            size_t from = rnd() % n;
            radix_ref_erase(&m, b, k, n, from);
            pcr_index_erase(ix, b, k, n, from);
        } else if (op < 98) {
            uint64_t cap = rnd() % 4 == 0 ? PCR_INDEX_UNLIMITED : 3 + rnd() % 30;
            radix_ref_set_capacity(&m, b, cap);
            pcr_index_set_capacity(ix, b, cap);
        } else {
            radix_ref_remove(&m, b);
            pcr_index_remove_backend(ix, b);
        }
        invalid += pcr_index_check(ix, errbuf, sizeof(errbuf)) != 0;
        if (!invalid && step % 7 == 0)
            mismatches += !radix_ref_same(ix, &m);
        if (mismatches || invalid)
            printf("# step %llu op %u backend %u: %s\n", (unsigned long long)step, op, b,
                   invalid ? errbuf : "differs from the reference");
    }
    PCR_CHECK_EQ_INT(mismatches, 0);
    PCR_CHECK_EQ_INT(invalid, 0);
    PCR_CHECK(radix_ref_same(ix, &m));
    PCR_CHECK(!m.full);
    pcr_index_free(ix);
}

/* ---- allocation failures ------------------------------------------------------------------ */

typedef struct {
    long calls, fail_at, fail_every;
    size_t live;
} failing_t;

static void *failing_malloc(size_t size, void *ud)
{
    failing_t *f = ud;
    f->calls++;
    if (f->calls == f->fail_at || (f->fail_every && f->calls % f->fail_every == 0))
        return NULL;
    f->live += size;
    return malloc(size);
}

static void failing_free(void *p, size_t size, void *ud)
{
    failing_t *f = ud;
    f->live -= size;
    free(p);
}

/* A fixed workload; after every failed call the index must be valid and the backend must
 * still hold at least what it held before. */
static int run_workload(pcr_index_t *ix, int *nomem)
{
    uint64_t k[RL];
    uint32_t before[4], after[4];
    int bad = 0;
    rng_state = 42;
    for (uint64_t step = 1; step <= 400; step++) {
        unsigned b = (unsigned)(rnd() % 4);
        size_t n = random_key(k), from;
        k[0] += rnd() % 40;  /* a wide root, so the table grows */
        pcr_index_match(ix, k, n, before);
        if (rnd() % 5 == 0) {
            pcr_index_erase(ix, b, k, n, rnd() % n);
        } else if (pcr_index_insert(ix, b, k, n, step, &from) == PCR_ERR_NOMEM) {
            (*nomem)++;
            pcr_index_match(ix, k, n, after);
            bad += after[b] < before[b];
        }
        if (pcr_index_check(ix, errbuf, sizeof(errbuf)) != 0) {
            printf("# step %llu: %s\n", (unsigned long long)step, errbuf);
            return 1;
        }
    }
    return bad;
}

static void test_allocation_failures(void)
{
    int bad = 0, nomem = 0, null_new = 0;
    for (long nth = 1; nth <= 1200 && !bad; nth++) {
        failing_t f = {.fail_at = nth};
        pcr_index_allocator_t a = {failing_malloc, failing_free, &f};
        pcr_index_opts_t o = {.nbackends = 4, .alloc = &a};
        pcr_index_t *ix = pcr_index_new(&o);
        if (ix == NULL) {
            null_new++;
            bad += f.live != 0;
            continue;
        }
        pcr_index_set_capacity(ix, 1, 25);
        bad += run_workload(ix, &nomem);
        pcr_index_free(ix);
        bad += f.live != 0;  /* nothing leaked */
    }
    PCR_CHECK_EQ_INT(bad, 0);
    PCR_CHECK(null_new >= 1);
    PCR_CHECK(nomem > 100);
    /* Frequent failures too: one call in five. */
    failing_t f = {.fail_every = 5};
    pcr_index_allocator_t a = {failing_malloc, failing_free, &f};
    pcr_index_opts_t o = {.nbackends = 4, .alloc = &a, .max_bytes = 6000};
    pcr_index_t *ix = NULL;
    while (ix == NULL)
        ix = pcr_index_new(&o);
    nomem = 0;
    PCR_CHECK_EQ_INT(run_workload(ix, &nomem), 0);
    PCR_CHECK(nomem > 10);
    pcr_index_free(ix);
    PCR_CHECK_EQ_INT(f.live, 0);
}

/* ---- the memory cap ----------------------------------------------------------------------- */

static void test_memory_cap_evicts_oldest(void)
{
    const size_t cap = 64 * 1024;
    pcr_index_t *ix = new_index(4, cap);
    uint64_t k[8];
    uint32_t m[4];
    size_t from;
    int over = 0;
    for (uint64_t i = 0; i < 2000; i++) {
        for (int j = 0; j < 8; j++)
            k[j] = i * 100 + (uint64_t)j;
        pcr_index_insert(ix, (unsigned)(i % 4), k, 8, i + 1, &from);
        over += pcr_index_bytes(ix) > cap;
    }
    CHECK_VALID(ix);
    PCR_CHECK_EQ_INT(over, 0);
    PCR_CHECK(pcr_index_pairs(ix) > 100);
    /* Every pair inserted is either still there or was evicted. */
    PCR_CHECK_EQ_U64(pcr_index_pairs(ix) + pcr_index_evictions(ix), 2000 * 8);
    for (int j = 0; j < 8; j++)
        k[j] = 0 * 100 + (uint64_t)j;
    PCR_CHECK_EQ_INT(pcr_index_match(ix, k, 8, m), 0);   /* the first went first */
    for (int j = 0; j < 8; j++)
        k[j] = 1999 * 100 + (uint64_t)j;
    PCR_CHECK_EQ_INT(pcr_index_match(ix, k, 8, m), 8);   /* the last is there */
    PCR_CHECK_EQ_INT(m[1999 % 4], 8);
    pcr_index_free(ix);
}

int main(void)
{
    PCR_RUN(test_insert_and_match);
    PCR_RUN(test_bad_arguments);
    PCR_RUN(test_erase_undoes_insert);
    PCR_RUN(test_capacity_evicts_lru);
    PCR_RUN(test_remove_backend);
    PCR_RUN(test_last_use_and_evict_older);
    PCR_RUN(test_random_against_reference);
    PCR_RUN(test_allocation_failures);
    PCR_RUN(test_memory_cap_evicts_oldest);
    return pcr_test_done();
}
