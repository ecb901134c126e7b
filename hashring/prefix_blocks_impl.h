/* hashring/prefix_blocks_impl.h: the body of the chain step, included by prefix_blocks.c and
 * prefix_blocks_avx2.c with PCR_BLOCKS_NAME set; each build inlines XXH3 for its own vector
 * unit. See prefix_blocks.h. */
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "prefix_blocks.h"

static inline void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

uint64_t PCR_BLOCKS_NAME(const unsigned char *p, size_t n, size_t block_bytes, uint64_t parent,
                         uint64_t *out)
{
    unsigned char link[16];
    for (size_t i = 0; i < n; i++, p += block_bytes) {
        uint64_t h = XXH3_64bits(p, block_bytes);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* The byte loop below is not folded into two stores, and costs a third of a block. */
        memcpy(link, &parent, 8);
        memcpy(link + 8, &h, 8);
#else
        put_le64(link, parent);
        put_le64(link + 8, h);
#endif
        parent = XXH3_64bits(link, sizeof(link));
        out[i] = parent;
    }
    return parent;
}
