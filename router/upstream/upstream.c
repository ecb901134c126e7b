/* router/upstream/upstream.c: owns upstream connections (router -> backend) and the requests on
 * them.
 *
 * Each backend has a bounded pool: idle keep-alive connections (reused most recent first, so
 * the rest age out), and a FIFO of requests waiting for a slot when all `max_connections` are
 * busy. A connection carries one request at a time; its response is parsed by http-parser and
 * handed to the caller as it arrives.
 *
 *   pcr_upstream_send -> [idle conn | new conn (connect) | wait queue]
 *        -> write request -> on_head -> on_body* -> on_done -> conn back to the pool
 *
 * Holding (routing.hold_tokens, pcr/hold.h): a completion counts its uncached prefill in
 * `sent_prefill`, its pool's and its backend's (every worker's), from when it gets a connection
 * until its first event (pcr_upstream_prefill_done) or its end. One that is not streamed shows
 * no first token before its whole answer, yet its prefill is in the pod's queue all the same:
 * it counts until the time the caller estimates for its first token behind what was sent
 * before it (cbs->prefill_us, a timer: prefill_due), or its answer, whichever comes first
 * (pcr_upstream_send_unstreamed). While the backend's count is at the budget, new completions
 * join the wait queue too ("held"), and whoever waits goes highest pcr_hold_rank first, save
 * that a held one goes before one of this worker's that counts on the blocks it brings
 * (held_bringer). Other requests rank as no prefill and are never held; they and small
 * completions (pcr_hold_small, unless they count on a held one) go while the budget is spent.
 * With no budget the queue stays FIFO. A queued request keeps its place until
 * timeouts.response_ms (PCR_UP_POOL_FULL, or PCR_UP_HELD for a held one), and a held one until
 * its backend leaves rotation (pcr_upstream_fail_held: PCR_UP_HELD_OUT, from the worker's tick).
 * The budget is the pod's, so a stream's first token on one worker may be what another's held
 * streams wait for, and the order is the pod's too: a release sends this worker's best held
 * stream only while no other worker's ranks higher (below, "one rank order"); when the budget is
 * still open and others hold streams, they are told (budget_freed, the owner's on_budget_open), and
 * each sends what it may (pcr_upstream_kick).
 *
 * A pooled connection the backend closed just as it was reused fails before any response byte;
 * such a request is re-sent once, on a fresh connection (an older idle one is likelier dead
 * too). Any other failure goes to the caller (who may retry on another backend while nothing
 * reached the client).
 *
 * Pods are checked as strictly as clients (http1.h): a status outside 100-599, 101, a header
 * name that is not a token, a value with CR/LF/NUL, folded lines, a Transfer-Encoding other
 * than "chunked", headers past MAX_RESP_HEADER_BYTES: the response is malformed
 * (PCR_UP_PROTOCOL, a 502 when nothing reached the client yet), decided here and only here.
 *
 * Deadlines, one timer per connection: connecting (the transport's connect timeout), waiting
 * for the head (timeouts.response_ms, from the request: bytes before the head do not restart
 * it), silence inside a body (timeouts.stream_idle_ms, restarted by every read, stopped while
 * the client side paused reading), idle in the pool (timeouts.upstream_keepalive_ms).
 *
 * Freeing: a callback may cancel its own request; the connection notices through `req == NULL`
 * after the parser returns, never touching freed memory (one close path, conn_close()). */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <http_parser.h>

#include "backend.h"
#include "http1.h"
#include "log.h"
#include "pcr/hold.h"
#include "server.h"
#include "sock.h"
#include "evmem.h"
#include "upstream.h"

#define MAX_RESP_HEADERS 64
/* A release looks at most this many waiters, the longest-waiting first, so a flood of held
 * streams costs a bounded time per first token; a younger one's turn comes as they leave. */
#define HOLD_SCAN 1024
#define MAX_RESP_HEADER_BYTES 65536

struct pcr_upreq {
    pcr_pool_t *pool;
    pcr_upconn_t *conn;              /* NULL while waiting for a slot */
    struct evbuffer *request;        /* the bytes to send, kept for the one stale-conn re-send */
    struct evbuffer *body;           /* the caller's, sent after them by reference (or NULL) */
    const pcr_upstream_cbs_t *cbs;
    void *ctx;
    unsigned *owner;                 /* its client's requests on pod connections (cbs->owner) */
    struct event *wait_timer;        /* while queued for a slot */
    struct event *prefill_timer;     /* unstreamed: when its prefill is taken as done */
    TAILQ_ENTRY(pcr_upreq) wait_link;
    uint64_t t_queued;               /* when it joined the queue, us */
    uint64_t held_us;                /* time spent held, us (pcr_upstream_held_us) */
    uint64_t prefill;                /* its uncached prefill, tokens (streams and unstreamed) */
    uint64_t ahead;                  /* the backend's sent_prefill when it was charged */
    uint64_t t_sent;                 /* when it was charged (went to the pod), us */
    pcr_up_prefix_t prefix;          /* what it was routed with (pcr_hold_depends) */
    int budgeted;                    /* a completion: counts against routing.hold_tokens, may
                                        be held */
    int estimated;                   /* not streamed: its prefill leaves at an estimate */
    int charged;                     /* its prefill is in pool->sent_prefill */
    int held;                        /* was queued because the budget was spent */
    int in_hold;                     /* ... and still is (the backend's `held` gauge) */
    int queued;
    int resent;                      /* already re-sent once after a stale pooled connection */
    int busy;                        /* counted in *owner: it has had a connection */
    int fresh;                       /* must go on a new connection */
    int paused;
};

struct pcr_upconn {
    pcr_pool_t *pool;
    pcr_backend_t *be;
    pcr_sock_t *sock;
    struct event *timer;
    unsigned timer_ms;               /* the deadline in force, re-armed on reads */
    http_parser parser;
    pcr_fold_t fold;
    pcr_upreq_t *req;                /* the request it carries, NULL when idle */
    TAILQ_ENTRY(pcr_upconn) idle_link;
    int connected;
    int reused;                      /* has carried a request before */
    int in_idle;
    int got_bytes;                   /* any response byte for the current request */
    int got_head;
    int done;                        /* on_message_complete seen */
    int malformed;                   /* a check of ours refused the response */
    int in_read;                     /* inside conn_parse: the parser's callbacks may run */
    /* Response headers as parsed: a flat buffer and offsets into it. */
    char *hbuf;
    size_t hlen, hcap;
    size_t hoff[MAX_RESP_HEADERS * 2], hsz[MAX_RESP_HEADERS * 2];
    size_t nh;                       /* names + values stored */
    int last_was_value;
};

static void conn_close(pcr_upconn_t *c);
static void conn_assign(pcr_upconn_t *c, pcr_upreq_t *r);
static void req_dispatch(pcr_upreq_t *r);
static void on_wait_timeout(evutil_socket_t fd, short what, void *arg);

/* The timeouts of the thread that owns the pool: a worker's config may be newer than what the
 * control thread reads (a reload is seen by each thread in turn). */
static const pcr_timeouts_conf_t *tmo(const pcr_pool_t *pool) { return &(*pool->cfg)->timeouts; }

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

static struct timeval ms_tv(unsigned ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

/* (Re)arms the connection's deadline, unless the response is paused by the client side. */
static void timer_arm(pcr_upconn_t *c, unsigned ms)
{
    c->timer_ms = ms;
    if (c->req != NULL && c->req->paused)
        return;
    struct timeval tv = ms_tv(ms);
    evtimer_add(c->timer, &tv);
}

/* ---- the wait queue and the prefill budget ------------------------------------------- */

/* routing.hold_tokens (0: no budget), as the owner's config says now: the pod's, counted over
 * every worker. */
static uint64_t pool_budget(const pcr_pool_t *pool)
{
    return (*pool->cfg)->routing.hold_tokens;
}

/* Whether a stream may go to the pod now: the prefill every worker has sent it and not seen
 * finish is under the budget. Whichever worker's stream brings that under it wakes the others
 * (budget_freed), so a worker with nothing of its own in flight there is not left waiting. */
static int hold_open(const pcr_pool_t *pool)
{
    return pcr_hold_open(PCR_LOAD(pool->be->sent_prefill), pool_budget(pool));
}

static void prefill_due(evutil_socket_t fd, short what, void *arg);

/* An unstreamed request's prefill leaves the count when its caller expects its first token:
 * behind the prefill sent before it, its own included (cbs->prefill_us). No later than the
 * response deadline, which would end it anyway. Without a timer (out of memory) it stays
 * counted until its answer, as a stream whose first token never came. */
static void prefill_arm(pcr_upreq_t *r)
{
    if (r->cbs->prefill_us == NULL)
        return;
    uint64_t us = r->cbs->prefill_us(r->ctx, r->ahead + r->prefill);
    uint64_t cap = (uint64_t)tmo(r->pool)->response_ms * 1000;
    if (us > cap)
        us = cap;
    if (r->prefill_timer == NULL)
        r->prefill_timer = evtimer_new(r->pool->base, prefill_due, r);
    if (r->prefill_timer == NULL)
        return;
    struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
    evtimer_add(r->prefill_timer, &tv);
}

static void charge(pcr_upreq_t *r)
{
    if (r->budgeted && !r->charged) {
        r->ahead = PCR_LOAD(r->pool->be->sent_prefill);
        r->t_sent = pcr_now_us();
        r->pool->sent_prefill += r->prefill;
        PCR_ADD(r->pool->be->sent_prefill, r->prefill);
        r->charged = 1;
        if (r->estimated)
            prefill_arm(r);
    }
}

static void uncharge(pcr_upreq_t *r)
{
    if (r->charged) {
        r->pool->sent_prefill -= r->prefill;
        PCR_SUB(r->pool->be->sent_prefill, r->prefill);
        r->charged = 0;
        if (r->prefill_timer != NULL)
            evtimer_del(r->prefill_timer);
    }
}

/* pcr_hold_rank at `now` of a request queued at `t_queued` with `prefill` tokens to do. */
static double rank_at(uint64_t now, uint64_t t_queued, uint64_t prefill)
{
    return pcr_hold_rank(now > t_queued ? now - t_queued : 0, prefill);
}

/* Fair share between clients: how many requests the waiter's client (its connection) has on
 * pod connections now. A waiter whose client has fewer goes first, so that a client with many
 * streams in flight (or stuck behind a window it never opens) cannot keep the pod's
 * connections from everyone else: a connection that frees goes to whoever holds fewest. */
static unsigned owner_busy(const pcr_upreq_t *r) { return r->owner != NULL ? *r->owner : 0; }

/* The waiter of highest rank now among the HOLD_SCAN oldest whose client has fewest requests on
 * pod connections (ties: the older, first in the queue): of the held completions only
 * (`held_only`), or of all, completions only while `streams_go`. Small completions
 * (pcr_hold_small) that only wait for a connection slot may go whatever the budget; one held
 * because it counts on a held one's blocks waits for the budget as before, so that it reaches
 * the pod after that one's prefill, not beside it on another connection. Requests that are not
 * completions rank as no prefill. */
static pcr_upreq_t *highest_rank(pcr_pool_t *pool, int held_only, int streams_go)
{
    pcr_upreq_t *w = TAILQ_FIRST(&pool->waiters), *best = NULL;
    uint64_t now = pcr_now_us();
    double rank = 0;
    unsigned seen = 0, fewest = 0;
    for (; w != NULL && seen < HOLD_SCAN; w = TAILQ_NEXT(w, wait_link), seen++) {
        if ((held_only && !w->in_hold) ||
            (w->budgeted && !streams_go && (w->in_hold || !pcr_hold_small(w->prefill))))
            continue;
        unsigned busy = owner_busy(w);
        double k = rank_at(now, w->t_queued, w->budgeted ? w->prefill : 0);
        if (best == NULL || busy < fewest || (busy == fewest && k > rank)) {
            best = w;
            rank = k;
            fewest = busy;
        }
    }
    return best;
}

/* The oldest of the HOLD_SCAN oldest waiters whose client has fewest requests on pod
 * connections. */
static pcr_upreq_t *oldest_fewest(pcr_pool_t *pool)
{
    pcr_upreq_t *w = TAILQ_FIRST(&pool->waiters), *best = w;
    unsigned seen = 0, fewest = w != NULL ? owner_busy(w) : 0;
    for (; w != NULL && fewest > 0 && seen < HOLD_SCAN; w = TAILQ_NEXT(w, wait_link), seen++) {
        if (owner_busy(w) < fewest) {
            best = w;
            fewest = owner_busy(w);
        }
    }
    return best;
}

/* ---- one rank order over the workers -------------------------------------------------
 *
 * Each worker publishes, in its slot on the backend (pcr_pending_t), its held stream that goes
 * next: the highest rank when it last looked (at each kick, and when that one leaves). A
 * release on a budget opening sends this worker's best only if no other worker's published one
 * ranks higher now; else it stops, and budget_freed wakes the others. A published stream may
 * have been overtaken by another of its worker's since, so what is compared is a lower bound of
 * that worker's best, never more: two workers cannot each defer to the other. A worker without a
 * connection slot to give publishes none. The one deferred to is woken and sends, as it sees the
 * same budget; should a wake-up cross a hold, the ticks kick too. */

static pcr_pending_t *own_slot(const pcr_pool_t *pool)
{
    if (pool->owner_slot < 0 || (unsigned)pool->owner_slot >= pool->be->npending)
        return NULL;
    return &pool->be->pending[pool->owner_slot];
}

static int slot_free(const pcr_pool_t *pool)
{
    return pool->nidle > 0 || pool->nconns < pool->max_connections;
}

/* `r` (or none) is this worker's next held stream, as the others see it. The two words are read
 * apart: a reader between two publications may pair one stream's time with the other's prefill,
 * and misorder one release; nothing waits on it. */
static void publish(pcr_pool_t *pool, pcr_upreq_t *r)
{
    pcr_pending_t *slot = own_slot(pool);
    int same = r != NULL && r == pool->best_held;
    pool->best_held = r;
    if (slot == NULL || same)
        return;
    if (r != NULL)
        PCR_STORE(slot->held_prefill, r->prefill);
    PCR_STORE(slot->held_at, r != NULL ? (r->t_queued ? r->t_queued : 1) : 0);
}

/* Publishes the held stream of highest rank now (of the HOLD_SCAN oldest), or none. */
static void publish_best(pcr_pool_t *pool)
{
    if (pool->nheld > 0 && slot_free(pool))
        publish(pool, highest_rank(pool, 1, 1));
    else if (pool->best_held != NULL)
        publish(pool, NULL);
}

/* Whether another worker's published held stream for this backend ranks above `r` now. */
static int other_goes_first(const pcr_pool_t *pool, const pcr_upreq_t *r)
{
    const pcr_pending_t *own = own_slot(pool);
    if (own == NULL)
        return 0;
    uint64_t now = pcr_now_us();
    double mine = rank_at(now, r->t_queued, r->prefill);
    for (unsigned i = 0; i < pool->be->npending; i++) {
        const pcr_pending_t *o = &pool->be->pending[i];
        uint64_t at = o == own ? 0 : PCR_LOAD(o->held_at);
        if (at != 0 && rank_at(now, at, PCR_LOAD(o->held_prefill)) > mine)
            return 1;
    }
    return 0;
}

static void waiter_add(pcr_upreq_t *r, int hold)
{
    pcr_pool_t *pool = r->pool;
    /* Waiting is bounded by the response timeout. */
    if (r->wait_timer == NULL)
        r->wait_timer = evtimer_new(pool->base, on_wait_timeout, r);
    if (r->wait_timer != NULL) {
        struct timeval wt = ms_tv(tmo(pool)->response_ms);
        evtimer_add(r->wait_timer, &wt);
    }
    TAILQ_INSERT_TAIL(&pool->waiters, r, wait_link);
    r->queued = 1;
    r->t_queued = pool_budget(pool) ? pcr_now_us() : 0;
    if (hold) {
        r->held = r->in_hold = 1;
        pool->nheld++;
        PCR_ADD(pool->be->held, 1);
        PCR_ADD(pool->be->held_total, 1);
        if (pool->best_held == NULL && slot_free(pool))
            publish(pool, r); /* it ranks 0 now: an older one, if any, stays the next */
    }
}

/* Off the queue, its deadline disarmed (the connection's own deadlines take over). */
static void waiter_take(pcr_upreq_t *r)
{
    TAILQ_REMOVE(&r->pool->waiters, r, wait_link);
    r->queued = 0;
    if (r->wait_timer)
        evtimer_del(r->wait_timer);
    if (r->in_hold) {
        uint64_t now = pcr_now_us();
        r->held_us += now > r->t_queued ? now - r->t_queued : 0;
        r->in_hold = 0;
        r->pool->nheld--;
        PCR_SUB(r->pool->be->held, 1);
        if (r == r->pool->best_held)
            publish_best(r->pool);
    }
}

/* Who waits and may go next, or NULL: of the waiters whose client has fewest requests on pod
 * connections, with no budget the oldest; else the highest pcr_hold_rank among those the
 * budget lets go (of the HOLD_SCAN oldest). */
static pcr_upreq_t *waiter_next(pcr_pool_t *pool)
{
    pcr_upreq_t *w = TAILQ_FIRST(&pool->waiters);
    if (w == NULL || pool_budget(pool) == 0)
        return oldest_fewest(pool);
    return highest_rank(pool, 0, hold_open(pool));
}

/* A stream held in this pool (of the HOLD_SCAN oldest) that brings blocks `r` counts as cached
 * (pcr_hold_depends), or NULL. Sent first, `r` would prefill them itself and the other would
 * find them: the hit the routing chose both for would be lost. Only this worker's: another
 * worker's held streams are seen as one published rank, not as keys. */
static pcr_upreq_t *held_bringer(pcr_pool_t *pool, const pcr_upreq_t *r)
{
    if (pool->nheld == 0 || r->prefix.blocks == NULL || r->prefix.matched == 0)
        return NULL;
    unsigned seen = 0;
    for (pcr_upreq_t *w = TAILQ_FIRST(&pool->waiters); w != NULL && seen < HOLD_SCAN;
         w = TAILQ_NEXT(w, wait_link), seen++) {
        if (w != r && w->in_hold && w->prefix.blocks != NULL &&
            pcr_hold_depends(r->prefix.blocks, r->prefix.nblocks, r->prefix.matched,
                             w->prefix.blocks, w->prefix.nblocks, w->prefix.added_from))
            return w;
    }
    return NULL;
}

/* waiter_next(), but NULL when its choice is a held stream that another worker's published
 * one ranks above: that one goes first (budget_freed wakes its worker). A held stream's turn
 * goes to the held stream whose blocks it counts on, if any (that one's, in turn, to its own):
 * the chosen one's rank stands for both. */
static pcr_upreq_t *waiter_next_in_order(pcr_pool_t *pool)
{
    pcr_upreq_t *w = waiter_next(pool);
    if (w == NULL || !w->in_hold)
        return w;
    if (other_goes_first(pool, w))
        return NULL;
    pcr_upreq_t *b;
    for (int depth = 0; depth < 8 && (b = held_bringer(pool, w)) != NULL; depth++)
        w = b;
    return w;
}

/* The budget or a slot opened: sends whoever may go, in order, while a connection is there to
 * take (an idle one, or room for a new one). Then publishes this worker's next. */
static void pool_kick(pcr_pool_t *pool)
{
    pcr_upreq_t *w;
    while (slot_free(pool) && (w = waiter_next_in_order(pool)) != NULL) {
        waiter_take(w);
        req_dispatch(w);
        if (w->queued)
            break; /* no connection after all (out of memory): it waits again */
    }
    publish_best(pool);
}

void pcr_upstream_kick(pcr_pool_t *pool)
{
    pool_kick(pool);
}

/* A stream's prefill left the budget (or may have): this worker's waiters go first, then the
 * other workers hear of it if the pod still has room and they hold streams for it. Never from
 * pcr_upstream_kick, so two workers that cannot send (no connection slot) do not wake each
 * other in turn. */
static void budget_freed(pcr_pool_t *pool)
{
    pool_kick(pool);
    if (pool->on_budget_open != NULL && PCR_LOAD(pool->be->held) > pool->nheld &&
        pcr_hold_open(PCR_LOAD(pool->be->sent_prefill), pool_budget(pool)))
        pool->on_budget_open(pool->owner);
}

static void req_free(pcr_upreq_t *r)
{
    if (r == NULL)
        return;
    if (r->queued)
        waiter_take(r);
    if (r->busy && r->owner != NULL)
        (*r->owner)--;
    uncharge(r);
    if (r->wait_timer)
        event_free(r->wait_timer);
    if (r->prefill_timer)
        event_free(r->prefill_timer);
    if (r->request)
        evbuffer_free(r->request);
    pcr_evmem_free(r);
}

/* Detaches the request from its connection and reports the failure to its owner. */
static void req_fail(pcr_upreq_t *r, pcr_up_error_t err, int got_head)
{
    const pcr_upstream_cbs_t *cbs = r->cbs;
    void *ctx = r->ctx;
    if (r->conn)
        r->conn->req = NULL;
    r->conn = NULL;
    req_free(r);
    cbs->on_error(ctx, err, got_head);
}

/* ---- response parsing ---------------------------------------------------------------- */

static int malformed(pcr_upconn_t *c, const char *why)
{
    if (!c->malformed)
        pcr_log_warn("backend %s: malformed response: %s", c->be->conf.name, why);
    c->malformed = 1;
    return -1;
}

/* Appends to the current header name or value slot, opening a new slot when the parser moves
 * from names to values or back (it may deliver one name or value in several pieces). */
static int hdr_append(pcr_upconn_t *c, const char *at, size_t len, int is_value)
{
    if (c->hlen + len > MAX_RESP_HEADER_BYTES)
        return malformed(c, "headers larger than 64 KiB");
    if (c->nh == 0 || is_value != c->last_was_value) {
        if (c->nh >= MAX_RESP_HEADERS * 2)
            return malformed(c, "more than 64 header fields");
        c->hoff[c->nh] = c->hlen;
        c->hsz[c->nh] = 0;
        c->nh++;
        c->last_was_value = is_value;
    }
    if (c->hlen + len > c->hcap) {
        size_t ncap = c->hcap ? c->hcap * 2 : 1024;
        while (ncap < c->hlen + len)
            ncap *= 2;
        char *nb = realloc(c->hbuf, ncap);
        if (nb == NULL)
            return -1;
        c->hbuf = nb;
        c->hcap = ncap;
    }
    memcpy(c->hbuf + c->hlen, at, len);
    c->hlen += len;
    c->hsz[c->nh - 1] += len;
    return 0;
}

static int on_hfield(http_parser *p, const char *at, size_t len)
{
    pcr_upconn_t *c = p->data;
    pcr_fold_field(&c->fold);
    return hdr_append(c, at, len, 0);
}

static int on_hvalue(http_parser *p, const char *at, size_t len)
{
    pcr_upconn_t *c = p->data;
    if (pcr_fold_value(&c->fold, at, len) < 0)
        return malformed(c, "obsolete line folding in a header field");
    return hdr_append(c, at, len, 1);
}

static int on_headers_complete(http_parser *p)
{
    pcr_upconn_t *c = p->data;
    pcr_upreq_t *r = c->req;
    if (r == NULL)
        return -1;
    unsigned status = p->status_code;
    if (status < 100 || status > 599)
        return malformed(c, "status code outside 100-599");
    if (status == 101)
        return malformed(c, "101 Switching Protocols to a request that asked for no upgrade");
    if (status < 200) {
        /* 1xx interim response: drop it and wait for the final one. Like 204 and 304 below, it
         * ends at the blank line whatever its Content-Length says (RFC 9112, 6.3); returning 1
         * tells http-parser so. */
        c->nh = c->hlen = 0;
        return 1;
    }
    pcr_hdr_t hdrs[MAX_RESP_HEADERS];
    size_t n = 0;
    for (size_t i = 0; i + 1 < c->nh; i += 2) {
        const char *name = c->hbuf + c->hoff[i], *value = c->hbuf + c->hoff[i + 1];
        if (!pcr_http_token_valid(name, c->hsz[i]) || !pcr_http_value_valid(value, c->hsz[i + 1]))
            return malformed(c, "invalid header field");
        if (c->hsz[i] == 17 && strncasecmp(name, "transfer-encoding", 17) == 0 &&
            !pcr_http_te_is_chunked(value, c->hsz[i + 1]))
            return malformed(c, "Transfer-Encoding other than \"chunked\"");
        hdrs[n].name = name;
        hdrs[n].name_len = c->hsz[i];
        hdrs[n].value = value;
        hdrs[n].value_len = c->hsz[i + 1];
        n++;
    }
    int64_t clen = -1;
    if (!(p->flags & F_CHUNKED) && p->content_length != ULLONG_MAX)
        clen = (int64_t)p->content_length;
    c->got_head = 1;
    /* The response started: from here on, silence is measured by the stream idle timeout,
     * armed when this read is parsed (conn_parse), unless the response ended in it. */
    c->timer_ms = tmo(c->pool)->stream_idle_ms;
    r->cbs->on_head(r->ctx, (int)status, hdrs, n, clen);
    return status == 204 || status == 304;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    pcr_upconn_t *c = p->data;
    if (c->req == NULL)
        return -1;
    c->req->cbs->on_body(c->req->ctx, at, len);
    return 0;
}

static int on_message_complete(http_parser *p)
{
    pcr_upconn_t *c = p->data;
    if (!c->got_head) {
        pcr_fold_reset(&c->fold);
        return 0; /* the end of a 1xx */
    }
    c->done = 1;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings resp_settings = {
    .on_header_field = on_hfield,
    .on_header_value = on_hvalue,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ---- connection life ----------------------------------------------------------------- */

static void conn_to_pool(pcr_upconn_t *c)
{
    pcr_pool_t *pool = c->pool;
    c->req = NULL;
    c->reused = 1;
    pcr_upreq_t *w = waiter_next_in_order(pool);
    if (w != NULL && !w->fresh) {
        waiter_take(w);
        conn_assign(c, w);
        return;
    }
    if (w != NULL || *pool->draining) {
        /* The oldest waiter needs a fresh connection: closing this one makes room for it. */
        conn_close(c);
        return;
    }
    /* Idle: keep reading so a close by the backend is seen, and age out after keepalive. */
    pcr_sock_read_start(c->sock);
    timer_arm(c, tmo(c->pool)->upstream_keepalive_ms);
    TAILQ_INSERT_HEAD(&pool->idle, c, idle_link);
    c->in_idle = 1;
    pool->nidle++;
}

static void conn_close(pcr_upconn_t *c)
{
    pcr_pool_t *pool = c->pool;
    if (c->in_idle) {
        TAILQ_REMOVE(&pool->idle, c, idle_link);
        pool->nidle--;
    }
    event_free(c->timer);
    pcr_sock_free(c->sock);
    free(c->hbuf);
    free(c);
    pool->nconns--;
    PCR_SUB(pool->be->conns, 1);
    /* A slot freed up: give it to the next waiter. */
    pcr_upreq_t *w = waiter_next_in_order(pool);
    if (w != NULL && !*pool->draining) {
        waiter_take(w);
        req_dispatch(w);
    }
}

/* The current request failed on this connection: re-send it once, on a fresh connection, if
 * this was a reused one that the backend had closed (nothing was received), else report; then
 * close. */
static void conn_fail(pcr_upconn_t *c, pcr_up_error_t err)
{
    pcr_upreq_t *r = c->req;
    pcr_pool_t *pool = c->pool;
    int stale = c->reused && !c->got_bytes && err == PCR_UP_RESET;
    int got_head = c->got_head;
    c->req = NULL;
    if (r != NULL) {
        r->conn = NULL;
        if (err == PCR_UP_CONNECT)
            PCR_ADD(c->be->connect_errors, 1);
        else if (!stale)
            PCR_ADD(c->be->upstream_errors, 1);
    }
    conn_close(c);
    if (r == NULL)
        return;
    if (stale && !r->resent) {
        r->resent = 1;
        r->fresh = 1;
        req_dispatch(r); /* still charged: it is not held again */
        return;
    }
    uncharge(r);
    budget_freed(pool);
    req_fail(r, err, got_head);
}

/* The response ended: the request goes back to its owner, the connection to the pool. */
static void conn_done(pcr_upconn_t *c, int keep)
{
    pcr_upreq_t *r = c->req;
    pcr_pool_t *pool = c->pool;
    const pcr_upstream_cbs_t *cbs = r->cbs;
    void *ctx = r->ctx;
    r->conn = NULL;
    c->req = NULL;
    req_free(r);
    if (keep)
        conn_to_pool(c);
    else
        conn_close(c);
    budget_freed(pool);
    cbs->on_done(ctx);
}

/* Parses what the input holds; the connection may be closed or back in the pool after. */
static void conn_parse(pcr_upconn_t *c)
{
    struct evbuffer *in = pcr_sock_input(c->sock);
    c->got_bytes = 1;
    c->in_read = 1;
    enum http_errno e = HPE_OK;
    size_t trailing = 0;
    while (evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        pcr_fold_begin(&c->fold, v.iov_base, v.iov_len);
        size_t n = http_parser_execute(&c->parser, &resp_settings, v.iov_base, v.iov_len);
        pcr_fold_end(&c->fold);
        evbuffer_drain(in, n);
        e = HTTP_PARSER_ERRNO(&c->parser);
        if (c->req == NULL || e != HPE_OK || c->done) {
            trailing = evbuffer_get_length(in);
            break;
        }
    }
    c->in_read = 0;
    if (c->req == NULL) {
        /* Cancelled from inside a callback: close, so the pod stops generating. */
        conn_close(c);
    } else if (e != HPE_OK && e != HPE_PAUSED) {
        if (!c->malformed)
            pcr_log_warn("backend %s: malformed response: %s", c->be->conf.name,
                         http_errno_description(e));
        conn_fail(c, PCR_UP_PROTOCOL);
    } else if (c->done) {
        /* Keep-alive only when nothing trails the response and the request went out whole. */
        int keep = http_should_keep_alive(&c->parser) && trailing == 0 &&
                   pcr_sock_pending(c->sock) == 0;
        conn_done(c, keep);
    } else if (c->req != NULL && !c->req->paused && c->got_head) {
        /* Inside a body, silence is measured from the last byte. Before the head, the deadline
         * stays where it was set: a pod dribbling its head, or sending 1xx after 1xx, still
         * gets its 504 at timeouts.response_ms. */
        timer_arm(c, c->timer_ms);
    }
}

static void on_sock_read(pcr_sock_t *sock, void *arg)
{
    pcr_upconn_t *c = arg;
    if (c->req == NULL) {
        /* Bytes on an idle connection: the backend broke the protocol. */
        conn_close(c);
        return;
    }
    conn_parse(c);
}

/* The read side ended (EOF, error): a close-delimited body may be complete, else it failed. */
static void on_sock_end(pcr_sock_t *sock, pcr_sock_end_t why, void *arg)
{
    pcr_upconn_t *c = arg;
    if (c->req == NULL) {
        conn_close(c); /* an idle connection the backend closed */
        return;
    }
    if (why == PCR_SOCK_EOF && c->got_head) {
        http_parser_execute(&c->parser, &resp_settings, NULL, 0);
        if (c->done) {
            conn_done(c, 0);
            return;
        }
    }
    conn_fail(c, why == PCR_SOCK_WRITE_TIMEOUT ? PCR_UP_TIMEOUT : PCR_UP_RESET);
}

static void on_sock_drain(pcr_sock_t *sock, void *arg) {}

static void on_sock_ready(pcr_sock_t *sock, int err, void *arg)
{
    pcr_upconn_t *c = arg;
    if (err != 0) {
        if (c->req == NULL) {
            conn_close(c);
            return;
        }
        pcr_log_warn("backend %s: connect failed: %s", c->be->conf.name, strerror(err));
        conn_fail(c, PCR_UP_CONNECT);
        return;
    }
    c->connected = 1;
    if (c->req == NULL) {
        conn_to_pool(c); /* its request was cancelled while connecting */
        return;
    }
    pcr_sock_flush(c->sock);
    pcr_sock_read_start(c->sock);
    timer_arm(c, tmo(c->pool)->response_ms);
}

static const pcr_sock_cbs_t up_sock_cbs = {on_sock_read, on_sock_drain, on_sock_end, on_sock_ready};

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    pcr_upconn_t *c = arg;
    if (c->req == NULL)
        conn_close(c); /* idle past upstream_keepalive_ms */
    else
        conn_fail(c, PCR_UP_TIMEOUT);
}

/* What evbuffer_add_buffer_reference() could not reference (no memory for its chains) is
 * copied instead, chain by chain. */
static void add_copy(struct evbuffer *out, struct evbuffer *src)
{
    struct evbuffer_ptr at;
    struct evbuffer_iovec v;
    evbuffer_ptr_set(src, &at, 0, EVBUFFER_PTR_SET);
    while (evbuffer_peek(src, -1, &at, &v, 1) >= 1 && v.iov_len > 0) {
        if (evbuffer_add(out, v.iov_base, v.iov_len) != 0)
            return;
        if (evbuffer_ptr_set(src, &at, v.iov_len, EVBUFFER_PTR_ADD) != 0)
            return;
    }
}

static void conn_assign(pcr_upconn_t *c, pcr_upreq_t *r)
{
    c->req = r;
    r->conn = c;
    if (!r->busy) {
        r->busy = 1;
        if (r->owner != NULL)
            (*r->owner)++;
    }
    charge(r);
    c->got_bytes = c->got_head = c->done = c->malformed = 0;
    c->nh = c->hlen = 0;
    c->last_was_value = 0;
    pcr_fold_reset(&c->fold);
    http_parser_init(&c->parser, HTTP_RESPONSE);
    c->parser.data = c;
    /* Copy, not move: the bytes are kept for one re-send if this pooled conn proves stale.
     * The body, most of the bytes, is only referenced: the output's chains point into the
     * caller's buffer (libevent keeps it alive while they do). */
    struct evbuffer *out = pcr_sock_output(c->sock);
    size_t len = evbuffer_get_length(r->request);
    evbuffer_add(out, evbuffer_pullup(r->request, -1), len);
    if (r->body != NULL && evbuffer_get_length(r->body) > 0 &&
        evbuffer_add_buffer_reference(out, r->body) != 0)
        add_copy(out, r->body);
    if (c->connected) {
        pcr_sock_read_start(c->sock);
        timer_arm(c, tmo(c->pool)->response_ms);
        pcr_sock_flush_soon(c->sock);
    }
}

static pcr_upconn_t *conn_open(pcr_pool_t *pool)
{
    pcr_backend_t *be = pool->be;
    pcr_upconn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->pool = pool;
    c->be = be;
    c->timer = evtimer_new(pool->base, on_timer, c);
    c->sock = pcr_sock_connect(pool->base, (struct sockaddr *)&be->addr, be->addrlen,
                               tmo(pool)->connect_ms);
    if (c->timer == NULL || c->sock == NULL) {
        if (c->timer)
            event_free(c->timer);
        pcr_sock_free(c->sock);
        free(c);
        return NULL;
    }
    pcr_sock_set_cbs(c->sock, &up_sock_cbs, c);
    /* A pod that does not read the request is as stuck as one that does not answer. */
    pcr_sock_set_write_timeout(c->sock, tmo(pool)->response_ms);
    pool->nconns++;
    PCR_ADD(be->conns, 1);
    return c;
}

static void on_wait_timeout(evutil_socket_t fd, short what, void *arg)
{
    pcr_upreq_t *r = arg;
    req_fail(r, r->in_hold ? PCR_UP_HELD : PCR_UP_POOL_FULL, 0);
}

static void req_dispatch(pcr_upreq_t *r)
{
    pcr_pool_t *pool = r->pool;
    if (r->budgeted && !r->charged &&
        ((!hold_open(pool) && !pcr_hold_small(r->prefill)) || held_bringer(pool, r) != NULL)) {
        /* The backend's prefill queue is full (and this one's own prefill is not too small
         * to matter), or what it counts on waits. */
        waiter_add(r, 1);
        return;
    }
    pcr_upconn_t *c = r->fresh ? NULL : TAILQ_FIRST(&pool->idle);
    if (c != NULL) {
        TAILQ_REMOVE(&pool->idle, c, idle_link);
        c->in_idle = 0;
        pool->nidle--;
        conn_assign(c, r);
        return;
    }
    if (pool->nconns >= pool->max_connections && r->fresh &&
        (c = TAILQ_LAST(&pool->idle, pcr_upconn_idle)) != NULL)
        conn_close(c); /* room for the fresh connection: the oldest idle one goes */
    if (pool->nconns < pool->max_connections) {
        c = conn_open(pool);
        if (c != NULL) {
            conn_assign(c, r);
            return;
        }
    }
    waiter_add(r, 0); /* wait for a slot */
}

pcr_upreq_t *pcr_upstream_send(pcr_pool_t *pool, struct evbuffer *request,
                               const pcr_upstream_cbs_t *cbs, void *ctx)
{
    return pcr_upstream_send_body(pool, request, NULL, cbs, ctx);
}

static pcr_upreq_t *send_req(pcr_pool_t *pool, struct evbuffer *head, struct evbuffer *body,
                             int budgeted, int estimated, uint64_t prefill,
                             const pcr_up_prefix_t *prefix, const pcr_upstream_cbs_t *cbs,
                             void *ctx)
{
    pcr_upreq_t *r = pcr_evmem_calloc(1, sizeof(*r)); /* per request: evmem.h */
    if (r == NULL) {
        evbuffer_free(head);
        return NULL;
    }
    r->pool = pool;
    r->request = head;
    r->body = body;
    r->cbs = cbs;
    r->ctx = ctx;
    r->owner = cbs->owner != NULL ? cbs->owner(ctx) : NULL;
    r->budgeted = budgeted;
    r->estimated = estimated && prefill > 0;
    r->prefill = prefill;
    if (prefix != NULL && prefix->blocks != NULL && prefix->nblocks > 0)
        r->prefix = *prefix;
    req_dispatch(r);
    return r;
}

pcr_upreq_t *pcr_upstream_send_body(pcr_pool_t *pool, struct evbuffer *head, struct evbuffer *body,
                                    const pcr_upstream_cbs_t *cbs, void *ctx)
{
    return send_req(pool, head, body, 0, 0, 0, NULL, cbs, ctx);
}

pcr_upreq_t *pcr_upstream_send_unstreamed(pcr_pool_t *pool, struct evbuffer *head,
                                          struct evbuffer *body, uint64_t prefill,
                                          const pcr_up_prefix_t *prefix,
                                          const pcr_upstream_cbs_t *cbs, void *ctx)
{
    return send_req(pool, head, body, 1, 1, prefill, prefix, cbs, ctx);
}

pcr_upreq_t *pcr_upstream_send_stream(pcr_pool_t *pool, struct evbuffer *head,
                                      struct evbuffer *body, uint64_t prefill,
                                      const pcr_up_prefix_t *prefix,
                                      const pcr_upstream_cbs_t *cbs, void *ctx)
{
    return send_req(pool, head, body, 1, 0, prefill, prefix, cbs, ctx);
}

/* An unstreamed request's estimated first token: its prefill leaves the count. Its owner
 * hears first (its own count of the pod's queue), then held streams may go. */
static void prefill_due(evutil_socket_t fd, short what, void *arg)
{
    pcr_upreq_t *r = arg;
    pcr_pool_t *pool = r->pool;
    uncharge(r);
    if (r->cbs->on_prefill_due != NULL)
        r->cbs->on_prefill_due(r->ctx);
    budget_freed(pool);
}

int pcr_upstream_prefill_done(pcr_upreq_t *r)
{
    if (r == NULL)
        return 0;
    if (r->charged) {
        uncharge(r);
        budget_freed(r->pool);
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
    pcr_upconn_t *c = r->conn;
    if (c != NULL) {
        c->req = NULL;
        r->conn = NULL;
        /* Inside its own read callback the connection sees req == NULL once the parser
         * returns and closes itself there; otherwise close it now. Either way the pod sees
         * the connection close and stops generating. */
        req_free(r);
        if (!c->in_read)
            conn_close(c);
    } else {
        req_free(r);
    }
    budget_freed(pool); /* its prefill may have left the budget */
}

void pcr_upstream_pause(pcr_upreq_t *r)
{
    if (r == NULL || r->paused)
        return;
    r->paused = 1;
    if (r->conn) {
        pcr_sock_read_stop(r->conn->sock);
        evtimer_del(r->conn->timer); /* the client is slow, not the pod */
    }
}

void pcr_upstream_resume(pcr_upreq_t *r)
{
    if (r == NULL || !r->paused)
        return;
    r->paused = 0;
    if (r->conn) {
        pcr_sock_read_start(r->conn->sock);
        timer_arm(r->conn, r->conn->timer_ms);
        /* Bytes read before the pause are still in the input buffer. */
        if (evbuffer_get_length(pcr_sock_input(r->conn->sock)) > 0 && !r->conn->in_read)
            conn_parse(r->conn);
    }
}

void pcr_upstream_fail_held(pcr_pool_t *pool)
{
    /* One at a time from the head: an owner's callback may end other requests of this pool,
     * so no pointer is kept across one. */
    while (pool->nheld > 0) {
        pcr_upreq_t *r = TAILQ_FIRST(&pool->waiters);
        while (r != NULL && !r->in_hold)
            r = TAILQ_NEXT(r, wait_link);
        if (r == NULL)
            break;
        req_fail(r, PCR_UP_HELD_OUT, 0);
    }
}

void pcr_upstream_close_idle(pcr_pool_t *pool)
{
    pcr_upconn_t *c;
    while ((c = TAILQ_FIRST(&pool->idle)) != NULL)
        conn_close(c);
}
