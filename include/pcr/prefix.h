/* pcr/prefix.h: the prefix key, canonical prompt bytes cut into chained block hashes.
 *
 * The model name seeds the chain (XXH3-64 of its bytes), so two models, or two LoRA
 * adapters, never share a block. The bytes are cut into blocks of `block_bytes`; block i is
 * hashed with XXH3-64 seeded by the hash of block i-1 (block 0 by the model seed), so
 * blocks[i] names the whole prefix 0..i. Only the first `max_prefix_bytes` are hashed; a final
 * partial block is hashed like any other, so a prompt shorter than one block still has a key.
 *
 * These values are a wire contract between router replicas (and test/unit/hashring/
 * test_prefix.c pins them): changing the scheme remaps every prefix. */
#ifndef PCR_PREFIX_H
#define PCR_PREFIX_H

#include <stddef.h>
#include <stdint.h>

/* The chain's first seed: XXH3-64 (seed 0) of the model name's bytes. */
uint64_t pcr_prefix_seed(const char *model, size_t model_len);

/* Blocks a prompt of any length can produce: ceil(max_prefix_bytes / block_bytes), or 0 when
 * block_bytes is 0. */
size_t pcr_prefix_max_blocks(size_t block_bytes, size_t max_prefix_bytes);

/* Hashes min(len, max_prefix_bytes) bytes into `out`, which has room for
 * pcr_prefix_max_blocks(block_bytes, max_prefix_bytes) values. Returns the number of blocks
 * written: ceil(hashed bytes / block_bytes), 0 for an empty prompt or block_bytes == 0. */
size_t pcr_prefix_hash(uint64_t seed, const void *bytes, size_t len, size_t block_bytes,
                       size_t max_prefix_bytes, uint64_t *out);

#endif
