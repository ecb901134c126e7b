/* test_flowq.c: hashring/flowq.c, the flow-control queue (include/pcr/flowq.h). */
#include <stdlib.h>

#include "pcr/flowq.h"
#include "pcr_test.h"

static const pcr_flowq_opts_t OPTS = {1000, 1u << 30, 100, 2.0};

typedef struct {
    pcr_flowq_entry_t e;
    uint64_t prompt;
    int id;
} req_t;

static req_t *of(pcr_flowq_entry_t *e) { return (req_t *)e; }

/* A higher band goes first whatever its counters; inside a band, the lower counter. */
static void test_priority_bands(void)
{
    pcr_flow_tenant_t t[3] = {{0, 1}, {5, 1}, {-1, 1}};
    pcr_flowq_t *q = pcr_flowq_new(&OPTS, t, 3);
    req_t r[9] = {0};
    for (int i = 0; i < 9; i++) {
        r[i].id = i;
        PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[i].e, (unsigned)(i % 3), 10, (uint64_t)i), 0);
    }
    pcr_flowq_served(q, 1, 1000000, 0); /* the high band's counter means nothing to the others */
    int order[9];
    for (int i = 0; i < 9; i++) {
        pcr_flowq_entry_t *p = pcr_flowq_peek(q);   /* what pop takes, left in place */
        PCR_CHECK(p != NULL && pcr_flowq_peek(q) == p && pcr_flowq_total(q) == (size_t)(9 - i));
        pcr_flowq_entry_t *e = pcr_flowq_pop(q);
        PCR_CHECK(e != NULL && e == p);
        order[i] = e ? of(e)->id : -1;
    }
    PCR_CHECK(order[0] == 1 && order[1] == 4 && order[2] == 7);  /* priority 5 */
    PCR_CHECK(order[3] == 0 && order[4] == 3 && order[5] == 6);  /* priority 0 */
    PCR_CHECK(order[6] == 2 && order[7] == 5 && order[8] == 8);  /* sheddable, last */
    PCR_CHECK(pcr_flowq_pop(q) == NULL && pcr_flowq_peek(q) == NULL);
    pcr_flowq_free(q);
}

/* Two tenants always backlogged, one of long prompts, one of short: tokens served stay within
 * 10% of each other; with weights 2:1, within 10% of 2:1. */
static void fairness(double w0, double w1, double want)
{
    pcr_flow_tenant_t t[2] = {{0, w0}, {0, w1}};
    pcr_flowq_t *q = pcr_flowq_new(&OPTS, t, 2);
    req_t r[2][4] = {0};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) {
            r[k][i].prompt = k == 0 ? 4000 : 300;
            PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[k][i].e, (unsigned)k, 1, 0), 0);
        }
    double served[2] = {0, 0};
    for (int n = 0; n < 2000; n++) {
        pcr_flowq_entry_t *e = pcr_flowq_pop(q);
        unsigned k = e->tenant;
        uint64_t out = 50 + (uint64_t)(n % 7) * 10;
        pcr_flowq_served(q, k, of(e)->prompt, 0);      /* at dispatch */
        pcr_flowq_served(q, k, 0, out);                /* as it is generated */
        served[k] += (double)of(e)->prompt + 2.0 * (double)out;
        PCR_CHECK_EQ_INT(pcr_flowq_push(q, e, k, 1, (uint64_t)n), 0); /* the next one */
    }
    double ratio = served[0] / served[1];
    printf("# weights %.0f:%.0f: served %.0f and %.0f tokens, ratio %.3f\n", w0, w1, served[0],
           served[1], ratio);
    PCR_CHECK(ratio > want * 0.9 && ratio < want * 1.1);
    pcr_flowq_free(q);
}

static void test_tokens_not_requests(void) { fairness(1, 1, 1.0); }
static void test_weights(void) { fairness(2, 1, 2.0); }

/* A tenant back from idle starts at the band's lowest counter: no burst of saved credit. */
static void test_no_credit_for_idling(void)
{
    pcr_flow_tenant_t t[2] = {{0, 1}, {0, 1}};
    pcr_flowq_t *q = pcr_flowq_new(&OPTS, t, 2);
    req_t a[2] = {0}, b[10] = {0};
    for (int i = 0; i < 2; i++)
        pcr_flowq_push(q, &a[i].e, 0, 1, 0);
    pcr_flowq_served(q, 0, 500000, 0); /* A alone, long served */
    for (int i = 0; i < 10; i++)
        pcr_flowq_push(q, &b[i].e, 1, 1, 1);
    PCR_CHECK(pcr_flowq_counter(q, 1) >= pcr_flowq_counter(q, 0));
    /* B does not get ten in a row: A's next waits behind at most one of B's. */
    pcr_flowq_entry_t *first = pcr_flowq_pop(q);
    pcr_flowq_served(q, first->tenant, 1000, 0);
    pcr_flowq_entry_t *second = pcr_flowq_pop(q);
    PCR_CHECK(first->tenant != second->tenant);
    /* Without the lift B's counter would be 0 and A would wait for all ten. */
    pcr_flowq_free(q);
}

static void test_bounds_ttl_and_leaving(void)
{
    pcr_flow_tenant_t t[2] = {{0, 1}, {0, 1}};
    pcr_flowq_opts_t o = {3, 100, 50, 2.0};
    pcr_flowq_t *q = pcr_flowq_new(&o, t, 2);
    req_t r[6] = {0};
    PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[0].e, 0, 40, 10), 0);
    PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[0].e, 0, 40, 10), PCR_ERR_INVAL); /* queued already */
    PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[1].e, 0, 40, 20), 0);
    PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[2].e, 0, 40, 30), PCR_ERR_FULL);  /* 120 bytes > 100 */
    PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[2].e, 0, 10, 30), 0);
    PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[3].e, 0, 1, 30), PCR_ERR_FULL);   /* 4 requests > 3 */
    PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[4].e, 2, 1, 30), PCR_ERR_INVAL);  /* no tenant 2 */
    PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[4].e, 1, 1, 35), 0);
    PCR_CHECK_EQ_INT(pcr_flowq_waiting(q, 0), 3);
    PCR_CHECK_EQ_INT(pcr_flowq_waiting_bytes(q, 0), 90);
    /* A client that leaves: out of the queue, its bytes freed. */
    pcr_flowq_remove(q, &r[1].e);
    pcr_flowq_remove(q, &r[1].e); /* twice is harmless */
    PCR_CHECK_EQ_INT(pcr_flowq_waiting_bytes(q, 0), 50);
    /* TTL 50: at 59 nothing; at 60 the one from 10; then the one from 30 at 80 (20 left). */
    PCR_CHECK(pcr_flowq_expired(q, 59) == NULL);
    PCR_CHECK(pcr_flowq_expired(q, 60) == &r[0].e);
    PCR_CHECK(pcr_flowq_expired(q, 60) == NULL);
    PCR_CHECK(pcr_flowq_expired(q, 85) == &r[2].e);
    PCR_CHECK(pcr_flowq_expired(q, 85) == &r[4].e);
    PCR_CHECK_EQ_INT(pcr_flowq_total(q), 0);
    /* A reload changes the bounds and the tenants' bands, and keeps the counters. */
    pcr_flowq_served(q, 1, 100, 0);
    pcr_flow_tenant_t t2[2] = {{1, 1}, {0, 3}};
    PCR_CHECK_EQ_INT(pcr_flowq_tune(q, &OPTS, t2, 2), 0);
    PCR_CHECK(pcr_flowq_counter(q, 1) == 100.0);
    PCR_CHECK_EQ_INT(pcr_flowq_tune(q, &OPTS, t2, 1), PCR_ERR_INVAL);
    pcr_flow_tenant_t bad[2] = {{0, 0}, {0, 1}};
    PCR_CHECK(pcr_flowq_new(&OPTS, bad, 2) == NULL);
    pcr_flowq_free(q);
    pcr_flowq_free(NULL);
}

/* 100,000 waiting requests (the entries are the caller's: the queue allocates nothing), then
 * drained: empty again, every one out once. */
static void test_many_waiting(void)
{
    enum { N = 100000, T = 8 };
    pcr_flow_tenant_t t[T];
    for (int i = 0; i < T; i++)
        t[i] = (pcr_flow_tenant_t){i % 2, 1 + i};
    pcr_flowq_opts_t o = {N, 1u << 30, 1000, 2.0};
    pcr_flowq_t *q = pcr_flowq_new(&o, t, T);
    req_t *r = calloc(N, sizeof(*r));
    for (int i = 0; i < N; i++)
        PCR_CHECK_EQ_INT(pcr_flowq_push(q, &r[i].e, (unsigned)(i % T), 100, (uint64_t)i), 0);
    PCR_CHECK_EQ_INT(pcr_flowq_total(q), N);
    size_t out = 0;
    for (pcr_flowq_entry_t *e; (e = pcr_flowq_pop(q)) != NULL; out++) {
        PCR_CHECK(!e->queued);
        pcr_flowq_served(q, e->tenant, 1000, 100);
    }
    PCR_CHECK_EQ_INT(out, N);
    for (int i = 0; i < T; i++)
        PCR_CHECK_EQ_INT(pcr_flowq_waiting_bytes(q, (unsigned)i), 0);
    free(r);
    pcr_flowq_free(q);
}

int main(void)
{
    PCR_RUN(test_priority_bands);
    PCR_RUN(test_tokens_not_requests);
    PCR_RUN(test_weights);
    PCR_RUN(test_no_credit_for_idling);
    PCR_RUN(test_bounds_ttl_and_leaving);
    PCR_RUN(test_many_waiting);
    return pcr_test_done();
}
