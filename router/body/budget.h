/* router/body/budget.h: the request-body budget, shared by every worker: the bytes of request
 * bodies held in memory in the process, against limits.max_buffered_body_bytes, and each worker's
 * sessions waiting for some of it to be released. The sessions (h1_server.c, h2_server.c) ask
 * before they read more of a body; the exchange counts what it holds (exchange.c). */
#ifndef PCR_ROUTER_BUDGET_H
#define PCR_ROUTER_BUDGET_H

#include <stddef.h>
#include <sys/queue.h>

#include "server.h"

/* Every request may buffer this much of its body whatever the budget: an HTTP/2 stream's
 * initial window, and as much for an HTTP/1.1 request, so that uploads holding the budget
 * cannot stall the small requests (most prompts) of other clients. */
#define PCR_BODY_FREE_BYTES (1024 * 1024)

/* A session waiting for request-body budget: `resume` runs from its worker's loop once some was
 * released (it may find the budget taken again and wait anew). */
typedef struct pcr_budget_waiter {
    TAILQ_ENTRY(pcr_budget_waiter) link;
    void (*resume)(struct pcr_budget_waiter *w);
    int queued;
} pcr_budget_waiter_t;

/* The worker's waiters and the event that wakes them (its thread). init: 0 or PCR_ERR_NOMEM. */
int pcr_budget_init(pcr_worker_t *w);
void pcr_budget_dispose(pcr_worker_t *w);
/* From the worker's tick: budget that other workers released wakes this one's waiters. */
void pcr_budget_tick(pcr_worker_t *w);

/* The control thread, at each of its ticks: once the bodies held have fallen to a quarter of
 * their peak since the last look (a flood that ended), the allocator's free pages go back to
 * the system (malloc_trim). Without it a process that once held a flood keeps its RSS, free
 * memory the allocator keeps in every worker's arena. Returns 1 when it trimmed. */
int pcr_budget_trim(pcr_server_t *srv);

/* Whether request bodies may grow: less than limits.max_buffered_body_bytes is held. */
int pcr_budget_ok(const pcr_worker_t *w);
/* Whether the body of request `req` (an exchange) may grow. Under the budget, any may. Past
 * it, one request at a time in the process still may (the first to ask, until it is freed): a
 * budget filled by partial bodies, none of which could complete, would otherwise stall every
 * upload until each timed out. The overshoot is at most one limits.max_body_bytes. */
int pcr_budget_may_grow(pcr_worker_t *w, const void *req);
/* `req` is being freed: it stops being the request allowed past the budget. */
void pcr_budget_forget(pcr_worker_t *w, const void *req);
/* Bytes of body held (delta > 0) or released (< 0) by this worker's requests. */
void pcr_budget_account(pcr_worker_t *w, ptrdiff_t delta);
void pcr_budget_wait(pcr_worker_t *w, pcr_budget_waiter_t *bw);
void pcr_budget_unwait(pcr_worker_t *w, pcr_budget_waiter_t *bw);

#endif
