/* router/core/server.h: the two contexts every part of the proxy hangs off.
 *
 * pcr_server_t is the process: the config, the backends' shared state (health, load, pod
 * metrics), the workers, and the control loop on the main thread (signals, health checks,
 * scrapes). pcr_worker_t is one worker thread: its own event loop, listeners (SO_REUSEPORT),
 * client sessions, upstream connection pools, metrics, and its own replica of the routing
 * policy. Nothing of a worker is touched by another thread except through worker.c: its
 * command pipe, its inbox of index updates, and counters read with relaxed atomics.
 *
 * This header holds their data only, low in the ladder so every layer may read it; the code
 * that runs the process and the workers is at the top (main.c, worker.h, control.h, reload.h).
 *
 *   main thread: control loop ------ commands (drain, stop) -------> worker 0 .. N-1
 *                health, scrapes --- index updates (capacity) -----> every worker's inbox
 *   worker i: decides, commits ----- index updates (commit, forget) -> every other worker
 *
 * Every worker routes from the same knowledge: what one learns (a prefix committed to a
 * backend, forgotten after a failure) is applied at once to its own policy and appended to the
 * others' inboxes, which they drain before each decision and on a short tick. */
#ifndef PCR_ROUTER_SERVER_H
#define PCR_ROUTER_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include <event2/event.h>
#include <openssl/ssl.h>

#include "atomic.h"
#include "bus.h"
#include "clock.h"
#include "config.h"
#include "counters.h"
#include "cpus.h"
#include "memacct.h"
#include "pcr/policy.h"

typedef struct pcr_backend pcr_backend_t;
typedef struct pcr_pool pcr_pool_t;
typedef struct pcr_session pcr_session_t;
typedef struct pcr_worker pcr_worker_t;
typedef struct pcr_bus pcr_bus_t;
typedef struct pcr_share pcr_share_t;

/* What the workers' listeners are to be (conn.c): for each config listener, the running
 * listener to keep (its sockets), or new sockets, one per worker, bound by the main thread; and
 * each one's TLS context, shared by the workers. Made at start and at each reload. */
typedef struct pcr_listen_plan {
    size_t n;
    unsigned nworkers;
    int *keep;                    /* [n]: index of the running listener kept, or -1 */
    int *fds;                     /* [n * nworkers]: new sockets, -1 once a worker took one */
    SSL_CTX **ctx;                /* [n]: NULL for plain */
} pcr_listen_plan_t;

typedef struct pcr_dns pcr_dns_t;
typedef struct pcr_reload pcr_reload_t;
typedef struct pcr_accesslog pcr_accesslog_t;
struct pcr_watch;
struct pcr_exchange;
struct pcr_flowq;

/* A tenant's state in the process, by slot: slots are given to tenant names as configs name
 * them (pcr_tenancy_assign, on the control thread) and never change hands, so a request
 * admitted under one config releases what it holds under the next. Slot 0 is "default". */
typedef struct {
    char name[PCR_TENANT_NAME_MAX + 1];  /* control thread only; "" = free */
    uint64_t tat_requests;        /* atomic: requests_per_s's GCRA (pcr/tenancy.h), in us */
    uint64_t tat_tokens;          /* atomic: tokens_per_min's, in us */
    uint32_t concurrent;          /* atomic: requests admitted and not finished */
} pcr_tenant_state_t;

/* A reload's new config and listeners, waiting for every worker to take them (reload.c). */
typedef struct {
    pcr_config_t *cfg;
    pcr_listen_plan_t *plan;
    uint64_t gen;
    pcr_config_t *old_cfg;        /* freed once every worker switched */
    pcr_listen_plan_t *old_plan;
} pcr_switch_t;

typedef struct pcr_server {
    pcr_config_t *cfg;
    /* Backends by slot (= policy id), PCR_MAX_BACKENDS of them, NULL for an empty slot; read
     * with pcr_backend_at() (backend.h). Slots below `nslots` (atomic) may be in use. */
    pcr_backend_t **backends;
    size_t nslots;
    char *slot_taken;             /* control thread: the slot's backend is not freed yet */
    LIST_HEAD(, pcr_backend) retired;  /* left, freed once nothing holds them */
    uint64_t epoch;               /* atomic: retirements; workers publish the last they saw */
    uint64_t light_needed_us;     /* atomic: when a light client last found no free connection
                                   * but a pool's reserve, any worker's and pod's: from then
                                   * every pool keeps its reserve (pcr/connshare.h) */
    const struct pcr_backend_hooks *backend_hooks;  /* the checks of each backend (control.c) */
    pcr_worker_t *workers;
    unsigned nworkers;
    const char *workers_source;   /* why nworkers: "config", "affinity" or "cgroup_quota" */
    pcr_cpus_t cpus;              /* the CPUs the process may use (cpus.h) */
    pcr_bus_t *bus;               /* index updates between workers (bus.c) */
    pcr_accesslog_t *access_log;  /* the access log's writer (accesslog.h) */
    pcr_share_t *share;           /* the index shared with other replicas (share.c), or NULL */
    struct pcr_kv_sub *kv_sub;    /* precise mode's KV-event subscriber (precise.c), or NULL;
                                     /metrics reads its counters */
    struct pcr_tokcache *tokcache;/* what earlier prompts tokenized to, every worker's
                                     (tokenize.c, under its lock); freed once they are joined */
    uint64_t tokcache_bytes;      /* atomic: its bytes, for the memory account */
    int share_loading;            /* atomic: a cold start loads the shared index; /health 503 */
    /* Whether the pods serve others than this router too (scrape.c, control thread): the
     * requests they finished against those they answered this router, summed over the pods
     * since the window began; the verdict, 0 not yet, 1 this router alone, 2 others too
     * (atomic: /metrics reads it). */
    uint64_t share_pod, share_ours;
    int pods_shared;

    /* The control loop, on the main thread. */
    struct event_base *base;
    struct event *probe_tick;     /* probes of ejected backends (control.c) */
    struct event *scrape_tick;    /* the pods' metrics and model lists (control.c) */
    struct event *sig_ev; /* the signalfd (SIGTERM, SIGINT, SIGHUP, SIGUSR1) */
    int sig_fd;
    struct event *drain_timer;
    struct event *workers_done;   /* the last worker to stop wakes the control loop */
    int draining;                 /* SIGTERM seen (atomic: workers read it) */
    unsigned workers_running;     /* atomic */
    int wake_fd[2];               /* workers_done's pipe */

    /* Request-body bytes reserved by all workers' sessions, against
     * limits.max_buffered_body_bytes, and the bytes of bodies held (router/body/budget.h). */
    size_t body_reserved;         /* atomic */
    size_t body_buffered;         /* atomic */
    const void *body_exempt;      /* atomic: the one request allowed past the budget, or NULL */
    /* Response bytes kept for clients slower than their pods, by all workers, against
     * limits.max_buffered_response_bytes (http/respond.c). */
    size_t resp_buffered;         /* atomic */
    /* The memory account against limits.max_memory_bytes (memacct.h), added up by the control
     * thread's tick (router/memguard.c), and the overload actions it set off. */
    uint64_t mem_limit;           /* atomic: the limit in force ("auto" resolved); 0: off */
    uint64_t mem_parts[PCR_MEM__COUNT]; /* atomic: the account at the last tick, by part */
    uint64_t mem_slow;            /* atomic: of it, all but the bodies and responses */
    uint64_t mem_static;          /* atomic: of it, all but those and libevent's and nghttp2's */
    unsigned overload;            /* atomic: PCR_OVERLOAD_BIT of each action on */
    const pcr_config_t *mem_cfg;  /* control thread: the config the limit was resolved for */
    pcr_listen_plan_t *listen_plan; /* the listeners in force (their TLS contexts) */

    /* Names, DNS discovery and reloads (control thread). */
    pcr_dns_t *dns;
    struct pcr_watch *watches;    /* one per discovery entry */
    size_t nwatches;
    uint64_t discovery_lookups, discovery_failures;  /* atomic */
    pcr_reload_t *reload;         /* in progress */
    int reload_again;             /* a SIGHUP came during one */
    pcr_switch_t *pending_switch; /* atomic: what the workers switch to at 'R' */
    pcr_switch_t *switching;      /* control: waiting for every worker */
    uint64_t cfg_gen;             /* atomic: reloads applied */
    uint64_t reloads_ok, reloads_failed;  /* atomic */
    pcr_tenant_state_t tenants[PCR_MAX_TENANTS];
    uint64_t session_words_n;     /* the session table (tenancy.c): 2 x this many words */
    uint64_t *session_words;      /* atomic words, pcr/tenancy.h's affinity format */
} pcr_server_t;

struct pcr_worker {
    pcr_server_t *srv;
    const pcr_config_t *cfg;      /* srv->cfg */
    unsigned id;
    pthread_t thread;
    struct event_base *base;
    pcr_policy_t *policy;         /* this worker's replica */
    const struct pcr_route_table *routes;  /* the paths its exchanges serve (routes.c) */
    pcr_pool_t **pools;           /* by backend slot: this worker's upstream connections */
    size_t npools;
    pcr_pool_t **tok_pools;       /* by backend slot: its connections for tokenizing (precise
                                     mode, tokenize.c), apart from the requests' */
    size_t ntok_pools;
    struct pcr_tokreq *tok_refresh; /* its refresh under way (tokenize.c), or NULL */
    unsigned tok_next;            /* the slot the next tokenization asks first */
    unsigned tok_asking;          /* tokenizations that requests wait for (tokenize.c) */
    uint64_t epoch_seen;          /* srv->epoch at this worker's last tick (atomic) */
    uint64_t cfg_gen;             /* the reload this worker runs (atomic) */
    pcr_metrics_t metrics;        /* written by this worker only */
    uint64_t evictions_seen;      /* the policy's eviction count at the last tick, */
    const pcr_policy_t *evictions_policy; /* of this replica (a new one counts from 0) */
    struct pcr_listener *listeners;  /* one per cfg->listen entry (conn.c) */
    size_t nlisteners;
    int spare_fd;                 /* given back to accept one connection when out of fds */
    LIST_HEAD(, pcr_session) sessions;  /* every open client connection */
    TAILQ_HEAD(, pcr_session) waiting;  /* those waiting for their client, oldest first */
    size_t nsessions;             /* atomic: /metrics reads it */
    uint64_t nconns[PCR_CONN__COUNT]; /* atomic: of them, by protocol (memacct.h) */
    int accept_paused;            /* the overload's stop_accepting paused the public listeners */
    uint64_t inflight;            /* exchanges started and not finished (atomic reads) */
    uint64_t nexchanges;          /* atomic: exchanges alive, those receiving included */
    uint64_t nreaders;            /* atomic: of them, those holding a body reader */
    int io_uring;                 /* its socket I/O batched through io_uring now (atomic) */
    TAILQ_HEAD(, pcr_budget_waiter) budget_waiters;  /* budget.c */
    struct event *budget_event;
    int draining;
    int stopped;                  /* the loop has ended (atomic) */

    /* Cross-thread: commands through a pipe (rare: drain, stop), index updates through the
     * inbox (bus.c), drained by `tick` too so an idle worker does not fall behind. */
    int cmd_fd[2];
    int hold_wake;                /* atomic: an 'H' (pools.c) is in cmd_fd */
    struct event *cmd_event;
    struct event *tick;
    struct event *sync_more;      /* the bus's backlog, applied in the next loop turn */

    /* Flow control (tenancy.c): the requests waiting while the pool is saturated, and the
     * event that releases them (a timer while any waits; made active when a request leaves
     * a pod). */
    struct pcr_flowq *flowq;
    struct event *flow_ev;
    const pcr_config_t *flow_cfg; /* the config the queue was tuned to */
    int (*flow_go)(struct pcr_exchange *ex);  /* sends a released request on (proxy.c) */
};

/* The overload actions on now (pcr/overload.h): the control thread's last account, with the
 * request bodies and responses held read afresh, so a flood of bodies or answers is seen
 * without waiting for the tick (core/memacct.c). A few loads: for every answer chunk. */
unsigned pcr_mem_actions_now(const pcr_server_t *srv);
/* The account as those actions see it: the tick's slow parts, the bodies and responses now. */
uint64_t pcr_mem_accounted_now(const pcr_server_t *srv);
static inline int pcr_mem_action(const pcr_server_t *srv, pcr_overload_action_t a)
{
    return (pcr_mem_actions_now(srv) & PCR_OVERLOAD_BIT(a)) != 0;
}
/* The same with libevent's blocks and nghttp2's sessions counted afresh too (a sum over the
 * threads' counts, core/memcount.h): for an accept, a request's admission and a body's budget
 * grant, so that a burst of connections or uploads is seen at the next of them. */
uint64_t pcr_mem_accounted_fresh(const pcr_server_t *srv);
/* Those parts read now (request_bodies, responses, buffers, http2) into `parts`, the others
 * left as they are; returns their sum. The tick and the fresh reads share it, so they agree. */
uint64_t pcr_mem_fresh_parts(const pcr_server_t *srv, uint64_t parts[PCR_MEM__COUNT]);
unsigned pcr_mem_actions_fresh(const pcr_server_t *srv);
static inline int pcr_mem_action_fresh(const pcr_server_t *srv, pcr_overload_action_t a)
{
    return (pcr_mem_actions_fresh(srv) & PCR_OVERLOAD_BIT(a)) != 0;
}

/* Called whenever an exchange or a session ends; while draining, ends the worker's loop once
 * nothing is left. */
static inline void pcr_worker_check_drained(pcr_worker_t *w)
{
    if (w->draining && w->inflight == 0 && w->nsessions == 0)
        event_base_loopexit(w->base, NULL);
}

/* Before a decision and on the tick: apply what the other workers (and the pods' events)
 * taught since the last time, at most 1024 blocks' worth in one loop turn; the rest in the
 * next turns (w->sync_more, made by worker.c), after the loop's I/O (core/bus.c). */
void pcr_worker_sync(pcr_worker_t *w);

#endif
