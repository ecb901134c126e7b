/* bench_kvtable.c: what applying the pods' KV events costs a worker (`make bench-kv`), in
 * blocks a second on one core: hashing each block's tokens into pcrouter's chain, finding or
 * making its entry, and dropping what the pods evict.
 *
 * The stream is a busy pool's at steady state: 8 pods, each full (every block stored past its
 * capacity evicts its oldest), prompts stored 16 blocks to an event, one event in four
 * continuing the pod's previous prompt (its parent is a block the pod holds). Two pool sizes
 * in the same run: one whose table fits the CPU's caches (1,024 blocks a pod: the baseline)
 * and one of 1M tokens a pod (62,500 blocks of 16 tokens, the routing bench's pods), so the
 * ratio is what the table's memory costs. Each figure is the median of 7 runs of 0.3 s. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "pcr/kvtable.h"

#define PODS 8
#define BLOCK 16
#define PER_EVENT 16
#define RUNS 7

/* One pod's blocks, oldest first, as the pod names them. */
typedef struct {
    uint64_t *ring;
    size_t cap, head, len;
    uint64_t next_hash;
} pod_t;

typedef struct {
    pcr_kvtable_t *t;
    pod_t pods[PODS];
    uint32_t tokens[PER_EVENT * BLOCK];
} pool_t;

/* One stored event of PER_EVENT blocks on `p`'s pod `b`, and the evictions it causes.
 * Returns the blocks applied (stored plus removed). */
static long step(pool_t *p, unsigned b)
{
    pod_t *pod = &p->pods[b];
    uint64_t hashes[PER_EVENT], gone[PER_EVENT];
    for (int i = 0; i < PER_EVENT * BLOCK; i++)
        p->tokens[i] = (uint32_t)next();
    for (int i = 0; i < PER_EVENT; i++)
        hashes[i] = pod->next_hash++ | 1ull << 63;
    pcr_kvt_stored_t ev = {.hashes = hashes, .nhashes = PER_EVENT, .tokens = p->tokens,
                           .block_size = BLOCK, .medium = PCR_KVT_GPU, .seed = 7};
    if (pod->len > 0 && next() % 4 == 0) {
        ev.has_parent = 1;
        ev.parent = pod->ring[(pod->head + pod->len - 1) % pod->cap];
    }
    if (pcr_kvtable_stored(p->t, b, &ev, 0) != 0) {
        fprintf(stderr, "bench_kvtable: a stored event was refused\n");
        exit(1);
    }
    size_t ngone = 0;
    for (int i = 0; i < PER_EVENT; i++) {
        if (pod->len == pod->cap) {
            gone[ngone++] = pod->ring[pod->head];
            pod->head = (pod->head + 1) % pod->cap;
            pod->len--;
        }
        pod->ring[(pod->head + pod->len) % pod->cap] = hashes[i];
        pod->len++;
    }
    pcr_kvtable_removed(p->t, b, gone, ngone, PCR_KVT_GPU);
    return PER_EVENT + (long)ngone;
}

static void pool_init(pool_t *p, size_t blocks_per_pod)
{
    pcr_kvtable_opts_t o = {.nbackends = PODS, .block_tokens = BLOCK};
    p->t = pcr_kvtable_new(&o);
    for (unsigned b = 0; b < PODS; b++) {
        p->pods[b] = (pod_t){.ring = calloc(blocks_per_pod, sizeof(uint64_t)),
                             .cap = blocks_per_pod, .next_hash = (uint64_t)b << 40};
        if (p->pods[b].ring == NULL)
            exit(1);
    }
    if (p->t == NULL)
        exit(1);
    /* Fill every pod, then one more round, so the table is at steady state. */
    for (size_t i = 0; i < 2 * blocks_per_pod / PER_EVENT; i++)
        for (unsigned b = 0; b < PODS; b++)
            step(p, b);
}

static void pool_free(pool_t *p)
{
    for (unsigned b = 0; b < PODS; b++)
        free(p->pods[b].ring);
    pcr_kvtable_free(p->t);
}

static double rate(pool_t *p)
{
    long blocks = 0;
    double t0 = now_s(), t;
    do {
        for (int k = 0; k < 64; k++)
            blocks += step(p, (unsigned)(next() % PODS));
        t = now_s();
    } while (t - t0 < 0.3);
    return blocks / (t - t0);
}

int main(void)
{
    static pool_t small, large;
    pool_init(&small, 1024);
    pool_init(&large, 62500);
    double rs[RUNS], rl[RUNS];
    for (int r = 0; r < RUNS; r++) { /* in turns, so a noisy moment falls on both */
        rs[r] = rate(&small);
        rl[r] = rate(&large);
    }
    double ms = median(rs, RUNS), ml = median(rl, RUNS);
    printf("| pool | table bytes | blocks applied/s | of the cached table |\n");
    printf("| --- | --- | --- | --- |\n");
    printf("| 8 pods x 1,024 blocks (fits the caches) | %.1f MB | %.2fM | 1.00x |\n",
           pcr_kvtable_bytes(small.t) / 1e6, ms / 1e6);
    printf("| 8 pods x 62,500 blocks (1M tokens a pod) | %.1f MB | %.2fM | %.2fx |\n",
           pcr_kvtable_bytes(large.t) / 1e6, ml / 1e6, ml / ms);
    pool_free(&small);
    pool_free(&large);
    return 0;
}
