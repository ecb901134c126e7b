/* test_connshare.c: hashring/connshare.c, the light clients' reserve of a pool's connections. */
#include "pcr/connshare.h"
#include "pcr_test.h"

static void test_the_reserve(void)
{
    PCR_CHECK(pcr_light_reserve(64, 10) == 6);
    PCR_CHECK(pcr_light_reserve(128, 10) == 12);
    PCR_CHECK(pcr_light_reserve(9, 10) == 0);    /* a small pool keeps none */
    PCR_CHECK(pcr_light_reserve(64, 0) == 0);    /* 0: off */
    PCR_CHECK(pcr_light_reserve(10, 100) == 5);  /* at most half */
    PCR_CHECK(pcr_light_reserve(65535, 50) == 32767);
}

static void test_who_may_take(void)
{
    /* Past the reserve, anyone. */
    PCR_CHECK(pcr_light_may_take(1000, 0, 64, 6, 1));
    PCR_CHECK(pcr_light_may_take(1000, 57, 64, 6, 1));
    /* The last six, kept: light clients only. */
    PCR_CHECK(!pcr_light_may_take(58, 58, 64, 6, 1));
    PCR_CHECK(!pcr_light_may_take(6, 58, 64, 6, 1));
    PCR_CHECK(pcr_light_may_take(5, 58, 64, 6, 1));
    PCR_CHECK(pcr_light_may_take(0, 63, 64, 6, 1));
    /* Not kept (no light client needed it lately): lent to anyone. */
    PCR_CHECK(pcr_light_may_take(58, 58, 64, 6, 0));
    PCR_CHECK(pcr_light_may_take(1000, 63, 64, 6, 0));
    /* None free: nobody. */
    PCR_CHECK(!pcr_light_may_take(0, 64, 64, 6, 1));
    PCR_CHECK(!pcr_light_may_take(0, 64, 64, 6, 0));
    PCR_CHECK(!pcr_light_may_take(0, 70, 64, 6, 1));
    /* No reserve: whoever, while a connection is free. */
    PCR_CHECK(pcr_light_may_take(1000, 63, 64, 0, 1));
}

/* A light client needs the reserve when no more than it is free; a heavy one never does. */
static void test_who_needs_it(void)
{
    PCR_CHECK(!pcr_light_needed(0, 57, 64, 6));   /* seven free: it goes past the reserve */
    PCR_CHECK(pcr_light_needed(0, 58, 64, 6));
    PCR_CHECK(pcr_light_needed(5, 64, 64, 6));    /* none free at all */
    PCR_CHECK(!pcr_light_needed(6, 64, 64, 6));   /* heavy */
    PCR_CHECK(!pcr_light_needed(0, 64, 64, 0));   /* no reserve */
    PCR_CHECK(!pcr_light_needed(0, 2, 2, 0));
}

/* Decreasing in the client's count: if the waiter with fewest may not, none may. */
static void test_monotone(void)
{
    for (int kept = 0; kept <= 1; kept++)
        for (unsigned busy = 0; busy <= 64; busy++)
            for (unsigned c = 1; c < 80; c++)
                if (pcr_light_may_take(c, busy, 64, 6, kept))
                    PCR_CHECK(pcr_light_may_take(c - 1, busy, 64, 6, kept));
}

int main(void)
{
    PCR_RUN(test_the_reserve);
    PCR_RUN(test_who_may_take);
    PCR_RUN(test_who_needs_it);
    PCR_RUN(test_monotone);
    return pcr_test_done();
}
