/* router/metrics.c: renders the Prometheus text exposition for GET /metrics.
 *
 * The predicted hit rate comes first, as the brief asks: pcrouter_prefix_blocks_matched_total
 * over pcrouter_prefix_blocks_total. Everything is a counter or gauge read from plain integers;
 * histograms use fixed buckets (seconds) suited to LLM latencies (10 ms .. 10 min). */
#include <stdio.h>

#include <event2/buffer.h>

#include "backend.h"
#include "metrics.h"
#include "server.h"

static const double buckets[PCR_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                  2.5, 5, 10, 30, 60, 120, 300, 600};

void pcr_hist_observe(pcr_hist_t *h, double seconds)
{
    size_t i = 0;
    while (i < PCR_HIST_BUCKETS && seconds > buckets[i])
        i++;
    h->counts[i]++;
    h->sum += seconds;
    h->total++;
}

void pcr_metrics_count_status(uint64_t by_code[600], int status)
{
    by_code[status >= 100 && status < 600 ? status : 0]++;
}

static void hist_render(struct evbuffer *out, const char *name, const char *help, const pcr_hist_t *h)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < PCR_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        evbuffer_add_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, buckets[i], (unsigned long long)cum);
    }
    cum += h->counts[PCR_HIST_BUCKETS];
    evbuffer_add_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                        (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->total);
}

/* One gauge or counter per backend: a row of this table each. */
typedef uint64_t (*backend_value_fn)(const pcr_server_t *srv, size_t i);

static uint64_t v_up(const pcr_server_t *s, size_t i) { return (uint64_t)s->backends[i].up; }
static uint64_t v_inflight(const pcr_server_t *s, size_t i) { return s->backends[i].inflight; }
static uint64_t v_queued(const pcr_server_t *s, size_t i) { return s->backends[i].queued_prefill; }
static uint64_t v_waiting(const pcr_server_t *s, size_t i) { return s->backends[i].pod_waiting; }
static uint64_t v_hits(const pcr_server_t *s, size_t i) { return s->backends[i].pod_hits; }
static uint64_t v_queries(const pcr_server_t *s, size_t i) { return s->backends[i].pod_queries; }
static uint64_t v_connect_errors(const pcr_server_t *s, size_t i) { return s->backends[i].connect_errors; }
static uint64_t v_upstream_errors(const pcr_server_t *s, size_t i) { return s->backends[i].upstream_errors; }
static uint64_t v_conns(const pcr_server_t *s, size_t i) { return s->backends[i].nconns; }

static uint64_t v_index_blocks(const pcr_server_t *s, size_t i)
{
    return pcr_policy_backend_blocks(s->policy, (int)i);
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
    {"pcrouter_index_blocks", "gauge", "Prefix blocks the index believes each backend holds.",
     v_index_blocks},
    {"pcrouter_upstream_connect_errors_total", "counter", "Failed connects to each backend.",
     v_connect_errors},
    {"pcrouter_upstream_errors_total", "counter",
     "Backend responses lost to a reset, a timeout or malformed HTTP.", v_upstream_errors},
    {"pcrouter_upstream_connections", "gauge", "Open connections to each backend (idle included).",
     v_conns},
};

#define HEADER(out, name, type, help) \
    evbuffer_add_printf(out, "# HELP " name " " help "\n# TYPE " name " " type "\n")

void pcr_metrics_render(pcr_server_t *srv, struct evbuffer *out)
{
    const pcr_metrics_t *m = &srv->metrics;
    const char *pol = pcr_policy_kind_name(srv->cfg->routing.policy);

    HEADER(out, "pcrouter_prefix_blocks_total", "counter",
           "Prefix blocks of routed prompts (the denominator of the predicted hit rate).");
    evbuffer_add_printf(out, "pcrouter_prefix_blocks_total %llu\n", (unsigned long long)m->prefix_blocks);
    HEADER(out, "pcrouter_prefix_blocks_matched_total", "counter",
           "Of those, blocks the chosen backend was believed to hold (the predicted hits).");
    evbuffer_add_printf(out, "pcrouter_prefix_blocks_matched_total %llu\n",
                        (unsigned long long)m->prefix_blocks_matched);
    HEADER(out, "pcrouter_predicted_hit_rate", "gauge",
           "prefix_blocks_matched_total / prefix_blocks_total since start.");
    evbuffer_add_printf(out, "pcrouter_predicted_hit_rate %.6f\n",
                        m->prefix_blocks ? (double)m->prefix_blocks_matched / (double)m->prefix_blocks : 0.0);

    /* Delivered: what the pods say their prefix caches served, summed over backends. */
    uint64_t hits = 0, queries = 0;
    for (size_t i = 0; i < srv->nbackends; i++) {
        hits += srv->backends[i].pod_hits;
        queries += srv->backends[i].pod_queries;
    }
    HEADER(out, "pcrouter_delivered_hit_rate", "gauge",
           "Prefix-cache hit rate the pods report (vllm:prefix_cache_hits_total / queries_total, tokens) since pcrouter started.");
    evbuffer_add_printf(out, "pcrouter_delivered_hit_rate %.6f\n", queries ? (double)hits / (double)queries : 0.0);

    HEADER(out, "pcrouter_route_decisions_total", "counter", "Routing decisions by policy and reason.");
    for (int r = 0; r < PCR_REASON__COUNT; r++)
        if (m->decisions[r])
            evbuffer_add_printf(out, "pcrouter_route_decisions_total{policy=\"%s\",reason=\"%s\"} %llu\n",
                                pol, pcr_reason_name((pcr_reason_t)r),
                                (unsigned long long)m->decisions[r]);

    HEADER(out, "pcrouter_requests_total", "counter", "Client requests by response status (499: client left).");
    for (int c = 100; c < 600; c++)
        if (m->requests_by_code[c])
            evbuffer_add_printf(out, "pcrouter_requests_total{code=\"%d\"} %llu\n", c,
                                (unsigned long long)m->requests_by_code[c]);
    /* The scrape being answered is itself in flight; it is left out so an idle router reads 0. */
    HEADER(out, "pcrouter_requests_in_flight", "gauge", "Requests being answered now (this scrape excluded).");
    evbuffer_add_printf(out, "pcrouter_requests_in_flight %llu\n",
                        (unsigned long long)(srv->inflight ? srv->inflight - 1 : 0));
    HEADER(out, "pcrouter_retries_total", "counter", "Requests re-sent to another backend after a failure.");
    evbuffer_add_printf(out, "pcrouter_retries_total %llu\n", (unsigned long long)m->retries);
    HEADER(out, "pcrouter_client_connections", "gauge", "Open client connections.");
    evbuffer_add_printf(out, "pcrouter_client_connections %zu\n", srv->nsessions);
    HEADER(out, "pcrouter_client_connections_total", "counter", "Client connections accepted.");
    evbuffer_add_printf(out, "pcrouter_client_connections_total %llu\n",
                        (unsigned long long)m->client_connections_total);
    HEADER(out, "pcrouter_bad_requests_total", "counter", "Client input that was not valid HTTP.");
    evbuffer_add_printf(out, "pcrouter_bad_requests_total %llu\n", (unsigned long long)m->bad_requests);
    HEADER(out, "pcrouter_client_connections_evicted_total", "counter",
           "Connections waiting for their client, closed at limits.max_client_connections to make room.");
    evbuffer_add_printf(out, "pcrouter_client_connections_evicted_total %llu\n",
                        (unsigned long long)m->connections_evicted);
    HEADER(out, "pcrouter_client_connections_refused_total", "counter",
           "Connections closed at accept (limit reached with every connection busy, or draining).");
    evbuffer_add_printf(out, "pcrouter_client_connections_refused_total %llu\n",
                        (unsigned long long)m->connections_refused);
    HEADER(out, "pcrouter_accept_fd_exhausted_total", "counter",
           "Accepts that failed for lack of file descriptors (accepting pauses, then resumes).");
    evbuffer_add_printf(out, "pcrouter_accept_fd_exhausted_total %llu\n",
                        (unsigned long long)m->accept_fd_exhausted);
    HEADER(out, "pcrouter_request_timeouts_total", "counter",
           "Requests answered 408: head not complete within timeouts.request_header_ms, or body stalled.");
    evbuffer_add_printf(out, "pcrouter_request_timeouts_total %llu\n",
                        (unsigned long long)m->request_timeouts);
    HEADER(out, "pcrouter_client_write_timeouts_total", "counter",
           "Streams or connections ended because the client accepted no bytes for timeouts.client_write_ms.");
    evbuffer_add_printf(out, "pcrouter_client_write_timeouts_total %llu\n",
                        (unsigned long long)m->write_timeouts);
    HEADER(out, "pcrouter_responses_aborted_total", "counter",
           "Responses the pod broke after their head reached the client.");
    evbuffer_add_printf(out, "pcrouter_responses_aborted_total %llu\n",
                        (unsigned long long)m->responses_aborted);
    HEADER(out, "pcrouter_request_body_buffered_bytes", "gauge",
           "Request body bytes held in memory, against limits.max_buffered_body_bytes.");
    evbuffer_add_printf(out, "pcrouter_request_body_buffered_bytes %zu\n", srv->body_buffered);

    pcr_policy_stats_t ps;
    pcr_policy_stats(srv->policy, &ps);
    HEADER(out, "pcrouter_index_bytes", "gauge", "Memory held by the prefix index.");
    evbuffer_add_printf(out, "pcrouter_index_bytes %zu\n", ps.index_bytes);

    for (size_t k = 0; k < PCR_ARRAY_SIZE(per_backend); k++) {
        evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", per_backend[k].name,
                            per_backend[k].help, per_backend[k].name, per_backend[k].type);
        for (size_t i = 0; i < srv->nbackends; i++)
            evbuffer_add_printf(out, "%s{backend=\"%s\"} %llu\n", per_backend[k].name,
                                srv->backends[i].conf->name,
                                (unsigned long long)per_backend[k].get(srv, i));
    }
    HEADER(out, "pcrouter_backend_requests_total", "counter", "Responses per backend and status.");
    for (size_t i = 0; i < srv->nbackends; i++)
        for (int c = 100; c < 600; c++)
            if (srv->backends[i].requests_by_code[c])
                evbuffer_add_printf(out, "pcrouter_backend_requests_total{backend=\"%s\",code=\"%d\"} %llu\n",
                                    srv->backends[i].conf->name, c,
                                    (unsigned long long)srv->backends[i].requests_by_code[c]);

    hist_render(out, "pcrouter_request_duration_seconds", "Request start to last response byte.",
                &m->duration);
    hist_render(out, "pcrouter_time_to_first_byte_seconds",
                "Request start to the response head from the backend.", &m->ttfb);
}
