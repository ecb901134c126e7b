/* router/scrape.c: reads each pod's own /metrics (vLLM's Prometheus text) every health
 * interval, for two things the router cannot count itself:
 *   - the load the pod reports: vllm:num_requests_waiting feeds the routing cost;
 *   - the hit rate the pod delivers: vllm:prefix_cache_hits_total / _queries_total (tokens),
 *     shown in pcrouter's /metrics beside the hit rate the router predicted.
 * vLLM v0 named the counters vllm:gpu_prefix_cache_{hits,queries}_total; both are read.
 * Counters are accumulated as deltas, so a pod restart (its counters fall to 0) is not a
 * negative rate. */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "backend.h"
#include "bus.h"
#include "log.h"
#include "scrape.h"
#include "upstream.h"

#define SCRAPE_MAX_BYTES (4 * 1024 * 1024)

typedef struct {
    pcr_backend_t *be;
    int status;
    struct evbuffer *body;
} scrape_ctx_t;

static int metric_is(const char *line, size_t len, const char *name)
{
    size_t n = strlen(name);
    return len > n && strncmp(line, name, n) == 0 && (line[n] == '{' || line[n] == ' ');
}

/* The sample value: the text after the last space (vLLM writes no timestamps). */
static double metric_value(const char *line, size_t len)
{
    const char *sp = NULL;
    for (size_t i = 0; i < len; i++)
        if (line[i] == ' ')
            sp = line + i;
    return sp ? strtod(sp + 1, NULL) : 0.0;
}

/* The value of label `name` ("16" in block_size="16"), as an integer; 0 when absent. */
static uint64_t label_u64(const char *line, size_t len, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i + n + 2 < len; i++) {
        if ((i == 0 || line[i - 1] == '{' || line[i - 1] == ',') && strncmp(line + i, name, n) == 0 &&
            line[i + n] == '=' && line[i + n + 1] == '"')
            return strtoull(line + i + n + 2, NULL, 10);
    }
    return 0;
}

/* vllm:cache_config_info{block_size="16",num_gpu_blocks="N",...} 1.0: the pod's KV capacity. */
static uint64_t cache_config_tokens(const char *line, size_t len)
{
    return label_u64(line, len, "block_size") * label_u64(line, len, "num_gpu_blocks");
}

/* Adds what the counter grew by; returns 1 when it went back (the pod restarted). */
static int accumulate(uint64_t *total, uint64_t *last, int *have, double raw)
{
    uint64_t v = raw > 0 ? (uint64_t)raw : 0;
    int went_back = *have && v < *last;
    if (*have && v >= *last)
        *total += v - *last;
    else if (*have)
        *total += v; /* the pod restarted: its counter began again at 0 */
    *last = v;
    *have = 1;
    return went_back;
}

void pcr_scrape_parse(pcr_backend_t *be, struct evbuffer *body)
{
    double waiting = 0, running = 0, hits = 0, queries = 0, started = 0, kv = 0;
    int seen_waiting = 0, seen_hits = 0, restarted = 0, seen_kv = 0;
    uint64_t cache_tokens = 0;
    char *line;
    size_t len;
    while ((line = evbuffer_readln(body, &len, EVBUFFER_EOL_LF)) != NULL) {
        if (len > 0 && line[0] != '#') {
            /* Sum over label sets: one pod may expose several models or engines. */
            if (metric_is(line, len, "vllm:num_requests_waiting")) {
                waiting += metric_value(line, len);
                seen_waiting = 1;
            } else if (metric_is(line, len, "vllm:num_requests_running")) {
                running += metric_value(line, len);
            } else if (metric_is(line, len, "vllm:prefix_cache_hits_total") ||
                       metric_is(line, len, "vllm:gpu_prefix_cache_hits_total")) {
                hits += metric_value(line, len);
                seen_hits = 1;
            } else if (metric_is(line, len, "vllm:cache_config_info")) {
                cache_tokens = cache_config_tokens(line, len);
            } else if (metric_is(line, len, "vllm:kv_cache_usage_perc") ||
                       metric_is(line, len, "vllm:gpu_cache_usage_perc")) {
                kv += metric_value(line, len); /* a ratio, 0..1, despite the name */
                seen_kv++;
            } else if (metric_is(line, len, "process_start_time_seconds")) {
                started = metric_value(line, len);
            } else if (metric_is(line, len, "vllm:prefix_cache_queries_total") ||
                       metric_is(line, len, "vllm:gpu_prefix_cache_queries_total")) {
                queries += metric_value(line, len);
            }
        }
        free(line);
    }
    if (seen_waiting) {
        PCR_STORE(be->pod_waiting, (uint32_t)waiting);
        PCR_STORE(be->pod_running, (uint32_t)running);
    }
    if (seen_kv) {
        /* Several engines in one pod: their mean. */
        double r = kv / seen_kv;
        PCR_STORE(be->pod_kv_usage_ppm, (uint32_t)(r > 1 ? 1e6 : r > 0 ? r * 1e6 + 0.5 : 0));
        PCR_STORE(be->pod_kv_usage_known, 1);
    }
    if (seen_hits) {
        uint64_t h = PCR_LOAD(be->pod_hits), q = PCR_LOAD(be->pod_queries);
        restarted |= accumulate(&h, &be->pod_hits_last, &be->pod_have_hits, hits);
        restarted |= accumulate(&q, &be->pod_queries_last, &be->pod_have_queries, queries);
        PCR_STORE(be->pod_hits, h);
        PCR_STORE(be->pod_queries, q);
    }
    if (started > 0) {
        restarted |= be->pod_start_time > 0 && started != be->pod_start_time;
        be->pod_start_time = started;
    }
    /* A new cache geometry is a new engine too. */
    restarted |= cache_tokens > 0 && PCR_LOAD(be->pod_cache_tokens) > 0 &&
                 cache_tokens != PCR_LOAD(be->pod_cache_tokens);
    if (restarted) {
        /* Its KV cache is empty: every replica of the index forgets what it believed of it
         * (the routing library decides; we report). */
        PCR_ADD(be->restarts, 1);
        pcr_log_warn("backend %s restarted (its metrics say so): its cache starts empty",
                     be->conf.name);
        pcr_bus_state(be->srv->bus, be->id, PCR_BACKEND_RESTARTED, pcr_now_us());
    }
    if (cache_tokens > 0 && cache_tokens != PCR_LOAD(be->pod_cache_tokens)) {
        /* The pod's real KV capacity replaces the configured guess: the index must never
         * believe a pod holds more than it can. A token is 4 bytes of canonical prompt. */
        PCR_STORE(be->pod_cache_tokens, cache_tokens);
        uint64_t blocks = cache_tokens * 4 / be->srv->cfg->routing.block_bytes;
        pcr_bus_capacity(be->srv->bus, PCR_BUS_CONTROL, be->id, blocks ? blocks : 1);
        pcr_log_info("backend %s reports a KV cache of %llu tokens", be->conf.name,
                     (unsigned long long)cache_tokens);
    }
    PCR_INC(be->pod_scrapes);
}

static void scrape_end(scrape_ctx_t *c)
{
    c->be->scrape_req = NULL;
    c->be->scrape_ctx = NULL;
    evbuffer_free(c->body);
    free(c);
}

static void on_head(void *ctx, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    ((scrape_ctx_t *)ctx)->status = status;
}

static void on_body(void *ctx, const char *data, size_t len)
{
    scrape_ctx_t *c = ctx;
    if (evbuffer_get_length(c->body) + len <= SCRAPE_MAX_BYTES)
        evbuffer_add(c->body, data, len);
}

static void on_done(void *ctx)
{
    scrape_ctx_t *c = ctx;
    if (c->status == 200)
        pcr_scrape_parse(c->be, c->body);
    scrape_end(c);
}

static void on_error(void *ctx, pcr_up_error_t err, int got_head) { scrape_end(ctx); }

static const pcr_upstream_cbs_t scrape_cbs = {on_head, on_body, on_done, on_error};

void pcr_scrape_start(pcr_backend_t *be)
{
    if (be->scrape_req != NULL || !PCR_LOAD(be->up))
        return; /* the last one is still running, or the pod is down */
    scrape_ctx_t *c = calloc(1, sizeof(*c));
    struct evbuffer *req = evbuffer_new();
    if (c == NULL || req == NULL || (c->body = evbuffer_new()) == NULL) {
        free(c);
        if (req)
            evbuffer_free(req);
        return;
    }
    c->be = be;
    evbuffer_add_printf(req, "GET /metrics HTTP/1.1\r\nHost: %s\r\nUser-Agent: pcrouter-scrape\r\n\r\n",
                        be->host_header);
    be->scrape_req = pcr_upstream_send(be->check_pool, req, &scrape_cbs, c);
    if (be->scrape_req == NULL) {
        evbuffer_free(c->body);
        free(c);
        return;
    }
    be->scrape_ctx = c;
}

void pcr_scrape_cancel(pcr_backend_t *be)
{
    if (be->scrape_req == NULL)
        return;
    pcr_upstream_cancel(be->scrape_req);
    scrape_end(be->scrape_ctx);
}
