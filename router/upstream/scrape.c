/* router/upstream/scrape.c: reads each pod's own /metrics (vLLM's Prometheus text) every
 * scrape.interval_ms, over the health checks' own connection (probe.c), for what the router cannot count
 * itself:
 *   - the load the pod reports: vllm:num_requests_waiting feeds the routing cost;
 *   - the hit rate the pod delivers: vllm:prefix_cache_hits_total / _queries_total (tokens),
 *     shown in pcrouter's /metrics beside the hit rate the router predicted.
 * The text is read by prom.c (pure, bounded, fuzzed) as it arrives: a vLLM page is tens of KiB
 * and 64 pods every 200 ms is 320 pages a second, so no copy of it is made, only of a line a
 * read boundary cuts. This file does the I/O and applies the sample to the backend. Counters are accumulated as deltas, so a pod restart (its counters
 * fall to 0) is not a negative rate. */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "backend.h"
#include "bus.h"
#include "log.h"
#include "probe.h"
#include "prom.h"
#include "scrape.h"

#define SCRAPE_MAX_BYTES (4 * 1024 * 1024)
/* Two counter resets closer than this: the counters flap (a real restart reloads a model). */
#define FLAP_US (60ull * 1000000)

/* One scrape in flight. The page is read as it arrives (prom.c's reader): no copy of it is
 * kept, only a line cut by a read boundary. */
typedef struct {
    pcr_backend_t *be;
    int status;
    size_t bytes;                  /* of the page so far, against SCRAPE_MAX_BYTES */
    pcr_prom_reader_t page;
} scrape_ctx_t;

/* A count the pod reported (finite, >= 0: prom.c checked) as an integer, saturated. */
static uint64_t to_u64(double v)
{
    return v >= 18446744073709551615.0 ? UINT64_MAX : v > 0 ? (uint64_t)v : 0;
}

static uint32_t to_u32(double v)
{
    return v >= 4294967295.0 ? UINT32_MAX : v > 0 ? (uint32_t)v : 0;
}

static uint64_t sat_add(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }

/* Adds what the prefix-cache counters grew by; returns 1 when either went back (the pod
 * restarted: its counters began again at 0, so their values count in full). Hits are a part
 * of the queries, so a scrape never adds more hits than queries. A second reset within
 * FLAP_US of the one before is no restart but a pod whose counters flap: from then on its
 * counters are not added (pod_counters_flap), or its made-up hits would drive the fleet's
 * delivered hit rate. */
static int accumulate(pcr_backend_t *be, double raw_hits, double raw_queries)
{
    uint64_t vh = to_u64(raw_hits), vq = to_u64(raw_queries);
    int have = be->pod_have_hits && be->pod_have_queries;
    int back = have && (vh < be->pod_hits_last || vq < be->pod_queries_last);
    uint64_t ah = back ? vh : vh - be->pod_hits_last;
    uint64_t aq = back ? vq : vq - be->pod_queries_last;
    if (ah > aq)
        ah = aq;
    if (back) {
        uint64_t now = pcr_now_us();
        if (be->pod_reset_us != 0 && now - be->pod_reset_us < FLAP_US && !PCR_LOAD(be->pod_counters_flap)) {
            PCR_STORE(be->pod_counters_flap, 1);
            pcr_log_warn("backend %s: its prefix-cache counters went back twice within %d s: "
                         "they are no longer counted", be->conf.name, (int)(FLAP_US / 1000000));
        }
        be->pod_reset_us = now;
    }
    if (have && !PCR_LOAD(be->pod_counters_flap)) {
        PCR_STORE(be->pod_hits, sat_add(PCR_LOAD(be->pod_hits), ah));
        PCR_STORE(be->pod_queries, sat_add(PCR_LOAD(be->pod_queries), aq));
    }
    be->pod_hits_last = vh;
    be->pod_queries_last = vq;
    be->pod_have_hits = be->pod_have_queries = 1;
    return back;
}

/* Whether the pods serve others than this router too (another replica, a client that calls
 * them directly): once the pool's window holds SHARE_WINDOW requests (what the pods finished
 * and what they answered this router, summed over the pods), the pods' count being more than
 * SHARE_FOREIGN above this router's (and SHARE_SLACK over, for requests that ended on either
 * side of a scrape) says so. Over the pool, not per pod: the first verdict comes after a
 * handful of requests, when unknown tails still wait (PCR_BACKEND_SHARED, decided by the
 * routing library; told to each pod's entry that was not told it yet). A pod whose counter
 * went back (a restart) adds nothing that scrape. */
#define SHARE_WINDOW 32
#define SHARE_FOREIGN 0.2
#define SHARE_SLACK 3

static void judge_sharing(pcr_backend_t *be, double success)
{
    pcr_server_t *srv = be->srv;
    uint64_t ours = 0;
    for (size_t c = 0; c < sizeof(be->requests_by_code) / sizeof(be->requests_by_code[0]); c++)
        ours += PCR_LOAD(be->requests_by_code[c]);
    uint64_t pod = success < 1e18 ? (uint64_t)success : (uint64_t)1e18;
    if (be->pod_have_success && pod >= be->pod_success_last && ours >= be->ours_last) {
        srv->share_pod += pod - be->pod_success_last;
        srv->share_ours += ours - be->ours_last;
    }   /* else a baseline: the pod's past is not this router's to compare */
    be->pod_have_success = 1;
    be->pod_success_last = pod;
    be->ours_last = ours;
    if (srv->share_pod + srv->share_ours < SHARE_WINDOW)
        return;
    int shared = (double)srv->share_pod >
                 (double)srv->share_ours / (1 - SHARE_FOREIGN) + SHARE_SLACK;
    srv->share_pod = srv->share_ours = 0;
    if (shared + 1 != PCR_LOAD(srv->pods_shared)) {
        PCR_STORE(srv->pods_shared, shared + 1);
        pcr_log_info("the pods serve %s", shared ? "others than this router too (they count "
                                                   "more requests than it sent)"
                                                 : "this router alone");
    }
    /* Every pod's entry hears the verdict, a pod that joined since the last one too. */
    uint64_t now = pcr_now_us();
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *b = pcr_backend_at(srv, i);
        if (b == NULL || b->shared_told == shared + 1)
            continue;
        b->shared_told = shared + 1;
        pcr_bus_state(srv->bus, (int)i, shared ? PCR_BACKEND_SHARED : PCR_BACKEND_PRIVATE, now);
    }
}

/* What one page said becomes the backend's. */
static void apply(pcr_backend_t *be, const pcr_pod_sample_t *sp)
{
    const pcr_pod_sample_t s = *sp;
    int restarted = 0;
    if (s.seen & PCR_PROM_WAITING) {
        PCR_STORE(be->pod_waiting, to_u32(s.num_requests_waiting));
        PCR_STORE(be->pod_running, to_u32(s.num_requests_running));
    }
    if (s.seen & PCR_PROM_KV_USAGE) {
        double r = s.kv_cache_usage; /* a ratio, 0..1, despite the name */
        PCR_STORE(be->pod_kv_usage_ppm, (uint32_t)(r > 1 ? 1e6 : r > 0 ? r * 1e6 + 0.5 : 0));
        PCR_STORE(be->pod_kv_usage_known, 1);
    }
    if (s.seen & PCR_PROM_HITS)
        restarted |= accumulate(be, s.prefix_cache_hits, s.prefix_cache_queries);
    if (s.seen & PCR_PROM_SUCCESS)
        judge_sharing(be, s.request_success);
    if (s.seen & PCR_PROM_START_TIME) {
        restarted |= be->pod_start_time > 0 && s.process_start_time != be->pod_start_time;
        be->pod_start_time = s.process_start_time;
    }
    /* prom.h bounds both factors, so neither product below can overflow. */
    uint64_t cache_tokens = s.block_size * s.num_gpu_blocks;
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
         * believe a pod holds more than it can. A token is PCR_BYTES_PER_TOKEN bytes. */
        PCR_STORE(be->pod_cache_tokens, cache_tokens);
        uint64_t blocks =
            cache_tokens * PCR_BYTES_PER_TOKEN / be->srv->cfg->routing.block_bytes;
        pcr_bus_capacity(be->srv->bus, PCR_BUS_CONTROL, be->id, blocks ? blocks : 1);
        pcr_log_info("backend %s reports a KV cache of %llu tokens", be->conf.name,
                     (unsigned long long)cache_tokens);
    }
    PCR_INC(be->pod_scrapes);
}

void pcr_scrape_parse(pcr_backend_t *be, struct evbuffer *body)
{
    pcr_prom_reader_t *r = malloc(sizeof(*r));
    if (r == NULL)
        return;
    pcr_prom_begin(r);
    struct evbuffer_ptr at;
    struct evbuffer_iovec v;
    evbuffer_ptr_set(body, &at, 0, EVBUFFER_PTR_SET);
    while (evbuffer_peek(body, -1, &at, &v, 1) == 1 && v.iov_len > 0) {
        pcr_prom_feed(r, v.iov_base, v.iov_len);
        if (evbuffer_ptr_set(body, &at, v.iov_len, EVBUFFER_PTR_ADD) != 0)
            break;
    }
    evbuffer_drain(body, evbuffer_get_length(body));
    apply(be, pcr_prom_end(r));
    free(r);
}

static void on_head(void *ctx, int status)
{
    scrape_ctx_t *c = ctx;
    c->status = status;
    pcr_prom_begin(&c->page);
}

/* The probe ends the read at SCRAPE_MAX_BYTES (incomplete: nothing of the page is used). */
static void on_body(void *ctx, const char *data, size_t len)
{
    scrape_ctx_t *c = ctx;
    if (c->status != 200)
        return;
    c->bytes += len;
    pcr_prom_feed(&c->page, data, len);
}

/* Complete: the page is applied. Cut (an error, scrape.timeout_ms: a pod that stalls its page
 * is let go, or a page past SCRAPE_MAX_BYTES): nothing of it is used, as what came may be cut
 * anywhere. */
static void on_end(void *ctx, int complete)
{
    scrape_ctx_t *c = ctx;
    if (complete && c->status == 200)
        apply(c->be, pcr_prom_end(&c->page));
    c->be->scrape_req = NULL;
    c->be->scrape_ctx = NULL;
    free(c);
}

static const pcr_probe_cbs_t scrape_cbs = {on_head, on_body, on_end};

void pcr_scrape_start(pcr_backend_t *be)
{
    if (be->scrape_req != NULL || !PCR_LOAD(be->up))
        return; /* the last one is still running, or the pod is down */
    scrape_ctx_t *c = malloc(sizeof(*c));   /* the reader's carry need not be zeroed */
    if (c == NULL)
        return;
    c->be = be;
    c->status = 0;
    c->bytes = 0;
    pcr_prom_begin(&c->page);
    be->scrape_req = pcr_probe_get(be, "/metrics", "pcrouter-scrape", NULL,
                                   be->srv->cfg->scrape.timeout_ms, SCRAPE_MAX_BYTES, &scrape_cbs, c);
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
    pcr_probe_cancel(be->scrape_req);
    be->scrape_req = NULL;
    free(be->scrape_ctx);
    be->scrape_ctx = NULL;
}
