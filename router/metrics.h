/* router/metrics.h: the counters and histograms behind GET /metrics (Prometheus text).
 * Integers bumped by the worker that owns them; rendering walks every worker's once per scrape. */
#ifndef PCR_ROUTER_METRICS_H
#define PCR_ROUTER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/policy.h"

#define PCR_HIST_BUCKETS 16

typedef struct {
    uint64_t counts[PCR_HIST_BUCKETS + 1];  /* last one is +Inf */
    uint64_t sum_us;
    uint64_t total;
} pcr_hist_t;

/* One worker's counters. Only that worker writes them (PCR_INC, server.h); /metrics, rendered
 * by whichever worker got the scrape, sums every worker's with relaxed loads. */
typedef struct {
    uint64_t requests_by_code[600];
    uint64_t decisions[PCR_REASON__COUNT];      /* by reason, for the configured policy */
    uint64_t prefix_blocks;                      /* blocks of routed prompts */
    uint64_t prefix_blocks_matched;              /* of those, held by the chosen backend */
    uint64_t retries;
    uint64_t panic_routes;                       /* sent while every candidate was out */
    uint64_t client_connections_total;
    uint64_t connections_evicted;                /* closed at the limit to make room */
    uint64_t connections_refused;                /* closed at accept: limit, draining */
    uint64_t accept_fd_exhausted;                /* accept failed for lack of descriptors */
    uint64_t bad_requests;                       /* unparseable HTTP from clients */
    uint64_t request_timeouts;                   /* 408: head or body not received in time */
    uint64_t write_timeouts;                     /* clients that accepted no bytes in time */
    uint64_t responses_aborted;                  /* broken after their head went out */
    uint64_t index_bytes;                        /* this worker's replica, set on its tick */
    pcr_hist_t duration;                         /* request start -> response end */
    pcr_hist_t ttfb;                             /* request start -> first response byte */
} pcr_metrics_t;

/* Records one duration in microseconds (owner thread only). */
void pcr_hist_observe(pcr_hist_t *h, uint64_t us);

/* Counts `status` in a per-code array of 600 (100..599); anything else, which only a
 * malformed peer could produce, lands in slot 0 ("other") instead of outside the array. The
 * first form is for an array one thread writes, the second for one several threads share. */
void pcr_metrics_count_status(uint64_t by_code[600], int status);
void pcr_metrics_count_status_shared(uint64_t by_code[600], int status);

struct pcr_worker;
struct evbuffer;

/* Appends the whole exposition text to `out`, summed over every worker; `w` is the worker
 * answering (its replica of the index gives the per-backend block counts). */
void pcr_metrics_render(struct pcr_worker *w, struct evbuffer *out);

#endif
