/* router/backend.h: one backend (a vLLM pod) at run time, shared by every thread: its address,
 * the load the router counts on it, its health, what its pod reports, and its counters. Fields
 * that several threads touch are read and written with the relaxed atomics of server.h.
 *
 * The connections to it live in pools (pcr_pool_t), one per worker and one on the control
 * thread for health checks and scrapes, never shared between threads (upstream.h). */
#ifndef PCR_ROUTER_BACKEND_H
#define PCR_ROUTER_BACKEND_H

#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "config.h"
#include "server.h"

typedef struct pcr_upconn pcr_upconn_t;
typedef struct pcr_upreq pcr_upreq_t;

struct pcr_backend {
    pcr_server_t *srv;
    int id;                                  /* index in srv->backends and in the policy */
    const pcr_backend_conf_t *conf;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char *host_header;                       /* "host:port" for the Host header */
    unsigned max_connections;                /* for the whole process */

    /* Load as the router counts it, fed to the policy (atomic: every worker updates it). */
    uint32_t inflight;
    uint64_t queued_prefill;                 /* uncached prefill tokens of in-flight requests */
    /* What the pod reports, from the control thread's scrape (atomic). */
    uint32_t pod_waiting;                    /* vllm:num_requests_waiting, last scrape */
    uint32_t pod_running;                    /* vllm:num_requests_running, last scrape */
    uint64_t pod_hits, pod_queries;          /* prefix-cache counters (tokens), as deltas */
    uint64_t pod_scrapes;
    uint64_t pod_cache_tokens;               /* KV capacity from vllm:cache_config_info, 0 unknown */
    /* The scrape's own state (control thread only). */
    uint64_t pod_hits_last, pod_queries_last;
    int pod_have_hits, pod_have_queries;
    pcr_upreq_t *scrape_req;
    void *scrape_ctx;

    /* Health: active checks move `up` (control thread); passive outlier detection, from the
     * outcome of real requests on any worker, ejects the backend for a while (atomics). */
    int up;                                  /* atomic */
    unsigned consecutive_failures;           /* active checks (atomic) */
    unsigned consecutive_successes;          /* atomic */
    unsigned consecutive_errors;             /* requests: 5xx, reset, timeout, malformed (atomic) */
    unsigned consecutive_connect_errors;     /* requests: refused or timed-out connects (atomic) */
    unsigned ejections;                      /* in a row, for the back-off (atomic) */
    uint64_t ejected_until_us;               /* 0: not ejected (atomic) */
    uint64_t ejected_at_us;                  /* atomic */
    uint64_t ejections_total;                /* atomic */
    struct event *health_timer;
    pcr_upreq_t *health_req;
    void *health_ctx;                        /* the check in flight, freed on dispose */

    /* Counters for /metrics (atomic). */
    uint64_t requests_by_code[600];
    uint64_t connect_errors;
    uint64_t upstream_errors;                /* resets, timeouts, malformed responses */
};

/* Resolves every backend's URL and sets up health checks on the control loop. 0 or PCR_ERR_*. */
int pcr_backends_init(pcr_server_t *srv);
void pcr_backends_dispose(pcr_server_t *srv);

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
void pcr_backend_report(pcr_backend_t *be, pcr_outcome_t outcome, uint64_t now_us);
/* A probe of an ejected backend succeeded: it takes requests again at once. */
void pcr_backend_uneject(pcr_backend_t *be);
int pcr_backend_ejected(const pcr_backend_t *be, uint64_t now_us);
/* Up and not ejected: a candidate for new requests. */
int pcr_backend_usable(const pcr_backend_t *be, uint64_t now_us);

/* Number of backends currently up. */
size_t pcr_backends_up(const pcr_server_t *srv);

/* Whether `be` serves `model` (any model when its config lists none). */
int pcr_backend_serves(const pcr_backend_t *be, const char *model);

#endif
