/* router/main.c: the pcrouter process: command line, start-up (config, backends, listeners,
 * workers), the control loop on the main thread, and the graceful stop (SIGTERM/SIGINT: every
 * worker stops accepting and lets its in-flight requests finish within timeouts.drain_ms; the
 * process exits 0 once the last worker is done). */
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/ssl.h>

#include "backend.h"
#include "bus.h"
#include "config.h"
#include "log.h"
#include "session.h"
#include "share.h"
#include "sock.h"
#include "upstream.h"
#include "version.h"

#define PCR_VERSION "0.1.0"

uint64_t pcr_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
    pcr_server_t *srv = arg;
    uint64_t inflight = 0;
    for (unsigned k = 0; k < srv->nworkers; k++)
        inflight += PCR_LOAD(srv->workers[k].inflight);
    pcr_log_warn("drain timeout: %llu request(s) still in flight are cut",
                 (unsigned long long)inflight);
    pcr_workers_stop(srv);
}

/* The last worker stopped: the control loop ends too. */
static void on_workers_done(evutil_socket_t fd, short what, void *arg)
{
    pcr_server_t *srv = arg;
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
        pcr_workers_stop(srv);
        return;
    }
    PCR_STORE(srv->draining, 1);
    uint64_t inflight = 0;
    for (unsigned k = 0; k < srv->nworkers; k++)
        inflight += PCR_LOAD(srv->workers[k].inflight);
    pcr_log_info("signal %d: draining (%llu request(s) in flight, up to %u ms)", (int)sig,
                 (unsigned long long)inflight, srv->cfg->timeouts.drain_ms);
    pcr_workers_drain(srv);
    pcr_share_drain(srv->share);
    for (size_t i = 0; i < srv->nbackends; i++)
        pcr_upstream_close_idle(&srv->check_pools[i]);
    unsigned ms = srv->cfg->timeouts.drain_ms;
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    srv->drain_timer = evtimer_new(srv->base, on_drain_timeout, srv);
    if (srv->drain_timer)
        evtimer_add(srv->drain_timer, &tv);
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

/* workers: 0 means one per CPU the process may run on. */
static unsigned worker_count(const pcr_config_t *cfg)
{
    if (cfg->workers > 0)
        return cfg->workers;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return (unsigned)CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

static int run(const char *path)
{
    int rc = 1, started = 0;
    char *errors = NULL;
    pcr_server_t srv;
    memset(&srv, 0, sizeof(srv));
    srv.wake_fd[0] = srv.wake_fd[1] = -1;
    srv.cfg = pcr_config_load(path, &errors);
    if (srv.cfg == NULL) {
        fprintf(stderr, "%s", errors ? errors : "invalid config\n");
        free(errors);
        return 1;
    }
    pcr_log_set_level(srv.cfg->log.level);
    signal(SIGPIPE, SIG_IGN);
    srv.nworkers = worker_count(srv.cfg);
    /* The control loop gets no epoll changelist (pcr_sock_base_new's hot-path shortcut):
     * hiredis closes a socket right after deleting its events, and with the changelist the
     * epoll_ctl would come later, when a worker may already have been given the same fd
     * number by accept(). */
    srv.base = event_base_new();
    srv.bus = pcr_bus_new(srv.nworkers);
    if (srv.base == NULL || srv.bus == NULL || pipe2(srv.wake_fd, O_CLOEXEC | O_NONBLOCK) != 0) {
        pcr_log_error("cannot start: out of memory");
        goto out;
    }
    if (pcr_backends_init(&srv) < 0 || pcr_listeners_bind(&srv) < 0)
        goto out;
    srv.sig_term = evsignal_new(srv.base, SIGTERM, on_signal, &srv);
    srv.sig_int = evsignal_new(srv.base, SIGINT, on_signal, &srv);
    srv.sig_hup = evsignal_new(srv.base, SIGHUP, on_hup, &srv);
    srv.workers_done = event_new(srv.base, srv.wake_fd[0], EV_READ, on_workers_done, &srv);
    if (srv.sig_term == NULL || srv.sig_int == NULL || srv.sig_hup == NULL ||
        srv.workers_done == NULL || evsignal_add(srv.sig_term, NULL) < 0 ||
        evsignal_add(srv.sig_int, NULL) < 0 || evsignal_add(srv.sig_hup, NULL) < 0 ||
        event_add(srv.workers_done, NULL) < 0)
        goto out;
    /* The bus tap must be on before a worker publishes anything. */
    if (pcr_share_new(&srv, &srv.share) < 0) {
        pcr_log_error("cannot start: the index sharing could not be set up");
        goto out;
    }
    if (pcr_workers_start(&srv) < 0)
        goto out;
    started = 1;
    pcr_share_start(srv.share);
    pcr_log_info("ready: pcrouter %s, %zu backend(s), policy %s, %u worker(s)", PCR_VERSION,
                 srv.nbackends, pcr_policy_kind_name(srv.cfg->routing.policy), srv.nworkers);
    event_base_dispatch(srv.base);
    rc = 0;
out:
    if (started) {
        pcr_workers_stop(&srv); /* no-op for workers that already stopped */
        pcr_workers_join(&srv);
        pcr_share_finish(srv.share);
        pcr_log_info("stopped");
    }
    PCR_STORE(srv.draining, 1);
    pcr_share_free(srv.share);
    pcr_listeners_unbind(&srv);
    pcr_backends_dispose(&srv);
    pcr_bus_free(srv.bus);
    if (srv.sig_term)
        event_free(srv.sig_term);
    if (srv.sig_int)
        event_free(srv.sig_int);
    if (srv.sig_hup)
        event_free(srv.sig_hup);
    if (srv.workers_done)
        event_free(srv.workers_done);
    if (srv.drain_timer)
        event_free(srv.drain_timer);
    if (srv.base)
        event_base_free(srv.base);
    for (int i = 0; i < 2; i++)
        if (srv.wake_fd[i] >= 0)
            close(srv.wake_fd[i]);
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
            pcr_version_print(stdout);
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
