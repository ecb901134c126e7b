/* hashring/kvtable.c: what each pod says it holds (include/pcr/kvtable.h).
 *
 * Layout: a node per chain value, each with a short list of holders (a backend, a medium, the
 * pod's own hash of the block, or "speculative" with an expiry). Two open-addressing tables
 * of indices (linear probing, backward-shift deletion, load at most 1/2) find a node by its
 * chain, and a holder by (backend, pod hash, medium); each slot keeps 32 bits of its entry's
 * hash beside the index, so probing and backward shifts read the slots alone and touch an
 * entry only where those bits match. Speculative holders are also queued in
 * the order they expire (the TTL is the table's, so the order of insertion); a queue entry
 * carries the holder's generation, so a slot freed and reused meanwhile is not expired.
 *
 *   node_map: chain --> node { chain, first holder }
 *                               |
 *                               v
 *   pod_map: (backend, pod hash, medium) --> holder { backend, medium, pod hash, next } --> ...
 *
 * Node and holder slots are recycled through free lists. Every array grows by doubling, only
 * within max_bytes, and an allocation that fails leaves the table as it was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "pcr/kvtable.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvtable hashes token ids as they lie in memory: little-endian only"
#endif

#define NIL UINT32_MAX

enum { H_FREE = 0, H_HELD, H_SPEC };

typedef struct {
    uint64_t chain;
    uint32_t first;    /* first holder; the next free node when unused */
    uint32_t used;
} node_t;

typedef struct {
    union {
        uint64_t pod_hash; /* H_HELD */
        uint64_t expires;  /* H_SPEC */
    };
    uint32_t node;
    uint32_t next;     /* the node's next holder; the next free holder when unused */
    uint32_t gen;      /* bumped when freed, so stale expiry entries miss */
    uint32_t backend;
    uint8_t medium;
    uint8_t state;
} holder_t;

typedef struct {
    uint32_t holder, gen;
    uint64_t expires;
} expiry_t;

typedef struct {
    uint64_t *slots;   /* hash << 32 | index + 1 (the hash's low 32 bits); 0 is empty */
    size_t cap, n;     /* cap a power of two up to 2^32, or 0 */
} imap_t;

#define SLOT_INDEX(s) ((uint32_t)(s) - 1)
#define SLOT_HASH(s) ((uint32_t)((s) >> 32))

struct pcr_kvtable {
    pcr_kvtable_opts_t o;
    node_t *nodes;
    size_t nodes_cap;
    uint32_t node_free;
    holder_t *holders;
    size_t holders_cap;
    uint32_t holder_free;
    imap_t node_map, pod_map;
    expiry_t *queue;   /* a ring */
    size_t q_cap, q_head, q_len;
    uint64_t *counts;  /* per backend: GPU, CPU, speculative */
    size_t bytes;
    uint64_t refused;
};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* Where a chain's node, and a pod's block, sit in their maps (and the hash bits kept). */
static uint32_t chain_home(uint64_t chain) { return (uint32_t)mix(chain); }

static uint32_t node_key(const pcr_kvtable_t *t, uint32_t i)
{
    return chain_home(t->nodes[i].chain);
}

static uint32_t pod_home(uint32_t backend, uint64_t pod_hash, unsigned medium)
{
    return (uint32_t)mix(pod_hash ^ ((uint64_t)backend << 8 | medium) * 0x9e3779b97f4a7c15ull);
}

static uint32_t pod_key(const pcr_kvtable_t *t, uint32_t i)
{
    const holder_t *h = &t->holders[i];
    return pod_home(h->backend, h->pod_hash, h->medium);
}

/* ---- memory: every array grows within max_bytes ------------------------------------------ */

static int fits(const pcr_kvtable_t *t, size_t more)
{
    return t->o.max_bytes == 0 || t->bytes + more <= t->o.max_bytes;
}

/* realloc of one array from `old` to `new` elements of `size`, counted. */
static void *grow_array(pcr_kvtable_t *t, void *p, size_t old, size_t new, size_t size, int *rc)
{
    if (!fits(t, (new - old) * size)) {
        *rc = PCR_ERR_FULL;
        return NULL;
    }
    void *np = realloc(p, new * size);
    if (np == NULL) {
        *rc = PCR_ERR_NOMEM;
        return NULL;
    }
    t->bytes += (new - old) * size;
    return np;
}

/* ---- the two index tables --------------------------------------------------------------- */

typedef uint32_t (*key_fn)(const pcr_kvtable_t *, uint32_t);

static int imap_reserve(pcr_kvtable_t *t, imap_t *m)
{
    if (m->cap != 0 && (m->n + 1) * 2 <= m->cap)
        return 0;
    size_t cap = m->cap ? m->cap * 2 : 64;
    if (cap > (size_t)1 << 32 || !fits(t, cap * sizeof(uint64_t)))
        return PCR_ERR_FULL;
    uint64_t *s = calloc(cap, sizeof(uint64_t));
    if (s == NULL)
        return PCR_ERR_NOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i] == 0)
            continue;
        size_t j = SLOT_HASH(m->slots[i]) & (cap - 1);
        while (s[j] != 0)
            j = (j + 1) & (cap - 1);
        s[j] = m->slots[i];
    }
    t->bytes += (cap - m->cap) * sizeof(uint64_t);
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

static void imap_put(const pcr_kvtable_t *t, imap_t *m, key_fn key, uint32_t v)
{
    uint32_t hash = key(t, v);
    size_t j = hash & (m->cap - 1);
    while (m->slots[j] != 0)
        j = (j + 1) & (m->cap - 1);
    m->slots[j] = (uint64_t)hash << 32 | (v + 1);
    m->n++;
}

/* Deletes `v`: backward shift, so no tombstone is left. */
static void imap_del(const pcr_kvtable_t *t, imap_t *m, key_fn key, uint32_t v)
{
    size_t mask = m->cap - 1, i = key(t, v) & mask;
    while ((uint32_t)m->slots[i] != v + 1)
        i = (i + 1) & mask;
    for (size_t j = i;;) {
        j = (j + 1) & mask;
        if (m->slots[j] == 0)
            break;
        size_t k = SLOT_HASH(m->slots[j]) & mask;
        /* slots[j] may move to i when its home is not in (i, j] cyclically. */
        if ((j > i && (k <= i || k > j)) || (j < i && k <= i && k > j)) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i] = 0;
    m->n--;
}

/* Events name blocks in batches: the slots of the next AHEAD are fetched while this one is
 * applied, as each is a likely cache miss in a table of many megabytes. */
#define AHEAD 8

static void prefetch_slot(const imap_t *m, uint32_t hash)
{
    if (m->cap != 0)
        __builtin_prefetch(&m->slots[hash & (m->cap - 1)]);
}

/* The entry of the first slot whose hash bits match (likely the one sought), or NIL: once
 * the slots are near, to fetch the entry before it is needed. */
static uint32_t peek(const imap_t *m, uint32_t hash)
{
    if (m->cap == 0)
        return NIL;
    size_t mask = m->cap - 1;
    for (size_t j = hash & mask; m->slots[j] != 0; j = (j + 1) & mask)
        if (SLOT_HASH(m->slots[j]) == hash)
            return SLOT_INDEX(m->slots[j]);
    return NIL;
}

static uint32_t node_find(const pcr_kvtable_t *t, uint64_t chain)
{
    if (t->node_map.cap == 0)
        return NIL;
    size_t mask = t->node_map.cap - 1;
    uint32_t hash = chain_home(chain);
    for (size_t j = hash & mask; t->node_map.slots[j] != 0; j = (j + 1) & mask) {
        uint64_t s = t->node_map.slots[j];
        if (SLOT_HASH(s) == hash && t->nodes[SLOT_INDEX(s)].chain == chain)
            return SLOT_INDEX(s);
    }
    return NIL;
}

static uint32_t pod_find(const pcr_kvtable_t *t, uint32_t backend, uint64_t pod_hash,
                         unsigned medium)
{
    if (t->pod_map.cap == 0)
        return NIL;
    size_t mask = t->pod_map.cap - 1;
    uint32_t hash = pod_home(backend, pod_hash, medium);
    for (size_t j = hash & mask; t->pod_map.slots[j] != 0; j = (j + 1) & mask) {
        uint64_t s = t->pod_map.slots[j];
        if (SLOT_HASH(s) != hash)
            continue;
        const holder_t *h = &t->holders[SLOT_INDEX(s)];
        if (h->pod_hash == pod_hash && h->backend == backend && h->medium == medium)
            return SLOT_INDEX(s);
    }
    return NIL;
}

/* ---- nodes and holders ------------------------------------------------------------------ */

/* The node of `chain`, made if needed; NIL with *rc set when it cannot be. */
static uint32_t node_get(pcr_kvtable_t *t, uint64_t chain, int *rc)
{
    uint32_t n = node_find(t, chain);
    if (n != NIL)
        return n;
    if (t->node_free == NIL) {
        size_t cap = t->nodes_cap ? t->nodes_cap * 2 : 64;
        node_t *nn = grow_array(t, t->nodes, t->nodes_cap, cap, sizeof(*nn), rc);
        if (nn == NULL)
            return NIL;
        t->nodes = nn;
        for (size_t i = cap; i-- > t->nodes_cap;) {
            t->nodes[i] = (node_t){0, t->node_free, 0};
            t->node_free = (uint32_t)i;
        }
        t->nodes_cap = cap;
    }
    if ((*rc = imap_reserve(t, &t->node_map)) != 0)
        return NIL;
    n = t->node_free;
    t->node_free = t->nodes[n].first;
    t->nodes[n] = (node_t){chain, NIL, 1};
    imap_put(t, &t->node_map, node_key, n);
    return n;
}

static void node_drop_if_empty(pcr_kvtable_t *t, uint32_t n)
{
    if (t->nodes[n].first != NIL)
        return;
    imap_del(t, &t->node_map, node_key, n);
    t->nodes[n] = (node_t){0, t->node_free, 0};
    t->node_free = n;
}

static uint64_t *count(pcr_kvtable_t *t, uint32_t backend, unsigned which)
{
    return &t->counts[backend * 3 + which];
}

static unsigned counted_as(const holder_t *h) { return h->state == H_SPEC ? 2 : h->medium; }

/* A new holder on node `n`, linked first; NIL with *rc set when it cannot be. The pod map
 * and the expiry queue are the caller's. */
static uint32_t holder_new(pcr_kvtable_t *t, uint32_t n, int *rc)
{
    if (t->holder_free == NIL) {
        size_t cap = t->holders_cap ? t->holders_cap * 2 : 64;
        holder_t *nh = grow_array(t, t->holders, t->holders_cap, cap, sizeof(*nh), rc);
        if (nh == NULL)
            return NIL;
        t->holders = nh;
        for (size_t i = cap; i-- > t->holders_cap;) {
            memset(&t->holders[i], 0, sizeof(t->holders[i]));
            t->holders[i].next = t->holder_free;
            t->holder_free = (uint32_t)i;
        }
        t->holders_cap = cap;
    }
    uint32_t h = t->holder_free;
    holder_t *p = &t->holders[h];
    t->holder_free = p->next;
    p->node = n;
    p->next = t->nodes[n].first;
    t->nodes[n].first = h;
    return h;
}

static void holder_drop(pcr_kvtable_t *t, uint32_t h)
{
    holder_t *p = &t->holders[h];
    uint32_t n = p->node;
    if (p->state == H_HELD)
        imap_del(t, &t->pod_map, pod_key, h);
    (*count(t, p->backend, counted_as(p)))--;
    uint32_t *link = &t->nodes[n].first;
    while (*link != h)
        link = &t->holders[*link].next;
    *link = p->next;
    uint32_t gen = p->gen + 1;
    memset(p, 0, sizeof(*p));
    p->gen = gen;
    p->next = t->holder_free;
    t->holder_free = h;
    node_drop_if_empty(t, n);
}

/* The holder of node `n` for `backend` on `medium` (H_HELD), or its speculative one (medium
 * ignored), or NIL. */
static uint32_t holder_of(const pcr_kvtable_t *t, uint32_t n, uint32_t backend, int medium)
{
    for (uint32_t h = t->nodes[n].first; h != NIL; h = t->holders[h].next) {
        const holder_t *p = &t->holders[h];
        if (p->backend == backend &&
            (medium < 0 ? p->state == H_SPEC : p->state == H_HELD && p->medium == medium))
            return h;
    }
    return NIL;
}

/* ---- the API ---------------------------------------------------------------------------- */

pcr_kvtable_t *pcr_kvtable_new(const pcr_kvtable_opts_t *o)
{
    if (o == NULL || o->block_tokens == 0 || o->block_tokens > 65536)
        return NULL;
    pcr_kvtable_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->o = *o;
    t->o.nbackends = 0;
    t->node_free = t->holder_free = NIL;
    if (pcr_kvtable_grow(t, o->nbackends) != 0) {
        pcr_kvtable_free(t);
        return NULL;
    }
    return t;
}

void pcr_kvtable_free(pcr_kvtable_t *t)
{
    if (t == NULL)
        return;
    free(t->nodes);
    free(t->holders);
    free(t->node_map.slots);
    free(t->pod_map.slots);
    free(t->queue);
    free(t->counts);
    free(t);
}

void pcr_kvtable_set_limits(pcr_kvtable_t *t, size_t max_bytes, uint64_t speculative_ttl)
{
    if (t == NULL)
        return;
    t->o.max_bytes = max_bytes;
    t->o.speculative_ttl = speculative_ttl;
}

int pcr_kvtable_grow(pcr_kvtable_t *t, size_t n)
{
    if (n <= t->o.nbackends)
        return 0;
    if (n > UINT32_MAX / 3)
        return PCR_ERR_INVAL;
    uint64_t *c = realloc(t->counts, n * 3 * sizeof(*c));
    if (c == NULL)
        return PCR_ERR_NOMEM;
    memset(c + t->o.nbackends * 3, 0, (n - t->o.nbackends) * 3 * sizeof(*c));
    t->bytes += (n - t->o.nbackends) * 3 * sizeof(*c);
    t->counts = c;
    t->o.nbackends = n;
    return 0;
}

static uint64_t chain_of(uint64_t prev, const uint32_t *tokens, uint32_t block_tokens)
{
    return XXH3_64bits_withSeed(tokens, (size_t)block_tokens * sizeof(uint32_t), prev);
}

size_t pcr_kvtable_key(uint64_t seed, uint32_t block_tokens, const uint32_t *tokens,
                       size_t ntokens, uint64_t *chains, size_t max)
{
    if (block_tokens == 0 || tokens == NULL)
        return 0;
    size_t n = ntokens / block_tokens;
    if (n > max)
        n = max;
    for (size_t i = 0; i < n; i++)
        seed = chains[i] = chain_of(seed, tokens + i * block_tokens, block_tokens);
    return n;
}

/* The chain a pod's hash stands for, on any medium; NIL when not known. */
static uint32_t pod_any(const pcr_kvtable_t *t, uint32_t backend, uint64_t pod_hash)
{
    for (unsigned m = 0; m < PCR_KVT_MEDIA; m++) {
        uint32_t h = pod_find(t, backend, pod_hash, m);
        if (h != NIL)
            return h;
    }
    return NIL;
}

/* Holder `h` (new, or speculative) becomes the pod's block `pod_hash` on `medium`. */
static int hold(pcr_kvtable_t *t, uint32_t h, uint32_t backend, uint64_t pod_hash,
                unsigned medium)
{
    int rc = imap_reserve(t, &t->pod_map);
    if (rc != 0)
        return rc;
    holder_t *p = &t->holders[h];
    if (p->state == H_SPEC)
        (*count(t, backend, 2))--;
    p->state = H_HELD;
    p->backend = backend;
    p->medium = (uint8_t)medium;
    p->pod_hash = pod_hash; /* in place of the expiry */
    imap_put(t, &t->pod_map, pod_key, h);
    (*count(t, backend, medium))++;
    return 0;
}

/* A new speculative holder of node `n` for `backend`, counted; NIL with *rc set (and a node
 * left empty dropped, a refusal counted) when it cannot be made. */
static uint32_t spec_new(pcr_kvtable_t *t, uint32_t n, uint32_t backend, int *rc)
{
    uint32_t h = holder_new(t, n, rc);
    if (h == NIL) {
        t->refused += *rc == PCR_ERR_FULL;
        node_drop_if_empty(t, n);
        return NIL;
    }
    t->holders[h].state = H_SPEC;
    t->holders[h].backend = backend;
    (*count(t, backend, 2))++;
    return h;
}

int pcr_kvtable_stored(pcr_kvtable_t *t, unsigned backend, const pcr_kvt_stored_t *ev,
                       uint64_t now)
{
    (void)now;
    if (t == NULL || ev == NULL || backend >= t->o.nbackends || ev->medium >= PCR_KVT_MEDIA ||
        ev->block_size != t->o.block_tokens || (ev->nhashes > 0 && ev->tokens == NULL))
        return PCR_ERR_INVAL;
    uint64_t prev = ev->seed;
    if (ev->has_parent) {
        uint32_t ph = pod_any(t, backend, ev->parent);
        if (ph == NIL)
            return PCR_ERR_NOTFOUND;
        prev = t->nodes[t->holders[ph].node].chain;
    }
    uint64_t chains[AHEAD];
    for (size_t i = 0; i < ev->nhashes; i++) {
        if (i % AHEAD == 0) /* the next blocks' chains, and their slots on their way */
            for (size_t k = i; k < ev->nhashes && k < i + AHEAD; k++) {
                prev = chains[k % AHEAD] =
                    chain_of(prev, ev->tokens + k * ev->block_size, ev->block_size);
                prefetch_slot(&t->node_map, chain_home(prev));
                prefetch_slot(&t->pod_map, pod_home(backend, ev->hashes[k], ev->medium));
            }
        uint64_t chain = chains[i % AHEAD];
        uint32_t h = pod_find(t, backend, ev->hashes[i], ev->medium);
        if (h != NIL) {
            if (t->nodes[t->holders[h].node].chain == chain)
                continue; /* stored again: nothing changes */
            holder_drop(t, h); /* the pod's hash now names other tokens */
        }
        int rc = 0;
        uint32_t n = node_get(t, chain, &rc);
        if (n == NIL) {
            t->refused += rc == PCR_ERR_FULL;
            return rc;
        }
        h = holder_of(t, n, backend, (int)ev->medium);
        if (h != NIL) {
            /* Held already under another of the pod's hashes: it goes by this one now. */
            imap_del(t, &t->pod_map, pod_key, h);
            t->holders[h].pod_hash = ev->hashes[i];
            imap_put(t, &t->pod_map, pod_key, h);
            continue;
        }
        h = holder_of(t, n, backend, -1); /* speculative: now confirmed */
        int fresh = h == NIL;
        if (fresh && (h = spec_new(t, n, backend, &rc)) == NIL)
            return rc; /* a new one is speculative until hold() below */
        if ((rc = hold(t, h, backend, ev->hashes[i], ev->medium)) != 0) {
            if (fresh)
                holder_drop(t, h);
            t->refused += rc == PCR_ERR_FULL;
            return rc;
        }
    }
    return 0;
}

size_t pcr_kvtable_removed(pcr_kvtable_t *t, unsigned backend, const uint64_t *hashes, size_t n,
                           pcr_kvt_medium_t medium)
{
    size_t dropped = 0;
    if (t == NULL || backend >= t->o.nbackends || medium >= PCR_KVT_MEDIA)
        return 0;
    for (size_t i = 0; i < n && i < AHEAD; i++)
        prefetch_slot(&t->pod_map, pod_home(backend, hashes[i], medium));
    /* Dropping a block reads its slot, its holder, its node and the node's slot, each
     * likely a miss: they are fetched in stages, 8, 6, 4 and 2 blocks ahead. */
    for (size_t i = 0; i < n; i++) {
        uint32_t h;
        if (i + AHEAD < n)
            prefetch_slot(&t->pod_map, pod_home(backend, hashes[i + AHEAD], medium));
        if (i + 6 < n && (h = peek(&t->pod_map, pod_home(backend, hashes[i + 6], medium))) != NIL)
            __builtin_prefetch(&t->holders[h]);
        if (i + 4 < n && (h = peek(&t->pod_map, pod_home(backend, hashes[i + 4], medium))) != NIL)
            __builtin_prefetch(&t->nodes[t->holders[h].node]);
        if (i + 2 < n && (h = peek(&t->pod_map, pod_home(backend, hashes[i + 2], medium))) != NIL)
            prefetch_slot(&t->node_map, node_key(t, t->holders[h].node));
        h = pod_find(t, backend, hashes[i], medium);
        if (h != NIL) {
            holder_drop(t, h);
            dropped++;
        }
    }
    return dropped;
}

void pcr_kvtable_clear(pcr_kvtable_t *t, unsigned backend)
{
    if (t == NULL || backend >= t->o.nbackends)
        return;
    for (size_t h = 0; h < t->holders_cap; h++)
        if (t->holders[h].state != H_FREE && t->holders[h].backend == backend)
            holder_drop(t, (uint32_t)h);
}

size_t pcr_kvtable_clear_speculative(pcr_kvtable_t *t, unsigned backend)
{
    size_t dropped = 0;
    if (t == NULL || backend >= t->o.nbackends || *count(t, backend, 2) == 0)
        return 0;
    /* Their expiry queue entries stay: the generation a drop bumps makes them miss. */
    for (size_t h = 0; h < t->holders_cap; h++)
        if (t->holders[h].state == H_SPEC && t->holders[h].backend == backend) {
            holder_drop(t, (uint32_t)h);
            dropped++;
        }
    return dropped;
}

/* Room for one more entry in the expiry queue. */
static int queue_reserve(pcr_kvtable_t *t)
{
    if (t->q_len < t->q_cap)
        return 0;
    int rc = 0;
    size_t cap = t->q_cap ? t->q_cap * 2 : 64;
    expiry_t *q = grow_array(t, t->queue, t->q_cap, cap, sizeof(*q), &rc);
    if (q == NULL)
        return rc;
    /* Unwrap the ring into the new space: the part from the head moves to the end. */
    size_t tail = t->q_cap - t->q_head;
    if (t->q_len > tail) {
        memmove(q + cap - tail, q + t->q_head, tail * sizeof(*q));
        t->q_head = cap - tail;
    }
    t->queue = q;
    t->q_cap = cap;
    return 0;
}

int pcr_kvtable_speculate(pcr_kvtable_t *t, unsigned backend, const uint64_t *chains, size_t n,
                          uint64_t now)
{
    if (t == NULL || backend >= t->o.nbackends)
        return PCR_ERR_INVAL;
    uint64_t expires = now + t->o.speculative_ttl;
    for (size_t i = 0; i < n; i++) {
        int rc = 0;
        uint32_t node = node_get(t, chains[i], &rc);
        if (node == NIL) {
            t->refused += rc == PCR_ERR_FULL;
            return rc;
        }
        uint32_t h = NIL;
        int held = 0;
        for (uint32_t k = t->nodes[node].first; k != NIL; k = t->holders[k].next) {
            if (t->holders[k].backend != backend)
                continue;
            held |= t->holders[k].state == H_HELD;
            if (t->holders[k].state == H_SPEC)
                h = k;
        }
        if (held)
            continue;
        if ((rc = queue_reserve(t)) != 0) {
            t->refused += rc == PCR_ERR_FULL;
            node_drop_if_empty(t, node);
            return rc;
        }
        if (h == NIL && (h = spec_new(t, node, backend, &rc)) == NIL)
            return rc;
        t->holders[h].expires = expires;
        t->queue[(t->q_head + t->q_len) % t->q_cap] = (expiry_t){h, t->holders[h].gen, expires};
        t->q_len++;
    }
    return 0;
}

size_t pcr_kvtable_expire(pcr_kvtable_t *t, uint64_t now)
{
    size_t dropped = 0;
    while (t != NULL && t->q_len > 0 && t->queue[t->q_head].expires <= now) {
        expiry_t e = t->queue[t->q_head];
        t->q_head = (t->q_head + 1) % t->q_cap;
        t->q_len--;
        holder_t *p = &t->holders[e.holder];
        /* A holder confirmed, dropped or made again since, or speculated anew, stays. */
        if (p->gen == e.gen && p->state == H_SPEC && p->expires <= now) {
            holder_drop(t, e.holder);
            dropped++;
        }
    }
    return dropped;
}

size_t pcr_kvtable_match(const pcr_kvtable_t *t, const uint64_t *chains, size_t n,
                         uint32_t *gpu, uint32_t *any)
{
    size_t nb = t->o.nbackends, best = 0;
    if (gpu)
        memset(gpu, 0, nb * sizeof(*gpu));
    memset(any, 0, nb * sizeof(*any));
    uint32_t *a = any;
    for (size_t i = 0; i < n; i++) {
        uint32_t node = node_find(t, chains[i]);
        if (node == NIL)
            break;
        int advanced = 0;
        for (uint32_t h = t->nodes[node].first; h != NIL; h = t->holders[h].next) {
            const holder_t *p = &t->holders[h];
            if (a[p->backend] == i) {
                a[p->backend] = (uint32_t)i + 1;
                advanced = 1;
            }
            if (gpu && gpu[p->backend] == i && (p->state == H_SPEC || p->medium == PCR_KVT_GPU))
                gpu[p->backend] = (uint32_t)i + 1;
        }
        if (!advanced)
            break;
        best = i + 1;
    }
    return best;
}

uint64_t pcr_kvtable_entries(const pcr_kvtable_t *t, unsigned backend, pcr_kvt_medium_t medium)
{
    return t != NULL && backend < t->o.nbackends && medium < PCR_KVT_MEDIA
               ? t->counts[backend * 3 + medium]
               : 0;
}

uint64_t pcr_kvtable_speculative(const pcr_kvtable_t *t, unsigned backend)
{
    return t != NULL && backend < t->o.nbackends ? t->counts[backend * 3 + 2] : 0;
}

uint64_t pcr_kvtable_refused(const pcr_kvtable_t *t) { return t ? t->refused : 0; }

size_t pcr_kvtable_bytes(const pcr_kvtable_t *t) { return t ? t->bytes + sizeof(*t) : 0; }

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            snprintf(err, errlen, __VA_ARGS__);                                             \
            free(seen);                                                                     \
            return PCR_ERR_INVAL;                                                           \
        }                                                                                   \
    } while (0)

int pcr_kvtable_check(const pcr_kvtable_t *t, char *err, size_t errlen)
{
    uint64_t *seen = calloc(t->o.nbackends * 3 + 1, sizeof(*seen));
    size_t nodes = 0, held = 0;
    CHECK(seen != NULL, "out of memory");
    for (uint32_t n = 0; n < t->nodes_cap; n++) {
        const node_t *nd = &t->nodes[n];
        if (!nd->used)
            continue;
        nodes++;
        CHECK(nd->first != NIL, "node %u has no holder", n);
        CHECK(node_find(t, nd->chain) == n, "node %u not found by its chain", n);
        size_t len = 0;
        for (uint32_t h = nd->first; h != NIL; h = t->holders[h].next) {
            const holder_t *p = &t->holders[h];
            CHECK(++len <= t->holders_cap, "node %u's holder list loops", n);
            CHECK(p->state != H_FREE && p->node == n, "holder %u: state %u node %u, on node %u",
                  h, p->state, p->node, n);
            CHECK(p->backend < t->o.nbackends, "holder %u: backend %u", h, p->backend);
            seen[p->backend * 3 + counted_as(p)]++;
            if (p->state == H_HELD) {
                held++;
                CHECK(pod_find(t, p->backend, p->pod_hash, p->medium) == h,
                      "holder %u not found by its pod hash", h);
            }
        }
    }
    CHECK(nodes == t->node_map.n, "%zu nodes, %zu in the map", nodes, t->node_map.n);
    CHECK(held == t->pod_map.n, "%zu held, %zu in the pod map", held, t->pod_map.n);
    for (size_t i = 0; i < t->o.nbackends * 3; i++)
        CHECK(seen[i] == t->counts[i], "backend %zu count %zu: %llu, counted %llu", i / 3,
              i % 3, (unsigned long long)seen[i], (unsigned long long)t->counts[i]);
    free(seen);
    return 0;
}
