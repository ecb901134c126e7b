/* router/main.c: the pcrouter process: command line, start-up (config, backends, listeners,
 * workers), the control loop on the main thread, and the graceful stop (SIGTERM/SIGINT: every
 * worker stops accepting and lets its in-flight requests finish within timeouts.drain_ms; the
 * process exits 0 once the last worker is done). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/signalfd.h>

#include <event2/event.h>
#include <openssl/ssl.h>

#include "accesslog.h"
#include "backend.h"
#include "control.h"
#include "bus.h"
#include "evmem.h"
#include "discovery.h"
#include "dns.h"
#include "config.h"
#include "log.h"
#include "memguard.h"
#include "reload.h"
#include "tenants.h"
#include "session.h"
#include "share.h"
#include "sock.h"
#include "upstream.h"
#include "version.h"
#include "worker.h"

#define PCR_VERSION "0.1.0"


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

static void on_hup(pcr_server_t *srv)
{
    if (PCR_LOAD(srv->draining)) {
        pcr_log_warn("SIGHUP while draining: no reload");
        return;
    }
    pcr_reload_start(srv);
}

/* Log rotation: the access log's writer reopens its file (the renamed one keeps every line
 * written before). */
static void on_usr1(pcr_server_t *srv)
{
    pcr_log_info("SIGUSR1: reopening the access log");
    pcr_accesslog_reopen(srv->access_log, NULL);
}

static void on_stop_signal(pcr_server_t *srv, int sig)
{
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
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be != NULL)
            pcr_upstream_close_idle(be->check_pool);
    }
    unsigned ms = srv->cfg->timeouts.drain_ms;
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    srv->drain_timer = evtimer_new(srv->base, on_drain_timeout, srv);
    if (srv->drain_timer)
        evtimer_add(srv->drain_timer, &tv);
}

/* Signals arrive through a signalfd read by the control loop: every thread blocks them from
 * the start (they are blocked before the first thread exists), so none is ever interrupted by a
 * handler, and each one is read here as data, in order, on the loop that acts on it. */
static void on_signalfd(evutil_socket_t fd, short what, void *arg)
{
    pcr_server_t *srv = arg;
    struct signalfd_siginfo si;
    for (int n = 0; n < 64; n++) {
        ssize_t got = read(fd, &si, sizeof(si));
        if (got != (ssize_t)sizeof(si))
            return; /* EAGAIN: all read */
        switch ((int)si.ssi_signo) {
        case SIGHUP:
            on_hup(srv);
            break;
        case SIGUSR1:
            on_usr1(srv);
            break;
        case SIGTERM:
        case SIGINT:
            on_stop_signal(srv, (int)si.ssi_signo);
            break;
        default:
            break;
        }
    }
}

static int signals_block(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGUSR1);
    return pthread_sigmask(SIG_BLOCK, set, NULL);
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

/* workers: 0 means one per CPU the process may use: the affinity mask, or the cgroup CPU quota
 * when it is smaller (cpus.h). The choice and its reason are logged and exported. */
static unsigned worker_count(pcr_server_t *srv)
{
    pcr_cpus_detect(&srv->cpus, "", 0);
    if (srv->cfg->workers > 0) {
        srv->workers_source = "config";
        return srv->cfg->workers;
    }
    srv->workers_source = pcr_cpus_source_name(srv->cpus.source);
    if (srv->cpus.source == PCR_CPUS_CGROUP)
        pcr_log_info("workers: %u, the cgroup CPU quota (%.2f CPUs in %s) under the %u CPU(s) of "
                     "the affinity mask", srv->cpus.count, srv->cpus.quota, srv->cpus.quota_path,
                     srv->cpus.affinity);
    else
        pcr_log_info("workers: %u, the CPUs in the affinity mask%s", srv->cpus.count,
                     srv->cpus.quota > 0 ? " (the cgroup CPU quota is not smaller)" : "");
    return srv->cpus.count;
}

static int run(const char *path)
{
    int rc = 1, started = 0;
    char *errors = NULL;
    pcr_server_t srv;
    memset(&srv, 0, sizeof(srv));
    srv.wake_fd[0] = srv.wake_fd[1] = -1;
    srv.sig_fd = -1;
    srv.cfg = pcr_config_load(path, &errors);
    if (srv.cfg == NULL) {
        fprintf(stderr, "%s", errors ? errors : "invalid config\n");
        free(errors);
        return 1;
    }
    pcr_log_set_level(srv.cfg->log.level);
    pcr_tenancy_assign(&srv, srv.cfg);
    signal(SIGPIPE, SIG_IGN);
    /* Before any thread starts (the access log's writer is the first): every thread inherits
     * the mask, and the signals wait for the signalfd. */
    sigset_t sigs;
    if (signals_block(&sigs) != 0 ||
        (srv.sig_fd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC)) < 0) {
        pcr_log_error("cannot start: signalfd: %s", strerror(errno));
        goto out;
    }
    srv.nworkers = worker_count(&srv);
    /* The control loop gets no epoll changelist (pcr_sock_base_new's hot-path shortcut; it
     * runs checks, scrapes, lookups and the Redis link, no hot path): hiredis closes a socket
     * right after deleting its events, and with the changelist the epoll_ctl would come after
     * the close, when a worker may already have been given the same fd number. That is
     * harmless (pcr_sock_base_new says why) but avoidable here, so it is avoided. */
    srv.base = event_base_new();
    srv.bus = pcr_bus_new(srv.nworkers);
    if (srv.base == NULL || srv.bus == NULL || pipe2(srv.wake_fd, O_CLOEXEC | O_NONBLOCK) != 0) {
        pcr_log_error("cannot start: out of memory");
        goto out;
    }
    char al_err[512];
    srv.access_log = pcr_accesslog_new(srv.cfg->log.access_log_path, srv.nworkers,
                                       PCR_ACCESSLOG_QUEUE_BYTES, al_err, sizeof(al_err));
    if (srv.access_log == NULL) {
        pcr_log_error("cannot start: log.access_log_path: %s", al_err);
        goto out;
    }
    char dns_err[256];
    srv.dns = pcr_dns_new(srv.base, srv.cfg->dns.nameservers, srv.cfg->dns.nnameservers,
                          srv.cfg->dns.timeout_ms, dns_err, sizeof(dns_err));
    if (srv.dns == NULL) {
        pcr_log_error("cannot start: %s", dns_err);
        goto out;
    }
    if (pcr_backends_init(&srv) < 0 ||
        (srv.listen_plan = pcr_listen_plan_new(&srv, srv.cfg, NULL)) == NULL)
        goto out;
    srv.sig_ev = event_new(srv.base, srv.sig_fd, EV_READ | EV_PERSIST, on_signalfd, &srv);
    srv.workers_done = event_new(srv.base, srv.wake_fd[0], EV_READ, on_workers_done, &srv);
    if (srv.sig_ev == NULL || srv.workers_done == NULL || event_add(srv.sig_ev, NULL) < 0 ||
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
    pcr_memguard_tick(&srv); /* the limit in force before the first request */
    pcr_share_start(srv.share);
    pcr_discovery_start(&srv);
    pcr_log_info("ready: pcrouter %s, %zu backend(s), policy %s, %u worker(s)", PCR_VERSION,
                 pcr_backends_count(&srv), pcr_policy_kind_name(srv.cfg->routing.policy),
                 srv.nworkers);
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
    /* Before the resolvers go: the link's own lookups are cancelled first (dns.c). */
    pcr_share_free(srv.share);
    srv.share = NULL;
    pcr_discovery_stop(&srv);
    pcr_reload_dispose(&srv);
    pcr_dns_free(srv.dns);
    srv.dns = NULL;
    if (srv.drain_timer)
        event_del(srv.drain_timer);
    pcr_listen_plan_free(srv.listen_plan);
    pcr_backends_dispose(&srv);
    pcr_bus_free(srv.bus);
    if (srv.sig_ev)
        event_free(srv.sig_ev);
    if (srv.sig_fd >= 0)
        close(srv.sig_fd);
    /* After the workers: every line they queued is written before the file closes. */
    pcr_accesslog_free(srv.access_log);
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
    free(srv.session_words);
    pcr_evmem_thread_clear();
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
    pcr_evmem_install(); /* before anything uses libevent */
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
