/* router/http/exchange_int.h: the exchange's fields, shared by exchange.c (the container and
 * the state machine), respond.c (the answer's way to the client), proxy.c (the way to a pod),
 * the route table (routes.c), the router's own endpoints (endpoints.c) and the access-log line
 * (access.c). Nothing else includes it. */
#ifndef PCR_ROUTER_EXCHANGE_INT_H
#define PCR_ROUTER_EXCHANGE_INT_H

#include <event2/buffer.h>

#include "backend.h"
#include "pcr/flowq.h"
#include "exchange.h"
#include "pcr/pd.h"
#include "spare.h"
#include "usage.h"

#define PCR_MAX_REQ_HEADERS 100

/* A header name or value in an exchange's hbuf (at most limits.max_header_bytes, 1 MiB). */
typedef struct {
    uint32_t off, len;
} pcr_hfield_t;

typedef struct pcr_models_fanout pcr_models_fanout_t;

/* What a path is (routes.c holds the table, the exchange walks it): an answer of the router's
 * own, given at once (/health, /metrics) or gathered from the pods (/v1/models), a prompt to
 * route by its prefix, or a request balanced by load. */
typedef enum {
    PCR_ROUTE_ANSWER = 0,
    PCR_ROUTE_FANOUT,
    PCR_ROUTE_PROMPT,
    PCR_ROUTE_PROXY,
} pcr_route_kind_t;

typedef struct pcr_route {
    const char *path;                 /* the path (a query may follow), or a prefix ending '/' */
    const char *method;               /* the one it takes ("GET" takes HEAD too), Allow on 405 */
    pcr_route_kind_t kind;
    int own;                          /* the router's own: on the admin listener when there is one */
    int api;                          /* PCR_ROUTE_PROMPT: its pcr_api_t */
    /* Takes the request on: an answer, a fan-out, or the way to a pod; < 0: no backend to ask
     * (503, FANOUT only). */
    int (*serve)(pcr_exchange_t *ex);
    /* FANOUT: the exchange is freed before the answer came. */
    void (*cancel)(pcr_exchange_t *ex);
} pcr_route_t;

/* The routes in the order they are tried: exact paths before the prefixes that hold them. */
typedef struct pcr_route_table {
    const pcr_route_t *routes;
    size_t n;
} pcr_route_table_t;

/* routes.c: the table every worker's exchanges use. */
extern const pcr_route_table_t pcr_routes;

/* Where a request stands. Every change goes through pcr_exchange_to() in exchange.c, which owns
 * all the accounting attached to the states:
 *
 *   RECEIVING --run/reject--> ROUTING --dispatch--> UP_WAIT --head--> UP_HEAD --body--> UP_BODY
 *       |                      |   ^                  |                 |                 |
 *       |                      |   +----retry---------+                 +---> DONE <------+
 *       +----------------------+--> LOCAL (an answer of the router's own) --> DONE
 *                                   UP_HEAD / UP_BODY --pod broke--> ABORTED
 *   any state but RECEIVING, DONE, ABORTED --the client left--> GONE (at pcr_exchange_free)
 *
 *   running (w->inflight)        ROUTING and every state after it
 *   backend in flight, and       UP_WAIT, UP_HEAD, UP_BODY
 *     the request's own prefill  UP_WAIT, UP_HEAD (released when the first body byte arrives)
 *   status recorded              on entering DONE, ABORTED or GONE (as 499, nginx's "client
 *                                closed request"); per backend only for DONE and ABORTED
 * DONE and ABORTED are the pod's end: what respond.c keeps for a slow client may still be on its
 * way, and the session's end of the answer waits for it.
 */
typedef enum {
    EX_RECEIVING = 0,
    EX_ROUTING,
    EX_UP_WAIT,
    EX_UP_HEAD,
    EX_UP_BODY,
    EX_LOCAL,
    EX_DONE,
    EX_ABORTED,
    EX_GONE,
} pcr_ex_state_t;

struct pcr_exchange {
    pcr_worker_t *w;
    const pcr_exchange_ops_t *ops;
    void *sess;
    pcr_light_client_t *client_load;  /* the client connection's (pcr_exchange_set_client) */
    const char *proto;                /* "HTTP/1.1", "HTTP/2" */
    pcr_ex_state_t state;

    /* The request. Header names and values live in `hbuf`, where `hf` says. */
    char method[16];
    char *path;                       /* NULL until set; then path_buf */
    char *path_buf;                   /* path_cap bytes, kept when the exchange is recycled */
    size_t path_cap;
    char *hbuf;
    size_t hlen, hcap;
    /* Where each name and value lies in hbuf: hf[0..nh), names at even indexes. Grown as fields
     * come (up to PCR_MAX_REQ_HEADERS * 2) and kept when the exchange is recycled, so a request
     * that waits holds room for the fields it has, not for the most it may have. */
    pcr_hfield_t *hf;
    size_t hf_cap;
    size_t nh;
    struct evbuffer *body;
    size_t body_counted;              /* bytes of `body` counted in the process's body budget */
    int body_dropped;                 /* refused while waiting: body freed, uncounted (drop_body) */
    char peer[64];
    int admin;                        /* came through the admin listener */
    const pcr_route_t *route;         /* what its path is, from pcr_exchange_run (NULL: none) */

    /* Routing. */
    pcr_body_reader_t *reader;        /* a routed request's body, parsed as it arrives */
    pcr_body_t req;                   /* what it gave: model, key blocks (owned here) */
    pcr_key_t key;                    /* a view of req's blocks */
    int has_key;
    pcr_decision_t decision;
    uint32_t added_from;
    int committed;                    /* the index holds the speculative entry */
    pcr_backend_t *be;                /* current attempt's backend (referenced) */
    uint64_t prefill;                 /* the request's uncached prefill on `be` */
    uint64_t tried[PCR_MAX_BACKENDS / 64];  /* per backend slot: already failed this request */
    uint64_t model_hash;              /* of req.model, for the pods' model lists */
    unsigned attempts;
    int panic;                        /* routed while every candidate was down or ejected */
    int resynced;                     /* found no pod, and decided again after the bus */
    uint64_t held_us;                 /* how long it was held, over its attempts */
    uint64_t conn_wait_us;            /* how long it waited for a pod connection, over its
                                         attempts and legs (pcr_up_send_t) */
    int held;                         /* waited in the pool while the pod's prefill queue was
                                         full (routing.hold_tokens): no feedback from it */
    /* Its prefix was committed to `be` at t_commit and the pod may not have computed it yet: in
     * be->pending[worker] from the send until the first token (or the end). settled_before:
     * what pcr_backend_settled_before() said just before this request was sent. */
    uint64_t t_commit, settled_before;
    TAILQ_ENTRY(pcr_exchange) pend_link;
    int pending;
    pcr_up_error_t last_error;
    pcr_upreq_t *up;
    int paused;
    pcr_models_fanout_t *fanout;

    /* Tenancy (tenancy.c): who asked, in what order it goes, what it holds. */
    int identified;                   /* tenant and priority are set (pcr_tenancy_identify) */
    unsigned tslot;                   /* the tenant's slot (pcr_server_t.tenants) */
    int priority;                     /* the tenant's, or its objective's */
    int pod_priority;                 /* the body's "priority" for the pods, when */
    int has_pod_priority;             /* the same entry has pod_priority */
    int pod_body_done;                /* the body is as the pods get it (proxy_req.c) */
    unsigned pod_pslot;               /* its prefill is counted in the backend's
                                         prefill_by_slot[pod_pslot - 1]; 0: not */
    unsigned qslot;                   /* whose band and fairness counter it waits in: its
                                         tenant's, or its objective's entry's */
    int admitted;                     /* counted in its tenant's concurrency */
    uint64_t tokens;                  /* prompt plus max_tokens, as the limits count them */
    pcr_flowq_entry_t fentry;         /* waiting in the worker's flow queue when queued */
    uint64_t t_queued;                /* when it began waiting, us */
    uint64_t session;                 /* hash of its session key, 0: none */

    /* Response. */
    int status;
    uint64_t resp_bytes;
    /* Its bytes kept for a client slower than its pod (respond.c): after whatever the session
     * has queued, before any later byte. Counted in the process's response budget while held;
     * the buffer (NULL until first needed) is kept when the exchange is recycled. */
    struct evbuffer *kept;
    int end_waits;                    /* the end (RESPOND_END) or abort (RESPOND_ABORT) waits
                                         for `kept` to go out */
    uint64_t unsent_at_end;           /* kept or queued bytes not yet written when it ended */
    uint64_t t_start, t_head;
    uint64_t t_first;                 /* a stream's first token: its first body byte (0: none) */
    uint64_t prefill_ahead;           /* a stream's: the prefill its pod had been sent and had
                                         not finished when it went (pcr_upstream_sent_ahead) */
    int has_prefill_ahead;            /* prefill_ahead is known (a stream that got its first
                                         token) */

    /* Per-request truth: the cached tokens the decision predicted, and what the pod said. */
    int inject_usage;                 /* stream_options added to the body sent (request_usage) */
    pcr_usage_t usage;                /* reads the answer's usage as it is forwarded */
    uint64_t predicted;               /* cached tokens the current decision predicted */
    int64_t delivered;                /* cached tokens the pod reported, -1 until it did */
    /* The decision's phases (first attempt): ns_parse, the reader's time while the body came;
     * from t_parse_ns (the last byte is in) ns_hash, the reader's last step, then the policy. */
    uint64_t t_parse_ns, ns_parse, ns_hash;
    uint64_t t_hashed_ns;             /* the reader's last step ended; dispatch's "now", 0 after */
    /* Precise mode (tokenize.c): the tokenization under way (NULL: none), the key's token
     * chains (room for as many as the prompt makes, kept when recycled), and its time (ns). */
    struct pcr_tokreq *tok;
    uint64_t *tblocks;
    size_t tblocks_cap;
    uint64_t ns_tokenize;
    int tokenized;                    /* a tokenization was tried (its phase is recorded) */
    int tok_probe;                    /* it waits to probe an unknown tail (PCR_PREFIX_PROBE) */
    size_t tok_known;                 /* ... with this many chains known before */

    /* Disaggregation (pd_proxy.c): a prompt prefilled on a prefill pod, then decoded on a pod
     * that pulls its KV blocks. pd_state: PD_NONE (not decided yet, or no roles), PD_PREFILL
     * (the prefill leg is under way: be, up and prefill are its own), PD_DECODE (the decode
     * leg, given the prefill pod's kv_transfer_params in pd_body), PD_LOCAL (decoded and
     * prefilled on one pod, decided so or after the prefill leg failed). */
    int pd_state;
    pcr_pd_outcome_t pd_outcome;
    unsigned pd_attempts;             /* prefill legs sent */
    pcr_decision_t pd_decision;       /* the prefill pod's, for its feedback */
    uint32_t pd_added_from;
    int pd_committed;                 /* the prefill pod's speculative index entry is in */
    uint64_t pd_settled_before;
    struct evbuffer *pd_resp;         /* the prefill leg's answer (bounded) */
    int pd_status;
    struct evbuffer *pd_body;         /* the decode leg's body (NULL: `body` as it came) */
    uint64_t pd_cached;               /* the prefill pod's cached tokens, told to the client */
    int pd_has_cached;
    int pd_prefill_slot;              /* the prefill pod that the decode leg pulls from */
    uint64_t pd_t_answer;             /* when the last prefill leg's answer began, us (0: none) */
    char pd_reqid[40];                /* X-Request-Id pcrouter made for both legs ("": the
                                         client's own is forwarded) */

    pcr_spare_link_t spare;           /* on its thread's list of spare exchanges (exchange.c) */
};

/* exchange.c, for proxy.c: a state change (the one transition function, which owns the
 * accounting), an unstreamed completion's prefill at its expected first token, the start and
 * the end of the body reader (routed requests: counted in the memory account while held), the
 * head and the body of an answer. */
void pcr_exchange_to(pcr_exchange_t *ex, pcr_ex_state_t to);
void pcr_exchange_prefill_due(pcr_exchange_t *ex);
int pcr_exchange_reader_start(pcr_exchange_t *ex);
void pcr_exchange_reader_release(pcr_exchange_t *ex);
void pcr_exchange_respond_head(pcr_exchange_t *ex, int status, const pcr_hdr_t *h, size_t n,
                               int64_t clen);
/* respond.c: the answer's body and its end, through the exchange's own buffer when the
 * client is slower than the pod (limits.max_response_buffer_bytes); whether the pod's reading
 * must pause now (the client is slow and the buffer, or the process's budget, is full); the
 * buffer's bytes released when the exchange goes. */
void pcr_exchange_respond_body(pcr_exchange_t *ex, const char *data, size_t len);
enum { RESPOND_END = 1, RESPOND_ABORT };
void pcr_exchange_respond_end(pcr_exchange_t *ex, int how);
int pcr_exchange_out_full(pcr_exchange_t *ex);
void pcr_exchange_kept_release(pcr_exchange_t *ex);
/* Bytes of the answer not yet written to the client's connection: kept, or queued for writing. */
size_t pcr_exchange_unsent(pcr_exchange_t *ex);
/* pcr_exchange_error with response fields of its own (Retry-After, WWW-Authenticate). */
void pcr_exchange_error_with(pcr_exchange_t *ex, int status, const char *type, const char *code,
                             const pcr_hdr_t *extra, size_t nextra, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/* proxy.c: a routed request (a prompt: its key, then the decision) and any request to a pod;
 * the route table names them. Both return 0: what goes wrong is answered to the client. */
int pcr_proxy_routed(pcr_exchange_t *ex);
int pcr_proxy_dispatch(pcr_exchange_t *ex);
/* proxy.c's upstream callbacks that pd_proxy.c's prefill leg shares (arg: the exchange): its
 * client's standing with the pools (pcr/connshare.h), its expected first token behind `tokens`
 * of prefill, its tenant's fairness counter, and that moment come. */
pcr_light_client_t *pcr_proxy_up_owner(void *arg);
uint64_t pcr_proxy_up_prefill_us(void *arg, uint64_t tokens);
double pcr_proxy_up_fair(void *arg);
void pcr_proxy_up_prefill_due(void *arg);
/* proxy.c, for pd_proxy.c: the request for `be` with `src` as its body (taken by reference
 * when nothing is added: *body is then src, else NULL), and pcrouter's own X-Request-Id when
 * ex->pd_reqid is set. NULL when out of memory. `usage`: add stream_options as
 * upstream.request_usage asks. */
/* Once, before the first attempt: where the config gives the pods a priority
 * (tenants.NAME.pod_priority), the body's top-level "priority" becomes the request's, or goes
 * when its tenant sets none (a client never picks its own); re-encoded with jansson, nothing
 * else changed but its spelling. Returns 0, or -1 having answered the error itself. */
int pcr_proxy_pod_body(pcr_exchange_t *ex);

struct evbuffer *pcr_proxy_request(pcr_exchange_t *ex, pcr_backend_t *be, struct evbuffer *src,
                                   int usage, struct evbuffer **body);
/* Fills loads[0..n) for the policy (usable = up, not ejected, not tried, serves the model);
 * returns how many are usable. */
size_t pcr_proxy_fill_loads(pcr_exchange_t *ex, pcr_backend_load_t *loads, size_t n, uint64_t now);

enum { PD_NONE = 0, PD_PREFILL, PD_DECODE, PD_LOCAL };

/* pd_proxy.c: whether any backend has a role other than "both" (roles[0..n) are set either
 * way); the prefill leg of a REMOTE decision (what goes wrong sends the request on to its
 * decode pod). The exchange frees pd_resp and pd_body. */
int pcr_pd_roles(pcr_exchange_t *ex, unsigned char *roles, size_t n);
void pcr_pd_prefill(pcr_exchange_t *ex, const pcr_pd_decision_t *pdd, uint64_t now);
int pcr_proxy_plain(pcr_exchange_t *ex);      /* other POST /v1/...: identify, admit, dispatch */

/* tenancy.c: who the request is (API key, tenant header, objective): 0 to go on, -1 when it
 * was answered (401). Then its admission once its tokens are known: the tenant's limits
 * (429), the pool's saturation (shed, or wait in the flow queue). 0: send it now with `go`;
 * 1: it waits and `go` sends it when released; -1: answered. */
int pcr_tenancy_identify(pcr_exchange_t *ex);
int pcr_tenancy_admit(pcr_exchange_t *ex, int (*go)(pcr_exchange_t *ex));
/* What the request was served, for flow control's fairness and the tenant's counters. */
void pcr_tenancy_served(pcr_exchange_t *ex, uint64_t output_tokens);
/* For the pools' hold queue: the pod priority classes (slots) whose prefill the pods preempt
 * for this request (0 without pod priorities), and its tenant's fairness counter now (0
 * without flow control's queue). */
uint64_t pcr_tenancy_passes(const pcr_exchange_t *ex);
double pcr_tenancy_fair(const pcr_exchange_t *ex);
/* A session's pod for the decision (-1: none or not to be kept), and the pod it went to. */
int pcr_tenancy_session_pod(pcr_exchange_t *ex, const pcr_backend_load_t *loads, size_t n);
void pcr_tenancy_session_went(pcr_exchange_t *ex, int backend);

/* access.c: the request's access-log line (log.access_log), handed to the writer. */
void pcr_access_record(const pcr_exchange_t *ex, int status, uint64_t now_us);

/* endpoints.c: the answers of the router's own (routes.c names them). */
int pcr_endpoint_health(pcr_exchange_t *ex);
int pcr_endpoint_metrics(pcr_exchange_t *ex);
int pcr_endpoint_models(pcr_exchange_t *ex);   /* starts the fan-out */
void pcr_endpoint_models_cancel(pcr_exchange_t *ex);

#endif
