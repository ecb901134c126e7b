/* test/unit/router/share/test_share_table.c: tests router/share/share_table.c, what a replica knows
 * of every backend's prefixes: random commits, forgets and resets against a naive list that does
 * the same, and the byte bound with its eviction of old entries. */
#include <stdlib.h>
#include <string.h>

#include "pcr/common.h"
#include "pcr_test.h"
#include "share_table.h"

#define NBASE 6
#define MAXN 48
#define NB 3

/* Keys are prefixes of a few random sequences: like chained block hashes, a key's last block
 * names the whole prefix. */
static uint64_t base[NBASE][MAXN];

typedef struct {
    int live;
    unsigned backend;
    int seq;
    size_t n;
    uint64_t time;
} ref_t;

#define MAXREF 4096
static ref_t ref[MAXREF];

static long ref_find(unsigned b, int seq, size_t n)
{
    for (long i = 0; i < MAXREF; i++)
        if (ref[i].live && ref[i].backend == b && ref[i].seq == seq && ref[i].n == n)
            return i;
    return -1;
}

static int ref_commit(unsigned b, int seq, size_t n, uint64_t time)
{
    long at = ref_find(b, seq, n);
    if (at >= 0) {
        if (ref[at].time < time)
            ref[at].time = time;
        return 0;
    }
    for (size_t k = 1; k < n; k++) {
        long p = ref_find(b, seq, k);
        if (p >= 0) {
            if (ref[p].time > time)
                time = ref[p].time;
            ref[p].live = 0;
        }
    }
    for (long i = 0; i < MAXREF; i++)
        if (!ref[i].live) {
            ref[i] = (ref_t){1, b, seq, n, time};
            return 1;
        }
    return -100;
}

static void ref_forget(unsigned b, int seq, size_t n, size_t from)
{
    if (from >= n)
        return;
    long at = ref_find(b, seq, n);
    if (at < 0)
        return;
    ref[at].live = 0;
    if (from > 0)
        ref_commit(b, seq, from, ref[at].time);
}

/* The table holds exactly the reference's entries, with their times. */
static void check_same(const pcr_share_table_t *t)
{
    const pcr_share_entry_t **v;
    size_t n, live = 0;
    PCR_CHECK_EQ_INT(pcr_share_table_list(t, &v, &n), 0);
    for (long i = 0; i < MAXREF; i++)
        live += ref[i].live;
    PCR_CHECK_EQ_INT(n, live);
    PCR_CHECK_EQ_INT(pcr_share_table_count(t), live);
    for (size_t i = 0; i < n; i++) {
        const pcr_share_entry_t *e = v[i];
        if (i > 0)
            PCR_CHECK(v[i - 1]->time <= e->time);   /* oldest first */
        int seq = -1;
        for (int s = 0; s < NBASE; s++)
            if (memcmp(e->blocks, base[s], e->nblocks * 8) == 0)
                seq = s;
        long r = ref_find(e->backend, seq, e->nblocks);
        PCR_CHECK(r >= 0);
        if (r >= 0)
            PCR_CHECK_EQ_U64(e->time, ref[r].time);
    }
    free(v);
}

static void test_against_reference(void)
{
    srand(99);
    for (int s = 0; s < NBASE; s++)
        for (int i = 0; i < MAXN; i++)
            base[s][i] = ((uint64_t)rand() << 33) ^ ((uint64_t)rand() << 11) ^ (uint64_t)rand();
    memset(ref, 0, sizeof ref);
    pcr_share_table_t *t = pcr_share_table_new(NB, (size_t)64 << 20, 1);
    PCR_CHECK(t != NULL);
    uint64_t now = 1000;
    for (int step = 0; step < 20000 && t != NULL; step++) {
        unsigned b = (unsigned)(rand() % NB);
        int seq = rand() % NBASE;
        size_t n = 1 + (size_t)(rand() % MAXN);
        int what = rand() % 100;
        now += (uint64_t)(rand() % 3);
        /* Some commits come with an older time, as a snapshot's do. */
        uint64_t time = what < 10 ? now - (uint64_t)(rand() % 500) : now;
        if (what < 75) {
            int want = ref_commit(b, seq, n, time);
            PCR_CHECK_EQ_INT(pcr_share_table_commit(t, b, base[seq], n, time), want);
        } else if (what < 97) {
            size_t from = (size_t)(rand() % (int)(n + 1));
            ref_forget(b, seq, n, from);
            pcr_share_table_forget(t, b, base[seq], n, from);
        } else {
            for (long i = 0; i < MAXREF; i++)
                if (ref[i].live && ref[i].backend == b)
                    ref[i].live = 0;
            pcr_share_table_reset(t, b);
        }
        if (step % 97 == 0)
            check_same(t);
    }
    if (t != NULL)
        check_same(t);
    pcr_share_table_free(t);
}

static void test_extension_replaces_and_version_moves(void)
{
    uint64_t k[4] = {10, 11, 12, 13};
    pcr_share_table_t *t = pcr_share_table_new(2, 1 << 20, 7);
    uint64_t v0 = pcr_share_table_version(t);
    PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 0, k, 2, 50), 1);
    PCR_CHECK(pcr_share_table_version(t) != v0);
    PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 0, k, 2, 40), 0);   /* known; time kept at 50 */
    PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 1, k, 2, 40), 1);   /* another backend: new */
    PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 0, k, 4, 45), 1);   /* extends: replaces */
    PCR_CHECK_EQ_INT(pcr_share_table_count(t), 2);
    const pcr_share_entry_t **v;
    size_t n;
    PCR_CHECK_EQ_INT(pcr_share_table_list(t, &v, &n), 0);
    PCR_CHECK_EQ_INT(n, 2);
    if (n == 2) {
        PCR_CHECK(v[0]->backend == 1 && v[0]->time == 40 && v[0]->nblocks == 2);
        /* The longer key inherits the later use of the one it replaced. */
        PCR_CHECK(v[1]->backend == 0 && v[1]->time == 50 && v[1]->nblocks == 4);
    }
    free(v);
    /* A forget from block 1: the backend still holds the first block. */
    pcr_share_table_forget(t, 0, k, 4, 1);
    PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 0, k, 1, 1), 0);
    PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 0, k, 4, 1), 1);
    pcr_share_table_reset(t, 0);
    PCR_CHECK_EQ_INT(pcr_share_table_count(t), 1);
    PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 9, k, 1, 1), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 0, k, 0, 1), PCR_ERR_INVAL);
    pcr_share_table_free(t);
    pcr_share_table_free(NULL);
    PCR_CHECK(pcr_share_table_new(0, 1 << 20, 1) == NULL);
}

/* Past the bound, old entries go first: most survivors are among the newest. */
static void test_bound_evicts_old_entries(void)
{
    size_t max = 64 * 1024;
    pcr_share_table_t *t = pcr_share_table_new(4, max, 3);
    uint64_t key[8];
    for (uint64_t i = 1; i <= 5000; i++) {
        for (int j = 0; j < 8; j++)
            key[j] = i * 131 + (uint64_t)j * 7919;
        PCR_CHECK_EQ_INT(pcr_share_table_commit(t, (unsigned)(i % 4), key, 8, i), 1);
        PCR_CHECK(pcr_share_table_bytes(t) <= max);
        /* The entry just made is never the one evicted. */
        PCR_CHECK_EQ_INT(pcr_share_table_commit(t, (unsigned)(i % 4), key, 8, i), 0);
    }
    const pcr_share_entry_t **v;
    size_t n;
    PCR_CHECK_EQ_INT(pcr_share_table_list(t, &v, &n), 0);
    PCR_CHECK(n > 100 && n < 1000);
    size_t recent = 0;
    for (size_t i = 0; i < n; i++)
        recent += v[i]->time > 5000 - 2 * n;
    PCR_CHECK(recent * 10 >= n * 9);   /* at least 90% are among the 2n newest */
    free(v);
    /* A key larger than the whole bound is refused, the table left as it was. */
    uint64_t *huge = calloc(10000, sizeof(uint64_t));
    huge[9999] = 1;
    PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 0, huge, 10000, 9999), PCR_ERR_TOO_LARGE);
    PCR_CHECK_EQ_INT(pcr_share_table_count(t), n);
    free(huge);
    pcr_share_table_free(t);
}

/* A backend's keys stay within its capacity in blocks, the newest kept; others untouched. */
static void test_backend_capacity(void)
{
    pcr_share_table_t *t = pcr_share_table_new(2, 1 << 20, 5);
    uint64_t key[10];
    pcr_share_table_set_capacity(t, 0, 100);
    for (uint64_t i = 1; i <= 60; i++) {
        for (int j = 0; j < 10; j++)
            key[j] = i * 1000003 + (uint64_t)j;
        PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 0, key, 10, i), 1);
        PCR_CHECK(pcr_share_table_held(t, 0) <= 100);
        PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 0, key, 10, i), 0);   /* the newest stays */
        PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 1, key, 10, i), 1);   /* no bound on 1 */
    }
    PCR_CHECK_EQ_INT(pcr_share_table_held(t, 0), 100);
    PCR_CHECK_EQ_INT(pcr_share_table_held(t, 1), 600);
    const pcr_share_entry_t **v;
    size_t n, recent = 0, of0 = 0;
    PCR_CHECK_EQ_INT(pcr_share_table_list(t, &v, &n), 0);
    for (size_t i = 0; i < n; i++)
        if (v[i]->backend == 0) {
            of0++;
            recent += v[i]->time > 40;
        }
    PCR_CHECK_EQ_INT(of0, 10);
    PCR_CHECK(recent >= 8);
    free(v);
    /* Lowering the bound evicts down to it; a key longer than the bound alone is kept. */
    pcr_share_table_set_capacity(t, 0, 30);
    PCR_CHECK(pcr_share_table_held(t, 0) <= 30);
    uint64_t longkey[40];
    for (int j = 0; j < 40; j++)
        longkey[j] = 777 + (uint64_t)j;
    PCR_CHECK_EQ_INT(pcr_share_table_commit(t, 0, longkey, 40, 100), 1);
    PCR_CHECK_EQ_INT(pcr_share_table_held(t, 0), 40);
    pcr_share_table_set_capacity(t, 0, 0);
    PCR_CHECK_EQ_INT(pcr_share_table_held(t, 0), 0);
    PCR_CHECK_EQ_INT(pcr_share_table_held(t, 1), 600);
    pcr_share_table_free(t);
}

int main(void)
{
    PCR_RUN(test_against_reference);
    PCR_RUN(test_extension_replaces_and_version_moves);
    PCR_RUN(test_bound_evicts_old_entries);
    PCR_RUN(test_backend_capacity);
    return pcr_test_done();
}
