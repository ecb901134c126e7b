/* radix_ref.c: the naive reference model of the prefix index (radix_ref.h). */
#include <string.h>

#include "radix_ref.h"

void radix_ref_init(radix_ref_t *m, size_t nb)
{
    m->n = 0;
    m->nb = nb;
    m->full = 0;
    for (size_t b = 0; b < RADIX_REF_MAXB; b++)
        m->cap[b] = PCR_INDEX_UNLIMITED;
}

int radix_ref_find(const radix_ref_t *m, unsigned b, const uint64_t *seq, size_t len)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->r[i].b == b && m->r[i].len == len &&
            memcmp(m->r[i].seq, seq, len * sizeof(uint64_t)) == 0)
            return (int)i;
    return -1;
}

static int has_child(const radix_ref_t *m, const radix_ref_rec_t *e)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->r[i].b == e->b && m->r[i].len == e->len + 1 &&
            memcmp(m->r[i].seq, e->seq, e->len * sizeof(uint64_t)) == 0)
            return 1;
    return 0;
}

uint64_t radix_ref_count(const radix_ref_t *m, unsigned b)
{
    uint64_t c = 0;
    for (size_t i = 0; i < m->n; i++)
        c += m->r[i].b == b;
    return c;
}

static void drop(radix_ref_t *m, size_t i)
{
    m->r[i] = m->r[--m->n];
}

void radix_ref_evict(radix_ref_t *m, unsigned b)
{
    while (radix_ref_count(m, b) > m->cap[b]) {
        int best = -1;
        for (size_t i = 0; i < m->n; i++)
            if (m->r[i].b == b && !has_child(m, &m->r[i]) &&
                (best < 0 || m->r[i].time < m->r[best].time))
                best = (int)i;
        drop(m, (size_t)best);
    }
}

void radix_ref_set_capacity(radix_ref_t *m, unsigned b, uint64_t cap)
{
    m->cap[b] = cap;
    radix_ref_evict(m, b);
}

size_t radix_ref_insert(radix_ref_t *m, unsigned b, const uint64_t *k, size_t n, uint64_t now)
{
    size_t from = n;
    for (size_t i = 0; i < n; i++) {
        int at = radix_ref_find(m, b, k, i + 1);
        if (at < 0) {
            if (m->n == RADIX_REF_MAX) {
                m->full = 1;
                return from;
            }
            at = (int)m->n++;
            m->r[at].b = b;
            m->r[at].len = i + 1;
            memcpy(m->r[at].seq, k, (i + 1) * sizeof(uint64_t));
            if (from > i)
                from = i;
        }
        m->r[at].time = now;
    }
    radix_ref_evict(m, b);
    return from;
}

void radix_ref_erase(radix_ref_t *m, unsigned b, const uint64_t *k, size_t n, size_t from)
{
    for (size_t i = n; i-- > from;) {
        int at = radix_ref_find(m, b, k, i + 1);
        if (at < 0)
            continue;
        if (has_child(m, &m->r[at]))
            return;
        drop(m, (size_t)at);
    }
}

void radix_ref_remove(radix_ref_t *m, unsigned b)
{
    for (size_t i = m->n; i-- > 0;)
        if (m->r[i].b == b)
            drop(m, i);
}

void radix_ref_match(const radix_ref_t *m, const uint64_t *k, size_t n, uint32_t *out)
{
    for (unsigned b = 0; b < m->nb; b++) {
        out[b] = 0;
        for (size_t i = 1; i <= n; i++)
            if (radix_ref_find(m, b, k, i) >= 0)
                out[b] = (uint32_t)i;
    }
}

int radix_ref_same(const pcr_index_t *ix, const radix_ref_t *m)
{
    uint32_t got[RADIX_REF_MAXB];
    for (unsigned b = 0; b < m->nb; b++)
        if (pcr_index_backend_blocks(ix, b) != radix_ref_count(m, b))
            return 0;
    for (size_t i = 0; i < m->n; i++) {
        pcr_index_match(ix, m->r[i].seq, m->r[i].len, got);
        if (got[m->r[i].b] < m->r[i].len)
            return 0;
    }
    return 1;
}

uint64_t radix_ref_last_use(const radix_ref_t *m, unsigned b, const uint64_t *k, size_t n)
{
    int at = n > 0 ? radix_ref_find(m, b, k, n) : -1;
    return at >= 0 ? m->r[at].time : 0;
}

uint64_t radix_ref_evict_older(radix_ref_t *m, unsigned b, uint64_t time)
{
    uint64_t dropped = 0;
    for (int again = 1; again;) {
        again = 0;
        for (size_t i = m->n; i-- > 0;) {
            if (m->r[i].b == b && m->r[i].time <= time && !has_child(m, &m->r[i])) {
                drop(m, i);
                dropped++;
                again = 1;
            }
        }
    }
    return dropped;
}
