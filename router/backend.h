/* router/backend.h: one backend (a vLLM pod) at run time: its address, its pool of upstream
 * connections, the load the router counts on it, its health, and its counters. */
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
    unsigned max_connections;

    /* Pool: idle connections, most recently used first; requests waiting for a slot. */
    TAILQ_HEAD(pcr_upconn_idle, pcr_upconn) idle;
    TAILQ_HEAD(, pcr_upreq) waiters;
    unsigned nconns;                         /* open: connecting + idle + busy */
    unsigned nidle;

    /* Load as the router counts it, fed to the policy. */
    uint32_t inflight;
    uint64_t queued_prefill;                 /* uncached prefill tokens of in-flight requests */
    uint32_t pod_waiting;                    /* vllm:num_requests_waiting, last scrape */
    uint32_t pod_running;                    /* vllm:num_requests_running, last scrape */

    /* Delivered hit rate: the pod's prefix-cache counters (tokens), as deltas since the
     * router's first scrape of it (scrape.c). */
    uint64_t pod_hits, pod_queries;
    uint64_t pod_hits_last, pod_queries_last;
    int pod_have_hits, pod_have_queries;
    uint64_t pod_scrapes;
    uint64_t pod_cache_tokens;               /* KV capacity from vllm:cache_config_info, 0 unknown */
    pcr_upreq_t *scrape_req;
    void *scrape_ctx;

    /* Health: active checks plus passive connect failures. */
    int up;
    unsigned consecutive_failures;
    unsigned consecutive_successes;
    struct event *health_timer;
    pcr_upreq_t *health_req;
    void *health_ctx;                        /* the check in flight, freed on dispose */

    /* Counters for /metrics. */
    uint64_t requests_by_code[600];
    uint64_t connect_errors;
    uint64_t upstream_errors;                /* resets, timeouts, malformed responses */
};

/* Resolves every backend's URL and sets up pools and health checks. 0 or PCR_ERR_*. */
int pcr_backends_init(pcr_server_t *srv);
void pcr_backends_dispose(pcr_server_t *srv);

/* Passive health signals from real traffic and from active checks. */
void pcr_backend_note_success(pcr_backend_t *be);
void pcr_backend_note_failure(pcr_backend_t *be);

/* Number of backends currently up. */
size_t pcr_backends_up(const pcr_server_t *srv);

/* Whether `be` serves `model` (any model when its config lists none). */
int pcr_backend_serves(const pcr_backend_t *be, const char *model);

#endif
