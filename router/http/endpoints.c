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

typedef struct {
    pcr_models_fanout_t *f;
    pcr_backend_t *be;
    pcr_upreq_t *up;
    int status;
    struct evbuffer *body;
} models_leg_t;

struct pcr_models_fanout {
    pcr_exchange_t *ex;
    models_leg_t *legs;
    size_t nlegs, pending;
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
    free(f->legs);
    free(f);
}

/* All legs answered: merge their "data" arrays, first occurrence of each id wins. */
static void fanout_finish(pcr_models_fanout_t *f)
{
    pcr_exchange_t *ex = f->ex;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    size_t ok = 0;
    for (size_t i = 0; i < f->nlegs; i++) {
        models_leg_t *leg = &f->legs[i];
        if (leg->status != 200 || leg->body == NULL)
            continue;
        size_t len = evbuffer_get_length(leg->body);
        cJSON *doc = cJSON_ParseWithLength((const char *)evbuffer_pullup(leg->body, -1), len);
        cJSON *arr = doc ? cJSON_GetObjectItemCaseSensitive(doc, "data") : NULL;
        if (!cJSON_IsArray(arr)) {
            pcr_log_warn("backend %s: /v1/models answer has no \"data\" array", leg->be->conf.name);
            cJSON_Delete(doc);
            continue;
        }
        ok++;
        cJSON *m;
        cJSON_ArrayForEach(m, arr) {
            cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
            if (!cJSON_IsString(id))
                continue;
            int seen = 0;
            cJSON *have;
            cJSON_ArrayForEach(have, data) {
                cJSON *hid = cJSON_GetObjectItemCaseSensitive(have, "id");
                if (strcmp(hid->valuestring, id->valuestring) == 0) {
                    seen = 1;
                    break;
                }
            }
            if (!seen)
                cJSON_AddItemToArray(data, cJSON_Duplicate(m, 1));
        }
        cJSON_Delete(doc);
    }
    ex->fanout = NULL;
    fanout_free(f);
    if (ok == 0) {
        cJSON_Delete(root);
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
    /* A model list is small; a backend that sends megabytes is not answering this question. */
    if (leg->body && evbuffer_get_length(leg->body) + len <= 4 * 1024 * 1024)
        evbuffer_add(leg->body, data, len);
    else
        leg->status = -1;
}

static void on_leg_done(void *ctx) { leg_over(ctx); }

static void on_leg_error(void *ctx, pcr_up_error_t err, int got_head)
{
    models_leg_t *leg = ctx;
    leg->status = -1;
    leg_over(leg);
}

static const pcr_upstream_cbs_t leg_cbs = {on_leg_head, on_leg_body, on_leg_done, on_leg_error,
                                          NULL,        NULL,        NULL};

int pcr_endpoint_models(pcr_exchange_t *ex)
{
    pcr_worker_t *w = ex->w;
    pcr_server_t *srv = w->srv;
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
        leg->up = pcr_upstream_send(pool, req, &leg_cbs, leg);
        if (leg->up)
            f->pending++;
        else
            leg->status = -1;
    }
    if (f->pending == 0) {
        fanout_free(f);
        return PCR_ERR_UNAVAIL;
    }
    ex->fanout = f;
    return 0;
}

void pcr_endpoint_models_cancel(pcr_exchange_t *ex)
{
    fanout_free(ex->fanout);
    ex->fanout = NULL;
}
