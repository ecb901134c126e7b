/* hashring/prefix.c: chained XXH3-64 block hashes of the canonical prompt bytes.
 * See include/pcr/prefix.h for the scheme; it is pinned by test_prefix.c. */
#include <xxhash.h>

#include "pcr/prefix.h"

uint64_t pcr_prefix_seed(const char *model, size_t model_len)
{
    return XXH3_64bits(model_len ? model : "", model_len);
}

size_t pcr_prefix_max_blocks(size_t block_bytes, size_t max_prefix_bytes)
{
    if (block_bytes == 0)
        return 0;
    return max_prefix_bytes / block_bytes + (max_prefix_bytes % block_bytes != 0);
}

size_t pcr_prefix_hash(uint64_t seed, const void *bytes, size_t len, size_t block_bytes,
                       size_t max_prefix_bytes, uint64_t *out)
{
    const unsigned char *p = bytes;
    size_t n = 0;

    if (block_bytes == 0 || bytes == NULL)
        return 0;
    if (len > max_prefix_bytes)
        len = max_prefix_bytes;
    for (size_t off = 0; off < len; off += block_bytes) {
        size_t take = len - off < block_bytes ? len - off : block_bytes;
        seed = XXH3_64bits_withSeed(p + off, take, seed);
        out[n++] = seed;
    }
    return n;
}
