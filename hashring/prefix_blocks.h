/* hashring/prefix_blocks.h: the chain step of the prefix key (include/pcr/prefix.h), for a
 * run of whole blocks at once.
 *
 *   chain[i] = XXH3-64(chain[i-1] and XXH3-64(block i), as 16 little-endian bytes)
 *
 * A block is hashed without a seed: a seeded XXH3 of more than 240 bytes first derives a
 * 192-byte secret from the seed, which cost as much as hashing a 256-byte block. The chain is
 * carried by a 16-byte XXH3 instead, a few nanoseconds. The same code is built twice: for the
 * baseline x86-64 (SSE2) and, where the compiler can, for AVX2 (prefix_blocks_avx2.c), which
 * hashes a 256-byte block about twice as fast; prefix.c picks one when the program starts.
 * Both give the same values on every CPU (test_prefix.c checks it). */
#ifndef PCR_HASHRING_PREFIX_BLOCKS_H
#define PCR_HASHRING_PREFIX_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

/* Hashes `n` blocks of `block_bytes` bytes from `p` onto the chain value `parent`, writes the
 * chain after each into out[0..n) and returns the last (parent when n is 0). */
typedef uint64_t (*pcr_prefix_blocks_fn)(const unsigned char *p, size_t n, size_t block_bytes,
                                         uint64_t parent, uint64_t *out);

uint64_t pcr_prefix_blocks_base(const unsigned char *p, size_t n, size_t block_bytes,
                                uint64_t parent, uint64_t *out);
#if defined(PCR_HAVE_BLOCKS_AVX2)
uint64_t pcr_prefix_blocks_avx2(const unsigned char *p, size_t n, size_t block_bytes,
                                uint64_t parent, uint64_t *out);
#endif

/* The variant prefix.c uses on this CPU. */
extern pcr_prefix_blocks_fn pcr_prefix_blocks;

#endif
