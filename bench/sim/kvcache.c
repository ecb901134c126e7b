/* bench/sim/kvcache.c: the block cache behind kvcache.h.
 *
 * Layout: a fixed array of `capacity` block slots, allocated once, and an open-addressing
 * table (linear probing, backward-shift deletion) from block hash to slot index + 1 (0 means
 * empty). Unpinned named blocks sit on a doubly linked LRU list threaded through the slots by
 * index; free slots sit on a singly linked free list.
 *
 *   table[]:  0 | 3 | 0 | 1 | 0 ...        slot+1, found by hash & mask, probing forward
 *   slots[]:  {hash, ref, prev, next} ...  ref == 0 and named: on the LRU list (head = oldest)
 */
#include "kvcache.h"

#include <math.h>
#include <stdlib.h>
#include <xxhash.h>

#include "pcr/common.h"

#define NIL UINT32_MAX

typedef struct {
    uint64_t hash;
    uint32_t ref;
    uint32_t prev, next;   /* LRU links when ref == 0, free-list link (next) when unused */
} slot_t;

struct pcr_kvcache {
    size_t capacity;
    size_t cached;         /* named slots */
    size_t pinned;         /* named slots with ref > 0 */
    size_t reserved;       /* private blocks of running requests */
    slot_t *slots;
    uint32_t free_head;
    uint32_t lru_head, lru_tail;
    uint32_t *table;       /* slot index + 1 */
    size_t mask;
    pcr_kvcache_observer_t obs;   /* all NULL: nobody listens */
};

pcr_kvcache_t *pcr_kvcache_new(size_t capacity_blocks)
{
    if (capacity_blocks == 0 || capacity_blocks > ((size_t)1 << 30))
        return NULL;
    pcr_kvcache_t *kv = calloc(1, sizeof(*kv));
    if (!kv)
        return NULL;
    size_t tsize = 16;
    while (tsize < capacity_blocks * 2)
        tsize <<= 1;
    kv->capacity = capacity_blocks;
    kv->mask = tsize - 1;
    kv->slots = malloc(capacity_blocks * sizeof(slot_t));
    kv->table = calloc(tsize, sizeof(uint32_t));
    if (!kv->slots || !kv->table) {
        pcr_kvcache_free(kv);
        return NULL;
    }
    for (size_t i = 0; i < capacity_blocks; i++)
        kv->slots[i].next = i + 1 < capacity_blocks ? (uint32_t)(i + 1) : NIL;
    kv->free_head = 0;
    kv->lru_head = kv->lru_tail = NIL;
    return kv;
}

void pcr_kvcache_free(pcr_kvcache_t *kv)
{
    if (!kv)
        return;
    free(kv->slots);
    free(kv->table);
    free(kv);
}

size_t pcr_kvcache_hash_prompt(const void *data, size_t len, uint64_t seed,
                               uint64_t *out, size_t max)
{
    size_t n = len / PCR_KV_BLOCK_BYTES;
    const unsigned char *p = data;
    uint64_t h = seed;
    for (size_t i = 0; i < n && i < max; i++) {
        h = XXH3_64bits_withSeed(p + i * PCR_KV_BLOCK_BYTES, PCR_KV_BLOCK_BYTES, h);
        out[i] = h;
    }
    return n;
}

/* Table position holding `hash`, or the empty position where it would go. */
static size_t find_pos(const pcr_kvcache_t *kv, uint64_t hash)
{
    size_t i = (size_t)hash & kv->mask;
    while (kv->table[i] && kv->slots[kv->table[i] - 1].hash != hash)
        i = (i + 1) & kv->mask;
    return i;
}

static uint32_t lookup(const pcr_kvcache_t *kv, uint64_t hash)
{
    uint32_t v = kv->table[find_pos(kv, hash)];
    return v ? v - 1 : NIL;
}

static void table_remove(pcr_kvcache_t *kv, uint64_t hash)
{
    size_t i = find_pos(kv, hash);
    if (!kv->table[i])
        return;
    /* Backward shift: move later entries of the probe run into the hole when their home
     * position does not lie cyclically between the hole and themselves. */
    size_t j = i;
    for (;;) {
        kv->table[i] = 0;
        for (;;) {
            j = (j + 1) & kv->mask;
            if (!kv->table[j])
                return;
            size_t home = (size_t)kv->slots[kv->table[j] - 1].hash & kv->mask;
            if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
                continue;
            break;
        }
        kv->table[i] = kv->table[j];
        i = j;
    }
}

static void lru_unlink(pcr_kvcache_t *kv, uint32_t s)
{
    slot_t *b = &kv->slots[s];
    if (b->prev != NIL) kv->slots[b->prev].next = b->next; else kv->lru_head = b->next;
    if (b->next != NIL) kv->slots[b->next].prev = b->prev; else kv->lru_tail = b->prev;
}

static void lru_push_tail(pcr_kvcache_t *kv, uint32_t s)
{
    slot_t *b = &kv->slots[s];
    b->next = NIL;
    b->prev = kv->lru_tail;
    if (kv->lru_tail != NIL) kv->slots[kv->lru_tail].next = s; else kv->lru_head = s;
    kv->lru_tail = s;
}

static void drop_head(pcr_kvcache_t *kv)
{
    uint32_t s = kv->lru_head;
    lru_unlink(kv, s);
    table_remove(kv, kv->slots[s].hash);
    kv->slots[s].next = kv->free_head;
    kv->free_head = s;
    kv->cached--;
}

static void evict_one(pcr_kvcache_t *kv)
{
    uint64_t h = kv->slots[kv->lru_head].hash;
    drop_head(kv);
    if (kv->obs.removed)
        kv->obs.removed(kv->obs.arg, h);
}

void pcr_kvcache_observe(pcr_kvcache_t *kv, const pcr_kvcache_observer_t *obs)
{
    kv->obs = obs ? *obs : (pcr_kvcache_observer_t){0};
}

size_t pcr_kvcache_clear(pcr_kvcache_t *kv)
{
    size_t n = 0;
    for (; kv->lru_head != NIL; n++)
        drop_head(kv);
    return n;
}

size_t pcr_kvcache_match(const pcr_kvcache_t *kv, const uint64_t *hashes, size_t n)
{
    size_t i = 0;
    while (i < n && lookup(kv, hashes[i]) != NIL)
        i++;
    return i;
}

/* Blocks this request would newly hold with ref > 0 (absent or unpinned ones). */
static size_t newly_pinned(const pcr_kvcache_t *kv, const uint64_t *hashes, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = lookup(kv, hashes[i]);
        if (s == NIL || kv->slots[s].ref == 0)
            k++;
    }
    return k;
}

int pcr_kvcache_fits(const pcr_kvcache_t *kv, const uint64_t *hashes, size_t n,
                     size_t private_blocks)
{
    if (n + private_blocks > kv->capacity)
        return PCR_ERR_TOO_LARGE;
    if (kv->pinned + kv->reserved + newly_pinned(kv, hashes, n) + private_blocks > kv->capacity)
        return PCR_ERR_FULL;
    return 0;
}

int pcr_kvcache_acquire(pcr_kvcache_t *kv, const uint64_t *hashes, size_t n,
                        size_t private_blocks, size_t *hit_blocks)
{
    int rc = pcr_kvcache_fits(kv, hashes, n, private_blocks);
    if (rc)
        return rc;
    *hit_blocks = pcr_kvcache_match(kv, hashes, n);
    /* Pin what is there first, so that making room below never evicts this request's own;
     * count what is not (`missing`), the blocks it takes anew. */
    size_t missing = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = lookup(kv, hashes[i]);
        if (s == NIL) {
            missing++;
            continue;
        }
        if (kv->slots[s].ref++ == 0) {
            lru_unlink(kv, s);
            kv->pinned++;
        }
    }
    kv->reserved += private_blocks;
    /* vLLM takes a request's new blocks from its free queue at once, evicting the cached block
     * each one held, and names them afterwards: the evictions go out as one run, then the
     * stores (the victims are the same as one at a time). */
    while (kv->cached + kv->reserved + missing > kv->capacity && kv->lru_head != NIL)
        evict_one(kv);
    for (size_t i = 0; i < n; i++) {
        size_t pos = find_pos(kv, hashes[i]);
        if (kv->table[pos])
            continue;
        /* Free slots are those neither cached nor reserved; evict until one is. */
        while (kv->free_head == NIL || kv->cached + kv->reserved >= kv->capacity)
            evict_one(kv);
        pos = find_pos(kv, hashes[i]);   /* eviction may have shifted the table */
        uint32_t s = kv->free_head;
        kv->free_head = kv->slots[s].next;
        kv->slots[s].hash = hashes[i];
        kv->slots[s].ref = 1;
        kv->table[pos] = s + 1;
        kv->cached++;
        kv->pinned++;
        if (kv->obs.stored)
            kv->obs.stored(kv->obs.arg, hashes, i);
    }
    while (kv->cached + kv->reserved > kv->capacity)
        evict_one(kv);
    return 0;
}

void pcr_kvcache_release(pcr_kvcache_t *kv, const uint64_t *hashes, size_t n,
                         size_t private_blocks)
{
    kv->reserved -= private_blocks < kv->reserved ? private_blocks : kv->reserved;
    for (size_t i = n; i-- > 0;) {   /* tail first: it is the first to go under pressure */
        uint32_t s = lookup(kv, hashes[i]);
        if (s == NIL || kv->slots[s].ref == 0)
            continue;
        if (--kv->slots[s].ref == 0) {
            lru_push_tail(kv, s);
            kv->pinned--;
        }
    }
}

void pcr_kvcache_release_uncomputed(pcr_kvcache_t *kv, const uint64_t *hashes, size_t n,
                                    size_t computed, size_t private_blocks)
{
    pcr_kvcache_release(kv, hashes, n, private_blocks);
    for (size_t i = n; i-- > computed;) {
        uint32_t s = lookup(kv, hashes[i]);
        if (s == NIL || kv->slots[s].ref != 0)
            continue;
        lru_unlink(kv, s);
        table_remove(kv, hashes[i]);
        kv->slots[s].next = kv->free_head;
        kv->free_head = s;
        kv->cached--;
        if (kv->obs.removed)
            kv->obs.removed(kv->obs.arg, hashes[i]);
    }
}

size_t pcr_kvcache_capacity(const pcr_kvcache_t *kv) { return kv->capacity; }
size_t pcr_kvcache_cached(const pcr_kvcache_t *kv) { return kv->cached; }
size_t pcr_kvcache_pinned(const pcr_kvcache_t *kv) { return kv->pinned; }
size_t pcr_kvcache_reserved(const pcr_kvcache_t *kv) { return kv->reserved; }

int pcr_kvcache_schedule_parse(const char *s, pcr_kvcache_phase_t *out, size_t *n)
{
    *n = 0;
    for (;;) {
        char *end;
        double sec = strtod(s, &end);
        if (end == s || *end != ':' || !(sec > 0 && sec <= 1e6) || *n == PCR_KV_MAX_PHASES)
            return -1;
        s = end + 1;
        double f = strtod(s, &end);
        if (end == s || !(f > 0 && f <= 1))
            return -1;
        out[(*n)++] = (pcr_kvcache_phase_t){sec, f};
        if (*end == 0)
            return 0;
        if (*end != ',')
            return -1;
        s = end + 1;
    }
}

double pcr_kvcache_schedule_at(const pcr_kvcache_phase_t *ph, size_t n, double t)
{
    double cycle = 0;
    for (size_t i = 0; i < n; i++)
        cycle += ph[i].seconds;
    if (n == 0 || !(cycle > 0))
        return 1;
    t = fmod(t > 0 ? t : 0, cycle);
    for (size_t i = 0; i < n; i++) {
        if (t < ph[i].seconds)
            return ph[i].fraction;
        t -= ph[i].seconds;
    }
    return ph[n - 1].fraction;   /* rounding at the cycle's end */
}
