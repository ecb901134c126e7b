/* router/share/share_table.c: the bounded table of what every backend holds (share_table.h).
 *
 * An open-addressing hash table of entry pointers, linear probing, at most half full; a
 * removal shifts the entries after it back, so no tombstone is ever needed:
 *
 *   slots: [ e ][   ][ e ][ e ][   ] ...      e = pcr_share_entry_t *, heap
 *   home(e) = (last block ^ backend * K) & mask   (the block is an XXH3 value: uniform already)
 *
 * Bytes: every entry's size plus the slot array, never above max_bytes once a commit returns. */
#include <stdlib.h>
#include <string.h>

#include "pcr/common.h"
#include "share_table.h"

#define MIN_SLOTS 64
#define EVICT_SAMPLES 8
/* Spreads the backend over the slot index (Fibonacci hashing's multiplier). */
#define BACKEND_MIX 0x9E3779B97F4A7C15ull

struct pcr_share_table {
    pcr_share_entry_t **slots;
    size_t mask;               /* slots - 1 */
    size_t count;
    size_t bytes;              /* entries + slots */
    size_t max_bytes;
    size_t nbackends;
    uint64_t *held;            /* per backend: its keys' blocks added up */
    uint64_t *cap;             /* per backend: the bound on held */
    uint64_t version;
    unsigned short rng[3];     /* nrand48 state: sampling for eviction */
};

static size_t entry_bytes(size_t n) { return sizeof(pcr_share_entry_t) + n * sizeof(uint64_t); }

static size_t home(const pcr_share_table_t *t, unsigned backend, uint64_t leaf)
{
    return (size_t)(leaf ^ ((uint64_t)backend * BACKEND_MIX)) & t->mask;
}

pcr_share_table_t *pcr_share_table_new(size_t nbackends, size_t max_bytes, uint64_t seed)
{
    if (nbackends == 0 || nbackends > 65535)
        return NULL;
    pcr_share_table_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->slots = calloc(MIN_SLOTS, sizeof(*t->slots));
    t->held = calloc(nbackends, sizeof(*t->held));
    t->cap = malloc(nbackends * sizeof(*t->cap));
    if (t->slots == NULL || t->held == NULL || t->cap == NULL) {
        free(t->slots);
        free(t->held);
        free(t->cap);
        free(t);
        return NULL;
    }
    for (size_t b = 0; b < nbackends; b++)
        t->cap[b] = UINT64_MAX;
    t->mask = MIN_SLOTS - 1;
    t->bytes = MIN_SLOTS * sizeof(*t->slots);
    t->max_bytes = max_bytes;
    t->nbackends = nbackends;
    t->rng[0] = (unsigned short)seed;
    t->rng[1] = (unsigned short)(seed >> 16);
    t->rng[2] = (unsigned short)(seed >> 32);
    return t;
}

void pcr_share_table_free(pcr_share_table_t *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i <= t->mask; i++)
        free(t->slots[i]);
    free(t->slots);
    free(t->held);
    free(t->cap);
    free(t);
}

/* The slot holding (backend, blocks ending in leaf, n long), or -1. */
static long find(const pcr_share_table_t *t, unsigned backend, uint64_t leaf, size_t n)
{
    for (size_t i = home(t, backend, leaf);; i = (i + 1) & t->mask) {
        const pcr_share_entry_t *e = t->slots[i];
        if (e == NULL)
            return -1;
        if (e->backend == backend && e->nblocks == n && e->blocks[n - 1] == leaf)
            return (long)i;
    }
}

static void place(pcr_share_table_t *t, pcr_share_entry_t *e)
{
    size_t i = home(t, e->backend, e->blocks[e->nblocks - 1]);
    while (t->slots[i] != NULL)
        i = (i + 1) & t->mask;
    t->slots[i] = e;
}

/* Frees the entry at slot i and shifts back the run after it so every entry stays reachable
 * from its home slot. */
static void remove_at(pcr_share_table_t *t, size_t i)
{
    pcr_share_entry_t *e = t->slots[i];
    t->bytes -= entry_bytes(e->nblocks);
    t->held[e->backend] -= e->nblocks;
    t->count--;
    t->version++;
    free(e);
    t->slots[i] = NULL;
    for (size_t j = (i + 1) & t->mask; t->slots[j] != NULL; j = (j + 1) & t->mask) {
        pcr_share_entry_t *x = t->slots[j];
        size_t h = home(t, x->backend, x->blocks[x->nblocks - 1]);
        /* x may move to the hole at i unless its home lies cyclically in (i, j]. */
        int stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            t->slots[i] = x;
            t->slots[j] = NULL;
            i = j;
        }
    }
}

/* Doubles the slot array; 0 or PCR_ERR_NOMEM (the table unchanged). */
static int grow(pcr_share_table_t *t)
{
    size_t old = t->mask + 1, nslots = old * 2;
    pcr_share_entry_t **ns = calloc(nslots, sizeof(*ns)), **os = t->slots;
    if (ns == NULL)
        return PCR_ERR_NOMEM;
    t->slots = ns;
    t->mask = nslots - 1;
    for (size_t i = 0; i < old; i++)
        if (os[i] != NULL)
            place(t, os[i]);
    free(os);
    t->bytes += old * sizeof(*ns);
    return 0;
}

/* Drops the oldest of a few entries sampled at random, of `backend` only when it is not -1,
 * never `keep`. Returns 0 when there was none to drop. A sample walks on from a random slot
 * to the next candidate: short, as the table is at most half full and a backend whose keys
 * are over its bound holds many of them. */
static int evict_one(pcr_share_table_t *t, long backend, const pcr_share_entry_t *keep)
{
    long victim = -1;
    for (int s = 0; s < EVICT_SAMPLES; s++) {
        size_t i = (size_t)nrand48(t->rng) & t->mask;
        long found = -1;
        for (size_t k = 0; k <= t->mask && found < 0; k++, i = (i + 1) & t->mask) {
            const pcr_share_entry_t *e = t->slots[i];
            if (e != NULL && e != keep && (backend < 0 || e->backend == backend))
                found = (long)i;
        }
        if (found < 0)
            return 0;
        if (victim < 0 || t->slots[found]->time < t->slots[victim]->time)
            victim = found;
    }
    remove_at(t, (size_t)victim);
    return 1;
}

int pcr_share_table_commit(pcr_share_table_t *t, unsigned backend, const uint64_t *blocks,
                           size_t n, uint64_t time)
{
    if (backend >= t->nbackends || n == 0 || n > UINT32_MAX)
        return PCR_ERR_INVAL;
    long at = find(t, backend, blocks[n - 1], n);
    if (at >= 0) {
        pcr_share_entry_t *e = t->slots[at];
        if (e->time < time) {
            e->time = time;
            t->version++;
        }
        return 0;
    }
    size_t need = entry_bytes(n);
    if (need + (t->mask + 1) * sizeof(*t->slots) > t->max_bytes)
        return PCR_ERR_TOO_LARGE;
    if ((t->count + 1) * 2 > t->mask + 1 && grow(t) < 0)
        return PCR_ERR_NOMEM;
    pcr_share_entry_t *e = malloc(need);
    if (e == NULL)
        return PCR_ERR_NOMEM;
    e->time = time;
    e->nblocks = (uint32_t)n;
    e->backend = (uint16_t)backend;
    memcpy(e->blocks, blocks, n * sizeof(uint64_t));
    /* The keys this one extends are known through it now; it inherits their latest use. */
    for (size_t i = 0; i + 1 < n; i++) {
        long p = find(t, backend, blocks[i], i + 1);
        if (p >= 0) {
            if (t->slots[p]->time > e->time)
                e->time = t->slots[p]->time;
            remove_at(t, (size_t)p);
        }
    }
    place(t, e);
    t->count++;
    t->bytes += need;
    t->held[backend] += n;
    t->version++;
    while (t->held[backend] > t->cap[backend] && evict_one(t, backend, e))
        ;
    while (t->bytes > t->max_bytes && evict_one(t, -1, e))
        ;
    return 1;
}

void pcr_share_table_forget(pcr_share_table_t *t, unsigned backend, const uint64_t *blocks,
                            size_t n, size_t from)
{
    if (backend >= t->nbackends || n == 0 || from >= n)
        return;
    long at = find(t, backend, blocks[n - 1], n);
    if (at < 0)
        return;
    uint64_t time = t->slots[at]->time;
    remove_at(t, (size_t)at);
    if (from > 0)
        pcr_share_table_commit(t, backend, blocks, from, time);
}

void pcr_share_table_reset(pcr_share_table_t *t, unsigned backend)
{
    /* Rare (a backend went down): one pass. A removal may shift a later entry into slot i, so
     * slot i is looked at again before moving on; entries only ever move back into a hole, so
     * none is skipped. */
    for (size_t i = 0; i <= t->mask;) {
        const pcr_share_entry_t *e = t->slots[i];
        if (e != NULL && e->backend == backend)
            remove_at(t, i);
        else
            i++;
    }
    t->version++;
}

void pcr_share_table_set_capacity(pcr_share_table_t *t, unsigned backend, uint64_t blocks)
{
    if (backend >= t->nbackends)
        return;
    t->cap[backend] = blocks;
    while (t->held[backend] > blocks && evict_one(t, backend, NULL))
        ;
}

uint64_t pcr_share_table_held(const pcr_share_table_t *t, unsigned backend)
{
    return backend < t->nbackends ? t->held[backend] : 0;
}

size_t pcr_share_table_count(const pcr_share_table_t *t) { return t->count; }
size_t pcr_share_table_bytes(const pcr_share_table_t *t) { return t->bytes; }
uint64_t pcr_share_table_version(const pcr_share_table_t *t) { return t->version; }

static int older_first(const void *a, const void *b)
{
    const pcr_share_entry_t *x = *(const pcr_share_entry_t *const *)a;
    const pcr_share_entry_t *y = *(const pcr_share_entry_t *const *)b;
    return x->time < y->time ? -1 : x->time > y->time;
}

int pcr_share_table_list(const pcr_share_table_t *t, const pcr_share_entry_t ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (t->count == 0)
        return 0;
    const pcr_share_entry_t **v = malloc(t->count * sizeof(*v));
    if (v == NULL)
        return PCR_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i <= t->mask; i++)
        if (t->slots[i] != NULL)
            v[k++] = t->slots[i];
    qsort(v, k, sizeof(*v), older_first);
    *out = v;
    *n = k;
    return 0;
}
