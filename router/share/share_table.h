/* router/share/share_table.h: what this replica knows of every backend's prefixes, kept on the
 * control thread for the Redis sharing (share.c): it is what the replica's snapshot holds, and
 * it tells a new update from one already known, so a snapshot loaded twice does not reach the
 * workers twice.
 *
 * The table holds keys, not blocks: for each backend, the longest keys it was given, each with
 * the time it was last used. Block hashes are chained, so a key's last block names its whole
 * prefix: a key is found by (backend, last block), and a commit that extends a key the
 * backend held replaces it (the turns of a conversation leave one entry, the longest). It is
 * bounded in bytes, and each backend in blocks (its keys' lengths added up: a prefix two keys
 * share counts twice), as a pod's cache is; past a bound it evicts old entries, chosen as the
 * oldest of a few sampled at random (as Redis approximates LRU), which needs no ordering kept
 * on every use.
 *
 * Pure: no I/O, no clock (times are the caller's), deterministic for a given seed. Not
 * thread-safe: one thread owns it. */
#ifndef PCR_ROUTER_SHARE_TABLE_H
#define PCR_ROUTER_SHARE_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct pcr_share_table pcr_share_table_t;

typedef struct {
    uint64_t time;             /* last use, the caller's clock */
    uint32_t nblocks;          /* >= 1 */
    uint16_t backend;
    uint64_t blocks[];         /* the key */
} pcr_share_entry_t;

/* NULL when out of memory or nbackends is 0 or over 65535. max_bytes bounds what
 * pcr_share_table_bytes reports. */
pcr_share_table_t *pcr_share_table_new(size_t nbackends, size_t max_bytes, uint64_t seed);
void pcr_share_table_free(pcr_share_table_t *t);   /* NULL is a no-op */

/* `backend` holds blocks[0..n), used at `time`. Returns 1 when the table did not hold that key
 * for that backend (new knowledge), 0 when it did (its time raised to `time` if older), or
 * PCR_ERR_INVAL (backend out of range, n 0 or over UINT32_MAX), PCR_ERR_TOO_LARGE (the key
 * alone is over the bound) or PCR_ERR_NOMEM; the table stays valid. */
int pcr_share_table_commit(pcr_share_table_t *t, unsigned backend, const uint64_t *blocks,
                           size_t n, uint64_t time);

/* `backend` failed the request for blocks[0..n) that it did not hold from block `from` on:
 * it now holds blocks[0..from) only (nothing of the key when `from` is 0). */
void pcr_share_table_forget(pcr_share_table_t *t, unsigned backend, const uint64_t *blocks,
                            size_t n, size_t from);

/* Drops every key of `backend`. */
void pcr_share_table_reset(pcr_share_table_t *t, unsigned backend);

/* Bounds the blocks `backend`'s keys may add up to (UINT64_MAX, the default: no bound) and
 * evicts its oldest keys down to it. A commit keeps the key it was given even when that key
 * alone is over the bound. */
void pcr_share_table_set_capacity(pcr_share_table_t *t, unsigned backend, uint64_t blocks);
uint64_t pcr_share_table_held(const pcr_share_table_t *t, unsigned backend);

size_t pcr_share_table_count(const pcr_share_table_t *t);
size_t pcr_share_table_bytes(const pcr_share_table_t *t);   /* entries and slots, <= max_bytes */
uint64_t pcr_share_table_version(const pcr_share_table_t *t); /* moves at every change */

/* Every entry, oldest first, as a heap array (*out, caller frees the array only) valid until
 * the table next changes. 0, or PCR_ERR_NOMEM with *out NULL. An empty table gives *n 0. */
int pcr_share_table_list(const pcr_share_table_t *t, const pcr_share_entry_t ***out, size_t *n);

#endif
