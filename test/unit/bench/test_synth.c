/* test/unit/bench/test_synth.c: the replayer's text synthesis (bench/sim/synth.c): lengths,
 * determinism, equal id prefixes giving equal text prefixes, and the alignment with the
 * simulator's 16-token blocks. */
#include <stdlib.h>

#include "kvcache.h"
#include "pcr/common.h"
#include "pcr_test.h"
#include "synth.h"

static char *prompt(const uint64_t *ids, size_t n, size_t tokens, uint64_t fill)
{
    char *buf = malloc(pcr_synth_prompt_len(tokens) + 1);
    size_t len = pcr_synth_prompt(ids, n, tokens, fill, buf);
    buf[len] = 0;
    return buf;
}

static void test_block_is_deterministic_and_plain(void)
{
    char a[PCR_SYNTH_BLOCK_BYTES], b[PCR_SYNTH_BLOCK_BYTES], c[PCR_SYNTH_BLOCK_BYTES];
    pcr_synth_block(7, a);
    pcr_synth_block(7, b);
    pcr_synth_block(8, c);
    PCR_CHECK(memcmp(a, b, sizeof a) == 0);
    PCR_CHECK(memcmp(a, c, PCR_KV_BLOCK_BYTES) != 0);   /* differ within the first sim block */
    int plain = 1;
    for (size_t i = 0; i < sizeof a; i++)
        plain &= (a[i] >= 'a' && a[i] <= 'z') || a[i] == ' ';
    PCR_CHECK(plain);   /* no JSON escaping needed */
}

static void test_lengths_match(void)
{
    uint64_t ids[4] = { 0, 1, 2, 3 };
    size_t lens[] = { 1, 15, 16, 511, 512, 513, 1500, 2048 };
    for (size_t i = 0; i < PCR_ARRAY_SIZE(lens); i++) {
        size_t nids = (lens[i] + 511) / 512;
        char *p = prompt(ids, nids, lens[i], 9);
        PCR_CHECK_EQ_INT(strlen(p), lens[i] * 4);
        free(p);
    }
}

static void test_equal_id_prefixes_equal_text_prefixes(void)
{
    uint64_t a[3] = { 0, 11, 12 }, b[3] = { 0, 11, 99 }, c[3] = { 5, 11, 12 };
    char *pa = prompt(a, 3, 1400, 1), *pb = prompt(b, 3, 1300, 2), *pc = prompt(c, 3, 1400, 3);
    PCR_CHECK(memcmp(pa, pb, 2 * PCR_SYNTH_BLOCK_BYTES) == 0);
    PCR_CHECK(memcmp(pa + 2 * PCR_SYNTH_BLOCK_BYTES, pb + 2 * PCR_SYNTH_BLOCK_BYTES, 64) != 0);
    PCR_CHECK(memcmp(pa, pc, 64) != 0);
    /* Same ids, another length: one is a prefix of the other. */
    char *pa2 = prompt(a, 3, 1100, 4);
    PCR_CHECK(memcmp(pa, pa2, 1100 * 4) == 0);
    free(pa);
    free(pb);
    free(pc);
    free(pa2);
}

static void test_partial_block_is_cut_block(void)
{
    uint64_t id = 42;
    char full[PCR_SYNTH_BLOCK_BYTES];
    pcr_synth_block(id, full);
    char *p = prompt(&id, 1, 100, 0);
    PCR_CHECK(memcmp(p, full, 400) == 0);
    free(p);
}

static void test_too_few_ids_still_fill(void)
{
    uint64_t ids[1] = { 3 };
    char *p = prompt(ids, 1, 1200, 77), *q = prompt(ids, 1, 1200, 78);
    PCR_CHECK_EQ_INT(strlen(p), 4800);
    PCR_CHECK(memcmp(p, q, PCR_SYNTH_BLOCK_BYTES) == 0);
    PCR_CHECK(memcmp(p + PCR_SYNTH_BLOCK_BYTES, q + PCR_SYNTH_BLOCK_BYTES, 64) != 0);  /* per row */
    free(p);
    free(q);
}

static void test_trace_block_is_32_sim_blocks(void)
{
    uint64_t a[2] = { 1, 2 }, b[2] = { 1, 3 };
    char *pa = prompt(a, 2, 1024, 0), *pb = prompt(b, 2, 1000, 0);
    uint64_t ha[64], hb[64];
    PCR_CHECK_EQ_INT(pcr_kvcache_hash_prompt(pa, 1024 * 4, 0, ha, 64), 64);
    PCR_CHECK_EQ_INT(pcr_kvcache_hash_prompt(pb, 1000 * 4, 0, hb, 64), 62);
    int shared = 0;
    while (shared < 62 && ha[shared] == hb[shared])
        shared++;
    PCR_CHECK_EQ_INT(shared, 32);
    free(pa);
    free(pb);
}

int main(void)
{
    PCR_RUN(test_block_is_deterministic_and_plain);
    PCR_RUN(test_lengths_match);
    PCR_RUN(test_equal_id_prefixes_equal_text_prefixes);
    PCR_RUN(test_partial_block_is_cut_block);
    PCR_RUN(test_too_few_ids_still_fill);
    PCR_RUN(test_trace_block_is_32_sim_blocks);
    return pcr_test_done();
}
