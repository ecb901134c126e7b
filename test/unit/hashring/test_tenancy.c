/* test_tenancy.c: hashring/tenancy.c (include/pcr/tenancy.h): rate limits, saturation,
 * session words. The rate limit is compared with a naive token bucket under random arrivals. */
#include <stdlib.h>

#include "pcr/tenancy.h"
#include "pcr_test.h"

/* A bucket of `cap` units refilling one unit per `interval`, as a float: the reference. */
typedef struct {
    double level, cap, interval;
    uint64_t last;
} bucket_t;

static int bucket_take(bucket_t *b, uint64_t now, double units)
{
    b->level += (double)(now - b->last) / b->interval;
    if (b->level > b->cap)
        b->level = b->cap;
    b->last = now;
    if (units > b->cap)
        units = b->cap;
    if (b->level + 1e-9 < units)
        return 0;
    b->level -= units;
    return 1;
}

/* GCRA passes exactly what a full-at-start token bucket passes. */
static void test_gcra_is_a_token_bucket(void)
{
    srand(7);
    for (int round = 0; round < 20; round++) {
        uint64_t interval = 1000 + (uint64_t)(rand() % 5000), cap = 1 + (uint64_t)(rand() % 20);
        bucket_t ref = {(double)cap, (double)cap, (double)interval, 0};
        uint64_t tat = 0, now = 0, retry = 0;
        int agree = 1, passed = 0;
        for (int i = 0; i < 2000; i++) {
            now += (uint64_t)(rand() % (int)(2 * interval));
            uint64_t units = 1 + (uint64_t)(rand() % 3);
            uint64_t next;
            int g = pcr_gcra_take(tat, now, units * interval, cap * interval, &next, &retry);
            int b = bucket_take(&ref, now, (double)units);
            if (g)
                tat = next, passed++;
            else if (retry == 0)
                agree = 0; /* a refusal always says when to come back */
            agree &= g == b;
        }
        PCR_CHECK(agree);
        PCR_CHECK(passed > 0);
    }
}

static void test_gcra_retry_after(void)
{
    uint64_t next = 0, retry = 0;
    /* One request a second, a bucket of one: a second request at once waits a second. */
    PCR_CHECK(pcr_gcra_take(0, 5000000, 1000000, 1000000, &next, &retry));
    PCR_CHECK_EQ_U64(next, 6000000);
    PCR_CHECK(!pcr_gcra_take(next, 5000000, 1000000, 1000000, &next, &retry));
    PCR_CHECK_EQ_U64(retry, 1000000);
    /* A cost over the bucket passes when it is full, never forever refused. */
    PCR_CHECK(pcr_gcra_take(0, 10, 999999999, 60, &next, &retry));
    PCR_CHECK(!pcr_gcra_take(next, 10, 1, 60, &next, &retry));
}

static void test_saturation(void)
{
    pcr_sat_opts_t o = {5, 0.8, 0, 0};
    pcr_sat_pod_t p[3] = {{1, 0, 10, 0.1, 0}, {1, 0, 0, 0.9, 0}, {0, 0, 0, 0, 0}};
    PCR_CHECK(pcr_saturation(p, 3, &o) == 1.0);  /* every usable pod at a threshold */
    p[1].kv_usage = 0.4;
    PCR_CHECK(pcr_saturation(p, 3, &o) == 0.5);  /* the least loaded pod's level */
    p[1].kv_usage = -1;                          /* unknown: not counted */
    PCR_CHECK(pcr_saturation(p, 3, &o) == 0.0);
    pcr_sat_opts_t inflight = {0, 0, 4, 0};
    p[0].inflight = 4, p[1].inflight = 2;
    PCR_CHECK(pcr_saturation(p, 3, &inflight) == 0.5);
    p[1].inflight = 9;
    PCR_CHECK(pcr_saturation(p, 3, &inflight) == 1.0);
    PCR_CHECK(pcr_saturation(p, 0, &inflight) == 0.0); /* no pod: nothing to wait for */
    p[0].usable = p[1].usable = 0;
    PCR_CHECK(pcr_saturation(p, 3, &inflight) == 0.0);
    pcr_sat_opts_t off = {0, 0, 0, 0};
    PCR_CHECK(pcr_saturation(p, 3, &off) == 0.0);
    pcr_sat_opts_t prefill = {0, 0, 0, 1000};
    pcr_sat_pod_t q[2] = {{1, 0, 0, -1, 3000}, {1, 0, 0, -1, 500}};
    PCR_CHECK(pcr_saturation(q, 2, &prefill) == 0.5);
    q[1].prefill = 1000;
    PCR_CHECK(pcr_saturation(q, 2, &prefill) == 1.0);
}

static void test_affinity_words(void)
{
    uint64_t h = 0x123456789abcdef1ull, other = 0x0fedcba987654321ull;
    uint64_t w = pcr_affinity_word(h, 7, 100);
    PCR_CHECK_EQ_INT(pcr_affinity_backend(w, h, 100, 600), 7);
    PCR_CHECK_EQ_INT(pcr_affinity_backend(w, h, 700, 600), 7);
    PCR_CHECK_EQ_INT(pcr_affinity_backend(w, h, 701, 600), -1);   /* expired */
    PCR_CHECK_EQ_INT(pcr_affinity_backend(w, other, 100, 600), -1); /* another session */
    PCR_CHECK_EQ_INT(pcr_affinity_backend(0, h, 100, 600), -1);
    PCR_CHECK_EQ_INT(pcr_affinity_backend(pcr_affinity_word(h, 0, 65535), h, 3, 600), 0); /* wraps */
    uint64_t set[2] = {pcr_affinity_word(other, 1, 10), 0};
    PCR_CHECK_EQ_INT(pcr_affinity_victim(set, h, 20, 600), 1);      /* the empty way */
    set[1] = pcr_affinity_word(h, 2, 15);
    PCR_CHECK_EQ_INT(pcr_affinity_victim(set, h, 20, 600), 1);      /* its own */
    set[1] = pcr_affinity_word(0x77ull << 40, 2, 15);
    PCR_CHECK_EQ_INT(pcr_affinity_victim(set, h, 20, 600), 0);      /* the older */
    PCR_CHECK_EQ_INT(pcr_affinity_set(h, 1024) % 2, 0);
    PCR_CHECK(pcr_affinity_set(h, 1024) < 2048);
    PCR_CHECK(pcr_affinity_keep(3, 2, 1.25, 0.5));
    PCR_CHECK(!pcr_affinity_keep(5, 2, 1.25, 0.5));  /* over its bound */
    PCR_CHECK(!pcr_affinity_keep(0, 2, 1.25, 1.0));  /* saturated */
}

/* A request passes the prefill of strictly worse (greater) pod priorities only. */
static void test_pod_preemptible(void)
{
    int prio[5] = {0, 10, -5, 0, 3};
    PCR_CHECK(pcr_pod_preemptible(prio, 5, 0) == (1u << 1 | 1u << 4));
    PCR_CHECK(pcr_pod_preemptible(prio, 5, -5) == (1u << 0 | 1u << 1 | 1u << 3 | 1u << 4));
    PCR_CHECK(pcr_pod_preemptible(prio, 5, 10) == 0);   /* the worst passes nobody */
    PCR_CHECK(pcr_pod_preemptible(prio, 5, 3) == 1u << 1);
    int many[64];
    for (int i = 0; i < 64; i++)
        many[i] = i;
    PCR_CHECK(pcr_pod_preemptible(many, 64, -1) == ~0ull);
    PCR_CHECK(pcr_pod_preemptible(many, 64, 62) == 1ull << 63);
}

int main(void)
{
    PCR_RUN(test_gcra_is_a_token_bucket);
    PCR_RUN(test_gcra_retry_after);
    PCR_RUN(test_saturation);
    PCR_RUN(test_affinity_words);
    PCR_RUN(test_pod_preemptible);
    return pcr_test_done();
}
