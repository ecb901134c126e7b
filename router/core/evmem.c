/* router/core/evmem.c: libevent's memory, kept per thread for reuse. See evmem.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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
#define SPAN_SHIFT 20
#define SPAN ((size_t)1 << SPAN_SHIFT)       /* a span: 1 MiB, aligned to its size */
#define SPAN_MIN 4096                        /* classes of this size and up come from spans */
#define SPAN_KEEP 4                          /* empty spans kept mapped, process-wide */
#define SPAN_HEAD 64                         /* the span's own header, before its blocks */

/* Before every block: 16 bytes, so the caller's pointer keeps malloc's alignment. */
typedef struct {
    uint16_t cls;                            /* NO_CLASS: a plain malloc of `size` bytes */
    uint16_t magic;
    uint8_t kind;                            /* the count it is in (memcount.h) */
    uint8_t pad[3];
    size_t size;                             /* what the caller may use */
} head_t;

_Static_assert(sizeof(head_t) == 16, "the header keeps 16-byte alignment");

/* A span holds blocks of one class, its header first. Blocks are found from their address
 * (the span is aligned to its size); a set bit is a free block. */
typedef struct span {
    struct span *prev, *next;                /* the class's spans with a free block, or the
                                              * empty spans kept */
    uint64_t free[4];
    uint16_t cls, nblocks, nfree;
    uint16_t listed;                         /* on its class's list */
} span_t;

_Static_assert(sizeof(span_t) <= SPAN_HEAD, "the span's header fits before its blocks");

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
static void count(const head_t *h, int64_t d)
{
    pcr_memcount_add((pcr_memcount_kind_t)h->kind, d);
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

/* The spans: one lock for all classes. A thread reaches it only when its own list of a class
 * is empty (malloc) or full (free), so it is taken once per many blocks under churn. */
static pthread_mutex_t span_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
    span_t *head, *tail;
} span_list_t;

static span_list_t span_partial[NCLASS];     /* spans with a free block, by class */
static span_list_t span_empty;               /* empty spans kept for reuse */
static unsigned span_nempty;
static uint64_t span_mapped;                 /* bytes of spans mapped (under span_lock) */

static size_t span_stride(int cls)
{
    return sizeof(head_t) + class_size(cls);
}

static void list_remove(span_list_t *l, span_t *sp)
{
    if (sp->prev != NULL)
        sp->prev->next = sp->next;
    else
        l->head = sp->next;
    if (sp->next != NULL)
        sp->next->prev = sp->prev;
    else
        l->tail = sp->prev;
    sp->prev = sp->next = NULL;
}

static void list_push(span_list_t *l, span_t *sp, int at_tail)
{
    if (l->head == NULL) {
        sp->prev = sp->next = NULL;
        l->head = l->tail = sp;
    } else if (at_tail) {
        sp->prev = l->tail;
        sp->next = NULL;
        l->tail->next = sp;
        l->tail = sp;
    } else {
        sp->prev = NULL;
        sp->next = l->head;
        l->head->prev = sp;
        l->head = sp;
    }
}

/* A span's worth of memory aligned to its size: twice that mapped, the ends unmapped. */
static span_t *span_map(void)
{
    char *m = mmap(NULL, 2 * SPAN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    uintptr_t a = ((uintptr_t)m + SPAN - 1) & ~(uintptr_t)(SPAN - 1);
    size_t before = a - (uintptr_t)m;
    if (before > 0)
        (void)munmap(m, before);
    (void)munmap((char *)a + SPAN, SPAN - before);
    span_mapped += SPAN;
    return (span_t *)a;
}

static void span_init(span_t *sp, int cls)
{
    memset(sp, 0, sizeof(*sp));
    sp->cls = (uint16_t)cls;
    sp->nblocks = (uint16_t)((SPAN - SPAN_HEAD) / span_stride(cls));
    if (sp->nblocks > 256)
        sp->nblocks = 256;
    for (unsigned i = 0; i < sp->nblocks; i++)
        sp->free[i / 64] |= (uint64_t)1 << (i % 64);
    sp->nfree = sp->nblocks;
}

static head_t *span_alloc(int cls)
{
    pthread_mutex_lock(&span_lock);
    span_t *sp = span_partial[cls].head;
    if (sp == NULL) {
        if (span_empty.head != NULL) {
            sp = span_empty.head;
            list_remove(&span_empty, sp);
            span_nempty--;
        } else if ((sp = span_map()) == NULL) {
            pthread_mutex_unlock(&span_lock);
            return NULL;
        }
        span_init(sp, cls);
        list_push(&span_partial[cls], sp, 0);
        sp->listed = 1;
    }
    unsigned w = 0;
    while (sp->free[w] == 0)
        w++;
    unsigned i = w * 64 + (unsigned)__builtin_ctzll(sp->free[w]);
    sp->free[w] &= ~((uint64_t)1 << (i % 64));
    if (--sp->nfree == 0) {
        list_remove(&span_partial[cls], sp);
        sp->listed = 0;
    }
    pthread_mutex_unlock(&span_lock);
    return (head_t *)(void *)((char *)sp + SPAN_HEAD + i * span_stride(cls));
}

/* A span fills up before the next one is started: one that gets a free block back after it
 * was full goes behind the others, so the spans being drained stay drained and go back to
 * the system once empty (beyond SPAN_KEEP kept). */
static void span_release(head_t *h)
{
    span_t *sp = (span_t *)((uintptr_t)h & ~(uintptr_t)(SPAN - 1));
    size_t off = (size_t)((char *)h - (char *)sp);
    pthread_mutex_lock(&span_lock);
    size_t stride = span_stride(sp->cls);
    size_t i = off >= SPAN_HEAD ? (off - SPAN_HEAD) / stride : SIZE_MAX;
    if (sp->cls != h->cls || i >= sp->nblocks || (off - SPAN_HEAD) % stride != 0 ||
        (sp->free[i / 64] >> (i % 64) & 1) != 0)
        abort(); /* not a block of this span, or freed twice */
    sp->free[i / 64] |= (uint64_t)1 << (i % 64);
    sp->nfree++;
    if (sp->nfree == sp->nblocks) {
        if (sp->listed)
            list_remove(&span_partial[sp->cls], sp);
        sp->listed = 0;
        if (span_nempty < SPAN_KEEP) {
            list_push(&span_empty, sp, 0);
            span_nempty++;
        } else {
            span_mapped -= SPAN;
            (void)munmap(sp, SPAN);
        }
    } else if (!sp->listed) {
        list_push(&span_partial[sp->cls], sp, 1);
        sp->listed = 1;
    }
    pthread_mutex_unlock(&span_lock);
}

/* A block of a class of SPAN_MIN and up came from a span (pcr_evmem_malloc_in); any other, a
 * plain one included, from malloc. */
static void release(head_t *h)
{
    if (h->cls != NO_CLASS && class_size(h->cls) >= SPAN_MIN)
        span_release(h);
    else
        free(h);
}

uint64_t pcr_evmem_span_bytes(void)
{
    pthread_mutex_lock(&span_lock);
    uint64_t n = span_mapped;
    pthread_mutex_unlock(&span_lock);
    return n;
}

static void cache_clear(cache_t *c)
{
    for (int i = 0; i < NCLASS; i++) {
        block_t *b = c->head[i];
        while (b != NULL) {
            block_t *next = b->next;
            release((head_t *)(void *)b - 1);
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

void *pcr_evmem_malloc_in(size_t n, pcr_memcount_kind_t kind)
{
    int cls = EVMEM_KEEP && n >= MIN_SIZE / 2 ? class_of(n) : -1;
    if (cls >= 0 && cache.head[cls] != NULL) {
        block_t *b = cache.head[cls];
        cache.head[cls] = b->next;
        cache.n[cls]--;
        head_t *h = (head_t *)(void *)b - 1;
        h->kind = (uint8_t)kind;
        count(h, (int64_t)h->size);
        return b;
    }
    size_t size = cls >= 0 ? class_size(cls) : n;
    if (size > SIZE_MAX - sizeof(head_t))
        return NULL;
    int span = cls >= 0 && size >= SPAN_MIN;
    head_t *h = span ? span_alloc(cls) : malloc(sizeof(head_t) + size);
    if (h == NULL)
        return NULL;
    h->cls = cls >= 0 ? (uint16_t)cls : NO_CLASS;
    h->magic = MAGIC;
    h->kind = (uint8_t)kind;
    memset(h->pad, 0, sizeof(h->pad));
    h->size = size;
    count(h, (int64_t)size);
    return h + 1;
}

void *pcr_evmem_calloc_in(size_t n, size_t size, pcr_memcount_kind_t kind)
{
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    void *p = pcr_evmem_malloc_in(n * size, kind);
    if (p != NULL)
        memset(p, 0, n * size);
    return p;
}

void *pcr_evmem_malloc(size_t n)
{
    return pcr_evmem_malloc_in(n, PCR_MEMCOUNT_LIBEVENT);
}

void *pcr_evmem_calloc(size_t n, size_t size)
{
    return pcr_evmem_calloc_in(n, size, PCR_MEMCOUNT_LIBEVENT);
}

void pcr_evmem_free(void *p)
{
    if (p == NULL)
        return;
    head_t *h = (head_t *)p - 1;
    if (h->magic != MAGIC)
        abort(); /* not ours: a libevent block freed elsewhere, or a corrupted heap */
    count(h, -(int64_t)h->size);
    unsigned cls = h->cls;
    if (cls < NCLASS && cache.n[cls] < class_keep((int)cls)) {
        if (!cache.registered) {
            (void)pthread_once(&exit_once, exit_key_make);
            cache.registered = pthread_setspecific(exit_key, &cache) == 0;
            if (!cache.registered) {
                release(h);
                return;
            }
        }
        block_t *b = p;
        b->next = cache.head[cls];
        cache.head[cls] = b;
        cache.n[cls]++;
        return;
    }
    release(h);
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
        count(nh, (int64_t)n - (int64_t)was);
        return nh + 1;
    }
    void *q = pcr_evmem_malloc_in(n, (pcr_memcount_kind_t)h->kind);
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
