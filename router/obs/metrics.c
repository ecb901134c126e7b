/* router/obs/metrics.c: renders the Prometheus text exposition for GET /metrics.
 *
 * The predicted hit rate comes first, as the brief asks: pcrouter_prefix_blocks_matched_total
 * over pcrouter_prefix_blocks_total. Every counter is summed over the workers (each writes only
 * its own, this reads them with relaxed loads); per-backend values are shared already.
 * Histograms use fixed buckets (counters.c). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "accesslog.h"
#include "backend.h"
#include "bus.h"
#include "kv_sub.h"
#include "metrics.h"
#include "server.h"
#include "share.h"
#include "upstream.h"
#include "version.h"

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

static void hist_help(struct evbuffer *out, const char *name, const char *help)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
}

/* One histogram's series, summed over the workers; `labels` ("phase=\"parse\",") go before
 * le in every bucket and in _sum and _count. */
static void hist_series(struct evbuffer *out, const pcr_server_t *srv, const char *name,
                        const char *labels, size_t off, const pcr_hist_spec_t *spec)
{
    uint64_t cum = 0;
    for (size_t i = 0; i <= spec->n; i++) {
        cum += sum_at(srv, off + offsetof(pcr_hist_t, counts) + i * sizeof(uint64_t));
        if (i < spec->n)
            evbuffer_add_printf(out, "%s_bucket{%sle=\"%.10g\"} %llu\n", name, labels,
                                (double)spec->le[i] / spec->scale, (unsigned long long)cum);
    }
    /* Each worker's sum is two's complement: summed modulo 2^64, the signed total is right. */
    int64_t sum = (int64_t)sum_at(srv, off + offsetof(pcr_hist_t, sum));
    uint64_t total = sum_at(srv, off + offsetof(pcr_hist_t, total));
    size_t ln = strlen(labels);
    char braces[128];
    /* _sum and _count take the same labels, without the trailing comma. */
    if (ln > 0 && ln < sizeof(braces) - 2)
        snprintf(braces, sizeof(braces), "{%.*s}", (int)(ln - 1), labels);
    else
        braces[0] = '\0';
    evbuffer_add_printf(out, "%s_bucket{%sle=\"+Inf\"} %llu\n%s_sum%s %.10g\n%s_count%s %llu\n", name,
                        labels, (unsigned long long)cum, name, braces, (double)sum / spec->scale,
                        name, braces, (unsigned long long)total);
}

static void hist_render(struct evbuffer *out, const pcr_server_t *srv, const char *name,
                        const char *help, size_t off, const pcr_hist_spec_t *spec)
{
    hist_help(out, name, help);
    hist_series(out, srv, name, "", off, spec);
}

/* One gauge or counter per backend: a row of this table each. */
typedef uint64_t (*backend_value_fn)(const pcr_worker_t *w, const pcr_backend_t *be);

static uint64_t v_up(const pcr_worker_t *w, const pcr_backend_t *be) { return (uint64_t)PCR_LOAD(be->up); }
static uint64_t v_inflight(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->inflight); }
static uint64_t v_queued(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->queued_prefill); }
static uint64_t v_waiting(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->pod_waiting); }
static uint64_t v_held(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->held); }
static uint64_t v_held_total(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->held_total); }
static uint64_t v_conn_waits(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->conn_waits); }
static uint64_t v_hits(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->pod_hits); }
static uint64_t v_queries(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->pod_queries); }
static uint64_t v_connect_errors(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->connect_errors); }
static uint64_t v_tls_errors(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(((pcr_backend_t *)be)->tls_errors); }
static uint64_t v_upstream_errors(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->upstream_errors); }
static uint64_t v_ejections(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->ejections_total); }
static uint64_t v_restarts(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->restarts); }
static uint64_t v_probes_too_large(const pcr_worker_t *w, const pcr_backend_t *be)
{
    return PCR_LOAD(be->probes_too_large);
}

static uint64_t v_ejected(const pcr_worker_t *w, const pcr_backend_t *be)
{
    return (uint64_t)pcr_backend_ejected(be, pcr_now_us());
}

static uint64_t v_conns(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->conns); }
static uint64_t v_predicted(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->cached_predicted); }
static uint64_t v_delivered(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->cached_delivered); }
static uint64_t v_prompt(const pcr_worker_t *w, const pcr_backend_t *be) { return PCR_LOAD(be->prompt_tokens); }

static uint64_t v_index_blocks(const pcr_worker_t *w, const pcr_backend_t *be)
{
    return pcr_policy_backend_blocks(w->policy, be->id);
}

/* The inverse slope of cache_aware's time-to-first-token estimate for the backend (pcr/ttft.h):
 * the prefill speed it learned from streams' first tokens, the prior's (70 us a token) until
 * then. */
static uint64_t v_prefill_speed(const pcr_worker_t *w, const pcr_backend_t *be)
{
    double us = pcr_policy_estimate_ttft(w->policy, be->id, 1000000) -
                pcr_policy_estimate_ttft(w->policy, be->id, 0);
    return us > 1 ? (uint64_t)(1e12 / us + 0.5) : 0;
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
    {"pcrouter_backend_ejected", "gauge",
     "1 while passive outlier detection keeps the backend out of rotation.", v_ejected},
    {"pcrouter_backend_ejections_total", "counter",
     "Times the backend was ejected for consecutive errors or failed connects.", v_ejections},
    {"pcrouter_backend_restarts_total", "counter",
     "Restarts of the pod its scrape revealed (its prefix entries were dropped).", v_restarts},
    {"pcrouter_backend_probes_too_large_total", "counter",
     "Health answers, /metrics pages and model lists of the pod cut at their size cap.",
     v_probes_too_large},
    {"pcrouter_backend_in_flight", "gauge", "Requests in flight per backend.", v_inflight},
    {"pcrouter_backend_queued_prefill_tokens", "gauge",
     "Uncached prompt tokens routed to the backend whose first byte has not come back (a "
     "non-streamed completion's until its expected first token).", v_queued},
    {"pcrouter_backend_pod_waiting", "gauge", "vllm:num_requests_waiting as last scraped.", v_waiting},
    {"pcrouter_backend_held_requests", "gauge",
     "Completions held at the router while the backend's prefill queue is full "
     "(routing.hold_tokens).",
     v_held},
    {"pcrouter_backend_held_total", "counter",
     "Completions that were held at the router for the backend.", v_held_total},
    {"pcrouter_backend_conn_waits_total", "counter",
     "Times a request waited at the router for a connection to the backend (every one busy, "
     "or the rest kept for light clients).", v_conn_waits},
    {"pcrouter_backend_prefill_tokens_per_second", "gauge",
     "Prefill speed, uncached prompt tokens a second, that cache_aware has learned for the "
     "backend from its streams' first tokens (time held in pcrouter excluded).", v_prefill_speed},
    {"pcrouter_index_blocks", "gauge",
     "Prefix blocks the index believes each backend holds (one worker's replica).", v_index_blocks},
    {"pcrouter_upstream_connect_errors_total", "counter", "Failed connects to each backend.",
     v_connect_errors},
    {"pcrouter_upstream_tls_errors_total", "counter",
     "TLS handshakes with each backend that failed (a certificate that does not verify, a pod that speaks no TLS); each is also a failed connect.",
     v_tls_errors},
    {"pcrouter_upstream_errors_total", "counter",
     "Backend responses lost to a reset, a timeout or malformed HTTP.", v_upstream_errors},
    {"pcrouter_upstream_connections", "gauge",
     "Open request connections to each backend (idle included), all workers.", v_conns},
    {"pcrouter_cached_tokens_predicted_total", "counter",
     "Prompt tokens the index predicted the backend held cached (matched blocks x block_bytes / 4, at most the prompt), over requests whose pod reported usage.",
     v_predicted},
    {"pcrouter_cached_tokens_delivered_total", "counter",
     "Prompt tokens the pod said it served from its cache (usage.prompt_tokens_details.cached_tokens), over the same requests.",
     v_delivered},
    {"pcrouter_prompt_tokens_total", "counter",
     "Prompt tokens of the same requests, as the pod counted them (usage.prompt_tokens).", v_prompt},
};

/* A label value as the exposition format wants it: backslash, double quote and newline
 * escaped. Backend names come from the config and may hold any printable character. */
static void label_escape(char *dst, size_t cap, const char *s)
{
    size_t o = 0;
    for (; *s != '\0' && o + 3 < cap; s++) {
        if (*s == '\\' || *s == '"' || *s == '\n') {
            dst[o++] = '\\';
            dst[o++] = *s == '\n' ? 'n' : *s;
        } else {
            dst[o++] = *s;
        }
    }
    dst[o] = '\0';
}

/* Decimal digits of v at the end of buf[0..20); returns where they start. */
static char *u64_digits(char *end, uint64_t v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    return end;
}

/* One sample `name{label="value"<extra>} v`, built with memcpy: per-backend rows are most of a
 * large exposition, and printf was half of its time. */
static void row(struct evbuffer *out, const char *name, const char *label, const char *value,
                const char *extra, uint64_t v)
{
    char line[PCR_LABEL_MAX + 256], num[24];
    size_t n = strlen(name), vl = strlen(value), el = extra ? strlen(extra) : 0, ll = strlen(label);
    if (n + ll + vl + el + 32 > sizeof(line)) {
        evbuffer_add_printf(out, "%s{%s=\"%s\"%s} %llu\n", name, label, value, extra ? extra : "",
                            (unsigned long long)v);
        return;
    }
    char *p = line;
    memcpy(p, name, n);
    p += n;
    *p++ = '{';
    memcpy(p, label, ll);
    p += ll;
    *p++ = '=';
    *p++ = '"';
    memcpy(p, value, vl);
    p += vl;
    *p++ = '"';
    if (el > 0)
        memcpy(p, extra, el);
    p += el;
    *p++ = '}';
    *p++ = ' ';
    char *d = u64_digits(num + sizeof(num), v);
    size_t dl = (size_t)(num + sizeof(num) - d);
    memcpy(p, d, dl);
    p += dl;
    *p++ = '\n';
    evbuffer_add(out, line, (size_t)(p - line));
}

#define HEADER(out, name, type, help) \
    evbuffer_add_printf(out, "# HELP " name " " help "\n# TYPE " name " " type "\n")

static void counter(struct evbuffer *out, const char *name, const char *help, uint64_t v)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
                        (unsigned long long)v);
}

/* A counter with one label: the array of n counts at `off` in pcr_metrics_t, each value's
 * summed over every worker. */
static void labelled(struct evbuffer *out, const pcr_server_t *srv, const char *name,
                     const char *help, const char *label, const char *const *values, size_t n,
                     size_t off)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (size_t k = 0; k < n; k++)
        evbuffer_add_printf(out, "%s{%s=\"%s\"} %llu\n", name, label, values[k],
                            (unsigned long long)sum_at(srv, off + k * sizeof(uint64_t)));
}

static const char *const phase_names[PCR_PHASE__COUNT] = {"parse", "hash", "match", "cost", "tokenize",
                                                              "total"};

/* The memory account against limits.max_memory_bytes and its overload actions (memacct.h). */
static void render_memory(const pcr_server_t *srv, struct evbuffer *out)
{
    HEADER(out, "pcrouter_memory_accounted_bytes", "gauge",
           "Memory pcrouter accounts for, by part, at the control thread's last tick.");
    for (int i = 0; i < PCR_MEM__COUNT; i++)
        evbuffer_add_printf(out, "pcrouter_memory_accounted_bytes{part=\"%s\"} %llu\n",
                            pcr_mem_part_names[i], (unsigned long long)PCR_LOAD(srv->mem_parts[i]));
    HEADER(out, "pcrouter_memory_limit_bytes", "gauge",
           "limits.max_memory_bytes in force (\"auto\" resolved); 0: no limit.");
    evbuffer_add_printf(out, "pcrouter_memory_limit_bytes %llu\n",
                        (unsigned long long)PCR_LOAD(srv->mem_limit));
    unsigned on = PCR_LOAD(srv->overload);
    HEADER(out, "pcrouter_overload_action_active", "gauge",
           "1 while the overload action is on (the memory account past its threshold).");
    for (int a = 0; a < PCR_OVERLOAD__COUNT; a++)
        evbuffer_add_printf(out, "pcrouter_overload_action_active{action=\"%s\"} %d\n",
                            pcr_overload_action_name((pcr_overload_action_t)a),
                            (on & PCR_OVERLOAD_BIT(a)) != 0);
    HEADER(out, "pcrouter_overload_refusals_total", "counter",
           "What the overload actions refused: body budget grants (shrink_windows), requests "
           "answered 503 (refuse_requests).");
    for (int a = 0; a < PCR_OVERLOAD_STOP_ACCEPTING; a++) {
        uint64_t v = sum_at(srv, offsetof(pcr_metrics_t, overload_refusals) +
                                     (size_t)a * sizeof(uint64_t));
        evbuffer_add_printf(out, "pcrouter_overload_refusals_total{action=\"%s\"} %llu\n",
                            pcr_overload_action_name((pcr_overload_action_t)a),
                            (unsigned long long)v);
    }
    counter(out, "pcrouter_overload_accept_pauses_total",
            "Times a worker's public listeners stopped accepting for the overload action "
            "stop_accepting.", SUM(srv, accept_pauses));
}

/* Precise mode: the subscriber's counters (0 while it never ran) and the tokenizations. */
static void render_precise(pcr_worker_t *w, struct evbuffer *out)
{
    const pcr_server_t *srv = w->srv;
    pcr_kv_sub_stats_t st = {0};
    pcr_kv_sub_t *sub = __atomic_load_n(&((pcr_server_t *)srv)->kv_sub, __ATOMIC_ACQUIRE);
    if (sub != NULL)
        pcr_kv_sub_stats(sub, &st);
    counter(out, "pcrouter_kv_events_total",
            "KV-cache events received from the pods and applied (routing.index events).", st.events);
    counter(out, "pcrouter_kv_event_batches_total", "Event batches received from the pods.",
            st.batches);
    counter(out, "pcrouter_kv_event_unknown_total",
            "Events of a type the decoder does not know, skipped.", st.unknown_events);
    counter(out, "pcrouter_kv_event_gaps_total",
            "Gaps in a pod's sequence numbers (batches missed).", st.gaps);
    HEADER(out, "pcrouter_kv_event_replays_total", "counter",
           "Replays asked of a pod's replay socket, by result.");
    evbuffer_add_printf(out, "pcrouter_kv_event_replays_total{result=\"ok\"} %llu\n"
                             "pcrouter_kv_event_replays_total{result=\"failed\"} %llu\n",
                        (unsigned long long)(st.replays - st.replays_failed),
                        (unsigned long long)st.replays_failed);
    counter(out, "pcrouter_kv_event_restarts_total",
            "Pod publishers seen to restart (their sequence went back).", st.restarts);
    counter(out, "pcrouter_kv_event_decode_errors_total",
            "Event batches that did not decode (the pod's entries are rebuilt).", st.decode_errors);
    counter(out, "pcrouter_kv_event_bad_messages_total",
            "Messages of the wrong shape (frames, sequence) from a pod.", st.bad_messages);
    counter(out, "pcrouter_kv_event_clears_total",
            "Times a pod's entries were dropped to be rebuilt (gap, restart, decode error, left).",
            st.cleared);
    counter(out, "pcrouter_tokenize_requests_total",
            "Tokenizations asked of a pod (precise mode).", SUM(srv, tokenize_calls));
    static const char *const why[4] = {"timeout", "error", "answer", "no_pod"};
    labelled(out, srv, "pcrouter_tokenize_failures_total",
             "Tokenizations that gave no tokens, by reason: the request was routed on its text "
             "key.", "reason", why, 4, offsetof(pcr_metrics_t, tokenize_failures));
    counter(out, "pcrouter_tokenize_cache_hits_total",
            "Prompts whose token chains the workers' cache held (no pod asked).",
            SUM(srv, tokenize_cache_hits));
    counter(out, "pcrouter_tokenize_cache_prefix_hits_total",
            "Prompts routed at once on the token chains of a cached prompt whose text they "
            "begin with (no pod waited for).", SUM(srv, tokenize_prefix_hits));
    counter(out, "pcrouter_tokenize_prefix_text_total",
            "Prompts beginning like a cached one routed at once on their text key instead: a "
            "pod was sent more of their text and alone holds those tokens' blocks.",
            SUM(srv, tokenize_prefix_text));
    static const char *const tail[3] = {"paid", "unpaid", "went"};
    labelled(out, srv, "pcrouter_tokenize_unknown_tail_total",
             "Prompts beginning like a cached one whose tokens two pods or more hold, no pod "
             "sent more of their text: waits for their own tokens that showed a pod holding "
             "more (paid) or not (unpaid), and prompts routed at once on the cached tokens "
             "(went; also in pcrouter_tokenize_cache_prefix_hits_total).",
             "outcome", tail, 3, offsetof(pcr_metrics_t, tokenize_tail));
    labelled(out, srv, "pcrouter_tokenize_unknown_tail_checked_total",
             "Unknown tails that went at once, checked on their own tokens asked in the "
             "background: a pod this router did not send the prompt held more (paid: waiting "
             "would have paid, and such prompts wait again) or not (unpaid).",
             "outcome", tail, 2, offsetof(pcr_metrics_t, tokenize_tail_checked));
    counter(out, "pcrouter_tokenize_refreshes_total",
            "Tokenizations asked after a prefix hit for the cache only, no request waiting "
            "(also in pcrouter_tokenize_requests_total).", SUM(srv, tokenize_refreshes));
    counter(out, "pcrouter_precise_decisions_total",
            "Decisions made on the prompt's token chains in the pods' own table.",
            SUM(srv, precise_decisions));
}

/* Per tenant of the config in force (so the series are bounded by it), summed over workers;
 * a tenant's priority is a label too, so a queue is read by band. */
static void tenants_render(pcr_worker_t *w, struct evbuffer *out)
{
    const pcr_server_t *srv = w->srv;
    const pcr_config_t *cfg = w->cfg;
    HEADER(out, "pcrouter_pool_saturation", "gauge",
           "The pool's saturation, 0..1 (1: every usable pod at a flow_control threshold).");
    evbuffer_add_printf(out, "pcrouter_pool_saturation %.6f\n",
                        pcr_backends_saturation((pcr_server_t *)srv, cfg));
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } per_tenant[] = {
        {"pcrouter_tenant_requests_total", "counter",
         "Requests of the tenant admitted (sent to a pod, or queued for one).",
         offsetof(pcr_tenant_counts_t, requests)},
        {"pcrouter_tenant_prompt_tokens_total", "counter",
         "Prompt tokens of those requests (canonical prompt bytes / 4).",
         offsetof(pcr_tenant_counts_t, prompt_tokens)},
        {"pcrouter_tenant_output_tokens_total", "counter",
         "Output tokens the pods reported for the tenant's requests (usage.completion_tokens).",
         offsetof(pcr_tenant_counts_t, output_tokens)},
        {"pcrouter_tenant_queue_requests", "gauge",
         "The tenant's requests waiting in pcrouter's flow-control queues now.",
         offsetof(pcr_tenant_counts_t, waiting)},
        {"pcrouter_tenant_queue_released_total", "counter",
         "The tenant's requests that left a flow-control queue for a pod.",
         offsetof(pcr_tenant_counts_t, waited)},
    };
    for (size_t k = 0; k < PCR_ARRAY_SIZE(per_tenant); k++) {
        evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", per_tenant[k].name,
                            per_tenant[k].help, per_tenant[k].name, per_tenant[k].type);
        for (size_t t = 0; t < cfg->ntenants; t++) {
            uint64_t v = 0;
            for (unsigned i = 0; i < srv->nworkers; i++)
                v += PCR_LOAD(*(const uint64_t *)((const char *)
                    &srv->workers[i].metrics.tenants[cfg->tenants[t].slot] + per_tenant[k].off));
            char extra[32];
            snprintf(extra, sizeof extra, ",priority=\"%d\"", cfg->tenants[t].priority);
            row(out, per_tenant[k].name, "tenant", cfg->tenants[t].name, extra, v);
        }
    }
    HEADER(out, "pcrouter_tenant_queue_wait_seconds_total", "counter",
           "Time the tenant's released requests waited in flow-control queues, summed.");
    for (size_t t = 0; t < cfg->ntenants; t++) {
        uint64_t us = 0;
        for (unsigned i = 0; i < srv->nworkers; i++)
            us += PCR_LOAD(srv->workers[i].metrics.tenants[cfg->tenants[t].slot].wait_us);
        evbuffer_add_printf(out, "pcrouter_tenant_queue_wait_seconds_total{tenant=\"%s\",priority=\"%d\"} %.6f\n",
                            cfg->tenants[t].name, cfg->tenants[t].priority, us / 1e6);
    }
    HEADER(out, "pcrouter_tenant_rejected_total", "counter",
           "The tenant's requests refused, by reason: unauthorized (401), rate-limit, token-limit, concurrency, shed, queue-full, rejected-ttl-expired (429).");
    for (size_t t = 0; t < cfg->ntenants; t++) {
        for (int r = 0; r < PCR_REJECT__COUNT; r++) {
            uint64_t v = 0;
            for (unsigned i = 0; i < srv->nworkers; i++)
                v += PCR_LOAD(srv->workers[i].metrics.tenants[cfg->tenants[t].slot].rejected[r]);
            char extra[64];
            snprintf(extra, sizeof extra, ",priority=\"%d\",reason=\"%s\"",
                     cfg->tenants[t].priority, pcr_reject_names[r]);
            row(out, "pcrouter_tenant_rejected_total", "tenant", cfg->tenants[t].name, extra, v);
        }
    }
    HEADER(out, "pcrouter_tenant_concurrent_requests", "gauge",
           "The tenant's requests in flight in the process (what max_concurrent bounds).");
    for (size_t t = 0; t < cfg->ntenants; t++)
        evbuffer_add_printf(out, "pcrouter_tenant_concurrent_requests{tenant=\"%s\"} %u\n",
                            cfg->tenants[t].name,
                            PCR_LOAD(srv->tenants[cfg->tenants[t].slot].concurrent));
}

void pcr_metrics_render(pcr_worker_t *w, struct evbuffer *out)
{
    const pcr_server_t *srv = w->srv;
    const char *pol = pcr_policy_kind_name(w->cfg->routing.policy);
    uint64_t blocks = SUM(srv, prefix_blocks), matched = SUM(srv, prefix_blocks_matched);

    HEADER(out, "pcrouter_build_info", "gauge", "Always 1: the version and git commit this pcrouter was built from.");
    evbuffer_add_printf(out, "pcrouter_build_info{version=\"%s\",commit=\"%s\"} 1\n",
                        pcr_version_string(), pcr_version_commit());
    HEADER(out, "pcrouter_workers", "gauge",
           "Worker threads, and why that many: config, affinity (the CPUs the process may run on) or cgroup_quota (its CPU limit).");
    evbuffer_add_printf(out, "pcrouter_workers{source=\"%s\"} %u\n",
                        srv->workers_source ? srv->workers_source : "config", srv->nworkers);
    HEADER(out, "pcrouter_cpu_affinity", "gauge", "CPUs in the process's affinity mask.");
    evbuffer_add_printf(out, "pcrouter_cpu_affinity %u\n", srv->cpus.affinity);
    HEADER(out, "pcrouter_cpu_quota", "gauge",
           "The cgroup CPU quota in CPUs (cpu.max or cpu.cfs_quota_us over its period); 0 when none is set.");
    evbuffer_add_printf(out, "pcrouter_cpu_quota %.3f\n", srv->cpus.quota);

    counter(out, "pcrouter_prefix_blocks_total",
            "Prefix blocks of routed prompts (the denominator of the predicted hit rate).", blocks);
    counter(out, "pcrouter_prefix_blocks_matched_total",
            "Of those, blocks the chosen backend was believed to hold (the predicted hits).", matched);
    HEADER(out, "pcrouter_pods_shared", "gauge",
           "Whether the pods serve others than this router too (their vllm:request_success_total "
           "against this router's answers from them): 2 yes, 1 this router alone, 0 not known yet.");
    evbuffer_add_printf(out, "pcrouter_pods_shared %d\n", PCR_LOAD(srv->pods_shared));
    HEADER(out, "pcrouter_predicted_hit_rate", "gauge",
           "prefix_blocks_matched_total / prefix_blocks_total since start.");
    evbuffer_add_printf(out, "pcrouter_predicted_hit_rate %.6f\n",
                        blocks ? (double)matched / (double)blocks : 0.0);

    /* Delivered: what the pods say their prefix caches served, summed over backends. */
    uint64_t hits = 0, queries = 0;
    size_t nslots = pcr_backend_slots(srv);
    for (size_t i = 0; i < nslots; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be != NULL && !PCR_LOAD(be->pod_counters_flap)) {
            hits += PCR_LOAD(be->pod_hits);
            queries += PCR_LOAD(be->pod_queries);
        }
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
    HEADER(out, "pcrouter_pd_decisions_total", "counter",
           "Prefill/decode decisions by outcome (disaggregated fleets).");
    for (int o = 0; o < PCR_PD__COUNT; o++) {
        uint64_t v = sum_at(srv, offsetof(pcr_metrics_t, pd_decisions) + (size_t)o * sizeof(uint64_t));
        evbuffer_add_printf(out, "pcrouter_pd_decisions_total{outcome=\"%s\"} %llu\n",
                            pcr_pd_outcome_name((pcr_pd_outcome_t)o), (unsigned long long)v);
    }
    static const char *const fail_names[PCR_PD_FAIL__COUNT] = {"error", "status", "no_params",
                                                               "too_large"};
    labelled(out, srv, "pcrouter_pd_prefill_leg_failures_total",
             "Prefill legs that gave the decode pod nothing to pull, by cause.", "cause",
             fail_names, PCR_PD_FAIL__COUNT, offsetof(pcr_metrics_t, pd_leg_failures));
    counter(out, "pcrouter_panic_routes_total",
            "Requests sent while every backend that could take them was down or ejected.",
            SUM(srv, panic_routes));
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
    counter(out, "pcrouter_request_body_budget_refusals_total",
            "Requests answered 503 because their body got no budget "
            "(limits.max_buffered_body_bytes) within timeouts.client_idle_ms.",
            SUM(srv, body_budget_refusals));
    counter(out, "pcrouter_client_write_timeouts_total",
            "Streams or connections ended because the client accepted no bytes for timeouts.client_write_ms.",
            SUM(srv, write_timeouts));
    counter(out, "pcrouter_h2_hibernations_total",
            "Times an idle HTTP/2 connection freed its nghttp2 session, to rebuild it at its next bytes.",
            SUM(srv, h2_hibernations));
    HEADER(out, "pcrouter_h2_sessions_hibernated", "gauge",
           "Idle HTTP/2 connections holding no nghttp2 session now (hibernated).");
    evbuffer_add_printf(out, "pcrouter_h2_sessions_hibernated %llu\n",
                        (unsigned long long)SUM(srv, h2_hibernated));
    counter(out, "pcrouter_responses_aborted_total",
            "Responses the pod broke after their head reached the client.", SUM(srv, responses_aborted));
    counter(out, "pcrouter_responses_buffered_total",
            "Responses whose pod finished while pcrouter still kept part of them for a slow client "
            "(limits.max_response_buffer_bytes): the pod's connection was freed first.",
            SUM(srv, responses_buffered));
    counter(out, "pcrouter_response_backpressure_total",
            "Times the reading of a pod's response paused because its client read slower and "
            "the response's buffer, or limits.max_buffered_response_bytes, was full.",
            SUM(srv, response_backpressure));
    HEADER(out, "pcrouter_response_buffered_bytes", "gauge",
           "Response bytes kept for clients slower than their pods, against "
           "limits.max_buffered_response_bytes.");
    evbuffer_add_printf(out, "pcrouter_response_buffered_bytes %llu\n",
                        (unsigned long long)PCR_LOAD(((pcr_server_t *)srv)->resp_buffered));
    HEADER(out, "pcrouter_request_body_buffered_bytes", "gauge",
           "Request body bytes held in memory: at most limits.max_buffered_body_bytes, one "
           "body past it, and each client connection's allowance.");
    evbuffer_add_printf(out, "pcrouter_request_body_buffered_bytes %llu\n",
                        (unsigned long long)PCR_LOAD(((pcr_server_t *)srv)->body_buffered));
    HEADER(out, "pcrouter_request_body_reserved_bytes", "gauge",
           "Request body bytes clients were allowed to send beyond their connections' "
           "allowances, against limits.max_buffered_body_bytes.");
    evbuffer_add_printf(out, "pcrouter_request_body_reserved_bytes %llu\n",
                        (unsigned long long)PCR_LOAD(((pcr_server_t *)srv)->body_reserved));
    render_memory(srv, out);
    HEADER(out, "pcrouter_config_reloads_total", "counter",
           "Config reloads (SIGHUP) by result: ok, or error (the previous config kept running).");
    evbuffer_add_printf(out, "pcrouter_config_reloads_total{result=\"ok\"} %llu\n"
                             "pcrouter_config_reloads_total{result=\"error\"} %llu\n",
                        (unsigned long long)PCR_LOAD(((pcr_server_t *)srv)->reloads_ok),
                        (unsigned long long)PCR_LOAD(((pcr_server_t *)srv)->reloads_failed));
    counter(out, "pcrouter_discovery_lookups_total", "DNS discovery lookups done.",
            PCR_LOAD(((pcr_server_t *)srv)->discovery_lookups));
    counter(out, "pcrouter_discovery_failures_total",
            "DNS discovery lookups that failed (the backends they found stayed).",
            PCR_LOAD(((pcr_server_t *)srv)->discovery_failures));
    HEADER(out, "pcrouter_backends", "gauge",
           "Backends in the pool, configured or discovered (one that left and drains is not).");
    evbuffer_add_printf(out, "pcrouter_backends %zu\n", pcr_backends_count(srv));
    counter(out, "pcrouter_access_log_dropped_total",
            "Access log lines lost: the writer's queue was full (a disk slower than the requests), or a write failed.",
            pcr_accesslog_dropped(srv->access_log));
    counter(out, "pcrouter_index_updates_dropped_total",
            "Index updates between workers dropped because a worker's inbox was full.",
            pcr_bus_dropped(srv->bus));

    pcr_share_render_metrics(srv->share, out);
    render_precise(w, out);

    unsigned uring_workers = 0;
    for (unsigned k = 0; k < srv->nworkers; k++)
        uring_workers += PCR_LOAD(srv->workers[k].io_uring) ? 1 : 0;
    HEADER(out, "pcrouter_io_uring_workers", "gauge",
           "Workers whose socket reads and writes go out in batches through io_uring (config io_uring).");
    evbuffer_add_printf(out, "pcrouter_io_uring_workers %u\n", uring_workers);
    counter(out, "pcrouter_io_uring_submits_total",
            "System calls that submitted a batch of socket reads or writes.", SUM(srv, io_submits));
    counter(out, "pcrouter_io_uring_ops_total",
            "Socket reads and writes submitted in those batches.", SUM(srv, io_ops));
    counter(out, "pcrouter_io_uring_merged_total",
            "Submits that carried the writes a busy loop turn left with the next turn's reads.",
            SUM(srv, io_merged));
    counter(out, "pcrouter_batch_waits_total",
            "Times a busy worker let events gather (one to four batch_wait_us) before looking for them.",
            SUM(srv, batch_waits));
    HEADER(out, "pcrouter_worker_cpu_seconds_total", "counter",
           "CPU time of the worker threads, read every 10 ms of their loops (batch_wait_busy).");
    evbuffer_add_printf(out, "pcrouter_worker_cpu_seconds_total %.6f\n",
                        (double)SUM(srv, cpu_us) / 1e6);

    /* Every worker holds a replica of the index: the memory is their sum. */
    HEADER(out, "pcrouter_index_bytes", "gauge", "Memory held by the prefix index, all worker replicas.");
    evbuffer_add_printf(out, "pcrouter_index_bytes %llu\n", (unsigned long long)SUM(srv, index_bytes));
    /* Every replica evicts alike (the same calls in the same order): their sum would count one
     * eviction once per worker, so the most any replica counted stands for the index. */
    uint64_t evictions = 0;
    for (unsigned k = 0; k < srv->nworkers; k++) {
        uint64_t v = PCR_LOAD(srv->workers[k].metrics.index_evictions);
        evictions = v > evictions ? v : evictions;
    }
    counter(out, "pcrouter_index_evictions_total",
            "(block, backend) pairs the prefix index evicted at a backend's capacity or at routing.index_max_bytes (one replica's count).",
            evictions);

    /* Every backend's name, escaped once for all its rows. */
    char (*names)[PCR_LABEL_MAX] = calloc(nslots ? nslots : 1, sizeof(*names));
    if (names == NULL)
        return;
    for (size_t i = 0; i < nslots; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be != NULL)
            label_escape(names[i], sizeof(names[i]), be->conf.name);
    }
    for (size_t k = 0; k < sizeof(per_backend) / sizeof(per_backend[0]); k++) {
        evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", per_backend[k].name,
                            per_backend[k].help, per_backend[k].name, per_backend[k].type);
        for (size_t i = 0; i < nslots; i++) {
            pcr_backend_t *be = pcr_backend_at(srv, i);
            if (be != NULL)
                row(out, per_backend[k].name, "backend", names[i], NULL, per_backend[k].get(w, be));
        }
    }
    /* Only pods that reported it: an unknown usage is no series rather than a false 0. */
    HEADER(out, "pcrouter_backend_kv_cache_usage_ratio", "gauge",
           "KV cache in use on the pod, 0..1, as last scraped (vllm:kv_cache_usage_perc, or vllm:gpu_cache_usage_perc).");
    for (size_t i = 0; i < nslots; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be != NULL && PCR_LOAD(be->pod_kv_usage_known))
            evbuffer_add_printf(out, "pcrouter_backend_kv_cache_usage_ratio{backend=\"%s\"} %.6f\n",
                                names[i], (double)PCR_LOAD(be->pod_kv_usage_ppm) / 1e6);
    }
    /* Precise mode: this worker's replica of the pods' table (every replica applies the same
     * events). */
    const pcr_kvtable_t *kvt = pcr_policy_kvtable(w->policy);
    HEADER(out, "pcrouter_backend_kv_blocks", "gauge",
           "Blocks the pod said it holds, by medium (gpu, cpu), in the pods' table (precise mode).");
    for (size_t i = 0; kvt != NULL && i < nslots; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL)
            continue;
        evbuffer_add_printf(out, "pcrouter_backend_kv_blocks{backend=\"%s\",medium=\"gpu\"} %llu\n"
                                 "pcrouter_backend_kv_blocks{backend=\"%s\",medium=\"cpu\"} %llu\n",
                            names[i], (unsigned long long)pcr_kvtable_entries(kvt, (unsigned)i, PCR_KVT_GPU),
                            names[i], (unsigned long long)pcr_kvtable_entries(kvt, (unsigned)i, PCR_KVT_CPU));
    }
    HEADER(out, "pcrouter_backend_kv_speculative_blocks", "gauge",
           "Blocks counted as held for requests just sent, not yet confirmed by the pod's events.");
    for (size_t i = 0; kvt != NULL && i < nslots; i++)
        if (pcr_backend_at(srv, i) != NULL)
            evbuffer_add_printf(out, "pcrouter_backend_kv_speculative_blocks{backend=\"%s\"} %llu\n",
                                names[i], (unsigned long long)pcr_kvtable_speculative(kvt, (unsigned)i));
    HEADER(out, "pcrouter_backend_requests_total", "counter", "Responses per backend and status.");
    for (size_t i = 0; i < nslots; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        for (int c = 100; be != NULL && c < 600; c++) {
            uint64_t v = PCR_LOAD(be->requests_by_code[c]);
            char code[16];
            if (v) {
                snprintf(code, sizeof(code), ",code=\"%d\"", c);
                row(out, "pcrouter_backend_requests_total", "backend", names[i], code, v);
            }
        }
    }
    free(names);

    hist_render(out, srv, "pcrouter_request_duration_seconds", "Request start to last response byte.",
                offsetof(pcr_metrics_t, duration), &pcr_hist_latency_us);
    hist_render(out, srv, "pcrouter_time_to_first_byte_seconds",
                "Request start to the response head from the backend (vLLM sends a stream's head before its prefill: see pcrouter_time_to_first_token_seconds).", offsetof(pcr_metrics_t, ttfb),
                &pcr_hist_latency_us);
    hist_render(out, srv, "pcrouter_time_to_first_token_seconds",
                "Streams only: request start to the first response body byte, the first token, time held in pcrouter included.",
                offsetof(pcr_metrics_t, ttft), &pcr_hist_latency_us);
    hist_help(out, "pcrouter_route_decision_seconds",
              "Time of a routed request's decision, by phase: parse (the body, while it arrives), hash (the prefix key, after its last byte), match (the index lookup), cost (costs and bounds), total (last body byte to chosen backend).");
    for (int ph = 0; ph < PCR_PHASE__COUNT; ph++) {
        char labels[32];
        snprintf(labels, sizeof(labels), "phase=\"%s\",", phase_names[ph]);
        hist_series(out, srv, "pcrouter_route_decision_seconds", labels,
                    offsetof(pcr_metrics_t, decision) + (size_t)ph * sizeof(pcr_hist_t),
                    &pcr_hist_decision_ns);
    }
    hist_render(out, srv, "pcrouter_cached_tokens_error",
                "Per request, predicted minus delivered cached tokens (requests whose pod reported usage): above 0, the index believed the pod held more than it did.",
                offsetof(pcr_metrics_t, cached_error), &pcr_hist_tokens_error);
    tenants_render(w, out);
}
