/* router/http/exchange.c: owns one request/response pair, independent of the client's
 * protocol: the container (its request as the session feeds it), the request state machine
 * (exchange_int.h) with the accounting tied to it, the router's own answers, and the walk of
 * the route table (routes.c). Proxying to a pod, the decision and the retries are proxy.c's,
 * which the route table names: the exchange calls neither it nor the endpoints by name.
 *
 *   run -> route by path (the worker's route table) -> local endpoint (endpoints.c)
 *                                                   -> proxy (proxy.c)
 *
 * Every state change goes through pcr_exchange_to(): it alone moves the in-flight counts,
 * charges and releases the backend's queued prefill, and records the final status, durations
 * and the access log line, so that no path can count a request twice or not at all. The one
 * release outside it is an unstreamed completion's prefill at its expected first token
 * (pcr_exchange_prefill_due), which zeroes ex->prefill so that the later release is of nothing.
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

#include "pcr/common.h"
#include "budget.h"
#include "bus.h"
#include "exchange_int.h"
#include "tokenize.h"
#include "http1.h"
#include "pools.h"
#include "log.h"

/* Spare exchanges: an exchange is 3.7 KiB (its header offsets), past malloc's per-thread
 * caches, with a body buffer, a path and a header buffer of its own, all made and freed per
 * request. Freed ones wait on their thread's list with those buffers, empty, and the next
 * exchange is one of them, cleared. Up to SPARE_MAX, as many as a few HTTP/2 clients keep in
 * flight (at most about 0.5 MiB per worker). */
#define SPARE_MAX 128
/* A request refused for memory may come back in a second: the account is looked at every
 * outlier.probe_ms, and an upload flood that ends frees its bodies at once. */
#define OVERLOAD_RETRY_AFTER "1"

static __thread pcr_spare_t spare;

static void exchange_destroy(pcr_exchange_t *ex)
{
    free(ex->path_buf);
    free(ex->hbuf);
    free(ex->hf);
    free(ex->tblocks);
    if (ex->body)
        evbuffer_free(ex->body);
    if (ex->kept)
        evbuffer_free(ex->kept);
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
    struct evbuffer *body = ex->body, *kept = ex->kept;
    char *path_buf = ex->path_buf, *hbuf = ex->hbuf;
    size_t path_cap = ex->path_cap, hcap = ex->hcap, tblocks_cap = ex->tblocks_cap;
    pcr_hfield_t *hf = ex->hf;
    size_t hf_cap = ex->hf_cap;
    uint64_t *tblocks = ex->tblocks;
    memset(ex, 0, sizeof(*ex));
    ex->hf = hf;
    ex->hf_cap = hf_cap;
    ex->tblocks = tblocks;
    ex->tblocks_cap = tblocks_cap;
    ex->body = body;
    ex->kept = kept;
    ex->path_buf = path_buf;
    ex->path_cap = path_cap;
    ex->hbuf = hbuf;
    ex->hcap = hcap;
    return ex;
}

/* A body reader is counted in the memory account while an exchange holds it (memacct.h). */
void pcr_exchange_reader_release(pcr_exchange_t *ex)
{
    if (ex->reader == NULL)
        return;
    pcr_body_reader_free(ex->reader);
    ex->reader = NULL;
    PCR_STORE(ex->w->nreaders, ex->w->nreaders - 1);
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
    PCR_STORE(w->nexchanges, w->nexchanges + 1);
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

void pcr_exchange_drop_body(pcr_exchange_t *ex)
{
    if (ex->body_dropped || ex->state != EX_RECEIVING)
        return;
    ex->body_dropped = 1;
    evbuffer_drain(ex->body, evbuffer_get_length(ex->body));
    pcr_exchange_reader_release(ex);
    /* body_counted stays, for the access log's bytes_in; the budget's count goes now. */
    if (ex->body_counted)
        pcr_budget_account(ex->w, -(ptrdiff_t)ex->body_counted);
}

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
    ex->unsent_at_end = pcr_exchange_unsent(ex);
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

/* The request's uncached prefill joins its backend's queue, and its pod priority's share of
 * it (pod_pslot, flow control's saturation); leaving undoes both. */
static void prefill_join(pcr_exchange_t *ex)
{
    PCR_ADD(ex->be->queued_prefill, ex->prefill);
    if (ex->pod_pslot)
        PCR_ADD(ex->be->prefill_by_slot[ex->pod_pslot - 1], ex->prefill);
    pending_join(ex);
}

static void prefill_leave(pcr_exchange_t *ex)
{
    PCR_SUB(ex->be->queued_prefill, ex->prefill);
    if (ex->pod_pslot)
        PCR_SUB(ex->be->prefill_by_slot[ex->pod_pslot - 1], ex->prefill);
    pending_leave(ex);
    /* Its pod's prefill has room again (flow_control.prefill_per_pod): the flow queue looks
     * now, not at its next tick, so that the pod gets its next prompt while it decodes this
     * one's first tokens rather than idling until then. */
    if (ex->prefill > 0 && ex->w->flow_ev != NULL)
        event_active(ex->w->flow_ev, EV_TIMEOUT, 1);
}

/* The one place a request changes state; see the table in exchange_int.h. */
void pcr_exchange_to(pcr_exchange_t *ex, pcr_ex_state_t to)
{
    pcr_ex_state_t from = ex->state;
    pcr_worker_t *w = ex->w;
    pcr_backend_t *be = ex->be;
    if (from == to)
        return;
    if (from == EX_RECEIVING)
        PCR_INC(w->inflight);
    if (holds_prefill(from) && !holds_prefill(to))
        prefill_leave(ex);
    if (holds_backend(from) && !holds_backend(to)) {
        PCR_SUB(be->inflight, 1);
        if (w->flow_ev != NULL) /* a pod has room: the flow queue may release a request */
            event_active(w->flow_ev, EV_TIMEOUT, 1);
    }
    if (!holds_backend(from) && holds_backend(to))
        PCR_ADD(be->inflight, 1);
    if (!holds_prefill(from) && holds_prefill(to))
        prefill_join(ex);
    ex->state = to;
    if (to == EX_ABORTED)
        PCR_INC(w->metrics.responses_aborted);
    if (to == EX_DONE || to == EX_ABORTED || to == EX_GONE) {
        if (ex->admitted) {
            PCR_SUB(w->srv->tenants[ex->tslot].concurrent, 1);
            ex->admitted = 0;
        }
        record(ex, ex->status, to != EX_GONE && holds_backend(from));
    }
}

/* An unstreamed completion's expected first token has come: its prefill leaves the pod's queue
 * as the decisions count it, and it no longer keeps the pod's settled_before back, as a stream's
 * first event would. The one release outside pcr_exchange_to(): it zeroes ex->prefill, so that
 * the later release there is of nothing. */
void pcr_exchange_prefill_due(pcr_exchange_t *ex)
{
    if (!holds_prefill(ex->state))
        return;
    prefill_leave(ex);
    ex->prefill = 0;
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
    /* The sessions keep a request's head within limits.max_header_bytes, its path included. */
    int rc = pcr_grow(&ex->path_buf, &ex->path_cap, len + 1, 128,
                      ex->w->cfg->limits.max_header_bytes + 1, NULL);
    if (rc != 0)
        return rc;
    memcpy(ex->path_buf, path, len);
    ex->path_buf[len] = '\0';
    ex->path = ex->path_buf;
    return 0;
}

void pcr_exchange_set_client(pcr_exchange_t *ex, const char *peer, int admin,
                             pcr_light_client_t *load)
{
    if (peer == NULL)
        peer = "-";
    size_t n = strnlen(peer, sizeof(ex->peer) - 1);
    memcpy(ex->peer, peer, n);
    ex->peer[n] = '\0';
    ex->admin = admin;
    ex->client_load = load;
}

static int hbuf_put(pcr_exchange_t *ex, const char *s, size_t len)
{
    /* The sessions keep a request's header fields within limits.max_header_bytes. */
    int rc = pcr_grow(&ex->hbuf, &ex->hcap, ex->hlen + len, 512,
                      ex->w->cfg->limits.max_header_bytes, NULL);
    if (rc == 0)
        rc = pcr_grow_elems(&ex->hf, &ex->hf_cap, ex->nh + 1, sizeof(*ex->hf), 16,
                            PCR_MAX_REQ_HEADERS * 2, NULL);
    if (rc != 0)
        return rc;
    ex->hf[ex->nh] = (pcr_hfield_t){(uint32_t)ex->hlen, (uint32_t)len};
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
    int rc = hbuf_put(ex, name, nlen);
    return rc != 0 ? rc : hbuf_put(ex, value, vlen);
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

int pcr_exchange_reader_start(pcr_exchange_t *ex)
{
    /* The defaults are zeros but for the two sizes, which the config gives (and the policy
     * defaults' whole struct, pcr_body_opts_default, is not filled per request). */
    pcr_body_opts_t o;
    memset(&o, 0, sizeof(o));
    o.block_bytes = ex->w->cfg->routing.block_bytes;
    o.max_prefix_bytes = ex->w->cfg->routing.max_prefix_bytes;
    ex->reader = pcr_body_reader_new((pcr_api_t)routed_api(ex), &o);
    if (ex->reader == NULL)
        return PCR_ERR_NOMEM;
    PCR_STORE(ex->w->nreaders, ex->w->nreaders + 1);
    return 0;
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
        if (ex->reader == NULL && pcr_exchange_reader_start(ex) < 0)
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

void pcr_exchange_respond_head(pcr_exchange_t *ex, int status, const pcr_hdr_t *h, size_t n,
                               int64_t clen)
{
    ex->status = status;
    ex->t_head = pcr_now_us();
    ex->ops->send_head(ex, status, h, n, clen);
}

void pcr_exchange_reply(pcr_exchange_t *ex, int status, const char *content_type, const char *body,
                        size_t len, const pcr_hdr_t *extra, size_t nextra)
{
    if (pcr_exchange_responded(ex) || holds_backend(ex->state))
        return;
    pcr_exchange_to(ex, EX_LOCAL);
    pcr_hdr_t h[8];
    size_t n = 0;
    h[n++] = (pcr_hdr_t){"content-type", 12, content_type, strlen(content_type)};
    for (size_t i = 0; i < nextra && n < PCR_ARRAY_SIZE(h); i++)
        h[n++] = extra[i];
    pcr_exchange_respond_head(ex, status, h, n, (int64_t)len);
    if (len > 0)
        pcr_exchange_respond_body(ex, body, len);
    pcr_exchange_to(ex, EX_DONE);
    pcr_exchange_respond_end(ex, RESPOND_END);
}

/* The OpenAI-style error body; cJSON writes the message with every escape JSON needs. */
static void error_reply(pcr_exchange_t *ex, int status, const char *type, const char *code,
                        const char *msg, const pcr_hdr_t *with, size_t nwith)
{
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", msg);
    cJSON_AddStringToObject(err, "type", type);
    cJSON_AddStringToObject(err, "code", code);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    static const char fallback[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":\"internal\"}}";
    const char *body = text ? text : fallback;
    pcr_hdr_t extra[4];
    size_t nextra = 0;
    for (size_t i = 0; i < nwith && nextra + 1 < PCR_ARRAY_SIZE(extra); i++)
        extra[nextra++] = with[i];
    if (status == 405 && ex->route != NULL) {
        const char *allow = ex->route->method; /* the route that refused the method */
        extra[nextra++] = (pcr_hdr_t){"allow", 5, allow, strlen(allow)};
    }
    pcr_exchange_reply(ex, status, "application/json", body, strlen(body), extra, nextra);
    free(text);
}

static void error_v(pcr_exchange_t *ex, int status, const char *type, const char *code,
                    const pcr_hdr_t *with, size_t nwith, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    error_reply(ex, status, type, code, msg, with, nwith);
}

void pcr_exchange_error(pcr_exchange_t *ex, int status, const char *type, const char *code,
                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_v(ex, status, type, code, NULL, 0, fmt, ap);
    va_end(ap);
}

void pcr_exchange_budget_refused(pcr_exchange_t *ex)
{
    pcr_worker_t *w = ex->w;
    PCR_INC(w->metrics.body_budget_refusals);
    pcr_exchange_error(ex, 503, "service_unavailable", "body_budget_exhausted",
                       "the request body could not be buffered within %u ms "
                       "(timeouts.client_idle_ms): the memory for request bodies, "
                       "limits.max_buffered_body_bytes (%zu bytes), is taken by other requests",
                       w->cfg->timeouts.client_idle_ms, w->cfg->limits.max_buffered_body_bytes);
}

void pcr_exchange_error_with(pcr_exchange_t *ex, int status, const char *type, const char *code,
                             const pcr_hdr_t *extra, size_t nextra, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_v(ex, status, type, code, extra, nextra, fmt, ap);
    va_end(ap);
}

int pcr_exchange_overloaded(pcr_exchange_t *ex)
{
    if (ex->admin || !pcr_mem_action_fresh(ex->w->srv, PCR_OVERLOAD_REFUSE_REQUESTS))
        return 0;
    const pcr_route_t *rt = route_find(ex);
    return rt == NULL || !rt->own;
}

void pcr_exchange_overload_refused(pcr_exchange_t *ex)
{
    const pcr_server_t *srv = ex->w->srv;
    PCR_INC(ex->w->metrics.overload_refusals[PCR_OVERLOAD_REFUSE_REQUESTS]);
    uint64_t now = pcr_mem_accounted_fresh(srv);
    pcr_hdr_t h[1] = {{"retry-after", 11, OVERLOAD_RETRY_AFTER, sizeof(OVERLOAD_RETRY_AFTER) - 1}};
    pcr_exchange_error_with(ex, 503, "server_overloaded", "memory_pressure", h, 1,
                            "pcrouter is refusing new requests: the memory it accounts for, "
                            "%llu bytes, is past %u%% of limits.max_memory_bytes (%llu bytes); "
                            "retry later", (unsigned long long)now,
                            pcr_overload_threshold(PCR_OVERLOAD_REFUSE_REQUESTS) / 10,
                            (unsigned long long)PCR_LOAD(srv->mem_limit));
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
    pcr_exchange_to(ex, EX_ROUTING);
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
    /* An answer gathered from the pods is the router's own: LOCAL until it is complete. */
    if (rt->kind == PCR_ROUTE_FANOUT)
        pcr_exchange_to(ex, EX_LOCAL);
    if (rt->serve(ex) < 0)
        pcr_exchange_error(ex, 503, "service_unavailable", "no_backend", "no backend is available");
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
    if (ex->tok != NULL)
        pcr_tokenize_cancel(ex);
    if (ex->fentry.queued && w->flowq != NULL) { /* its client left while it waited for the pool */
        pcr_flowq_remove(w->flowq, &ex->fentry);
        PCR_SUB(w->metrics.tenants[ex->tslot].waiting, 1);
    }
    if (ex->state != EX_RECEIVING && !pcr_exchange_finished(ex)) {
        /* 499: the client went away before the response ended (nginx's convention). */
        ex->status = 499;
        pcr_exchange_to(ex, EX_GONE);
    }
    if (ex->state != EX_RECEIVING)
        PCR_STORE(w->inflight, w->inflight - 1);
    PCR_STORE(w->nexchanges, w->nexchanges - 1);
    pcr_exchange_kept_release(ex);
    pcr_budget_forget(w, ex);
    if (ex->body_counted && !ex->body_dropped)
        pcr_budget_account(w, -(ptrdiff_t)ex->body_counted);
    pcr_body_dispose(&ex->req);
    pcr_exchange_reader_release(ex);
    pcr_usage_dispose(&ex->usage);
    if (ex->pd_resp != NULL)
        evbuffer_free(ex->pd_resp);
    if (ex->pd_body != NULL)
        evbuffer_free(ex->pd_body);
    if (ex->be != NULL)
        pcr_backend_unref(ex->be);
    /* Kept for the next exchange: the buffers, emptied. A body still referenced by a pod
     * connection's output (pcr_up_send_t.body) keeps its chains alive there. A path or a
     * header buffer grown past what requests usually need is not kept. */
    int keep = ex->body != NULL && ex->path_cap <= 4096 && ex->hcap <= 16384;
    if (keep)
        evbuffer_drain(ex->body, evbuffer_get_length(ex->body));
    if (!keep || !pcr_spare_put(&spare, &ex->spare, SPARE_MAX))
        exchange_destroy(ex);
    pcr_worker_check_drained(w);
}
