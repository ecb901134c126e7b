/* router/metrics.c: renders the Prometheus text exposition for GET /metrics.
 *
 * The predicted hit rate comes first, as the brief asks: pcrouter_prefix_blocks_matched_total
 * over pcrouter_prefix_blocks_total. Every counter is summed over the workers (each writes only
 * its own, this reads them with relaxed loads); per-backend values are shared already.
 * Histograms use fixed buckets (seconds) suited to LLM latencies (5 ms .. 10 min). */
#include <stddef.h>
#include <stdio.h>

#include <event2/buffer.h>

#include "backend.h"
#include "bus.h"
#include "metrics.h"
#include "server.h"
#include "share.h"
#include "upstream.h"

static const double buckets[PCR_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                  2.5, 5, 10, 30, 60, 120, 300, 600};

void pcr_hist_observe(pcr_hist_t *h, uint64_t us)
{
    double seconds = (double)us / 1e6;
    size_t i = 0;
    while (i < PCR_HIST_BUCKETS && seconds > buckets[i])
        i++;
    PCR_INC(h->counts[i]);
    PCR_BUMP(h->sum_us, us);
    PCR_INC(h->total);
}

void pcr_metrics_count_status(uint64_t by_code[600], int status)
{
    PCR_INC(by_code[status >= 100 && status < 600 ? status : 0]);
}

void pcr_metrics_count_status_shared(uint64_t by_code[600], int status)
{
    PCR_ADD(by_code[status >= 100 && status < 600 ? status : 0], 1);
}

/* The sum of one counter over every worker: `off` is its offset in pcr_metrics_t. */
static uint64_t sum_at(const pcr_server_t *srv, size_t off)
{
    uint64_t total = 0;
    for (unsigned k = 0; k < srv->nworkers; k++) {
        uint64_t *p = (uint64_t *)(void *)((char *)&srv->workers[k].metrics + off);
        total += PCR_LOAD(*p);
    }
    return total;
}

#define SUM(srv, field) sum_at(srv, offsetof(pcr_metrics_t, field))

static void hist_render(struct evbuffer *out, const pcr_server_t *srv, const char *name,
                        const char *help, size_t off)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i <= PCR_HIST_BUCKETS; i++) {
        cum += sum_at(srv, off + offsetof(pcr_hist_t, counts) + i * sizeof(uint64_t));
        if (i < PCR_HIST_BUCKETS)
            evbuffer_add_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, buckets[i],
                                (unsigned long long)cum);
    }
    uint64_t sum_us = sum_at(srv, off + offsetof(pcr_hist_t, sum_us));
    uint64_t total = sum_at(srv, off + offsetof(pcr_hist_t, total));
    evbuffer_add_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                        (unsigned long long)cum, name, (double)sum_us / 1e6, name,
                        (unsigned long long)total);
}

/* One gauge or counter per backend: a row of this table each. */
typedef uint64_t (*backend_value_fn)(const pcr_worker_t *w, size_t i);

#define BE(w, i) (&(w)->srv->backends[i])
static uint64_t v_up(const pcr_worker_t *w, size_t i) { return (uint64_t)PCR_LOAD(BE(w, i)->up); }
static uint64_t v_inflight(const pcr_worker_t *w, size_t i) { return PCR_LOAD(BE(w, i)->inflight); }
static uint64_t v_queued(const pcr_worker_t *w, size_t i) { return PCR_LOAD(BE(w, i)->queued_prefill); }
static uint64_t v_waiting(const pcr_worker_t *w, size_t i) { return PCR_LOAD(BE(w, i)->pod_waiting); }
static uint64_t v_hits(const pcr_worker_t *w, size_t i) { return PCR_LOAD(BE(w, i)->pod_hits); }
static uint64_t v_queries(const pcr_worker_t *w, size_t i) { return PCR_LOAD(BE(w, i)->pod_queries); }
static uint64_t v_connect_errors(const pcr_worker_t *w, size_t i) { return PCR_LOAD(BE(w, i)->connect_errors); }
static uint64_t v_upstream_errors(const pcr_worker_t *w, size_t i) { return PCR_LOAD(BE(w, i)->upstream_errors); }

static uint64_t v_conns(const pcr_worker_t *w, size_t i)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < w->srv->nworkers; k++)
        n += PCR_LOAD(w->srv->workers[k].pools[i].nconns);
    return n;
}

static uint64_t v_index_blocks(const pcr_worker_t *w, size_t i)
{
    return pcr_policy_backend_blocks(w->policy, (int)i);
}

static const struct {
    const char *name, *type, *help;
    backend_value_fn get;
} per_backend[] = {
    {"pcrouter_backend_prefix_cache_hits_tokens_total", "counter",
     "Prompt tokens served from the pod's prefix cache (scraped vllm:prefix_cache_hits_total).", v_hits},
    {"pcrouter_backend_prefix_cache_queries_tokens_total", "counter",
     "Prompt tokens the pod looked up in its prefix cache (scraped vllm:prefix_cache_queries_total).",
     v_queries},
    {"pcrouter_backend_up", "gauge", "1 when the backend passes health checks.", v_up},
    {"pcrouter_backend_in_flight", "gauge", "Requests in flight per backend.", v_inflight},
    {"pcrouter_backend_queued_prefill_tokens", "gauge",
     "Uncached prompt tokens sent to the backend whose first byte has not come back.", v_queued},
    {"pcrouter_backend_pod_waiting", "gauge", "vllm:num_requests_waiting as last scraped.", v_waiting},
    {"pcrouter_index_blocks", "gauge",
     "Prefix blocks the index believes each backend holds (one worker's replica).", v_index_blocks},
    {"pcrouter_upstream_connect_errors_total", "counter", "Failed connects to each backend.",
     v_connect_errors},
    {"pcrouter_upstream_errors_total", "counter",
     "Backend responses lost to a reset, a timeout or malformed HTTP.", v_upstream_errors},
    {"pcrouter_upstream_connections", "gauge",
     "Open request connections to each backend (idle included), all workers.", v_conns},
};

#define HEADER(out, name, type, help) \
    evbuffer_add_printf(out, "# HELP " name " " help "\n# TYPE " name " " type "\n")

static void counter(struct evbuffer *out, const char *name, const char *help, uint64_t v)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
                        (unsigned long long)v);
}

void pcr_metrics_render(pcr_worker_t *w, struct evbuffer *out)
{
    const pcr_server_t *srv = w->srv;
    const char *pol = pcr_policy_kind_name(w->cfg->routing.policy);
    uint64_t blocks = SUM(srv, prefix_blocks), matched = SUM(srv, prefix_blocks_matched);

    counter(out, "pcrouter_prefix_blocks_total",
            "Prefix blocks of routed prompts (the denominator of the predicted hit rate).", blocks);
    counter(out, "pcrouter_prefix_blocks_matched_total",
            "Of those, blocks the chosen backend was believed to hold (the predicted hits).", matched);
    HEADER(out, "pcrouter_predicted_hit_rate", "gauge",
           "prefix_blocks_matched_total / prefix_blocks_total since start.");
    evbuffer_add_printf(out, "pcrouter_predicted_hit_rate %.6f\n",
                        blocks ? (double)matched / (double)blocks : 0.0);

    /* Delivered: what the pods say their prefix caches served, summed over backends. */
    uint64_t hits = 0, queries = 0;
    for (size_t i = 0; i < srv->nbackends; i++) {
        hits += PCR_LOAD(srv->backends[i].pod_hits);
        queries += PCR_LOAD(srv->backends[i].pod_queries);
    }
    HEADER(out, "pcrouter_delivered_hit_rate", "gauge",
           "Prefix-cache hit rate the pods report (vllm:prefix_cache_hits_total / queries_total, tokens) since pcrouter started.");
    evbuffer_add_printf(out, "pcrouter_delivered_hit_rate %.6f\n", queries ? (double)hits / (double)queries : 0.0);

    HEADER(out, "pcrouter_route_decisions_total", "counter", "Routing decisions by policy and reason.");
    for (int r = 0; r < PCR_REASON__COUNT; r++) {
        uint64_t v = sum_at(srv, offsetof(pcr_metrics_t, decisions) + (size_t)r * sizeof(uint64_t));
        if (v)
            evbuffer_add_printf(out, "pcrouter_route_decisions_total{policy=\"%s\",reason=\"%s\"} %llu\n",
                                pol, pcr_reason_name((pcr_reason_t)r), (unsigned long long)v);
    }

    HEADER(out, "pcrouter_requests_total", "counter", "Client requests by response status (499: client left).");
    for (int c = 100; c < 600; c++) {
        uint64_t v = sum_at(srv, offsetof(pcr_metrics_t, requests_by_code) + (size_t)c * sizeof(uint64_t));
        if (v)
            evbuffer_add_printf(out, "pcrouter_requests_total{code=\"%d\"} %llu\n", c,
                                (unsigned long long)v);
    }
    /* The scrape being answered is itself in flight; it is left out so an idle router reads 0. */
    uint64_t inflight = 0, sessions = 0;
    for (unsigned k = 0; k < srv->nworkers; k++) {
        inflight += PCR_LOAD(srv->workers[k].inflight);
        sessions += PCR_LOAD(srv->workers[k].nsessions);
    }
    HEADER(out, "pcrouter_requests_in_flight", "gauge", "Requests being answered now (this scrape excluded).");
    evbuffer_add_printf(out, "pcrouter_requests_in_flight %llu\n",
                        (unsigned long long)(inflight ? inflight - 1 : 0));
    counter(out, "pcrouter_retries_total", "Requests re-sent to another backend after a failure.",
            SUM(srv, retries));
    HEADER(out, "pcrouter_client_connections", "gauge", "Open client connections.");
    evbuffer_add_printf(out, "pcrouter_client_connections %llu\n", (unsigned long long)sessions);
    counter(out, "pcrouter_client_connections_total", "Client connections accepted.",
            SUM(srv, client_connections_total));
    counter(out, "pcrouter_bad_requests_total", "Client input that was not valid HTTP.",
            SUM(srv, bad_requests));
    counter(out, "pcrouter_client_connections_evicted_total",
            "Connections waiting for their client, closed at limits.max_client_connections to make room.",
            SUM(srv, connections_evicted));
    counter(out, "pcrouter_client_connections_refused_total",
            "Connections closed at accept (limit reached with every connection busy, or draining).",
            SUM(srv, connections_refused));
    counter(out, "pcrouter_accept_fd_exhausted_total",
            "Accepts that failed for lack of file descriptors (accepting pauses, then resumes).",
            SUM(srv, accept_fd_exhausted));
    counter(out, "pcrouter_request_timeouts_total",
            "Requests answered 408: head not complete within timeouts.request_header_ms, or body stalled.",
            SUM(srv, request_timeouts));
    counter(out, "pcrouter_client_write_timeouts_total",
            "Streams or connections ended because the client accepted no bytes for timeouts.client_write_ms.",
            SUM(srv, write_timeouts));
    counter(out, "pcrouter_responses_aborted_total",
            "Responses the pod broke after their head reached the client.", SUM(srv, responses_aborted));
    HEADER(out, "pcrouter_request_body_buffered_bytes", "gauge",
           "Request body bytes held in memory, against limits.max_buffered_body_bytes.");
    evbuffer_add_printf(out, "pcrouter_request_body_buffered_bytes %llu\n",
                        (unsigned long long)PCR_LOAD(((pcr_server_t *)srv)->body_buffered));
    HEADER(out, "pcrouter_workers", "gauge", "Event-loop threads.");
    evbuffer_add_printf(out, "pcrouter_workers %u\n", srv->nworkers);
    counter(out, "pcrouter_index_updates_dropped_total",
            "Index updates between workers dropped because a worker's inbox was full.",
            pcr_bus_dropped(srv->bus));

    pcr_share_render_metrics(srv->share, out);

    /* Every worker holds a replica of the index: the memory is their sum. */
    HEADER(out, "pcrouter_index_bytes", "gauge", "Memory held by the prefix index, all worker replicas.");
    evbuffer_add_printf(out, "pcrouter_index_bytes %llu\n", (unsigned long long)SUM(srv, index_bytes));

    for (size_t k = 0; k < sizeof(per_backend) / sizeof(per_backend[0]); k++) {
        evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", per_backend[k].name,
                            per_backend[k].help, per_backend[k].name, per_backend[k].type);
        for (size_t i = 0; i < srv->nbackends; i++)
            evbuffer_add_printf(out, "%s{backend=\"%s\"} %llu\n", per_backend[k].name,
                                srv->backends[i].conf->name,
                                (unsigned long long)per_backend[k].get(w, i));
    }
    HEADER(out, "pcrouter_backend_requests_total", "counter", "Responses per backend and status.");
    for (size_t i = 0; i < srv->nbackends; i++)
        for (int c = 100; c < 600; c++) {
            uint64_t v = PCR_LOAD(srv->backends[i].requests_by_code[c]);
            if (v)
                evbuffer_add_printf(out, "pcrouter_backend_requests_total{backend=\"%s\",code=\"%d\"} %llu\n",
                                    srv->backends[i].conf->name, c, (unsigned long long)v);
        }

    hist_render(out, srv, "pcrouter_request_duration_seconds", "Request start to last response byte.",
                offsetof(pcr_metrics_t, duration));
    hist_render(out, srv, "pcrouter_time_to_first_byte_seconds",
                "Request start to the response head from the backend.", offsetof(pcr_metrics_t, ttfb));
}
