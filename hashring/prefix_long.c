/* hashring/prefix_long.c: XXH3-64 of a long block through libxxhash's x86 dispatch, which
 * picks the widest vector unit the CPU has (AVX-512, AVX2) at run time. prefix.c inlines
 * XXH3 for short inputs, where a call into the library costs as much as the hash, but an
 * inlined XXH3 is built for the baseline (SSE2) and hashes a 2 KiB block at half the speed.
 * XXH3 gives the same value on every vector unit. This file stays apart from prefix.c, which
 * includes xxhash.h with XXH_INLINE_ALL. */
#include "prefix_long.h"

#if defined(PCR_HAVE_XXH_DISPATCH)
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>

uint64_t pcr_prefix_hash_long(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed_dispatch(data, len, seed);
}
#else
#include <xxhash.h>

uint64_t pcr_prefix_hash_long(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}
#endif
