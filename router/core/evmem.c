/* router/core/evmem.c: libevent's memory, kept per thread for reuse. See evmem.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "evmem.h"
#include "memcount.h"

#if defined(__SANITIZE_ADDRESS__)
#define EVMEM_KEEP 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EVMEM_KEEP 0
#endif
#endif
#ifndef EVMEM_KEEP
#define EVMEM_KEEP 1
#endif

#define MIN_SIZE 64
#define SMALL_MAX 256                        /* classes 16 bytes apart up to here */
#define MAX_SHIFT 16                         /* 64 KiB */
#define NSMALL ((SMALL_MAX - MIN_SIZE) / 16 + 1)
#define NCLASS (NSMALL + 2 * (MAX_SHIFT - 8))
#define KEEP_SMALL 2048u                     /* blocks of a small class kept per thread */
#define KEEP_BYTES (512u << 10)              /* bytes of a larger class kept per thread */
#define NO_CLASS 0xFFFFu
#define MAGIC 0x6576u                        /* "ev": a block of ours */

/* Before every block: 16 bytes, so the caller's pointer keeps malloc's alignment. */
typedef struct {
    uint16_t cls;                            /* NO_CLASS: a plain malloc of `size` bytes */
    uint16_t magic;
    uint32_t pad;
    size_t size;                             /* what the caller may use */
} head_t;

_Static_assert(sizeof(head_t) == 16, "the header keeps 16-byte alignment");

typedef struct block {
    struct block *next;
} block_t;

typedef struct {
    block_t *head[NCLASS];
    unsigned n[NCLASS];
    int registered;                          /* the thread-exit destructor is set */
} cache_t;

static __thread cache_t cache;

/* Bytes handed out and not yet given back, for the memory account (memcount.h). */
static void count(int64_t d)
{
    pcr_memcount_add(PCR_MEMCOUNT_LIBEVENT, d);
}

uint64_t pcr_evmem_in_use(void)
{
    return pcr_memcount_sum(PCR_MEMCOUNT_LIBEVENT);
}

static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

/* Size classes: 64 to 256 bytes in steps of 16 (an evbuffer, an event, an upstream request
 * each take close to what they ask for), then two per power of two up to 64 KiB (384, 512,
 * 768, 1024, ...), so that a block wastes at most a third of itself. */
static int class_of(size_t n)
{
    if (n > ((size_t)1 << MAX_SHIFT))
        return -1;
    if (n <= MIN_SIZE)
        return 0;
    if (n <= SMALL_MAX)
        return (int)((n + 15) / 16) - MIN_SIZE / 16;
    /* 2^k < n <= 2^(k+1), k >= 8: the lower half's class holds up to 1.5 x 2^k. */
    int k = (int)(sizeof(unsigned long) * 8) - 1 - __builtin_clzl((unsigned long)(n - 1));
    size_t half = ((size_t)3) << (k - 1);
    return NSMALL + 2 * (k - 8) + (n > half);
}

static size_t class_size(int cls)
{
    if (cls < NSMALL)
        return MIN_SIZE + 16 * (size_t)cls;
    int j = cls - NSMALL, k = 8 + j / 2;
    return j % 2 == 0 ? ((size_t)3) << (k - 1) : (size_t)1 << (k + 1);
}

static unsigned class_keep(int cls)
{
    return cls < NSMALL ? KEEP_SMALL : (unsigned)(KEEP_BYTES / class_size(cls));
}

static void cache_clear(cache_t *c)
{
    for (int i = 0; i < NCLASS; i++) {
        block_t *b = c->head[i];
        while (b != NULL) {
            block_t *next = b->next;
            free((head_t *)(void *)b - 1);
            b = next;
        }
        c->head[i] = NULL;
        c->n[i] = 0;
    }
}

static void on_thread_exit(void *arg)
{
    (void)arg;
    cache_clear(&cache);
    /* A block freed after this (another destructor of the thread's) registers again, and
     * glibc runs the destructor again for it. */
    cache.registered = 0;
}

static void exit_key_make(void)
{
    (void)pthread_key_create(&exit_key, on_thread_exit);
}

void *pcr_evmem_malloc(size_t n)
{
    int cls = EVMEM_KEEP && n >= MIN_SIZE / 2 ? class_of(n) : -1;
    if (cls >= 0 && cache.head[cls] != NULL) {
        block_t *b = cache.head[cls];
        cache.head[cls] = b->next;
        cache.n[cls]--;
        count((int64_t)((head_t *)(void *)b - 1)->size);
        return b;
    }
    size_t size = cls >= 0 ? class_size(cls) : n;
    if (size > SIZE_MAX - sizeof(head_t))
        return NULL;
    head_t *h = malloc(sizeof(head_t) + size);
    if (h == NULL)
        return NULL;
    h->cls = cls >= 0 ? (uint16_t)cls : NO_CLASS;
    h->magic = MAGIC;
    h->pad = 0;
    h->size = size;
    count((int64_t)size);
    return h + 1;
}

void *pcr_evmem_calloc(size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    void *p = pcr_evmem_malloc(n * size);
    if (p != NULL)
        memset(p, 0, n * size);
    return p;
}

void pcr_evmem_free(void *p)
{
    if (p == NULL)
        return;
    head_t *h = (head_t *)p - 1;
    if (h->magic != MAGIC)
        abort(); /* not ours: a libevent block freed elsewhere, or a corrupted heap */
    count(-(int64_t)h->size);
    unsigned cls = h->cls;
    if (cls < NCLASS && cache.n[cls] < class_keep((int)cls)) {
        if (!cache.registered) {
            (void)pthread_once(&exit_once, exit_key_make);
            cache.registered = pthread_setspecific(exit_key, &cache) == 0;
            if (!cache.registered) {
                free(h);
                return;
            }
        }
        block_t *b = p;
        b->next = cache.head[cls];
        cache.head[cls] = b;
        cache.n[cls]++;
        return;
    }
    free(h);
}

void *pcr_evmem_realloc(void *p, size_t n)
{
    if (p == NULL)
        return pcr_evmem_malloc(n);
    head_t *h = (head_t *)p - 1;
    if (h->magic != MAGIC)
        abort();
    if (n <= h->size && h->cls != NO_CLASS)
        return p; /* fits the class it has */
    if (h->cls == NO_CLASS && class_of(n) < 0) {
        /* Large to large: malloc's realloc may grow in place. */
        if (n > SIZE_MAX - sizeof(head_t))
            return NULL;
        size_t was = h->size;
        head_t *nh = realloc(h, sizeof(head_t) + n);
        if (nh == NULL)
            return NULL;
        nh->size = n;
        count((int64_t)n - (int64_t)was);
        return nh + 1;
    }
    void *q = pcr_evmem_malloc(n);
    if (q == NULL)
        return NULL;
    memcpy(q, p, h->size < n ? h->size : n);
    pcr_evmem_free(p);
    return q;
}

void pcr_evmem_thread_clear(void)
{
    cache_clear(&cache);
}

size_t pcr_evmem_thread_kept(void)
{
    size_t k = 0;
    for (int i = 0; i < NCLASS; i++)
        k += cache.n[i];
    return k;
}

int pcr_evmem_keeps(void)
{
    return EVMEM_KEEP;
}

void pcr_evmem_install(void)
{
    event_set_mem_functions(pcr_evmem_malloc, pcr_evmem_realloc, pcr_evmem_free);
}
