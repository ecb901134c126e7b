/* router/backend.c: owns the backends' run-time state: address resolution at start-up, the
 * up/down state that active health checks move, passive outlier detection (ejection), and the
 * active checks themselves (GET health.path every health.interval_ms, and probes of ejected
 * backends every outlier.probe_ms).
 *
 * A backend goes down after `fall` failed checks in a row and comes back after `rise`
 * successful ones. Checks run on the control thread, over a connection of their own
 * (srv->check_pools), so a pod whose request pool is full of long generations is still checked.
 * Outcomes of real requests come from the workers, hence the atomics: consecutive errors eject
 * a backend for a back-off that grows with repeated ejections, and a probe that succeeds brings
 * it back at once, so a pod that restarts in a few milliseconds costs a fraction of a second. */
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

/* Moves `up` once, whichever thread saw the threshold crossed first. A backend that is down
 * keeps its entries in the index: a pod unreachable for a while still holds its KV cache; only
 * a restart empties it, and the scrape sees that (scrape.c). */
static void set_up(pcr_backend_t *be, int up)
{
    int want = !up;
    if (!__atomic_compare_exchange_n(&be->up, &want, up, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    if (up)
        pcr_log_info("backend %s is up", be->conf->name);
    else
        pcr_log_warn("backend %s is down after %u failed health checks", be->conf->name,
                     PCR_LOAD(be->consecutive_failures));
}

void pcr_backend_check_result(pcr_backend_t *be, int ok)
{
    const pcr_health_conf_t *h = &be->srv->cfg->health;
    if (ok) {
        PCR_STORE(be->consecutive_failures, 0);
        unsigned n = PCR_ADD(be->consecutive_successes, 1) + 1;
        if (!PCR_LOAD(be->up) && n >= h->rise)
            set_up(be, 1);
    } else {
        PCR_STORE(be->consecutive_successes, 0);
        unsigned n = PCR_ADD(be->consecutive_failures, 1) + 1;
        if (PCR_LOAD(be->up) && n >= h->fall)
            set_up(be, 0);
    }
}

/* ---- passive outlier detection -------------------------------------------------------- */

int pcr_backend_ejected(const pcr_backend_t *be, uint64_t now_us)
{
    return PCR_LOAD(((pcr_backend_t *)be)->ejected_until_us) > now_us;
}

int pcr_backend_usable(const pcr_backend_t *be, uint64_t now_us)
{
    return PCR_LOAD(((pcr_backend_t *)be)->up) && !pcr_backend_ejected(be, now_us);
}

static void eject(pcr_backend_t *be, uint64_t now, const char *why, unsigned count)
{
    const pcr_outlier_conf_t *o = &be->srv->cfg->outlier;
    uint64_t until = PCR_LOAD(be->ejected_until_us);
    if (until > now)
        return; /* already out */
    /* A backend back to health for a while starts its back-off afresh. */
    if (PCR_LOAD(be->ejected_at_us) + (uint64_t)o->max_ejection_ms * 1000 * 2 < now)
        PCR_STORE(be->ejections, 0);
    unsigned k = PCR_LOAD(be->ejections);
    uint64_t ms = o->ejection_ms;
    for (unsigned i = 0; i < k && ms < o->max_ejection_ms; i++)
        ms *= 2;
    if (ms > o->max_ejection_ms)
        ms = o->max_ejection_ms;
    /* Whichever worker crossed the threshold first does it. */
    if (!__atomic_compare_exchange_n(&be->ejected_until_us, &until, now + ms * 1000, 0,
                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    PCR_STORE(be->ejected_at_us, now);
    PCR_ADD(be->ejections, 1);
    PCR_ADD(be->ejections_total, 1);
    PCR_STORE(be->consecutive_errors, 0);
    PCR_STORE(be->consecutive_connect_errors, 0);
    pcr_log_warn("backend %s ejected for %llu ms after %u %s in a row", be->conf->name,
                 (unsigned long long)ms, count, why);
}

void pcr_backend_report(pcr_backend_t *be, pcr_outcome_t outcome, uint64_t now_us)
{
    const pcr_outlier_conf_t *o = &be->srv->cfg->outlier;
    switch (outcome) {
    case PCR_OUTCOME_OK:
        if (PCR_LOAD(be->consecutive_errors))
            PCR_STORE(be->consecutive_errors, 0);
        if (PCR_LOAD(be->consecutive_connect_errors))
            PCR_STORE(be->consecutive_connect_errors, 0);
        break;
    case PCR_OUTCOME_5XX:
    case PCR_OUTCOME_ERROR: {
        unsigned n = PCR_ADD(be->consecutive_errors, 1) + 1;
        if (o->consecutive_errors > 0 && n >= o->consecutive_errors)
            eject(be, now_us, outcome == PCR_OUTCOME_5XX ? "errors (5xx)" : "errors", n);
        break;
    }
    case PCR_OUTCOME_CONNECT: {
        unsigned n = PCR_ADD(be->consecutive_connect_errors, 1) + 1;
        PCR_ADD(be->consecutive_errors, 1);
        if (o->consecutive_connect_errors > 0 && n >= o->consecutive_connect_errors)
            eject(be, now_us, "failed connects", n);
        break;
    }
    }
}

void pcr_backend_uneject(pcr_backend_t *be)
{
    if (PCR_LOAD(be->ejected_until_us) == 0)
        return;
    PCR_STORE(be->ejected_until_us, 0);
    PCR_STORE(be->consecutive_errors, 0);
    PCR_STORE(be->consecutive_connect_errors, 0);
    pcr_log_info("backend %s answers its probe: back in rotation", be->conf->name);
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

enum { HEALTH_FAILED = 0, HEALTH_OK = 1, HEALTH_SKIPPED = 2 };

/* Ends the check in flight. */
static void health_end(health_ctx_t *h, int verdict)
{
    pcr_backend_t *be = h->be;
    be->health_req = NULL;
    be->health_ctx = NULL;
    event_free(h->deadline);
    free(h);
    if (verdict == HEALTH_OK && pcr_backend_ejected(be, pcr_now_us()))
        pcr_backend_uneject(be); /* a probe, or a check that happened to come first */
    if (verdict != HEALTH_SKIPPED)
        pcr_backend_check_result(be, verdict == HEALTH_OK);
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
    health_end(ctx, HEALTH_FAILED);
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

/* Sends one check now, unless one is in flight. */
static void health_start(pcr_backend_t *be)
{
    if (PCR_LOAD(be->srv->draining) || be->health_req != NULL)
        return;
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

static void on_health_timer(evutil_socket_t fd, short what, void *arg) { health_start(arg); }

static void health_schedule(pcr_backend_t *be)
{
    unsigned ms = be->srv->cfg->health.interval_ms;
    if (ms == 0 || be->health_timer == NULL || PCR_LOAD(be->srv->draining))
        return;
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(be->health_timer, &tv);
}

/* Every outlier.probe_ms: an ejected backend is probed (a health check), so it comes back as
 * soon as it answers rather than when its ejection ends. */
static void on_probe_tick(evutil_socket_t fd, short what, void *arg)
{
    pcr_server_t *srv = arg;
    uint64_t now = pcr_now_us();
    for (size_t i = 0; i < srv->nbackends; i++)
        if (pcr_backend_ejected(&srv->backends[i], now))
            health_start(&srv->backends[i]);
}

/* Every scrape.interval_ms, independent of the health checks: the pods' load and hit rate. */
static void on_scrape_tick(evutil_socket_t fd, short what, void *arg)
{
    pcr_server_t *srv = arg;
    if (PCR_LOAD(srv->draining))
        return;
    for (size_t i = 0; i < srv->nbackends; i++)
        pcr_scrape_start(&srv->backends[i]);
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
    srv->probe_tick = event_new(srv->base, -1, EV_PERSIST, on_probe_tick, srv);
    if (srv->probe_tick == NULL)
        return PCR_ERR_NOMEM;
    struct timeval ptv = {cfg->outlier.probe_ms / 1000, (suseconds_t)(cfg->outlier.probe_ms % 1000) * 1000};
    event_add(srv->probe_tick, &ptv);
    if (cfg->scrape.interval_ms > 0) {
        srv->scrape_tick = event_new(srv->base, -1, EV_PERSIST, on_scrape_tick, srv);
        if (srv->scrape_tick == NULL)
            return PCR_ERR_NOMEM;
        struct timeval stv = {cfg->scrape.interval_ms / 1000,
                              (suseconds_t)(cfg->scrape.interval_ms % 1000) * 1000};
        event_add(srv->scrape_tick, &stv);
        event_active(srv->scrape_tick, EV_TIMEOUT, 0); /* the first right away */
    }
    return 0;
}

void pcr_backends_dispose(pcr_server_t *srv)
{
    if (srv->probe_tick)
        event_free(srv->probe_tick);
    if (srv->scrape_tick)
        event_free(srv->scrape_tick);
    srv->probe_tick = srv->scrape_tick = NULL;
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
