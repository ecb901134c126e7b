/* bench/sim/kvcache.h: the simulated pod's prefix cache, shaped like vLLM's KV block manager.
 *
 * The canonical prompt is cut into blocks of PCR_KV_BLOCK_BYTES (16 tokens of 4 bytes); block i
 * is named by XXH3-64 of its bytes seeded with the name of block i-1, so one 64-bit value names
 * a whole prefix. Only full blocks are named: the partial last block is never cached, as in vLLM.
 *
 * The cache holds at most `capacity` blocks. A running request pins its prompt blocks (refcount)
 * and reserves private blocks for its partial block and its output; on release its blocks stay
 * cached with refcount 0 and join the LRU list, tail block first, so that under pressure a
 * prefix loses its tail before its head (vLLM frees a request's blocks in reverse order).
 * A request's hit is its leading run of cached blocks. The replayer links this same file to
 * compute the LRU ceiling, so both count hits the same way.
 *
 * An observer, when set, hears each block an acquire names anew and each block evicted, in
 * the cache's own order (vllm_sim publishes them as vLLM's KV events). It changes nothing:
 * without one, or with one, the cache makes the same choices.
 *
 * Ownership: pcr_kvcache_new / pcr_kvcache_free (NULL is a no-op). No I/O, no clock. */
#ifndef PCR_BENCH_KVCACHE_H
#define PCR_BENCH_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#define PCR_KV_TOKEN_BYTES 4
#define PCR_KV_BLOCK_TOKENS 16
#define PCR_KV_BLOCK_BYTES (PCR_KV_TOKEN_BYTES * PCR_KV_BLOCK_TOKENS)

typedef struct pcr_kvcache pcr_kvcache_t;

/* A cache of `capacity_blocks` blocks (1 .. 2^30). NULL when out of memory or out of range. */
pcr_kvcache_t *pcr_kvcache_new(size_t capacity_blocks);
void pcr_kvcache_free(pcr_kvcache_t *kv);

/* Names the full blocks of `data` (len bytes): writes at most `max` chained hashes to `out`
 * and returns how many full blocks there are (may exceed max; only max are written). */
size_t pcr_kvcache_hash_prompt(const void *data, size_t len, uint64_t seed,
                               uint64_t *out, size_t max);

/* How many of the first n blocks are cached, counting from the first one: the hit. */
size_t pcr_kvcache_match(const pcr_kvcache_t *kv, const uint64_t *hashes, size_t n);

/* Admits a request: pins its n blocks (cached or new) and reserves `private_blocks` more,
 * evicting unpinned blocks least recently used first. On success *hit_blocks is the leading
 * cached run before admission and 0 is returned. Returns PCR_ERR_FULL, changing nothing, when
 * pinned and reserved blocks leave too little room; PCR_ERR_TOO_LARGE when the request alone
 * exceeds the capacity. `hashes` must not repeat a value. */
int pcr_kvcache_acquire(pcr_kvcache_t *kv, const uint64_t *hashes, size_t n,
                        size_t private_blocks, size_t *hit_blocks);

/* Undoes one acquire with the same arguments: the blocks stay cached, now evictable. */
void pcr_kvcache_release(pcr_kvcache_t *kv, const uint64_t *hashes, size_t n,
                         size_t private_blocks);

/* Undoes one acquire as release does, for a request preempted before it computed its blocks
 * from `computed` on: those of them no other request holds leave the cache at once (the
 * observer hears them removed), since what was never computed cannot be hit. */
void pcr_kvcache_release_uncomputed(pcr_kvcache_t *kv, const uint64_t *hashes, size_t n,
                                    size_t computed, size_t private_blocks);

/* Would acquire succeed now? (Same test as acquire, without side effects.) */
int pcr_kvcache_fits(const pcr_kvcache_t *kv, const uint64_t *hashes, size_t n,
                     size_t private_blocks);

/* Cached tokens a request of `prompt_tokens` tokens is served: its hit, less the last block
 * when the whole prompt would hit, since vLLM always computes at least the last token. */
static inline size_t pcr_kvcache_hit_tokens(size_t hit_blocks, size_t prompt_tokens)
{
    size_t max_blocks = prompt_tokens ? (prompt_tokens - 1) / PCR_KV_BLOCK_TOKENS : 0;
    return (hit_blocks < max_blocks ? hit_blocks : max_blocks) * PCR_KV_BLOCK_TOKENS;
}

/* What an observer hears. stored: hashes[i] of the acquire under way entered the cache (the
 * blocks before it are cached and pinned). removed: `hash` was evicted. Callbacks must not
 * call back into the cache. */
typedef struct {
    void (*stored)(void *arg, const uint64_t *hashes, size_t i);
    void (*removed)(void *arg, uint64_t hash);
    void *arg;
} pcr_kvcache_observer_t;

/* Sets the observer (copied; NULL: none, the default). */
void pcr_kvcache_observe(pcr_kvcache_t *kv, const pcr_kvcache_observer_t *obs);

/* Drops every unpinned block at once, without telling the observer (a pod that restarts says
 * so in one event instead). Pinned blocks and reservations stay. Returns how many went. */
size_t pcr_kvcache_clear(pcr_kvcache_t *kv);

size_t pcr_kvcache_capacity(const pcr_kvcache_t *kv);

/* A capacity schedule, "S:F,S:F,...": the usable cache is F (0 < F <= 1) of its capacity for
 * S seconds (0 < S <= 1e6) of model time, then the next phase, in a cycle. vllm_sim's pods
 * follow it (--capacity-schedule) and the replayer's scheduled ceiling does too. */
#define PCR_KV_MAX_PHASES 64
typedef struct {
    double seconds;               /* model time */
    double fraction;              /* of the capacity, in (0, 1] */
} pcr_kvcache_phase_t;

/* Parses `s` into out[PCR_KV_MAX_PHASES]: 0, or -1 when malformed or out of range. */
int pcr_kvcache_schedule_parse(const char *s, pcr_kvcache_phase_t *out, size_t *n);

/* The fraction in force `t` seconds (>= 0) after the cycle started. */
double pcr_kvcache_schedule_at(const pcr_kvcache_phase_t *ph, size_t n, double t);

size_t pcr_kvcache_cached(const pcr_kvcache_t *kv);   /* named blocks held, pinned or not */
size_t pcr_kvcache_pinned(const pcr_kvcache_t *kv);   /* named blocks with refcount > 0 */
size_t pcr_kvcache_reserved(const pcr_kvcache_t *kv); /* private blocks of running requests */

#endif
