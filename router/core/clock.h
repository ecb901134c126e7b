/* router/core/clock.h: the monotonic clock every part reads, a thread's CPU time, and the one
 * conversion of a millisecond setting into libevent's struct timeval. */
#ifndef PCR_ROUTER_CLOCK_H
#define PCR_ROUTER_CLOCK_H

#include <stdint.h>
#include <sys/time.h>

/* Monotonic time in microseconds, and in nanoseconds (same clock). */
uint64_t pcr_now_us(void);
uint64_t pcr_now_ns(void);

/* The calling thread's CPU time (user and system) in microseconds; 0 if it cannot be read. A
 * system call, unlike the monotonic clock: read it sparingly. */
uint64_t pcr_thread_cpu_us(void);

/* `ms` milliseconds as a timeval (a timer's delay). */
static inline struct timeval pcr_ms_to_tv(uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

#endif
