/* router/body/budget.h: the request-body budget, shared by every worker. Two counts: the bytes
 * sessions have reserved (what clients were allowed to send beyond each connection's allowance),
 * bounded by limits.max_buffered_body_bytes; and the bytes of request bodies actually held
 * (exchange.c counts them, for the gauge and the allocator trim). The sessions (h1_server.c,
 * h2_server.c) reserve before they let a client send more of a body (HTTP/2 window, HTTP/1.1
 * read), wait when the budget is taken, and give their reservation back as bodies are freed. */
#ifndef PCR_ROUTER_BUDGET_H
#define PCR_ROUTER_BUDGET_H

#include <stddef.h>
#include <sys/queue.h>

#include "server.h"

/* Each client connection may hold this much request body without a reservation: HTTP/2's
 * connection window before any WINDOW_UPDATE (RFC 9113, 6.9.2: it cannot be made smaller), and
 * as much for HTTP/1.1. So a small body (most prompts) never waits for the budget, even while
 * uploads hold all of it; the memory bound is the budget plus this per connection. */
#define PCR_BODY_ALLOWANCE 65535

/* A session waiting for request-body budget: `resume` runs from its worker's loop once some was
 * released (it may find the budget taken again and wait anew). `shed` runs from the worker's
 * tick while the memory account refuses requests (pcr/overload.h): the session answers 503 to
 * its requests that wait (all but the one allowed past the budget, pcr_budget_exempt), which
 * frees the body bytes each holds within its connection's allowance, and waits anew only for
 * what is left. Without it such a request kept its bytes until timeouts.client_idle_ms, up to
 * PCR_BODY_ALLOWANCE per connection whatever the limit. */
typedef struct pcr_budget_waiter {
    TAILQ_ENTRY(pcr_budget_waiter) link;
    void (*resume)(struct pcr_budget_waiter *w);
    void (*shed)(struct pcr_budget_waiter *w);
    int queued;
} pcr_budget_waiter_t;

/* The worker's waiters and the event that wakes them (its thread). init: 0 or PCR_ERR_NOMEM. */
int pcr_budget_init(pcr_worker_t *w);
void pcr_budget_dispose(pcr_worker_t *w);
/* From the worker's tick: budget that other workers released wakes this one's waiters; while
 * the memory account refuses requests, every waiter is shed instead (`shed` above). */
void pcr_budget_tick(pcr_worker_t *w);

/* The control thread, at each of its ticks: once the bodies held have fallen to a quarter of
 * their peak since the last look (a flood that ended), the allocator's free pages go back to
 * the system (malloc_trim). Without it a process that once held a flood keeps its RSS, free
 * memory the allocator keeps in every worker's arena. Returns 1 when it trimmed. */
int pcr_budget_trim(pcr_server_t *srv);

/* Whether anything may be reserved: less than limits.max_buffered_body_bytes is, and the memory
 * account's shrink_windows action (pcr/overload.h) is off; while it is on, only the request
 * allowed past the budget gets more. */
int pcr_budget_ok(const pcr_worker_t *w);
/* Reserves `n` bytes for the body of request `req` (an exchange); 1 when reserved. Within the
 * budget any request may. Past it, one request at a time in the process still may (the first
 * to ask, until it is freed, with its body): a budget filled by partial bodies, none
 * of which could complete, would otherwise stall every upload until each timed out. That
 * reserve is at most one limits.max_body_bytes (and its connection's windows). Returns 1 when
 * reserved within the budget, 2 when past it (`req` is the request allowed), 0 when not. */
int pcr_budget_reserve(pcr_worker_t *w, const void *req, size_t n);
/* Reserves `n` bytes whatever the budget: bytes a client may send on a window that must be
 * given back for the connection to go on (bounded by the caller). */
void pcr_budget_force(pcr_worker_t *w, size_t n);
/* Gives back `n` reserved bytes; this worker's waiters hear of it now, the others' at their tick. */
void pcr_budget_release(pcr_worker_t *w, size_t n);
/* Whether `req` is the request allowed past the budget now. */
int pcr_budget_exempt(const pcr_worker_t *w, const void *req);
/* `req` is being freed: it stops being the request allowed past the budget. */
void pcr_budget_forget(pcr_worker_t *w, const void *req);
/* Bytes of body held (delta > 0) or released (< 0) by this worker's requests. */
void pcr_budget_account(pcr_worker_t *w, ptrdiff_t delta);
void pcr_budget_wait(pcr_worker_t *w, pcr_budget_waiter_t *bw);
void pcr_budget_unwait(pcr_worker_t *w, pcr_budget_waiter_t *bw);

#endif
