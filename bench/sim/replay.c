/* bench/sim/replay.c: replays a Mooncake trace through any OpenAI-compatible endpoint.
 *
 * Each row becomes a streaming /v1/completions request (prompt synthesised from its hash_ids,
 * max_tokens = min(output_length, --max-tokens-cap)) sent at timestamp / time_scale, over
 * HTTP/1.1 keep-alive connections (replay_client.c) or h2c streams (--h2c, replay_h2.c). Per
 * request it measures time to first token (first SSE data event), the gaps between the events
 * that carry tokens (inter-token latency, as vLLM's benchmark counts it), time per output
 * token (last token less first, over the tokens after the first), output tokens and end to
 * end; per run, output tokens and requests per second, each with p50, p90, p99 and mean. With
 * --unstreamed F, that fraction of the rows (drawn from the row's index, so every run and
 * router gets the same ones) asks for a whole answer instead ("stream": false), as batch
 * clients do: those count in the hit rate, the shares and end to end, not in TTFT, which a
 * whole answer does not show. With --pods
 * it scrapes every pod's /metrics before and after: delivered hit rate is the difference of
 * vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total, each pod's share comes
 * from vllm:request_success_total. The ceiling is one LRU cache with all pods' capacity
 * (replay_trace.c); with --capacity-schedule a second one follows the pods' schedule.
 * Prints a table; --json writes the same figures for scripts.
 *
 * With --far-pods it also counts the requests, and the bytes (request and response bodies),
 * that crossed zones: those answered by a pod (x-sim-pod) of that list.
 *
 * Times are measured on the wall clock; the "model" figures multiply them by the time scale
 * to read as a real pod's seconds (router and network overhead are scaled up too). */
#include <cjson/cJSON.h>
#include <event2/event.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "pcr/common.h"
#include "replay_client.h"
#include "replay_h2.h"
#include "replay_trace.h"

#define MAX_PODS 256
#define MAX_TARGETS 16      /* --target repeated: requests spread round robin over them */

typedef struct {
    const char *url;
    rc_pool_t *pool;
    const char *path;
    struct evbuffer *body;
    int status, done, err;
    /* parsed */
    double queries, hits, success, blocks;
    double q0, h0, s0;
} pod_t;

typedef struct {
    size_t idx;
    double sent_us, ttft_us, e2e_us;
    double first_tok_us, last_tok_us;   /* the first and last events carrying tokens */
    size_t bytes_out, bytes_in;         /* request body sent, response body received */
    int status, err, got_done, first_seen, stream;
    size_t cached_tokens, completion_tokens;
    char pod[32];
    struct evbuffer *sse;     /* undelivered bytes of the current SSE event */
} req_t;

static struct {
    struct event_base *base;
    rt_trace_t trace;
    req_t *reqs;
    size_t next, inflight, finished, errors, max_inflight;
    double t0_us, end_us;
    double time_scale;
    double unstreamed;        /* fraction of rows sent with "stream": false */
    size_t cap;
    const char *model;
    double timeout_s;
    rc_pool_t *target[MAX_TARGETS];
    rh2_pool_t *target_h2[MAX_TARGETS];   /* --h2c: used instead of target */
    size_t ntargets;
    const char *target_path;
    struct event *send_timer, *progress_timer;
    int progress_tty, progress;
    pod_t pods[MAX_PODS];
    size_t npods, scrapes_left;
    double *itl;              /* every gap between two token events of a stream, wall us */
    size_t nitl, citl;
} g;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* ---- /metrics scraping ---- */

static double label_num(const char *line, const char *label)
{
    const char *p = strstr(line, label);
    return p ? strtod(p + strlen(label), NULL) : 0;
}

/* Sums the samples of the metrics we need over their labels. Prometheus text is one sample
 * per line, "name{labels} value"; comment lines start with '#'. */
static void parse_metrics(pod_t *p, const char *text)
{
    p->queries = p->hits = p->success = p->blocks = 0;
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (*line == '#' || *line == '\n')
            continue;
        const char *eol = strchr(line, '\n');
        size_t ll = eol ? (size_t)(eol - line) : strlen(line);
        const char *sp = memrchr(line, ' ', ll);
        if (!sp)
            continue;
        double v = strtod(sp + 1, NULL);
        size_t nl = strcspn(line, "{ ");
#define IS(name) (nl == sizeof(name) - 1 && !strncmp(line, name, nl))
        if (IS("vllm:prefix_cache_queries_total"))
            p->queries += v;
        else if (IS("vllm:prefix_cache_hits_total"))
            p->hits += v;
        else if (IS("vllm:request_success_total"))
            p->success += v;
        else if (IS("vllm:cache_config_info"))
            p->blocks = label_num(line, "num_gpu_blocks=\"");
#undef IS
    }
}

static void on_scrape_status(void *arg, int status) { ((pod_t *)arg)->status = status; }
static void on_scrape_body(void *arg, const char *d, size_t n) { evbuffer_add(((pod_t *)arg)->body, d, n); }
static void on_scrape_done(void *arg, int err)
{
    pod_t *p = arg;
    p->err = err ? err : (p->status == 200 ? 0 : PCR_ERR_IO);
    p->done = 1;
    if (!p->err) {
        evbuffer_add(p->body, "", 1);
        parse_metrics(p, (const char *)evbuffer_pullup(p->body, -1));
    } else {
        fprintf(stderr, "replay: scraping %s/metrics failed: %s (status %d)\n", p->url,
                pcr_strerror(p->err), p->status);
    }
    evbuffer_drain(p->body, evbuffer_get_length(p->body));
    if (--g.scrapes_left == 0)
        event_base_loopbreak(g.base);
}

static const rc_cb_t scrape_cb = { on_scrape_status, NULL, on_scrape_body, on_scrape_done };

/* Scrapes every pod once, running the loop until all answered. Returns the number failed. */
static int scrape_all(void)
{
    g.scrapes_left = g.npods;
    for (size_t i = 0; i < g.npods; i++) {
        g.pods[i].done = 0;
        g.pods[i].status = 0;
        rc_send(g.pods[i].pool, "GET", "/metrics", NULL, 10, &scrape_cb, &g.pods[i]);
    }
    if (g.scrapes_left)
        event_base_dispatch(g.base);
    int bad = 0;
    for (size_t i = 0; i < g.npods; i++)
        bad += g.pods[i].err != 0;
    return bad;
}

/* ---- the replay ---- */

static void on_req_status(void *arg, int status) { ((req_t *)arg)->status = status; }

static void on_req_pod(void *arg, const char *v, size_t n)
{
    req_t *r = arg;
    snprintf(r->pod, sizeof r->pod, "%.*s", (int)n, v);
}

/* The answer's usage (an SSE event's, or a whole answer's): its completion tokens and cached
 * prompt tokens. Returns whether it had its completion tokens. */
static int take_usage(req_t *r, const cJSON *o)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    const cJSON *det = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details");
    const cJSON *cached = cJSON_GetObjectItemCaseSensitive(det, "cached_tokens");
    if (cJSON_IsNumber(ct))
        r->completion_tokens = (size_t)ct->valuedouble;
    if (cJSON_IsNumber(cached))
        r->cached_tokens = (size_t)cached->valuedouble;
    return cJSON_IsNumber(ct);
}

static void sse_event(req_t *r, const char *ev, size_t n)
{
    if (n < 6 || memcmp(ev, "data:", 5) != 0)
        return;
    const char *d = ev + 5;
    size_t dn = n - 5;
    while (dn && *d == ' ') {
        d++;
        dn--;
    }
    if (!r->first_seen) {
        r->first_seen = 1;
        r->ttft_us = now_us() - r->sent_us;
    }
    if (dn >= 6 && memcmp(d, "[DONE]", 6) == 0) {
        r->got_done = 1;
        return;
    }
    /* An event with choices carries tokens; the usage event's choices are empty. */
    if (!memmem(d, dn, "\"choices\":[]", 12)) {
        double now = now_us();
        if (r->first_tok_us == 0) {
            r->first_tok_us = now;
        } else {
            if (g.nitl == g.citl) {
                size_t nc = g.citl ? g.citl * 2 : 65536;
                double *nv = realloc(g.itl, nc * sizeof(*nv));
                if (nv) {
                    g.itl = nv;
                    g.citl = nc;
                }
            }
            if (g.nitl < g.citl)
                g.itl[g.nitl++] = now - r->last_tok_us;
        }
        r->last_tok_us = now;
    }
    if (memmem(d, dn, "\"usage\"", 7)) {
        cJSON *o = cJSON_ParseWithLength(d, dn);
        take_usage(r, o);
        cJSON_Delete(o);
    }
}

/* A whole answer's usage, at its end; 0 when it is a complete JSON completion. */
static int whole_answer(req_t *r)
{
    size_t n = evbuffer_get_length(r->sse);
    cJSON *o = cJSON_ParseWithLength((const char *)evbuffer_pullup(r->sse, -1), n);
    int ok = cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "choices")) && take_usage(r, o);
    cJSON_Delete(o);
    return ok ? 0 : -1;
}

/* A whole answer is kept until its end, up to this much. */
#define MAX_WHOLE_ANSWER (64u << 20)

static void on_req_body(void *arg, const char *d, size_t n)
{
    req_t *r = arg;
    r->bytes_in += n;
    if (r->status != 200)
        return;
    if (!r->stream) {
        if (evbuffer_get_length(r->sse) + n <= MAX_WHOLE_ANSWER)
            evbuffer_add(r->sse, d, n);
        return;
    }
    evbuffer_add(r->sse, d, n);
    for (;;) {
        struct evbuffer_ptr p = evbuffer_search(r->sse, "\n\n", 2, NULL);
        if (p.pos < 0)
            break;
        size_t len = (size_t)p.pos;
        sse_event(r, (const char *)evbuffer_pullup(r->sse, (ssize_t)len), len);
        evbuffer_drain(r->sse, len + 2);
    }
}

static void on_req_done(void *arg, int err)
{
    req_t *r = arg;
    r->e2e_us = now_us() - r->sent_us;
    if (!err && r->status != 200)
        err = PCR_ERR_IO;
    if (!err && !r->stream)
        r->got_done = whole_answer(r) == 0;
    if (!err && !r->got_done)
        err = PCR_ERR_PARSE;   /* the stream ended without [DONE] */
    r->err = err;
    if (r->err)
        g.errors++;
    if (r->sse)
        evbuffer_free(r->sse);
    r->sse = NULL;
    g.inflight--;
    g.finished++;
    if (g.finished == g.trace.n) {
        g.end_us = now_us();
        event_base_loopbreak(g.base);
    }
}

static const rc_cb_t req_cb = { on_req_status, on_req_pod, on_req_body, on_req_done };

static void free_prompt(const void *data, size_t len, void *arg)
{
    free((void *)data);
}

static void send_one(size_t i)
{
    req_t *r = &g.reqs[i];
    const rt_row_t *row = &g.trace.rows[i];
    size_t plen;
    char *prompt = rt_prompt(&g.trace, i, &plen);
    struct evbuffer *body = evbuffer_new();
    r->idx = i;
    r->sse = evbuffer_new();
    r->sent_us = now_us();
    g.inflight++;
    if (g.inflight > g.max_inflight)
        g.max_inflight = g.inflight;
    if (!prompt || !body || !r->sse) {
        free(prompt);
        if (body)
            evbuffer_free(body);
        on_req_done(r, PCR_ERR_NOMEM);
        return;
    }
    size_t mt = row->output_length < g.cap ? row->output_length : g.cap;
    if (mt < 1)
        mt = 1;
    /* The prompt is lowercase words and spaces (synth.c): it needs no JSON escaping. */
    evbuffer_add_printf(body, "{\"model\":\"%s\",\"prompt\":\"", g.model);
    evbuffer_add_reference(body, prompt, plen, free_prompt, NULL);
    r->stream = !rt_unstreamed(i, g.unstreamed);
    if (r->stream)
        evbuffer_add_printf(body, "\",\"max_tokens\":%zu,\"stream\":true,"
                            "\"stream_options\":{\"include_usage\":true}}", mt);
    else
        evbuffer_add_printf(body, "\",\"max_tokens\":%zu,\"stream\":false}", mt);
    r->bytes_out = evbuffer_get_length(body);
    size_t t = i % g.ntargets;   /* row i to target i mod n: the replicas behind a Service */
    if (g.target_h2[t])
        rh2_send(g.target_h2[t], g.target_path, body, g.timeout_s, &req_cb, r);
    else
        rc_send(g.target[t], "POST", g.target_path, body, g.timeout_s, &req_cb, r);
    evbuffer_free(body);
}

static void schedule_next(void);

static void on_send_timer(evutil_socket_t fd, short what, void *arg)
{
    double now = now_us() - g.t0_us;
    while (g.next < g.trace.n &&
           g.trace.rows[g.next].timestamp_ms * 1000.0 / g.time_scale <= now + 100)
        send_one(g.next++);
    schedule_next();
}

static void schedule_next(void)
{
    if (g.next >= g.trace.n)
        return;
    double at = g.trace.rows[g.next].timestamp_ms * 1000.0 / g.time_scale;
    double d = at - (now_us() - g.t0_us);
    if (d < 0)
        d = 0;
    struct timeval tv = { (time_t)(d / 1e6), (suseconds_t)fmod(d, 1e6) };
    evtimer_add(g.send_timer, &tv);
}

static void on_progress(evutil_socket_t fd, short what, void *arg)
{
    size_t n = g.trace.n, done = g.finished;
    int width = 30, fill = n ? (int)((double)done * width / n) : width;
    char bar[64];
    memset(bar, '#', fill);
    memset(bar + fill, '.', width - fill);
    bar[width] = 0;
    fprintf(stderr, "%s[%s] %zu/%zu done, %zu in flight, %zu errors, %.1fs%s",
            g.progress_tty ? "\r" : "", bar, done, n, g.inflight, g.errors,
            (now_us() - g.t0_us) / 1e6, g.progress_tty ? "" : "\n");
}

/* ---- the report ---- */

/* Is `name` one of the comma-separated names of `list`? */
static int in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t k = strcspn(p, ",");
        if (k == n && strncmp(p, name, n) == 0)
            return 1;
        p += k;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* {p50, p90, p99, mean} of v[0..n) (sorted), each times f, as object `name` of j. */
static void add_stats(cJSON *j, const char *name, const double *v, size_t n, double f)
{
    cJSON *s = cJSON_AddObjectToObject(j, name);
    if (!n)
        return;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    cJSON_AddNumberToObject(s, "p50", rt_percentile(v, n, 50) * f);
    cJSON_AddNumberToObject(s, "p90", rt_percentile(v, n, 90) * f);
    cJSON_AddNumberToObject(s, "p99", rt_percentile(v, n, 99) * f);
    cJSON_AddNumberToObject(s, "mean", sum / (double)n * f);
}

static double mean(const double *v, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    return n ? sum / (double)n : NAN;
}

static void usage(FILE *f)
{
    fprintf(f,
"usage: replay --trace FILE --target URL [options]\n"
"  --trace FILE          Mooncake JSONL trace\n"
"  --target URL          http://host:port[/path] (path default /v1/completions); repeated,\n"
"                        rows go to the targets round robin (several router replicas)\n"
"  --time-scale F        send at timestamp / F (default 1)\n"
"  --limit N             first N rows only (default all)\n"
"  --skip N              skip the first N rows (default 0)\n"
"  --max-tokens-cap N    max_tokens = min(output_length, N) (default 4096)\n"
"  --max-input-tokens N  cut longer prompts to N tokens, keeping their prefix (default: no cut)\n"
"  --model NAME          \"model\" of every request (default sim-8b)\n"
"  --pods URL,URL,...    pods whose /metrics give hit rate and shares\n"
"  --ceiling-tokens N    ceiling cache size (default: sum of the pods' num_gpu_blocks x 16)\n"
"  --capacity-schedule S:F,...  the pods' (vllm_sim's flag): a second ceiling whose cache\n"
"                        follows it from the first row, what such a pool could at best hit\n"
"  --timeout-s F         per-request timeout, wall clock (default 300)\n"
"  --max-conns N         HTTP/1.1 connections to the target at most (default 4096)\n"
"  --h2c                 send over HTTP/2 cleartext (prior knowledge) instead of HTTP/1.1\n"
"  --h2c-conns N         h2c connections, requests spread over them (default 1)\n"
"  --unstreamed F        this fraction of the rows asks for a whole answer, not a stream\n"
"                        (the same rows every run; not in TTFT) (default 0)\n"
"  --far-pods NAME,...   pods in another zone than the target (by their x-sim-pod name): the\n"
"                        share of requests and of bytes that crossed zones is reported\n"
"  --json FILE           write the summary as JSON\n"
"  --label NAME          name of this run in the table and JSON (default: the target)\n"
"  --no-progress         no progress bar\n");
}

int main(int argc, char **argv)
{
    const char *trace = NULL, *target = NULL, *pods = NULL, *json = NULL, *label = NULL;
    const char *far = NULL;
    const char *targets[MAX_TARGETS];
    size_t limit = 0, skip = 0, max_input = 0;
    double ceiling_tokens = 0;
    pcr_kvcache_phase_t phases[PCR_KV_MAX_PHASES];
    size_t nphases = 0;
    unsigned max_conns = 4096, h2c_conns = 0;
    g.time_scale = 1;
    g.cap = 4096;
    g.model = "sim-8b";
    g.timeout_s = 300;
    g.progress = 1;
    enum { O_TRACE = 256, O_TARGET, O_SCALE, O_LIMIT, O_SKIP, O_CAP, O_MODEL, O_PODS, O_CEIL,
           O_TIMEOUT, O_CONNS, O_JSON, O_LABEL, O_NOPROG, O_HELP, O_MAXIN, O_H2C, O_H2CONNS,
           O_UNSTREAMED, O_FAR, O_CAPSCHED };
    static const struct option opts[] = {
        {"trace", 1, 0, O_TRACE}, {"target", 1, 0, O_TARGET}, {"time-scale", 1, 0, O_SCALE},
        {"limit", 1, 0, O_LIMIT}, {"skip", 1, 0, O_SKIP}, {"max-tokens-cap", 1, 0, O_CAP},
        {"model", 1, 0, O_MODEL}, {"pods", 1, 0, O_PODS}, {"ceiling-tokens", 1, 0, O_CEIL},
        {"timeout-s", 1, 0, O_TIMEOUT}, {"max-conns", 1, 0, O_CONNS}, {"json", 1, 0, O_JSON},
        {"label", 1, 0, O_LABEL}, {"no-progress", 0, 0, O_NOPROG}, {"help", 0, 0, O_HELP},
        {"max-input-tokens", 1, 0, O_MAXIN}, {"h2c", 0, 0, O_H2C},
        {"h2c-conns", 1, 0, O_H2CONNS}, {"unstreamed", 1, 0, O_UNSTREAMED},
        {"far-pods", 1, 0, O_FAR}, {"capacity-schedule", 1, 0, O_CAPSCHED}, {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        double v = optarg ? strtod(optarg, &end) : 0;
        int num_ok = optarg && end != optarg && *end == 0 && v >= 0;
        switch (o) {
        case O_TRACE: trace = optarg; continue;
        case O_TARGET:
            if (g.ntargets == MAX_TARGETS) break;
            targets[g.ntargets++] = target = optarg;
            continue;
        case O_MODEL:
            if (strpbrk(optarg, "\"\\")) break;
            g.model = optarg;
            continue;
        case O_PODS: pods = optarg; continue;
        case O_FAR: far = optarg; continue;
        case O_CAPSCHED:
            if (pcr_kvcache_schedule_parse(optarg, phases, &nphases) != 0) break;
            continue;
        case O_JSON: json = optarg; continue;
        case O_LABEL: label = optarg; continue;
        case O_NOPROG: g.progress = 0; continue;
        case O_HELP: usage(stdout); return 0;
        case O_SCALE: if (!num_ok || v <= 0) break; g.time_scale = v; continue;
        case O_LIMIT: if (!num_ok) break; limit = (size_t)v; continue;
        case O_SKIP: if (!num_ok) break; skip = (size_t)v; continue;
        case O_CAP: if (!num_ok || v < 1) break; g.cap = (size_t)v; continue;
        case O_CEIL: if (!num_ok) break; ceiling_tokens = v; continue;
        case O_TIMEOUT: if (!num_ok || v <= 0) break; g.timeout_s = v; continue;
        case O_CONNS: if (!num_ok || v < 1) break; max_conns = (unsigned)v; continue;
        case O_MAXIN: if (!num_ok || v < 1) break; max_input = (size_t)v; continue;
        case O_H2C: if (!h2c_conns) h2c_conns = 1; continue;
        case O_H2CONNS: if (!num_ok || v < 1) break; h2c_conns = (unsigned)v; continue;
        case O_UNSTREAMED: if (!num_ok || v > 1) break; g.unstreamed = v; continue;
        default: usage(stderr); return 2;
        }
        fprintf(stderr, "replay: bad value for --%s: %s\n", opts[o - O_TRACE].name, optarg);
        return 2;
    }
    if (!trace || !target || optind < argc) {
        usage(stderr);
        return 2;
    }
    if (!label)
        label = targets[0];
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    int rc = 1;
    g.base = event_base_new();
    if (!g.base || rt_trace_load(&g.trace, trace, skip, limit) != 0)
        goto out;
    if (g.trace.n == 0) {
        fprintf(stderr, "replay: no rows in %s\n", trace);
        goto out;
    }
    for (size_t i = 0; max_input && i < g.trace.n; i++) {
        rt_row_t *row = &g.trace.rows[i];
        size_t ids = (max_input + 511) / 512;
        if (row->input_length > max_input)
            row->input_length = max_input;
        if (row->nids > ids)
            row->nids = ids;
    }
    for (size_t t = 0; t < g.ntargets; t++) {
        const char *path = NULL;
        if (h2c_conns)
            g.target_h2[t] = rh2_pool_new(g.base, targets[t], h2c_conns, &path);
        else
            g.target[t] = rc_pool_new(g.base, targets[t], max_conns, &path);
        if (!g.target[t] && !g.target_h2[t])
            goto out;
        if (t == 0)
            g.target_path = path;
    }
    if (strcmp(g.target_path, "/") == 0)
        g.target_path = "/v1/completions";
    if (pods) {
        char *list = strdup(pods), *save = NULL;
        for (char *u = strtok_r(list, ",", &save); u; u = strtok_r(NULL, ",", &save)) {
            if (g.npods == MAX_PODS)
                break;
            pod_t *p = &g.pods[g.npods];
            p->url = strdup(u);
            p->body = evbuffer_new();
            p->pool = rc_pool_new(g.base, u, 2, &p->path);
            if (!p->pool) {
                free(list);
                goto out;
            }
            g.npods++;
        }
        free(list);
        if (scrape_all()) {
            fprintf(stderr, "replay: cannot read every pod's /metrics before the run\n");
            goto out;
        }
        for (size_t i = 0; i < g.npods; i++) {
            g.pods[i].q0 = g.pods[i].queries;
            g.pods[i].h0 = g.pods[i].hits;
            g.pods[i].s0 = g.pods[i].success;
        }
        if (ceiling_tokens == 0)
            for (size_t i = 0; i < g.npods; i++)
                ceiling_tokens += g.pods[i].blocks * 16;
    }
    double ceiling = NAN, ceiling_sched = NAN;
    uint64_t ch = 0, cq = 0;
    if (ceiling_tokens >= 16) {
        ceiling = rt_ceiling(&g.trace, (uint64_t)ceiling_tokens, NULL, 0, &ch, &cq);
        if (ceiling < 0)
            ceiling = NAN;
        if (nphases > 0) {
            ceiling_sched = rt_ceiling(&g.trace, (uint64_t)ceiling_tokens, phases, nphases,
                                       &ch, &cq);
            if (ceiling_sched < 0)
                ceiling_sched = NAN;
        }
    }

    g.reqs = calloc(g.trace.n, sizeof(req_t));
    g.send_timer = evtimer_new(g.base, on_send_timer, NULL);
    g.progress_tty = isatty(2);
    g.progress_timer = event_new(g.base, -1, EV_PERSIST, on_progress, NULL);
    if (!g.reqs || !g.send_timer || !g.progress_timer)
        goto out;
    if (g.progress) {
        struct timeval ptv = { g.progress_tty ? 0 : 5, g.progress_tty ? 250000 : 0 };
        event_add(g.progress_timer, &ptv);
    }
    g.t0_us = now_us() - g.trace.rows[0].timestamp_ms * 1000.0 / g.time_scale;
    double start_us = now_us();
    schedule_next();
    event_base_dispatch(g.base);
    event_del(g.progress_timer);
    if (g.progress) {
        on_progress(-1, 0, NULL);
        if (g.progress_tty)
            fputc('\n', stderr);
    }
    double wall_s = (g.end_us - start_us) / 1e6;

    int scrape_failed = g.npods ? scrape_all() : 0;

    /* Figures. */
    size_t n = g.trace.n, ok = 0, nt = 0;
    double *ttft = malloc(n * sizeof(double)), *e2e = malloc(n * sizeof(double));
    double *tpot = malloc(n * sizeof(double)), *outtok = malloc(n * sizeof(double));
    size_t ntpot = 0, far_n = 0;
    double bytes_all = 0, bytes_far = 0;
    double cached = 0, prompt = 0, out_tokens = 0;
    size_t e_timeout = 0, e_io = 0, e_http = 0, e_stream = 0;
    for (size_t i = 0; i < n; i++) {
        req_t *r = &g.reqs[i];
        if (r->err) {
            if (r->err == PCR_ERR_TIMEOUT) e_timeout++;
            else if (r->status && r->status != 200) e_http++;
            else if (r->status == 200) e_stream++;   /* the stream broke before [DONE] */
            else e_io++;
            continue;
        }
        if (r->stream)
            ttft[nt++] = r->ttft_us / 1000.0;
        if (r->stream && r->completion_tokens > 1 && r->last_tok_us > r->first_tok_us)
            tpot[ntpot++] = (r->last_tok_us - r->first_tok_us) / 1000.0 /
                            (double)(r->completion_tokens - 1);
        outtok[ok] = (double)r->completion_tokens;
        out_tokens += (double)r->completion_tokens;
        e2e[ok] = r->e2e_us / 1000.0;
        ok++;
        bytes_all += (double)(r->bytes_out + r->bytes_in);
        if (far && r->pod[0] && in_list(far, r->pod)) {
            far_n++;
            bytes_far += (double)(r->bytes_out + r->bytes_in);
        }
        cached += r->cached_tokens;
        prompt += g.trace.rows[i].input_length;
    }
    rt_sort(ttft, nt);
    rt_sort(e2e, ok);
    rt_sort(tpot, ntpot);
    rt_sort(outtok, ok);
    rt_sort(g.itl, g.nitl);
    double dq = 0, dh = 0, ds = 0, smax = 0;
    size_t share_pods = 0;
    for (size_t i = 0; i < g.npods; i++) {
        pod_t *p = &g.pods[i];
        dq += p->queries - p->q0;
        dh += p->hits - p->h0;
        double s = p->success - p->s0;
        ds += s;
        if (s > smax)
            smax = s;
    }
    if (!g.npods) {
        /* No metrics: count the x-sim-pod headers the responses carried. */
        char names[MAX_PODS][32];
        double cnt[MAX_PODS];
        size_t np = 0;
        for (size_t i = 0; i < n; i++) {
            if (g.reqs[i].err || !g.reqs[i].pod[0])
                continue;
            size_t k = 0;
            while (k < np && strcmp(names[k], g.reqs[i].pod) != 0)
                k++;
            if (k == np) {
                if (np == MAX_PODS)
                    continue;
                snprintf(names[np], sizeof names[np], "%s", g.reqs[i].pod);
                cnt[np++] = 0;
            }
            cnt[k]++;
            ds++;
            if (cnt[k] > smax)
                smax = cnt[k];
        }
        share_pods = np;
    }
    double hit = g.npods && dq > 0 && !scrape_failed ? dh / dq : NAN;
    size_t npods_share = g.npods ? g.npods : share_pods;
    double share = npods_share && ds > 0 ? smax / (ds / npods_share) : NAN;
    double rps = wall_s > 0 ? ok / wall_s : 0;
    double tps = wall_s > 0 ? out_tokens / wall_s : 0;
    double sc = g.time_scale;

    printf("replay %s: %zu requests, %zu ok, %zu errors (timeout %zu, http %zu, dropped %zu, "
           "connection %zu), %.1f s wall, time scale %g\n", label, n, ok, g.errors, e_timeout,
           e_http, e_stream, e_io, wall_s, sc);
    printf("  hit rate %.4f (pods' counters)   ceiling %.4f   fraction of ceiling %.3f   "
           "client-seen %.4f\n",
           hit, ceiling, hit / ceiling, prompt > 0 ? cached / prompt : NAN);
    if (nphases > 0)
        printf("  scheduled ceiling %.4f (the cache follows --capacity-schedule)   fraction %.3f\n",
               ceiling_sched, hit / ceiling_sched);
    printf("  TTFT model ms p50 %.0f  p90 %.0f  p99 %.0f   (wall ms p50 %.1f p99 %.1f)\n",
           rt_percentile(ttft, nt, 50) * sc, rt_percentile(ttft, nt, 90) * sc,
           rt_percentile(ttft, nt, 99) * sc, rt_percentile(ttft, nt, 50),
           rt_percentile(ttft, nt, 99));
    printf("  e2e model s p50 %.2f  p99 %.2f   max/mean share %.3f   %.1f req/s wall "
           "(%.2f req/s model)   peak in flight %zu\n", rt_percentile(e2e, ok, 50) * sc / 1000,
           rt_percentile(e2e, ok, 99) * sc / 1000, share, rps, rps / sc, g.max_inflight);
    if (far)
        printf("  crossed zones: %.3f of requests, %.3f of bytes\n",
               ok ? (double)far_n / (double)ok : NAN, bytes_all > 0 ? bytes_far / bytes_all : NAN);
    printf("  ITL model ms p50 %.1f  p90 %.1f  p99 %.1f  mean %.1f   TPOT mean %.1f   TTFT mean "
           "%.0f   output %.0f tokens/s model\n", rt_percentile(g.itl, g.nitl, 50) / 1000 * sc,
           rt_percentile(g.itl, g.nitl, 90) / 1000 * sc,
           rt_percentile(g.itl, g.nitl, 99) / 1000 * sc, mean(g.itl, g.nitl) / 1000 * sc,
           mean(tpot, ntpot) * sc, mean(ttft, nt) * sc, tps / sc);

    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "label", label);
        cJSON_AddStringToObject(j, "target", targets[0]);
        cJSON_AddNumberToObject(j, "targets", (double)g.ntargets);
        cJSON_AddStringToObject(j, "trace", trace);
        cJSON_AddNumberToObject(j, "time_scale", sc);
        cJSON_AddNumberToObject(j, "requests", (double)n);
        cJSON_AddNumberToObject(j, "completed", (double)ok);
        cJSON_AddNumberToObject(j, "completed_streams", (double)nt);
        cJSON_AddNumberToObject(j, "unstreamed_fraction", g.unstreamed);
        cJSON_AddNumberToObject(j, "errors", (double)g.errors);
        cJSON *ek = cJSON_AddObjectToObject(j, "error_kinds");
        cJSON_AddNumberToObject(ek, "timeout", (double)e_timeout);
        cJSON_AddNumberToObject(ek, "http", (double)e_http);
        cJSON_AddNumberToObject(ek, "dropped", (double)e_stream);
        cJSON_AddNumberToObject(ek, "connection", (double)e_io);
        cJSON_AddNumberToObject(j, "wall_s", wall_s);
        cJSON_AddNumberToObject(j, "throughput_rps_wall", rps);
        cJSON_AddNumberToObject(j, "throughput_rps_model", rps / sc);
        cJSON_AddNumberToObject(j, "peak_in_flight", (double)g.max_inflight);
        if (!isnan(hit)) cJSON_AddNumberToObject(j, "hit_rate", hit);
        else cJSON_AddNullToObject(j, "hit_rate");
        cJSON_AddNumberToObject(j, "prefix_queries_tokens", dq);
        cJSON_AddNumberToObject(j, "prefix_hits_tokens", dh);
        cJSON_AddNumberToObject(j, "client_cached_rate", prompt > 0 ? cached / prompt : 0);
        if (!isnan(ceiling)) {
            cJSON_AddNumberToObject(j, "ceiling", ceiling);
            cJSON_AddNumberToObject(j, "ceiling_capacity_tokens", ceiling_tokens);
            if (!isnan(hit)) cJSON_AddNumberToObject(j, "fraction_of_ceiling", hit / ceiling);
        }
        if (!isnan(ceiling_sched)) {
            cJSON_AddNumberToObject(j, "ceiling_scheduled", ceiling_sched);
            if (!isnan(hit))
                cJSON_AddNumberToObject(j, "fraction_of_scheduled_ceiling", hit / ceiling_sched);
        }
        if (!isnan(share)) cJSON_AddNumberToObject(j, "share_max_over_mean", share);
        else cJSON_AddNullToObject(j, "share_max_over_mean");
        cJSON *pa = cJSON_AddArrayToObject(j, "pods");
        for (size_t i = 0; i < g.npods; i++) {
            cJSON *po = cJSON_CreateObject();
            cJSON_AddStringToObject(po, "url", g.pods[i].url);
            cJSON_AddNumberToObject(po, "requests", g.pods[i].success - g.pods[i].s0);
            cJSON_AddNumberToObject(po, "queries", g.pods[i].queries - g.pods[i].q0);
            cJSON_AddNumberToObject(po, "hits", g.pods[i].hits - g.pods[i].h0);
            cJSON_AddItemToArray(pa, po);
        }
        add_stats(j, "ttft_ms_wall", ttft, nt, 1);
        add_stats(j, "ttft_ms_model", ttft, nt, sc);
        add_stats(j, "e2e_ms_model", e2e, ok, sc);
        add_stats(j, "itl_ms_model", g.itl, g.nitl, sc / 1000);
        cJSON_AddNumberToObject(j, "itl_gaps", (double)g.nitl);
        add_stats(j, "tpot_ms_model", tpot, ntpot, sc);
        add_stats(j, "output_tokens", outtok, ok, 1);
        cJSON_AddNumberToObject(j, "output_tokens_total", out_tokens);
        cJSON_AddNumberToObject(j, "output_tokens_per_s_model", tps / sc);
        cJSON_AddNumberToObject(j, "requests_per_s_model", rps / sc);
        cJSON_AddNumberToObject(j, "body_bytes", bytes_all);
        if (far) {
            cJSON_AddNumberToObject(j, "cross_zone_requests", (double)far_n);
            cJSON_AddNumberToObject(j, "cross_zone_request_share",
                                    ok ? (double)far_n / (double)ok : 0);
            cJSON_AddNumberToObject(j, "cross_zone_byte_share",
                                    bytes_all > 0 ? bytes_far / bytes_all : 0);
        }
        cJSON *all = cJSON_AddArrayToObject(j, "ttft_ms_model_sorted");
        for (size_t i = 0; i < nt; i++)
            cJSON_AddItemToArray(all, cJSON_CreateNumber(round(ttft[i] * sc * 10) / 10));
        char *text = cJSON_Print(j);
        FILE *f = fopen(json, "w");
        int werr = !f || !text || fputs(text, f) < 0;
        if ((f && fclose(f) != 0) || werr)
            fprintf(stderr, "replay: cannot write %s\n", json);
        cJSON_free(text);
        cJSON_Delete(j);
    }
    free(ttft);
    free(e2e);
    free(tpot);
    free(outtok);
    free(g.itl);
    rc = scrape_failed || ok == 0 ? 1 : 0;   /* a run where nothing completed is a failure */
out:
    for (size_t t = 0; t < g.ntargets; t++) {
        rc_pool_free(g.target[t]);
        rh2_pool_free(g.target_h2[t]);
    }
    for (size_t i = 0; i < g.npods; i++) {
        rc_pool_free(g.pods[i].pool);
        if (g.pods[i].body)
            evbuffer_free(g.pods[i].body);
        free((char *)g.pods[i].url);
    }
    if (g.reqs)
        for (size_t i = 0; i < g.trace.n; i++)
            if (g.reqs[i].sse)
                evbuffer_free(g.reqs[i].sse);
    free(g.reqs);
    if (g.send_timer) event_free(g.send_timer);
    if (g.progress_timer) event_free(g.progress_timer);
    rt_trace_dispose(&g.trace);
    if (g.base) event_base_free(g.base);
    return rc;
}
