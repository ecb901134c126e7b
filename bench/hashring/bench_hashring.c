/* bench_hashring.c: micro-benchmarks of the routing brain (hashring/) and the body reader,
 * measured against the routing brain's budget:
 *   - a decision for an 8k-token (32 KiB) prompt in at most 30 us, body parse included;
 *   - at most 48 bytes of index per stored (block, backend);
 *   - at least 5M match operations per second on short prompts.
 * Also: hashing throughput, decision time for 1k/32k/128k-token prompts, insert ops/s.
 * The index is pre-filled with 1M (block, backend) pairs over 16 backends, shaped like chat
 * traffic: 8 shared system prompts, sessions whose turns extend one another.
 * Run with `make bench-hashring` (release build); about 20 s. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "body.h"
#include "pcr/index.h"
#include "pcr/policy.h"
#include "pcr/prefix.h"

#define NB 16
#define PREFILL_PAIRS 1000000u
#define SYS_PROMPTS 8
#define SYS_BLOCKS 8

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static const char *verdict(int ok)
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

typedef void (*insert_fn)(void *ctx, unsigned b, const uint64_t *k, size_t n, uint64_t now);

/* Chat-shaped traffic until `pairs` (block, backend) pairs are stored: a session picks one of
 * 8 system prompts, then each turn extends the previous one by 2..12 blocks; a session lives on
 * one backend, and one turn in eight lands on another (a spill). */
static uint64_t prefill(insert_fn ins, void *ctx, uint64_t (*pairs)(void *ctx), uint64_t target)
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

static void ins_policy(void *ctx, unsigned b, const uint64_t *k, size_t n, uint64_t now)
{
    pcr_key_t key = {(uint64_t *)k, n, n * 64};
    uint32_t from;
    pcr_policy_commit(ctx, (int)b, &key, now, &from);
}

static uint64_t pairs_policy(void *ctx)
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

/* ---- decisions ---------------------------------------------------------------------------- */

/* A chat body whose two messages hold about `tokens` tokens of text (4 bytes each), with a
 * JSON escape now and then as real prompts have. */
static char *chat_body(size_t tokens, size_t *len)
{
    size_t text = tokens * 4;
    char *s = malloc(text + 256);
    size_t n = (size_t)sprintf(s, "{\"model\":\"llama-3-8b\",\"stream\":true,\"messages\":"
                                  "[{\"role\":\"system\",\"content\":\"");
    for (size_t i = 0; i < text; i++) {
        if (i == 2048) {
            n += (size_t)sprintf(s + n, "\"},{\"role\":\"user\",\"content\":\"");
        } else if (i % 97 == 96) {
            s[n++] = '\\';
            s[n++] = 'n';
            i++;
        } else {
            s[n++] = i % 6 == 5 ? ' ' : (char)('a' + (i * 7 + i / 13) % 26);
        }
    }
    n += (size_t)sprintf(s + n, "\"}]}");
    *len = n;
    return s;
}

static void bench_decisions(void)
{
    static const size_t sizes[] = {1024, 8192, 32768, 131072};
    static const int iters[] = {20000, 5000, 2000, 500};
    pcr_backend_desc_t be[NB];
    char names[NB][16];
    for (int b = 0; b < NB; b++) {
        snprintf(names[b], sizeof(names[b]), "pod-%02d", b);
        be[b] = (pcr_backend_desc_t){names[b], "", 1, 0};
    }
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    pcr_policy_t *p = pcr_policy_new(&o, be, NB);
    uint64_t t = prefill(ins_policy, p, pairs_policy, PREFILL_PAIRS);
    uint64_t *blocks = malloc(pcr_policy_max_blocks(p) * sizeof(uint64_t));
    uint64_t *lat = malloc(20000 * sizeof(uint64_t));
    pcr_backend_load_t loads[NB];
    memset(loads, 0, sizeof(loads));
    for (int b = 0; b < NB; b++) {
        loads[b].usable = 1;
        loads[b].inflight = (uint32_t)(b % 5);
        loads[b].queued_prefill = (uint64_t)(b % 3) * 2000;
    }
    printf("decision = body parse (cJSON) + key (hash) + index match + cost, index of %llu pairs"
           " over %d backends:\n", (unsigned long long)pairs_policy(p), NB);
    for (size_t s = 0; s < 4; s++) {
        size_t len;
        char *body = chat_body(sizes[s], &len);
        pcr_body_t pb;
        char err[128];
        pcr_key_t key = {blocks, 0, 0};
        /* Make it warm: one backend holds all of it, another its first half. */
        pcr_body_parse(PCR_API_CHAT, body, len, &pb, err, sizeof(err));
        pcr_policy_key(p, pb.model, pb.model_len, pb.key, pb.key_len, &key);
        uint32_t from;
        pcr_policy_commit(p, 3, &key, t++, &from);
        key.nblocks /= 2;
        pcr_policy_commit(p, 7, &key, t++, &from);
        pcr_body_dispose(&pb);
        uint64_t sink = 0;
        for (int i = 0; i < iters[s]; i++) {
            pcr_decision_t d;
            uint64_t t0 = now_ns();
            pcr_body_parse(PCR_API_CHAT, body, len, &pb, err, sizeof(err));
            pcr_policy_key(p, pb.model, pb.model_len, pb.key, pb.key_len, &key);
            pcr_policy_decide(p, &key, loads, t, &d);
            pcr_body_dispose(&pb);
            lat[i] = now_ns() - t0;
            sink += (uint64_t)d.backend;
        }
        qsort(lat, (size_t)iters[s], sizeof(*lat), cmp_u64);
        double med = lat[iters[s] / 2] / 1000.0, p99 = lat[iters[s] * 99 / 100] / 1000.0;
        /* The body parse alone, to show where the time goes. */
        for (int i = 0; i < iters[s] / 4; i++) {
            uint64_t t0 = now_ns();
            pcr_body_parse(PCR_API_CHAT, body, len, &pb, err, sizeof(err));
            pcr_body_dispose(&pb);
            lat[i] = now_ns() - t0;
        }
        qsort(lat, (size_t)iters[s] / 4, sizeof(*lat), cmp_u64);
        printf("  %6zuk tokens (%4zu KiB body): median %7.2f us, p99 %7.2f us (parse alone %6.2f us)",
               sizes[s] / 1024, len / 1024, med, p99, lat[iters[s] / 8] / 1000.0);
        if (sizes[s] == 8192)
            printf("  (target median <= 30 us) %s", verdict(med <= 30));
        printf("%s\n", sink == 1 ? " " : "");
        free(body);
    }
    free(lat);
    free(blocks);
    pcr_policy_free(p);
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
