/* router/main.c: the pcrouter process: command line, start-up, the event loop, and the
 * graceful stop (SIGTERM/SIGINT: stop accepting, let in-flight requests finish within
 * timeouts.drain_ms, exit 0). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <openssl/ssl.h>

#include "backend.h"
#include "config.h"
#include "log.h"
#include "session.h"
#include "sock.h"
#include "upstream.h"

#define PCR_VERSION "0.1.0"

uint64_t pcr_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void pcr_server_check_drained(pcr_server_t *srv)
{
    if (srv->draining && srv->inflight == 0 && srv->nsessions == 0)
        event_base_loopexit(srv->base, NULL);
}

int pcr_server_body_budget_ok(const pcr_server_t *srv)
{
    return srv->body_buffered < srv->cfg->limits.max_buffered_body_bytes;
}

int pcr_server_body_may_grow(pcr_server_t *srv, const void *req)
{
    if (pcr_server_body_budget_ok(srv) || srv->body_exempt == req)
        return 1;
    if (srv->body_exempt != NULL)
        return 0;
    srv->body_exempt = req;
    return 1;
}

void pcr_server_body_forget(pcr_server_t *srv, const void *req)
{
    if (srv->body_exempt == req)
        srv->body_exempt = NULL;
}

/* Waiters can make progress: there is budget, or nobody holds the exemption. */
static int budget_open(const pcr_server_t *srv)
{
    return pcr_server_body_budget_ok(srv) || srv->body_exempt == NULL;
}

void pcr_server_body_wait(pcr_server_t *srv, pcr_budget_waiter_t *w)
{
    if (!w->queued) {
        TAILQ_INSERT_TAIL(&srv->budget_waiters, w, link);
        w->queued = 1;
    }
}

void pcr_server_body_unwait(pcr_server_t *srv, pcr_budget_waiter_t *w)
{
    if (w->queued) {
        TAILQ_REMOVE(&srv->budget_waiters, w, link);
        w->queued = 0;
    }
}

void pcr_server_body_released(pcr_server_t *srv)
{
    if (!TAILQ_EMPTY(&srv->budget_waiters) && budget_open(srv) && srv->budget_event)
        event_active(srv->budget_event, 0, 0);
}

/* Wakes the sessions waiting for body budget, oldest first, while there is budget (or the
 * exemption is free); each may take some and wait again, which puts it at the back. */
static void on_budget(evutil_socket_t fd, short what, void *arg)
{
    pcr_server_t *srv = arg;
    size_t n = 0;
    pcr_budget_waiter_t *w;
    for (w = TAILQ_FIRST(&srv->budget_waiters); w != NULL; w = TAILQ_NEXT(w, link))
        n++;
    while (n-- > 0 && budget_open(srv) &&
           (w = TAILQ_FIRST(&srv->budget_waiters)) != NULL) {
        pcr_server_body_unwait(srv, w);
        w->resume(w);
    }
}

static void on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    pcr_server_t *srv = arg;
    pcr_log_warn("drain timeout: %llu request(s) still in flight are cut",
                 (unsigned long long)srv->inflight);
    event_base_loopexit(srv->base, NULL);
}

static void on_hup(evutil_socket_t sig, short what, void *arg)
{
    pcr_server_t *srv = arg;
    pcr_log_warn("SIGHUP: reloading the config is not supported yet; still running with %s",
                 srv->cfg->path);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    pcr_server_t *srv = arg;
    if (srv->draining) {
        pcr_log_warn("second signal: stopping now");
        event_base_loopexit(srv->base, NULL);
        return;
    }
    srv->draining = 1;
    pcr_log_info("signal %d: draining (%llu request(s) in flight, up to %u ms)", (int)sig,
                 (unsigned long long)srv->inflight, srv->cfg->timeouts.drain_ms);
    pcr_listeners_stop(srv);
    /* drain() may close the session at once: take the next one first. */
    pcr_session_t *s = LIST_FIRST(&srv->sessions), *next;
    for (; s != NULL; s = next) {
        next = LIST_NEXT(s, link);
        s->ops->drain(s);
    }
    for (size_t i = 0; i < srv->nbackends; i++)
        pcr_upstream_close_idle(&srv->backends[i]);
    unsigned ms = srv->cfg->timeouts.drain_ms;
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    srv->drain_timer = evtimer_new(srv->base, on_drain_timeout, srv);
    if (srv->drain_timer)
        evtimer_add(srv->drain_timer, &tv);
    pcr_server_check_drained(srv);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pcrouter -c FILE          run with the config FILE (also --config FILE)\n"
            "       pcrouter --check-config FILE  validate FILE, print every error, exit 1 on any\n"
            "       pcrouter --version | --help\n"
            "\n"
            "A prefix-cache-aware router for OpenAI-style inference servers (vLLM).\n"
            "Config reference: conf/pcrouter.full.json and conf/README.md. Logs go to stderr.\n");
}

static int check_config(const char *path)
{
    char *errors = NULL;
    pcr_config_t *cfg = pcr_config_load(path, &errors);
    if (cfg == NULL) {
        fprintf(stderr, "%s", errors ? errors : "invalid config\n");
        if (errors && errors[strlen(errors) - 1] != '\n')
            fputc('\n', stderr);
        free(errors);
        return 1;
    }
    printf("%s: OK (%zu listener(s), %zu backend(s), policy %s)\n", path, cfg->nlisten,
           cfg->nbackends, pcr_policy_kind_name(cfg->routing.policy));
    pcr_config_free(cfg);
    return 0;
}

static pcr_policy_t *make_policy(const pcr_config_t *cfg)
{
    pcr_backend_desc_t descs[cfg->nbackends];
    for (size_t i = 0; i < cfg->nbackends; i++) {
        const pcr_backend_conf_t *b = &cfg->backends[i];
        descs[i].name = b->name;
        descs[i].zone = b->zone;
        descs[i].weight = b->weight;
        /* A token is 4 bytes of canonical prompt: capacity in tokens -> blocks. */
        uint64_t blocks = b->capacity_tokens * 4 / cfg->routing.block_bytes;
        descs[i].capacity_blocks = blocks ? blocks : 1;
    }
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    o.kind = cfg->routing.policy;
    o.block_bytes = cfg->routing.block_bytes;
    o.max_prefix_bytes = cfg->routing.max_prefix_bytes;
    o.index_max_bytes = cfg->routing.index_max_bytes;
    o.load_factor = cfg->routing.load_factor;
    o.load_weight = cfg->routing.load_weight;
    o.zone_penalty = cfg->routing.zone_penalty;
    o.zone = cfg->routing.zone;
    o.vnodes = cfg->routing.vnodes;
    return pcr_policy_new(&o, descs, cfg->nbackends);
}

static int run(const char *path)
{
    int rc = 1;
    char *errors = NULL;
    pcr_server_t srv;
    memset(&srv, 0, sizeof(srv));
    LIST_INIT(&srv.sessions);
    TAILQ_INIT(&srv.waiting);
    TAILQ_INIT(&srv.budget_waiters);
    srv.spare_fd = -1;
    srv.cfg = pcr_config_load(path, &errors);
    if (srv.cfg == NULL) {
        fprintf(stderr, "%s", errors ? errors : "invalid config\n");
        free(errors);
        return 1;
    }
    pcr_log_set_level(srv.cfg->log.level);
    signal(SIGPIPE, SIG_IGN);
    srv.base = pcr_sock_base_new();
    srv.policy = make_policy(srv.cfg);
    if (srv.base == NULL || srv.policy == NULL) {
        pcr_log_error("cannot start: out of memory or invalid routing settings");
        goto out;
    }
    if (pcr_backends_init(&srv) < 0 || pcr_listeners_start(&srv) < 0)
        goto out;
    srv.sig_term = evsignal_new(srv.base, SIGTERM, on_signal, &srv);
    srv.sig_int = evsignal_new(srv.base, SIGINT, on_signal, &srv);
    srv.sig_hup = evsignal_new(srv.base, SIGHUP, on_hup, &srv);
    srv.budget_event = event_new(srv.base, -1, 0, on_budget, &srv);
    if (srv.sig_term == NULL || srv.sig_int == NULL || srv.sig_hup == NULL ||
        srv.budget_event == NULL || evsignal_add(srv.sig_term, NULL) < 0 ||
        evsignal_add(srv.sig_int, NULL) < 0 || evsignal_add(srv.sig_hup, NULL) < 0)
        goto out;
    pcr_log_info("ready: pcrouter %s, %zu backend(s), policy %s", PCR_VERSION, srv.nbackends,
                 pcr_policy_kind_name(srv.cfg->routing.policy));
    event_base_dispatch(srv.base);
    rc = 0;
    pcr_log_info("stopped");
out:
    /* Close what is left (a drain that timed out leaves sessions): one close path each. */
    srv.draining = 1; /* pools stop re-dispatching while everything closes */
    while (!LIST_EMPTY(&srv.sessions)) {
        pcr_session_t *s = LIST_FIRST(&srv.sessions);
        s->ops->close(s);
    }
    pcr_listeners_free(&srv);
    pcr_backends_dispose(&srv);
    pcr_policy_free(srv.policy);
    if (srv.sig_term)
        event_free(srv.sig_term);
    if (srv.sig_int)
        event_free(srv.sig_int);
    if (srv.sig_hup)
        event_free(srv.sig_hup);
    if (srv.budget_event)
        event_free(srv.budget_event);
    if (srv.drain_timer)
        event_free(srv.drain_timer);
    if (srv.base)
        event_base_free(srv.base);
    pcr_config_free(srv.cfg);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"check-config", required_argument, NULL, 'C'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "c:hV", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case 'C':
            return check_config(optarg);
        case 'V':
            printf("pcrouter %s\n", PCR_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (config == NULL || optind < argc) {
        usage(stderr);
        return 2;
    }
    return run(config);
}
