/* test_hold.c: hashring/hold.c, the order in which held requests go to their pod. */
#include "pcr/hold.h"
#include "pcr_test.h"

static void test_shorter_prefill_ranks_higher_at_equal_wait(void)
{
    PCR_CHECK(pcr_hold_rank(100000, 1000) > pcr_hold_rank(100000, 4000));
    PCR_CHECK(pcr_hold_rank(100000, 0) > pcr_hold_rank(100000, 1));
}

static void test_waiting_lifts_a_long_prefill(void)
{
    /* 4000 tokens (4256 with the base) that waited 1 s pass 100 (356) that waited 50 ms,
     * not 100 that waited 100 ms. */
    PCR_CHECK(pcr_hold_rank(1000000, 4000) > pcr_hold_rank(50000, 100));
    PCR_CHECK(pcr_hold_rank(1000000, 4000) < pcr_hold_rank(100000, 100));
    /* Nothing that just came passes a request that waits, whatever their sizes. */
    PCR_CHECK(pcr_hold_rank(1, 1u << 30) > pcr_hold_rank(0, 0));
}

static void test_the_ratio(void)
{
    PCR_CHECK(pcr_hold_rank(0, 0) == 0.0);
    PCR_CHECK(pcr_hold_rank(2560, 0) == 2560.0 / PCR_HOLD_BASE_TOKENS);
    PCR_CHECK(pcr_hold_rank(UINT64_MAX, UINT64_MAX) > 0.99);
}

static void test_the_budget(void)
{
    PCR_CHECK(pcr_hold_open(0, 0));
    PCR_CHECK(pcr_hold_open(UINT64_MAX, 0));      /* 0: no budget */
    PCR_CHECK(pcr_hold_open(0, 1000));
    PCR_CHECK(pcr_hold_open(999, 1000));          /* under it: one more, however large */
    PCR_CHECK(!pcr_hold_open(1000, 1000));
    PCR_CHECK(!pcr_hold_open(50000, 1000));
}

/* A stream whose own prefill is below a first token's fixed part is never held. */
static void test_too_small_to_hold(void)
{
    PCR_CHECK(pcr_hold_small(0));
    PCR_CHECK(pcr_hold_small(PCR_HOLD_BASE_TOKENS));
    PCR_CHECK(!pcr_hold_small(PCR_HOLD_BASE_TOKENS + 1));
    PCR_CHECK(!pcr_hold_small(UINT64_MAX));
}

static void test_what_a_held_request_brings(void)
{
    /* Request 1's key a0 a1 a2 a3; its pod held a0 a1 before it (it brings a2 a3). */
    const uint64_t one[] = {10, 11, 12, 13};
    /* Request 2 extends it (a0..a3 then a4) and matched 5 blocks there: it counts on a2. */
    const uint64_t ext[] = {10, 11, 12, 13, 14};
    PCR_CHECK(pcr_hold_depends(ext, 5, 5, one, 4, 2));
    PCR_CHECK(pcr_hold_depends(ext, 5, 3, one, 4, 2));    /* a2 alone is enough */
    PCR_CHECK(!pcr_hold_depends(ext, 5, 2, one, 4, 2));   /* only what the pod had before */
    PCR_CHECK(!pcr_hold_depends(ext, 5, 5, one, 4, 4));   /* request 1 brings nothing */
    PCR_CHECK(!pcr_hold_depends(ext, 2, 2, one, 4, 2));   /* a key shorter than that block */
    /* Another prompt after the shared a0 a1: its third block is not request 1's. */
    const uint64_t other[] = {10, 11, 22, 23};
    PCR_CHECK(!pcr_hold_depends(other, 4, 4, one, 4, 2));
    /* Whatever its own blocks, a request that matched nothing counts on nobody. */
    PCR_CHECK(!pcr_hold_depends(ext, 5, 0, one, 4, 0));
}

/* Bands first, then the tenants' counters, then the client's load, then the rank. */
static void test_the_order(void)
{
    pcr_hold_key_t batch_old = {.priority = 0, .fair = 10, .busy = 0, .rank = 1e9};
    pcr_hold_key_t chat_new = {.priority = 10, .fair = 1e9, .busy = 5, .rank = 0};
    PCR_CHECK(pcr_hold_before(&chat_new, &batch_old));
    PCR_CHECK(!pcr_hold_before(&batch_old, &chat_new));
    pcr_hold_key_t behind = {.priority = 0, .fair = 20, .busy = 0, .rank = 1e9};
    PCR_CHECK(pcr_hold_before(&batch_old, &behind));  /* the lower counter, within a band */
    pcr_hold_key_t busy = {.priority = 0, .fair = 10, .busy = 1, .rank = 1e9};
    PCR_CHECK(pcr_hold_before(&batch_old, &busy));
    pcr_hold_key_t lower = {.priority = 0, .fair = 10, .busy = 0, .rank = 1};
    PCR_CHECK(pcr_hold_before(&batch_old, &lower));
    PCR_CHECK(!pcr_hold_before(&batch_old, &batch_old)); /* a tie: the older stays first */
}

int main(void)
{
    PCR_RUN(test_shorter_prefill_ranks_higher_at_equal_wait);
    PCR_RUN(test_waiting_lifts_a_long_prefill);
    PCR_RUN(test_the_ratio);
    PCR_RUN(test_the_budget);
    PCR_RUN(test_too_small_to_hold);
    PCR_RUN(test_what_a_held_request_brings);
    PCR_RUN(test_the_order);
    return pcr_test_done();
}
