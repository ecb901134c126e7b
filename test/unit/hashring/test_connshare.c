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

/* A client that left an answer unread counts as heavy for PCR_LIGHT_KEEP_MS, whatever it holds:
 * its streams, all reset at once, do not make it light again. */
static void test_a_slow_client_is_heavy_for_a_while(void)
{
    const uint64_t s = 1000000, keep = (uint64_t)PCR_LIGHT_KEEP_MS * 1000;
    PCR_CHECK(pcr_light_count(NULL, 5) == 0);
    pcr_light_client_t c = {.busy = 3, .slow_us = 0};
    PCR_CHECK(pcr_light_count(&c, 7 * s) == 3);          /* never slow */
    c.slow_us = 7 * s;
    unsigned n = pcr_light_count(&c, 7 * s);
    PCR_CHECK(n == 3 + PCR_LIGHT_SLOW);
    c.busy = 0;
    n = pcr_light_count(&c, 7 * s + keep - 1);
    PCR_CHECK(n == PCR_LIGHT_SLOW);
    /* Heavier than the largest reserve: it needs none and may not take a kept one. */
    PCR_CHECK(n > pcr_light_reserve(65535, PCR_LIGHT_RESERVE_PCT_MAX));
    PCR_CHECK(!pcr_light_needed(n, 64, 64, 6));
    PCR_CHECK(!pcr_light_may_take(n, 58, 64, 6, 1));
    PCR_CHECK(pcr_light_may_take(n, 57, 64, 6, 1));      /* past the reserve, as anyone */
    /* And after every client that was not slow, however busy. */
    pcr_light_client_t busy = {.busy = 4000000000u};
    PCR_CHECK(pcr_light_count(&busy, 7 * s) < n);
    /* Light again once the time is over, or on a clock that went back. */
    PCR_CHECK(pcr_light_count(&c, 7 * s + keep) == 0);
    PCR_CHECK(pcr_light_count(&c, 6 * s) == 0);
}

/* A blind client (its streams have no window: it can take no answer byte) comes after every
 * other client, slow ones included, and never gets the reserve, kept or not. */
static void test_a_blind_client_never_gets_the_reserve(void)
{
    const uint64_t s = 1000000;
    pcr_light_client_t c = {.busy = 0, .blind = 1};
    unsigned n = pcr_light_count(&c, 7 * s);
    PCR_CHECK(n == PCR_LIGHT_BLIND);
    c.slow_us = 7 * s;                                   /* slow too: still the same */
    PCR_CHECK(pcr_light_count(&c, 7 * s) == PCR_LIGHT_BLIND);
    pcr_light_client_t slow = {.busy = PCR_LIGHT_SLOW * 2, .slow_us = 7 * s};
    PCR_CHECK(pcr_light_count(&slow, 7 * s) < n);
    PCR_CHECK(!pcr_light_needed(n, 64, 64, 6));
    PCR_CHECK(!pcr_light_may_take(n, 58, 64, 6, 1));
    PCR_CHECK(!pcr_light_may_take(n, 58, 64, 6, 0));     /* not kept: still not lent to it */
    PCR_CHECK(!pcr_light_may_take(n, 63, 64, 6, 0));
    PCR_CHECK(pcr_light_may_take(n, 57, 64, 6, 0));      /* past the reserve, as anyone */
    PCR_CHECK(pcr_light_may_take(n, 63, 64, 0, 0));      /* no reserve: whoever */
    c.blind = 0;                                         /* it opened a window: slow only */
    PCR_CHECK(pcr_light_count(&c, 7 * s) == PCR_LIGHT_SLOW);
}

/* Blind clients together hold no more of a pool than its reserve counts connections; with no
 * reserve, nothing is kept from them. */
static void test_blind_clients_hold_at_most_the_reserve(void)
{
    PCR_CHECK(pcr_blind_may_take(0, 6));
    PCR_CHECK(pcr_blind_may_take(5, 6));
    PCR_CHECK(!pcr_blind_may_take(6, 6));
    PCR_CHECK(!pcr_blind_may_take(100, 6));
    PCR_CHECK(pcr_blind_may_take(100, 0));
}

static void test_who_leaves_the_idle_connections(void)
{
    const uint64_t s = 1000000;
    pcr_light_client_t blind = {.busy = 0, .blind = 1}, slow = {.busy = 0, .slow_us = s};
    pcr_light_client_t heavy = {.busy = 40};
    unsigned b = pcr_light_count(&blind, s), w = pcr_light_count(&slow, s);
    /* A client that takes no answer byte opens a fresh connection while few are idle. */
    PCR_CHECK(pcr_light_fresh(b, 1, 10, 64, 6));
    PCR_CHECK(pcr_light_fresh(w, 6, 10, 64, 6));
    /* Not past the reserve's worth of idle ones, nor when the pool may not grow. */
    PCR_CHECK(!pcr_light_fresh(b, 7, 10, 64, 6));
    PCR_CHECK(!pcr_light_fresh(b, 1, 64, 64, 6));
    /* A client that reads its answers keeps the warm connection, many requests or few. */
    PCR_CHECK(!pcr_light_fresh(pcr_light_count(&heavy, s), 1, 10, 64, 6));
    PCR_CHECK(!pcr_light_fresh(0, 0, 10, 64, 6));
    /* Slow no more once PCR_LIGHT_KEEP_MS has passed. */
    PCR_CHECK(!pcr_light_fresh(pcr_light_count(&slow, s + (uint64_t)PCR_LIGHT_KEEP_MS * 1000),
                               1, 10, 64, 6));
}

/* Decreasing in the client's count: if the waiter with fewest may not, none may. */
static void test_monotone(void)
{
    static const unsigned counts[] = {0, 1, 5, 6, 7, 79, PCR_LIGHT_SLOW, PCR_LIGHT_SLOW + 5,
                                      PCR_LIGHT_BLIND, PCR_LIGHT_BLIND + 5};
    const size_t nc = sizeof(counts) / sizeof(counts[0]);
    for (int kept = 0; kept <= 1; kept++)
        for (unsigned busy = 0; busy <= 64; busy++) {
            for (unsigned c = 1; c < 80; c++)
                if (pcr_light_may_take(c, busy, 64, 6, kept))
                    PCR_CHECK(pcr_light_may_take(c - 1, busy, 64, 6, kept));
            for (size_t i = 1; i < nc; i++)
                if (pcr_light_may_take(counts[i], busy, 64, 6, kept))
                    PCR_CHECK(pcr_light_may_take(counts[i - 1], busy, 64, 6, kept));
        }
}

int main(void)
{
    PCR_RUN(test_the_reserve);
    PCR_RUN(test_who_may_take);
    PCR_RUN(test_a_slow_client_is_heavy_for_a_while);
    PCR_RUN(test_who_needs_it);
    PCR_RUN(test_a_blind_client_never_gets_the_reserve);
    PCR_RUN(test_blind_clients_hold_at_most_the_reserve);
    PCR_RUN(test_who_leaves_the_idle_connections);
    PCR_RUN(test_monotone);
    return pcr_test_done();
}
