/* test/unit/bench/test_ceiling.c: the replayer's LRU ceiling, and the capacity schedule it and
 * vllm_sim's pods share (kvcache.h). */
#include <math.h>
#include <string.h>

#include "kvcache.h"
#include "pcr_test.h"
#include "replay_trace.h"

static void test_schedule_parse(void)
{
    pcr_kvcache_phase_t ph[PCR_KV_MAX_PHASES];
    size_t n;
    PCR_CHECK_EQ_INT(pcr_kvcache_schedule_parse("20:1,20:0.25", ph, &n), 0);
    PCR_CHECK_EQ_INT(n, 2);
    PCR_CHECK(ph[0].seconds == 20 && ph[0].fraction == 1);
    PCR_CHECK(ph[1].seconds == 20 && ph[1].fraction == 0.25);
    const char *bad[] = {"", "20", "20:", ":1", "20:0", "20:1.5", "0:1", "-1:1", "20:1,",
                         "20:1;5:1", "2e6:1", "20:1x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        PCR_CHECK_EQ_INT(pcr_kvcache_schedule_parse(bad[i], ph, &n), -1);
    char many[PCR_KV_MAX_PHASES * 8 + 16] = "1:1";
    for (int i = 0; i < PCR_KV_MAX_PHASES; i++)
        strcat(many, ",1:1");   /* one phase too many */
    PCR_CHECK_EQ_INT(pcr_kvcache_schedule_parse(many, ph, &n), -1);
}

static void test_schedule_at_cycles(void)
{
    pcr_kvcache_phase_t ph[] = {{2, 1}, {1, 0.5}, {1, 0.25}};
    PCR_CHECK(pcr_kvcache_schedule_at(ph, 3, 0) == 1);
    PCR_CHECK(pcr_kvcache_schedule_at(ph, 3, 1.99) == 1);
    PCR_CHECK(pcr_kvcache_schedule_at(ph, 3, 2.5) == 0.5);
    PCR_CHECK(pcr_kvcache_schedule_at(ph, 3, 3.5) == 0.25);
    PCR_CHECK(pcr_kvcache_schedule_at(ph, 3, 4.5) == 1);        /* the next cycle */
    PCR_CHECK(pcr_kvcache_schedule_at(ph, 3, 4 * 100 + 2.5) == 0.5);
    PCR_CHECK(pcr_kvcache_schedule_at(ph, 3, -1) == 1);         /* before the start */
    PCR_CHECK(pcr_kvcache_schedule_at(ph, 0, 5) == 1);          /* no schedule */
}

/* Two 512-token prompts, A and B, in a cache that holds both; from t = 1 s it holds one.
 * A, B, A at full capacity; then A hits (the most recent) and B does not, where the ceiling
 * without the schedule hits both. */
static void test_ceiling_follows_the_schedule(void)
{
    uint64_t a[] = {1}, b[] = {2};
    rt_row_t rows[] = {
        {0, 512, 1, a, 1}, {100, 512, 1, b, 1}, {200, 512, 1, a, 1},
        {1500, 512, 1, a, 1}, {1600, 512, 1, b, 1},
    };
    rt_trace_t t = {rows, 5};
    pcr_kvcache_phase_t ph[] = {{1, 1}, {1, 0.5}};
    uint64_t h, q;
    size_t one = pcr_kvcache_hit_tokens(32, 512);   /* 496: the last block is computed */
    double full = rt_ceiling(&t, 2 * 512, NULL, 0, &h, &q);
    PCR_CHECK_EQ_INT(q, 5 * 512);
    PCR_CHECK_EQ_INT(h, 3 * one);
    PCR_CHECK(fabs(full - 3.0 * (double)one / (5 * 512)) < 1e-12);
    double sched = rt_ceiling(&t, 2 * 512, ph, 2, &h, &q);
    PCR_CHECK_EQ_INT(h, 2 * one);
    PCR_CHECK(sched < full);
    /* The same rows a cycle later (t + 2 s) see the same phases. */
    for (size_t i = 0; i < 5; i++)
        rows[i].timestamp_ms += 2000;
    PCR_CHECK(rt_ceiling(&t, 2 * 512, ph, 2, &h, &q) == sched);
}

int main(void)
{
    PCR_RUN(test_schedule_parse);
    PCR_RUN(test_schedule_at_cycles);
    PCR_RUN(test_ceiling_follows_the_schedule);
    return pcr_test_done();
}
