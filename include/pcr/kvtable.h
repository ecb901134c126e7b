/* pcr/kvtable.h: what each pod says it holds, from its KV-cache events (precise mode).
 *
 * A vLLM pod publishes every block it stores and evicts, named by its own block hash, which
 * is seeded per process and cannot be reproduced. So the table keys blocks on pcrouter's own
 * chain of the block's tokens, the same chain a request's tokens give (pcr_kvtable_key):
 *
 *   chain[i] = XXH3-64(the block's token ids as little-endian u32, seed chain[i-1]),
 *   chain[-1] = the seed (0 for the base model; the caller's value for an adapter)
 *
 * and keeps, per pod, a map from the pod's hash to that chain, so that BlockRemoved (which
 * names the pod's hash only) finds what to drop, and a stored block's parent gives the chain
 * its tokens continue. Only whole blocks count, as in vLLM's prefix cache.
 *
 * A block is held by a pod on a medium: GPU, or CPU when offloaded (the same block may be
 * on both while it moves). Entries the router adds for a request it has just sent are
 * speculative: they make two requests a moment apart land together, until the pod's own
 * event confirms them or `speculative_ttl` passes.
 *
 * Pure: no I/O, no clock (`now` is passed in, any monotonic unit), no threads. Bounded by
 * `max_bytes`: past it new entries are refused (counted), never the table corrupted. Every
 * function that allocates leaves the table valid when an allocation fails. Implemented in
 * hashring/kvtable.c. */
#ifndef PCR_KVTABLE_H
#define PCR_KVTABLE_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/common.h"

typedef enum {
    PCR_KVT_GPU = 0,
    PCR_KVT_CPU = 1,
    PCR_KVT_MEDIA = 2,
} pcr_kvt_medium_t;

typedef struct {
    size_t nbackends;          /* 0.. (grows with pcr_kvtable_grow) */
    uint32_t block_tokens;     /* tokens per block: vLLM's --block-size (16) */
    size_t max_bytes;          /* 0 = no bound */
    uint64_t speculative_ttl;  /* in the caller's `now` units */
} pcr_kvtable_opts_t;

typedef struct pcr_kvtable pcr_kvtable_t;

/* A BlockStored event, as the decoder gives it (router/kv/kv_decode.h). */
typedef struct {
    const uint64_t *hashes;    /* the pod's block hashes */
    size_t nhashes;
    int has_parent;
    uint64_t parent;           /* the pod's hash of the block before hashes[0] */
    const uint32_t *tokens;    /* nhashes x block_size */
    uint32_t block_size;
    pcr_kvt_medium_t medium;
    uint64_t seed;             /* chain[-1] for a block with no parent */
} pcr_kvt_stored_t;

/* NULL when out of memory or opts invalid (block_tokens 0). _free(NULL) is a no-op. */
pcr_kvtable_t *pcr_kvtable_new(const pcr_kvtable_opts_t *opts);
void pcr_kvtable_free(pcr_kvtable_t *t);

/* A reload: the new bound (entries past it stay, new ones are refused until below) and TTL
 * (for entries speculated from now on). NULL is a no-op. */
void pcr_kvtable_set_limits(pcr_kvtable_t *t, size_t max_bytes, uint64_t speculative_ttl);

/* Room for backends up to `n` (never shrinks). 0 or PCR_ERR_NOMEM. */
int pcr_kvtable_grow(pcr_kvtable_t *t, size_t n);

/* A request's key: the chains of the whole blocks of tokens[0..ntokens), at most `max`.
 * Returns how many were written. Allocates nothing. */
size_t pcr_kvtable_key(uint64_t seed, uint32_t block_tokens, const uint32_t *tokens,
                       size_t ntokens, uint64_t *chains, size_t max);

/* The pod events. _stored returns 0; PCR_ERR_NOTFOUND when the parent is not known (an
 * event was missed: nothing is stored, the caller resynchronises); PCR_ERR_INVAL for another
 * block size than the table's or a backend out of range; PCR_ERR_FULL past max_bytes, or
 * PCR_ERR_NOMEM (then a leading part of the blocks may be stored: each stored block is
 * valid). A block the pod already had is refreshed; a speculative one is confirmed. */
int pcr_kvtable_stored(pcr_kvtable_t *t, unsigned backend, const pcr_kvt_stored_t *ev,
                       uint64_t now);
/* Drops the pod's blocks of these hashes on `medium` (unknown ones are ignored). Returns how
 * many were dropped. */
size_t pcr_kvtable_removed(pcr_kvtable_t *t, unsigned backend, const uint64_t *hashes, size_t n,
                           pcr_kvt_medium_t medium);
/* Drops every entry of a backend, speculative ones too (AllBlocksCleared, a restart, a
 * backend that left, a subscription that lost its place). */
void pcr_kvtable_clear(pcr_kvtable_t *t, unsigned backend);
/* Drops a backend's speculative entries only, leaving what its events reported (a restart
 * seen by other means than the events, which report it themselves). Returns how many. */
size_t pcr_kvtable_clear_speculative(pcr_kvtable_t *t, unsigned backend);

/* A request was just sent to `backend` with this key: its blocks the backend does not hold
 * become speculative entries until now + speculative_ttl. 0, PCR_ERR_FULL or PCR_ERR_NOMEM. */
int pcr_kvtable_speculate(pcr_kvtable_t *t, unsigned backend, const uint64_t *chains, size_t n,
                          uint64_t now);
/* Drops the speculative entries whose time is up. Returns how many. */
size_t pcr_kvtable_expire(pcr_kvtable_t *t, uint64_t now);

/* One walk over the key: gpu[b] = leading blocks of chains[0..n) backend b holds on its GPU
 * (speculative entries count: they will be there), any[b] = the same on GPU or CPU, for every
 * b < nbackends (`gpu` may be NULL). Returns the largest any[b]. Reads only. */
size_t pcr_kvtable_match(const pcr_kvtable_t *t, const uint64_t *chains, size_t n,
                         uint32_t *gpu, uint32_t *any);

/* Counts, for /metrics. */
uint64_t pcr_kvtable_entries(const pcr_kvtable_t *t, unsigned backend, pcr_kvt_medium_t medium);
uint64_t pcr_kvtable_speculative(const pcr_kvtable_t *t, unsigned backend);
uint64_t pcr_kvtable_refused(const pcr_kvtable_t *t);  /* entries refused: max_bytes */
size_t pcr_kvtable_bytes(const pcr_kvtable_t *t);

/* Checks every invariant (a test helper, O(size)): 0, or PCR_ERR_INVAL with a message. */
int pcr_kvtable_check(const pcr_kvtable_t *t, char *err, size_t errlen);

#endif
