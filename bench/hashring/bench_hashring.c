/* bench_hashring.c: micro-benchmarks of the routing brain (hashring/) and the body reader,
 * measured against the routing brain's budget:
 *   - at most 48 bytes of index per stored (block, backend);
 *   - at least 5M match operations per second on short prompts;
 * and a decision within 10 us of the body's last byte, whatever the prompt's length
 * (bench_decision.c). Also: hashing throughput, insert ops/s.
 * The index is pre-filled with 1M (block, backend) pairs over 16 backends, shaped like chat
 * traffic: 8 shared system prompts, sessions whose turns extend one another.
 * Run with `make bench-hashring` (release build); about 10 s. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_hashring.h"
#include "pcr/index.h"
#include "pcr/prefix.h"

#define SYS_PROMPTS 8
#define SYS_BLOCKS 8

static uint64_t rng = 0x9E3779B97F4A7C15ull;

uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

const char *verdict(int ok)
{
    return ok ? "PASS" : "FAIL";
}

/* ---- hashing ------------------------------------------------------------------------------ */

static void bench_hashing(void)
{
    size_t len = 128 * 1024;
    char *buf = malloc(len);
    uint64_t out[512], sink = 0;
    for (size_t i = 0; i < len; i++)
        buf[i] = (char)rnd();
    double t0 = now_s(), t;
    size_t bytes = 0;
    do {
        for (int r = 0; r < 64; r++) {
            pcr_prefix_hash("llama", 5, buf, len, 256, len, out);
            sink ^= out[511];
            bytes += len;
        }
        t = now_s() - t0;
    } while (t < 1.0);
    printf("hashing (256-byte blocks, chained XXH3-64): %.2f GB/s%s\n", (double)bytes / t / 1e9,
           sink == 42 ? " " : "");
    free(buf);
}

/* ---- the pre-filled index ----------------------------------------------------------------- */

/* Chat-shaped traffic until `pairs` (block, backend) pairs are stored: a session picks one of
 * 8 system prompts, then each turn extends the previous one by 2..12 blocks; a session lives on
 * one backend, and one turn in eight lands on another (a spill). */
uint64_t prefill(insert_fn ins, void *ctx, uint64_t (*pairs)(void *ctx), uint64_t target)
{
    uint64_t k[512], t = 1, session = 0;
    while (pairs(ctx) < target) {
        size_t n = 0;
        uint64_t sys = rnd() % SYS_PROMPTS;
        for (int i = 0; i < SYS_BLOCKS; i++)
            k[n++] = 0x5157000000000000ull + sys * 64 + (uint64_t)i;
        unsigned home = (unsigned)(session % NB);
        int turns = 1 + (int)(rnd() % 10);
        for (int turn = 0; turn < turns && n < 400; turn++) {
            size_t add = 2 + rnd() % 11;
            for (size_t i = 0; i < add; i++)
                k[n++] = rnd();
            unsigned b = rnd() % 8 == 0 ? (unsigned)(rnd() % NB) : home;
            ins(ctx, b, k, n, t++);
        }
        session++;
    }
    return t;
}

static void ins_index(void *ctx, unsigned b, const uint64_t *k, size_t n, uint64_t now)
{
    size_t from;
    pcr_index_insert(ctx, b, k, n, now, &from);
}

static uint64_t pairs_index(void *ctx)
{
    return pcr_index_pairs(ctx);
}

void ins_policy(void *ctx, unsigned b, const uint64_t *k, size_t n, uint64_t now)
{
    pcr_key_t key = {.blocks = (uint64_t *)k, .nblocks = n, .prompt_tokens = n * 64};
    uint32_t from;
    pcr_policy_commit(ctx, (int)b, &key, now, &from);
}

uint64_t pairs_policy(void *ctx)
{
    uint64_t s = 0;
    for (int b = 0; b < NB; b++)
        s += pcr_policy_backend_blocks(ctx, b);
    return s;
}

/* ---- index memory and raw operations ------------------------------------------------------ */

static double bench_index(void)
{
    pcr_index_opts_t o = {.nbackends = NB};
    size_t heap0 = mallinfo2().uordblks;
    pcr_index_t *ix = pcr_index_new(&o);
    double t0 = now_s();
    uint64_t t = prefill(ins_index, ix, pairs_index, PREFILL_PAIRS);
    double fill_s = now_s() - t0;
    size_t heap = mallinfo2().uordblks - heap0;
    uint64_t pairs = pcr_index_pairs(ix);
    double per = (double)pcr_index_bytes(ix) / (double)pairs;
    printf("index: %llu (block, backend) pairs in %llu nodes, %.1f MiB (%.1f MiB of heap)\n",
           (unsigned long long)pairs, (unsigned long long)pcr_index_nodes(ix),
           pcr_index_bytes(ix) / 1048576.0, heap / 1048576.0);
    printf("index bytes per (block, backend): %.1f asked, %.1f with malloc overhead "
           "(target <= 48) %s\n", per, (double)heap / (double)pairs, verdict(per <= 48));
    printf("prefill inserts: %.2f M blocks/s\n", (double)pairs / fill_s / 1e6);

    /* Short prompts: 8..24 blocks (512..1536 tokens), half warm, half diverging early. */
    enum { NKEYS = 4096 };
    static uint64_t keys[NKEYS][24];
    static size_t lens[NKEYS];
    for (int i = 0; i < NKEYS; i++) {
        lens[i] = SYS_BLOCKS + rnd() % 17;
        uint64_t sys = rnd() % SYS_PROMPTS;
        for (size_t j = 0; j < lens[i]; j++)
            keys[i][j] = j < SYS_BLOCKS ? 0x5157000000000000ull + sys * 64 + j : rnd();
    }
    uint32_t matched[NB];
    uint64_t sink = 0;
    long ops = 0;
    t0 = now_s();
    double el;
    do {
        for (int i = 0; i < NKEYS; i++)
            sink += pcr_index_match(ix, keys[i], lens[i], matched);
        ops += NKEYS;
        el = now_s() - t0;
    } while (el < 1.5);
    double match_rate = (double)ops / el;
    printf("match, short prompts (8-24 blocks, 16 backends): %.2f M ops/s (target >= 5) %s%s\n",
           match_rate / 1e6, verdict(match_rate >= 5e6), sink == 42 ? " " : "");

    ops = 0;
    t0 = now_s();
    do {
        for (int i = 0; i < NKEYS; i++) {
            size_t from;
            pcr_index_insert(ix, (unsigned)(rnd() % NB), keys[i], lens[i], t++, &from);
        }
        ops += NKEYS;
        el = now_s() - t0;
    } while (el < 1.0);
    printf("insert, short prompts: %.2f M ops/s\n", (double)ops / el / 1e6);
    pcr_index_free(ix);
    return per;
}

int main(void)
{
    double t0 = now_s();
    printf("bench_hashring: pcrouter's routing brain (hashring/) and body reader\n");
    bench_hashing();
    bench_index();
    bench_decisions();
    printf("total %.1f s\n", now_s() - t0);
    return 0;
}
