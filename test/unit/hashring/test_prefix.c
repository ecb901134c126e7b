/* test_prefix.c: hashring/prefix.c, the chained block hashes. The golden values pin the
 * scheme: if one changes, every router replica would remap every prefix. */
#include <stdlib.h>
#include <xxhash.h>

#include "pcr/prefix.h"
#include "pcr_test.h"

static char text[1000];

static void fill_text(void)
{
    for (int i = 0; i < 1000; i++)
        text[i] = (char)('a' + i % 26);
}

static void test_golden_vectors(void)
{
    uint64_t out[8];
    uint64_t seed = pcr_prefix_seed("llama", 5);
    PCR_CHECK_EQ_U64(seed, 0x1cd9e3046f25882full);
    PCR_CHECK_EQ_U64(pcr_prefix_seed("", 0), 0x2d06800538d394c2ull);
    PCR_CHECK_EQ_INT(pcr_prefix_hash(seed, text, 600, 256, 131072, out), 3);
    PCR_CHECK_EQ_U64(out[0], 0x3411e70a77666c0eull);
    PCR_CHECK_EQ_U64(out[1], 0xd4f2a9124c35c566ull);
    PCR_CHECK_EQ_U64(out[2], 0xfff17a6da72025abull);
    PCR_CHECK_EQ_INT(pcr_prefix_hash(seed, "hello", 5, 256, 131072, out), 1);
    PCR_CHECK_EQ_U64(out[0], 0x7ba72645fd8a709bull);
}

/* The scheme, restated with XXH3 directly: block i seeded by block i-1, the last one partial. */
static void test_chain_definition(void)
{
    uint64_t out[8];
    uint64_t seed = XXH3_64bits("m", 1);
    PCR_CHECK_EQ_U64(pcr_prefix_seed("m", 1), seed);
    PCR_CHECK_EQ_INT(pcr_prefix_hash(seed, text, 300, 128, 131072, out), 3);
    uint64_t h0 = XXH3_64bits_withSeed(text, 128, seed);
    uint64_t h1 = XXH3_64bits_withSeed(text + 128, 128, h0);
    uint64_t h2 = XXH3_64bits_withSeed(text + 256, 44, h1);
    PCR_CHECK_EQ_U64(out[0], h0);
    PCR_CHECK_EQ_U64(out[1], h1);
    PCR_CHECK_EQ_U64(out[2], h2);
}

static void test_shared_prefix_shares_blocks(void)
{
    uint64_t a[8], b[8];
    char other[1000];
    memcpy(other, text, sizeof(other));
    other[700] = '#';
    uint64_t seed = pcr_prefix_seed("m", 1);
    size_t na = pcr_prefix_hash(seed, text, 1000, 256, 131072, a);
    size_t nb = pcr_prefix_hash(seed, other, 1000, 256, 131072, b);
    PCR_CHECK_EQ_INT(na, 4);
    PCR_CHECK_EQ_INT(nb, 4);
    PCR_CHECK_EQ_U64(a[0], b[0]);
    PCR_CHECK_EQ_U64(a[1], b[1]);
    PCR_CHECK(a[2] != b[2]);  /* byte 700 is in block 2 */
    PCR_CHECK(a[3] != b[3]);  /* and the chain carries the difference on */
    /* A prompt that extends another keeps its full blocks. */
    na = pcr_prefix_hash(seed, text, 512, 256, 131072, a);
    nb = pcr_prefix_hash(seed, text, 900, 256, 131072, b);
    PCR_CHECK_EQ_INT(na, 2);
    PCR_CHECK(memcmp(a, b, 2 * sizeof(uint64_t)) == 0);
}

static void test_models_never_share(void)
{
    uint64_t a[4], b[4];
    pcr_prefix_hash(pcr_prefix_seed("base", 4), text, 256, 256, 131072, a);
    pcr_prefix_hash(pcr_prefix_seed("base-lora1", 10), text, 256, 256, 131072, b);
    PCR_CHECK(a[0] != b[0]);
}

static void test_limits(void)
{
    uint64_t out[8], full[8];
    uint64_t seed = pcr_prefix_seed("m", 1);
    PCR_CHECK_EQ_INT(pcr_prefix_max_blocks(256, 131072), 512);
    PCR_CHECK_EQ_INT(pcr_prefix_max_blocks(256, 1000), 4);
    PCR_CHECK_EQ_INT(pcr_prefix_max_blocks(0, 1000), 0);
    /* Only max_prefix_bytes are hashed: a longer prompt gives the same blocks. */
    PCR_CHECK_EQ_INT(pcr_prefix_hash(seed, text, 1000, 256, 600, out), 3);
    PCR_CHECK_EQ_INT(pcr_prefix_hash(seed, text, 600, 256, 131072, full), 3);
    PCR_CHECK(memcmp(out, full, 3 * sizeof(uint64_t)) == 0);
    PCR_CHECK_EQ_INT(pcr_prefix_hash(seed, text, 0, 256, 131072, out), 0);
    PCR_CHECK_EQ_INT(pcr_prefix_hash(seed, text, 10, 0, 131072, out), 0);
    PCR_CHECK_EQ_INT(pcr_prefix_hash(seed, NULL, 10, 256, 131072, out), 0);
    /* One byte still gets a key. */
    PCR_CHECK_EQ_INT(pcr_prefix_hash(seed, "x", 1, 256, 131072, out), 1);
}

int main(void)
{
    fill_text();
    PCR_RUN(test_golden_vectors);
    PCR_RUN(test_chain_definition);
    PCR_RUN(test_shared_prefix_shares_blocks);
    PCR_RUN(test_models_never_share);
    PCR_RUN(test_limits);
    return pcr_test_done();
}
