/* router/core/counters.h: the counters and histograms behind GET /metrics (Prometheus text):
 * integers bumped by the worker that owns them (server.h holds each worker's), rendered by
 * metrics.c, which walks every worker's once per scrape. */
#ifndef PCR_ROUTER_COUNTERS_H
#define PCR_ROUTER_COUNTERS_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/overload.h"
#include "pcr/pd.h"
#include "config.h"
#include "pcr/policy.h"

#define PCR_HIST_BUCKETS 16
#define PCR_LABEL_MAX 256   /* a label value once escaped; longer ones are cut */

/* A histogram's buckets: upper bounds in the unit values are observed in (microseconds,
 * nanoseconds, tokens), ascending, and how many of that unit make one of the unit rendered
 * (1e6 for microseconds shown as seconds). */
typedef struct {
    int64_t le[PCR_HIST_BUCKETS];
    size_t n;
    double scale;
} pcr_hist_spec_t;

extern const pcr_hist_spec_t pcr_hist_latency_us;   /* 5 ms .. 10 min, rendered in seconds */
extern const pcr_hist_spec_t pcr_hist_decision_ns;  /* 1 us .. 100 ms, rendered in seconds */
extern const pcr_hist_spec_t pcr_hist_tokens_error; /* -65536 .. 65536 tokens */

typedef struct {
    uint64_t counts[PCR_HIST_BUCKETS + 1];  /* counts[spec->n] is +Inf */
    int64_t sum;                            /* may go negative (the prediction error) */
    uint64_t total;
} pcr_hist_t;

/* The phases of a routing decision, timed in exchange.c. */
typedef enum {
    PCR_PHASE_PARSE = 0,   /* the request body's JSON, into canonical prompt bytes */
    PCR_PHASE_HASH,        /* the chained block hashes of the prefix key */
    PCR_PHASE_MATCH,       /* the policy's index match (cache_aware) */
    PCR_PHASE_COST,        /* the policy's costs, bounded loads, ring */
    PCR_PHASE_TOKENIZE,    /* precise mode: the prompt's tokens from a pod (or the cache) */
    PCR_PHASE_TOTAL,       /* all of it, from the body's parse to the chosen backend */
    PCR_PHASE__COUNT
} pcr_phase_t;

/* Why a prefill leg gave the decode pod nothing to pull (pd_proxy.c). */
typedef enum {
    PCR_PD_FAIL_ERROR = 0,   /* no answer: connect, reset, timeout, malformed */
    PCR_PD_FAIL_STATUS,      /* an answer other than 200 */
    PCR_PD_FAIL_NO_PARAMS,   /* 200 without usable kv_transfer_params */
    PCR_PD_FAIL_TOO_LARGE,   /* an answer past the bound */
    PCR_PD_FAIL__COUNT
} pcr_pd_fail_t;

/* One worker's counters. Only that worker writes them (PCR_INC, atomic.h); /metrics, rendered
 * by whichever worker got the scrape, sums every worker's with relaxed loads. */
/* Why a tenant's request was refused (429, or 401 for auth), as /metrics names them. */
typedef enum {
    PCR_REJECT_AUTH = 0,      /* "unauthorized": no known API key */
    PCR_REJECT_RATE,          /* "rate-limit": requests_per_s */
    PCR_REJECT_TOKENS,        /* "token-limit": tokens_per_min */
    PCR_REJECT_CONCURRENCY,   /* "concurrency": max_concurrent */
    PCR_REJECT_SHED,          /* "shed": sheddable at saturation, flow control off */
    PCR_REJECT_QUEUE_FULL,    /* "queue-full": the tenant's flow-control queue is at a bound */
    PCR_REJECT_TTL,           /* "rejected-ttl-expired": waited past flow_control.ttl_ms */
    PCR_REJECT__COUNT
} pcr_reject_t;

extern const char *const pcr_reject_names[PCR_REJECT__COUNT];

/* One worker's counts of one tenant (by its slot, pcr_server_t.tenants). */
typedef struct {
    uint64_t requests;                           /* admitted to the pool (sent or queued) */
    uint64_t prompt_tokens;                      /* their prompts, bytes / PCR_BYTES_PER_TOKEN */
    uint64_t output_tokens;                      /* what pods reported generating */
    uint64_t rejected[PCR_REJECT__COUNT];
    uint64_t waiting;                            /* gauge: in this worker's flow queue now */
    uint64_t waited;                             /* left the queue for a pod */
    uint64_t wait_us;                            /* ... the time they waited, summed */
} pcr_tenant_counts_t;

typedef struct {
    uint64_t requests_by_code[600];
    uint64_t decisions[PCR_REASON__COUNT];      /* by reason, for the configured policy */
    uint64_t prefix_blocks;                      /* blocks of routed prompts */
    uint64_t prefix_blocks_matched;              /* of those, held by the chosen backend */
    uint64_t retries;
    uint64_t pd_decisions[PCR_PD__COUNT];        /* disaggregation, by outcome (pcr/pd.h) */
    uint64_t pd_leg_failures[PCR_PD_FAIL__COUNT];/* prefill legs that gave no usable answer */
    uint64_t panic_routes;                       /* sent while every candidate was out */
    uint64_t client_connections_total;
    uint64_t connections_evicted;                /* closed at the limit to make room */
    uint64_t connections_refused;                /* closed at accept: limit, draining */
    uint64_t accept_fd_exhausted;                /* accept failed for lack of descriptors */
    uint64_t bad_requests;                       /* unparseable HTTP from clients */
    uint64_t request_timeouts;                   /* 408: head or body not received in time */
    uint64_t body_budget_refusals;               /* 503: no body budget within client_idle_ms */
    uint64_t write_timeouts;                     /* clients that accepted no bytes in time */
    uint64_t h2_hibernated;                      /* gauge: idle h2 sessions without nghttp2's */
    uint64_t h2_hibernations;                    /* times an idle h2 session freed nghttp2's */
    uint64_t responses_aborted;                  /* broken after their head went out */
    uint64_t responses_buffered;                 /* ended at the pod while part was kept for
                                                    a slow client (http/respond.c) */
    uint64_t response_backpressure;              /* pod reads paused: a slow client's buffer full */
    uint64_t index_bytes;                        /* this worker's replica, set on its tick */
    uint64_t overload_refusals[PCR_OVERLOAD__COUNT]; /* by overload action (pcr/overload.h):
                                                    body budget grants, requests refused */
    uint64_t accept_pauses;                      /* its listeners paused by stop_accepting */
    uint64_t index_evictions;                    /* its evictions, added up on its tick */
    uint64_t io_submits;                         /* io_uring submits of batched socket I/O */
    uint64_t io_ops;                             /* the reads and writes in them */
    uint64_t io_merged;                          /* submits with a turn's writes and the next reads */
    uint64_t batch_waits;                        /* sleeps of batch_wait_us before a wait */
    uint64_t cpu_us;                             /* the worker thread's CPU time, sampled */
    uint64_t tokenize_calls;                     /* precise mode: tokenizations asked of pods */
    uint64_t tokenize_failures[4];               /* ... that gave no tokens: timeout, error,
                                                    bad answer, no pod */
    uint64_t tokenize_cache_hits;                /* prompts whose tokens the cache had */
    uint64_t tokenize_prefix_hits;               /* ... had for a prefix of their text */
    uint64_t tokenize_prefix_text;               /* ... routed on their text key instead */
    uint64_t tokenize_tail[3];                   /* ... an unknown tail: waits that paid, that
                                                    did not, prompts that went at once */
    uint64_t tokenize_tail_checked[2];           /* ... of those that went, checked in the
                                                    background: would have paid, would not */
    uint64_t tokenize_refreshes;                 /* tokenizations asked for the cache only */
    uint64_t precise_decisions;                  /* decided on token chains (pods' events) */
    pcr_hist_t duration;                         /* request start -> response end (us) */
    pcr_hist_t ttfb;                             /* request start -> first response byte (us) */
    pcr_hist_t ttft;                             /* request start -> a stream's first token (us) */
    pcr_hist_t decision[PCR_PHASE__COUNT];       /* routing decision phases (ns) */
    pcr_hist_t cached_error;                     /* predicted - delivered cached tokens */
    pcr_tenant_counts_t tenants[PCR_MAX_TENANTS];
} pcr_metrics_t;

/* Records one value in the unit of `spec` (owner thread only). */
void pcr_hist_observe(pcr_hist_t *h, const pcr_hist_spec_t *spec, int64_t v);

/* Counts `status` in a per-code array of 600 (100..599); anything else, which only a
 * malformed peer could produce, lands in slot 0 ("other") instead of outside the array. The
 * first form is for an array one thread writes, the second for one several threads share. */
void pcr_metrics_count_status(uint64_t by_code[600], int status);
void pcr_metrics_count_status_shared(uint64_t by_code[600], int status);

#endif
