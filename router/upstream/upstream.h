/* router/upstream/upstream.h: one HTTP/1.1 request to a backend, over a pooled keep-alive
 * connection.
 *
 * The caller hands over the complete request bytes and a callback table; the response comes
 * back piece by piece as it arrives (head, body chunks, end) so SSE streams flow through.
 * After on_done or on_error the request object is gone; pcr_upstream_cancel() ends it early
 * (the connection is closed, so the pod sees the client leave and stops generating). */
#ifndef PCR_ROUTER_UPSTREAM_H
#define PCR_ROUTER_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "config.h"
#include "pcr/connshare.h"

struct evbuffer;
struct event_base;
typedef struct pcr_backend pcr_backend_t;
typedef struct pcr_upreq pcr_upreq_t;

typedef struct {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} pcr_hdr_t;

typedef enum {
    PCR_UP_CONNECT = 1,   /* could not connect: nothing was sent */
    PCR_UP_RESET,         /* connection closed or broke before the response ended */
    PCR_UP_TIMEOUT,       /* no response (or no more of it) within the configured time */
    PCR_UP_PROTOCOL,      /* the backend's response was not valid HTTP/1.1 */
    PCR_UP_POOL_FULL,     /* no connection slot freed up in time */
    PCR_UP_HELD,          /* held (routing.hold_tokens) until timeouts.response_ms */
    PCR_UP_HELD_OUT,      /* held while the backend went out of rotation: nothing was sent */
} pcr_up_error_t;

typedef struct {
    /* Status and headers (pointers valid during the call). content_length is -1 when the
     * length is not known in advance (chunked or close-delimited). */
    void (*on_head)(void *ctx, int status, const pcr_hdr_t *hdrs, size_t nhdrs,
                    int64_t content_length);
    void (*on_body)(void *ctx, const char *data, size_t len);
    void (*on_done)(void *ctx);
    /* `got_head` tells whether on_head was already called (then the response is cut short). */
    void (*on_error)(void *ctx, pcr_up_error_t err, int got_head);
    /* Optional: the standing of the client this one is for (pcr/connshare.h): its count of
     * requests on pod connections, which this one keeps while it has a connection, and whether
     * it left answers unread lately. Waiters whose client counts for less go first. */
    pcr_light_client_t *(*owner)(void *ctx);
    /* Optional, for PCR_UP_UNSTREAMED: how long after its send the pod is
     * expected to reach a first token behind `tokens` of prefill (what was sent it before the
     * request and not finished, and the request's own), in microseconds; and the call made
     * when that time has come, before the answer (never after on_done, on_error or
     * pcr_upstream_cancel). prefill_us is a question, and may be asked inside the send;
     * on_prefill_due must not end the request. */
    uint64_t (*prefill_us)(void *ctx, uint64_t tokens);
    void (*on_prefill_due)(void *ctx);
    /* Optional: the fairness counter of the request's tenant now (pcr/flowq.h), lower first
     * among held completions of one priority. */
    double (*fair)(void *ctx);
} pcr_upstream_cbs_t;

/* The connections of one thread to one backend: idle keep-alive connections (most recently
 * used first) and the requests waiting for a slot, or held back while the backend's prefill
 * queue is full (pcr/hold.h). Owned by one event loop, never shared. */
struct pcr_upconn;
struct pcr_upreq;
struct pcr_up_transport;
typedef struct pcr_pool {
    pcr_backend_t *be;
    const struct pcr_up_transport *transport; /* how requests reach the pod (upstream_int.h) */
    struct event_base *base;
    const int *draining;             /* the owner's flag: no new idle connections once set */
    const pcr_config_t *const *cfg;  /* the owner's config (a reload swaps it) */
    TAILQ_HEAD(pcr_upconn_idle, pcr_upconn) idle;
    TAILQ_HEAD(pcr_upreq_wait, pcr_upreq) waiters;
    unsigned nconns;                 /* open: connecting + idle + busy */
    unsigned nidle;
    unsigned handing;                /* a connection on its way from its answer's end to the
                                        next waiter (1 inside conn_to_pool): free to that one */
    unsigned max_connections;
    uint64_t sent_prefill;           /* uncached prefill sent, not yet at a first token: streams'
                                        and, until their estimate, unstreamed completions'
                                        (this worker's; the backend's counts every worker's) */
    unsigned nheld;                  /* completions held in `waiters` */
    unsigned nblind;                 /* requests of blind clients on its connections */
    /* The owner (pcr_pool_set_owner): its slot in the backend's pending[] (a worker's id; -1:
     * none, as the control thread's pool), and the call that tells the other owners when the
     * pod's budget opens while they hold completions for it (NULL: nobody to tell). */
    int owner_slot;
    void (*on_budget_open)(void *owner);
    void *owner;
    struct pcr_upreq *best_held;     /* the held one published as this worker's next */
} pcr_pool_t;

void pcr_pool_init(pcr_pool_t *pool, pcr_backend_t *be, struct event_base *base,
                   unsigned max_connections, const int *draining,
                   const pcr_config_t *const *cfg);
/* The pool belongs to the worker in `slot` of the backend's pending[]: its held streams take
 * part in the one rank order over the workers, and `on_budget_open(owner)` is called when the
 * budget opens while others hold streams. Without it the pool holds for itself alone. */
void pcr_pool_set_owner(pcr_pool_t *pool, int slot, void (*on_budget_open)(void *owner),
                        void *owner);
/* Closes the idle connections; the busy ones end with their requests. */
void pcr_pool_dispose(pcr_pool_t *pool);

/* The prefix a completion was routed with, for the order among held ones: a held completion
 * goes before one that counts as cached the blocks it brings to the pod (pcr_hold_depends).
 * `blocks` is the caller's and stays unchanged until the request ends; NULL (or nblocks 0): no
 * key. */
typedef struct {
    const uint64_t *blocks;          /* the key's chained block hashes */
    uint32_t nblocks;
    uint32_t matched;                /* leading blocks the backend held at the decision */
    uint32_t added_from;             /* first block it did not hold before (nblocks: none) */
} pcr_up_prefix_t;

/* What a request is to the pod's prefill budget (routing.hold_tokens). */
typedef enum {
    /* Not a completion (a probe, a models list, a pass-through): never held, counts nothing. */
    PCR_UP_PLAIN = 0,
    /* A streamed completion with `prefill` tokens of uncached prefill. It counts against
     * routing.hold_tokens, with every worker's completions to the backend, from when it is
     * sent until pcr_upstream_prefill_done() or its end. While the budget is spent, such
     * requests wait in the pool and go in their priority bands, then highest pcr_hold_rank
     * first over every worker (pcr/hold.h), except that a completion held on this worker whose blocks the first counts
     * on goes before it; or they fail with PCR_UP_HELD after timeouts.response_ms. */
    PCR_UP_STREAM,
    /* A completion that is not streamed. It shows no first token before its whole answer, yet
     * its prefill is in the pod's queue: it is held and counts against routing.hold_tokens (and
     * in pcr_upstream_sent_ahead() of what is sent after it) as a stream does, from when it is
     * sent until cbs->prefill_us() later (then cbs->on_prefill_due()), its answer's first body
     * byte (pcr_upstream_prefill_done) or its end, whichever comes first. */
    PCR_UP_UNSTREAMED,
} pcr_up_kind_t;

/* One request to a pod, as the caller describes it to pcr_upstream_send(). */
typedef struct {
    struct evbuffer *head;           /* taken: the request's head, or its whole bytes */
    /* Sent after `head` by reference, not copied (NULL: none). The caller leaves it unchanged
     * (nothing added or drained) until the request ends: on_done, on_error, or
     * pcr_upstream_cancel(). */
    struct evbuffer *body;
    pcr_up_kind_t kind;
    uint64_t prefill;                /* its uncached prefill, tokens (completions only) */
    const pcr_up_prefix_t *prefix;   /* what it was routed with (copied; NULL: none) */
    /* For the order of held completions (pcr_hold_before) and their budget: its priority
     * (higher first), the class of pod priority its prefill is counted in (1 + the class's
     * index below PCR_MAX_TENANTS; 0: none), and the classes whose prefill a pod preempts for
     * it (bit i: class i + 1), which its budget leaves out. */
    int priority;
    unsigned pclass;
    uint64_t passes;
    /* The caller's: the time the request waits for a connection slot (every one of the pool's
     * max_connections busy, or the rest kept for light clients) is added to it, in us, as each
     * wait ends (NULL: not counted). It outlives the request. */
    uint64_t *conn_wait_us;
} pcr_up_send_t;

/* The one way a request goes to a pod: over `pool`, through the pool's transport (today the
 * HTTP/1.1 client, upstream_h1.c), after any wait for a connection slot or, for a completion,
 * for the pod's prefill budget. `req->head` is taken whatever the result. Returns the request
 * handle, or NULL when out of memory (no callback is made then). Callbacks never run inside
 * this call. */
pcr_upreq_t *pcr_upstream_send(pcr_pool_t *pool, const pcr_up_send_t *req,
                               const pcr_upstream_cbs_t *cbs, void *ctx);

/* The stream's first event came back: its prefill is done and leaves the budget; held requests
 * may go. Returns 1 when the request itself had been held (others may have gone ahead of it),
 * else 0. Once per request; later calls return the same and change nothing. */
int pcr_upstream_prefill_done(pcr_upreq_t *r);

/* The backend's prefill budget may have opened through another worker's stream: held streams
 * that may go now do, while no other worker's next held stream ranks higher. */
void pcr_upstream_kick(pcr_pool_t *pool);

/* How long the request has been held so far, in microseconds (0 when never). */
uint64_t pcr_upstream_held_us(const pcr_upreq_t *r);

/* The uncached prefill that every worker had sent the backend and not seen reach a first token
 * when this one went (routing.hold_tokens' count; 0 for requests sent without a prefill). */
uint64_t pcr_upstream_sent_ahead(const pcr_upreq_t *r);

/* When a request sent with a prefill went to its pod (pcr_now_us), after any wait for the
 * budget or a connection slot; 0 for other requests and before it went. */
uint64_t pcr_upstream_sent_us(const pcr_upreq_t *r);

/* Fails every stream held in the pool with PCR_UP_HELD_OUT, the oldest first: its backend is
 * out of rotation (down, ejected, removed), so their owners route them again rather than wait
 * for it. Never from inside a callback of this pool's requests. */
void pcr_upstream_fail_held(pcr_pool_t *pool);

/* Ends the request now; no callback follows. Safe from inside the request's own callbacks. */
void pcr_upstream_cancel(pcr_upreq_t *r);

/* Backpressure: stop / restart reading the response (the client is slow). */
void pcr_upstream_pause(pcr_upreq_t *r);
void pcr_upstream_resume(pcr_upreq_t *r);

/* Closes every idle connection of the pool (drain). */
void pcr_upstream_close_idle(pcr_pool_t *pool);

#endif
