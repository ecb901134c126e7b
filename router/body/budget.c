/* router/body/budget.c: owns the request-body budget (budget.h): the atomic counts of the bytes all
 * workers reserved and hold, the one request allowed past the budget, and each worker's queue
 * of sessions waiting for it, woken oldest first from the worker's own loop. */
#include <malloc.h>

#include <event2/event.h>

#include "budget.h"

/* Below this peak a flood is not worth a trim: the allocator keeps small amounts for reuse. */
#define TRIM_MIN_PEAK (16u << 20)

int pcr_budget_trim(pcr_server_t *srv)
{
    /* The control thread's own: the process runs one server. */
    static size_t peak;
    size_t now = PCR_LOAD(srv->body_buffered);
    if (now > peak)
        peak = now;
    if (peak < TRIM_MIN_PEAK || now > peak / 4)
        return 0;
    peak = now;
    /* Every arena, the workers' included (glibc locks each in turn, briefly). */
    malloc_trim(0);
    return 1;
}

int pcr_budget_ok(const pcr_worker_t *w)
{
    return PCR_LOAD(w->srv->body_reserved) < w->cfg->limits.max_buffered_body_bytes &&
           !pcr_mem_action(w->srv, PCR_OVERLOAD_SHRINK_WINDOWS);
}

int pcr_budget_reserve(pcr_worker_t *w, const void *req, size_t n)
{
    size_t max = w->cfg->limits.max_buffered_body_bytes;
    size_t cur = __atomic_load_n(&w->srv->body_reserved, __ATOMIC_RELAXED);
    /* The memory account near its limit (pcr/overload.h): only the one request allowed past
     * the budget may grow its body, so the clients' windows stay shut. */
    if (n <= max && cur <= max - n && pcr_mem_action_fresh(w->srv, PCR_OVERLOAD_SHRINK_WINDOWS)) {
        PCR_INC(w->metrics.overload_refusals[PCR_OVERLOAD_SHRINK_WINDOWS]);
        max = 0;
    }
    while (n <= max && cur <= max - n)
        if (__atomic_compare_exchange_n(&w->srv->body_reserved, &cur, cur + n, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return 1;
    const void *held = __atomic_load_n(&w->srv->body_exempt, __ATOMIC_ACQUIRE);
    if (held == req) {
        PCR_ADD(w->srv->body_reserved, n);
        return 2;
    }
    if (held != NULL ||
        !__atomic_compare_exchange_n(&w->srv->body_exempt, &held, req, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return 0;
    PCR_ADD(w->srv->body_reserved, n);
    return 2;
}

void pcr_budget_force(pcr_worker_t *w, size_t n) { PCR_ADD(w->srv->body_reserved, n); }

int pcr_budget_exempt(const pcr_worker_t *w, const void *req)
{
    return req != NULL && __atomic_load_n(&w->srv->body_exempt, __ATOMIC_ACQUIRE) == req;
}

void pcr_budget_forget(pcr_worker_t *w, const void *req)
{
    const void *mine = req;
    if (__atomic_compare_exchange_n(&w->srv->body_exempt, &mine, NULL, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE) &&
        !TAILQ_EMPTY(&w->budget_waiters))
        event_active(w->budget_event, 0, 0);
}

/* Waiters can make progress: there is budget, or nobody holds the exemption. */
static int budget_open(const pcr_worker_t *w)
{
    return pcr_budget_ok(w) || __atomic_load_n(&w->srv->body_exempt, __ATOMIC_ACQUIRE) == NULL;
}

void pcr_budget_account(pcr_worker_t *w, ptrdiff_t delta)
{
    if (delta >= 0)
        PCR_ADD(w->srv->body_buffered, (size_t)delta);
    else
        PCR_SUB(w->srv->body_buffered, (size_t)-delta);
}

void pcr_budget_release(pcr_worker_t *w, size_t n)
{
    if (n == 0)
        return;
    PCR_SUB(w->srv->body_reserved, n);
    if (!TAILQ_EMPTY(&w->budget_waiters) && budget_open(w))
        event_active(w->budget_event, 0, 0);
}

void pcr_budget_wait(pcr_worker_t *w, pcr_budget_waiter_t *bw)
{
    if (!bw->queued) {
        TAILQ_INSERT_TAIL(&w->budget_waiters, bw, link);
        bw->queued = 1;
    }
}

void pcr_budget_unwait(pcr_worker_t *w, pcr_budget_waiter_t *bw)
{
    if (bw->queued) {
        TAILQ_REMOVE(&w->budget_waiters, bw, link);
        bw->queued = 0;
    }
}

/* Wakes the sessions waiting for body budget, oldest first, while there is budget (or the
 * exemption is free); each may take some and wait again, which puts it at the back. */
static void on_budget(evutil_socket_t fd, short what, void *arg)
{
    pcr_worker_t *w = arg;
    size_t n = 0;
    pcr_budget_waiter_t *bw;
    TAILQ_FOREACH(bw, &w->budget_waiters, link)
        n++;
    while (n-- > 0 && budget_open(w) && (bw = TAILQ_FIRST(&w->budget_waiters)) != NULL) {
        pcr_budget_unwait(w, bw);
        bw->resume(bw);
    }
}

/* Sheds every waiter once (those that wait again go to the back, past the count). */
static void shed_all(pcr_worker_t *w)
{
    size_t n = 0;
    pcr_budget_waiter_t *bw;
    TAILQ_FOREACH(bw, &w->budget_waiters, link)
        n++;
    while (n-- > 0 && (bw = TAILQ_FIRST(&w->budget_waiters)) != NULL) {
        pcr_budget_unwait(w, bw);
        bw->shed(bw);
    }
}

void pcr_budget_tick(pcr_worker_t *w)
{
    if (!TAILQ_EMPTY(&w->budget_waiters) &&
        pcr_mem_action_fresh(w->srv, PCR_OVERLOAD_REFUSE_REQUESTS)) {
        shed_all(w);
        return;
    }
    if (!TAILQ_EMPTY(&w->budget_waiters) && budget_open(w))
        event_active(w->budget_event, 0, 0);
}

int pcr_budget_init(pcr_worker_t *w)
{
    TAILQ_INIT(&w->budget_waiters);
    w->budget_event = event_new(w->base, -1, 0, on_budget, w);
    return w->budget_event != NULL ? 0 : PCR_ERR_NOMEM;
}

void pcr_budget_dispose(pcr_worker_t *w)
{
    if (w->budget_event)
        event_free(w->budget_event);
    w->budget_event = NULL;
}
