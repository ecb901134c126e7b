/* router/control.c: owns the control thread's ticks over the backends. Every outlier.probe_ms
 * the ejected backends are probed and those done with their ejection come back, and what left
 * (backends, reloaded configs) is freed once nothing holds it; every scrape.interval_ms the pods'
 * metrics are read and their model lists refreshed. It also gives the registry (backend.c) the
 * hooks that start and stop each backend's checks: its check connection (one of its own, so a
 * pod whose request pool is full of long generations is still checked), its health checks
 * (health.c), scrapes (scrape.c) and model lists (models.c). */
#include <stdlib.h>

#include <event2/event.h>

#include "backend.h"
#include "budget.h"
#include "control.h"
#include "health.h"
#include "models.h"
#include "memguard.h"
#include "precise.h"
#include "reload.h"
#include "scrape.h"
#include "upstream.h"

/* ---- each backend's checks ----------------------------------------------------------- */

/* Health check, scrape, model list. */
#define PCR_CHECK_CONNECTIONS 3

static int checks_prepare(pcr_backend_t *be)
{
    pcr_server_t *srv = be->srv;
    be->check_pool = calloc(1, sizeof(*be->check_pool));
    if (be->check_pool == NULL)
        return PCR_ERR_NOMEM;
    /* One connection for each kind of probe, each of which has at most one in flight: a
     * health check never waits behind a slow /metrics or /v1/models, whose wait would eat
     * its own deadline and mark a healthy pod down. */
    pcr_pool_init(be->check_pool, be, srv->base, PCR_CHECK_CONNECTIONS, &srv->draining,
                  (const pcr_config_t **)&srv->cfg);
    return pcr_health_init(be);
}

static void checks_join(pcr_backend_t *be)
{
    pcr_health_first(be);
    if (be->srv->cfg->scrape.interval_ms != 0)
        pcr_scrape_start(be);
    if (be->srv->cfg->scrape.models_interval_ms != 0)
        pcr_models_fetch(be);
    pcr_precise_refresh(be->srv);
}

static void checks_leave(pcr_backend_t *be)
{
    pcr_health_stop(be);
    pcr_scrape_cancel(be);
    pcr_models_cancel(be);
    pcr_precise_refresh(be->srv);
}

static int checks_busy(const pcr_backend_t *be)
{
    return pcr_health_busy(be) || be->models_req != NULL;
}

static void checks_dispose(pcr_backend_t *be)
{
    pcr_health_dispose(be);
    pcr_scrape_cancel(be);
    pcr_models_cancel(be);
    if (be->check_pool) {
        pcr_pool_dispose(be->check_pool);
        free(be->check_pool);
        be->check_pool = NULL;
    }
}

static const pcr_backend_hooks_t checks = {checks_prepare, checks_join, checks_leave, checks_busy,
                                           checks_dispose};

/* ---- the ticks ----------------------------------------------------------------------- */

/* Every outlier.probe_ms: an ejected backend is probed (a health check), so one that cannot be
 * reached is marked down after health.fall probes, and one ejected for failed connects comes
 * back as soon as it answers rather than when its ejection ends; an ejection that ran its course
 * ends here. Backends that left and drained are freed here too, and a reload's old config once
 * every worker runs the new one. */
static void on_probe_tick(evutil_socket_t fd, short what, void *arg)
{
    pcr_server_t *srv = arg;
    uint64_t now = pcr_now_us();
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL)
            continue;
        uint64_t until = PCR_LOAD(be->ejected_until_us);
        if (until > now)
            pcr_health_start(be);
        else if (until != 0 && until <= now)
            pcr_backend_ejection_served(be, until);
    }
    pcr_backends_collect(srv);
    pcr_reload_collect(srv);
    pcr_budget_trim(srv);
    pcr_memguard_tick(srv);
}

/* Every scrape.interval_ms, independent of the health checks: the pods' load, hit rate and
 * models. */
static void on_scrape_tick(evutil_socket_t fd, short what, void *arg)
{
    pcr_server_t *srv = arg;
    if (PCR_LOAD(srv->draining))
        return;
    uint64_t now = pcr_now_us();
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be != NULL) {
            pcr_scrape_start(be);
            pcr_models_tick(be, now);
        }
    }
}

int pcr_backends_init(pcr_server_t *srv)
{
    const pcr_config_t *cfg = srv->cfg;
    int rc = pcr_backends_open(srv, &checks);
    if (rc < 0 || (rc = pcr_precise_apply(srv)) < 0)
        return rc;
    srv->probe_tick = event_new(srv->base, -1, EV_PERSIST, on_probe_tick, srv);
    if (srv->probe_tick == NULL)
        return PCR_ERR_NOMEM;
    struct timeval ptv = pcr_ms_to_tv(cfg->outlier.probe_ms);
    event_add(srv->probe_tick, &ptv);
    if (cfg->scrape.interval_ms > 0) {
        srv->scrape_tick = event_new(srv->base, -1, EV_PERSIST, on_scrape_tick, srv);
        if (srv->scrape_tick == NULL)
            return PCR_ERR_NOMEM;
        struct timeval stv = pcr_ms_to_tv(cfg->scrape.interval_ms);
        event_add(srv->scrape_tick, &stv);
    }
    return 0;
}

void pcr_backends_retime(pcr_server_t *srv)
{
    const pcr_config_t *cfg = srv->cfg;
    struct timeval ptv = pcr_ms_to_tv(cfg->outlier.probe_ms);
    event_add(srv->probe_tick, &ptv);
    /* Each backend's checks follow health.interval_ms (started, stopped, started again), whatever
     * the scrape does. */
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be != NULL)
            pcr_health_retime(be);
    }
    if (cfg->scrape.interval_ms == 0) {
        if (srv->scrape_tick)
            event_del(srv->scrape_tick);
        return;
    }
    if (srv->scrape_tick == NULL)
        srv->scrape_tick = event_new(srv->base, -1, EV_PERSIST, on_scrape_tick, srv);
    if (srv->scrape_tick == NULL)
        return;
    struct timeval stv = pcr_ms_to_tv(cfg->scrape.interval_ms);
    event_add(srv->scrape_tick, &stv);
}

void pcr_backends_dispose(pcr_server_t *srv)
{
    if (srv->probe_tick)
        event_free(srv->probe_tick);
    if (srv->scrape_tick)
        event_free(srv->scrape_tick);
    srv->probe_tick = srv->scrape_tick = NULL;
    pcr_precise_stop(srv);
    pcr_backends_close(srv);
}
