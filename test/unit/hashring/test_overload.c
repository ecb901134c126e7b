/* test_overload.c: hashring/overload.c, the overload actions' thresholds and hysteresis. */
#include "pcr/overload.h"
#include "pcr_test.h"

#define SHRINK PCR_OVERLOAD_BIT(PCR_OVERLOAD_SHRINK_WINDOWS)
#define REFUSE PCR_OVERLOAD_BIT(PCR_OVERLOAD_REFUSE_REQUESTS)
#define STOP PCR_OVERLOAD_BIT(PCR_OVERLOAD_STOP_ACCEPTING)
#define ALL (SHRINK | REFUSE | STOP)

static void test_thresholds_from_nothing(void)
{
    const uint64_t lim = 1000000;
    PCR_CHECK_EQ_INT(pcr_overload_decide(0, lim, 0), 0);
    PCR_CHECK_EQ_INT(pcr_overload_decide(799999, lim, 0), 0);
    PCR_CHECK_EQ_INT(pcr_overload_decide(800000, lim, 0), SHRINK);
    PCR_CHECK_EQ_INT(pcr_overload_decide(899999, lim, 0), SHRINK);
    PCR_CHECK_EQ_INT(pcr_overload_decide(900000, lim, 0), SHRINK | REFUSE);
    PCR_CHECK_EQ_INT(pcr_overload_decide(949999, lim, 0), SHRINK | REFUSE);
    PCR_CHECK_EQ_INT(pcr_overload_decide(950000, lim, 0), ALL);
    PCR_CHECK_EQ_INT(pcr_overload_decide(5 * lim, lim, 0), ALL);
}

/* An action ends only PCR_OVERLOAD_MARGIN (5 points) below where it starts. */
static void test_hysteresis(void)
{
    const uint64_t lim = 1000000;
    unsigned s = pcr_overload_decide(960000, lim, 0);
    PCR_CHECK_EQ_INT(s, ALL);
    s = pcr_overload_decide(920000, lim, s);        /* under 95%, over 90%: all stay */
    PCR_CHECK_EQ_INT(s, ALL);
    s = pcr_overload_decide(900000, lim, s);        /* 90%: stop_accepting still on */
    PCR_CHECK_EQ_INT(s, ALL);
    s = pcr_overload_decide(899999, lim, s);        /* under 90%: it ends */
    PCR_CHECK_EQ_INT(s, SHRINK | REFUSE);
    s = pcr_overload_decide(940000, lim, s);        /* back up, under 95%: it stays off */
    PCR_CHECK_EQ_INT(s, SHRINK | REFUSE);
    s = pcr_overload_decide(850000, lim, s);
    PCR_CHECK_EQ_INT(s, SHRINK | REFUSE);
    s = pcr_overload_decide(849999, lim, s);
    PCR_CHECK_EQ_INT(s, SHRINK);
    s = pcr_overload_decide(750000, lim, s);
    PCR_CHECK_EQ_INT(s, SHRINK);
    s = pcr_overload_decide(749999, lim, s);
    PCR_CHECK_EQ_INT(s, 0);
    /* Falling straight from the top to under every margin ends all at once. */
    PCR_CHECK_EQ_INT(pcr_overload_decide(0, lim, ALL), 0);
}

/* A higher action on implies the lower ones, whatever the state passed in says. */
static void test_higher_implies_lower(void)
{
    const uint64_t lim = 1000000;
    PCR_CHECK_EQ_INT(pcr_overload_decide(910000, lim, STOP), ALL);
    PCR_CHECK_EQ_INT(pcr_overload_decide(860000, lim, REFUSE), SHRINK | REFUSE);
    /* The lower one alone does not keep a higher one on. */
    PCR_CHECK_EQ_INT(pcr_overload_decide(920000, lim, SHRINK), SHRINK | REFUSE);
}

static void test_off_and_extremes(void)
{
    PCR_CHECK_EQ_INT(pcr_overload_decide(UINT64_MAX, 0, ALL), 0);  /* 0: off */
    PCR_CHECK_EQ_INT(pcr_overload_decide(UINT64_MAX, UINT64_MAX, 0), ALL);
    PCR_CHECK_EQ_INT(pcr_overload_decide(UINT64_MAX / 2, UINT64_MAX, 0), 0);
    PCR_CHECK_EQ_INT(pcr_overload_decide(1, 1, 0), ALL);
    PCR_CHECK_EQ_INT(pcr_overload_decide(0, 1, ALL), 0);
}

static void test_names(void)
{
    PCR_CHECK_STR(pcr_overload_action_name(PCR_OVERLOAD_SHRINK_WINDOWS), "shrink_windows");
    PCR_CHECK_STR(pcr_overload_action_name(PCR_OVERLOAD_REFUSE_REQUESTS), "refuse_requests");
    PCR_CHECK_STR(pcr_overload_action_name(PCR_OVERLOAD_STOP_ACCEPTING), "stop_accepting");
    PCR_CHECK_STR(pcr_overload_action_name(PCR_OVERLOAD__COUNT), "unknown");
    PCR_CHECK_EQ_INT(pcr_overload_threshold(PCR_OVERLOAD_REFUSE_REQUESTS), 900);
    PCR_CHECK_EQ_INT(pcr_overload_threshold(PCR_OVERLOAD__COUNT), 0);
}

int main(void)
{
    PCR_RUN(test_thresholds_from_nothing);
    PCR_RUN(test_hysteresis);
    PCR_RUN(test_higher_implies_lower);
    PCR_RUN(test_off_and_extremes);
    PCR_RUN(test_names);
    return pcr_test_done();
}
