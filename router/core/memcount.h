/* router/core/memcount.h: bytes held by a library pcrouter hands its allocator to, counted per
 * thread for the memory account (core/memacct.h).
 *
 * Each thread adds to its own slot, so counting costs no shared write on the hot path. A block
 * freed by another thread than the one that made it subtracts from the freeing thread's slot:
 * only the sum over the slots means anything. A thread's slot outlives it (its count stays in
 * the sum); threads past the slots share the last one with atomic adds. */
#ifndef PCR_ROUTER_MEMCOUNT_H
#define PCR_ROUTER_MEMCOUNT_H

#include <stdint.h>

typedef enum {
    PCR_MEMCOUNT_LIBEVENT = 0,  /* libevent's blocks (core/evmem.c), at their class sizes */
    PCR_MEMCOUNT_NGHTTP2,       /* nghttp2's sessions (http/h2_server.c), malloc's usable sizes */
    PCR_MEMCOUNT_READERS,       /* request body readers' blocks (body/body.c, core/evmem.c) */
    PCR_MEMCOUNT__COUNT
} pcr_memcount_kind_t;

/* Adds d (negative for a free) to the calling thread's count of `kind`. */
void pcr_memcount_add(pcr_memcount_kind_t kind, int64_t d);

/* The sum over every thread, 0 if it is negative (a moment where frees were counted first). */
uint64_t pcr_memcount_sum(pcr_memcount_kind_t kind);

#endif
