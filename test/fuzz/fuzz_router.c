/* test/fuzz/fuzz_router.c: the router under test (fuzz_router.h). */
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "accesslog.h"
#include "backend.h"
#include "bus.h"
#include "control.h"
#include "fuzz.h"
#include "fuzz_net.h"
#include "fuzz_router.h"
#include "upstream.h"

static fuzz_router_t *routers[FUZZ_ROUTER_VARIANTS];

static void router_stop(fuzz_router_t *r)
{
    pcr_server_t *srv = &r->srv;
    pcr_worker_dispose(&r->w);
    pcr_worker_release(&r->w);
    pcr_backends_dispose(srv);
    pcr_bus_free(srv->bus);
    pcr_accesslog_free(srv->access_log);
    event_base_free(srv->base);
    pcr_config_free(r->cfg);
    free(r);
}

/* At exit: every kept server, on the virtual clock its timers were armed on. */
static void routers_free(void)
{
    fuzz_clock_start();
    for (size_t i = 0; i < FUZZ_ROUTER_VARIANTS; i++) {
        if (routers[i] != NULL)
            router_stop(routers[i]);
        routers[i] = NULL;
    }
    fuzz_clock_stop();
}

static fuzz_router_t *router_start(const char *config)
{
    fuzz_router_t *r = calloc(1, sizeof(*r));
    FUZZ_CHECK(r != NULL);
    char *errors = NULL;
    r->cfg = pcr_config_parse(config, "fuzz.json", &errors);
    FUZZ_CHECKF(r->cfg != NULL, "%s", errors ? errors : "config");
    pcr_server_t *srv = &r->srv;
    srv->cfg = r->cfg;
    srv->nworkers = 1;
    srv->workers = &r->w;
    srv->base = event_base_new();      /* the control loop's: never run here */
    srv->bus = pcr_bus_new(1);
    FUZZ_CHECK(srv->base != NULL && srv->bus != NULL);
    if (r->cfg->log.access_log) {
        char err[256];
        srv->access_log = pcr_accesslog_new(r->cfg->log.access_log_path, 1,
                                            PCR_ACCESSLOG_QUEUE_BYTES, err, sizeof(err));
        FUZZ_CHECKF(srv->access_log != NULL, "%s", err);
    }
    FUZZ_CHECK(pcr_backends_init(srv) == 0);
    r->plan.nworkers = 1;              /* no listener: the connection is made here */
    srv->listen_plan = &r->plan;
    FUZZ_CHECK(pcr_worker_init(srv, &r->w, 0) == 0);
    return r;
}

fuzz_router_t *fuzz_router_get(unsigned variant, const char *config)
{
    static int registered;
    FUZZ_CHECK(variant < FUZZ_ROUTER_VARIANTS);
    if (routers[variant] == NULL) {
        if (!registered)
            FUZZ_CHECK(atexit(routers_free) == 0);
        registered = 1;
        routers[variant] = router_start(config);
    }
    return routers[variant];
}

void fuzz_router_reset(fuzz_router_t *r)
{
    pcr_server_t *srv = &r->srv;
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL)
            continue;
        /* An ejection is over (the clock moved an epoch past it): what the control thread's
         * probe tick, which never runs here, would do; the worker hears of it at its tick. */
        uint64_t until = be->ejected_until_us;
        if (until != 0)
            pcr_backend_ejection_served(be, until);
        be->consecutive_errors = be->consecutive_connect_errors = 0;
    }
}

pcr_sock_t *fuzz_router_connect(fuzz_router_t *r, int *client_fd)
{
    int sv[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    *client_fd = sv[0];
    pcr_sock_t *sock = pcr_sock_plain_new(r->w.base, sv[1]);
    FUZZ_CHECK(sock != NULL);
    return sock;
}

static int pods_closed(fuzz_router_t *r)
{
    for (size_t i = 0; i < pcr_backend_slots(&r->srv); i++) {
        pcr_backend_t *be = pcr_backend_at(&r->srv, i);
        if (be != NULL && be->conns != 0)
            return 0;
    }
    return 1;
}

void fuzz_router_check_accounting(fuzz_router_t *r)
{
    pcr_server_t *srv = &r->srv;
    FUZZ_CHECKF(r->w.nsessions == 0, "%zu sessions left", r->w.nsessions);
    FUZZ_CHECKF(r->w.inflight == 0, "%llu requests still in flight",
                (unsigned long long)r->w.inflight);
    FUZZ_CHECKF(srv->body_buffered == 0, "%zu body bytes still counted", srv->body_buffered);
    FUZZ_CHECKF(srv->body_reserved == 0, "%zu body bytes still reserved", srv->body_reserved);
    FUZZ_CHECK(srv->body_exempt == NULL);
    FUZZ_CHECK(TAILQ_EMPTY(&r->w.budget_waiters));
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL)
            continue;
        FUZZ_CHECKF(be->inflight == 0 && be->queued_prefill == 0,
                    "backend %s: %u in flight, %llu prefill queued", be->conf.name, be->inflight,
                    (unsigned long long)be->queued_prefill);
        FUZZ_CHECKF(be->conns == 0, "backend %s: %u connections open", be->conf.name, be->conns);
    }
    for (size_t i = 0; i < r->w.npools; i++) {
        pcr_pool_t *pool = r->w.pools[i];
        FUZZ_CHECK(pool == NULL || (pool->nconns == 0 && TAILQ_EMPTY(&pool->waiters)));
    }
}

/* On a loaded machine the kernel may hand loopback packets to its softirq thread, after the
 * turn that would have seen them (a FIN, a connection the pod's listener had not taken yet):
 * real time passes (up to 2 s), the pod closing what it took meanwhile, until the router holds
 * no pod connection. */
void fuzz_router_end_input(fuzz_router_t *r, fuzz_pods_t *pods, void (*run)(void *), void *arg)
{
    fuzz_pods_close(pods);
    run(arg);
    for (int i = 0; i < 2000 && !pods_closed(r); i++) {
        usleep(1000);
        fuzz_pods_close(pods);
        run(arg);
    }
    fuzz_router_check_accounting(r);
}
