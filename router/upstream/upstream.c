/* router/upstream/upstream.c: owns the upstream pool of one thread to one backend (upstream.h)
 * and the requests on it: their one entry (pcr_upstream_send), their handle, their end. The
 * module is three files behind upstream_int.h: this one, the hold queue (upstream_queue.c: who
 * waits for a slot or for the pod's prefill budget, and who goes next) and the HTTP/1.1 client
 * (upstream_h1.c: the connections and the response parser), which this file and the queue
 * reach only through the pool's transport table (pcr_up_transport_t): the seam a TLS or
 * HTTP/2 client to the pods will plug into.
 *
 * Each backend has a bounded pool: idle keep-alive connections (reused most recent first, so
 * the rest age out), and a FIFO of requests waiting for a slot when all `max_connections` are
 * busy. A connection carries one request at a time; its response is parsed by http-parser and
 * handed to the caller as it arrives.
 *
 *   pcr_upstream_send -> transport->dispatch -> [idle conn | new conn (connect) | wait queue]
 *        -> write request -> on_head -> on_body* -> on_done -> conn back to the pool
 *
 * A pooled connection the backend closed just as it was reused fails before any response byte;
 * such a request is re-sent once, on a fresh connection (an older idle one is likelier dead
 * too). Any other failure goes to the caller (who may retry on another backend while nothing
 * reached the client). */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "evmem.h"
#include "log.h"
#include "upstream_int.h"

void pcr_pool_init(pcr_pool_t *pool, pcr_backend_t *be, struct event_base *base,
                   unsigned max_connections, const int *draining,
                   const pcr_config_t *const *cfg)
{
    memset(pool, 0, sizeof(*pool));
    pool->be = be;
    pool->base = base;
    pool->draining = draining;
    pool->cfg = cfg;
    pool->max_connections = max_connections ? max_connections : 1;
    pool->owner_slot = -1;
    pool->transport = &pcr_up_h1;
    TAILQ_INIT(&pool->idle);
    TAILQ_INIT(&pool->waiters);
}

void pcr_pool_set_owner(pcr_pool_t *pool, int slot, void (*on_budget_open)(void *owner),
                        void *owner)
{
    pool->owner_slot = slot;
    pool->on_budget_open = on_budget_open;
    pool->owner = owner;
}

void pcr_pool_dispose(pcr_pool_t *pool)
{
    pcr_upstream_close_idle(pool);
}

static const char *const upr_state_name[] = {"READY", "WAITING", "HELD", "ON_CONN"};

/* Which states each state may move to (bit per pcr_upr_state_t): the picture in upstream_int.h. */
static const unsigned upr_next[] = {
    [UPR_READY] = 1u << UPR_WAITING | 1u << UPR_HELD | 1u << UPR_ON_CONN,
    [UPR_WAITING] = 1u << UPR_READY,
    [UPR_HELD] = 1u << UPR_READY,
    [UPR_ON_CONN] = 1u << UPR_READY,
};

/* The one place a request's state changes, with what is counted per state: the backend's and
 * the pool's held gauges and the time spent held; its client's requests on pod connections
 * from its first connection on. A move the picture does not have is a bug: logged, and made. */
void pcr_upreq_to(pcr_upreq_t *r, pcr_upr_state_t to)
{
    pcr_upr_state_t from = r->state;
    pcr_pool_t *pool = r->pool;
    if (from == to)
        return;
    if (!(upr_next[from] & (1u << to)))
        pcr_log_warn("backend %s: invalid state transition of an upstream request: %s -> %s",
                     pool->be->conf.name, upr_state_name[from], upr_state_name[to]);
    if (from == UPR_HELD) {
        uint64_t now = pcr_now_us();
        r->held_us += now > r->t_queued ? now - r->t_queued : 0;
        pool->nheld--;
        PCR_SUB(pool->be->held, 1);
    }
    if (from == UPR_WAITING && r->conn_wait_us != NULL) {
        uint64_t now = pcr_now_us();
        *r->conn_wait_us += now > r->t_wait ? now - r->t_wait : 0;
    }
    if (to == UPR_WAITING) {
        r->t_wait = pcr_now_us();
        PCR_ADD(pool->be->conn_waits, 1);
    }
    if (to == UPR_HELD) {
        r->held = 1;
        pool->nheld++;
        PCR_ADD(pool->be->held, 1);
        PCR_ADD(pool->be->held_total, 1);
    }
    if (to == UPR_ON_CONN && !r->busy) {
        r->busy = 1;
        if (r->owner != NULL)
            r->owner->busy++;
    }
    r->state = to;
}

void pcr_upreq_free(pcr_upreq_t *r)
{
    if (r == NULL)
        return;
    if (pcr_upreq_queued(r))
        pcr_upq_take(r);
    if (r->busy && r->owner != NULL)
        r->owner->busy--;
    pcr_upreq_off_conn(r);
    pcr_upq_uncharge(r);
    if (r->wait_timer)
        event_free(r->wait_timer);
    if (r->prefill_timer)
        event_free(r->prefill_timer);
    if (r->request)
        evbuffer_free(r->request);
    pcr_evmem_free(r);
}

/* Reports the failure of a request that has no connection (any was detached) to its owner. */
void pcr_upreq_fail(pcr_upreq_t *r, pcr_up_error_t err, int got_head)
{
    const pcr_upstream_cbs_t *cbs = r->cbs;
    void *ctx = r->ctx;
    pcr_upreq_free(r);
    cbs->on_error(ctx, err, got_head);
}

pcr_upreq_t *pcr_upstream_send(pcr_pool_t *pool, const pcr_up_send_t *req,
                               const pcr_upstream_cbs_t *cbs, void *ctx)
{
    pcr_upreq_t *r = pcr_evmem_calloc(1, sizeof(*r)); /* per request: evmem.h */
    if (r == NULL) {
        evbuffer_free(req->head);
        return NULL;
    }
    r->pool = pool;
    r->request = req->head;
    r->body = req->body;
    r->cbs = cbs;
    r->ctx = ctx;
    r->owner = cbs->owner != NULL ? cbs->owner(ctx) : NULL;
    r->kind = req->kind;
    r->prefill = pcr_upreq_budgeted(r) ? req->prefill : 0;
    r->priority = req->priority;
    r->pclass = req->pclass <= PCR_MAX_TENANTS ? req->pclass : 0;
    r->passes = req->passes;
    r->conn_wait_us = req->conn_wait_us;
    const pcr_up_prefix_t *prefix = req->prefix;
    if (pcr_upreq_budgeted(r) && prefix != NULL && prefix->blocks != NULL && prefix->nblocks > 0)
        r->prefix = *prefix;
    pool->transport->dispatch(r);
    return r;
}

int pcr_upstream_prefill_done(pcr_upreq_t *r)
{
    if (r == NULL)
        return 0;
    if (r->charged) {
        pcr_upq_uncharge(r);
        pcr_upq_freed(r->pool);
    }
    return r->held;
}

uint64_t pcr_upstream_held_us(const pcr_upreq_t *r)
{
    return r != NULL ? r->held_us : 0;
}

uint64_t pcr_upstream_sent_ahead(const pcr_upreq_t *r)
{
    return r != NULL ? r->ahead : 0;
}

uint64_t pcr_upstream_sent_us(const pcr_upreq_t *r)
{
    return r != NULL ? r->t_sent : 0;
}

void pcr_upstream_cancel(pcr_upreq_t *r)
{
    if (r == NULL)
        return;
    pcr_pool_t *pool = r->pool;
    if (r->conn != NULL)
        pool->transport->abort(r);
    else
        pcr_upreq_free(r);
    pcr_upq_freed(pool); /* its prefill may have left the budget */
}

void pcr_upstream_pause(pcr_upreq_t *r)
{
    if (r == NULL || r->paused)
        return;
    r->paused = 1;
    if (r->conn)
        r->pool->transport->pause(r);
}

void pcr_upstream_resume(pcr_upreq_t *r)
{
    if (r == NULL || !r->paused)
        return;
    r->paused = 0;
    if (r->conn)
        r->pool->transport->resume(r);
}

void pcr_upstream_close_idle(pcr_pool_t *pool)
{
    pool->transport->close_idle(pool);
}
