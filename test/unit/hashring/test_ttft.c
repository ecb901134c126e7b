/* test_ttft.c: hashring/ttft.c, a backend's time to first token learned online. */
#include <math.h>

#include "pcr/ttft.h"
#include "pcr_test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void)   /* [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static int near(double got, double want, double rel)
{
    return fabs(got - want) <= rel * fabs(want);
}

/* Feeds n observations of the pod y = c + a x (+- noise), x spread over [0, xmax). */
static void feed(pcr_ttft_t *t, int n, double a, double c, double xmax, double noise)
{
    for (int i = 0; i < n; i++) {
        double x = 1024 + uniform() * (xmax - 1024);
        double y = c + a * x;
        pcr_ttft_observe(t, x, y * (1.0 + noise * (2.0 * uniform() - 1.0)));
    }
}

static void test_prior_before_any_observation(void)
{
    pcr_ttft_t t;
    pcr_ttft_init(&t, 70, 20000);
    PCR_CHECK(near(pcr_ttft_estimate(&t, 0), 20000, 1e-12));
    PCR_CHECK(near(pcr_ttft_estimate(&t, 1000), 90000, 1e-12));
    PCR_CHECK_EQ_INT(t.n, 0);
    pcr_ttft_init(&t, -1, NAN);   /* nonsense falls back to the defaults */
    PCR_CHECK(near(t.a, 70, 1e-12));
    PCR_CHECK(near(t.c, 20000, 1e-12));
}

static void test_learns_the_pods_rate(void)
{
    pcr_ttft_t t;
    pcr_ttft_init(&t, 70, 20000);
    feed(&t, 400, 45, 20000, 20000, 0.05);   /* a faster GPU than the prior says */
    printf("# a %.2f us/token\n", t.a);
    PCR_CHECK(near(t.a, 45, 0.03));
    PCR_CHECK(near(t.c, 20000, 1e-12));      /* the overhead stays as given */
    PCR_CHECK_EQ_INT(t.n, 400);
    pcr_ttft_init(&t, 70, 20000);
    feed(&t, 400, 200, 20000, 20000, 0.05);  /* a 70B model: slower */
    PCR_CHECK(near(t.a, 200, 0.03));
}

static void test_follows_a_pod_that_slows_down(void)
{
    pcr_ttft_t t;
    pcr_ttft_init(&t, 70, 20000);
    feed(&t, 300, 45, 20000, 20000, 0.05);
    feed(&t, 400, 120, 20000, 20000, 0.05);  /* twice as busy, e.g. a longer decode batch */
    printf("# a %.2f us/token\n", t.a);
    PCR_CHECK(near(t.a, 120, 0.05));
}

/* Ten times faster than the prior (a time-scaled benchmark), and long queues from the start:
 * the first observations must count for what they say, not be clipped back toward the guess. */
static void test_a_prior_far_off_is_left_quickly(void)
{
    pcr_ttft_t t;
    pcr_ttft_init(&t, 70, 2000);
    for (int i = 0; i < 20; i++) {
        double x = 60000 + 2000.0 * i;
        pcr_ttft_observe(&t, x, 2000 + 7 * x);
    }
    printf("# a %.2f us/token after 20 long observations\n", t.a);
    PCR_CHECK(near(t.a, 7, 0.1));
}

/* Waiting no token explains (a pod past capacity) raises the rate, never a fixed cost that
 * would turn every request away from the pod, short or long. */
static void test_unexplained_waiting_is_no_fixed_cost(void)
{
    pcr_ttft_t t;
    pcr_ttft_init(&t, 70, 20000);
    for (int i = 0; i < 300; i++)
        pcr_ttft_observe(&t, 4000 + (i % 5) * 1000, 3e6);   /* 3 s, whatever the size */
    PCR_CHECK(near(pcr_ttft_estimate(&t, 0), 20000, 1e-12));
    PCR_CHECK(pcr_ttft_estimate(&t, 6000) > 1e6);
}

static void test_one_stalled_request_moves_it_little(void)
{
    pcr_ttft_t t;
    pcr_ttft_init(&t, 70, 20000);
    feed(&t, 300, 50, 20000, 10000, 0.02);
    double before = pcr_ttft_estimate(&t, 4000);
    pcr_ttft_observe(&t, 1500, 100e6);       /* 100 s for 1500 tokens: it waited elsewhere */
    double after = pcr_ttft_estimate(&t, 4000);
    printf("# estimate at 4000 tokens: %.0f us, then %.0f us\n", before, after);
    PCR_CHECK(near(after, before, 0.05));
    /* A lasting change is still learned: clipping bounds a step, not where it ends. */
    for (int i = 0; i < 400; i++)
        pcr_ttft_observe(&t, 4000, 2.0 * before);
    PCR_CHECK(near(pcr_ttft_estimate(&t, 4000), 2.0 * before, 0.05));
}

static void test_short_requests_keep_it_sane(void)
{
    pcr_ttft_t t;
    pcr_ttft_init(&t, 70, 20000);
    for (int i = 0; i < 500; i++) {
        pcr_ttft_observe(&t, 0, 25000);      /* fully cached: they say nothing of the rate */
        pcr_ttft_observe(&t, 200, 21000);    /* short: mostly the overhead, which is not 20 ms */
    }
    PCR_CHECK(near(t.a, 70, 1e-12));
    PCR_CHECK_EQ_INT(t.n, 0);
    for (int i = 0; i < 500; i++)
        pcr_ttft_observe(&t, 1500, 80000);   /* one size only */
    printf("# estimate at 1500 tokens %.0f us (a %.1f)\n", pcr_ttft_estimate(&t, 1500), t.a);
    PCR_CHECK(near(pcr_ttft_estimate(&t, 1500), 80000, 0.15));   /* the prior holds a little */
    PCR_CHECK(pcr_ttft_estimate(&t, 8000) > pcr_ttft_estimate(&t, 1500));
}

static void test_bounded_and_bad_input_ignored(void)
{
    pcr_ttft_t t;
    pcr_ttft_init(&t, 70, 20000);
    pcr_ttft_t copy = t;
    pcr_ttft_observe(&t, NAN, 1000);
    pcr_ttft_observe(&t, 2000, INFINITY);
    pcr_ttft_observe(&t, -5, 1000);
    pcr_ttft_observe(&t, 2000, -1);
    pcr_ttft_observe(&t, 1e12, 1000);
    pcr_ttft_observe(&t, 2000, 1e300);
    PCR_CHECK(memcmp(&t, &copy, sizeof(t)) == 0);
    for (int i = 0; i < 2000; i++)           /* a pod 1000x slower than the prior */
        pcr_ttft_observe(&t, 1000 + i % 7 * 1000, 70e3 * (1000 + i % 7 * 1000));
    PCR_CHECK(t.a <= 70 * 64 + 1e-9);
    for (int i = 0; i < 2000; i++)           /* answers before it could have prefilled */
        pcr_ttft_observe(&t, 1000 + i % 7 * 1000, 0);
    PCR_CHECK(t.a >= 70.0 / 64 - 1e-9);
    PCR_CHECK(t.c >= 0);
}

static void test_deterministic(void)
{
    pcr_ttft_t t1, t2;
    pcr_ttft_init(&t1, 70, 20000);
    pcr_ttft_init(&t2, 70, 20000);
    uint64_t seed = rng;
    feed(&t1, 500, 55, 20000, 30000, 0.3);
    rng = seed;
    feed(&t2, 500, 55, 20000, 30000, 0.3);
    PCR_CHECK(memcmp(&t1, &t2, sizeof(t1)) == 0);
}

int main(void)
{
    PCR_RUN(test_prior_before_any_observation);
    PCR_RUN(test_learns_the_pods_rate);
    PCR_RUN(test_follows_a_pod_that_slows_down);
    PCR_RUN(test_a_prior_far_off_is_left_quickly);
    PCR_RUN(test_unexplained_waiting_is_no_fixed_cost);
    PCR_RUN(test_one_stalled_request_moves_it_little);
    PCR_RUN(test_short_requests_keep_it_sane);
    PCR_RUN(test_bounded_and_bad_input_ignored);
    PCR_RUN(test_deterministic);
    return pcr_test_done();
}
