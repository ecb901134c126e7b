/* test_evmem.c: router/core/evmem.c, libevent's blocks kept per thread for reuse. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "evmem.h"
#include "pcr_test.h"

/* A freed block of a kept size comes back for the next request of that size class; other
 * sizes are not kept. */
static void test_reuse_by_size(void)
{
    pcr_evmem_thread_clear();
    void *a = pcr_evmem_malloc(32768 - 100);
    PCR_CHECK(a != NULL);
    PCR_CHECK(((uintptr_t)a & 15) == 0);
    memset(a, 0xAB, 32768 - 100);
    pcr_evmem_free(a);
    if (!pcr_evmem_keeps()) {
        PCR_CHECK_EQ_INT((int)pcr_evmem_thread_kept(), 0);
        return;
    }
    PCR_CHECK_EQ_INT((int)pcr_evmem_thread_kept(), 1);
    void *b = pcr_evmem_malloc(32768);   /* same class: the same block */
    PCR_CHECK(b == a);
    PCR_CHECK_EQ_INT((int)pcr_evmem_thread_kept(), 0);
    void *c = pcr_evmem_malloc(20000);   /* same class again, none kept: a new one */
    PCR_CHECK(c != NULL && c != b);
    pcr_evmem_free(b);
    pcr_evmem_free(c);
    void *tiny = pcr_evmem_malloc(8), *huge = pcr_evmem_malloc(200000);
    PCR_CHECK(tiny != NULL && huge != NULL);
    pcr_evmem_free(tiny);
    pcr_evmem_free(huge);
    PCR_CHECK_EQ_INT((int)pcr_evmem_thread_kept(), 2);  /* b and c only */
    /* Small blocks (an evbuffer, an upstream request) are kept from 32 bytes up, zeroed by
     * calloc when they come back. */
    unsigned char *s1 = pcr_evmem_malloc(100);
    PCR_CHECK(s1 != NULL && ((uintptr_t)s1 & 15) == 0);
    memset(s1, 0xCD, 100);
    pcr_evmem_free(s1);
    PCR_CHECK_EQ_INT((int)pcr_evmem_thread_kept(), 3);
    unsigned char *s2 = pcr_evmem_calloc(1, 110);  /* the 112-byte class: the same block */
    PCR_CHECK(s2 == s1);
    for (int i = 0; i < 110; i++)
        PCR_CHECK_EQ_INT(s2[i], 0);
    pcr_evmem_free(s2);
    /* Close classes: 136 bytes (an evbuffer) take a 144-byte block, not a 256-byte one, and
     * 300 bytes a 384-byte one. realloc within the block's class keeps the block. */
    int keeps = pcr_evmem_keeps();
    unsigned char *e = pcr_evmem_malloc(136);
    PCR_CHECK(e != NULL);
    unsigned char *e1 = pcr_evmem_realloc(e, 144);
    PCR_CHECK(e1 != NULL && (e1 == e || !keeps));
    unsigned char *e2 = pcr_evmem_realloc(e1, 145);
    PCR_CHECK(e2 != NULL && e2 != e1);
    pcr_evmem_free(e2);
    unsigned char *f = pcr_evmem_malloc(300);
    unsigned char *f1 = f != NULL ? pcr_evmem_realloc(f, 384) : NULL;
    PCR_CHECK(f1 != NULL && (f1 == f || !keeps));
    unsigned char *f2 = pcr_evmem_realloc(f1, 385);
    PCR_CHECK(f2 != NULL && f2 != f1);
    pcr_evmem_free(f2);
    PCR_CHECK(pcr_evmem_calloc(SIZE_MAX / 2, 4) == NULL);  /* n x size overflows */
    pcr_evmem_thread_clear();
    PCR_CHECK_EQ_INT((int)pcr_evmem_thread_kept(), 0);
}

/* At most 1 MiB of a size is kept per thread: the rest is freed. */
static void test_bounded(void)
{
    pcr_evmem_thread_clear();
    enum { N = 100 };
    void *p[N];
    for (int i = 0; i < N; i++)
        p[i] = pcr_evmem_malloc(65536);
    for (int i = 0; i < N; i++)
        pcr_evmem_free(p[i]);
    PCR_CHECK((int)pcr_evmem_thread_kept() <= (pcr_evmem_keeps() ? 16 : 0));
    for (int i = 0; i < N; i++)
        p[i] = pcr_evmem_malloc(1024);
    for (int i = 0; i < N; i++)
        pcr_evmem_free(p[i]);
    PCR_CHECK((int)pcr_evmem_thread_kept() <= (pcr_evmem_keeps() ? 16 + N : 0));
    pcr_evmem_thread_clear();
}

/* realloc keeps the bytes, within a class and across classes and sizes. */
static void test_realloc(void)
{
    unsigned char *p = pcr_evmem_realloc(NULL, 10);
    PCR_CHECK(p != NULL);
    for (int i = 0; i < 10; i++)
        p[i] = (unsigned char)i;
    static const size_t sizes[] = {300, 600, 5000, 70000, 300000, 2000, 8};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        p = pcr_evmem_realloc(p, sizes[s]);
        PCR_CHECK(p != NULL);
        for (int i = 0; i < 8; i++)
            PCR_CHECK_EQ_INT(p[i], i);
        memset(p + 8, 0x5A, sizes[s] - 8);  /* every byte asked for is usable */
    }
    pcr_evmem_free(p);
    pcr_evmem_thread_clear();
}

static void *free_them(void *arg)
{
    void **p = arg;
    for (int i = 0; i < 8; i++)
        pcr_evmem_free(p[i]);
    /* This thread keeps them until it ends: its exit frees them (LeakSanitizer checks). */
    return (void *)(uintptr_t)pcr_evmem_thread_kept();
}

/* A block made by one thread and freed by another joins the freeing thread's list, which is
 * freed when that thread ends. */
static void test_other_thread(void)
{
    pcr_evmem_thread_clear();
    void *p[8];
    for (int i = 0; i < 8; i++)
        p[i] = pcr_evmem_malloc(4096 * (size_t)(i + 1));
    pthread_t t;
    void *kept = NULL;
    PCR_CHECK(pthread_create(&t, NULL, free_them, p) == 0);
    PCR_CHECK(pthread_join(t, &kept) == 0);
    PCR_CHECK_EQ_INT((int)(uintptr_t)kept, pcr_evmem_keeps() ? 8 : 0);
    PCR_CHECK_EQ_INT((int)pcr_evmem_thread_kept(), 0);
}

/* Through libevent: buffers filled, drained and freed, the same chain blocks come back. */
static void test_libevent(void)
{
    pcr_evmem_install();
    pcr_evmem_thread_clear();
    char data[3000];
    memset(data, 'x', sizeof(data));
    for (int round = 0; round < 100; round++) {
        struct evbuffer *b = evbuffer_new();
        PCR_CHECK(b != NULL);
        struct evbuffer_iovec v;
        PCR_CHECK(evbuffer_reserve_space(b, 16384, &v, 1) == 1);
        memcpy(v.iov_base, data, sizeof(data));
        v.iov_len = sizeof(data);
        PCR_CHECK(evbuffer_commit_space(b, &v, 1) == 0);
        PCR_CHECK(evbuffer_add(b, data, sizeof(data)) == 0);
        PCR_CHECK_EQ_INT((int)evbuffer_get_length(b), 2 * (int)sizeof(data));
        evbuffer_drain(b, 100);
        PCR_CHECK(memcmp(evbuffer_pullup(b, -1), data, 100) == 0);
        evbuffer_free(b);
    }
    /* Kept: a few blocks, not one per round. */
    PCR_CHECK((int)pcr_evmem_thread_kept() <= (pcr_evmem_keeps() ? 8 : 0));
    struct event_base *base = event_base_new();
    PCR_CHECK(base != NULL);
    event_base_free(base);
    pcr_evmem_thread_clear();
}

/* The bytes in use: each block counts its class's size (not what was asked) from malloc to
 * free, kept blocks not at all, a realloc its new size, and a block freed by another thread
 * leaves the sum as it found it. */
static void test_in_use(void)
{
    pcr_evmem_thread_clear();
    uint64_t base = pcr_evmem_in_use();
    void *a = pcr_evmem_malloc(16384 + 56); /* a read's chain: a 24 KiB class */
    PCR_CHECK(a != NULL);
    PCR_CHECK_EQ_INT((int)(pcr_evmem_in_use() - base),
                     pcr_evmem_keeps() ? 24576 : 16384 + 56);
    void *b = pcr_evmem_malloc(100000);     /* past the classes: as asked */
    PCR_CHECK_EQ_INT((int)(pcr_evmem_in_use() - base),
                     (pcr_evmem_keeps() ? 24576 : 16384 + 56) + 100000);
    b = pcr_evmem_realloc(b, 300000);
    PCR_CHECK_EQ_INT((int)(pcr_evmem_in_use() - base),
                     (pcr_evmem_keeps() ? 24576 : 16384 + 56) + 300000);
    pcr_evmem_free(b);
    pcr_evmem_free(a);
    PCR_CHECK_EQ_INT((int)(pcr_evmem_in_use() - base), 0);
    void *c = pcr_evmem_malloc(16384 + 56); /* from the kept list: counted again */
    PCR_CHECK(pcr_evmem_in_use() - base > 16384);
    pcr_evmem_free(c);
    void *p[8];
    for (int i = 0; i < 8; i++)
        p[i] = pcr_evmem_malloc(4096 * (size_t)(i + 1));
    PCR_CHECK(pcr_evmem_in_use() - base >= 8 * 4096);
    pthread_t t;
    void *kept = NULL;
    PCR_CHECK(pthread_create(&t, NULL, free_them, p) == 0);
    PCR_CHECK(pthread_join(t, &kept) == 0);
    PCR_CHECK_EQ_INT((int)(pcr_evmem_in_use() - base), 0);
    pcr_evmem_thread_clear();
}

static long rss_kib(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return -1;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = -1;
    fclose(f);
    return rss < 0 ? -1 : rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Blocks of 4 KiB and up come from spans, which go back to the system once empty: 64 MiB of
 * them made between small blocks that stay (as a flood of uploads' chains sit between the
 * connections' evbuffers) and then freed leave RSS where it was before. From malloc they
 * stayed in RSS: the small blocks pinned the heap around them. */
static void test_spans_go_back(void)
{
    pcr_evmem_thread_clear();
    enum { N = 4096, BIG = 16384 };
    void **big = calloc(N, sizeof(void *)), **small = calloc(N, sizeof(void *));
    PCR_CHECK(big != NULL && small != NULL);
    long before = rss_kib();
    for (int i = 0; i < N; i++) {
        big[i] = pcr_evmem_malloc(BIG);
        small[i] = pcr_evmem_malloc(200);
        PCR_CHECK(big[i] != NULL && small[i] != NULL);
        memset(big[i], i & 0xFF, BIG);
        memset(small[i], 0x11, 200);
    }
    if (pcr_evmem_keeps())
        PCR_CHECK(pcr_evmem_span_bytes() >= (uint64_t)N * BIG);
    else
        PCR_CHECK_EQ_INT((int)pcr_evmem_span_bytes(), 0);
    long peak = rss_kib();
    PCR_CHECK(peak - before >= N * (BIG / 1024) * 9 / 10);
    for (int i = 0; i < N; i++) {
        unsigned char *b = big[i];
        PCR_CHECK(b[0] == (i & 0xFF) && b[BIG - 1] == (i & 0xFF)); /* no block overlaps */
        pcr_evmem_free(big[i]);
    }
    pcr_evmem_thread_clear();
    if (pcr_evmem_keeps()) {
        PCR_CHECK(pcr_evmem_span_bytes() <= 4u << 20);            /* 4 empty spans kept */
        PCR_CHECK(peak - rss_kib() >= N * (BIG / 1024) * 8 / 10);
    }
    for (int i = 0; i < N; i++)
        pcr_evmem_free(small[i]);
    pcr_evmem_thread_clear();
    free(big);
    free(small);
}

/* Two threads make and free blocks of every span class at once, each block checked for its
 * own pattern (a block handed out twice shows as another's), half of them freed by the other
 * thread. */
#define MIX_N 2000
static void *mix_blocks(void *arg)
{
    void **give = arg;
    unsigned seed = (unsigned)(uintptr_t)give;
    void *mine[64] = {0};
    size_t len[64] = {0};
    for (int i = 0; i < MIX_N; i++) {
        int k = (int)(rand_r(&seed) % 64);
        if (mine[k] != NULL) {
            unsigned char *b = mine[k];
            PCR_CHECK(b[0] == (unsigned char)k && b[len[k] - 1] == (unsigned char)k);
            pcr_evmem_free(mine[k]);
        }
        len[k] = 4096 + (size_t)(rand_r(&seed) % 61440);
        mine[k] = pcr_evmem_malloc(len[k]);
        PCR_CHECK(mine[k] != NULL);
        memset(mine[k], k, len[k]);
        if (i % 2 == 0) {
            give[i] = pcr_evmem_malloc(8192);
            PCR_CHECK(give[i] != NULL);
        }
    }
    for (int k = 0; k < 64; k++)
        pcr_evmem_free(mine[k]);
    return NULL;
}

static void test_spans_threads(void)
{
    void **a = calloc(MIX_N, sizeof(void *)), **b = calloc(MIX_N, sizeof(void *));
    PCR_CHECK(a != NULL && b != NULL);
    pthread_t ta, tb;
    PCR_CHECK(pthread_create(&ta, NULL, mix_blocks, a) == 0);
    PCR_CHECK(pthread_create(&tb, NULL, mix_blocks, b) == 0);
    PCR_CHECK(pthread_join(ta, NULL) == 0);
    PCR_CHECK(pthread_join(tb, NULL) == 0);
    for (int i = 0; i < MIX_N; i++) {  /* blocks of threads now gone, freed here */
        pcr_evmem_free(a[i]);
        pcr_evmem_free(b[i]);
    }
    pcr_evmem_thread_clear();
    PCR_CHECK(pcr_evmem_span_bytes() <= 4u << 20);
    free(a);
    free(b);
}

int main(void)
{
    PCR_RUN(test_reuse_by_size);
    PCR_RUN(test_bounded);
    PCR_RUN(test_realloc);
    PCR_RUN(test_other_thread);
    PCR_RUN(test_libevent);
    PCR_RUN(test_in_use);
    PCR_RUN(test_spans_go_back);
    PCR_RUN(test_spans_threads);
    return pcr_test_done();
}
