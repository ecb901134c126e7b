/* router/upstream/upstream_int.h: the upstream module's own: a request and a connection as the
 * three files of the module see them (upstream.c, upstream_queue.c, upstream_h1.c), the
 * transport table between the generic half and the HTTP/1.1 client, and the calls between
 * them. Nothing else includes it. */
#ifndef PCR_ROUTER_UPSTREAM_INT_H
#define PCR_ROUTER_UPSTREAM_INT_H

#include <event2/event.h>
#include <http_parser.h>

#include "backend.h"
#include "http1.h"
#include "server.h"
#include "sock.h"
#include "upstream.h"

#define MAX_RESP_HEADERS 64
/* A release looks at most this many waiters, the longest-waiting first, so a flood of held
 * streams costs a bounded time per first token; a younger one's turn comes as they leave. */
#define HOLD_SCAN 1024
#define MAX_RESP_HEADER_BYTES 65536

/* Where a request stands; pcr_upreq_to() alone changes it.
 *
 *   READY -> WAITING | HELD -> READY -> ON_CONN -> (end)
 *   READY -> ON_CONN -> READY (a stale pooled connection: re-sent once) -> ...
 *
 * A request ends (pcr_upreq_free) from any state. */
typedef enum {
    UPR_READY,    /* neither queued nor on a connection: new, taken off the queue, or re-sent */
    UPR_WAITING,  /* in pool->waiters for a connection slot */
    UPR_HELD,     /* in pool->waiters because the pod's prefill budget is spent (or what it
                     counts on waits): the backend's `held` gauge */
    UPR_ON_CONN,  /* on a connection (r->conn): connecting, written, or its answer arriving */
} pcr_upr_state_t;

struct pcr_upreq {
    pcr_pool_t *pool;
    pcr_upr_state_t state;
    pcr_upconn_t *conn;              /* NULL while waiting for a slot */
    struct evbuffer *request;        /* the bytes to send, kept for the one stale-conn re-send */
    struct evbuffer *body;           /* the caller's, sent after them by reference (or NULL) */
    const pcr_upstream_cbs_t *cbs;
    void *ctx;
    pcr_light_client_t *owner;       /* its client's standing with the pools (cbs->owner) */
    struct event *wait_timer;        /* while queued for a slot */
    struct event *prefill_timer;     /* unstreamed: when its prefill is taken as done */
    TAILQ_ENTRY(pcr_upreq) wait_link; /* waiters, higher priority first, else in arrival order */
    uint64_t t_queued;               /* when it joined the queue, us */
    uint64_t t_wait;                 /* when it began to wait for a slot (WAITING), us */
    uint64_t *conn_wait_us;          /* the caller's sum of those waits (pcr_up_send_t) */
    uint64_t held_us;                /* time spent held, us (pcr_upstream_held_us) */
    uint64_t prefill;                /* its uncached prefill, tokens (streams and unstreamed) */
    uint64_t ahead;                  /* the backend's sent_prefill when it was charged */
    uint64_t t_sent;                 /* when it was charged (went to the pod), us */
    pcr_up_prefix_t prefix;          /* what it was routed with (pcr_hold_depends) */
    pcr_up_kind_t kind;              /* what it is to the prefill budget (fixed) */
    int priority;                    /* its band among waiters (pcr_up_send_t) */
    unsigned pclass;                 /* its pod priority class + 1, 0: none */
    uint64_t passes;                 /* the classes its budget leaves out */
    /* Flags that are not where it stands. `charged` follows its prefill, which leaves the count
     * at the first token (or the estimate) while the request stays on its connection, and stays
     * counted through a re-send; the next three are its history; `paused` is the client side's
     * backpressure, in whatever state. */
    int charged;                     /* its prefill is in pool->sent_prefill */
    int held;                        /* has been HELD (pcr_upstream_prefill_done reports it) */
    int resent;                      /* re-sent once after a stale pooled connection: it goes on
                                        a new connection */
    int busy;                        /* counted in *owner: it has been ON_CONN */
    int blind_on;                    /* counted in pool->nblind: on a connection, its client
                                        blind when it took it */
    int paused;
};

/* A completion: counts against routing.hold_tokens and may be held. */
static inline int pcr_upreq_budgeted(const pcr_upreq_t *r) { return r->kind != PCR_UP_PLAIN; }
/* Not streamed: its prefill leaves the count at the caller's estimate (cbs->prefill_us). */
static inline int pcr_upreq_estimated(const pcr_upreq_t *r)
{
    return r->kind == PCR_UP_UNSTREAMED && r->prefill > 0;
}
/* It leaves its connection: no longer one of the pool's blind requests. */
static inline void pcr_upreq_off_conn(pcr_upreq_t *r)
{
    if (r->blind_on) {
        r->blind_on = 0;
        r->pool->nblind--;
    }
}
static inline int pcr_upreq_queued(const pcr_upreq_t *r)
{
    return r->state == UPR_WAITING || r->state == UPR_HELD;
}

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

/* A transport to the pods: how a request reaches one over the pool's connections. The generic
 * half of the module (upstream.c, upstream_queue.c) calls only these; the HTTP/1.1 client
 * (upstream_h1.c) is the one there is, and a TLS or HTTP/2 client would be another table. A
 * transport reports each request's end with pcr_upreq_free / pcr_upreq_fail and the callbacks,
 * and gives a freed slot to pcr_upq_next()'s choice. */
typedef struct pcr_up_transport {
    /* To an idle connection, a new one, or the queue (for a slot or the prefill budget). */
    void (*dispatch)(pcr_upreq_t *r);
    /* `r` is cancelled while it has a connection: detach and free it, and end the connection
     * so the pod sees the client leave (later, when inside the connection's own read). */
    void (*abort)(pcr_upreq_t *r);
    /* Backpressure on the response of a request that has a connection. */
    void (*pause)(pcr_upreq_t *r);
    void (*resume)(pcr_upreq_t *r);
    /* Closes the pool's idle connections. */
    void (*close_idle)(pcr_pool_t *pool);
} pcr_up_transport_t;

extern const pcr_up_transport_t pcr_up_h1;

/* The timeouts of the thread that owns the pool: a worker's config may be newer than what the
 * control thread reads (a reload is seen by each thread in turn). */
static inline const pcr_timeouts_conf_t *tmo(const pcr_pool_t *pool)
{
    return &(*pool->cfg)->timeouts;
}

/* upstream.c: a request's move to another state (the accounting that goes with it: the owner's
 * count on its first connection, the held gauges and time); a request's end. free: no callback;
 * fail: a request with no connection, then its owner's on_error. */
void pcr_upreq_to(pcr_upreq_t *r, pcr_upr_state_t to);
void pcr_upreq_free(pcr_upreq_t *r);
void pcr_upreq_fail(pcr_upreq_t *r, pcr_up_error_t err, int got_head);

/* upstream_queue.c: the budget (routing.hold_tokens, 0: none) and whether it is open (for `r`,
 * the classes it passes left out; NULL: none); a request's prefill in and out of the count;
 * into the queue (`hold`: because the budget is spent) and out of it (to be sent: counted
 * first, then dispatched by `send`); who goes next (NULL: nobody may); the held stream whose
 * blocks `r` counts on; whether `r` may take a free connection (the light clients' reserve,
 * pcr/connshare.h), whether it should open a fresh one rather than take an idle one
 * (pcr_light_fresh), and the note that `r`'s client is light and needs the reserve, from which
 * on it is kept; and, once a prefill left the budget, the kick of this pool and of the
 * others. */
uint64_t pcr_upq_budget(const pcr_pool_t *pool);
int pcr_upq_open(const pcr_pool_t *pool, const pcr_upreq_t *r);
void pcr_upq_charge(pcr_upreq_t *r);
void pcr_upq_uncharge(pcr_upreq_t *r);
void pcr_upq_add(pcr_upreq_t *r, int hold);
void pcr_upq_take(pcr_upreq_t *r);
void pcr_upq_take_to_send(pcr_upreq_t *r);
void pcr_upq_send(pcr_upreq_t *r);
pcr_upreq_t *pcr_upq_next(pcr_pool_t *pool);
int pcr_upq_may_take(const pcr_pool_t *pool, const pcr_upreq_t *r);
int pcr_upq_fresh(const pcr_pool_t *pool, const pcr_upreq_t *r);
void pcr_upq_note_light(pcr_pool_t *pool, const pcr_upreq_t *r);
pcr_upreq_t *pcr_upq_bringer(pcr_pool_t *pool, const pcr_upreq_t *r);
void pcr_upq_freed(pcr_pool_t *pool);


#endif
