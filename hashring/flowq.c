/* hashring/flowq.c: the flow-control queue (include/pcr/flowq.h). One FIFO per tenant (a
 * doubly linked list through the caller's entries) with its counter; choosing scans the
 * tenants, whose number is the config's (a few to a few hundred), so no heap is kept. */
#include <stdlib.h>

#include "pcr/flowq.h"

typedef struct {
    pcr_flowq_entry_t *head, *tail;
    size_t n;
    uint64_t bytes;
    double counter;            /* tokens served / weight */
    int priority;
    double weight;
} tq_t;

struct pcr_flowq {
    pcr_flowq_opts_t o;
    tq_t *t;
    size_t n, total;
};

static int tenants_valid(const pcr_flow_tenant_t *tenants, size_t n)
{
    if (n > 0 && tenants == NULL)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(tenants[i].weight > 0))
            return 0;
    return 1;
}

pcr_flowq_t *pcr_flowq_new(const pcr_flowq_opts_t *o, const pcr_flow_tenant_t *tenants, size_t n)
{
    if (o == NULL || !(o->output_weight >= 0) || !tenants_valid(tenants, n))
        return NULL;
    pcr_flowq_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    q->t = calloc(n ? n : 1, sizeof(*q->t));
    if (q->t == NULL) {
        free(q);
        return NULL;
    }
    q->o = *o;
    q->n = n;
    for (size_t i = 0; i < n; i++) {
        q->t[i].priority = tenants[i].priority;
        q->t[i].weight = tenants[i].weight;
    }
    return q;
}

void pcr_flowq_free(pcr_flowq_t *q)
{
    if (q == NULL)
        return;
    free(q->t);
    free(q);
}

int pcr_flowq_tune(pcr_flowq_t *q, const pcr_flowq_opts_t *o, const pcr_flow_tenant_t *tenants,
                   size_t n)
{
    if (q == NULL || o == NULL || n != q->n || !(o->output_weight >= 0) ||
        !tenants_valid(tenants, n))
        return PCR_ERR_INVAL;
    q->o = *o;
    for (size_t i = 0; i < n; i++) {
        q->t[i].priority = tenants[i].priority;
        q->t[i].weight = tenants[i].weight;
    }
    return 0;
}

/* The lowest counter of the backlogged tenants of `priority` other than `skip`; -1 if none. */
static double band_floor(const pcr_flowq_t *q, int priority, size_t skip)
{
    double lo = -1;
    for (size_t i = 0; i < q->n; i++)
        if (i != skip && q->t[i].n > 0 && q->t[i].priority == priority &&
            (lo < 0 || q->t[i].counter < lo))
            lo = q->t[i].counter;
    return lo;
}

int pcr_flowq_push(pcr_flowq_t *q, pcr_flowq_entry_t *e, unsigned tenant, uint64_t bytes,
                   uint64_t now)
{
    if (q == NULL || e == NULL || tenant >= q->n || e->queued)
        return PCR_ERR_INVAL;
    tq_t *t = &q->t[tenant];
    if (t->n >= q->o.max_requests || bytes > q->o.max_bytes || t->bytes > q->o.max_bytes - bytes)
        return PCR_ERR_FULL;
    if (t->n == 0) {
        /* Back from idle: no credit for the time it did not ask. */
        double lo = band_floor(q, t->priority, tenant);
        if (lo > t->counter)
            t->counter = lo;
    }
    *e = (pcr_flowq_entry_t){t->tail, NULL, now, bytes, tenant, 1};
    if (t->tail)
        t->tail->next = e;
    else
        t->head = e;
    t->tail = e;
    t->n++;
    t->bytes += bytes;
    q->total++;
    return 0;
}

void pcr_flowq_remove(pcr_flowq_t *q, pcr_flowq_entry_t *e)
{
    if (q == NULL || e == NULL || !e->queued || e->tenant >= q->n)
        return;
    tq_t *t = &q->t[e->tenant];
    if (e->prev)
        e->prev->next = e->next;
    else
        t->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        t->tail = e->prev;
    t->n--;
    t->bytes -= e->bytes;
    q->total--;
    e->prev = e->next = NULL;
    e->queued = 0;
}

pcr_flowq_entry_t *pcr_flowq_peek(const pcr_flowq_t *q)
{
    if (q == NULL || q->total == 0)
        return NULL;
    size_t best = q->n;
    for (size_t i = 0; i < q->n; i++) {
        const tq_t *t = &q->t[i];
        if (t->n == 0)
            continue;
        if (best == q->n) {
            best = i;
            continue;
        }
        const tq_t *b = &q->t[best];
        /* Higher band first; then the lower counter; then who waited longest. */
        if (t->priority != b->priority ? t->priority > b->priority
            : t->counter != b->counter ? t->counter < b->counter
                                       : t->head->since < b->head->since)
            best = i;
    }
    return q->t[best].head;
}

pcr_flowq_entry_t *pcr_flowq_pop(pcr_flowq_t *q)
{
    pcr_flowq_entry_t *e = pcr_flowq_peek(q);
    if (e != NULL)
        pcr_flowq_remove(q, e);
    return e;
}

pcr_flowq_entry_t *pcr_flowq_expired(pcr_flowq_t *q, uint64_t now)
{
    if (q == NULL || q->total == 0)
        return NULL;
    pcr_flowq_entry_t *old = NULL;
    for (size_t i = 0; i < q->n; i++) {
        pcr_flowq_entry_t *h = q->t[i].head; /* each FIFO's oldest */
        if (h != NULL && now >= h->since && now - h->since >= q->o.ttl &&
            (old == NULL || h->since < old->since))
            old = h;
    }
    if (old != NULL)
        pcr_flowq_remove(q, old);
    return old;
}

void pcr_flowq_served(pcr_flowq_t *q, unsigned tenant, uint64_t prompt_tokens,
                      uint64_t output_tokens)
{
    if (q == NULL || tenant >= q->n)
        return;
    tq_t *t = &q->t[tenant];
    t->counter += ((double)prompt_tokens + q->o.output_weight * (double)output_tokens) / t->weight;
}

size_t pcr_flowq_waiting(const pcr_flowq_t *q, unsigned tenant)
{
    return q != NULL && tenant < q->n ? q->t[tenant].n : 0;
}

uint64_t pcr_flowq_waiting_bytes(const pcr_flowq_t *q, unsigned tenant)
{
    return q != NULL && tenant < q->n ? q->t[tenant].bytes : 0;
}

size_t pcr_flowq_total(const pcr_flowq_t *q) { return q ? q->total : 0; }

double pcr_flowq_counter(const pcr_flowq_t *q, unsigned tenant)
{
    return q != NULL && tenant < q->n ? q->t[tenant].counter : 0;
}
