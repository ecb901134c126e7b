/* router/server.h: the process-wide context every part of the proxy hangs off: the event
 * base, the config, the backends with their pools, the routing policy, the listeners and
 * the drain state. One event loop on one thread owns all of it. */
#ifndef PCR_ROUTER_SERVER_H
#define PCR_ROUTER_SERVER_H

#include <stdint.h>
#include <sys/queue.h>

#include <event2/event.h>
#include <openssl/ssl.h>

#include "config.h"
#include "metrics.h"
#include "pcr/policy.h"

typedef struct pcr_backend pcr_backend_t;
typedef struct pcr_session pcr_session_t;

typedef struct pcr_server {
    struct event_base *base;
    pcr_config_t *cfg;
    pcr_backend_t *backends;      /* cfg->nbackends of them, in config order (= policy ids) */
    size_t nbackends;
    pcr_policy_t *policy;
    pcr_metrics_t metrics;
    struct pcr_listener *listeners;  /* one per cfg->listen entry (conn.c) */
    size_t nlisteners;
    size_t nhandshakes;           /* accepted connections whose protocol is not known yet */
    LIST_HEAD(, pcr_session) sessions;  /* every open client connection */
    size_t nsessions;
    uint64_t inflight;            /* exchanges started and not finished */
    int draining;                 /* SIGTERM seen: no new connections or streams */
    struct event *drain_timer;
    struct event *sig_term, *sig_int;
    uint64_t *scratch_blocks;     /* key buffer for one decision (single-threaded) */
} pcr_server_t;

/* Monotonic time in microseconds. */
uint64_t pcr_now_us(void);

/* Called whenever an exchange finishes; while draining, ends the loop once nothing is left. */
void pcr_server_check_drained(pcr_server_t *srv);

#endif
