/* test_kvtable.c: hashring/kvtable.c, what each pod says it holds (include/pcr/kvtable.h):
 * the cases one by one, then random events against a naive model, with every invariant
 * checked after each step. */
#include <stdlib.h>

#include "pcr/kvtable.h"
#include "pcr_test.h"

#define BT 4 /* tokens per block in these tests */

static pcr_kvtable_t *make(size_t nb, size_t max_bytes)
{
    pcr_kvtable_opts_t o = {nb, BT, max_bytes, 100};
    return pcr_kvtable_new(&o);
}

static void checked(pcr_kvtable_t *t)
{
    char err[160] = "";
    int rc = pcr_kvtable_check(t, err, sizeof(err));
    if (rc != 0)
        printf("# %s\n", err);
    PCR_CHECK_EQ_INT(rc, 0);
}

/* tokens of a prompt: block i is {i*10+salt, ...}. */
static void prompt(uint32_t *tok, size_t blocks, uint32_t salt)
{
    for (size_t i = 0; i < blocks * BT; i++)
        tok[i] = (uint32_t)(i / BT * 10 + salt + i % BT * 1000);
}

static int store(pcr_kvtable_t *t, unsigned b, const uint64_t *hashes, size_t n, int has_parent,
                 uint64_t parent, const uint32_t *tok, pcr_kvt_medium_t m)
{
    pcr_kvt_stored_t ev = {hashes, n, has_parent, parent, tok, BT, m, 0};
    return pcr_kvtable_stored(t, b, &ev, 1);
}

static void test_key(void)
{
    uint32_t tok[4 * BT + 3];
    prompt(tok, 4, 0);
    uint64_t a[8], b[8];
    PCR_CHECK_EQ_INT(pcr_kvtable_key(0, BT, tok, 4 * BT + 3, a, 8), 4); /* whole blocks only */
    PCR_CHECK_EQ_INT(pcr_kvtable_key(0, BT, tok, 3 * BT, b, 8), 3);
    PCR_CHECK(a[0] == b[0] && a[2] == b[2]);
    PCR_CHECK_EQ_INT(pcr_kvtable_key(0, BT, tok, 4 * BT, b, 2), 2); /* at most max */
    PCR_CHECK_EQ_INT(pcr_kvtable_key(7, BT, tok, 4 * BT, b, 8), 4); /* another seed */
    PCR_CHECK(a[0] != b[0] && a[3] != b[3]);
    tok[BT] ^= 1; /* block 1 differs: block 0 is shared, every later chain differs */
    PCR_CHECK_EQ_INT(pcr_kvtable_key(0, BT, tok, 4 * BT, b, 8), 4);
    PCR_CHECK(a[0] == b[0] && a[1] != b[1] && a[3] != b[3]);
    PCR_CHECK_EQ_INT(pcr_kvtable_key(0, 0, tok, 4 * BT, b, 8), 0);
}

/* A pod stores a prompt in two events (the second continues the first through its parent);
 * a request with the same tokens matches it whole, one with more matches the part held. */
static void test_stored_then_matched(void)
{
    pcr_kvtable_t *t = make(3, 0);
    uint32_t tok[6 * BT];
    prompt(tok, 6, 0);
    uint64_t h1[2] = {0xa1, 0xa2}, h2[2] = {0xa3, 0xa4};
    PCR_CHECK_EQ_INT(store(t, 1, h1, 2, 0, 0, tok, PCR_KVT_GPU), 0);
    PCR_CHECK_EQ_INT(store(t, 1, h2, 2, 1, 0xa2, tok + 2 * BT, PCR_KVT_GPU), 0);
    /* Pod 2 holds the first block only, under its own hashes. */
    uint64_t g[1] = {0xbeef};
    PCR_CHECK_EQ_INT(store(t, 2, g, 1, 0, 0, tok, PCR_KVT_GPU), 0);
    uint64_t key[6];
    PCR_CHECK_EQ_INT(pcr_kvtable_key(0, BT, tok, 6 * BT, key, 6), 6);
    uint32_t gpu[3], any[3];
    PCR_CHECK_EQ_INT(pcr_kvtable_match(t, key, 6, gpu, any), 4);
    PCR_CHECK(gpu[0] == 0 && gpu[1] == 4 && gpu[2] == 1);
    PCR_CHECK(any[0] == 0 && any[1] == 4 && any[2] == 1);
    PCR_CHECK_EQ_INT(pcr_kvtable_entries(t, 1, PCR_KVT_GPU), 4);
    /* Stored again: nothing changes. */
    PCR_CHECK_EQ_INT(store(t, 1, h1, 2, 0, 0, tok, PCR_KVT_GPU), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_entries(t, 1, PCR_KVT_GPU), 4);
    checked(t);
    /* An unknown parent: an event was missed; nothing stored. */
    PCR_CHECK_EQ_INT(store(t, 0, h2, 2, 1, 0x999, tok + 2 * BT, PCR_KVT_GPU), PCR_ERR_NOTFOUND);
    PCR_CHECK_EQ_INT(pcr_kvtable_entries(t, 0, PCR_KVT_GPU), 0);
    /* Another block size, or a backend out of range: refused. */
    pcr_kvt_stored_t bad = {h1, 2, 0, 0, tok, BT * 2, PCR_KVT_GPU, 0};
    PCR_CHECK_EQ_INT(pcr_kvtable_stored(t, 0, &bad, 1), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(store(t, 3, h1, 2, 0, 0, tok, PCR_KVT_GPU), PCR_ERR_INVAL);
    checked(t);
    pcr_kvtable_free(t);
}

/* Evictions: the tail first (vLLM's order) shortens the match; a hole in the middle stops it
 * there, as vLLM's own lookup stops at its first miss. */
static void test_removed(void)
{
    pcr_kvtable_t *t = make(1, 0);
    uint32_t tok[4 * BT];
    prompt(tok, 4, 0);
    uint64_t h[4] = {1, 2, 3, 4}, key[4];
    PCR_CHECK_EQ_INT(store(t, 0, h, 4, 0, 0, tok, PCR_KVT_GPU), 0);
    pcr_kvtable_key(0, BT, tok, 4 * BT, key, 4);
    uint32_t any[1];
    PCR_CHECK_EQ_INT(pcr_kvtable_removed(t, 0, h + 3, 1, PCR_KVT_GPU), 1);
    PCR_CHECK_EQ_INT(pcr_kvtable_match(t, key, 4, NULL, any), 3);
    PCR_CHECK_EQ_INT(pcr_kvtable_removed(t, 0, h + 1, 1, PCR_KVT_GPU), 1);
    PCR_CHECK_EQ_INT(pcr_kvtable_match(t, key, 4, NULL, any), 1);
    PCR_CHECK_EQ_INT(pcr_kvtable_removed(t, 0, h + 1, 1, PCR_KVT_GPU), 0); /* gone already */
    PCR_CHECK_EQ_INT(pcr_kvtable_removed(t, 0, h, 1, PCR_KVT_CPU), 0);     /* not on the CPU */
    PCR_CHECK_EQ_INT(pcr_kvtable_entries(t, 0, PCR_KVT_GPU), 2);
    checked(t);
    pcr_kvtable_free(t);
}

/* Offloading: a block moves to the CPU (stored there, then removed from the GPU). It still
 * matches, but not as a GPU hit. */
static void test_media(void)
{
    pcr_kvtable_t *t = make(1, 0);
    uint32_t tok[2 * BT];
    prompt(tok, 2, 3);
    uint64_t h[2] = {10, 11}, key[2];
    pcr_kvtable_key(0, BT, tok, 2 * BT, key, 2);
    PCR_CHECK_EQ_INT(store(t, 0, h, 2, 0, 0, tok, PCR_KVT_GPU), 0);
    PCR_CHECK_EQ_INT(store(t, 0, h + 1, 1, 1, 10, tok + BT, PCR_KVT_CPU), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_removed(t, 0, h + 1, 1, PCR_KVT_GPU), 1);
    uint32_t gpu[1], any[1];
    PCR_CHECK_EQ_INT(pcr_kvtable_match(t, key, 2, gpu, any), 2);
    PCR_CHECK_EQ_INT(gpu[0], 1);
    PCR_CHECK_EQ_INT(any[0], 2);
    PCR_CHECK_EQ_INT(pcr_kvtable_entries(t, 0, PCR_KVT_CPU), 1);
    checked(t);
    pcr_kvtable_free(t);
}

/* A request just sent: its blocks count as held until the pod confirms them or the TTL ends. */
static void test_speculative(void)
{
    pcr_kvtable_t *t = make(2, 0);
    uint32_t tok[3 * BT];
    prompt(tok, 3, 5);
    uint64_t key[3], h[3] = {21, 22, 23};
    pcr_kvtable_key(0, BT, tok, 3 * BT, key, 3);
    PCR_CHECK_EQ_INT(pcr_kvtable_speculate(t, 1, key, 3, 1000), 0);
    uint32_t gpu[2], any[2];
    PCR_CHECK_EQ_INT(pcr_kvtable_match(t, key, 3, gpu, any), 3);
    PCR_CHECK(gpu[1] == 3 && any[1] == 3 && any[0] == 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_speculative(t, 1), 3);
    /* The pod confirms the first two; the third stays speculative and expires. */
    PCR_CHECK_EQ_INT(store(t, 1, h, 2, 0, 0, tok, PCR_KVT_GPU), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_speculative(t, 1), 1);
    PCR_CHECK_EQ_INT(pcr_kvtable_expire(t, 1099), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_expire(t, 1100), 1);
    PCR_CHECK_EQ_INT(pcr_kvtable_match(t, key, 3, gpu, any), 2);
    /* Speculated again before its time is up: the later time holds. */
    PCR_CHECK_EQ_INT(pcr_kvtable_speculate(t, 0, key, 1, 2000), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_speculate(t, 0, key, 1, 2050), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_expire(t, 2100), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_speculative(t, 0), 1);
    PCR_CHECK_EQ_INT(pcr_kvtable_expire(t, 2150), 1);
    /* Held already: no speculative entry. */
    PCR_CHECK_EQ_INT(pcr_kvtable_speculate(t, 1, key, 2, 3000), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_speculative(t, 1), 0);
    checked(t);
    /* AllBlocksCleared: everything of that pod, speculative too. */
    PCR_CHECK_EQ_INT(pcr_kvtable_speculate(t, 1, key, 3, 3000), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_speculate(t, 0, key, 3, 3000), 0);
    pcr_kvtable_clear(t, 1);
    PCR_CHECK_EQ_INT(pcr_kvtable_entries(t, 1, PCR_KVT_GPU) + pcr_kvtable_speculative(t, 1), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_match(t, key, 3, gpu, any), 3);
    PCR_CHECK(any[1] == 0 && any[0] == 3);
    checked(t);
    /* A restart seen by other means: the guesses go, what the pod reported stays. */
    PCR_CHECK_EQ_INT(store(t, 1, h, 2, 0, 0, tok, PCR_KVT_GPU), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_speculate(t, 1, key, 3, 4000), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_speculative(t, 1), 1);
    PCR_CHECK_EQ_INT(pcr_kvtable_clear_speculative(t, 1), 1);
    PCR_CHECK_EQ_INT(pcr_kvtable_clear_speculative(t, 1), 0);
    PCR_CHECK_EQ_INT(pcr_kvtable_entries(t, 1, PCR_KVT_GPU), 2);
    PCR_CHECK_EQ_INT(pcr_kvtable_speculative(t, 0), 3);
    PCR_CHECK_EQ_INT(pcr_kvtable_match(t, key, 3, gpu, any), 3);
    PCR_CHECK(any[1] == 2 && any[0] == 3);
    PCR_CHECK_EQ_INT(pcr_kvtable_expire(t, 9000), 3); /* pod 0's; pod 1's queued ones miss */
    checked(t);
    pcr_kvtable_free(t);
}

/* A publisher that never stops storing: the table stays within its bound, refuses and counts
 * the rest, and stays whole. */
static void test_bounded(void)
{
    pcr_kvtable_t *t = make(1, 64 * 1024);
    uint32_t tok[BT];
    int full = 0;
    for (uint32_t i = 0; i < 100000 && !full; i++) {
        for (int k = 0; k < BT; k++)
            tok[k] = i * 7 + (uint32_t)k;
        uint64_t h = i + 1;
        int rc = store(t, 0, &h, 1, 0, 0, tok, PCR_KVT_GPU);
        PCR_CHECK(rc == 0 || rc == PCR_ERR_FULL);
        full = rc == PCR_ERR_FULL;
    }
    PCR_CHECK(full);
    PCR_CHECK(pcr_kvtable_refused(t) >= 1);
    PCR_CHECK(pcr_kvtable_bytes(t) <= 64 * 1024 + 256);
    PCR_CHECK(pcr_kvtable_entries(t, 0, PCR_KVT_GPU) > 500);
    checked(t);
    pcr_kvtable_free(t);
}

/* ---- random events against a naive model ------------------------------------------------- */

#define NB 3
#define MAXE 4096

typedef struct {
    int used, spec;
    unsigned b, medium;
    uint64_t pod, chain, expires;
} ment_t;

static ment_t model[MAXE];

static ment_t *m_find_pod(unsigned b, uint64_t pod, int medium)
{
    for (int i = 0; i < MAXE; i++)
        if (model[i].used && !model[i].spec && model[i].b == b && model[i].pod == pod &&
            (medium < 0 || model[i].medium == (unsigned)medium))
            return &model[i];
    return NULL;
}

static ment_t *m_find_chain(unsigned b, uint64_t chain, int medium)
{
    for (int i = 0; i < MAXE; i++)
        if (model[i].used && model[i].b == b && model[i].chain == chain &&
            (medium == -2 ? 1 : medium < 0 ? model[i].spec
                                           : !model[i].spec && model[i].medium == (unsigned)medium))
            return &model[i];
    return NULL;
}

static ment_t *m_new(void)
{
    for (int i = 0; i < MAXE; i++)
        if (!model[i].used) {
            memset(&model[i], 0, sizeof(model[i]));
            model[i].used = 1;
            return &model[i];
        }
    return NULL;
}

static uint64_t chain_after(uint64_t prev, const uint32_t *tok)
{
    uint64_t c;
    /* The same function as the table's, through its public key call. */
    pcr_kvtable_key(prev, BT, tok, BT, &c, 1);
    return c;
}

static void m_match(const uint64_t *key, size_t n, uint32_t *gpu, uint32_t *any)
{
    for (unsigned b = 0; b < NB; b++) {
        size_t i = 0;
        while (i < n && m_find_chain(b, key[i], -2))
            i++;
        any[b] = (uint32_t)i;
        i = 0;
        while (i < n && (m_find_chain(b, key[i], PCR_KVT_GPU) || m_find_chain(b, key[i], -1)))
            i++;
        gpu[b] = (uint32_t)i;
    }
}

static void test_random_against_model(void)
{
    pcr_kvtable_t *t = make(NB, 0);
    memset(model, 0, sizeof(model));
    srand(12345);
    uint64_t now = 0;
    int failures_before = pcr_test_case_failed;
    int stored = 0, orphans = 0, removed = 0, expired = 0, hits = 0;
    for (int step = 0; step < 6000 && pcr_test_case_failed == failures_before; step++) {
        now += (uint64_t)(rand() % 20);
        unsigned b = (unsigned)(rand() % NB), medium = (unsigned)(rand() % 4 == 0);
        /* Prompts from a small alphabet of blocks, so pods share and collide; up to 12 blocks,
         * past the 8 the table fetches ahead. */
        size_t nblocks = 1 + (size_t)(rand() % (rand() % 4 == 0 ? 12 : 5));
        uint32_t tok[12 * BT];
        for (size_t i = 0; i < nblocks; i++)
            for (int k = 0; k < BT; k++)
                tok[i * BT + (size_t)k] = (uint32_t)(rand() % 3);
        uint64_t key[12];
        pcr_kvtable_key(0, BT, tok, nblocks * BT, key, 12);
        int op = rand() % 10;
        if (op < 4) {
            /* Stored: from the root, or continuing a block this pod has. The pod's hashes come
             * from a small set, so a hash sometimes names other tokens than before. */
            size_t from = (size_t)(rand() % (int)nblocks);
            uint64_t pods[12];
            for (size_t i = 0; i < nblocks; i++)
                pods[i] = (uint64_t)(rand() % 40) + 1;
            int has_parent = from > 0;
            uint64_t parent = has_parent ? pods[from - 1] : 0;
            ment_t *pe = has_parent ? m_find_pod(b, parent, -1) : NULL;
            /* Half the time the parent is one the pod really has under that hash. */
            if (has_parent && pe == NULL && rand() % 2) {
                for (int i = 0; i < MAXE && pe == NULL; i++)
                    if (model[i].used && !model[i].spec && model[i].b == b)
                        pe = &model[i];
                if (pe != NULL)
                    parent = pe->pod;
            }
            /* The model: which medium's entry the table finds first for a parent. */
            if (has_parent) {
                pe = m_find_pod(b, parent, PCR_KVT_GPU);
                if (pe == NULL)
                    pe = m_find_pod(b, parent, PCR_KVT_CPU);
            }
            pcr_kvt_stored_t ev = {pods + from, nblocks - from, has_parent, parent,
                                   tok + from * BT, BT, (pcr_kvt_medium_t)medium, 0};
            int rc = pcr_kvtable_stored(t, b, &ev, now);
            stored++;
            orphans += rc == PCR_ERR_NOTFOUND;
            if (has_parent && pe == NULL) {
                PCR_CHECK_EQ_INT(rc, PCR_ERR_NOTFOUND);
            } else {
                PCR_CHECK_EQ_INT(rc, 0);
                uint64_t prev = has_parent ? pe->chain : 0;
                for (size_t i = from; i < nblocks; i++) {
                    uint64_t c = chain_after(prev, tok + i * BT);
                    prev = c;
                    ment_t *e = m_find_pod(b, pods[i], (int)medium);
                    if (e != NULL && e->chain == c)
                        continue;
                    if (e != NULL)
                        e->used = 0;
                    e = m_find_chain(b, c, (int)medium);
                    if (e != NULL) {
                        e->pod = pods[i];
                        continue;
                    }
                    e = m_find_chain(b, c, -1);
                    if (e == NULL)
                        e = m_new();
                    PCR_CHECK(e != NULL);
                    if (e == NULL)
                        break;
                    *e = (ment_t){1, 0, b, medium, pods[i], c, 0};
                }
            }
        } else if (op < 6) {
            /* One hash, or a run of up to 12 (as the router coalesces vLLM's one-block
             * BlockRemoved events), repeats and unknown hashes among them. */
            uint64_t pods[12];
            size_t npods = rand() % 2 ? 1 : 1 + (size_t)(rand() % 12), want = 0;
            for (size_t i = 0; i < npods; i++) {
                pods[i] = (uint64_t)(rand() % 40) + 1;
                ment_t *e = m_find_pod(b, pods[i], (int)medium);
                want += e != NULL;
                if (e != NULL)
                    e->used = 0;
            }
            removed += (int)want;
            PCR_CHECK_EQ_INT(pcr_kvtable_removed(t, b, pods, npods, (pcr_kvt_medium_t)medium),
                             want);
        } else if (op < 8) {
            PCR_CHECK_EQ_INT(pcr_kvtable_speculate(t, b, key, nblocks, now), 0);
            for (size_t i = 0; i < nblocks; i++) {
                if (m_find_chain(b, key[i], PCR_KVT_GPU) || m_find_chain(b, key[i], PCR_KVT_CPU))
                    continue;
                ment_t *e = m_find_chain(b, key[i], -1);
                if (e == NULL && (e = m_new()) != NULL)
                    *e = (ment_t){1, 1, b, 0, 0, key[i], 0};
                if (e != NULL)
                    e->expires = now + 100;
            }
        } else if (op == 8) {
            size_t want = 0;
            for (int i = 0; i < MAXE; i++)
                if (model[i].used && model[i].spec && model[i].expires <= now) {
                    model[i].used = 0;
                    want++;
                }
            PCR_CHECK_EQ_INT(pcr_kvtable_expire(t, now), want);
            expired += (int)want;
        } else if (rand() % 16 == 0) {
            size_t want = 0;
            for (int i = 0; i < MAXE; i++)
                if (model[i].used && model[i].b == b && model[i].spec) {
                    model[i].used = 0;
                    want++;
                }
            PCR_CHECK_EQ_INT(pcr_kvtable_clear_speculative(t, b), want);
        } else if (rand() % 8 == 0) {
            pcr_kvtable_clear(t, b);
            for (int i = 0; i < MAXE; i++)
                if (model[i].used && model[i].b == b)
                    model[i].used = 0;
        }
        uint32_t gpu[NB], any[NB], mg[NB], ma[NB];
        pcr_kvtable_match(t, key, nblocks, gpu, any);
        m_match(key, nblocks, mg, ma);
        hits += ma[0] + ma[1] + ma[2] > 0;
        for (unsigned k = 0; k < NB; k++) {
            PCR_CHECK_EQ_INT(gpu[k], mg[k]);
            PCR_CHECK_EQ_INT(any[k], ma[k]);
            uint64_t n[3] = {0, 0, 0};
            for (int i = 0; i < MAXE; i++)
                if (model[i].used && model[i].b == k)
                    n[model[i].spec ? 2 : model[i].medium]++;
            PCR_CHECK_EQ_INT(pcr_kvtable_entries(t, k, PCR_KVT_GPU), n[0]);
            PCR_CHECK_EQ_INT(pcr_kvtable_entries(t, k, PCR_KVT_CPU), n[1]);
            PCR_CHECK_EQ_INT(pcr_kvtable_speculative(t, k), n[2]);
        }
        checked(t);
        if (pcr_test_case_failed != failures_before)
            printf("# at step %d, op %d\n", step, op);
    }
    printf("# %d stored (%d with an unknown parent), %d removed, %d expired, %d matches\n",
           stored, orphans, removed, expired, hits);
    PCR_CHECK(orphans > 0 && stored - orphans > 1000 && removed > 100 && expired > 100 &&
              hits > 1000);
    pcr_kvtable_free(t);
}

int main(void)
{
    PCR_RUN(test_key);
    PCR_RUN(test_stored_then_matched);
    PCR_RUN(test_removed);
    PCR_RUN(test_media);
    PCR_RUN(test_speculative);
    PCR_RUN(test_bounded);
    PCR_RUN(test_random_against_model);
    return pcr_test_done();
}
