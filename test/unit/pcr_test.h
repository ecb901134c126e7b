/* pcr_test.h: the smallest unit-test harness that does the job.
 *
 * Each test file is one executable speaking TAP (one "ok N - name" or
 * "not ok N - name" line per test case); test/run.py counts the lines, so every
 * case shows in the "N passed, N failed" total. Usage:
 *
 *   static void test_something(void) { PCR_CHECK(1 + 1 == 2); PCR_CHECK_EQ_INT(x, 3); }
 *   int main(void) { PCR_RUN(test_something); return pcr_test_done(); }
 *
 * A failed check prints the expression, file and line as a TAP comment, marks the
 * current case failed and goes on, so one run shows every failure. */
#ifndef PCR_TEST_H
#define PCR_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static int pcr_test_case_failed;
static int pcr_test_count;
static int pcr_test_failures;

#define PCR_CHECK(cond) do { \
    if (!(cond)) { \
        printf("# check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
        pcr_test_case_failed = 1; \
    } } while (0)

#define PCR_CHECK_EQ_INT(a, b) do { \
    long long pcr_a_ = (long long)(a), pcr_b_ = (long long)(b); \
    if (pcr_a_ != pcr_b_) { \
        printf("# check failed: %s == %s (%lld != %lld) (%s:%d)\n", #a, #b, pcr_a_, pcr_b_, \
               __FILE__, __LINE__); \
        pcr_test_case_failed = 1; \
    } } while (0)

#define PCR_CHECK_EQ_U64(a, b) do { \
    uint64_t pcr_a_ = (uint64_t)(a), pcr_b_ = (uint64_t)(b); \
    if (pcr_a_ != pcr_b_) { \
        printf("# check failed: %s == %s (0x%016" PRIx64 " != 0x%016" PRIx64 ") (%s:%d)\n", \
               #a, #b, pcr_a_, pcr_b_, __FILE__, __LINE__); \
        pcr_test_case_failed = 1; \
    } } while (0)

#define PCR_CHECK_STR(a, b) do { \
    const char *pcr_a_ = (a), *pcr_b_ = (b); \
    if (pcr_a_ == NULL || pcr_b_ == NULL || strcmp(pcr_a_, pcr_b_) != 0) { \
        printf("# check failed: %s == %s (\"%s\" != \"%s\") (%s:%d)\n", #a, #b, \
               pcr_a_ ? pcr_a_ : "(null)", pcr_b_ ? pcr_b_ : "(null)", __FILE__, __LINE__); \
        pcr_test_case_failed = 1; \
    } } while (0)

#define PCR_RUN(fn) do { \
    pcr_test_case_failed = 0; \
    fn(); \
    pcr_test_count++; \
    if (pcr_test_case_failed) pcr_test_failures++; \
    printf("%sok %d - %s\n", pcr_test_case_failed ? "not " : "", pcr_test_count, #fn); \
    fflush(stdout); \
    } while (0)

static inline int pcr_test_done(void)
{
    printf("1..%d\n", pcr_test_count);
    return pcr_test_failures ? 1 : 0;
}

#endif
