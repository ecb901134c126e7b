/* router/exchange.c: owns one request/response pair from routing to the last byte.
 *
 *   run -> route by path -> local endpoint (health, metrics, models)
 *                        -> proxy: parse body -> key -> policy decision -> upstream
 *   upstream head/body/end -> session ops (streamed as they come, paused above a watermark)
 *   upstream failure before anything reached the client -> forget the speculative index
 *   entry, try another backend (upstream.retries times), else 502/503/504
 *
 * The exchange never frees itself: the session that owns it does, after send_end or when the
 * client goes away (pcr_exchange_free cancels the upstream request then). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "exchange_int.h"
#include "log.h"

static const pcr_upstream_cbs_t proxy_cbs;

pcr_exchange_t *pcr_exchange_new(pcr_server_t *srv, const pcr_exchange_ops_t *ops, void *sess,
                                 const char *proto)
{
    pcr_exchange_t *ex = calloc(1, sizeof(*ex));
    if (ex == NULL)
        return NULL;
    ex->srv = srv;
    ex->ops = ops;
    ex->sess = sess;
    ex->proto = proto;
    ex->body = evbuffer_new();
    ex->tried = calloc(srv->nbackends, 1);
    if (ex->body == NULL || ex->tried == NULL) {
        pcr_exchange_free(ex);
        return NULL;
    }
    ex->t_start = pcr_now_us();
    return ex;
}

void *pcr_exchange_session(const pcr_exchange_t *ex) { return ex->sess; }
int pcr_exchange_responded(const pcr_exchange_t *ex) { return ex->responded; }
int pcr_exchange_finished(const pcr_exchange_t *ex) { return ex->finished; }
int pcr_exchange_running(const pcr_exchange_t *ex) { return ex->running; }

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
    char *p = realloc(ex->path, len + 1);
    if (p == NULL)
        return PCR_ERR_NOMEM;
    memcpy(p, path, len);
    p[len] = '\0';
    ex->path = p;
    return 0;
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
    if (ex->nh + 2 > PCR_MAX_REQ_HEADERS * 2)
        return PCR_ERR_TOO_LARGE;
    if (hbuf_put(ex, name, nlen) < 0 || hbuf_put(ex, value, vlen) < 0)
        return PCR_ERR_NOMEM;
    return 0;
}

int pcr_exchange_add_body(pcr_exchange_t *ex, const char *data, size_t len)
{
    if (evbuffer_get_length(ex->body) + len > ex->srv->cfg->limits.max_body_bytes)
        return PCR_ERR_TOO_LARGE;
    return evbuffer_add(ex->body, data, len) == 0 ? 0 : PCR_ERR_NOMEM;
}

/* ---- answering ----------------------------------------------------------------------- */

static void respond_head(pcr_exchange_t *ex, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    ex->status = status;
    ex->responded = 1;
    ex->t_head = pcr_now_us();
    ex->ops->send_head(ex, status, h, n, clen);
}

static void respond_body(pcr_exchange_t *ex, const char *data, size_t len)
{
    ex->resp_bytes += len;
    ex->ops->send_body(ex, data, len);
}

static void respond_end(pcr_exchange_t *ex)
{
    ex->finished = 1;
    ex->ops->send_end(ex);
}

void pcr_exchange_reply(pcr_exchange_t *ex, int status, const char *content_type, const char *body,
                        size_t len, const pcr_hdr_t *extra, size_t nextra)
{
    if (ex->responded)
        return;
    pcr_hdr_t h[8];
    size_t n = 0;
    h[n++] = (pcr_hdr_t){"content-type", 12, content_type, strlen(content_type)};
    for (size_t i = 0; i < nextra && n < PCR_ARRAY_SIZE(h); i++)
        h[n++] = extra[i];
    respond_head(ex, status, h, n, (int64_t)len);
    if (len > 0)
        respond_body(ex, body, len);
    respond_end(ex);
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
    if (status == 405) {
        const char *p = ex->path ? ex->path : "";
        const char *allow = strncmp(p, "/v1/models", 10) == 0 || strcmp(p, "/health") == 0 ||
                                    strcmp(p, "/metrics") == 0
                                ? "GET"
                                : "POST";
        extra[nextra++] = (pcr_hdr_t){"allow", 5, allow, strlen(allow)};
    }
    pcr_exchange_reply(ex, status, "application/json", body, strlen(body), extra, nextra);
    free(text);
}

/* The request counts from here: in-flight, then status and access log when it is freed. */
static void mark_running(pcr_exchange_t *ex)
{
    if (!ex->running) {
        ex->running = 1;
        ex->srv->inflight++;
    }
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

void pcr_exchange_reject(pcr_exchange_t *ex, int status, const char *type, const char *code,
                         const char *fmt, ...)
{
    mark_running(ex);
    va_list ap;
    va_start(ap, fmt);
    error_v(ex, status, type, code, fmt, ap);
    va_end(ap);
}

/* ---- load accounting ----------------------------------------------------------------- */

static void charge(pcr_exchange_t *ex, pcr_backend_t *be, uint64_t prefill)
{
    ex->be = be;
    ex->charged = 1;
    ex->prefill_charged = prefill;
    be->inflight++;
    be->queued_prefill += prefill;
}

/* The pod has started answering: its prefill is no longer queued work. */
static void release_prefill(pcr_exchange_t *ex)
{
    if (ex->charged && ex->prefill_charged) {
        ex->be->queued_prefill -= ex->prefill_charged;
        ex->prefill_charged = 0;
    }
}

static void release(pcr_exchange_t *ex)
{
    if (!ex->charged)
        return;
    release_prefill(ex);
    ex->be->inflight--;
    ex->charged = 0;
}

/* ---- proxying ------------------------------------------------------------------------ */

static int is_hop_by_hop(const char *n, size_t len)
{
    static const char *const hop[] = {"connection", "keep-alive", "proxy-connection",
                                      "transfer-encoding", "te", "trailer", "upgrade", "host",
                                      "content-length", "expect", "http2-settings"};
    if (len > 0 && n[0] == ':')
        return 1; /* HTTP/2 pseudo-headers */
    for (size_t i = 0; i < PCR_ARRAY_SIZE(hop); i++)
        if (strlen(hop[i]) == len && strncasecmp(n, hop[i], len) == 0)
            return 1;
    return 0;
}

static struct evbuffer *build_upstream_request(pcr_exchange_t *ex, pcr_backend_t *be)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL)
        return NULL;
    size_t blen = evbuffer_get_length(ex->body);
    evbuffer_add_printf(b, "%s %s HTTP/1.1\r\nHost: %s\r\n", ex->method, ex->path, be->host_header);
    for (size_t i = 0; i + 1 < ex->nh; i += 2) {
        const char *n = ex->hbuf + ex->hoff[i];
        if (is_hop_by_hop(n, ex->hsz[i]))
            continue;
        evbuffer_add(b, n, ex->hsz[i]);
        evbuffer_add(b, ": ", 2);
        evbuffer_add(b, ex->hbuf + ex->hoff[i + 1], ex->hsz[i + 1]);
        evbuffer_add(b, "\r\n", 2);
    }
    if (blen > 0 || strcmp(ex->method, "POST") == 0)
        evbuffer_add_printf(b, "Content-Length: %zu\r\n", blen);
    evbuffer_add(b, "\r\n", 2);
    if (blen > 0)
        evbuffer_add(b, evbuffer_pullup(ex->body, -1), blen);
    return b;
}

static void fail_unrouted(pcr_exchange_t *ex)
{
    switch (ex->last_error) {
    case PCR_UP_TIMEOUT:
        pcr_exchange_error(ex, 504, "timeout", "upstream_timeout",
                           "backend %s did not answer within %u ms", ex->be ? ex->be->conf->name : "?",
                           ex->srv->cfg->timeouts.response_ms);
        break;
    case PCR_UP_POOL_FULL:
        pcr_exchange_error(ex, 503, "service_unavailable", "no_backend",
                           "every backend connection stayed busy for %u ms",
                           ex->srv->cfg->timeouts.response_ms);
        break;
    default:
        pcr_exchange_error(ex, 502, "upstream_error", "bad_gateway",
                           "%u backend(s) failed before answering (last: %s, %s)", ex->attempts,
                           ex->be ? ex->be->conf->name : "?",
                           ex->last_error == PCR_UP_CONNECT  ? "connection refused or timed out"
                           : ex->last_error == PCR_UP_PROTOCOL ? "malformed HTTP response"
                                                               : "connection closed");
        break;
    }
}

/* Chooses a backend (skipping those already tried) and sends the request there. */
static void dispatch(pcr_exchange_t *ex)
{
    pcr_server_t *srv = ex->srv;
    pcr_backend_load_t loads[srv->nbackends];
    const char *model = ex->req.model ? ex->req.model : "";
    for (size_t i = 0; i < srv->nbackends; i++) {
        pcr_backend_t *be = &srv->backends[i];
        loads[i].usable = be->up && !ex->tried[i] && pcr_backend_serves(be, model);
        loads[i].inflight = be->inflight;
        loads[i].queued_prefill = be->queued_prefill;
        loads[i].pod_waiting = be->pod_waiting;
    }
    pcr_decision_t d;
    uint64_t now = pcr_now_us();
    int rc = pcr_policy_decide(srv->policy, ex->has_key ? &ex->key : NULL, loads, now, &d);
    if (rc < 0 || d.backend < 0 || (size_t)d.backend >= srv->nbackends) {
        if (ex->attempts > 0) {
            fail_unrouted(ex);
        } else if (model[0] != '\0' && pcr_backends_up(srv) > 0) {
            pcr_exchange_error(ex, 404, "invalid_request_error", "model_not_found",
                               "no backend serves the model '%s'", model);
        } else {
            pcr_exchange_error(ex, 503, "service_unavailable", "no_backend",
                               "no backend is available (%zu of %zu up)", pcr_backends_up(srv),
                               srv->nbackends);
        }
        return;
    }
    pcr_backend_t *be = &srv->backends[d.backend];
    if (ex->attempts == 0) {
        srv->metrics.decisions[d.reason]++;
        if (ex->has_key) {
            srv->metrics.prefix_blocks += d.total_blocks;
            srv->metrics.prefix_blocks_matched += d.matched_blocks;
        }
    } else {
        srv->metrics.retries++;
    }
    ex->decision = d;
    ex->attempts++;
    ex->tried[d.backend] = 1;
    if (ex->has_key && pcr_policy_commit(srv->policy, d.backend, &ex->key, now, &ex->added_from) == 0)
        ex->committed = 1;
    charge(ex, be, d.uncached_prefill);
    struct evbuffer *req = build_upstream_request(ex, be);
    ex->up = req ? pcr_upstream_send(be, req, &proxy_cbs, ex) : NULL;
    if (ex->up == NULL) {
        release(ex);
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
    }
}

static void on_up_head(void *ctx, int status, const pcr_hdr_t *hdrs, size_t n, int64_t clen)
{
    pcr_exchange_t *ex = ctx;
    pcr_hdr_t out[PCR_MAX_REQ_HEADERS];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 2 < PCR_ARRAY_SIZE(out); i++)
        if (!is_hop_by_hop(hdrs[i].name, hdrs[i].name_len))
            out[k++] = hdrs[i];
    const char *bname = ex->be->conf->name;
    const char *reason = pcr_reason_name(ex->decision.reason);
    out[k++] = (pcr_hdr_t){"x-pcrouter-backend", 18, bname, strlen(bname)};
    out[k++] = (pcr_hdr_t){"x-pcrouter-route", 16, reason, strlen(reason)};
    respond_head(ex, status, out, k, clen);
}

static void on_up_body(void *ctx, const char *data, size_t len)
{
    pcr_exchange_t *ex = ctx;
    /* A stream's first event is its first token: the time to it teaches the policy the pod's
     * prefill rate. Not at the response head, which vLLM sends before prefilling a stream and
     * after generating a whole non-streamed answer; not after a retry, whose time includes
     * the failed attempt. prefill_charged is set until the first body bytes. */
    if (ex->req.stream && ex->attempts == 1 && ex->prefill_charged > 0)
        pcr_policy_observe(ex->srv->policy, ex->be->id, ex->decision.uncached_prefill,
                           ex->decision.queued_ahead, pcr_now_us() - ex->t_start);
    release_prefill(ex);
    respond_body(ex, data, len);
    if (!ex->paused && ex->ops->pending(ex) > PCR_WRITE_HIGH) {
        ex->paused = 1;
        pcr_upstream_pause(ex->up);
    }
}

static void on_up_done(void *ctx)
{
    pcr_exchange_t *ex = ctx;
    ex->up = NULL;
    ex->be->requests_by_code[ex->status]++;
    release(ex);
    respond_end(ex);
}

static void on_up_error(void *ctx, pcr_up_error_t err, int got_head)
{
    pcr_exchange_t *ex = ctx;
    ex->up = NULL;
    ex->last_error = err;
    pcr_backend_t *be = ex->be;
    release(ex);
    if (got_head) {
        /* Part of the response reached the client: it cannot be retried, only cut. */
        pcr_log_warn("backend %s: response cut short (%s) after %llu bytes", be->conf->name,
                     err == PCR_UP_TIMEOUT ? "stream idle timeout" : "connection lost",
                     (unsigned long long)ex->resp_bytes);
        be->requests_by_code[ex->status]++;
        ex->aborted = 1;
        ex->finished = 1;
        ex->ops->send_abort(ex);
        return;
    }
    if (ex->committed) {
        pcr_policy_forget(ex->srv->policy, be->id, &ex->key, ex->added_from);
        ex->committed = 0;
    }
    int retryable = err == PCR_UP_CONNECT || err == PCR_UP_RESET || err == PCR_UP_PROTOCOL;
    if (retryable && ex->attempts <= ex->srv->cfg->upstream.retries && !ex->srv->draining) {
        pcr_log_info("backend %s failed before answering; retrying on another backend",
                     be->conf->name);
        dispatch(ex);
        return;
    }
    fail_unrouted(ex);
}

static const pcr_upstream_cbs_t proxy_cbs = {on_up_head, on_up_body, on_up_done, on_up_error};

void pcr_exchange_on_writable(pcr_exchange_t *ex)
{
    if (ex->paused && ex->ops->pending(ex) <= PCR_WRITE_LOW) {
        ex->paused = 0;
        pcr_upstream_resume(ex->up);
    }
}

/* POST /v1/completions and /v1/chat/completions: the prompt picks the backend. */
static void proxy_routed(pcr_exchange_t *ex, pcr_api_t api)
{
    size_t len = evbuffer_get_length(ex->body);
    const char *data = len ? (const char *)evbuffer_pullup(ex->body, -1) : "";
    char err[256];
    int rc = pcr_body_parse(api, data, len, &ex->req, err, sizeof(err));
    if (rc == PCR_ERR_PARSE) {
        pcr_exchange_error(ex, 400, "invalid_request_error", "invalid_json", "%s", err);
        return;
    }
    if (rc == PCR_ERR_INVAL) {
        pcr_exchange_error(ex, 400, "invalid_request_error", "missing_prompt", "%s", err);
        return;
    }
    if (rc < 0) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "%s", pcr_strerror(rc));
        return;
    }
    pcr_policy_t *pol = ex->srv->policy;
    ex->key.blocks = malloc(pcr_policy_max_blocks(pol) * sizeof(uint64_t));
    if (ex->key.blocks == NULL) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return;
    }
    pcr_policy_key(pol, ex->req.model, ex->req.model_len, ex->req.key, ex->req.key_len, &ex->key);
    ex->has_key = 1;
    dispatch(ex);
}

static int path_is(const char *path, const char *want)
{
    size_t n = strlen(want);
    return strncmp(path, want, n) == 0 && (path[n] == '\0' || path[n] == '?');
}

void pcr_exchange_run(pcr_exchange_t *ex)
{
    mark_running(ex);
    const char *p = ex->path ? ex->path : "";
    int get = strcmp(ex->method, "GET") == 0 || strcmp(ex->method, "HEAD") == 0;
    int post = strcmp(ex->method, "POST") == 0;

    if (path_is(p, "/health") || path_is(p, "/metrics") || path_is(p, "/v1/models")) {
        if (!get) {
            pcr_exchange_error(ex, 405, "invalid_request_error", "method_not_allowed",
                               "%s is not allowed on %s; use GET", ex->method, p);
        } else if (path_is(p, "/health")) {
            pcr_endpoint_health(ex);
        } else if (path_is(p, "/metrics")) {
            pcr_endpoint_metrics(ex);
        } else if (pcr_endpoint_models(ex) < 0) {
            pcr_exchange_error(ex, 503, "service_unavailable", "no_backend", "no backend is available");
        }
        return;
    }
    if (path_is(p, "/v1/completions") || path_is(p, "/v1/chat/completions")) {
        if (!post) {
            pcr_exchange_error(ex, 405, "invalid_request_error", "method_not_allowed",
                               "%s is not allowed on %s; use POST", ex->method, p);
            return;
        }
        proxy_routed(ex, path_is(p, "/v1/completions") ? PCR_API_COMPLETIONS : PCR_API_CHAT);
        return;
    }
    if (strncmp(p, "/v1/", 4) == 0 && post) {
        dispatch(ex); /* embeddings, tokenize, ...: balanced by load, no prefix key */
        return;
    }
    if (strncmp(p, "/v1/", 4) == 0 && !post) {
        pcr_exchange_error(ex, 405, "invalid_request_error", "method_not_allowed",
                           "%s is not allowed on %s; use POST", ex->method, p);
        return;
    }
    pcr_exchange_error(ex, 404, "invalid_request_error", "not_found",
                       "no route for %s %s (see /v1/completions, /v1/chat/completions, /v1/models, "
                       "/health, /metrics)", ex->method, p);
}

static void access_log(const pcr_exchange_t *ex, int status, double secs)
{
    if (!ex->srv->cfg->log.access_log)
        return;
    pcr_log_info("access %s %s %s %d %llu backend=%s route=%s blocks=%u/%u attempts=%u %.3fs",
                 ex->proto, ex->method, ex->path ? ex->path : "-", status,
                 (unsigned long long)ex->resp_bytes, ex->be ? ex->be->conf->name : "-",
                 ex->be ? pcr_reason_name(ex->decision.reason) : "-", ex->decision.matched_blocks,
                 ex->decision.total_blocks, ex->attempts, secs);
}

void pcr_exchange_free(pcr_exchange_t *ex)
{
    if (ex == NULL)
        return;
    pcr_server_t *srv = ex->srv;
    if (ex->up) {
        pcr_upstream_cancel(ex->up);
        ex->up = NULL;
    }
    if (ex->fanout)
        pcr_endpoint_models_cancel(ex);
    release(ex);
    if (ex->running) {
        /* 499: the client went away before the response ended (nginx's convention). */
        int status = ex->finished && !ex->aborted ? ex->status : 499;
        if (status >= 100 && status < 600)
            srv->metrics.requests_by_code[status]++;
        double secs = (double)(pcr_now_us() - ex->t_start) / 1e6;
        pcr_hist_observe(&srv->metrics.duration, secs);
        if (ex->t_head)
            pcr_hist_observe(&srv->metrics.ttfb, (double)(ex->t_head - ex->t_start) / 1e6);
        access_log(ex, status, secs);
        srv->inflight--;
    }
    pcr_body_dispose(&ex->req);
    free(ex->key.blocks);
    free(ex->tried);
    free(ex->path);
    free(ex->hbuf);
    if (ex->body)
        evbuffer_free(ex->body);
    free(ex);
    if (srv->draining)
        pcr_server_check_drained(srv);
}
