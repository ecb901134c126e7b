/* router/core/atomic.h: the relaxed atomics every part uses for what threads share. */
#ifndef PCR_ROUTER_ATOMIC_H
#define PCR_ROUTER_ATOMIC_H

/* Relaxed atomics for counters and gauges shared between threads: a single writer (or
 * several, for the RMW forms) and readers that only need some recent value. */
#define PCR_LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define PCR_STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define PCR_ADD(x, v) __atomic_fetch_add(&(x), (v), __ATOMIC_RELAXED)
#define PCR_SUB(x, v) __atomic_fetch_sub(&(x), (v), __ATOMIC_RELAXED)
/* A counter only its owner thread writes: no read-modify-write instruction needed. */
#define PCR_INC(x) PCR_STORE(x, PCR_LOAD(x) + 1)
#define PCR_BUMP(x, v) PCR_STORE(x, PCR_LOAD(x) + (v))

#endif
