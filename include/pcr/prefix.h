/* pcr/prefix.h: the prefix key, canonical prompt bytes cut into chained block hashes.
 *
 * The scheme, all XXH3-64:
 *
 *   chain[i]  = XXH3(chain[i-1] then XXH3(block i), as 16 little-endian bytes), chain[-1] = 0
 *   ctx       = XXH3(model name, seed C), C = XXH3(context bytes) or 0 when there are none
 *   blocks[i] = XXH3(chain[i] as 8 little-endian bytes, seed ctx)
 *
 * Blocks are `block_bytes` long; only the first `max_prefix_bytes` canonical bytes are hashed,
 * and a final partial block is hashed like any other, so a prompt shorter than one block still
 * has a key. blocks[i] names the whole prefix 0..i (chain[i] does, and the last step is a
 * bijection of chain[i] for a given ctx), and two models (or two LoRA adapters, or two tool
 * lists) never share a block but by a 64-bit collision.
 *
 * Why the model is mixed in last instead of seeding the chain: a request body may name its
 * model after a 512 KiB prompt (and a chat request its tools after its messages), and the
 * router hashes the prompt while the body arrives (router/body/body.c). The chain needs nothing
 * but the prompt's bytes; the model and the context cost one 8-byte XXH3 per block at the end
 * (max_prefix_bytes / block_bytes of them: 512 by default, about 1 us).
 *
 * Blocks are hashed without a seed: a seeded XXH3 of more than 240 bytes derives a secret from
 * the seed first, which cost as much as the 256-byte block itself (hashring/prefix_blocks.h).
 *
 * These values are a wire contract between router replicas (test/unit/hashring/test_prefix.c
 * pins them): changing the scheme remaps every prefix. Pure: libc and xxHash only. */
#ifndef PCR_PREFIX_H
#define PCR_PREFIX_H

#include <stddef.h>
#include <stdint.h>

/* Blocks a prompt of any length can produce: ceil(max_prefix_bytes / block_bytes), or 0 when
 * block_bytes is 0. */
size_t pcr_prefix_max_blocks(size_t block_bytes, size_t max_prefix_bytes);

/* One-shot: hashes min(len, max_prefix_bytes) bytes with `model` mixed in (no context bytes)
 * into `out`, which has room for pcr_prefix_max_blocks(block_bytes, max_prefix_bytes) values.
 * Returns the number of blocks written: ceil(hashed bytes / block_bytes), 0 for an empty
 * prompt, block_bytes == 0 or bytes == NULL. Allocates nothing. */
size_t pcr_prefix_hash(const char *model, size_t model_len, const void *bytes, size_t len,
                       size_t block_bytes, size_t max_prefix_bytes, uint64_t *out);

/* The same key, fed in pieces: any split of the canonical bytes over any number of
 * pcr_prefix_stream_update() calls gives the blocks pcr_prefix_hash() gives for the whole. */
typedef struct pcr_prefix_stream pcr_prefix_stream_t;

/* A heap stream (block_bytes >= 1, max_prefix_bytes >= 1); NULL when out of memory or when an
 * argument is invalid. It holds one partial block and the chain so far (8 bytes a block). */
pcr_prefix_stream_t *pcr_prefix_stream_new(size_t block_bytes, size_t max_prefix_bytes);
void pcr_prefix_stream_free(pcr_prefix_stream_t *s);  /* NULL is a no-op */

/* Forgets everything fed, so the stream can serve the next request. */
void pcr_prefix_stream_reset(pcr_prefix_stream_t *s);

/* The next canonical bytes. Bytes past max_prefix_bytes are counted, not hashed. Returns 0 or
 * PCR_ERR_NOMEM (the chain could not grow); the error sticks until reset. */
int pcr_prefix_stream_update(pcr_prefix_stream_t *s, const void *bytes, size_t len);

/* Bytes that concern the whole prompt wherever they come in the body (a chat request's
 * tools): hashed apart and mixed into every block with the model. Counted, all of them.
 * Returns 0 or PCR_ERR_NOMEM (sticky, as above). */
int pcr_prefix_stream_context(pcr_prefix_stream_t *s, const void *bytes, size_t len);

/* Canonical plus context bytes fed so far, hashed or not (prompt tokens are this / 4). */
uint64_t pcr_prefix_stream_bytes(const pcr_prefix_stream_t *s);

/* Writes the key, `model` mixed in, into `out` (room for pcr_prefix_max_blocks()), and
 * returns the number of blocks; the stream is left as it was (finish again, or reset).
 * Returns 0 blocks and sets *err (when not NULL) to PCR_ERR_NOMEM if an update failed. */
size_t pcr_prefix_stream_finish(const pcr_prefix_stream_t *s, const char *model,
                                size_t model_len, uint64_t *out, int *err);

#endif
