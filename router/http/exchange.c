/* router/http/exchange.c: owns one request/response pair from routing to the last byte, and the
 * request state machine (exchange_int.h) with the accounting tied to it.
 *
 *   run -> route by path (the worker's route table, routes.c) -> local endpoint
 *                        -> proxy: parse body -> key -> policy decision -> upstream
 *   upstream head/body/end -> session ops (streamed as they come, paused above a watermark)
 *   upstream failure before anything reached the client -> forget the speculative index
 *   entry, try another backend (upstream.retries times), else 502/503/504
 *
 * Every state change goes through ex_to(): it alone moves the in-flight counts, charges and
 * releases the backend's queued prefill, and records the final status, durations and the access
 * log line, so that no path can count a request twice or not at all. The one release outside
 * it is an unstreamed completion's prefill at its expected first token (on_up_prefill_due),
 * which zeroes ex->prefill so that ex_to's later release is of nothing.
 *
 * The exchange never frees itself: the session that owns it does, after send_end or when the
 * client goes away (pcr_exchange_free cancels the upstream request then). */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>
#include <http_parser.h>

#include "budget.h"
#include "bus.h"
#include "exchange_int.h"
#include "http1.h"
#include "pools.h"
#include "log.h"

static const pcr_upstream_cbs_t proxy_cbs;

/* Spare exchanges: an exchange is 3.7 KiB (its header offsets), past malloc's per-thread
 * caches, with a body buffer, a path and a header buffer of its own, all made and freed per
 * request. Freed ones wait on their thread's list with those buffers, empty, and the next
 * exchange is one of them, cleared. Up to SPARE_MAX, as many as a few HTTP/2 clients keep in
 * flight (at most about 0.5 MiB per worker). */
#define SPARE_MAX 128

static __thread pcr_spare_t spare;

static void exchange_destroy(pcr_exchange_t *ex)
{
    free(ex->path_buf);
    free(ex->hbuf);
    if (ex->body)
        evbuffer_free(ex->body);
    free(ex);
}

void pcr_exchange_cache_clear(void)
{
    pcr_spare_link_t *link;
    while ((link = pcr_spare_take(&spare)) != NULL)
        exchange_destroy(PCR_SPARE_OBJ(link, pcr_exchange_t, spare));
}

static pcr_exchange_t *exchange_alloc(void)
{
    pcr_spare_link_t *link = pcr_spare_take(&spare);
    if (link == NULL)
        return calloc(1, sizeof(pcr_exchange_t));
    pcr_exchange_t *ex = PCR_SPARE_OBJ(link, pcr_exchange_t, spare);
    struct evbuffer *body = ex->body;
    char *path_buf = ex->path_buf, *hbuf = ex->hbuf;
    size_t path_cap = ex->path_cap, hcap = ex->hcap;
    memset(ex, 0, offsetof(pcr_exchange_t, hoff));
    ex->body = body;
    ex->path_buf = path_buf;
    ex->path_cap = path_cap;
    ex->hbuf = hbuf;
    ex->hcap = hcap;
    return ex;
}

pcr_exchange_t *pcr_exchange_new(pcr_worker_t *w, const pcr_exchange_ops_t *ops, void *sess,
                                 const char *proto)
{
    pcr_exchange_t *ex = exchange_alloc();
    if (ex == NULL)
        return NULL;
    ex->w = w;
    ex->ops = ops;
    ex->sess = sess;
    ex->proto = proto;
    ex->state = EX_RECEIVING;
    if (ex->body == NULL)
        ex->body = evbuffer_new();
    if (ex->body == NULL) {
        pcr_exchange_free(ex);
        return NULL;
    }
    ex->t_start = pcr_now_us();
    ex->delivered = -1;
    return ex;
}

void *pcr_exchange_session(const pcr_exchange_t *ex) { return ex->sess; }

int pcr_exchange_responded(const pcr_exchange_t *ex) { return ex->t_head != 0; }

int pcr_exchange_finished(const pcr_exchange_t *ex)
{
    return ex->state == EX_DONE || ex->state == EX_ABORTED;
}

int pcr_exchange_running(const pcr_exchange_t *ex) { return ex->state != EX_RECEIVING; }

size_t pcr_exchange_body_bytes(const pcr_exchange_t *ex) { return ex->body_counted; }

/* ---- the state machine --------------------------------------------------------------- */

static int holds_backend(pcr_ex_state_t s)
{
    return s == EX_UP_WAIT || s == EX_UP_HEAD || s == EX_UP_BODY;
}

static int holds_prefill(pcr_ex_state_t s) { return s == EX_UP_WAIT || s == EX_UP_HEAD; }

/* The request's outcome, once: status counters, durations, the access log line. */
static void record(pcr_exchange_t *ex, int status, int via_backend)
{
    pcr_metrics_t *m = &ex->w->metrics;
    pcr_metrics_count_status(m->requests_by_code, status);
    if (via_backend && ex->be != NULL)
        pcr_metrics_count_status_shared(ex->be->requests_by_code, status);
    uint64_t now = pcr_now_us();
    pcr_hist_observe(&m->duration, &pcr_hist_latency_us, (int64_t)(now - ex->t_start));
    if (ex->t_head)
        pcr_hist_observe(&m->ttfb, &pcr_hist_latency_us, (int64_t)(ex->t_head - ex->t_start));
    if (ex->t_first)
        pcr_hist_observe(&m->ttft, &pcr_hist_latency_us, (int64_t)(ex->t_first - ex->t_start));
    pcr_access_record(ex, status, now);
}

/* Publishes the worker's oldest pending commit to `be` for the other threads. */
static void pending_publish(pcr_pending_t *pd)
{
    const pcr_exchange_t *head = TAILQ_FIRST(&pd->list);
    PCR_STORE(pd->since, head != NULL ? head->t_commit : UINT64_MAX);
}

/* A request whose prefix was committed to its backend is sent: until its first token the pod
 * may not hold that prefix (pcr_backend_settled_before). Kept in commit order. */
static void pending_join(pcr_exchange_t *ex)
{
    if (!ex->committed || ex->pending)
        return;
    pcr_pending_t *pd = &ex->be->pending[ex->w->id];
    pcr_exchange_t *after = TAILQ_LAST(&pd->list, pcr_pending_list);
    while (after != NULL && after->t_commit > ex->t_commit)
        after = TAILQ_PREV(after, pcr_pending_list, pend_link);
    if (after != NULL)
        TAILQ_INSERT_AFTER(&pd->list, after, ex, pend_link);
    else
        TAILQ_INSERT_HEAD(&pd->list, ex, pend_link);
    ex->pending = 1;
    pending_publish(pd);
}

static void pending_leave(pcr_exchange_t *ex)
{
    if (!ex->pending)
        return;
    pcr_pending_t *pd = &ex->be->pending[ex->w->id];
    TAILQ_REMOVE(&pd->list, ex, pend_link);
    ex->pending = 0;
    pending_publish(pd);
}

/* The one place a request changes state; see the table in exchange_int.h. */
static void ex_to(pcr_exchange_t *ex, pcr_ex_state_t to)
{
    pcr_ex_state_t from = ex->state;
    pcr_worker_t *w = ex->w;
    pcr_backend_t *be = ex->be;
    if (from == to)
        return;
    if (from == EX_RECEIVING)
        PCR_INC(w->inflight);
    if (holds_prefill(from) && !holds_prefill(to)) {
        PCR_SUB(be->queued_prefill, ex->prefill);
        pending_leave(ex);
    }
    if (holds_backend(from) && !holds_backend(to))
        PCR_SUB(be->inflight, 1);
    if (!holds_backend(from) && holds_backend(to))
        PCR_ADD(be->inflight, 1);
    if (!holds_prefill(from) && holds_prefill(to)) {
        PCR_ADD(be->queued_prefill, ex->prefill);
        pending_join(ex);
    }
    ex->state = to;
    if (to == EX_ABORTED)
        PCR_INC(w->metrics.responses_aborted);
    if (to == EX_DONE || to == EX_ABORTED || to == EX_GONE)
        record(ex, ex->status, to != EX_GONE && holds_backend(from));
}

/* ---- the request --------------------------------------------------------------------- */

int pcr_exchange_set_method(pcr_exchange_t *ex, const char *method, size_t len)
{
    if (len >= sizeof(ex->method))
        return PCR_ERR_INVAL;
    memcpy(ex->method, method, len);
    ex->method[len] = '\0';
    return 0;
}

int pcr_exchange_set_path(pcr_exchange_t *ex, const char *path, size_t len)
{
    if (len + 1 > ex->path_cap) {
        size_t cap = len + 1 > 128 ? len + 1 : 128;
        char *p = realloc(ex->path_buf, cap);
        if (p == NULL)
            return PCR_ERR_NOMEM;
        ex->path_buf = p;
        ex->path_cap = cap;
    }
    memcpy(ex->path_buf, path, len);
    ex->path_buf[len] = '\0';
    ex->path = ex->path_buf;
    return 0;
}

void pcr_exchange_set_client(pcr_exchange_t *ex, const char *peer, int admin, unsigned *pod_busy)
{
    if (peer == NULL)
        peer = "-";
    size_t n = strnlen(peer, sizeof(ex->peer) - 1);
    memcpy(ex->peer, peer, n);
    ex->peer[n] = '\0';
    ex->admin = admin;
    ex->pod_busy = pod_busy;
}

static int hbuf_put(pcr_exchange_t *ex, const char *s, size_t len)
{
    if (ex->hlen + len > ex->hcap) {
        size_t ncap = ex->hcap ? ex->hcap * 2 : 512;
        while (ncap < ex->hlen + len)
            ncap *= 2;
        char *nb = realloc(ex->hbuf, ncap);
        if (nb == NULL)
            return PCR_ERR_NOMEM;
        ex->hbuf = nb;
        ex->hcap = ncap;
    }
    ex->hoff[ex->nh] = ex->hlen;
    ex->hsz[ex->nh] = len;
    memcpy(ex->hbuf + ex->hlen, s, len);
    ex->hlen += len;
    ex->nh++;
    return 0;
}

int pcr_exchange_add_header(pcr_exchange_t *ex, const char *name, size_t nlen, const char *value,
                            size_t vlen)
{
    if (!pcr_http_token_valid(name, nlen) || !pcr_http_value_valid(value, vlen))
        return PCR_ERR_INVAL;
    if (ex->nh + 2 > PCR_MAX_REQ_HEADERS * 2)
        return PCR_ERR_TOO_LARGE;
    if (hbuf_put(ex, name, nlen) < 0 || hbuf_put(ex, value, vlen) < 0)
        return PCR_ERR_NOMEM;
    return 0;
}

static const pcr_route_t *route_find(const pcr_exchange_t *ex);

/* The routed paths (a prompt to hash): which API, or -1. */
static int routed_api(const pcr_exchange_t *ex)
{
    if (strcmp(ex->method, "POST") != 0)
        return -1;
    const pcr_route_t *rt = route_find(ex);
    return rt != NULL && rt->kind == PCR_ROUTE_PROMPT ? rt->api : -1;
}

static int body_reader_start(pcr_exchange_t *ex)
{
    /* The defaults are zeros but for the two sizes, which the config gives (and the policy
     * defaults' whole struct, pcr_body_opts_default, is not filled per request). */
    pcr_body_opts_t o;
    memset(&o, 0, sizeof(o));
    o.block_bytes = ex->w->cfg->routing.block_bytes;
    o.max_prefix_bytes = ex->w->cfg->routing.max_prefix_bytes;
    ex->reader = pcr_body_reader_new((pcr_api_t)routed_api(ex), &o);
    return ex->reader != NULL ? 0 : PCR_ERR_NOMEM;
}

int pcr_exchange_see_body(pcr_exchange_t *ex, const char *data, size_t len)
{
    if (ex->body_counted + len > ex->w->cfg->limits.max_body_bytes)
        return PCR_ERR_TOO_LARGE;
    /* A routed request's body is parsed and its prompt hashed as it arrives, so the decision
     * after the last byte does not wait for the whole prompt (router/body/body.h). A body found bad
     * here still arrives whole; the reader says why when the request runs. */
    if (routed_api(ex) >= 0) {
        uint64_t t0 = pcr_now_ns();
        if (ex->reader == NULL && body_reader_start(ex) < 0)
            return PCR_ERR_NOMEM;
        pcr_body_reader_feed(ex->reader, data, len);
        ex->ns_parse += pcr_now_ns() - t0;
    }
    ex->body_counted += len;
    pcr_budget_account(ex->w, (ptrdiff_t)len);
    return 0;
}

struct evbuffer *pcr_exchange_body(pcr_exchange_t *ex) { return ex->body; }

int pcr_exchange_take_body(pcr_exchange_t *ex, struct evbuffer *src, size_t len)
{
    return evbuffer_remove_buffer(src, ex->body, len) == (int)len ? 0 : PCR_ERR_NOMEM;
}

int pcr_exchange_add_body(pcr_exchange_t *ex, const char *data, size_t len)
{
    int rc = pcr_exchange_see_body(ex, data, len);
    if (rc != 0)
        return rc;
    return evbuffer_add(ex->body, data, len) == 0 ? 0 : PCR_ERR_NOMEM;
}

/* ---- answering ----------------------------------------------------------------------- */

static void respond_head(pcr_exchange_t *ex, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    ex->status = status;
    ex->t_head = pcr_now_us();
    ex->ops->send_head(ex, status, h, n, clen);
}

static void respond_body(pcr_exchange_t *ex, const char *data, size_t len)
{
    ex->resp_bytes += len;
    ex->ops->send_body(ex, data, len);
}

void pcr_exchange_reply(pcr_exchange_t *ex, int status, const char *content_type, const char *body,
                        size_t len, const pcr_hdr_t *extra, size_t nextra)
{
    if (pcr_exchange_responded(ex) || holds_backend(ex->state))
        return;
    ex_to(ex, EX_LOCAL);
    pcr_hdr_t h[8];
    size_t n = 0;
    h[n++] = (pcr_hdr_t){"content-type", 12, content_type, strlen(content_type)};
    for (size_t i = 0; i < nextra && n < PCR_ARRAY_SIZE(h); i++)
        h[n++] = extra[i];
    respond_head(ex, status, h, n, (int64_t)len);
    if (len > 0)
        respond_body(ex, body, len);
    ex_to(ex, EX_DONE);
    ex->ops->send_end(ex);
}

/* The OpenAI-style error body; cJSON writes the message with every escape JSON needs. */
static void error_reply(pcr_exchange_t *ex, int status, const char *type, const char *code,
                        const char *msg)
{
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", msg);
    cJSON_AddStringToObject(err, "type", type);
    cJSON_AddStringToObject(err, "code", code);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    static const char fallback[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":\"internal\"}}";
    const char *body = text ? text : fallback;
    pcr_hdr_t extra[1];
    size_t nextra = 0;
    if (status == 405 && ex->route != NULL) {
        const char *allow = ex->route->method; /* the route that refused the method */
        extra[nextra++] = (pcr_hdr_t){"allow", 5, allow, strlen(allow)};
    }
    pcr_exchange_reply(ex, status, "application/json", body, strlen(body), extra, nextra);
    free(text);
}

static void error_v(pcr_exchange_t *ex, int status, const char *type, const char *code,
                    const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    error_reply(ex, status, type, code, msg);
}

void pcr_exchange_error(pcr_exchange_t *ex, int status, const char *type, const char *code,
                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_v(ex, status, type, code, fmt, ap);
    va_end(ap);
}

/* ---- proxying ------------------------------------------------------------------------ */

/* The values of every Connection field of the request, joined by commas (NULL when none). */
static char *request_connection(const pcr_exchange_t *ex)
{
    struct evbuffer *b = NULL;
    for (size_t i = 0; i + 1 < ex->nh; i += 2) {
        if (ex->hsz[i] == 10 && strncasecmp(ex->hbuf + ex->hoff[i], "connection", 10) == 0) {
            if (b == NULL && (b = evbuffer_new()) == NULL)
                return NULL;
            evbuffer_add(b, ",", 1);
            evbuffer_add(b, ex->hbuf + ex->hoff[i + 1], ex->hsz[i + 1]);
        }
    }
    if (b == NULL)
        return NULL;
    size_t len = evbuffer_get_length(b);
    char *s = malloc(len + 1);
    if (s != NULL) {
        evbuffer_remove(b, s, len);
        s[len] = '\0';
    }
    evbuffer_free(b);
    return s;
}

static char *put(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

/* The request for the pod: its head in a new buffer, written once into space of its exact
 * size (no printf: formatting cost more than the rest of the head), and its body, which is
 * `ex->body` itself (*body, sent by reference, never copied) unless stream_options is added to
 * it: then the body follows the head in the new buffer and *body is NULL. */
static struct evbuffer *build_upstream_request(pcr_exchange_t *ex, pcr_backend_t *be,
                                               struct evbuffer **body)
{
    char *conn = request_connection(ex);
    size_t blen = evbuffer_get_length(ex->body);
    /* upstream.request_usage: "stream_options" goes before the object's closing brace. */
    static const char opt[] = "\"stream_options\":{\"include_usage\":true}";
    const char *raw = NULL;
    int empty = 0;
    long at = -1;
    if (ex->inject_usage) {
        raw = blen ? (const char *)evbuffer_pullup(ex->body, -1) : "";
        at = pcr_usage_insert_at(raw, blen, &empty);
    }
    size_t extra = at >= 0 ? sizeof(opt) - 1 + !empty : 0;
    int clen = blen > 0 || strcmp(ex->method, "POST") == 0;

    /* "<method> <path> HTTP/1.1\r\nHost: <host>\r\n", the fields kept, Content-Length, CRLF. */
    unsigned char keep[PCR_MAX_REQ_HEADERS];
    size_t mlen = strlen(ex->method), plen = strlen(ex->path), hlen = strlen(be->host_header);
    size_t need = mlen + 1 + plen + 17 + hlen + 2 + 2 + (clen ? 16 + 20 + 2 : 0);
    for (size_t i = 0; i + 1 < ex->nh; i += 2) {
        keep[i / 2] = !pcr_http_hop_by_hop(ex->hbuf + ex->hoff[i], ex->hsz[i], conn);
        if (keep[i / 2])
            need += ex->hsz[i] + 2 + ex->hsz[i + 1] + 2;
    }
    free(conn);
    struct evbuffer *b = evbuffer_new();
    struct evbuffer_iovec v;
    if (b == NULL || evbuffer_reserve_space(b, (ev_ssize_t)need, &v, 1) != 1) {
        if (b != NULL)
            evbuffer_free(b);
        return NULL;
    }
    char *p = v.iov_base;
    p = put(p, ex->method, mlen);
    *p++ = ' ';
    p = put(p, ex->path, plen);
    p = put(p, " HTTP/1.1\r\nHost: ", 17);
    p = put(p, be->host_header, hlen);
    p = put(p, "\r\n", 2);
    for (size_t i = 0; i + 1 < ex->nh; i += 2) {
        if (!keep[i / 2])
            continue;
        p = put(p, ex->hbuf + ex->hoff[i], ex->hsz[i]);
        p = put(p, ": ", 2);
        p = put(p, ex->hbuf + ex->hoff[i + 1], ex->hsz[i + 1]);
        p = put(p, "\r\n", 2);
    }
    if (clen) {
        p = put(p, "Content-Length: ", 16);
        p += pcr_http_put_dec(p, blen + extra);
        p = put(p, "\r\n", 2);
    }
    p = put(p, "\r\n", 2);
    v.iov_len = (size_t)(p - (char *)v.iov_base);
    evbuffer_commit_space(b, &v, 1);

    *body = NULL;
    if (at >= 0) {
        evbuffer_add(b, raw, (size_t)at);
        if (!empty)
            evbuffer_add(b, ",", 1);
        evbuffer_add(b, opt, sizeof(opt) - 1);
        evbuffer_add(b, raw + at, blen - (size_t)at);
    } else if (blen > 0) {
        *body = ex->body;
    }
    return b;
}

static void fail_unrouted(pcr_exchange_t *ex)
{
    switch (ex->last_error) {
    case PCR_UP_TIMEOUT:
        pcr_exchange_error(ex, 504, "timeout", "upstream_timeout",
                           "backend %s did not answer within %u ms", ex->be ? ex->be->conf.name : "?",
                           ex->w->cfg->timeouts.response_ms);
        break;
    case PCR_UP_POOL_FULL:
        pcr_exchange_error(ex, 503, "service_unavailable", "no_backend",
                           "every backend connection stayed busy for %u ms",
                           ex->w->cfg->timeouts.response_ms);
        break;
    case PCR_UP_HELD_OUT:
        pcr_exchange_error(ex, 503, "service_unavailable", "no_backend",
                           "backend %s went out of rotation while the request waited for it, "
                           "and no other could take it", ex->be ? ex->be->conf.name : "?");
        break;
    case PCR_UP_HELD:
        pcr_exchange_error(ex, 503, "service_unavailable", "backend_busy",
                           "backend %s kept more than routing.hold_tokens (%llu) of prefill "
                           "queued for %u ms", ex->be ? ex->be->conf.name : "?",
                           (unsigned long long)ex->w->cfg->routing.hold_tokens,
                           ex->w->cfg->timeouts.response_ms);
        break;
    default:
        pcr_exchange_error(ex, 502, "upstream_error", "bad_gateway",
                           "%u backend(s) failed before answering (last: %s, %s)", ex->attempts,
                           ex->be ? ex->be->conf.name : "?",
                           ex->last_error == PCR_UP_CONNECT  ? "connection refused or timed out"
                           : ex->last_error == PCR_UP_PROTOCOL ? "malformed HTTP response"
                                                               : "connection closed");
        break;
    }
}

static int tried(const pcr_exchange_t *ex, size_t i)
{
    return (ex->tried[i / 64] >> (i % 64)) & 1;
}

/* Fills loads[0..n) for the policy: usable = in a slot, up, not ejected, not yet tried, serving
 * the model. Returns how many are usable. */
static size_t fill_loads(pcr_exchange_t *ex, pcr_backend_load_t *loads, size_t n, uint64_t now)
{
    pcr_server_t *srv = ex->w->srv;
    const char *model = ex->req.model ? ex->req.model : "";
    size_t usable = 0, candidates = 0;
    memset(loads, 0, n * sizeof(*loads));
    for (size_t i = 0; i < n; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL)
            continue;
        int serves = !tried(ex, i) && PCR_LOAD(be->up) &&
                     pcr_backend_serves(be, model, ex->model_hash);
        loads[i].usable = serves && !pcr_backend_ejected(be, now);
        loads[i].inflight = PCR_LOAD(be->inflight);
        loads[i].queued_prefill = PCR_LOAD(be->queued_prefill);
        loads[i].pod_waiting = PCR_LOAD(be->pod_waiting);
        loads[i].usable |= serves ? 2 : 0; /* a candidate, for panic below */
        usable += (loads[i].usable & 1) != 0;
        candidates += serves;
    }
    /* Panic (Envoy's name): every backend that passes its health checks and could take the
     * request is ejected. Trying them anyway beats answering 503 to everything; one that
     * answers comes back through its probe. (Backends that fail their active checks stay out:
     * a 503 that says so is clearer than errors from a dead engine.) */
    int panic = usable == 0 && candidates > 0;
    for (size_t i = 0; i < n; i++)
        loads[i].usable = panic ? (loads[i].usable & 2) != 0 : (loads[i].usable & 1);
    if (panic) {
        ex->panic = 1;
        usable = candidates;
    }
    return usable;
}

/* The decision's phases (a routed request's first attempt), in the worker's histograms. */
static void observe_decision(pcr_exchange_t *ex, uint64_t match_ns, uint64_t cost_ns,
                             uint64_t t_end)
{
    pcr_hist_t *h = ex->w->metrics.decision;
    pcr_hist_observe(&h[PCR_PHASE_PARSE], &pcr_hist_decision_ns, (int64_t)ex->ns_parse);
    pcr_hist_observe(&h[PCR_PHASE_HASH], &pcr_hist_decision_ns, (int64_t)ex->ns_hash);
    pcr_hist_observe(&h[PCR_PHASE_MATCH], &pcr_hist_decision_ns, (int64_t)match_ns);
    pcr_hist_observe(&h[PCR_PHASE_COST], &pcr_hist_decision_ns, (int64_t)cost_ns);
    pcr_hist_observe(&h[PCR_PHASE_TOTAL], &pcr_hist_decision_ns, (int64_t)(t_end - ex->t_parse_ns));
}

/* The cached tokens the decision predicts: the chosen backend's matched blocks, a token being
 * PCR_BYTES_PER_TOKEN bytes of canonical prompt, at most the prompt's own tokens. */
static uint64_t predicted_tokens(const pcr_exchange_t *ex)
{
    if (!ex->has_key)
        return 0;
    uint64_t t = (uint64_t)ex->decision.matched_blocks * ex->w->cfg->routing.block_bytes /
                 PCR_BYTES_PER_TOKEN;
    return t < ex->key.prompt_tokens ? t : ex->key.prompt_tokens;
}

/* Chooses a backend (skipping those already tried) and sends the request there. */
static void dispatch(pcr_exchange_t *ex)
{
    pcr_worker_t *w = ex->w;
    pcr_server_t *srv = w->srv;
    const char *model = ex->req.model ? ex->req.model : "";
    pcr_worker_sync(w); /* what the other workers (and the control thread) published meanwhile */
    size_t n = pcr_backend_slots(srv);
    pcr_backend_load_t loads[n ? n : 1];
    pcr_decision_t d;
    pcr_backend_t *be = NULL;
    /* The clock read that ended the reader's last step, when the decision follows it at once
     * (proxy_routed); a retry reads it anew. */
    uint64_t now = (ex->t_hashed_ns != 0 ? ex->t_hashed_ns : pcr_now_ns()) / 1000u;
    ex->t_hashed_ns = 0;
    uint64_t match_ns = 0, cost_ns = 0, t_end = 0;
    for (;;) {
        fill_loads(ex, loads, n, now);
        int rc = pcr_policy_decide(w->policy, ex->has_key ? &ex->key : NULL, loads, now, &d);
        match_ns += d.match_ns;
        cost_ns += d.cost_ns;
        t_end = d.done_ns; /* the policy's clock is pcr_now_ns (worker.c) */
        if (rc < 0 || d.backend < 0 || (size_t)d.backend >= n)
            break;
        if ((be = pcr_backend_at(srv, (size_t)d.backend)) != NULL)
            break;
        /* It left between the two reads: never again for this request. */
        ex->tried[(size_t)d.backend / 64] |= 1ull << ((size_t)d.backend % 64);
    }
    if (ex->attempts == 0 && ex->has_key)
        observe_decision(ex, match_ns, cost_ns, t_end != 0 ? t_end : pcr_now_ns());
    if (be == NULL) {
        if (ex->attempts > 0) {
            fail_unrouted(ex);
        } else if (model[0] != '\0' && pcr_backends_up(srv) > 0) {
            pcr_exchange_error(ex, 404, "invalid_request_error", "model_not_found",
                               "no backend serves the model '%s'", model);
        } else {
            pcr_exchange_error(ex, 503, "service_unavailable", "no_backend",
                               "no backend is available (%zu up)", pcr_backends_up(srv));
        }
        return;
    }
    if (ex->panic)
        PCR_INC(w->metrics.panic_routes);
    if (ex->attempts == 0) {
        PCR_INC(w->metrics.decisions[d.reason < PCR_REASON__COUNT ? d.reason : PCR_REASON_NO_BACKEND]);
        if (ex->has_key) {
            PCR_BUMP(w->metrics.prefix_blocks, d.total_blocks);
            PCR_BUMP(w->metrics.prefix_blocks_matched, d.matched_blocks);
        }
    } else {
        PCR_INC(w->metrics.retries);
    }
    ex->decision = d;
    ex->predicted = predicted_tokens(ex);
    ex->attempts++;
    ex->tried[(size_t)d.backend / 64] |= 1ull << ((size_t)d.backend % 64);
    if (ex->has_key && pcr_policy_commit(w->policy, d.backend, &ex->key, now, &ex->added_from) == 0) {
        ex->committed = 1;
        ex->t_commit = now;
        /* Read before this request joins the pending ones (ex_to below). */
        ex->settled_before = pcr_backend_settled_before(be);
        pcr_bus_commit(srv->bus, (int)w->id, d.backend, &ex->key, now);
    }
    struct evbuffer *body;
    struct evbuffer *req = build_upstream_request(ex, be, &body);
    if (req == NULL) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return;
    }
    pcr_pool_t *pool = pcr_pools_get(w, be);
    if (pool == NULL) {
        evbuffer_free(req);
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return;
    }
    /* The exchange holds the backend until it is freed: a backend that leaves the config is
     * not freed under a request it is answering. */
    pcr_backend_ref(be);
    if (ex->be != NULL)
        pcr_backend_unref(ex->be);
    ex->be = be;
    ex->prefill = d.uncached_prefill;
    ex_to(ex, EX_UP_WAIT);
    /* A stream's first event tells when its prefill is done, so the pool can hold completions
     * while the pod's prefill queue is full (routing.hold_tokens). One that is not streamed
     * shows nothing before its answer, which vLLM sends whole once generated: its prefill
     * counts in the pod's queue until the time the policy expects its first token, not for
     * the whole generation. */
    if (ex->has_key) {
        /* The key lives as long as the exchange, the upstream request no longer. */
        pcr_up_prefix_t prefix = {
            .blocks = ex->key.blocks,
            .nblocks = (uint32_t)ex->key.nblocks,
            .matched = d.matched_blocks,
            .added_from = ex->committed ? (uint32_t)ex->added_from : (uint32_t)ex->key.nblocks,
        };
        ex->up = ex->req.stream ? pcr_upstream_send_stream(pool, req, body, ex->prefill,
                                                           &prefix, &proxy_cbs, ex)
                                : pcr_upstream_send_unstreamed(pool, req, body, ex->prefill,
                                                               &prefix, &proxy_cbs, ex);
    } else {
        ex->up = pcr_upstream_send_body(pool, req, body, &proxy_cbs, ex);
    }
    if (ex->up == NULL) {
        ex_to(ex, EX_ROUTING);
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
    }
}

/* ---- per-request truth: the pod's usage ------------------------------------------------ */

/* The answer's usage is read as it is forwarded (usage.h), for routed requests. */
static void usage_start(pcr_exchange_t *ex, int status, const pcr_hdr_t *hdrs, size_t n)
{
    const pcr_hdr_t *ct = NULL, *ce = NULL;
    for (size_t i = 0; i < n; i++) {
        if (hdrs[i].name_len == 12 && strncasecmp(hdrs[i].name, "content-type", 12) == 0)
            ct = &hdrs[i];
        else if (hdrs[i].name_len == 16 && strncasecmp(hdrs[i].name, "content-encoding", 16) == 0)
            ce = &hdrs[i];
    }
    pcr_usage_mode_t mode = pcr_usage_mode(status, ct ? ct->value : NULL, ct ? ct->value_len : 0,
                                           ce ? ce->value : NULL, ce ? ce->value_len : 0);
    pcr_usage_init(&ex->usage, mode, ex->inject_usage);
}

/* The one place a request's delivered cached tokens arrive, once per request, before its
 * outcome is recorded: the backend that answered (ex->be, slot ex->be->id), the decision that
 * chose it (ex->decision: matched and total blocks; ex->predicted in tokens), the prefix key
 * (ex->key), what the pod says it reused (`delivered`, and `prompt` tokens, in the pod's own
 * count), and which of the prefixes committed to the backend before it the pod had computed
 * when it was sent (ex->settled_before).
 *
 * It goes on to the routing library, pcr_policy_feedback(), in this worker's replica and, through
 * the bus, in every other: when the pod delivered less than predicted it no longer holds the
 * rest of that prefix, and the index forgets it for this backend; when it delivered more, the
 * index learns it. The policy is the library's; the router only passes the observation on
 * (routing.feedback false: counted, not passed on). */
static void observe_delivered(pcr_exchange_t *ex, uint64_t delivered, uint64_t prompt)
{
    pcr_backend_t *be = ex->be;
    uint64_t predicted = ex->predicted;
    if (prompt > 0 && predicted > prompt)
        predicted = prompt; /* the pod's tokens are the truth; ours are estimates */
    ex->predicted = predicted;
    ex->delivered = (int64_t)delivered;
    PCR_ADD(be->cached_predicted, predicted);
    PCR_ADD(be->cached_delivered, delivered);
    PCR_ADD(be->prompt_tokens, prompt);
    pcr_hist_observe(&ex->w->metrics.cached_error, &pcr_hist_tokens_error,
                     (int64_t)predicted - (int64_t)delivered);
    pcr_worker_t *w = ex->w;
    /* A held request may have gone ahead of the one that was to bring its prefix to the pod:
     * then what the pod reused says nothing of what it evicted. */
    if (ex->has_key && ex->committed && !ex->held && w->cfg->routing.feedback) {
        pcr_policy_feedback(w->policy, &ex->key, &ex->decision, delivered, ex->settled_before);
        pcr_bus_feedback(w->srv->bus, (int)w->id, &ex->key, &ex->decision, delivered,
                         ex->settled_before);
    }
}

/* Whether field `f` of the pod's response is hop-by-hop: one of the fixed list, or named by
 * any of its Connection fields, however long they are. */
static int pod_hop_by_hop(const pcr_hdr_t *hdrs, size_t n, const pcr_hdr_t *f)
{
    if (pcr_http_hop_by_hop(f->name, f->name_len, NULL))
        return 1;
    for (size_t j = 0; j < n; j++)
        if (hdrs[j].name_len == 10 && strncasecmp(hdrs[j].name, "connection", 10) == 0 &&
            pcr_http_list_has(hdrs[j].value, hdrs[j].value_len, f->name, f->name_len))
            return 1;
    return 0;
}

static void on_up_head(void *ctx, int status, const pcr_hdr_t *hdrs, size_t n, int64_t clen)
{
    pcr_exchange_t *ex = ctx;
    pcr_hdr_t out[PCR_MAX_REQ_HEADERS];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 2 < PCR_ARRAY_SIZE(out); i++)
        if (!pod_hop_by_hop(hdrs, n, &hdrs[i]))
            out[k++] = hdrs[i];
    const char *bname = ex->be->conf.name;
    const char *reason = pcr_reason_name(ex->decision.reason);
    out[k++] = (pcr_hdr_t){"x-pcrouter-backend", 18, bname, strlen(bname)};
    out[k++] = (pcr_hdr_t){"x-pcrouter-route", 16, reason, strlen(reason)};
    /* A 4xx is the client's fault: for outlier detection it is a pod that works. */
    pcr_backend_report(ex->be, &ex->w->cfg->outlier, status >= 500 ? PCR_OUTCOME_5XX : PCR_OUTCOME_OK,
                       pcr_now_us());
    if (ex->has_key) {
        usage_start(ex, status, hdrs, n);
        if (ex->usage.strip)
            clen = -1; /* an event may be dropped: the length is no longer known */
    }
    ex_to(ex, EX_UP_HEAD);
    respond_head(ex, status, out, k, clen);
}

static void emit_body(void *ctx, const char *data, size_t len)
{
    if (len > 0)
        respond_body(ctx, data, len);
}

static void on_up_body(void *ctx, const char *data, size_t len)
{
    pcr_exchange_t *ex = ctx;
    /* A stream's first event is its first token: the time to it teaches the policy the pod's
     * prefill rate (every worker's replica, through the bus). Not at the response head, which
     * vLLM sends before prefilling a stream and after generating a whole non-streamed answer;
     * not after a retry, whose time includes the failed attempt. Not with replicas sharing
     * through Redis either: each sees only its own part of a pod's queue, so the time it
     * measures holds the other replicas' work, which it would take for the pod's slowness
     * (4 replicas fell from 1.03x to 0.81x of one replica's hit rate so); they route on the
     * configured rate. Every stream's time counts from its send, behind the prefill its pod had
     * been sent then and not finished: a wait in pcrouter (held, or for a connection slot) is
     * not the pod's, and neither are the held streams of the queue the decision saw. Counted
     * from the decision, a stream that went while others were held (another worker's, whose
     * wake-up was still on its way) was charged their prefill too, and its pod looked up to
     * three times faster than it was: the cost then sent it every long prompt (Mooncake past
     * its knee, two workers). The same first event is the stream's time to first token
     * (metrics, access log). */
    if (ex->state != EX_UP_BODY && ex->req.stream && ex->t_first == 0) {
        ex->t_first = pcr_now_us();
        ex->prefill_ahead = pcr_upstream_sent_ahead(ex->up);
        ex->has_prefill_ahead = 1;
    }
    if (ex->state != EX_UP_BODY && ex->req.stream && ex->attempts == 1 &&
        !ex->w->cfg->redis.enabled) {
        pcr_worker_t *w = ex->w;
        uint64_t sent = pcr_upstream_sent_us(ex->up);
        uint64_t from = sent > ex->t_start ? sent : ex->t_start;
        uint64_t ttfb = ex->t_first > from ? ex->t_first - from : 0;
        uint64_t ahead = ex->prefill_ahead;
        pcr_policy_observe(w->policy, ex->be->id, ex->decision.uncached_prefill, ahead, ttfb);
        pcr_bus_observe(w->srv->bus, (int)w->id, ex->be->id, ex->decision.uncached_prefill,
                        ahead, ttfb);
    }
    if (ex->state != EX_UP_BODY && pcr_upstream_prefill_done(ex->up)) {
        ex->held = 1;
        ex->held_us += pcr_upstream_held_us(ex->up);
    }
    ex_to(ex, EX_UP_BODY); /* the pod has started answering: its prefill is done */
    pcr_usage_feed(&ex->usage, data, len, emit_body, ex);
    if (!ex->paused && ex->ops->pending(ex) > PCR_WRITE_HIGH) {
        ex->paused = 1;
        pcr_upstream_pause(ex->up);
    }
}

static void on_up_done(void *ctx)
{
    pcr_exchange_t *ex = ctx;
    ex->up = NULL;
    if (pcr_usage_finish(&ex->usage, emit_body, ex))
        observe_delivered(ex, ex->usage.cached_tokens, ex->usage.prompt_tokens);
    pcr_usage_dispose(&ex->usage);
    ex_to(ex, EX_DONE);
    ex->ops->send_end(ex);
}

/* Another backend that could take the request, without choosing it yet. */
static int can_retry(pcr_exchange_t *ex)
{
    size_t n = pcr_backend_slots(ex->w->srv);
    pcr_backend_load_t loads[n ? n : 1];
    return ex->attempts <= ex->w->cfg->upstream.retries && !ex->w->draining &&
           fill_loads(ex, loads, n, pcr_now_us()) > 0;
}

static void on_up_error(void *ctx, pcr_up_error_t err, int got_head)
{
    pcr_exchange_t *ex = ctx;
    pcr_backend_t *be = ex->be;
    ex->up = NULL;
    ex->last_error = err;
    if (err == PCR_UP_HELD) { /* held until its deadline, and the request with it */
        ex->held = 1;
        ex->held_us += (uint64_t)ex->w->cfg->timeouts.response_ms * 1000u;
    }
    /* A full pool or a held request: the pool is ours; the pod did nothing wrong. */
    if (err != PCR_UP_POOL_FULL && err != PCR_UP_HELD && err != PCR_UP_HELD_OUT)
        pcr_backend_report(be, &ex->w->cfg->outlier,
                           err == PCR_UP_CONNECT ? PCR_OUTCOME_CONNECT : PCR_OUTCOME_ERROR,
                           pcr_now_us());
    if (got_head) {
        /* Part of the response reached the client: it cannot be retried, only cut. */
        pcr_log_warn("backend %s: response cut short (%s) after %llu bytes", be->conf.name,
                     err == PCR_UP_TIMEOUT    ? "stream idle timeout"
                     : err == PCR_UP_PROTOCOL ? "malformed response"
                                              : "connection lost",
                     (unsigned long long)ex->resp_bytes);
        ex_to(ex, EX_ABORTED);
        ex->ops->send_abort(ex);
        return;
    }
    ex_to(ex, EX_ROUTING);
    if (ex->committed) {
        pcr_policy_forget(ex->w->policy, be->id, &ex->key, ex->added_from);
        pcr_bus_forget(ex->w->srv->bus, (int)ex->w->id, be->id, &ex->key, ex->added_from);
        ex->committed = 0;
    }
    int retryable = err == PCR_UP_CONNECT || err == PCR_UP_RESET || err == PCR_UP_PROTOCOL ||
                    err == PCR_UP_HELD_OUT;
    if (retryable && can_retry(ex)) {
        pcr_log_info(err == PCR_UP_HELD_OUT
                         ? "backend %s went out of rotation while a request waited for it; "
                           "routing it again"
                         : "backend %s failed before answering; retrying on another backend",
                     be->conf.name);
        dispatch(ex);
        return;
    }
    fail_unrouted(ex);
}

static unsigned *on_up_owner(void *arg) { return ((pcr_exchange_t *)arg)->pod_busy; }

/* An unstreamed completion's first token, as the policy expects it of its pod behind `tokens`
 * of prefill (what was sent before it, and its own): at the rate learned from streams, or the
 * policy's starting one. */
static uint64_t on_up_prefill_us(void *arg, uint64_t tokens)
{
    pcr_exchange_t *ex = arg;
    double us = pcr_policy_estimate_ttft(ex->w->policy, ex->be->id, tokens);
    return us > 0 ? (uint64_t)us : 0;
}

/* ... has come: its prefill leaves the pod's queue as the decisions count it, and it no longer
 * keeps the pod's settled_before back, as a stream's first event would. */
static void on_up_prefill_due(void *arg)
{
    pcr_exchange_t *ex = arg;
    if (!holds_prefill(ex->state))
        return;
    PCR_SUB(ex->be->queued_prefill, ex->prefill);
    ex->prefill = 0;
    pending_leave(ex);
}

static const pcr_upstream_cbs_t proxy_cbs = {on_up_head,  on_up_body,       on_up_done,
                                             on_up_error, on_up_owner,      on_up_prefill_us,
                                             on_up_prefill_due};

void pcr_exchange_on_writable(pcr_exchange_t *ex)
{
    if (ex->paused && ex->ops->pending(ex) <= PCR_WRITE_LOW) {
        ex->paused = 0;
        pcr_upstream_resume(ex->up);
    }
}

/* POST /v1/completions and /v1/chat/completions: the prompt picks the backend. The body was
 * parsed and its prompt hashed while it arrived (pcr_exchange_add_body): what is left is the
 * reader's last step and the decision. */
static void proxy_routed(pcr_exchange_t *ex)
{
    /* The body was read and its prefix hashed as it came (ns_parse); from here on is the time
     * after its last byte: the reader's last step (ns_hash), then the decision. */
    ex->t_parse_ns = pcr_now_ns();
    if (ex->reader == NULL && body_reader_start(ex) < 0) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return;
    }
    int rc = pcr_body_reader_finish(ex->reader, &ex->req);
    const char *why = pcr_body_reader_error(ex->reader);
    ex->t_hashed_ns = pcr_now_ns();
    ex->ns_hash = ex->t_hashed_ns - ex->t_parse_ns;
    if (rc == PCR_ERR_PARSE) {
        pcr_exchange_error(ex, 400, "invalid_request_error", "invalid_json", "%s", why);
        return;
    }
    if (rc == PCR_ERR_INVAL) {
        pcr_exchange_error(ex, 400, "invalid_request_error", "missing_prompt", "%s", why);
        return;
    }
    if (rc < 0) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "%s", pcr_strerror(rc));
        return;
    }
    pcr_body_reader_free(ex->reader);
    ex->reader = NULL;
    ex->key = pcr_body_key(&ex->req);
    ex->model_hash = pcr_model_hash(ex->req.model, ex->req.model_len);
    ex->has_key = 1;
    /* A stream whose client asked nothing of its options: pcrouter may ask for usage (where,
     * build_upstream_request finds). */
    ex->inject_usage = ex->w->cfg->upstream.request_usage && ex->req.stream &&
                       !ex->req.stream_options;
    dispatch(ex);
}

static int path_is(const char *path, const char *want)
{
    size_t n = strlen(want);
    return strncmp(path, want, n) == 0 && (path[n] == '\0' || path[n] == '?');
}

/* The first route of the worker's table that the path is (its path, or under its prefix). */
static const pcr_route_t *route_find(const pcr_exchange_t *ex)
{
    const char *p = ex->path ? ex->path : "";
    const pcr_route_table_t *t = ex->w->routes;
    for (size_t i = 0; t != NULL && i < t->n; i++) {
        const pcr_route_t *rt = &t->routes[i];
        size_t n = strlen(rt->path);
        if (n > 0 && rt->path[n - 1] == '/' ? strncmp(p, rt->path, n) == 0 : path_is(p, rt->path))
            return rt;
    }
    return NULL;
}

/* "/v1/completions, ..., /metrics": the table's paths, for the answer to a path it has not. */
static void route_list(const pcr_route_table_t *t, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; t != NULL && i < t->n && len < cap; i++) {
        const char *path = t->routes[i].path;
        if (path[strlen(path) - 1] == '/')
            continue; /* a prefix is no endpoint */
        int n = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", path);
        if (n < 0)
            break;
        len += (size_t)n;
    }
}

void pcr_exchange_run(pcr_exchange_t *ex)
{
    ex_to(ex, EX_ROUTING);
    const char *p = ex->path ? ex->path : "";
    const pcr_route_t *rt = route_find(ex);
    ex->route = rt;
    int own = rt != NULL && rt->own;

    /* With an admin listener, the router's own endpoints live there and only there: the
     * public listeners need not expose the pool's state. */
    if (ex->admin && !own) {
        pcr_exchange_error(ex, 404, "invalid_request_error", "not_found",
                           "the admin listener serves /metrics and /health only");
        return;
    }
    if (!ex->admin && own && ex->w->cfg->admin.addrlen != 0) {
        pcr_exchange_error(ex, 404, "invalid_request_error", "not_found",
                           "%s is served on the admin listener (admin.address)", p);
        return;
    }
    if (rt == NULL) {
        char list[256];
        route_list(ex->w->routes, list, sizeof(list));
        pcr_exchange_error(ex, 404, "invalid_request_error", "not_found",
                           "no route for %s %s (see %s)", ex->method, p, list);
        return;
    }
    int get = strcmp(rt->method, "GET") == 0;
    if (strcmp(ex->method, rt->method) != 0 && !(get && strcmp(ex->method, "HEAD") == 0)) {
        pcr_exchange_error(ex, 405, "invalid_request_error", "method_not_allowed",
                           "%s is not allowed on %s; use %s", ex->method, p, rt->method);
        return;
    }
    switch (rt->kind) {
    case PCR_ROUTE_ANSWER:
        rt->serve(ex);
        break;
    case PCR_ROUTE_FANOUT:
        ex_to(ex, EX_LOCAL);
        if (rt->serve(ex) < 0)
            pcr_exchange_error(ex, 503, "service_unavailable", "no_backend",
                               "no backend is available");
        break;
    case PCR_ROUTE_PROMPT:
        proxy_routed(ex);
        break;
    case PCR_ROUTE_PROXY:
        dispatch(ex);
        break;
    }
}

void pcr_exchange_free(pcr_exchange_t *ex)
{
    if (ex == NULL)
        return;
    pcr_worker_t *w = ex->w;
    if (ex->up) {
        pcr_upstream_cancel(ex->up);
        ex->up = NULL;
    }
    if (ex->fanout && ex->route != NULL && ex->route->cancel != NULL)
        ex->route->cancel(ex);
    if (ex->state != EX_RECEIVING && !pcr_exchange_finished(ex)) {
        /* 499: the client went away before the response ended (nginx's convention). */
        ex->status = 499;
        ex_to(ex, EX_GONE);
    }
    if (ex->state != EX_RECEIVING)
        PCR_STORE(w->inflight, w->inflight - 1);
    pcr_budget_forget(w, ex);
    if (ex->body_counted)
        pcr_budget_account(w, -(ptrdiff_t)ex->body_counted);
    pcr_body_dispose(&ex->req);
    pcr_body_reader_free(ex->reader);
    pcr_usage_dispose(&ex->usage);
    if (ex->be != NULL)
        pcr_backend_unref(ex->be);
    /* Kept for the next exchange: the buffers, emptied. A body still referenced by a pod
     * connection's output (pcr_upstream_send_body) keeps its chains alive there. A path or a
     * header buffer grown past what requests usually need is not kept. */
    int keep = ex->body != NULL && ex->path_cap <= 4096 && ex->hcap <= 16384;
    if (keep)
        evbuffer_drain(ex->body, evbuffer_get_length(ex->body));
    if (!keep || !pcr_spare_put(&spare, &ex->spare, SPARE_MAX))
        exchange_destroy(ex);
    pcr_worker_check_drained(w);
}
