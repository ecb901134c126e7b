/* hashring/prefix_blocks_avx2.c: the chain step built with -mavx2, used only where the CPU
 * has AVX2 (prefix_blocks.c picks). See prefix_blocks.h. */
#define PCR_BLOCKS_NAME pcr_prefix_blocks_avx2
#include "prefix_blocks_impl.h"
