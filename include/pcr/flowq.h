/* pcr/flowq.h: the queue requests wait in while the pool is saturated (flow control):
 * strict priority bands, and within a band the tenants take turns by tokens served.
 *
 * The order is virtual-token-counter fairness (Sheng et al., "Fairness in Serving Large
 * Language Models", OSDI 2024): each tenant has a counter of the tokens it was served divided
 * by its weight (an output token counting `output_weight` prompt tokens); the next request is
 * the oldest of the backlogged tenant with the lowest counter in the highest non-empty band.
 * A tenant that was idle is lifted to the lowest counter of its band's backlogged tenants when
 * it queues again, so that idling earns no credit to flood with later. Priority is strict: a
 * lower band waits while a higher one has anything.
 *
 * Entries are the caller's (embedded in its request), so queueing never allocates: memory is
 * the caller's requests, bounded per tenant by `max_requests` and `max_bytes` (a full queue
 * refuses). Each entry waits at most `ttl`. Pure: no I/O, no clock (`now` is passed in), no
 * threads; one queue per thread. Implemented in hashring/flowq.c. */
#ifndef PCR_FLOWQ_H
#define PCR_FLOWQ_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/common.h"

typedef struct {
    int priority;              /* higher first; negative is sheddable (the router's rule) */
    double weight;             /* its share within its band, > 0 */
} pcr_flow_tenant_t;

typedef struct {
    size_t max_requests;       /* waiting per tenant; 0 = none may wait */
    uint64_t max_bytes;        /* waiting per tenant, the callers' byte counts */
    uint64_t ttl;              /* longest wait, in `now` units */
    double output_weight;      /* an output token in the counters, in prompt tokens (VTC: 2) */
} pcr_flowq_opts_t;

/* One waiting request, inside the caller's own object: zeroed before its first push. Its
 * fields are the queue's. */
typedef struct pcr_flowq_entry {
    struct pcr_flowq_entry *prev, *next;
    uint64_t since;            /* when it was queued */
    uint64_t bytes;
    unsigned tenant;
    int queued;
} pcr_flowq_entry_t;

typedef struct pcr_flowq pcr_flowq_t;

/* NULL when out of memory or an argument is invalid (a weight <= 0). _free(NULL) is a no-op;
 * entries still queued are simply forgotten (they are the caller's). */
pcr_flowq_t *pcr_flowq_new(const pcr_flowq_opts_t *opts, const pcr_flow_tenant_t *tenants,
                           size_t n);
void pcr_flowq_free(pcr_flowq_t *q);

/* A reload: new options and tenants (same count and order; the router makes a new queue when
 * the tenants themselves change). Counters are kept. 0 or PCR_ERR_INVAL. */
int pcr_flowq_tune(pcr_flowq_t *q, const pcr_flowq_opts_t *opts, const pcr_flow_tenant_t *tenants,
                   size_t n);

/* Queues `e` for `tenant`: 0, PCR_ERR_FULL (the tenant's queue is at a bound: not queued),
 * PCR_ERR_INVAL (tenant out of range, or `e` queued already). */
int pcr_flowq_push(pcr_flowq_t *q, pcr_flowq_entry_t *e, unsigned tenant, uint64_t bytes,
                   uint64_t now);
/* Takes `e` out (its client left, or it was sent some other way). A no-op when not queued. */
void pcr_flowq_remove(pcr_flowq_t *q, pcr_flowq_entry_t *e);
/* The next entry to send, taken out; NULL when nothing waits. */
pcr_flowq_entry_t *pcr_flowq_pop(pcr_flowq_t *q);
/* The entry pcr_flowq_pop would take, left queued; NULL when nothing waits. */
pcr_flowq_entry_t *pcr_flowq_peek(const pcr_flowq_t *q);
/* The oldest entry whose wait passed the TTL at `now`, taken out; NULL when none. Call until
 * NULL (each gets its 429). */
pcr_flowq_entry_t *pcr_flowq_expired(pcr_flowq_t *q, uint64_t now);

/* What a tenant's request was served: its counter grows by (prompt + output_weight x output)
 * / weight. The router charges the prompt when it sends the request (so that a burst of sends
 * sees it at once) and the output as it comes or at the end. */
void pcr_flowq_served(pcr_flowq_t *q, unsigned tenant, uint64_t prompt_tokens,
                      uint64_t output_tokens);

/* Counts, for /metrics and the tests. */
size_t pcr_flowq_waiting(const pcr_flowq_t *q, unsigned tenant);
uint64_t pcr_flowq_waiting_bytes(const pcr_flowq_t *q, unsigned tenant);
size_t pcr_flowq_total(const pcr_flowq_t *q);
double pcr_flowq_counter(const pcr_flowq_t *q, unsigned tenant);

#endif
