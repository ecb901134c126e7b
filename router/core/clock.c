/* router/core/clock.c: the one clock the router reads: monotonic, in microseconds (clock.h), and
 * in nanoseconds for what takes microseconds (a routing decision's phases). The routing library
 * has none of its own: this time is passed in. */
#include <time.h>

#include "clock.h"

uint64_t pcr_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t pcr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
