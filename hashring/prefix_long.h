/* hashring/prefix_long.h: XXH3-64 with a seed, for blocks long enough that the best vector
 * unit pays for a library call. Below 512 bytes it does not: a seeded XXH3 of a long input
 * first derives a secret from the seed, the same work on every unit, and a 256-byte block
 * (the default) hashes faster inlined (23 against 26 ns); at 512 bytes the two are even, at
 * 1 KiB and more the dispatch is 1.5x faster. */
#ifndef PCR_HASHRING_PREFIX_LONG_H
#define PCR_HASHRING_PREFIX_LONG_H

#include <stddef.h>
#include <stdint.h>

#define PCR_PREFIX_LONG_MIN 512

uint64_t pcr_prefix_hash_long(const void *data, size_t len, uint64_t seed);

#endif
