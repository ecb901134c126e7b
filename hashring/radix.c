/* hashring/radix.c: the prefix index (include/pcr/index.h), a compressed radix tree over
 * sequences of chained block hashes, with per-backend holdings, LRU eviction and a memory cap.
 *
 * Design
 * ------
 * A node holds a run of one or more block hashes (a compressed edge, as in rax) and the list
 * of backends that hold the whole run. Children are not stored in their parent: one hash table
 * maps (parent, first hash of the child's run) to the child, so a node of any fan-out (the
 * root of a model with thousands of distinct prompts) costs nothing extra and a lookup is one
 * probe. Lookups only go down; a node knows its parent, so erase and eviction go up.
 *
 *      table: (parent, hash[0]) -> node           backend b's leaf list (LRU, oldest first)
 *   +--------------------------------------+      head -> C.hold[b] -> E.hold[b] -> tail
 *   |                 root                 |
 *   +------------------+-------------------+
 *                      |
 *        +-------------v--------------+     rnode_t (32 bytes + 8 per block)
 *        | A  run: h0 h1 h2           |     +--------+------+-------+---------+-----+----------+
 *        |    hold: {b0,t9} {b1,t7}   |     | parent | hold | depth | nblocks | cap | nhold,cap|
 *        +------+---------------+-----+     +--------+------+-------+---------+-----+----------+
 *               |               |           | hash[0] hash[1] ... hash[nblocks-1] (the run)  |
 *   +-----------v-----+   +-----v--------+  +------------------------------------------------+
 *   | B run: h3       |   | C run: h3' h4 |
 *   | hold: {b0,t9}   |   | hold: {b1,t7} |  hold_t (32 bytes): time, LRU prev/next (nodes),
 *   +----+------------+   +---------------+  nkids (children this backend holds), backend
 *        |
 *   +----v------------+   A request h0 h1 h2 h3' h4 h5 matches: b0 holds 3 blocks, b1 holds 5.
 *   | E run: h5 h6    |
 *   | hold: {b0,t9}   |
 *   +-----------------+
 *
 * Invariants (checked by radix_check.c after every step of the randomised tests):
 * - A backend's holdings are prefix-closed: holding a node implies holding its parent; a
 *   holding always covers the node's whole run (an insert or eviction that ends inside a run
 *   splits it). Every node has at least one holder, so a node with no holder is freed at once.
 * - A holding with nkids == 0 is a leaf for its backend and sits in that backend's leaf list,
 *   which is kept sorted by time. An insert touches one leaf (moved from the tail: O(1) when
 *   time only grows); a parent that becomes a leaf is placed from the head, where it almost
 *   always belongs (its time is that of its newest child, which was just evicted as oldest).
 * - Capacity eviction takes blocks from the tail of the oldest leaf, as vLLM frees a request's
 *   last blocks first; the memory cap evicts whole leaf holdings, oldest across backends.
 * - Every allocation happens before the structure is changed, so a failed one leaves a valid
 *   tree; the operations that cannot fail (erase, eviction) fall back to dropping a backend's
 *   whole node instead of splitting it.
 *
 * Memory per stored (block, backend) is 8 bytes of hash per block plus, per node, 32 bytes of
 * header, 32 per holder and about 12 of table; runs of a few blocks shared by a few backends
 * bring it well under the 48-byte target (bench_hashring measures it). */
#include <stdlib.h>
#include <string.h>

#include "radix_int.h"

#define TABLE_MIN 64u

static void *default_malloc(size_t size, void *ud)
{
    (void)ud;
    return malloc(size);
}

static void default_free(void *ptr, size_t size, void *ud)
{
    (void)size;
    (void)ud;
    free(ptr);
}

static void *ix_alloc(pcr_index_t *ix, size_t n)
{
    void *p = ix->a.malloc_fn(n, ix->a.ud);
    if (p != NULL)
        ix->bytes += n;
    return p;
}

static void ix_free(pcr_index_t *ix, void *p, size_t n)
{
    if (p != NULL) {
        ix->a.free_fn(p, n, ix->a.ud);
        ix->bytes -= n;
    }
}

/* ---- the child table ---------------------------------------------------------------------- */

static size_t slot_of(const pcr_index_t *ix, const rnode_t *parent, uint64_t h)
{
    uint64_t k = h ^ ((uint64_t)(uintptr_t)parent * 0x9E3779B97F4A7C15ull);
    k ^= k >> 31;
    k *= 0xBF58476D1CE4E5B9ull;
    k ^= k >> 29;
    return (size_t)k & ix->mask;
}

rnode_t *pcr_radix_find(const pcr_index_t *ix, const rnode_t *parent, uint64_t h)
{
    for (size_t i = slot_of(ix, parent, h);; i = (i + 1) & ix->mask) {
        rnode_t *x = ix->slots[i];
        if (x == NULL || (x->parent == parent && x->hash[0] == h))
            return x;
    }
}

static size_t tab_pos(const pcr_index_t *ix, const rnode_t *x)
{
    size_t i = slot_of(ix, x->parent, x->hash[0]);
    while (ix->slots[i] != x)
        i = (i + 1) & ix->mask;
    return i;
}

static void tab_put(pcr_index_t *ix, rnode_t *x)
{
    size_t i = slot_of(ix, x->parent, x->hash[0]);
    while (ix->slots[i] != NULL)
        i = (i + 1) & ix->mask;
    ix->slots[i] = x;
    ix->count++;
}

/* Backward-shift deletion: no tombstones, so lookups stay short and deletion never allocates. */
static void tab_del(pcr_index_t *ix, size_t i)
{
    size_t j = i;
    ix->slots[i] = NULL;
    ix->count--;
    for (;;) {
        j = (j + 1) & ix->mask;
        rnode_t *y = ix->slots[j];
        if (y == NULL)
            return;
        size_t k = slot_of(ix, y->parent, y->hash[0]);
        /* y may move to i unless its home k lies cyclically in (i, j]. */
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            ix->slots[i] = y;
            ix->slots[j] = NULL;
            i = j;
        }
    }
}

/* Makes room for `extra` more nodes at a load of at most 3/4. */
static int tab_reserve(pcr_index_t *ix, size_t extra)
{
    size_t n = ix->mask + 1;
    if ((ix->count + extra) * 4 <= n * 3)
        return 0;
    size_t nn = n * 2;
    rnode_t **ns = ix_alloc(ix, nn * sizeof(*ns));
    if (ns == NULL)
        return PCR_ERR_NOMEM;
    memset(ns, 0, nn * sizeof(*ns));
    rnode_t **old = ix->slots;
    ix->slots = ns;
    ix->mask = nn - 1;
    ix->count = 0;
    for (size_t i = 0; i < n; i++)
        if (old[i] != NULL)
            tab_put(ix, old[i]);
    ix_free(ix, old, n * sizeof(*old));
    return 0;
}

/* ---- holdings and leaf lists -------------------------------------------------------------- */

hold_t *pcr_radix_hold(const rnode_t *x, unsigned b)
{
    size_t lo = 0, hi = x->nhold;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (x->hold[mid].backend < b)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < x->nhold && x->hold[lo].backend == b ? &x->hold[lo] : NULL;
}

static void lru_unlink(pcr_index_t *ix, unsigned b, hold_t *h)
{
    rbackend_t *be = &ix->be[b];
    if (h->prev != NULL)
        pcr_radix_hold(h->prev, b)->next = h->next;
    else
        be->head = h->next;
    if (h->next != NULL)
        pcr_radix_hold(h->next, b)->prev = h->prev;
    else
        be->tail = h->prev;
    h->prev = h->next = NULL;
}

/* Links x's holding h after node `after` (NULL = at the head). */
static void lru_link_after(pcr_index_t *ix, unsigned b, rnode_t *x, hold_t *h, rnode_t *after)
{
    rbackend_t *be = &ix->be[b];
    rnode_t *next = after != NULL ? pcr_radix_hold(after, b)->next : be->head;
    h->prev = after;
    h->next = next;
    if (after != NULL)
        pcr_radix_hold(after, b)->next = x;
    else
        be->head = x;
    if (next != NULL)
        pcr_radix_hold(next, b)->prev = x;
    else
        be->tail = x;
}

/* Sorted by time, equal times in arrival order; `from_head` picks the end the scan starts at. */
static void lru_insert(pcr_index_t *ix, unsigned b, rnode_t *x, hold_t *h, int from_head)
{
    rnode_t *after;
    if (from_head) {
        rnode_t *prev = NULL, *cur = ix->be[b].head;
        while (cur != NULL) {
            hold_t *c = pcr_radix_hold(cur, b);
            if (c->time > h->time)
                break;
            prev = cur;
            cur = c->next;
        }
        after = prev;
    } else {
        after = ix->be[b].tail;
        while (after != NULL) {
            hold_t *c = pcr_radix_hold(after, b);
            if (c->time <= h->time)
                break;
            after = c->prev;
        }
    }
    lru_link_after(ix, b, x, h, after);
}

/* Ensures x has room for one more holder. */
static int hold_reserve(pcr_index_t *ix, rnode_t *x)
{
    if (x->nhold < x->hold_cap)
        return 0;
    size_t ncap = x->hold_cap ? (size_t)x->hold_cap * 2 : 1;
    if (ncap > PCR_INDEX_MAX_BACKENDS)
        ncap = PCR_INDEX_MAX_BACKENDS;
    hold_t *nh = ix_alloc(ix, ncap * sizeof(*nh));
    if (nh == NULL)
        return PCR_ERR_NOMEM;
    if (x->nhold)
        memcpy(nh, x->hold, x->nhold * sizeof(*nh));
    ix_free(ix, x->hold, x->hold_cap * sizeof(*nh));
    x->hold = nh;
    x->hold_cap = (uint16_t)ncap;
    return 0;
}

/* Adds b (room reserved, b holds x's parent) as a leaf holding of x. */
static void hold_add(pcr_index_t *ix, rnode_t *x, unsigned b, uint64_t now)
{
    size_t i = 0;
    while (i < x->nhold && x->hold[i].backend < b)
        i++;
    memmove(&x->hold[i + 1], &x->hold[i], (x->nhold - i) * sizeof(hold_t));
    x->nhold++;
    hold_t *h = &x->hold[i];
    memset(h, 0, sizeof(*h));
    h->time = now;
    h->backend = (uint16_t)b;
    lru_insert(ix, b, x, h, 0);
    if (x->parent != ix->root) {
        hold_t *hp = pcr_radix_hold(x->parent, b);
        if (hp->nkids++ == 0)
            lru_unlink(ix, b, hp);
    }
    ix->be[b].blocks += x->nblocks;
    ix->pairs += x->nblocks;
}

static void node_free(pcr_index_t *ix, rnode_t *x)
{
    ix_free(ix, x->hold, x->hold_cap * sizeof(hold_t));
    ix_free(ix, x, pcr_radix_node_size(x->cap));
}

/* Removes b's leaf holding of x; frees x when it was the last. The parent, if it becomes a
 * leaf for b, goes to its sorted place (`sorted`) or to the head (when all of b goes). */
static void hold_remove(pcr_index_t *ix, rnode_t *x, unsigned b, int sorted)
{
    hold_t *h = pcr_radix_hold(x, b);
    rnode_t *p = x->parent;

    lru_unlink(ix, b, h);
    ix->be[b].blocks -= x->nblocks;
    ix->pairs -= x->nblocks;
    size_t i = (size_t)(h - x->hold);
    memmove(&x->hold[i], &x->hold[i + 1], (x->nhold - i - 1) * sizeof(hold_t));
    x->nhold--;
    if (p != ix->root) {
        hold_t *hp = pcr_radix_hold(p, b);
        if (--hp->nkids == 0) {
            if (sorted)
                lru_insert(ix, b, p, hp, 1);
            else
                lru_link_after(ix, b, p, hp, NULL);
        }
    }
    if (x->nhold == 0) {
        tab_del(ix, tab_pos(ix, x));
        node_free(ix, x);
    }
}

/* ---- nodes -------------------------------------------------------------------------------- */

static rnode_t *node_new(pcr_index_t *ix, rnode_t *parent, const uint64_t *hash, size_t k,
                         size_t depth)
{
    rnode_t *x = ix_alloc(ix, pcr_radix_node_size((uint32_t)k));
    if (x == NULL)
        return NULL;
    memset(x, 0, sizeof(*x));
    x->parent = parent;
    x->depth = (uint32_t)depth;
    x->nblocks = x->cap = (uint32_t)k;
    memcpy(x->hash, hash, k * sizeof(uint64_t));
    return x;
}

/* Splits x after its first j blocks (0 < j < nblocks; one table slot reserved). x keeps its
 * address, holders and children as the lower part, so no child or leaf list needs fixing; the
 * new upper node takes x's place under its parent. Returns the upper node, or NULL. */
static rnode_t *node_split(pcr_index_t *ix, rnode_t *x, size_t j)
{
    rnode_t *u = node_new(ix, x->parent, x->hash, j, x->depth);
    if (u == NULL)
        return NULL;
    u->hold = ix_alloc(ix, x->nhold * sizeof(hold_t));
    if (u->hold == NULL) {
        node_free(ix, u);
        return NULL;
    }
    u->nhold = u->hold_cap = x->nhold;
    for (size_t i = 0; i < x->nhold; i++) {
        memset(&u->hold[i], 0, sizeof(hold_t));
        u->hold[i].time = x->hold[i].time;
        u->hold[i].backend = x->hold[i].backend;
        u->hold[i].nkids = 1;
    }
    ix->slots[tab_pos(ix, x)] = u;   /* same key: same parent, same first hash */
    memmove(x->hash, x->hash + j, (x->nblocks - j) * sizeof(uint64_t));
    x->nblocks -= (uint32_t)j;
    x->depth += (uint32_t)j;
    x->parent = u;
    tab_put(ix, x);
    return u;
}

/* Drops the last m (< nblocks) blocks of b's leaf holding of x. Cannot fail. */
static void hold_trim(pcr_index_t *ix, rnode_t *x, unsigned b, size_t m)
{
    if (x->nhold == 1) {
        /* b alone holds x and has no child there, so x has no child at all: shrink in place. */
        x->nblocks -= (uint32_t)m;
        ix->be[b].blocks -= m;
        ix->pairs -= m;
        return;
    }
    if (tab_reserve(ix, 1) == 0)
        (void)node_split(ix, x, x->nblocks - m);
    hold_remove(ix, x, b, 1);  /* after a failed split this forgets the whole node: safe */
}

static size_t run_common(const rnode_t *x, const uint64_t *key, size_t n)
{
    size_t lim = x->nblocks < n ? x->nblocks : n, j = 0;
    while (j < lim && x->hash[j] == key[j])
        j++;
    return j;
}

/* ---- eviction ----------------------------------------------------------------------------- */

/* Both evictions count the (block, backend) pairs they drop, from the pair count itself: a
 * trim whose split found no memory drops a whole node, and that counts too. */
static void evict_backend(pcr_index_t *ix, unsigned b, uint64_t target)
{
    rbackend_t *be = &ix->be[b];
    uint64_t before = ix->pairs;
    while (be->blocks > target && be->head != NULL) {
        rnode_t *x = be->head;
        uint64_t need = be->blocks - target;
        if (need >= x->nblocks)
            hold_remove(ix, x, b, 1);
        else
            hold_trim(ix, x, b, (size_t)need);
    }
    ix->evictions += before - ix->pairs;
}

/* The memory cap: whole leaf holdings, the oldest across all backends (ties: lowest index).
 * O(backends) per eviction, which only happens at the cap. */
static void evict_global(pcr_index_t *ix)
{
    uint64_t before = ix->pairs;
    while (ix->max_bytes && ix->bytes > ix->max_bytes && ix->pairs > 0) {
        unsigned best = 0;
        uint64_t best_t = UINT64_MAX;
        int found = 0;
        for (unsigned b = 0; b < ix->nb; b++) {
            rnode_t *x = ix->be[b].head;
            if (x == NULL)
                continue;
            uint64_t t = pcr_radix_hold(x, b)->time;
            if (!found || t < best_t) {
                best = b;
                best_t = t;
                found = 1;
            }
        }
        hold_remove(ix, ix->be[best].head, best, 1);
    }
    ix->evictions += before - ix->pairs;
}

/* ---- public API --------------------------------------------------------------------------- */

pcr_index_t *pcr_index_new(const pcr_index_opts_t *opts)
{
    pcr_index_allocator_t a = {default_malloc, default_free, NULL};
    if (opts == NULL || opts->nbackends < 1 || opts->nbackends > PCR_INDEX_MAX_BACKENDS)
        return NULL;
    if (opts->alloc != NULL) {
        if (opts->alloc->malloc_fn == NULL || opts->alloc->free_fn == NULL)
            return NULL;
        a = *opts->alloc;
    }
    pcr_index_t *ix = a.malloc_fn(sizeof(*ix), a.ud);
    if (ix == NULL)
        return NULL;
    memset(ix, 0, sizeof(*ix));
    ix->a = a;
    ix->bytes = sizeof(*ix);
    ix->max_bytes = opts->max_bytes;
    ix->nb = opts->nbackends;
    if ((ix->be = ix_alloc(ix, ix->nb * sizeof(rbackend_t))) == NULL ||
        (ix->root = ix_alloc(ix, pcr_radix_node_size(0))) == NULL ||
        (ix->slots = ix_alloc(ix, TABLE_MIN * sizeof(rnode_t *))) == NULL) {
        pcr_index_free(ix);
        return NULL;
    }
    memset(ix->be, 0, ix->nb * sizeof(rbackend_t));
    for (size_t b = 0; b < ix->nb; b++)
        ix->be[b].capacity = PCR_INDEX_UNLIMITED;
    memset(ix->root, 0, sizeof(rnode_t));
    memset(ix->slots, 0, TABLE_MIN * sizeof(rnode_t *));
    ix->mask = TABLE_MIN - 1;
    return ix;
}

void pcr_index_set_max_bytes(pcr_index_t *ix, size_t max_bytes)
{
    if (ix == NULL)
        return;
    ix->max_bytes = max_bytes;
    evict_global(ix);
}

int pcr_index_grow(pcr_index_t *ix, size_t nbackends)
{
    if (ix == NULL || nbackends > PCR_INDEX_MAX_BACKENDS)
        return PCR_ERR_INVAL;
    if (nbackends <= ix->nb)
        return 0;
    rbackend_t *nbe = ix_alloc(ix, nbackends * sizeof(*nbe));
    if (nbe == NULL)
        return PCR_ERR_NOMEM;
    memcpy(nbe, ix->be, ix->nb * sizeof(*nbe));
    for (size_t b = ix->nb; b < nbackends; b++)
        nbe[b] = (rbackend_t){NULL, NULL, 0, PCR_INDEX_UNLIMITED};
    ix_free(ix, ix->be, ix->nb * sizeof(*ix->be));
    ix->be = nbe;
    ix->nb = nbackends;
    return 0;
}

void pcr_index_free(pcr_index_t *ix)
{
    if (ix == NULL)
        return;
    if (ix->slots != NULL && ix->mask != 0) {
        for (size_t i = 0; i <= ix->mask; i++)
            if (ix->slots[i] != NULL)
                node_free(ix, ix->slots[i]);
    }
    if (ix->slots != NULL)
        ix_free(ix, ix->slots, (ix->mask + 1) * sizeof(rnode_t *));
    if (ix->root != NULL)
        ix_free(ix, ix->root, pcr_radix_node_size(0));
    if (ix->be != NULL)
        ix_free(ix, ix->be, ix->nb * sizeof(rbackend_t));
    pcr_index_allocator_t a = ix->a;
    a.free_fn(ix, sizeof(*ix), a.ud);
}

int pcr_index_set_capacity(pcr_index_t *ix, unsigned backend, uint64_t blocks)
{
    if (ix == NULL || backend >= ix->nb)
        return PCR_ERR_INVAL;
    ix->be[backend].capacity = blocks;
    evict_backend(ix, backend, blocks);
    return 0;
}

int pcr_index_insert(pcr_index_t *ix, unsigned b, const uint64_t *blocks, size_t n,
                     uint64_t now, size_t *added_from)
{
    size_t from = n, i = 0;
    rnode_t *node;
    int rc = 0;

    if (added_from != NULL)
        *added_from = n;
    if (ix == NULL || b >= ix->nb || (blocks == NULL && n > 0) || n > UINT32_MAX)
        return PCR_ERR_INVAL;
    node = ix->root;
    while (i < n) {
        if (tab_reserve(ix, 2) != 0) {
            rc = PCR_ERR_NOMEM;
            break;
        }
        rnode_t *c = pcr_radix_find(ix, node, blocks[i]);
        if (c == NULL) {
            rnode_t *x = node_new(ix, node, blocks + i, n - i, i);
            if (x == NULL || hold_reserve(ix, x) != 0) {
                if (x != NULL)
                    node_free(ix, x);
                rc = PCR_ERR_NOMEM;
                break;
            }
            tab_put(ix, x);
            hold_add(ix, x, b, now);
            if (from > i)
                from = i;
            break;
        }
        size_t j = run_common(c, blocks + i, n - i);
        if (j < c->nblocks && (c = node_split(ix, c, j)) == NULL) {
            rc = PCR_ERR_NOMEM;
            break;
        }
        hold_t *h = pcr_radix_hold(c, b);
        if (h == NULL) {
            if (hold_reserve(ix, c) != 0) {
                rc = PCR_ERR_NOMEM;
                break;
            }
            hold_add(ix, c, b, now);
            if (from > i)
                from = i;
        } else {
            h->time = now;
            if (h->nkids == 0) {
                lru_unlink(ix, b, h);
                lru_insert(ix, b, c, h, 0);
            }
        }
        i += c->nblocks;
        node = c;
    }
    if (added_from != NULL)
        *added_from = from;
    evict_backend(ix, b, ix->be[b].capacity);
    evict_global(ix);
    return rc;
}

size_t pcr_index_match(const pcr_index_t *ix, const uint64_t *blocks, size_t n,
                       uint32_t *matched)
{
    const rnode_t *node;
    size_t i = 0, best = 0;

    if (ix == NULL || matched == NULL)
        return 0;
    memset(matched, 0, ix->nb * sizeof(*matched));
    if (blocks == NULL)
        return 0;
    node = ix->root;
    while (i < n) {
        const rnode_t *c = pcr_radix_find(ix, node, blocks[i]);
        if (c == NULL)
            break;
        size_t j = run_common(c, blocks + i, n - i);
        best = i + j;
        for (size_t k = 0; k < c->nhold; k++)
            matched[c->hold[k].backend] = (uint32_t)best;
        if (j < c->nblocks)
            break;
        i = best;
        node = c;
    }
    return best;
}

void pcr_index_erase(pcr_index_t *ix, unsigned b, const uint64_t *blocks, size_t n,
                     size_t from)
{
    rnode_t *x;
    size_t i = 0;

    if (ix == NULL || b >= ix->nb || blocks == NULL || from >= n)
        return;
    /* Down to the deepest node on the path. */
    x = ix->root;
    while (i < n) {
        rnode_t *c = pcr_radix_find(ix, x, blocks[i]);
        if (c == NULL)
            break;
        size_t j = run_common(c, blocks + i, n - i);
        if (j < c->nblocks) {
            /* The path ends inside c: if b holds c it holds blocks below the path's end,
             * which need every block of the path. */
            if (pcr_radix_hold(c, b) != NULL)
                return;
            break;
        }
        i += j;
        x = c;
    }
    /* Up again, dropping b's leaf holdings until `from` or a block b still needs. */
    while (x != ix->root && x->depth + x->nblocks > from) {
        rnode_t *p = x->parent;
        hold_t *h = pcr_radix_hold(x, b);
        if (h != NULL) {
            if (h->nkids > 0)
                return;
            if (x->depth >= from) {
                hold_remove(ix, x, b, 1);
            } else {
                hold_trim(ix, x, b, x->depth + x->nblocks - from);
                return;
            }
        }
        x = p;
    }
}

uint64_t pcr_index_last_use(const pcr_index_t *ix, unsigned b, const uint64_t *blocks,
                            size_t n)
{
    const rnode_t *node;
    size_t i = 0;

    if (ix == NULL || b >= ix->nb || blocks == NULL || n == 0)
        return 0;
    node = ix->root;
    while (i < n) {
        const rnode_t *c = pcr_radix_find(ix, node, blocks[i]);
        if (c == NULL)
            return 0;
        size_t j = run_common(c, blocks + i, n - i);
        const hold_t *h = pcr_radix_hold(c, b);
        if (h == NULL || (j < c->nblocks && i + j < n))
            return 0;   /* b does not hold it, or the path leaves the tree inside c */
        if (i + j == n)
            return h->time;
        i += j;
        node = c;
    }
    return 0;
}

uint64_t pcr_index_evict_older(pcr_index_t *ix, unsigned b, uint64_t time)
{
    if (ix == NULL || b >= ix->nb)
        return 0;
    uint64_t before = ix->be[b].blocks;
    /* The leaf list is sorted by time and a parent is never older than its children, so the
     * head is always the oldest block left; a parent that becomes a leaf goes to its sorted
     * place and is met again here if it is old enough. */
    while (ix->be[b].head != NULL && pcr_radix_hold(ix->be[b].head, b)->time <= time)
        hold_remove(ix, ix->be[b].head, b, 1);
    return before - ix->be[b].blocks;
}

void pcr_index_remove_backend(pcr_index_t *ix, unsigned b)
{
    if (ix == NULL || b >= ix->nb)
        return;
    /* Order does not matter here: a parent that becomes a leaf goes to the head, next. */
    while (ix->be[b].head != NULL)
        hold_remove(ix, ix->be[b].head, b, 0);
}

uint64_t pcr_index_backend_blocks(const pcr_index_t *ix, unsigned b)
{
    return ix != NULL && b < ix->nb ? ix->be[b].blocks : 0;
}

uint64_t pcr_index_pairs(const pcr_index_t *ix)
{
    return ix != NULL ? ix->pairs : 0;
}

uint64_t pcr_index_evictions(const pcr_index_t *ix)
{
    return ix != NULL ? ix->evictions : 0;
}

uint64_t pcr_index_nodes(const pcr_index_t *ix)
{
    return ix != NULL ? ix->count : 0;
}

size_t pcr_index_bytes(const pcr_index_t *ix)
{
    return ix != NULL ? ix->bytes : 0;
}
