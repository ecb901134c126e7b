/* router/backend.c: owns the backends' run-time state: address resolution at start-up,
 * active health checks (GET health.path every health.interval_ms), and the up/down state that
 * active checks and passive connect failures move.
 *
 * A backend goes down after `fall` consecutive failures and comes back after `rise`
 * consecutive successes. Checks run on the control thread, over a connection of their own
 * (srv->check_pools), so a pod whose request pool is full of long generations is still checked;
 * passive failures come from the workers, hence the atomics. With health checks disabled (interval 0) nothing could bring a
 * backend back, so passive failures then never mark it down: retries still steer around it. */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "backend.h"
#include "bus.h"
#include "log.h"
#include "scrape.h"
#include "upstream.h"

static void health_schedule(pcr_backend_t *be);

/* Moves `up` once, whichever thread saw the threshold crossed first. */
static void set_up(pcr_backend_t *be, int up)
{
    int want = !up;
    if (!__atomic_compare_exchange_n(&be->up, &want, up, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    if (up) {
        pcr_log_info("backend %s is up", be->conf->name);
    } else {
        pcr_log_warn("backend %s is down after %u consecutive failures", be->conf->name,
                     PCR_LOAD(be->consecutive_failures));
        /* Its pod may come back empty (a restart): what every replica of the index believed
         * is void. */
        pcr_bus_reset(be->srv->bus, PCR_BUS_CONTROL, be->id);
    }
}

void pcr_backend_note_success(pcr_backend_t *be)
{
    PCR_STORE(be->consecutive_failures, 0);
    unsigned n = PCR_ADD(be->consecutive_successes, 1) + 1;
    if (!PCR_LOAD(be->up) && n >= be->srv->cfg->health.rise)
        set_up(be, 1);
}

void pcr_backend_note_failure(pcr_backend_t *be)
{
    PCR_STORE(be->consecutive_successes, 0);
    unsigned n = PCR_ADD(be->consecutive_failures, 1) + 1;
    if (PCR_LOAD(be->up) && be->srv->cfg->health.interval_ms > 0 && n >= be->srv->cfg->health.fall)
        set_up(be, 0);
}

size_t pcr_backends_up(const pcr_server_t *srv)
{
    size_t n = 0;
    for (size_t i = 0; i < srv->nbackends; i++)
        n += PCR_LOAD(srv->backends[i].up) ? 1 : 0;
    return n;
}

int pcr_backend_serves(const pcr_backend_t *be, const char *model)
{
    if (be->conf->nmodels == 0 || model == NULL || model[0] == '\0')
        return 1;
    for (size_t i = 0; i < be->conf->nmodels; i++)
        if (strcmp(be->conf->models[i], model) == 0)
            return 1;
    return 0;
}

/* ---- active health checks ------------------------------------------------------------ */

typedef struct {
    pcr_backend_t *be;
    int status;
    struct event *deadline;
} health_ctx_t;

enum { HEALTH_FAILED = 0, HEALTH_OK = 1, HEALTH_COUNTED = 2 };

/* Ends the check in flight; `verdict` HEALTH_COUNTED when the pool already counted it. */
static void health_end(health_ctx_t *h, int verdict)
{
    pcr_backend_t *be = h->be;
    be->health_req = NULL;
    be->health_ctx = NULL;
    event_free(h->deadline);
    free(h);
    if (verdict == HEALTH_OK)
        pcr_backend_note_success(be);
    else if (verdict == HEALTH_FAILED)
        pcr_backend_note_failure(be);
    health_schedule(be);
}

static void on_health_head(void *ctx, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    ((health_ctx_t *)ctx)->status = status;
}

static void on_health_body(void *ctx, const char *data, size_t len) {}

static void on_health_done(void *ctx)
{
    health_ctx_t *h = ctx;
    health_end(h, h->status >= 200 && h->status < 300 ? HEALTH_OK : HEALTH_FAILED);
}

static void on_health_error(void *ctx, pcr_up_error_t err, int got_head)
{
    /* A connect failure the pool already counted against the backend. */
    health_end(ctx, err == PCR_UP_CONNECT ? HEALTH_COUNTED : HEALTH_FAILED);
}

static const pcr_upstream_cbs_t health_cbs = {
    on_health_head, on_health_body, on_health_done, on_health_error,
};

static void on_health_deadline(evutil_socket_t fd, short what, void *arg)
{
    health_ctx_t *h = arg;
    pcr_upstream_cancel(h->be->health_req);
    health_end(h, HEALTH_FAILED);
}

static void on_health_timer(evutil_socket_t fd, short what, void *arg)
{
    pcr_backend_t *be = arg;
    if (PCR_LOAD(be->srv->draining) || be->health_req != NULL)
        return;
    pcr_scrape_start(be);
    health_ctx_t *h = calloc(1, sizeof(*h));
    struct evbuffer *req = evbuffer_new();
    if (h == NULL || req == NULL)
        goto fail;
    h->be = be;
    h->deadline = evtimer_new(be->srv->base, on_health_deadline, h);
    if (h->deadline == NULL)
        goto fail;
    evbuffer_add_printf(req, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: pcrouter-health\r\n\r\n",
                        be->srv->cfg->health.path, be->host_header);
    be->health_req = pcr_upstream_send(&be->srv->check_pools[be->id], req, &health_cbs, h);
    req = NULL;
    if (be->health_req == NULL)
        goto fail;
    be->health_ctx = h;
    unsigned ms = be->srv->cfg->health.timeout_ms;
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(h->deadline, &tv);
    return;
fail:
    if (req)
        evbuffer_free(req);
    if (h && h->deadline)
        event_free(h->deadline);
    free(h);
    health_schedule(be);
}

static void health_schedule(pcr_backend_t *be)
{
    unsigned ms = be->srv->cfg->health.interval_ms;
    if (ms == 0 || be->health_timer == NULL || PCR_LOAD(be->srv->draining))
        return;
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(be->health_timer, &tv);
}

/* ---- set-up -------------------------------------------------------------------------- */

int pcr_backends_init(pcr_server_t *srv)
{
    const pcr_config_t *cfg = srv->cfg;
    srv->backends = calloc(cfg->nbackends, sizeof(*srv->backends));
    if (srv->backends == NULL)
        return PCR_ERR_NOMEM;
    srv->nbackends = cfg->nbackends;
    srv->check_pools = calloc(cfg->nbackends, sizeof(*srv->check_pools));
    if (srv->check_pools == NULL)
        return PCR_ERR_NOMEM;
    for (size_t i = 0; i < cfg->nbackends; i++) {
        pcr_backend_t *be = &srv->backends[i];
        const pcr_backend_conf_t *bc = &cfg->backends[i];
        be->srv = srv;
        be->id = (int)i;
        be->conf = bc;
        be->up = 1; /* optimistic: the first check or request says otherwise */
        be->max_connections = bc->max_connections ? bc->max_connections : cfg->upstream.max_connections;
        /* Checks and scrapes: one connection of their own, never queued behind requests. */
        pcr_pool_init(&srv->check_pools[i], be, srv->base, 1, &srv->draining);
        /* Resolved once at start-up, before the loop runs (getaddrinfo blocks). */
        char port[8];
        snprintf(port, sizeof(port), "%u", bc->port);
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC}, *res = NULL;
        int rc = getaddrinfo(bc->host, port, &hints, &res);
        if (rc != 0 || res == NULL) {
            pcr_log_error("backends[%zu].url: cannot resolve host \"%s\": %s", i, bc->host,
                          gai_strerror(rc));
            return PCR_ERR_INVAL;
        }
        memcpy(&be->addr, res->ai_addr, res->ai_addrlen);
        be->addrlen = res->ai_addrlen;
        freeaddrinfo(res);
        size_t hl = strlen(bc->host) + 16;
        be->host_header = malloc(hl);
        if (be->host_header == NULL)
            return PCR_ERR_NOMEM;
        if (strchr(bc->host, ':'))
            snprintf(be->host_header, hl, "[%s]:%u", bc->host, bc->port);
        else
            snprintf(be->host_header, hl, "%s:%u", bc->host, bc->port);
        if (cfg->health.interval_ms > 0) {
            be->health_timer = evtimer_new(srv->base, on_health_timer, be);
            if (be->health_timer == NULL)
                return PCR_ERR_NOMEM;
            /* First check right away, so a dead pod is known within one timeout. */
            struct timeval now = {0, 0};
            evtimer_add(be->health_timer, &now);
        }
    }
    return 0;
}

void pcr_backends_dispose(pcr_server_t *srv)
{
    for (size_t i = 0; i < srv->nbackends; i++) {
        pcr_backend_t *be = &srv->backends[i];
        if (be->health_timer)
            event_free(be->health_timer);
        be->health_timer = NULL;
        if (be->health_req != NULL) {
            health_ctx_t *h = be->health_ctx;
            pcr_upstream_cancel(be->health_req);
            event_free(h->deadline);
            free(h);
            be->health_req = NULL;
        }
        pcr_scrape_cancel(be);
        pcr_pool_dispose(&srv->check_pools[i]);
        free(be->host_header);
    }
    free(srv->check_pools);
    srv->check_pools = NULL;
    free(srv->backends);
    srv->backends = NULL;
    srv->nbackends = 0;
}
