/* router/core/clock.c: the one clock the router reads: monotonic, in microseconds (clock.h), and
 * in nanoseconds for what takes microseconds (a routing decision's phases); and the calling
 * thread's CPU time. The routing library has none of its own: this time is passed in. */
#include <time.h>

#include "clock.h"

static uint64_t to_us(const struct timespec *ts)
{
    return (uint64_t)ts->tv_sec * 1000000u + (uint64_t)ts->tv_nsec / 1000u;
}

uint64_t pcr_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return to_us(&ts);
}

uint64_t pcr_thread_cpu_us(void)
{
    struct timespec ts;
    return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0 ? to_us(&ts) : 0;
}

uint64_t pcr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
