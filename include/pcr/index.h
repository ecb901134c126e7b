/* pcr/index.h: the prefix index, a compressed radix tree over chained block hashes that
 * knows, for every stored prefix, which backends hold it and when each last used it.
 *
 * A backend's holdings are always prefix-closed: holding block i of a path means holding
 * blocks 0..i-1 of it, the way a vLLM pod's prefix cache works. Each backend has a capacity in
 * blocks; inserting past it evicts that backend's least recently used leaf blocks first. A cap
 * on the index's total memory evicts the globally least recently used leaves.
 *
 * Pure: no I/O, no clock (the caller passes `now`, any monotonic unit), no threads. The memory
 * allocator is injectable, and every function that allocates leaves the index valid when an
 * allocation fails. Implemented in hashring/radix.c. */
#ifndef PCR_INDEX_H
#define PCR_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/common.h"

#define PCR_INDEX_MAX_BACKENDS 65535u
#define PCR_INDEX_UNLIMITED UINT64_MAX

/* The allocator: `free_fn` is told the size that was asked for. */
typedef struct {
    void *(*malloc_fn)(size_t size, void *ud);
    void (*free_fn)(void *ptr, size_t size, void *ud);
    void *ud;
} pcr_index_allocator_t;

typedef struct {
    size_t nbackends;                     /* 1..PCR_INDEX_MAX_BACKENDS */
    size_t max_bytes;                     /* hard cap on index memory; 0 = none */
    const pcr_index_allocator_t *alloc;   /* NULL = malloc/free; copied */
} pcr_index_opts_t;

typedef struct pcr_index pcr_index_t;

/* NULL when out of memory or when opts are invalid. Every backend starts with unlimited
 * capacity. */
pcr_index_t *pcr_index_new(const pcr_index_opts_t *opts);
void pcr_index_free(pcr_index_t *idx);  /* NULL is a no-op */

/* Changes the memory cap (0 = none), evicting the oldest leaves down to it. */
void pcr_index_set_max_bytes(pcr_index_t *idx, size_t max_bytes);

/* Makes room for backends up to `nbackends` (new ones empty, unlimited). 0, PCR_ERR_INVAL, or
 * PCR_ERR_NOMEM (the index unchanged). Never shrinks. */
int pcr_index_grow(pcr_index_t *idx, size_t nbackends);

/* Sets a backend's capacity in blocks (PCR_INDEX_UNLIMITED = none) and evicts its least
 * recently used leaf blocks down to it. 0 or PCR_ERR_INVAL. */
int pcr_index_set_capacity(pcr_index_t *idx, unsigned backend, uint64_t blocks);

/* Records that `backend` holds blocks[0..n) (last used at `now`), then enforces its capacity
 * and the memory cap. *added_from gets the first block it did not hold before (n when it held
 * all). Returns 0, PCR_ERR_INVAL, or PCR_ERR_NOMEM: the index stays valid and the backend then
 * holds a leading part of the new blocks (from *added_from on), which pcr_index_erase undoes. */
int pcr_index_insert(pcr_index_t *idx, unsigned backend, const uint64_t *blocks, size_t n,
                     uint64_t now, size_t *added_from);

/* One walk: matched[b] = how many leading blocks of blocks[0..n) backend b holds, for every
 * b < nbackends. Returns the largest of them. Reads only. */
size_t pcr_index_match(const pcr_index_t *idx, const uint64_t *blocks, size_t n,
                       uint32_t *matched);

/* Drops blocks [from, n) of the path for `backend`, deepest first, but keeps any block the
 * backend still needs as the prefix of a longer prefix it holds (holdings stay prefix-closed).
 * Never fails: when splitting a node would need memory that is not there, it drops the
 * backend's whole node instead (forgetting more than asked is safe). */
void pcr_index_erase(pcr_index_t *idx, unsigned backend, const uint64_t *blocks, size_t n,
                     size_t from);

/* When `backend` last used block n-1 of blocks[0..n): the `now` of the latest insert that
 * covered it, or 0 when the backend does not hold it (or n is 0). Reads only. */
uint64_t pcr_index_last_use(const pcr_index_t *idx, unsigned backend, const uint64_t *blocks,
                            size_t n);

/* Drops every block `backend` last used at or before `time`, oldest first, as an LRU cache
 * that evicted a block of that age has evicted everything older. Holdings stay prefix-closed
 * (a block needed by a newer one stays). Returns the blocks dropped. Never fails. */
uint64_t pcr_index_evict_older(pcr_index_t *idx, unsigned backend, uint64_t time);

/* Drops every entry of `backend` (its pod restarted or left). Never fails. */
void pcr_index_remove_backend(pcr_index_t *idx, unsigned backend);

uint64_t pcr_index_backend_blocks(const pcr_index_t *idx, unsigned backend);
uint64_t pcr_index_pairs(const pcr_index_t *idx);   /* stored (block, backend) pairs */
uint64_t pcr_index_nodes(const pcr_index_t *idx);
/* (block, backend) pairs evicted since the index was made: by a backend's capacity or by the
 * memory cap (not by pcr_index_erase or pcr_index_remove_backend, which forget on request). */
uint64_t pcr_index_evictions(const pcr_index_t *idx);
size_t pcr_index_bytes(const pcr_index_t *idx);     /* bytes asked from the allocator */

/* Checks every invariant (a test helper, O(size)); 0, or PCR_ERR_INVAL with a message.
 * Uses scratch fields inside the index, hence not const. */
int pcr_index_check(pcr_index_t *idx, char *err, size_t errlen);

#endif
