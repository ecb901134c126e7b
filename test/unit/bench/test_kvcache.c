/* test/unit/bench/test_kvcache.c: the simulator's prefix cache (bench/sim/kvcache.c):
 * chained block names, prefix hits, LRU eviction under pressure (tail first), pinning,
 * reservations, and a comparison with a naive reference under random operations. */
#include <stdlib.h>

#include "kvcache.h"
#include "pcr/common.h"
#include "pcr_test.h"

/* Hashes for a prompt of n blocks whose text is derived from (tag, i). */
static void make_text(char *buf, size_t nbytes, unsigned tag_of_block0, unsigned tag_rest)
{
    for (size_t i = 0; i < nbytes; i++)
        buf[i] = (char)('a' + ((i / PCR_KV_BLOCK_BYTES == 0 ? tag_of_block0 : tag_rest) * 7 +
                               i * 13 + i / PCR_KV_BLOCK_BYTES) % 26);
}

static void test_hash_full_blocks_only(void)
{
    char text[10 * PCR_KV_BLOCK_BYTES + 10];
    uint64_t h[16];
    make_text(text, sizeof text, 1, 1);
    PCR_CHECK_EQ_INT(pcr_kvcache_hash_prompt(text, sizeof text, 0, h, 16), 10);
    PCR_CHECK_EQ_INT(pcr_kvcache_hash_prompt(text, PCR_KV_BLOCK_BYTES - 1, 0, h, 16), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_hash_prompt(text, sizeof text, 0, h, 3), 10);  /* counts all */
}

static void test_hash_is_chained(void)
{
    char a[4 * PCR_KV_BLOCK_BYTES], b[4 * PCR_KV_BLOCK_BYTES];
    uint64_t ha[4], hb[4], hs[4];
    make_text(a, sizeof a, 1, 1);
    memcpy(b, a, sizeof b);
    b[3 * PCR_KV_BLOCK_BYTES + 5] ^= 1;          /* last block differs */
    pcr_kvcache_hash_prompt(a, sizeof a, 0, ha, 4);
    pcr_kvcache_hash_prompt(b, sizeof b, 0, hb, 4);
    PCR_CHECK_EQ_U64(ha[0], hb[0]);
    PCR_CHECK_EQ_U64(ha[2], hb[2]);
    PCR_CHECK(ha[3] != hb[3]);
    b[3 * PCR_KV_BLOCK_BYTES + 5] ^= 1;
    b[0] ^= 1;                                    /* first block differs: every name differs */
    pcr_kvcache_hash_prompt(b, sizeof b, 0, hb, 4);
    for (int i = 0; i < 4; i++)
        PCR_CHECK(ha[i] != hb[i]);
    /* Same block bytes at a different position are a different name (parent differs). */
    PCR_CHECK(ha[1] != ha[2]);
    pcr_kvcache_hash_prompt(a, sizeof a, 42, hs, 4);   /* another seed, another namespace */
    PCR_CHECK(hs[0] != ha[0]);
}

static void seq(uint64_t *h, size_t n, uint64_t base)
{
    for (size_t i = 0; i < n; i++)
        h[i] = base + i;
}

static void test_prefix_hit(void)
{
    pcr_kvcache_t *kv = pcr_kvcache_new(100);
    uint64_t a[10], b[10];
    size_t hit = 99;
    seq(a, 10, 1000);
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, a, 10, 2, &hit), 0);
    PCR_CHECK_EQ_INT(hit, 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_pinned(kv), 10);
    PCR_CHECK_EQ_INT(pcr_kvcache_reserved(kv), 2);
    pcr_kvcache_release(kv, a, 10, 2);
    PCR_CHECK_EQ_INT(pcr_kvcache_pinned(kv), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_reserved(kv), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_cached(kv), 10);
    memcpy(b, a, sizeof b);
    b[6] = 5000;                                  /* shares 6 leading blocks */
    for (int i = 7; i < 10; i++)
        b[i] = 5000 + i;
    PCR_CHECK_EQ_INT(pcr_kvcache_match(kv, b, 10), 6);
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, b, 10, 0, &hit), 0);
    PCR_CHECK_EQ_INT(hit, 6);
    PCR_CHECK_EQ_INT(pcr_kvcache_cached(kv), 14);
    pcr_kvcache_release(kv, b, 10, 0);
    /* A hole at the head means no hit, even with later blocks cached. */
    b[0] = 1;
    PCR_CHECK_EQ_INT(pcr_kvcache_match(kv, b, 10), 0);
    pcr_kvcache_free(kv);
}

static void test_hit_tokens_keeps_last_token(void)
{
    PCR_CHECK_EQ_INT(pcr_kvcache_hit_tokens(4, 100), 64);
    PCR_CHECK_EQ_INT(pcr_kvcache_hit_tokens(4, 64), 48);   /* all cached: last block recomputed */
    PCR_CHECK_EQ_INT(pcr_kvcache_hit_tokens(4, 65), 64);
    PCR_CHECK_EQ_INT(pcr_kvcache_hit_tokens(0, 1000), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_hit_tokens(3, 0), 0);
}

static void test_lru_under_pressure(void)
{
    pcr_kvcache_t *kv = pcr_kvcache_new(8);
    uint64_t a[4], b[4], c[4];
    size_t hit;
    seq(a, 4, 100);
    seq(b, 4, 200);
    seq(c, 4, 300);
    pcr_kvcache_acquire(kv, a, 4, 0, &hit);
    pcr_kvcache_release(kv, a, 4, 0);
    pcr_kvcache_acquire(kv, b, 4, 0, &hit);
    pcr_kvcache_release(kv, b, 4, 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, a, 4, 0, &hit), 0);   /* a is now recent */
    PCR_CHECK_EQ_INT(hit, 4);
    pcr_kvcache_release(kv, a, 4, 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, c, 4, 0, &hit), 0);   /* evicts b, the LRU */
    pcr_kvcache_release(kv, c, 4, 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_match(kv, a, 4), 4);
    PCR_CHECK_EQ_INT(pcr_kvcache_match(kv, b, 4), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_match(kv, c, 4), 4);
    PCR_CHECK_EQ_INT(pcr_kvcache_cached(kv), 8);
    pcr_kvcache_free(kv);
}

static void test_eviction_takes_tail_first(void)
{
    pcr_kvcache_t *kv = pcr_kvcache_new(6);
    uint64_t a[4], b[3];
    size_t hit;
    seq(a, 4, 100);
    seq(b, 3, 200);
    pcr_kvcache_acquire(kv, a, 4, 0, &hit);
    pcr_kvcache_release(kv, a, 4, 0);
    pcr_kvcache_acquire(kv, b, 3, 0, &hit);     /* needs one of a's blocks: its last */
    PCR_CHECK_EQ_INT(pcr_kvcache_match(kv, a, 4), 3);
    pcr_kvcache_release(kv, b, 3, 0);
    pcr_kvcache_free(kv);
}

static void test_pinned_blocks_stay(void)
{
    pcr_kvcache_t *kv = pcr_kvcache_new(6);
    uint64_t a[4], b[3];
    size_t hit;
    seq(a, 4, 100);
    seq(b, 3, 200);
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, a, 4, 0, &hit), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_fits(kv, b, 3, 0), PCR_ERR_FULL);
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, b, 3, 0, &hit), PCR_ERR_FULL);
    PCR_CHECK_EQ_INT(pcr_kvcache_match(kv, a, 4), 4);          /* untouched */
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, b, 2, 1, &hit), PCR_ERR_FULL);  /* reservation counts */
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, b, 1, 1, &hit), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_pinned(kv) + pcr_kvcache_reserved(kv), 6);
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, b, 7, 0, &hit), PCR_ERR_TOO_LARGE);
    pcr_kvcache_release(kv, b, 1, 1);
    pcr_kvcache_release(kv, a, 4, 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, b, 3, 0, &hit), 0);
    PCR_CHECK_EQ_INT(hit, 1);
    pcr_kvcache_release(kv, b, 3, 0);
    /* A shared block pinned twice needs two releases. */
    pcr_kvcache_acquire(kv, a, 2, 0, &hit);
    pcr_kvcache_acquire(kv, a, 2, 0, &hit);
    pcr_kvcache_release(kv, a, 2, 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_pinned(kv), 2);
    pcr_kvcache_release(kv, a, 2, 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_pinned(kv), 0);
    pcr_kvcache_free(kv);
}

static void test_bad_sizes(void)
{
    PCR_CHECK(pcr_kvcache_new(0) == NULL);
    PCR_CHECK(pcr_kvcache_new((size_t)1 << 31) == NULL);
    pcr_kvcache_free(NULL);
}

/* ---- naive reference: arrays and linear scans, same policy ---- */

#define REF_MAX 64
typedef struct {
    uint64_t hash[REF_MAX];
    unsigned ref[REF_MAX];
    size_t n;                     /* cached blocks, any order */
    uint64_t lru[REF_MAX];        /* unpinned, oldest first */
    size_t nlru;
    size_t cap, reserved;
} ref_t;

static int ref_find(const ref_t *r, uint64_t h)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->hash[i] == h)
            return (int)i;
    return -1;
}

static void ref_lru_remove(ref_t *r, uint64_t h)
{
    for (size_t i = 0; i < r->nlru; i++)
        if (r->lru[i] == h) {
            memmove(r->lru + i, r->lru + i + 1, (r->nlru - i - 1) * sizeof(uint64_t));
            r->nlru--;
            return;
        }
}

static void ref_evict(ref_t *r)
{
    int k = ref_find(r, r->lru[0]);
    ref_lru_remove(r, r->lru[0]);
    r->hash[k] = r->hash[r->n - 1];
    r->ref[k] = r->ref[r->n - 1];
    r->n--;
}

static int ref_acquire(ref_t *r, const uint64_t *h, size_t n, size_t priv, size_t *hit)
{
    size_t pinned = 0, newly = 0;
    for (size_t i = 0; i < r->n; i++)
        pinned += r->ref[i] > 0;
    for (size_t i = 0; i < n; i++) {
        int k = ref_find(r, h[i]);
        newly += k < 0 || r->ref[k] == 0;
    }
    if (n + priv > r->cap)
        return PCR_ERR_TOO_LARGE;
    if (pinned + r->reserved + newly + priv > r->cap)
        return PCR_ERR_FULL;
    *hit = 0;
    while (*hit < n && ref_find(r, h[*hit]) >= 0)
        (*hit)++;
    for (size_t i = 0; i < n; i++) {
        int k = ref_find(r, h[i]);
        if (k >= 0 && r->ref[k]++ == 0)
            ref_lru_remove(r, h[i]);
    }
    r->reserved += priv;
    for (size_t i = 0; i < n; i++) {
        if (ref_find(r, h[i]) >= 0)
            continue;
        while (r->n + r->reserved >= r->cap)
            ref_evict(r);
        r->hash[r->n] = h[i];
        r->ref[r->n++] = 1;
    }
    while (r->n + r->reserved > r->cap)
        ref_evict(r);
    return 0;
}

static void ref_release(ref_t *r, const uint64_t *h, size_t n, size_t priv)
{
    r->reserved -= priv;
    for (size_t i = n; i-- > 0;) {
        int k = ref_find(r, h[i]);
        if (k >= 0 && r->ref[k] > 0 && --r->ref[k] == 0)
            r->lru[r->nlru++] = h[i];
    }
}

static uint64_t rnd_state = 12345;
static unsigned rnd(unsigned n)
{
    rnd_state = rnd_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)((rnd_state >> 33) % n);
}

/* Hash values shaped so that probe runs in the 64-slot table meet, and wrap past its end,
 * where backward-shift deletion is subtle: each shape puts the homes elsewhere. */
static uint64_t shaped(uint64_t parent, int shape)
{
    switch (shape) {
    case 0:  return (parent << 8) | ((parent % 16) << 2);               /* 16 homes 4 apart */
    case 1:  return (parent << 8) | (32 + ((parent % 8) << 2));         /* upper half */
    default: return (parent << 8) | ((56 + ((parent % 6) << 2)) & 63);  /* across the end */
    }
}

static void random_run(int shape)
{
    enum { CAP = 24, HELD = 4 };
    pcr_kvcache_t *kv = pcr_kvcache_new(CAP);
    ref_t ref = { .cap = CAP };
    struct { uint64_t h[12]; size_t n, priv; int live; } held[HELD] = {{{0}, 0, 0, 0}};
    int mismatches = 0;
    for (int step = 0; step < 20000; step++) {
        int slot = (int)rnd(HELD);
        if (held[slot].live) {
            pcr_kvcache_release(kv, held[slot].h, held[slot].n, held[slot].priv);
            ref_release(&ref, held[slot].h, held[slot].n, held[slot].priv);
            held[slot].live = 0;
            continue;
        }
        /* Prefix trees over a small alphabet, so prompts share heads. */
        uint64_t h[12];
        size_t n = 1 + rnd(10), priv = rnd(3);
        uint64_t parent = 1 + rnd(3);
        for (size_t i = 0; i < n; i++) {
            parent = parent * 4 + rnd(i < 3 ? 2 : 4);
            h[i] = shaped(parent, shape);
        }
        size_t hit_a = 0, hit_b = 0;
        int ra = pcr_kvcache_acquire(kv, h, n, priv, &hit_a);
        int rb = ref_acquire(&ref, h, n, priv, &hit_b);
        if (ra != rb || (ra == 0 && hit_a != hit_b))
            mismatches++;
        if (ra == 0) {
            memcpy(held[slot].h, h, sizeof h);
            held[slot].n = n;
            held[slot].priv = priv;
            held[slot].live = 1;
        } else if (rb == 0) {
            ref_release(&ref, h, n, priv);   /* keep the two in step after a mismatch */
        }
        if (pcr_kvcache_cached(kv) != ref.n)
            mismatches++;
        for (size_t i = 0; i < ref.n; i++)
            if (pcr_kvcache_match(kv, &ref.hash[i], 1) != 1)
                mismatches++;
    }
    PCR_CHECK_EQ_INT(mismatches, 0);
    pcr_kvcache_free(kv);
}

/* What an observer heard: stores as (hash), removals as (hash | flag in a parallel array). */
typedef struct {
    uint64_t h[64];
    int removed[64];
    size_t n;
} heard_t;

static void on_stored(void *arg, const uint64_t *hashes, size_t i)
{
    heard_t *w = arg;
    if (w->n < 64) { w->h[w->n] = hashes[i]; w->removed[w->n++] = 0; }
}

static void on_removed(void *arg, uint64_t hash)
{
    heard_t *w = arg;
    if (w->n < 64) { w->h[w->n] = hash; w->removed[w->n++] = 1; }
}

static void test_observer_hears_stores_and_lru_evictions(void)
{
    pcr_kvcache_t *kv = pcr_kvcache_new(6);
    heard_t w = {0};
    pcr_kvcache_observer_t obs = {on_stored, on_removed, &w};
    pcr_kvcache_observe(kv, &obs);
    uint64_t a[4], b[4];
    size_t hit;
    seq(a, 4, 100);
    seq(b, 4, 200);
    b[0] = a[0];                          /* b shares a's first block: not stored again */
    pcr_kvcache_acquire(kv, a, 4, 0, &hit);
    pcr_kvcache_release(kv, a, 4, 0);
    PCR_CHECK_EQ_INT(w.n, 4);
    for (size_t i = 0; i < 4; i++) {
        PCR_CHECK_EQ_U64(w.h[i], a[i]);
        PCR_CHECK_EQ_INT(w.removed[i], 0);
    }
    w.n = 0;
    /* b needs 3 new blocks, 2 are free: a loses its tail, a[3], before b's blocks are named
     * (as vLLM evicts while it takes a request's new blocks, and names them later). */
    pcr_kvcache_acquire(kv, b, 4, 0, &hit);
    PCR_CHECK_EQ_INT(hit, 1);
    PCR_CHECK_EQ_INT(w.n, 4);
    PCR_CHECK(w.removed[0] && w.h[0] == a[3]);
    PCR_CHECK(!w.removed[1] && w.h[1] == b[1]);
    PCR_CHECK(!w.removed[2] && w.h[2] == b[2]);
    PCR_CHECK(!w.removed[3] && w.h[3] == b[3]);
    pcr_kvcache_release(kv, b, 4, 0);
    /* clear drops what is unpinned and says nothing. */
    w.n = 0;
    PCR_CHECK_EQ_INT(pcr_kvcache_acquire(kv, a, 2, 0, &hit), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_clear(kv), 4);   /* a[2], b[1..3]: a[0..1] are pinned */
    PCR_CHECK_EQ_INT(w.n, 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_cached(kv), 2);
    PCR_CHECK_EQ_INT(pcr_kvcache_match(kv, b, 4), 1);
    pcr_kvcache_release(kv, a, 2, 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_clear(kv), 2);
    PCR_CHECK_EQ_INT(pcr_kvcache_cached(kv), 0);
    pcr_kvcache_observe(kv, NULL);
    pcr_kvcache_acquire(kv, a, 4, 0, &hit);      /* nobody listens: nothing heard */
    PCR_CHECK_EQ_INT(w.n, 0);
    pcr_kvcache_free(kv);
}

static void test_random_against_reference(void)
{
    for (int shape = 0; shape < 3; shape++)
        random_run(shape);
}

int main(void)
{
    PCR_RUN(test_hash_full_blocks_only);
    PCR_RUN(test_hash_is_chained);
    PCR_RUN(test_prefix_hit);
    PCR_RUN(test_hit_tokens_keeps_last_token);
    PCR_RUN(test_lru_under_pressure);
    PCR_RUN(test_eviction_takes_tail_first);
    PCR_RUN(test_pinned_blocks_stay);
    PCR_RUN(test_bad_sizes);
    PCR_RUN(test_random_against_reference);
    PCR_RUN(test_observer_hears_stores_and_lru_evictions);
    return pcr_test_done();
}
