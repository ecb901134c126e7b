/* hashring/prefix_blocks.c: the chain step built for the baseline vector unit (SSE2 on
 * x86-64). See prefix_blocks.h. */
#define PCR_BLOCKS_NAME pcr_prefix_blocks_base
#include "prefix_blocks_impl.h"

pcr_prefix_blocks_fn pcr_prefix_blocks = pcr_prefix_blocks_base;

/* Picked before main(), so no thread ever races on the pointer. */
__attribute__((constructor)) static void prefix_blocks_pick(void)
{
#if defined(PCR_HAVE_BLOCKS_AVX2)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        pcr_prefix_blocks = pcr_prefix_blocks_avx2;
#endif
}
