/* router/worker.c: owns the worker threads (server.h): their setup and teardown, the commands
 * the control thread sends them (drain, stop, reload, held streams), and the tick that keeps an
 * idle worker's index replica current. The services lower parts use live below it: the body
 * budget (budget.c), the pools (pools.c), the bus sync and drained check (server.h).
 *
 * A worker is built entirely on the main thread before its thread starts (event base, policy
 * replica, pools, listener events), runs its loop on its own thread, and tears itself down on
 * that thread when the loop ends; the last one to stop wakes the control loop through a pipe.
 * Commands travel through a pipe too: they are rare, and a worker's base is never touched by
 * another thread (libevent's bases here have no locks). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "body.h"
#include "budget.h"
#include "exchange_int.h"
#include "bus.h"
#include "log.h"
#include "pools.h"
#include "session.h"
#include "sock.h"
#include "tokenize.h"
#include "worker.h"
#include "tenants.h"

#define TICK_MS 20

/* ---- the loop ------------------------------------------------------------------------ */

/* The bus's backlog, a slice more (pcr_worker_sync arms it). */
static void on_sync_more(evutil_socket_t fd, short what, void *arg)
{
    pcr_worker_sync(arg);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    pcr_worker_t *w = arg;
    /* A quiescent point: no pointer read from a backend slot in an earlier callback is held
     * without a reference, so what was retired before this is free to go. */
    __atomic_store_n(&w->epoch_seen, __atomic_load_n(&w->srv->epoch, __ATOMIC_ACQUIRE),
                     __ATOMIC_RELEASE);
    pcr_worker_sync(w);
    pcr_pools_tick(w);
    pcr_policy_stats_t ps;
    pcr_policy_stats(w->policy, &ps);
    PCR_STORE(w->metrics.index_bytes, ps.index_bytes);
    /* A counter that never goes back: a replica made afresh (a reload that changed the keys)
     * starts its count at 0 again, and all of it is new. */
    uint64_t ev = ps.index_evictions;
    if (w->evictions_policy != w->policy) {
        w->evictions_policy = w->policy;
        w->evictions_seen = 0;
    }
    PCR_BUMP(w->metrics.index_evictions, ev >= w->evictions_seen ? ev - w->evictions_seen : ev);
    w->evictions_seen = ev;
    pcr_budget_tick(w);
    if (!w->draining)
        pcr_listeners_pause(w, pcr_mem_action_fresh(w->srv, PCR_OVERLOAD_STOP_ACCEPTING));
}

static void worker_drain(pcr_worker_t *w)
{
    if (w->draining)
        return;
    w->draining = 1;
    pcr_listeners_stop(w);
    /* drain() may close the session at once: take the next one first. */
    pcr_session_t *s = LIST_FIRST(&w->sessions), *next;
    for (; s != NULL; s = next) {
        next = LIST_NEXT(s, link);
        s->ops->drain(s);
    }
    pcr_pools_close_idle(w);
    pcr_worker_check_drained(w);
}

/* A reload: the new config and listeners. What the worker read of the old config before
 * returns to the loop is done with it; the control thread frees it once every worker said so. */
static void worker_switch(pcr_worker_t *w)
{
    pcr_switch_t *sw = __atomic_load_n(&w->srv->pending_switch, __ATOMIC_ACQUIRE);
    if (sw == NULL || PCR_LOAD(w->cfg_gen) >= sw->gen)
        return;
    if (pcr_listeners_adopt(w, sw->plan, sw->cfg) < 0)
        pcr_log_error("worker %u: out of memory taking the new listeners", w->id);
    w->cfg = sw->cfg;
    /* Release: every read of `sw` above happens before the control thread, seeing this
     * (acquire, pcr_reload_collect), frees it. */
    __atomic_store_n(&w->cfg_gen, sw->gen, __ATOMIC_RELEASE);
}

static void on_cmd(evutil_socket_t fd, short what, void *arg)
{
    pcr_worker_t *w = arg;
    char cmds[16];
    ssize_t n = read(fd, cmds, sizeof(cmds));
    for (ssize_t i = 0; i < n; i++) {
        if (cmds[i] == 'D')
            worker_drain(w);
        else if (cmds[i] == 'S')
            event_base_loopbreak(w->base);
        else if (cmds[i] == 'R')
            worker_switch(w);
        else if (cmds[i] == 'H')
            pcr_pools_kick_held(w);
    }
}

/* ---- set-up and teardown ------------------------------------------------------------- */

/* The policy starts with no backend: they join through the bus (pcr_backend_add published
 * each one before the workers existed), like every later one. */
static pcr_policy_t *make_policy(const pcr_config_t *cfg, unsigned nworkers)
{
    pcr_policy_opts_t o;
    pcr_config_policy_opts(cfg, nworkers, &o);
    pcr_policy_t *p = pcr_policy_new(&o, NULL, 0);
    pcr_policy_set_clock(p, pcr_now_ns); /* its phases in pcrouter_route_decision_seconds */
    return p;
}

/* Everything of a worker but its thread; on the main thread. Undone by pcr_worker_dispose(). */
int pcr_worker_init(pcr_server_t *srv, pcr_worker_t *w, unsigned id)
{
    w->srv = srv;
    w->cfg = srv->cfg;
    w->cfg_gen = PCR_LOAD(srv->cfg_gen);
    w->id = id;
    w->routes = &pcr_routes;
    w->spare_fd = -1;
    w->cmd_fd[0] = w->cmd_fd[1] = -1;
    LIST_INIT(&w->sessions);
    TAILQ_INIT(&w->waiting);
    w->base = pcr_sock_base_new();
    w->policy = make_policy(srv->cfg, srv->nworkers);
    if (w->base == NULL || w->policy == NULL)
        return PCR_ERR_NOMEM;
    pcr_worker_sync(w);
    if (pipe2(w->cmd_fd, O_CLOEXEC | O_NONBLOCK) != 0)
        return PCR_ERR_IO;
    w->cmd_event = event_new(w->base, w->cmd_fd[0], EV_READ | EV_PERSIST, on_cmd, w);
    w->tick = event_new(w->base, -1, EV_PERSIST, on_tick, w);
    w->sync_more = evtimer_new(w->base, on_sync_more, w);
    if (w->cmd_event == NULL || w->tick == NULL || w->sync_more == NULL ||
        pcr_budget_init(w) < 0)
        return PCR_ERR_NOMEM;
    struct timeval tv = {0, TICK_MS * 1000};
    event_add(w->cmd_event, NULL);
    event_add(w->tick, &tv);
    return pcr_listeners_adopt(w, srv->listen_plan, w->cfg);
}

void pcr_worker_dispose(pcr_worker_t *w)
{
    /* Close what is left (a drain that timed out leaves sessions): one close path each. */
    w->draining = 1; /* pools stop re-dispatching while everything closes */
    while (!LIST_EMPTY(&w->sessions)) {
        pcr_session_t *s = LIST_FIRST(&w->sessions);
        s->ops->close(s);
    }
    pcr_listeners_free(w);
    pcr_tokenize_worker_free(w); /* its refresh under way is cancelled, before its pool goes */
    pcr_pools_free(w);
    pcr_tenancy_worker_free(w);
    pcr_policy_free(w->policy);
    w->policy = NULL;
    if (w->cmd_event)
        event_free(w->cmd_event);
    if (w->tick)
        event_free(w->tick);
    if (w->sync_more)
        event_free(w->sync_more);
    pcr_budget_dispose(w);
    w->cmd_event = w->tick = w->sync_more = NULL;
    if (w->base)
        event_base_free(w->base);
    w->base = NULL;
    /* The command pipe stays open until the thread is joined: the control thread may still
     * write to it. */
}

/* What stays after pcr_worker_dispose() until no other thread can look at the worker. */
void pcr_worker_release(pcr_worker_t *w)
{
    for (int i = 0; i < 2; i++)
        if (w->cmd_fd[i] >= 0)
            close(w->cmd_fd[i]);
    w->cmd_fd[0] = w->cmd_fd[1] = -1;
}

/* ---- letting events gather (batch_wait_us) --------------------------------------------------
 * Under load, a loop that wakes for each event as it comes pays for every one a wait, a wake-up
 * and, batched, a submit of its own: on a VM, where a system call and a wake-up are dear, that
 * is a good part of a request's cost. When the last wait found two sockets or more readable
 * within batch_wait_us of starting (a steady flow), the worker sleeps before the next wait,
 * which then returns what came meanwhile, handled in one turn: batch_wait_us for each readable
 * socket past the first, GATHER_MAX of them at most. A wait that blocked longer, or found one
 * event (a single client taking turns with its pod), ends the stretch: light load gets no added
 * latency. Never while a busy turn's writes wait for the next turn's reads.
 *
 * Only a busy worker gathers: one whose thread ran batch_wait_busy of the time or more over the
 * last GATHER_SAMPLE_US, the time it slept to gather left out (so that gathering, which makes a
 * worker run less, does not turn itself off). Below that, CPU is not what limits the worker, and
 * a sleep would only delay the bursts a moderate rate brings (clients that fire together). */
typedef struct {
    uint64_t since;   /* when the last wait began (us) */
    unsigned dense;   /* 0, or how many batch_wait_us the next sleep lasts (GATHER_MAX at most) */
    int busy;         /* the last sample found the worker busy (batch_wait_busy or more) */
    uint64_t sampled; /* when it was taken (us, monotonic) */
    uint64_t cpu;     /* the thread's CPU time then (us) */
    uint64_t slept;   /* time slept to gather since (us) */
} gather_t;

/* A sample every 10 ms: a hundred clock_gettime calls a second, and a load that rises or falls
 * changes the worker's mind within that. */
#define GATHER_SAMPLE_US 10000

/* Full load gathers several sockets a turn and sleeps up to this many batch_wait_us; a moderate
 * rate, two a turn, one. Twice as long let a closed-loop load wait on the sleep. */
#define GATHER_MAX 4

static void gather_before(pcr_worker_t *w, gather_t *g, int writes_wait)
{
    unsigned us = w->cfg->batch_wait_us; /* a reload may change it: read every turn */
    if (us == 0) {
        g->dense = 0;
        return;
    }
    if (g->dense && !writes_wait) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)us * g->dense * 1000};
        uint64_t t0 = pcr_now_us();
        (void)nanosleep(&ts, NULL); /* a signal cuts it short: the wait goes on at once */
        PCR_INC(w->metrics.batch_waits);
        g->since = pcr_now_us();
        g->slept += g->since - t0;
        return;
    }
    g->since = pcr_now_us();
}

/* The worker's CPU time since the last sample against the clock's, less its sleeps
 * (pcrouter_worker_cpu_seconds_total counts the CPU time): is it busy enough to gather? */
static void gather_sample(pcr_worker_t *w, gather_t *g, uint64_t now)
{
    if (now - g->sampled < GATHER_SAMPLE_US)
        return;
    uint64_t cpu = pcr_thread_cpu_us();
    uint64_t ran = cpu > g->cpu ? cpu - g->cpu : 0;
    uint64_t awake = now - g->sampled > g->slept ? now - g->sampled - g->slept : 0;
    double share = w->cfg->batch_wait_busy; /* 0: gather whatever the load */
    if (g->sampled != 0) /* the first sample: the thread's start is not a load */
        PCR_ADD(w->metrics.cpu_us, ran);
    g->busy = share <= 0 || (g->sampled != 0 && (double)ran >= share * (double)awake);
    g->sampled = now;
    g->cpu = cpu;
    g->slept = 0;
}

static void gather_after(pcr_worker_t *w, gather_t *g, int writes_wait)
{
    if (writes_wait)
        return; /* a look without sleep, in the middle of a busy stretch: it says nothing */
    unsigned us = w->cfg->batch_wait_us;
    unsigned readable = pcr_sock_readable_take();
    uint64_t now = pcr_now_us();
    gather_sample(w, g, now);
    g->dense = 0;
    if (us > 0 && g->busy && readable >= 2 && now - g->since < us)
        g->dense = readable - 1 < GATHER_MAX ? readable - 1 : GATHER_MAX;
}

static void *worker_main(void *arg)
{
    pcr_worker_t *w = arg;
    pcr_server_t *srv = w->srv;
    int rc = w->cfg->io_uring
                 ? pcr_sock_batch_begin(&w->metrics.io_submits, &w->metrics.io_ops,
                                        &w->metrics.io_merged, &w->io_uring)
                 : -1;
    if (w->cfg->io_uring && rc != 0 && w->id == 0)
        pcr_log_warn("io_uring: no ring (%s): every socket read and write is a system call of "
                     "its own", strerror(-rc));
    gather_t g = {0};
    /* The thread's timers to the microsecond: the default slack (50 us) would make a sleep of
     * batch_wait_us up to three times as long. */
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    /* One turn at a time, so that its reads and writes go out together at its end; while a
     * busy turn's writes wait, the next only looks (no sleep) and they go with its reads.
     * Without a ring the batch calls do nothing and each turn is libevent's alone. */
    for (;;) {
        int writes_wait = pcr_sock_batch_waiting();
        gather_before(w, &g, writes_wait);
        int turn = event_base_loop(w->base, writes_wait ? EVLOOP_ONCE | EVLOOP_NONBLOCK
                                                        : EVLOOP_ONCE);
        gather_after(w, &g, writes_wait);
        pcr_sock_batch_turn();
        if (turn != 0 || event_base_got_exit(w->base) || event_base_got_break(w->base)) {
            pcr_sock_batch_flush();
            break;
        }
    }
    pcr_worker_dispose(w);
    pcr_sock_batch_end();
    pcr_body_reader_cache_clear(); /* the spare readers and exchanges this thread kept */
    pcr_exchange_cache_clear();
    __atomic_store_n(&w->stopped, 1, __ATOMIC_RELEASE); /* after its last use of shared state */
    if (PCR_SUB(srv->workers_running, 1) == 1) {
        ssize_t n = write(srv->wake_fd[1], "x", 1); /* the last one out wakes the control loop */
        (void)n;
    }
    return NULL;
}

int pcr_workers_start(pcr_server_t *srv)
{
    srv->workers = calloc(srv->nworkers, sizeof(*srv->workers));
    if (srv->workers == NULL)
        return PCR_ERR_NOMEM;
    for (unsigned i = 0; i < srv->nworkers; i++) {
        int rc = pcr_worker_init(srv, &srv->workers[i], i);
        if (rc < 0) {
            pcr_log_error("cannot start worker %u: %s", i, pcr_strerror(rc));
            for (unsigned k = 0; k <= i; k++) {
                pcr_worker_dispose(&srv->workers[k]);
                pcr_worker_release(&srv->workers[k]);
            }
            free(srv->workers);
            srv->workers = NULL;
            return rc;
        }
    }
    /* Signals belong to the control loop: the workers start with every signal blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    PCR_STORE(srv->workers_running, srv->nworkers);
    int err = 0;
    unsigned started = 0;
    for (; started < srv->nworkers; started++) {
        err = pthread_create(&srv->workers[started].thread, NULL, worker_main, &srv->workers[started]);
        if (err != 0)
            break;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0) {
        pcr_log_error("cannot start worker thread %u: %s", started, strerror(err));
        PCR_SUB(srv->workers_running, srv->nworkers - started);
        for (unsigned k = started; k < srv->nworkers; k++) {
            pcr_worker_dispose(&srv->workers[k]);
            pcr_worker_release(&srv->workers[k]);
        }
        srv->nworkers = started;
        pcr_workers_stop(srv);
        pcr_workers_join(srv);
        return PCR_ERR_IO;
    }
    return 0;
}

void pcr_workers_command(pcr_server_t *srv, char c)
{
    for (unsigned i = 0; i < srv->nworkers; i++) {
        ssize_t n = write(srv->workers[i].cmd_fd[1], &c, 1);
        (void)n;
    }
}

void pcr_workers_drain(pcr_server_t *srv) { pcr_workers_command(srv, 'D'); }
void pcr_workers_stop(pcr_server_t *srv) { pcr_workers_command(srv, 'S'); }

void pcr_workers_join(pcr_server_t *srv)
{
    for (unsigned i = 0; i < srv->nworkers; i++)
        pthread_join(srv->workers[i].thread, NULL);
    for (unsigned i = 0; i < srv->nworkers; i++)
        pcr_worker_release(&srv->workers[i]);
    free(srv->workers);
    srv->workers = NULL;
    pcr_tokenize_server_free(srv);
}
