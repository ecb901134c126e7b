/* test_prefix.c: hashring/prefix.c, the chained block hashes, one-shot and streamed. The golden
 * values pin the scheme: if one changes, every router replica would remap every prefix. */
#include <stdlib.h>
#include <xxhash.h>

#include "pcr/common.h"
#include "pcr/prefix.h"
#include "pcr_test.h"
#include "prefix_blocks.h"

static char text[1000];

static void fill_text(void)
{
    for (int i = 0; i < 1000; i++)
        text[i] = (char)('a' + i % 26);
}

static uint64_t rng = 0x243F6A8885A308D3ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void test_golden_vectors(void)
{
    uint64_t out[8];
    PCR_CHECK_EQ_INT(pcr_prefix_hash("llama", 5, text, 600, 256, 131072, out), 3);
    PCR_CHECK_EQ_U64(out[0], 0xe96fe1bbf4604420ull);
    PCR_CHECK_EQ_U64(out[1], 0x019a1118fccf25fbull);
    PCR_CHECK_EQ_U64(out[2], 0x135e2dabcc47ef72ull);
    PCR_CHECK_EQ_INT(pcr_prefix_hash("llama", 5, "hello", 5, 256, 131072, out), 1);
    PCR_CHECK_EQ_U64(out[0], 0xb6b187776d287b5eull);
    PCR_CHECK_EQ_INT(pcr_prefix_hash("", 0, "hello", 5, 256, 131072, out), 1);
    PCR_CHECK_EQ_U64(out[0], 0x0cbca580f1153ebdull);
    /* With context bytes (a chat request's tools). */
    pcr_prefix_stream_t *s = pcr_prefix_stream_new(256, 131072);
    PCR_CHECK(s != NULL);
    pcr_prefix_stream_update(s, "hello", 5);
    pcr_prefix_stream_context(s, "[{\"type\":\"function\"}]", 21);
    PCR_CHECK_EQ_INT(pcr_prefix_stream_finish(s, "llama", 5, out, NULL), 1);
    PCR_CHECK_EQ_U64(out[0], 0x75c0f08c2b5a1dbbull);
    pcr_prefix_stream_free(s);
}

static void le64(uint64_t v, unsigned char out[8])
{
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(v >> (8 * i));
}

/* chain[i] from chain[i-1] and block i, with libxxhash's own XXH3. */
static uint64_t chain_link(uint64_t parent, const void *block, size_t n)
{
    unsigned char in[16];
    le64(parent, in);
    le64(XXH3_64bits(block, n), in + 8);
    return XXH3_64bits(in, sizeof(in));
}

/* The scheme, restated with XXH3 directly: a chain from 0 where each block is hashed without a
 * seed and linked to the chain so far, the last block partial, then the model (seeded by the
 * context's hash, 0 without one) mixed into each chain value. */
static void test_chain_definition(void)
{
    uint64_t out[8];
    unsigned char le[8];
    PCR_CHECK_EQ_INT(pcr_prefix_hash("m", 1, text, 300, 128, 131072, out), 3);
    uint64_t c0 = chain_link(0, text, 128);
    uint64_t c1 = chain_link(c0, text + 128, 128);
    uint64_t c2 = chain_link(c1, text + 256, 44);
    uint64_t ctx = XXH3_64bits_withSeed("m", 1, 0);
    le64(c0, le);
    PCR_CHECK_EQ_U64(out[0], XXH3_64bits_withSeed(le, 8, ctx));
    le64(c1, le);
    PCR_CHECK_EQ_U64(out[1], XXH3_64bits_withSeed(le, 8, ctx));
    le64(c2, le);
    PCR_CHECK_EQ_U64(out[2], XXH3_64bits_withSeed(le, 8, ctx));

    pcr_prefix_stream_t *s = pcr_prefix_stream_new(128, 131072);
    pcr_prefix_stream_update(s, text, 300);
    pcr_prefix_stream_context(s, "TOOLS", 2);
    pcr_prefix_stream_context(s, "OLS", 3);
    PCR_CHECK_EQ_INT(pcr_prefix_stream_finish(s, "m", 1, out, NULL), 3);
    ctx = XXH3_64bits_withSeed("m", 1, XXH3_64bits("TOOLS", 5));
    le64(c2, le);
    PCR_CHECK_EQ_U64(out[2], XXH3_64bits_withSeed(le, 8, ctx));
    PCR_CHECK_EQ_INT(pcr_prefix_stream_bytes(s), 305);
    pcr_prefix_stream_free(s);
}

/* The chain step is built for SSE2 and for AVX2; both give libxxhash's values, for blocks from
 * 1 byte (XXH3's short paths) to past 240 (its long path) and runs of them. */
static void test_vector_builds_agree(void)
{
    static unsigned char buf[8192];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)rnd();
    const size_t sizes[] = {1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 256, 512, 1000, 4096};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t bb = sizes[k], n = sizeof(buf) / bb < 8 ? sizeof(buf) / bb : 8;
        uint64_t want[8] = {0}, base[8] = {0}, parent = rnd(), p = parent;
        for (size_t i = 0; i < n; i++)
            want[i] = p = chain_link(p, buf + i * bb, bb);
        PCR_CHECK_EQ_U64(pcr_prefix_blocks_base(buf, n, bb, parent, base), want[n - 1]);
        for (size_t i = 0; i < n; i++)
            PCR_CHECK_EQ_U64(base[i], want[i]);
#if defined(PCR_HAVE_BLOCKS_AVX2)
        if (__builtin_cpu_supports("avx2")) {
            uint64_t wide[8];
            PCR_CHECK_EQ_U64(pcr_prefix_blocks_avx2(buf, n, bb, parent, wide), want[n - 1]);
            for (size_t i = 0; i < n; i++)
                PCR_CHECK_EQ_U64(wide[i], want[i]);
        }
#endif
    }
    PCR_CHECK_EQ_U64(pcr_prefix_blocks_base(buf, 0, 256, 42, NULL), 42);
}

static void test_shared_prefix_shares_blocks(void)
{
    uint64_t a[8], b[8];
    char other[1000];
    memcpy(other, text, sizeof(other));
    other[700] = '#';
    size_t na = pcr_prefix_hash("m", 1, text, 1000, 256, 131072, a);
    size_t nb = pcr_prefix_hash("m", 1, other, 1000, 256, 131072, b);
    PCR_CHECK_EQ_INT(na, 4);
    PCR_CHECK_EQ_INT(nb, 4);
    PCR_CHECK_EQ_U64(a[0], b[0]);
    PCR_CHECK_EQ_U64(a[1], b[1]);
    PCR_CHECK(a[2] != b[2]);  /* byte 700 is in block 2 */
    PCR_CHECK(a[3] != b[3]);  /* and the chain carries the difference on */
    /* A prompt that extends another keeps its full blocks. */
    na = pcr_prefix_hash("m", 1, text, 512, 256, 131072, a);
    nb = pcr_prefix_hash("m", 1, text, 900, 256, 131072, b);
    PCR_CHECK_EQ_INT(na, 2);
    PCR_CHECK(memcmp(a, b, 2 * sizeof(uint64_t)) == 0);
}

/* Two models, or one model with two tool lists, share no block at any position. */
static void test_models_never_share(void)
{
    uint64_t a[4], b[4], c[4];
    PCR_CHECK_EQ_INT(pcr_prefix_hash("base", 4, text, 1000, 256, 131072, a), 4);
    PCR_CHECK_EQ_INT(pcr_prefix_hash("base-lora1", 10, text, 1000, 256, 131072, b), 4);
    pcr_prefix_stream_t *s = pcr_prefix_stream_new(256, 131072);
    pcr_prefix_stream_update(s, text, 1000);
    pcr_prefix_stream_context(s, "[]", 2);
    PCR_CHECK_EQ_INT(pcr_prefix_stream_finish(s, "base", 4, c, NULL), 4);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            PCR_CHECK(a[i] != b[j]);
            PCR_CHECK(a[i] != c[j]);
        }
    pcr_prefix_stream_free(s);
}

/* Any split of the bytes over updates gives the one-shot key; so does a reset stream. */
static void test_stream_any_split(void)
{
    uint64_t want[16], got[16];
    pcr_prefix_stream_t *s = pcr_prefix_stream_new(64, 700);
    size_t nwant = pcr_prefix_hash("mod", 3, text, 1000, 64, 700, want);
    PCR_CHECK_EQ_INT(nwant, 11);
    for (size_t cut = 0; cut <= 1000; cut++) {
        pcr_prefix_stream_reset(s);
        pcr_prefix_stream_update(s, text, cut);
        pcr_prefix_stream_update(s, text + cut, 1000 - cut);
        size_t n = pcr_prefix_stream_finish(s, "mod", 3, got, NULL);
        if (n != nwant || memcmp(got, want, n * sizeof(uint64_t)) != 0) {
            PCR_CHECK(!"split differs");
            break;
        }
    }
    for (int round = 0; round < 200; round++) {
        pcr_prefix_stream_reset(s);
        for (size_t off = 0; off < 1000;) {
            size_t take = 1 + rnd() % 90;
            if (take > 1000 - off)
                take = 1000 - off;
            pcr_prefix_stream_update(s, text + off, take);
            off += take;
        }
        size_t n = pcr_prefix_stream_finish(s, "mod", 3, got, NULL);
        PCR_CHECK(n == nwant && memcmp(got, want, n * sizeof(uint64_t)) == 0);
        /* finish leaves the stream as it was */
        PCR_CHECK(pcr_prefix_stream_finish(s, "mod", 3, got, NULL) == nwant);
        PCR_CHECK_EQ_INT(pcr_prefix_stream_bytes(s), 1000);
    }
    pcr_prefix_stream_free(s);
}

/* A long max_prefix_bytes makes the chain grow past its first allocation. */
static void test_stream_grows(void)
{
    size_t len = 300000;
    char *big = malloc(len);
    for (size_t i = 0; i < len; i++)
        big[i] = (char)rnd();
    size_t max = pcr_prefix_max_blocks(16, len);
    uint64_t *want = malloc(max * sizeof(uint64_t)), *got = malloc(max * sizeof(uint64_t));
    size_t nwant = pcr_prefix_hash("m", 1, big, len, 16, len, want);
    PCR_CHECK_EQ_INT(nwant, 18750);
    pcr_prefix_stream_t *s = pcr_prefix_stream_new(16, len);
    for (size_t off = 0; off < len; off += 16384)
        pcr_prefix_stream_update(s, big + off, len - off < 16384 ? len - off : 16384);
    int err = 1;
    PCR_CHECK_EQ_INT(pcr_prefix_stream_finish(s, "m", 1, got, &err), nwant);
    PCR_CHECK_EQ_INT(err, 0);
    PCR_CHECK(memcmp(got, want, nwant * sizeof(uint64_t)) == 0);
    pcr_prefix_stream_free(s);
    free(big);
    free(want);
    free(got);
}

static void test_limits(void)
{
    uint64_t out[8], full[8];
    PCR_CHECK_EQ_INT(pcr_prefix_max_blocks(256, 131072), 512);
    PCR_CHECK_EQ_INT(pcr_prefix_max_blocks(256, 1000), 4);
    PCR_CHECK_EQ_INT(pcr_prefix_max_blocks(0, 1000), 0);
    /* Only max_prefix_bytes are hashed: a longer prompt gives the same blocks. */
    PCR_CHECK_EQ_INT(pcr_prefix_hash("m", 1, text, 1000, 256, 600, out), 3);
    PCR_CHECK_EQ_INT(pcr_prefix_hash("m", 1, text, 600, 256, 131072, full), 3);
    PCR_CHECK(memcmp(out, full, 3 * sizeof(uint64_t)) == 0);
    PCR_CHECK_EQ_INT(pcr_prefix_hash("m", 1, text, 0, 256, 131072, out), 0);
    PCR_CHECK_EQ_INT(pcr_prefix_hash("m", 1, text, 10, 0, 131072, out), 0);
    PCR_CHECK_EQ_INT(pcr_prefix_hash("m", 1, NULL, 10, 256, 131072, out), 0);
    /* One byte still gets a key. */
    PCR_CHECK_EQ_INT(pcr_prefix_hash("m", 1, "x", 1, 256, 131072, out), 1);
    /* The stream: past max_prefix_bytes bytes are counted, not hashed. */
    pcr_prefix_stream_t *s = pcr_prefix_stream_new(256, 600);
    PCR_CHECK_EQ_INT(pcr_prefix_stream_update(s, text, 1000), 0);
    PCR_CHECK_EQ_INT(pcr_prefix_stream_finish(s, "m", 1, full, NULL), 3);
    pcr_prefix_hash("m", 1, text, 1000, 256, 600, out);
    PCR_CHECK(memcmp(out, full, 3 * sizeof(uint64_t)) == 0);
    PCR_CHECK_EQ_INT(pcr_prefix_stream_bytes(s), 1000);
    pcr_prefix_stream_reset(s);
    PCR_CHECK_EQ_INT(pcr_prefix_stream_finish(s, "m", 1, out, NULL), 0);
    PCR_CHECK_EQ_INT(pcr_prefix_stream_update(s, NULL, 3), PCR_ERR_INVAL);
    pcr_prefix_stream_free(s);
    pcr_prefix_stream_free(NULL);
    PCR_CHECK(pcr_prefix_stream_new(0, 100) == NULL);
    PCR_CHECK(pcr_prefix_stream_new(16, 0) == NULL);
}

int main(void)
{
    fill_text();
    PCR_RUN(test_golden_vectors);
    PCR_RUN(test_chain_definition);
    PCR_RUN(test_vector_builds_agree);
    PCR_RUN(test_shared_prefix_shares_blocks);
    PCR_RUN(test_models_never_share);
    PCR_RUN(test_stream_any_split);
    PCR_RUN(test_stream_grows);
    PCR_RUN(test_limits);
    return pcr_test_done();
}
