/* router/scrape.c: reads each pod's own /metrics (vLLM's Prometheus text) every
 * scrape.interval_ms, over the health checks' connection, for what the router cannot count
 * itself:
 *   - the load the pod reports: vllm:num_requests_waiting feeds the routing cost;
 *   - the hit rate the pod delivers: vllm:prefix_cache_hits_total / _queries_total (tokens),
 *     shown in pcrouter's /metrics beside the hit rate the router predicted;
 *   - its KV capacity (vllm:cache_config_info), and whether it restarted (its counters went back,
 *     or process_start_time_seconds or the cache geometry changed), which empties its cache.
 * vLLM v0 named the counters vllm:gpu_prefix_cache_{hits,queries}_total; both are read.
 * Counters are accumulated as deltas, so a pod restart (its counters fall to 0) is not a
 * negative rate.
 *
 * A vLLM page is tens of KiB, mostly histograms nobody here reads, and 64 pods every 200 ms is
 * 320 pages a second: the body is read line by line as it arrives, in place (no copy of the
 * page, no allocation per line), a line is dismissed on its first bytes unless it names one of
 * the few metrics above, and only a line cut by a read boundary is copied (bounded). */
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
#define LINE_MAX_BYTES 4096              /* longer lines are none of ours: skipped */

/* What one page says, summed over its label sets (one pod may expose several models). */
typedef struct {
    double waiting, running, hits, queries, started;
    int seen_waiting, seen_hits;
    uint64_t cache_tokens;
    char carry[LINE_MAX_BYTES];          /* a line cut by the end of a read */
    size_t ncarry;
    int skipping;                        /* inside a line too long to keep */
    size_t bytes;
} page_t;

typedef struct {
    pcr_backend_t *be;
    int status;
    page_t page;
} scrape_ctx_t;

/* Whether the line holds sample `name` (NAME_IS: a string literal, compared without strlen). */
static int name_is(const char *line, size_t len, const char *name, size_t n)
{
    return len > n && memcmp(line, name, n) == 0 && (line[n] == '{' || line[n] == ' ');
}
#define NAME_IS(line, len, lit) name_is(line, len, lit, sizeof(lit) - 1)

/* The sample value: the text after the last space (vLLM writes no timestamps). */
static double metric_value(const char *line, size_t len)
{
    const char *sp = NULL;
    for (size_t i = 0; i < len; i++)
        if (line[i] == ' ')
            sp = line + i;
    if (sp == NULL)
        return 0.0;
    char num[64];
    size_t n = (size_t)(line + len - (sp + 1));
    if (n >= sizeof(num))
        return 0.0;
    memcpy(num, sp + 1, n);
    num[n] = '\0'; /* the line is not NUL-terminated: strtod gets a copy */
    return strtod(num, NULL);
}

/* The value of label `name` ("16" in block_size="16"), as an integer; 0 when absent. */
static uint64_t label_u64(const char *line, size_t len, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i + n + 2 < len; i++) {
        if ((i == 0 || line[i - 1] == '{' || line[i - 1] == ',') && strncmp(line + i, name, n) == 0 &&
            line[i + n] == '=' && line[i + n + 1] == '"') {
            uint64_t v = 0;
            for (size_t k = i + n + 2; k < len && line[k] >= '0' && line[k] <= '9'; k++)
                v = v * 10 + (uint64_t)(line[k] - '0');
            return v;
        }
    }
    return 0;
}

/* vllm:cache_config_info{block_size="16",num_gpu_blocks="N",...} 1.0: the pod's KV capacity. */
static uint64_t cache_config_tokens(const char *line, size_t len)
{
    return label_u64(line, len, "block_size") * label_u64(line, len, "num_gpu_blocks");
}

/* One line of the page. Most are dismissed on their first bytes. */
static void page_line(page_t *pg, const char *line, size_t len)
{
    if (len < 6 || line[0] == '#')
        return;
    if (line[0] == 'p') {
        if (NAME_IS(line, len, "process_start_time_seconds"))
            pg->started = metric_value(line, len);
        return;
    }
    if (line[0] != 'v' || memcmp(line, "vllm:", 5) != 0)
        return;
    switch (line[5]) {
    case 'n':
        if (NAME_IS(line, len, "vllm:num_requests_waiting")) {
            pg->waiting += metric_value(line, len);
            pg->seen_waiting = 1;
        } else if (NAME_IS(line, len, "vllm:num_requests_running")) {
            pg->running += metric_value(line, len);
        }
        break;
    case 'p':
    case 'g':
        if (NAME_IS(line, len, "vllm:prefix_cache_hits_total") ||
            NAME_IS(line, len, "vllm:gpu_prefix_cache_hits_total")) {
            pg->hits += metric_value(line, len);
            pg->seen_hits = 1;
        } else if (NAME_IS(line, len, "vllm:prefix_cache_queries_total") ||
                   NAME_IS(line, len, "vllm:gpu_prefix_cache_queries_total")) {
            pg->queries += metric_value(line, len);
        }
        break;
    case 'c':
        if (NAME_IS(line, len, "vllm:cache_config_info"))
            pg->cache_tokens = cache_config_tokens(line, len);
        break;
    default:
        break;
    }
}

/* The next piece of the page as it arrives: whole lines are read where they are; the line the
 * piece ends in waits in `carry` for the rest. */
static void page_feed(page_t *pg, const char *data, size_t len)
{
    if (pg->bytes + len > SCRAPE_MAX_BYTES)
        len = pg->bytes < SCRAPE_MAX_BYTES ? SCRAPE_MAX_BYTES - pg->bytes : 0;
    pg->bytes += len;
    const char *p = data, *end = data + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        if (pg->skipping || pg->ncarry + n > sizeof(pg->carry)) {
            pg->skipping = 1; /* too long to be ours: up to its end */
            pg->ncarry = 0;
        } else if (nl != NULL && pg->ncarry == 0) {
            page_line(pg, p, n);
        } else {
            memcpy(pg->carry + pg->ncarry, p, n);
            pg->ncarry += n;
            if (nl != NULL) {
                page_line(pg, pg->carry, pg->ncarry);
                pg->ncarry = 0;
            }
        }
        if (nl == NULL)
            break;
        pg->skipping = 0;
        p = nl + 1;
    }
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

/* The whole page was read: what it says becomes the backend's. */
static void page_apply(pcr_backend_t *be, page_t *pg)
{
    int restarted = 0;
    if (pg->ncarry > 0 && !pg->skipping)
        page_line(pg, pg->carry, pg->ncarry); /* the last line had no newline */
    pg->ncarry = 0;
    if (pg->seen_waiting) {
        PCR_STORE(be->pod_waiting, (uint32_t)pg->waiting);
        PCR_STORE(be->pod_running, (uint32_t)pg->running);
    }
    if (pg->seen_hits) {
        uint64_t h = PCR_LOAD(be->pod_hits), q = PCR_LOAD(be->pod_queries);
        restarted |= accumulate(&h, &be->pod_hits_last, &be->pod_have_hits, pg->hits);
        restarted |= accumulate(&q, &be->pod_queries_last, &be->pod_have_queries, pg->queries);
        PCR_STORE(be->pod_hits, h);
        PCR_STORE(be->pod_queries, q);
    }
    if (pg->started > 0) {
        restarted |= be->pod_start_time > 0 && pg->started != be->pod_start_time;
        be->pod_start_time = pg->started;
    }
    uint64_t cache_tokens = pg->cache_tokens;
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

void pcr_scrape_parse(pcr_backend_t *be, struct evbuffer *body)
{
    page_t *pg = calloc(1, sizeof(*pg));
    if (pg == NULL) {
        evbuffer_drain(body, evbuffer_get_length(body));
        return;
    }
    struct evbuffer_iovec v[16];
    while (evbuffer_get_length(body) > 0) {
        int n = evbuffer_peek(body, -1, NULL, v, 16);
        size_t used = 0;
        for (int i = 0; i < n && i < 16; i++) {
            page_feed(pg, v[i].iov_base, v[i].iov_len);
            used += v[i].iov_len;
        }
        evbuffer_drain(body, used);
    }
    page_apply(be, pg);
    free(pg);
}

static void scrape_end(scrape_ctx_t *c)
{
    c->be->scrape_req = NULL;
    c->be->scrape_ctx = NULL;
    free(c);
}

static void on_head(void *ctx, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    ((scrape_ctx_t *)ctx)->status = status;
}

static void on_body(void *ctx, const char *data, size_t len)
{
    scrape_ctx_t *c = ctx;
    if (c->status == 200)
        page_feed(&c->page, data, len);
}

static void on_done(void *ctx)
{
    scrape_ctx_t *c = ctx;
    if (c->status == 200)
        page_apply(c->be, &c->page);
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
    if (c == NULL || req == NULL) {
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
