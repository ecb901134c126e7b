/* router/core/evmem.h: libevent's memory, kept per thread for reuse (event_set_mem_functions).
 *
 * Why: libevent gives each read its own buffer chain, a 32 KiB block for a 16 KiB read (the
 * chain's header tips a 16 KiB request over to the next power of two), and frees it once the
 * bytes are parsed. Blocks of that size are beyond malloc's per-thread caches: every request
 * paid malloc's slow path (and its consolidation of small free blocks) for each chain it read
 * or wrote, a few percent of the proxy's CPU. HAProxy and nginx keep such buffers in pools;
 * this is that, for libevent's blocks.
 *
 * How: blocks of 32 bytes to 64 KiB are rounded up to a size class (64 to 256 bytes in steps
 * of 16, then 384, 512, 768, 1024, ... 64 KiB) and kept, when freed, on the freeing thread's
 * list for that class (at most 2048 blocks of a class up to 256 bytes, 512 KiB of a larger
 * one); any other size goes to malloc as it is. Classes this close keep an idle connection's
 * evbuffers near their own size. A block made by one thread may be freed by another (the bus
 * hands buffers over): it joins the freeing thread's list. A thread's lists are freed when it
 * ends; the process's own thread's when pcr_evmem_thread_clear() is called.
 *
 * Spans: the classes of 4 KiB and up (bodies' and answers' chains, and the body readers) do
 * not come from malloc but from spans, 1 MiB mappings that each hold blocks of one class. A
 * span that empties is unmapped (4 empty ones are kept), so memory freed after a flood of
 * uploads goes back to the system. From malloc it did not: the freed chains sat between the
 * connections' small blocks in malloc's heap, and RSS stayed at the flood's peak
 * (docs/BENCHMARKS.md, "Spans"). A thread reaches the spans, under one lock, only when its
 * list of a class is empty or full.
 *
 * The small blocks are libevent's per-request evbuffers and events. With 64 requests in
 * flight, malloc's per-thread cache (7 blocks of a size) runs dry and every allocation of them
 * took malloc's slow path. The router's own objects and buffers that live for one request (an
 * upstream request, an h2 stream, a response's copy for its usage in router/body/usage.c) come from
 * the same lists.
 *
 * Under AddressSanitizer the lists and spans are off (every block is malloc's, every free is
 * a free), so that a use after free is still caught. */
#ifndef PCR_ROUTER_EVMEM_H
#define PCR_ROUTER_EVMEM_H

#include <stddef.h>
#include <stdint.h>

#include "memcount.h"

/* Installs the functions in libevent. Must be called before anything else uses libevent. */
void pcr_evmem_install(void);

/* The functions themselves (for the unit test). Their blocks count in PCR_MEMCOUNT_LIBEVENT. */
void *pcr_evmem_malloc(size_t n);
void *pcr_evmem_calloc(size_t n, size_t size);

/* The same, for blocks counted in `kind` (a realloc keeps the block's kind; free is
 * pcr_evmem_free). */
void *pcr_evmem_malloc_in(size_t n, pcr_memcount_kind_t kind);
void *pcr_evmem_calloc_in(size_t n, size_t size, pcr_memcount_kind_t kind);
void *pcr_evmem_realloc(void *p, size_t n);
void pcr_evmem_free(void *p);

/* The bytes of the blocks handed out and not yet freed, all threads (class sizes, not what
 * was asked: what the blocks hold), for the memory account. Kept blocks are not in it. */
uint64_t pcr_evmem_in_use(void);

/* The bytes of the spans mapped (the blocks of 4 KiB and up), kept empty ones included. */
uint64_t pcr_evmem_span_bytes(void);

/* Frees the calling thread's kept blocks. */
void pcr_evmem_thread_clear(void);

/* Blocks the calling thread keeps, and whether blocks are kept at all (not under
 * AddressSanitizer), for the unit test. */
size_t pcr_evmem_thread_kept(void);
int pcr_evmem_keeps(void);

#endif
