/* router/upstream/health.c: owns the active health checks (health.h): each backend's timer and its
 * check in flight, a GET of health.path on the check connection (probe.c) that moves the backend up
 * or down (backend.c counts the results against `rise` and `fall`). Checks run on the control
 * thread, over a connection of their own, so a pod whose request pool is full of long generations
 * is still checked. */
#include <event2/event.h>

#include "backend.h"
#include "health.h"
#include "probe.h"

/* A health answer is its status; a body past this is not a health answer (the read stops). */
#define HEALTH_MAX_BYTES (1024 * 1024)

static void health_schedule(pcr_backend_t *be);

static void on_check_head(void *ctx, int status)
{
    pcr_backend_t *be = ctx;
    be->health_status = status;
}

/* The check is over: 2xx and complete is a success, anything else a failure. */
static void on_check_end(void *ctx, int complete)
{
    pcr_backend_t *be = ctx;
    int ok = complete && be->health_status >= 200 && be->health_status < 300;
    be->health_req = NULL;
    if (ok && pcr_backend_ejected(be, pcr_now_us()) && PCR_LOAD(be->ejected_for_connects))
        pcr_backend_uneject(be); /* a probe, or a check that happened to come first */
    pcr_backend_check_result(be, ok);
    health_schedule(be);
}

static const pcr_probe_cbs_t check_cbs = {on_check_head, NULL, on_check_end};

void pcr_health_start(pcr_backend_t *be)
{
    if (PCR_LOAD(be->srv->draining) || be->health_req != NULL || PCR_LOAD(be->removed))
        return;
    be->health_status = 0;
    be->health_req = pcr_probe_get(be, be->srv->cfg->health.path, "pcrouter-health", NULL,
                                   be->srv->cfg->health.timeout_ms, HEALTH_MAX_BYTES, &check_cbs, be);
    if (be->health_req == NULL)
        health_schedule(be);
}

static void on_health_timer(evutil_socket_t fd, short what, void *arg) { pcr_health_start(arg); }

static void health_schedule(pcr_backend_t *be)
{
    unsigned ms = be->srv->cfg->health.interval_ms;
    if (ms == 0 || be->health_timer == NULL || PCR_LOAD(be->srv->draining) ||
        PCR_LOAD(be->removed))
        return;
    struct timeval tv = pcr_ms_to_tv(ms);
    evtimer_add(be->health_timer, &tv);
}

int pcr_health_init(pcr_backend_t *be)
{
    if (be->srv->cfg->health.interval_ms == 0)
        return 0;
    be->health_timer = evtimer_new(be->srv->base, on_health_timer, be);
    return be->health_timer != NULL ? 0 : PCR_ERR_NOMEM;
}

void pcr_health_first(pcr_backend_t *be)
{
    if (be->health_timer != NULL) {
        struct timeval now = {0, 0};
        evtimer_add(be->health_timer, &now);
    }
}

/* A reload may turn checks on (a backend without a timer gets one), off (the timer stops; a
 * check in flight ends without scheduling another), or on again: then the timer of the first
 * turn is idle, neither pending nor behind a check in flight, and is armed again. */
void pcr_health_retime(pcr_backend_t *be)
{
    if (be->srv->cfg->health.interval_ms == 0) {
        pcr_health_stop(be);
        return;
    }
    if (be->health_timer == NULL)
        be->health_timer = evtimer_new(be->srv->base, on_health_timer, be);
    if (be->health_timer != NULL && be->health_req == NULL &&
        !evtimer_pending(be->health_timer, NULL))
        health_schedule(be);
}

void pcr_health_stop(pcr_backend_t *be)
{
    if (be->health_timer)
        event_del(be->health_timer);
}

int pcr_health_busy(const pcr_backend_t *be) { return be->health_req != NULL; }

void pcr_health_dispose(pcr_backend_t *be)
{
    if (be->health_timer)
        event_free(be->health_timer);
    be->health_timer = NULL;
    pcr_probe_cancel(be->health_req);
    be->health_req = NULL;
}
