/* router/http/endpoints.c: the router's own endpoints: GET /health, GET /metrics, and GET
 * /v1/models (a fan-out to every backend that is up, answered with the union of their model lists).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "exchange_int.h"
#include "log.h"
#include "metrics.h"
#include "pools.h"

/* 200 when a pod is usable; 503 when none is, and while a cold start loads the index shared
 * through Redis (requests are routed meanwhile, from the local index: only readiness waits). */
int pcr_endpoint_health(pcr_exchange_t *ex)
{
    size_t up = pcr_backends_up(ex->w->srv);
    int loading = PCR_LOAD(ex->w->srv->share_loading);
    char body[200];
    int n = snprintf(body, sizeof(body), "{\"status\":\"%s\",\"backends_up\":%zu,\"backends\":%zu%s%s}",
                     loading ? "loading" : up ? "ok" : "unavailable", up,
                     pcr_backends_count(ex->w->srv),
                     loading ? ",\"detail\":\"loading the prefix index shared through Redis\"" : "",
                     ex->w->draining ? ",\"draining\":true" : "");
    pcr_exchange_reply(ex, up && !loading ? 200 : 503, "application/json", body, (size_t)n, NULL, 0);
    return 0;
}

int pcr_endpoint_metrics(pcr_exchange_t *ex)
{
    struct evbuffer *out = evbuffer_new();
    if (out == NULL) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return 0;
    }
    pcr_metrics_render(ex->w, out);
    size_t len = evbuffer_get_length(out);
    pcr_exchange_reply(ex, 200, "text/plain; version=0.0.4; charset=utf-8",
                       (const char *)evbuffer_pullup(out, -1), len, NULL, 0);
    evbuffer_free(out);
    return 0;
}

/* ---- GET /v1/models ------------------------------------------------------------------ */

/* A model list is small; a backend that sends more is not answering this question. */
#define LEG_MAX_BYTES (4 * 1024 * 1024)

typedef struct {
    pcr_models_fanout_t *f;
    pcr_backend_t *be;
    pcr_upreq_t *up;
    int status;                    /* the pod's, or -1: failed, cut off at the cap, or late */
    int late;
    struct evbuffer *body;
} models_leg_t;

struct pcr_models_fanout {
    pcr_exchange_t *ex;
    models_leg_t *legs;
    size_t nlegs, pending;
    struct event *deadline;        /* scrape.models_timeout_ms: the answer goes with what came */
};

static void fanout_free(pcr_models_fanout_t *f)
{
    for (size_t i = 0; i < f->nlegs; i++) {
        if (f->legs[i].up)
            pcr_upstream_cancel(f->legs[i].up);
        if (f->legs[i].body)
            evbuffer_free(f->legs[i].body);
        if (f->legs[i].be)
            pcr_backend_unref(f->legs[i].be);
    }
    if (f->deadline)
        event_free(f->deadline);
    free(f->legs);
    free(f);
}

typedef struct {
    const char *id;
    size_t seq;                    /* position in the pods' lists, in order */
} model_ref_t;

static int ref_cmp(const void *a, const void *b)
{
    const model_ref_t *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c != 0 ? c : x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* The union of the parsed lists' "data" entries, each id once (its first occurrence, in the
 * pods' order), moved into `data`. Sorting by (id, position) finds the duplicates in
 * O(n log n): a pod listing 100,000 models (adapters) must not cost n^2 string compares. */
static int merge_lists(cJSON **docs, size_t ndocs, cJSON *data)
{
    size_t total = 0;
    for (size_t i = 0; i < ndocs; i++)
        total += (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(docs[i], "data"));
    model_ref_t *refs = malloc((total ? total : 1) * sizeof(*refs));
    cJSON **items = malloc((total ? total : 1) * sizeof(*items));
    unsigned char *keep = calloc(total ? total : 1, 1);
    if (refs == NULL || items == NULL || keep == NULL) {
        free(refs);
        free(items);
        free(keep);
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < ndocs; i++) {
        cJSON *m;
        cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(docs[i], "data")) {
            cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
            items[n] = m;
            if (cJSON_IsString(id) && id->valuestring != NULL)
                refs[n] = (model_ref_t){id->valuestring, n};
            else
                refs[n] = (model_ref_t){NULL, n}; /* no id: left out */
            n++;
        }
    }
    size_t nref = 0;
    for (size_t i = 0; i < n; i++)
        if (refs[i].id != NULL)
            refs[nref++] = refs[i];
    qsort(refs, nref, sizeof(*refs), ref_cmp);
    for (size_t i = 0; i < nref; i++)
        if (i == 0 || strcmp(refs[i - 1].id, refs[i].id) != 0)
            keep[refs[i].seq] = 1;
    for (size_t i = 0; i < n; i++) {
        if (keep[i])
            cJSON_AddItemToArray(data, cJSON_Duplicate(items[i], 1));
    }
    free(refs);
    free(items);
    free(keep);
    return 0;
}

/* All legs answered, or the deadline passed: the union of the lists that came whole. */
static void fanout_finish(pcr_models_fanout_t *f)
{
    pcr_exchange_t *ex = f->ex;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON **docs = calloc(f->nlegs ? f->nlegs : 1, sizeof(*docs));
    size_t ok = 0, late = 0;
    for (size_t i = 0; i < f->nlegs && docs != NULL; i++) {
        models_leg_t *leg = &f->legs[i];
        late += leg->late;
        if (leg->status != 200 || leg->body == NULL)
            continue;
        size_t len = evbuffer_get_length(leg->body);
        cJSON *doc = cJSON_ParseWithLength((const char *)evbuffer_pullup(leg->body, -1), len);
        evbuffer_free(leg->body);
        leg->body = NULL;
        if (!cJSON_IsArray(doc ? cJSON_GetObjectItemCaseSensitive(doc, "data") : NULL)) {
            pcr_log_warn("backend %s: /v1/models answer has no \"data\" array", leg->be->conf.name);
            cJSON_Delete(doc);
            continue;
        }
        docs[ok++] = doc;
    }
    int merged = docs != NULL && root != NULL && data != NULL && merge_lists(docs, ok, data) == 0;
    for (size_t i = 0; i < ok; i++)
        cJSON_Delete(docs[i]);
    free(docs);
    ex->fanout = NULL;
    fanout_free(f);
    if (!merged) {
        cJSON_Delete(root);
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return;
    }
    if (ok == 0) {
        cJSON_Delete(root);
        if (late > 0)
            pcr_exchange_error(ex, 504, "upstream_error", "gateway_timeout",
                               "no backend answered GET /v1/models within %u ms "
                               "(scrape.models_timeout_ms)", ex->w->cfg->scrape.models_timeout_ms);
        else
            pcr_exchange_error(ex, 502, "upstream_error", "bad_gateway",
                               "no backend answered GET /v1/models");
        return;
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (text == NULL) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return;
    }
    pcr_exchange_reply(ex, 200, "application/json", text, strlen(text), NULL, 0);
    free(text);
}

/* scrape.models_timeout_ms passed: the pods still answering are left out. */
static void on_fanout_deadline(evutil_socket_t fd, short what, void *arg)
{
    pcr_models_fanout_t *f = arg;
    for (size_t i = 0; i < f->nlegs; i++) {
        models_leg_t *leg = &f->legs[i];
        if (leg->up == NULL)
            continue;
        pcr_log_info("backend %s: GET /v1/models not answered within %u ms: left out",
                     leg->be->conf.name, f->ex->w->cfg->scrape.models_timeout_ms);
        pcr_upstream_cancel(leg->up);
        leg->up = NULL;
        leg->status = -1;
        leg->late = 1;
    }
    f->pending = 0;
    fanout_finish(f);
}

static void leg_over(models_leg_t *leg)
{
    leg->up = NULL;
    if (--leg->f->pending == 0)
        fanout_finish(leg->f);
}

static void on_leg_head(void *ctx, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    models_leg_t *leg = ctx;
    leg->status = status;
}

static void on_leg_body(void *ctx, const char *data, size_t len)
{
    models_leg_t *leg = ctx;
    if (leg->body && evbuffer_get_length(leg->body) + len <= LEG_MAX_BYTES) {
        evbuffer_add(leg->body, data, len);
        return;
    }
    /* Past the cap: the read stops here (its connection is closed), not at the body's end. */
    pcr_log_warn("backend %s: GET /v1/models answer over %d bytes: left out", leg->be->conf.name,
                 LEG_MAX_BYTES);
    pcr_upstream_cancel(leg->up);
    leg->status = -1;
    leg_over(leg);
}

static void on_leg_done(void *ctx) { leg_over(ctx); }

static void on_leg_error(void *ctx, pcr_up_error_t err, int got_head)
{
    models_leg_t *leg = ctx;
    leg->status = -1;
    leg_over(leg);
}

static const pcr_upstream_cbs_t leg_cbs = {on_leg_head, on_leg_body, on_leg_done, on_leg_error,
                                          NULL,        NULL,        NULL,        NULL};

int pcr_endpoint_models(pcr_exchange_t *ex)
{
    pcr_worker_t *w = ex->w;
    pcr_server_t *srv = w->srv;
    if (pcr_tenancy_identify(ex) < 0) /* the model list needs a key as any API call does */
        return 0;
    pcr_models_fanout_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return PCR_ERR_NOMEM;
    f->ex = ex;
    size_t n = pcr_backend_slots(srv);
    f->legs = calloc(n ? n : 1, sizeof(*f->legs));
    if (f->legs == NULL) {
        free(f);
        return PCR_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        pcr_pool_t *pool = be != NULL && PCR_LOAD(be->up) ? pcr_pools_get(w, be) : NULL;
        if (pool == NULL)
            continue;
        models_leg_t *leg = &f->legs[f->nlegs];
        struct evbuffer *req = evbuffer_new();
        leg->body = evbuffer_new();
        if (req == NULL || leg->body == NULL) {
            if (req)
                evbuffer_free(req);
            continue;
        }
        leg->f = f;
        leg->be = be;
        pcr_backend_ref(be);
        f->nlegs++;
        evbuffer_add_printf(req, "GET /v1/models HTTP/1.1\r\nHost: %s\r\nAccept: application/json\r\n\r\n",
                            be->host_header);
        leg->up = pcr_upstream_send(pool, &(pcr_up_send_t){.head = req}, &leg_cbs, leg);
        if (leg->up)
            f->pending++;
        else
            leg->status = -1;
    }
    if (f->pending == 0) {
        fanout_free(f);
        return PCR_ERR_UNAVAIL;
    }
    f->deadline = evtimer_new(w->base, on_fanout_deadline, f);
    if (f->deadline == NULL) {
        fanout_free(f);
        return PCR_ERR_NOMEM;
    }
    struct timeval tv = pcr_ms_to_tv(w->cfg->scrape.models_timeout_ms);
    evtimer_add(f->deadline, &tv);
    ex->fanout = f;
    return 0;
}

void pcr_endpoint_models_cancel(pcr_exchange_t *ex)
{
    fanout_free(ex->fanout);
    ex->fanout = NULL;
}
