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
    int spare_fd;                 /* given back to accept one connection when out of fds */
    LIST_HEAD(, pcr_session) sessions;  /* every open client connection */
    TAILQ_HEAD(, pcr_session) waiting;  /* those waiting for their client, oldest first */
    size_t nsessions;
    uint64_t inflight;            /* exchanges started and not finished */
    /* Request bodies held in memory, against limits.max_buffered_body_bytes; sessions that
     * stopped reading (or granting HTTP/2 window) for it wait on `budget_waiters`. */
    size_t body_buffered;
    const void *body_exempt;      /* the one request allowed past the budget, NULL: none */
    TAILQ_HEAD(, pcr_budget_waiter) budget_waiters;
    struct event *budget_event;
    int draining;                 /* SIGTERM seen: no new connections or streams */
    struct event *drain_timer;
    struct event *sig_term, *sig_int, *sig_hup;
    uint64_t *scratch_blocks;     /* key buffer for one decision (single-threaded) */
} pcr_server_t;

/* A session waiting for request-body budget: `resume` runs from the event loop once some was
 * released (it may find the budget taken again and wait anew). */
typedef struct pcr_budget_waiter {
    TAILQ_ENTRY(pcr_budget_waiter) link;
    void (*resume)(struct pcr_budget_waiter *w);
    int queued;
} pcr_budget_waiter_t;

/* Every request may buffer this much of its body whatever the budget: an HTTP/2 stream's
 * initial window, and as much for an HTTP/1.1 request, so that uploads holding the budget
 * cannot stall the small requests (most prompts) of other clients. */
#define PCR_BODY_FREE_BYTES (1024 * 1024)

/* Whether request bodies may grow: less than limits.max_buffered_body_bytes is held. */
int pcr_server_body_budget_ok(const pcr_server_t *srv);
/* Whether the body of request `req` (an exchange) may grow. Under the budget, any may. Past
 * it, one request at a time still may (the first to ask, until it is freed): a budget filled
 * by partial bodies, none of which could complete, would otherwise stall every upload until
 * each timed out. The overshoot is at most one limits.max_body_bytes. */
int pcr_server_body_may_grow(pcr_server_t *srv, const void *req);
/* `req` is being freed: it stops being the request allowed past the budget. */
void pcr_server_body_forget(pcr_server_t *srv, const void *req);
void pcr_server_body_wait(pcr_server_t *srv, pcr_budget_waiter_t *w);
void pcr_server_body_unwait(pcr_server_t *srv, pcr_budget_waiter_t *w);
/* Some body bytes were freed: wake the waiters (from the loop). */
void pcr_server_body_released(pcr_server_t *srv);

/* Monotonic time in microseconds. */
uint64_t pcr_now_us(void);

/* Called whenever an exchange finishes; while draining, ends the loop once nothing is left. */
void pcr_server_check_drained(pcr_server_t *srv);

#endif
