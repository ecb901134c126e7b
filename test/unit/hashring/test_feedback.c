/* test_feedback.c: hashring/feedback.c, the index corrected by the cached tokens pods deliver.
 *
 * Hand-written cases for each outcome (short, long, as predicted, the last block), then a
 * reference pod: a naive LRU cache of blocks that evicts a finished request's tail first, as
 * vLLM does, fed the same requests as a policy whose index believes the pod twice as large as
 * it is (a misconfigured capacity), with and without feedback. */
#include <stdlib.h>

#include "pcr/policy.h"
#include "pcr_test.h"

#define BB 256                   /* the policy's block: 64 tokens */
#define TOK (BB / 4)

static const pcr_backend_desc_t one[1] = {{"pod-a", "", 1, 0}};

static pcr_policy_t *make(uint64_t capacity_blocks)
{
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    pcr_backend_desc_t d = one[0];
    d.capacity_blocks = capacity_blocks;
    return pcr_policy_new(&o, &d, 1);
}

/* A key of n blocks named base, base+1, ...: prefixes of the same base share their blocks. */
typedef struct {
    uint64_t blocks[512];
    pcr_key_t k;
} keybuf_t;

static pcr_key_t *key_of(keybuf_t *kb, uint64_t base, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kb->blocks[i] = base * 1000003u + i;
    kb->k.blocks = kb->blocks;
    kb->k.nblocks = n;
    kb->k.prompt_tokens = n * TOK;
    return &kb->k;
}

static uint32_t held(pcr_policy_t *p, pcr_key_t *k)
{
    pcr_backend_load_t l = {.usable = 1};
    pcr_decision_t d;
    pcr_policy_decide(p, k, &l, 0, &d);
    return d.matched_blocks;
}

/* decide + commit at `now`, as the router does when it sends a request. */
static pcr_decision_t send(pcr_policy_t *p, pcr_key_t *k, uint64_t now)
{
    pcr_backend_load_t l = {.usable = 1};
    pcr_decision_t d;
    uint32_t from;
    pcr_policy_decide(p, k, &l, now, &d);
    pcr_policy_commit(p, d.backend, k, now, &from);
    return d;
}

static void test_short_forgets_what_is_older(void)
{
    pcr_policy_t *p = make(0);
    keybuf_t a, b, c;
    send(p, key_of(&a, 1, 10), 1);
    send(p, key_of(&b, 2, 10), 2);
    send(p, key_of(&c, 3, 10), 3);
    pcr_decision_t d = send(p, &b.k, 4);     /* b again: the index says all 10 are there */
    PCR_CHECK_EQ_INT(d.matched_blocks, 10);
    PCR_CHECK_EQ_U64(d.matched_time, 2);
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(p, 0), UINT64_MAX);
    /* The pod had none of it: it evicted b (last used at 2), so a (1) went before it. */
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &b.k, &d, 0, 5), 0);
    PCR_CHECK_EQ_INT(held(p, &a.k), 0);
    PCR_CHECK_EQ_INT(held(p, &b.k), 10);     /* it holds b now: it just computed it */
    PCR_CHECK_EQ_INT(held(p, &c.k), 10);     /* used after b: kept */
    /* What is left is what the pod can keep: its capacity in the index is that now. */
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(p, 0), 20);
    PCR_CHECK_EQ_U64(pcr_policy_backend_blocks(p, 0), 20);
    pcr_policy_free(p);
}

/* The request that brought b to the pod (committed at 2) had not reached its first token when
 * this one was sent (settled_before 2: it was still queued at the pod, or held): a short answer
 * says nothing of evictions, and nothing changes. Had it reached it (settled_before 3), the
 * same answer is an eviction. */
static void test_short_before_its_prefix_settled_is_no_evidence(void)
{
    pcr_policy_t *p = make(0);
    keybuf_t a, b;
    send(p, key_of(&a, 1, 10), 1);
    send(p, key_of(&b, 2, 10), 2);
    pcr_decision_t d = send(p, &b.k, 4);
    PCR_CHECK_EQ_U64(d.matched_time, 2);
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &b.k, &d, 0, 2), 0);
    PCR_CHECK_EQ_INT(held(p, &a.k), 10);
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(p, 0), UINT64_MAX);
    PCR_CHECK_EQ_U64(pcr_policy_backend_blocks(p, 0), 20);
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &b.k, &d, 0, 3), 0);
    PCR_CHECK_EQ_INT(held(p, &a.k), 0);
    PCR_CHECK(pcr_policy_backend_capacity(p, 0) < UINT64_MAX);
    pcr_policy_free(p);
}

static void test_the_last_block_is_not_short(void)
{
    pcr_policy_t *p = make(0);
    keybuf_t a, b;
    send(p, key_of(&a, 1, 10), 1);
    send(p, key_of(&b, 2, 10), 2);
    pcr_decision_t d = send(p, &b.k, 3);
    /* A fully cached prompt: the pod recomputes its last token, so it reports one of its own
     * 16-token blocks less: 9 blocks and 48 tokens of the policy's. */
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &b.k, &d, 10 * TOK - 16, 4), 0);
    PCR_CHECK_EQ_INT(held(p, &a.k), 10);
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(p, 0), UINT64_MAX);
    /* One more block short still passes (a pod may count in blocks larger than ours); two
     * more is short. */
    d = send(p, &b.k, 5);
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &b.k, &d, 8 * TOK, 6), 0);
    PCR_CHECK_EQ_INT(held(p, &a.k), 10);
    d = send(p, &b.k, 7);
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &b.k, &d, 7 * TOK, 8), 0);
    PCR_CHECK_EQ_INT(held(p, &a.k), 0);
    pcr_policy_free(p);
}

static void test_long_learns_and_grows(void)
{
    pcr_policy_t *p = make(100);
    keybuf_t a;
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(p, 0), 100);
    /* Shrink it first with a short answer, on a pod that holds 60 blocks. */
    for (uint64_t i = 0; i < 6; i++) {
        keybuf_t k;
        send(p, key_of(&k, 10 + i, 10), 1 + i);
    }
    keybuf_t first;
    pcr_decision_t d = send(p, key_of(&first, 10, 10), 10);
    pcr_policy_feedback(p, &first.k, &d, 0, 11);
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(p, 0), 60);
    /* The index let a prefix go that the pod still had: it says so, the capacity grows by the
     * difference and the prefix is held again. */
    d = send(p, key_of(&a, 50, 30), 12);
    PCR_CHECK_EQ_INT(d.matched_blocks, 0);
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &a.k, &d, 20 * TOK, 13), 0);
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(p, 0), 80);
    PCR_CHECK_EQ_INT(held(p, &a.k), 30);
    /* Confirmed predictions grow it back toward the configured 100, never past it. */
    for (int i = 0; i < 200; i++) {
        d = send(p, &a.k, 14 + (uint64_t)i);
        pcr_policy_feedback(p, &a.k, &d, 30 * TOK - 16, 14 + (uint64_t)i);
    }
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(p, 0), 100);
    /* A scrape that reports the capacity starts afresh from it. */
    PCR_CHECK_EQ_INT(pcr_policy_set_capacity(p, 0, 70), 0);
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(p, 0), 70);
    pcr_policy_free(p);
}

static void test_bad_arguments_and_other_policies(void)
{
    pcr_policy_t *p = make(0);
    keybuf_t a;
    pcr_decision_t d = send(p, key_of(&a, 1, 4), 1);
    PCR_CHECK_EQ_INT(pcr_policy_feedback(NULL, &a.k, &d, 0, 2), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, NULL, &d, 0, 2), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &a.k, NULL, 0, 2), PCR_ERR_INVAL);
    pcr_decision_t bad = d;
    bad.backend = 1;
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &a.k, &bad, 0, 2), PCR_ERR_INVAL);
    bad.backend = -1;
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &a.k, &bad, 0, 2), PCR_ERR_INVAL);
    /* More delivered than the prompt has is taken as all of it. */
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &a.k, &d, UINT64_MAX, 2), 0);
    PCR_CHECK_EQ_INT(held(p, &a.k), 4);
    pcr_policy_free(p);

    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    o.kind = PCR_POLICY_ROUND_ROBIN;
    p = pcr_policy_new(&o, one, 1);
    PCR_CHECK_EQ_INT(pcr_policy_feedback(p, &a.k, &d, 0, 2), 0);
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(p, 0), 0);
    pcr_policy_free(p);
}

/* ---- the reference pod -------------------------------------------------------------------- */

#define POD_CAP 600   /* blocks the pod really holds */
#define RL_MAX 4096

typedef struct {
    uint64_t b[RL_MAX];   /* front = evicted first */
    size_t n;
} lru_t;

static size_t lru_find(const lru_t *c, uint64_t h)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->b[i] == h)
            return i;
    return SIZE_MAX;
}

/* Serves a request: returns the leading blocks it had, then holds them all, the tail placed to
 * be evicted first (vLLM frees a finished request's blocks in reverse order). */
static size_t lru_serve(lru_t *c, const uint64_t *k, size_t n)
{
    size_t hit = 0;
    while (hit < n && lru_find(c, k[hit]) != SIZE_MAX)
        hit++;
    for (size_t i = 0; i < n; i++) {
        size_t at = lru_find(c, k[i]);
        if (at != SIZE_MAX) {
            memmove(&c->b[at], &c->b[at + 1], (c->n - at - 1) * sizeof(uint64_t));
            c->n--;
        }
    }
    for (size_t i = n; i-- > 0;)
        c->b[c->n++] = k[i];
    if (c->n > POD_CAP) {
        size_t drop = c->n - POD_CAP;
        memmove(c->b, c->b + drop, (c->n - drop) * sizeof(uint64_t));
        c->n -= drop;
    }
    return hit;
}

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* 60 conversations, picked with a skew, each turn 2 blocks longer than its last: the working
 * set outgrows the pod. Returns the mean |predicted - delivered| blocks over the second half. */
static double run_against_pod(int feedback)
{
    pcr_policy_t *p = make(2 * POD_CAP);   /* the index is told the pod is twice as big */
    static lru_t pod;
    size_t len[60] = {0}, epoch[60] = {0};
    double err = 0;
    int counted = 0;
    memset(&pod, 0, sizeof(pod));
    rng = 0x243f6a8885a308d3ull;
    for (uint64_t t = 1; t <= 3000; t++) {
        uint64_t r = rnd() % 100, conv = r < 50 ? r % 10 : r % 60;
        if (len[conv] + 2 > 60) {   /* the conversation ends, another starts in its place */
            len[conv] = 0;
            epoch[conv]++;
        }
        size_t n = len[conv] += 2;
        keybuf_t k;
        pcr_decision_t d = send(p, key_of(&k, conv * 1000 + epoch[conv], n), t);
        size_t hit = lru_serve(&pod, k.blocks, n);
        if (feedback)
            pcr_policy_feedback(p, &k.k, &d, hit * TOK, t);
        if (t > 1500) {
            err += (double)(d.matched_blocks > hit ? d.matched_blocks - hit : hit - d.matched_blocks);
            counted++;
        }
    }
    printf("# feedback %s: capacity in the index %llu blocks (the pod: %d), mean error %.2f blocks\n",
           feedback ? "on" : "off", (unsigned long long)pcr_policy_backend_capacity(p, 0),
           POD_CAP, err / counted);
    pcr_policy_free(p);
    return err / counted;
}

static void test_feedback_tracks_a_smaller_pod(void)
{
    double off = run_against_pod(0), on = run_against_pod(1);
    PCR_CHECK(off > 1.0);         /* the misconfiguration shows */
    PCR_CHECK(on <= off / 2);     /* feedback removes at least half of the error */
}

static void test_deterministic(void)
{
    pcr_policy_t *p1 = make(50), *p2 = make(50);
    int differ = 0;
    rng = 7;
    for (uint64_t t = 1; t <= 500; t++) {
        keybuf_t k;
        key_of(&k, rnd() % 20, 1 + rnd() % 20);
        uint64_t delivered = rnd() % (k.k.prompt_tokens + 1);
        pcr_decision_t d1 = send(p1, &k.k, t), d2 = send(p2, &k.k, t);
        differ += memcmp(&d1, &d2, sizeof(d1)) != 0;
        pcr_policy_feedback(p1, &k.k, &d1, delivered, t);
        pcr_policy_feedback(p2, &k.k, &d2, delivered, t);
        differ += pcr_policy_backend_blocks(p1, 0) != pcr_policy_backend_blocks(p2, 0) ||
                  pcr_policy_backend_capacity(p1, 0) != pcr_policy_backend_capacity(p2, 0);
    }
    PCR_CHECK_EQ_INT(differ, 0);
    pcr_policy_free(p1);
    pcr_policy_free(p2);
}

int main(void)
{
    PCR_RUN(test_short_forgets_what_is_older);
    PCR_RUN(test_short_before_its_prefix_settled_is_no_evidence);
    PCR_RUN(test_the_last_block_is_not_short);
    PCR_RUN(test_long_learns_and_grows);
    PCR_RUN(test_bad_arguments_and_other_policies);
    PCR_RUN(test_feedback_tracks_a_smaller_pod);
    PCR_RUN(test_deterministic);
    return pcr_test_done();
}
