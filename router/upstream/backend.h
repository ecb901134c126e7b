/* router/upstream/backend.h: one backend (a vLLM pod) at run time, shared by every thread: its
 * address, the load the router counts on it, its health, what its pod reports, and its counters.
 * Fields that several threads touch are read and written with the relaxed atomics of server.h.
 *
 * Backends come and go while the router runs (a config reload, DNS discovery). Each lives in a
 * numbered slot of srv->backends, the same number the routing policy knows it by; a slot is
 * empty (NULL) when its backend left. A backend that leaves is removed from its slot at once
 * (no new request picks it) but freed only once nothing holds it: every exchange sent to it and
 * every worker's pool of connections to it takes a reference, and the control thread frees it
 * after a grace period in which every worker has passed its tick (so a pointer a worker read
 * from a slot during one callback is never freed under it).
 *
 * The connections to it live in pools (pcr_pool_t), one per worker and one on the control
 * thread for health checks and scrapes, never shared between threads (upstream.h). The
 * registry (backend.c) sends nothing to a pod: the control thread's checks hang off it through
 * pcr_backend_hooks_t (control.c). */
#ifndef PCR_ROUTER_BACKEND_H
#define PCR_ROUTER_BACKEND_H

#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "config.h"
#include "server.h"

#define PCR_MAX_BACKENDS 1024
#define PCR_MAX_MODELS 256

/* A set of model names, as hashes, written by the control thread under a sequence lock and
 * read by any worker. */
typedef struct {
    uint32_t seq;                            /* odd while being written */
    uint32_t known;                          /* written at least once */
    uint32_t n;
    uint64_t h[PCR_MAX_MODELS];
} pcr_modelset_t;

typedef struct pcr_upconn pcr_upconn_t;

/* One worker's own on a backend, written by that worker only, read by the others (a cache line
 * each). `list`: its requests that carry a prefix and have not reached their first token (or
 * their end), oldest commit first: the prefixes the pod may not have computed yet (exchange.c);
 * `since` is what the others read of it. `held_at`, `held_prefill`: its held stream that goes
 * next (the first by pcr_hold_before when it last looked) and its priority `held_prio`, so that a
 * release on any worker goes in one order of bands and ranks (upstream_queue.c). */
struct pcr_exchange;
typedef struct pcr_pending {
    TAILQ_HEAD(pcr_pending_list, pcr_exchange) list;
    uint64_t since;                          /* atomic: the oldest's commit time, UINT64_MAX none */
    uint64_t held_at;                        /* atomic: when it was held, us; 0: none held */
    uint64_t held_prefill;                   /* atomic: its prefill, tokens */
    int64_t held_prio;                       /* atomic: its priority */
    char pad[64 - sizeof(struct pcr_pending_list) - 4 * sizeof(uint64_t)];
} pcr_pending_t;
typedef struct pcr_upreq pcr_upreq_t;

struct pcr_backend {
    pcr_server_t *srv;
    int id;                                  /* its slot: index in srv->backends and the policy */
    pcr_backend_conf_t conf;                 /* its own copy; name, url, host, port never change */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char *host_header;                       /* "host:port" for the Host header */
    unsigned max_connections;                /* for the whole process (atomic: a reload moves it) */
    int removed;                             /* left the config: draining (atomic) */
    int discovered;                          /* found by DNS discovery (disc_dns, disc_port) */
    char *disc_dns;
    unsigned disc_port;
    unsigned refs;                           /* exchanges and pools holding it (atomic) */
    uint64_t retired_epoch;                  /* control thread: freed once workers passed it */
    LIST_ENTRY(pcr_backend) retired_link;

    /* Load as the router counts it, fed to the policy (atomic: every worker updates it). */
    uint32_t inflight;
    uint64_t queued_prefill;                 /* uncached prefill tokens of in-flight requests */
    uint64_t prefill_by_slot[PCR_MAX_TENANTS]; /* of them, those sent while some tenant had a
                                              pod_priority, by the slot of the tenant whose
                                              pod_priority they carry (exchange.c) */
    uint32_t conns;                          /* request connections, all workers */
    uint32_t held;                           /* streams held in the pools (routing.hold_tokens) */
    uint64_t held_total;                     /* ... ever */
    uint64_t conn_waits;                     /* times a request waited for a connection slot */
    uint64_t sent_prefill;                   /* the pools' sent_prefill, summed (upstream_queue.c) */
    uint64_t sent_by_class[PCR_MAX_TENANTS]; /* of it, by the pod priority class the requests
                                              carry (pcr_up_send_t.pclass) */
    pcr_pending_t *pending;                  /* [npending]: each worker's own (exchange.c) */
    unsigned npending;                       /* srv->nworkers when it was made */
    /* What the pod reports, from the control thread's scrape (atomic). */
    uint32_t pod_waiting;                    /* vllm:num_requests_waiting, last scrape */
    uint32_t pod_running;                    /* vllm:num_requests_running, last scrape */
    uint64_t pod_hits, pod_queries;          /* prefix-cache counters (tokens), as deltas */
    uint64_t pod_scrapes;
    uint64_t pod_cache_tokens;               /* KV capacity from vllm:cache_config_info, 0 unknown */
    uint32_t pod_kv_usage_ppm;               /* vllm:kv_cache_usage_perc, in millionths */
    int pod_kv_usage_known;                  /* the pod reported it at least once */
    uint64_t restarts;                       /* restarts the scrape saw (atomic) */
    uint64_t probes_too_large;               /* checks, scrapes, model lists cut at their cap */
    /* The scrape's own state (control thread only). */
    double pod_start_time;                   /* process_start_time_seconds, 0 unknown */
    uint64_t pod_hits_last, pod_queries_last;
    int pod_have_hits, pod_have_queries;
    uint64_t pod_reset_us;                   /* the last time its counters went back */
    int pod_counters_flap;                   /* they went back twice in a minute: not counted,
                                                nor in the fleet's delivered hit rate (atomic) */
    /* The requests it finished (its vllm:request_success_total) and those it answered this
     * router, at the last scrape: their growth goes to the pool's sharing window (scrape.c). */
    uint64_t pod_success_last, ours_last;
    int pod_have_success;
    int shared_told;                         /* the pool's verdict its policy entries were
                                                told (server.h pods_shared), 0 none yet */
    struct pcr_probe *scrape_req;            /* scrape.c, on a check connection (probe.h) */
    void *scrape_ctx;

    /* The models it serves: those its config lists, and those its pod says it serves (GET
     * /v1/models, LoRA adapters included). */
    pcr_modelset_t cfg_models;
    pcr_modelset_t pod_models;
    struct pcr_probe *models_req;            /* models.c */
    void *models_ctx;
    uint64_t models_at_us;                   /* control: when the pod was last asked */

    /* Health: active checks move `up` (control thread); passive outlier detection, from the
     * outcome of real requests on any worker, ejects the backend for a while (atomics). */
    int up;                                  /* atomic */
    unsigned consecutive_failures;           /* active checks (atomic) */
    unsigned consecutive_successes;          /* atomic */
    unsigned consecutive_errors;             /* requests: 5xx, reset, timeout, malformed (atomic) */
    unsigned consecutive_connect_errors;     /* requests: refused or timed-out connects (atomic) */
    unsigned ejections;                      /* in a row, for the back-off (atomic) */
    uint64_t ejected_until_us;               /* 0: not ejected (atomic) */
    int ejected_for_connects;                /* the ejection in force came from failed
                                                connects, so a probe may end it (atomic) */
    uint64_t ejected_at_us;                  /* atomic */
    uint64_t ejections_total;                /* atomic */
    struct event *health_timer;              /* health.c */
    struct pcr_probe *health_req;            /* the check in flight */
    int health_status;                       /* its answer's status, 0 before the head */
    pcr_pool_t *check_pool;                  /* the control thread's connections (control.c) */

    /* TLS to the pod (an https:// url, or a discovery entry's "tls"): the context every
     * connection to it is made with (atomic: a reload swaps it, re-reading the certificates;
     * the old one is freed once every worker has passed its tick, as a backend is), and the
     * name sent as SNI and verified. NULL: plain HTTP. */
    struct ssl_ctx_st *tls_ctx;
    struct pcr_tls_retired *tls_retired;     /* control thread: swapped out, not freed yet */
    char *tls_name;
    int tls_verify;
    uint64_t tls_errors;                     /* handshakes that failed, verification included (atomic) */

    /* Counters for /metrics (atomic). */
    uint64_t requests_by_code[600];
    /* Cached prompt tokens, over the requests whose pod reported its usage (proxy.c): what
     * the index predicted, what the pod said it reused, and their prompts' tokens. */
    uint64_t cached_predicted, cached_delivered, prompt_tokens;
    uint64_t connect_errors;
    uint64_t upstream_errors;                /* resets, timeouts, malformed responses */
};

/* The backend in slot `id` now, or NULL (empty, or out of range). Any thread; a worker may use
 * the pointer until its callback returns, or longer with a reference. */
pcr_backend_t *pcr_backend_at(const pcr_server_t *srv, size_t id);
/* Slots in use or used before: every id is below it (any thread). */
size_t pcr_backend_slots(const pcr_server_t *srv);
void pcr_backend_ref(pcr_backend_t *be);
void pcr_backend_unref(pcr_backend_t *be);

/* The oldest commit time among the requests any worker has sent to `be` with a prefix that have
 * not reached their first token yet, UINT64_MAX when none: every prefix committed to it before
 * that is in the pod's cache, unless evicted (pcr_policy_feedback's settled_before). Any
 * thread. */
uint64_t pcr_backend_settled_before(const pcr_backend_t *be);

/* What the control thread does with a backend's checks (control.c), called by the registry so
 * that a backend added at start, by a reload or by discovery gets them alike: `prepare` before
 * the backend is published (its check connection and timer; < 0 refuses it), `join` once it
 * is, `leave` when it leaves its slot, `busy` while a check still runs (it is freed only after),
 * `dispose` before it is freed (also after a failed `prepare`). */
typedef struct pcr_backend_hooks {
    int (*prepare)(pcr_backend_t *be);
    void (*join)(pcr_backend_t *be);
    void (*leave)(pcr_backend_t *be);
    int (*busy)(const pcr_backend_t *be);
    void (*dispose)(pcr_backend_t *be);
} pcr_backend_hooks_t;

/* Control thread. pcr_backends_open resolves the config's backends (before the loops run) and
 * adds them, `hooks` (may be NULL: no checks) being told of each; pcr_backend_add makes one
 * from settings whose host is resolved already (`sa`), in the lowest free slot, published to
 * every worker's policy; pcr_backend_remove empties its slot (draining); pcr_backends_collect
 * frees those nothing holds any more; pcr_backends_close frees them all. */
int pcr_backends_open(pcr_server_t *srv, const pcr_backend_hooks_t *hooks);
void pcr_backends_close(pcr_server_t *srv);
pcr_backend_t *pcr_backend_add(pcr_server_t *srv, const pcr_backend_conf_t *conf,
                               const struct sockaddr *sa, socklen_t salen);
void pcr_backend_remove(pcr_backend_t *be);
/* The same, for a backend DNS discovery found under `dns`:`port`. */
pcr_backend_t *pcr_backend_add_discovered(pcr_server_t *srv, const pcr_backend_conf_t *conf,
                                          const struct sockaddr *sa, socklen_t salen,
                                          const char *dns, unsigned port);
void pcr_backends_collect(pcr_server_t *srv);
/* TLS to the pod from `t` (control thread): a fresh context (the files read again), swapped in;
 * the old one is retired. With `t` NULL or not enabled, the backend speaks plain HTTP (a
 * backend's scheme never changes while it lives). < 0 with `err` filled when a certificate,
 * key or CA file cannot be used: the backend keeps what it had. */
int pcr_backend_tls_set(pcr_backend_t *be, const pcr_upstream_tls_conf_t *t, char *err,
                        size_t errlen);
/* A connection's SSL for the pod (any thread), NULL when out of memory. */
struct ssl_st *pcr_backend_tls_ssl(pcr_backend_t *be);
/* Finds the backend named `name` (control thread), NULL when none. */
pcr_backend_t *pcr_backend_find(pcr_server_t *srv, const char *name);
/* What the policy is told of a backend. */
void pcr_backend_desc(const pcr_backend_t *be, pcr_backend_desc_t *desc);

/* Active health checks (control thread): `fall` failures in a row mark the backend down,
 * `rise` successes up again. */
void pcr_backend_check_result(pcr_backend_t *be, int ok);

/* Passive outlier detection: how one request to the backend went, from any worker. A 4xx is
 * the client's fault and counts as OK: a router that ejected pods on 4xx once took a whole
 * fleet down. outlier.consecutive_errors errors, or outlier.consecutive_connect_errors refused
 * connects, in a row eject the backend for outlier.ejection_ms, doubled at each ejection in a
 * row up to outlier.max_ejection_ms. */
typedef enum {
    PCR_OUTCOME_OK = 0,        /* a response head below 500 */
    PCR_OUTCOME_5XX,
    PCR_OUTCOME_ERROR,         /* reset, timeout, malformed response */
    PCR_OUTCOME_CONNECT,       /* the connection could not be made */
} pcr_outcome_t;
void pcr_backend_report(pcr_backend_t *be, const pcr_outlier_conf_t *o, pcr_outcome_t outcome,
                        uint64_t now_us);
/* A probe of a backend ejected for failed connects succeeded: it takes requests again at once.
 * A backend ejected for errors (5xx, resets, timeouts) serves its whole ejection instead: such a
 * pod often answers its health check while failing requests, and letting it back at each probe
 * would defeat the back-off. */
void pcr_backend_uneject(pcr_backend_t *be);
int pcr_backend_ejected(const pcr_backend_t *be, uint64_t now_us);
/* The ejection read as ending at `until` has run its course (control thread's probe tick): the
 * backend is back in rotation, unless another ejection began meanwhile. */
void pcr_backend_ejection_served(pcr_backend_t *be, uint64_t until);

/* Number of backends currently up, and in all (any thread). */
size_t pcr_backends_up(const pcr_server_t *srv);

/* The pool's saturation now, 0..1 (pcr_saturation over every backend's counters: the router's
 * requests in flight, the pod's scraped queue and KV usage), with flow_control's thresholds. */
double pcr_backends_saturation(pcr_server_t *srv, const pcr_config_t *cfg);
/* The same for a request that the pods serve before the requests of the tenant slots in
 * `passes` (pcr_pod_preemptible): their prefill is left out of each pod's. */
double pcr_backends_saturation_for(pcr_server_t *srv, const pcr_config_t *cfg, uint64_t passes);

size_t pcr_backends_count(const pcr_server_t *srv);

/* Whether `be` serves `model`: any model when the request names none; else a model its config
 * lists or its pod reported; a pod whose list is not known yet and whose config lists none
 * serves any (any thread). */
int pcr_backend_serves(const pcr_backend_t *be, const char *model, uint64_t model_hash);
uint64_t pcr_model_hash(const char *model, size_t len);
/* A list of `n` hashes, at most PCR_MAX_MODELS (control thread): the pod's own, or the one of
 * its config (a reload). */
void pcr_modelset_store(pcr_modelset_t *set, const uint64_t *hashes, size_t n);
void pcr_backend_config_models(pcr_backend_t *be, const pcr_backend_conf_t *conf);

#endif
