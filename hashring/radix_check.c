/* hashring/radix_check.c: pcr_index_check(), every invariant of the radix index, in O(size).
 * Tests call it after each operation (and after each injected allocation failure); the
 * router never does. It allocates its own scratch with calloc, not with the index's allocator,
 * so a failing test allocator does not disturb it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "radix_int.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return PCR_ERR_INVAL;
}

static int check_node(const pcr_index_t *ix, const rnode_t *x, char *err, size_t errlen)
{
    const rnode_t *p = x->parent;
    if (x->nblocks == 0 || x->nblocks > x->cap)
        return fail(err, errlen, "node %p: run of %u blocks, cap %u", (void *)x, x->nblocks, x->cap);
    if (x->nhold == 0 || x->nhold > x->hold_cap)
        return fail(err, errlen, "node %p: %u holders, room %u", (void *)x, x->nhold, x->hold_cap);
    if (pcr_radix_find(ix, p, x->hash[0]) != x)
        return fail(err, errlen, "node %p: not found under its key", (void *)x);
    if (p != ix->root && pcr_radix_find(ix, p->parent, p->hash[0]) != p)
        return fail(err, errlen, "node %p: parent not in the tree", (void *)x);
    if (x->depth != p->depth + p->nblocks)
        return fail(err, errlen, "node %p: depth %u, parent ends at %u", (void *)x, x->depth,
                    p->depth + p->nblocks);
    for (size_t i = 0; i < x->nhold; i++) {
        const hold_t *h = &x->hold[i];
        if (h->backend >= ix->nb || (i > 0 && x->hold[i - 1].backend >= h->backend))
            return fail(err, errlen, "node %p: holders unsorted or out of range", (void *)x);
        if (p != ix->root) {
            hold_t *hp = pcr_radix_hold(p, h->backend);
            if (hp == NULL)
                return fail(err, errlen, "node %p: backend %u holds it but not its parent",
                            (void *)x, h->backend);
            hp->scratch++;
        }
    }
    return 0;
}

static int check_lists(const pcr_index_t *ix, const uint64_t *leaves, char *err, size_t errlen)
{
    for (unsigned b = 0; b < ix->nb; b++) {
        const rnode_t *prev = NULL;
        uint64_t n = 0, t = 0;
        for (const rnode_t *x = ix->be[b].head; x != NULL; ) {
            const hold_t *h = pcr_radix_hold(x, b);
            if (h == NULL || h->nkids != 0 || h->prev != prev)
                return fail(err, errlen, "backend %u: leaf list broken at %p", b, (void *)x);
            if (n > 0 && h->time < t)
                return fail(err, errlen, "backend %u: leaf list out of time order", b);
            t = h->time;
            if (++n > leaves[b])
                return fail(err, errlen, "backend %u: leaf list longer than its leaves", b);
            prev = x;
            x = h->next;
        }
        if (ix->be[b].tail != prev || n != leaves[b])
            return fail(err, errlen, "backend %u: %llu listed, %llu leaves", b,
                        (unsigned long long)n, (unsigned long long)leaves[b]);
    }
    return 0;
}

int pcr_index_check(pcr_index_t *ix, char *err, size_t errlen)
{
    uint64_t *blocks = NULL, *leaves = NULL, pairs = 0, nodes = 0;
    size_t bytes = sizeof(*ix) + ix->nb * sizeof(rbackend_t) + pcr_radix_node_size(0) +
                   (ix->mask + 1) * sizeof(rnode_t *);
    int rc = 0;

    blocks = calloc(ix->nb, sizeof(*blocks));
    leaves = calloc(ix->nb, sizeof(*leaves));
    if (blocks == NULL || leaves == NULL) {
        rc = fail(err, errlen, "out of memory while checking");
        goto out;
    }
    for (size_t i = 0; i <= ix->mask; i++)
        if (ix->slots[i] != NULL)
            for (size_t k = 0; k < ix->slots[i]->nhold; k++)
                ix->slots[i]->hold[k].scratch = 0;
    for (size_t i = 0; i <= ix->mask && rc == 0; i++) {
        const rnode_t *x = ix->slots[i];
        if (x == NULL)
            continue;
        nodes++;
        bytes += pcr_radix_node_size(x->cap) + x->hold_cap * sizeof(hold_t);
        rc = check_node(ix, x, err, errlen);
    }
    for (size_t i = 0; i <= ix->mask && rc == 0; i++) {
        const rnode_t *x = ix->slots[i];
        for (size_t k = 0; x != NULL && k < x->nhold; k++) {
            const hold_t *h = &x->hold[k];
            if (h->scratch != (uint16_t)h->nkids) {
                rc = fail(err, errlen, "node %p backend %u: nkids %u, counted %u", (void *)x,
                          h->backend, h->nkids, h->scratch);
                break;
            }
            if (h->nkids == 0)
                leaves[h->backend]++;
            blocks[h->backend] += x->nblocks;
            pairs += x->nblocks;
        }
    }
    if (rc != 0)
        goto out;
    if (nodes != ix->count)
        rc = fail(err, errlen, "%llu nodes in the table, count says %zu",
                  (unsigned long long)nodes, ix->count);
    else if (pairs != ix->pairs)
        rc = fail(err, errlen, "%llu pairs, counter says %llu", (unsigned long long)pairs,
                  (unsigned long long)ix->pairs);
    else if (bytes != ix->bytes)
        rc = fail(err, errlen, "%zu bytes allocated, counter says %zu", bytes, ix->bytes);
    else if (ix->count * 4 > (ix->mask + 1) * 3)
        rc = fail(err, errlen, "table over its load limit");
    for (unsigned b = 0; b < ix->nb && rc == 0; b++) {
        if (blocks[b] != ix->be[b].blocks)
            rc = fail(err, errlen, "backend %u: %llu blocks, counter says %llu", b,
                      (unsigned long long)blocks[b], (unsigned long long)ix->be[b].blocks);
        else if (blocks[b] > ix->be[b].capacity)
            rc = fail(err, errlen, "backend %u: %llu blocks over capacity %llu", b,
                      (unsigned long long)blocks[b], (unsigned long long)ix->be[b].capacity);
    }
    if (rc == 0)
        rc = check_lists(ix, leaves, err, errlen);
out:
    free(blocks);
    free(leaves);
    return rc;
}
