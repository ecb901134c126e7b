/* router/upstream/models.c: what each pod says it serves, from its GET /v1/models (LoRA adapters
 * appear there as models of their own), read on the control thread over the checks' connection
 * (probe.c) when a backend joins and then every scrape.models_interval_ms (0: never). The list
 * joins the config's `models` (backend.h): a request names a model, and only pods serving it are
 * candidates; a request for a model no pod serves gets 404 model_not_found. A pod that has not
 * answered yet serves any model unless its config lists some. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <event2/buffer.h>

#include "backend.h"
#include "log.h"
#include "models.h"
#include "probe.h"

#define MODELS_MAX_BYTES (1024 * 1024)

typedef struct {
    pcr_backend_t *be;
    int status;
    struct evbuffer *body;
} models_ctx_t;

/* Reads {"data": [{"id": "..."}, ...]}; -1 when it is not that. */
int pcr_models_parse(const char *text, size_t len, uint64_t *hashes, size_t max, size_t *n)
{
    cJSON *doc = cJSON_ParseWithLength(text, len);
    cJSON *data = doc ? cJSON_GetObjectItemCaseSensitive(doc, "data") : NULL;
    if (!cJSON_IsArray(data)) {
        cJSON_Delete(doc);
        return -1;
    }
    *n = 0;
    cJSON *m;
    cJSON_ArrayForEach(m, data) {
        cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
        if (cJSON_IsString(id) && id->valuestring != NULL && *n < max)
            hashes[(*n)++] = pcr_model_hash(id->valuestring, strlen(id->valuestring));
    }
    cJSON_Delete(doc);
    return 0;
}

static void models_end(models_ctx_t *c)
{
    pcr_backend_t *be = c->be;
    be->models_req = NULL;
    be->models_ctx = NULL;
    evbuffer_free(c->body);
    free(c);
}

static void on_head(void *ctx, int status) { ((models_ctx_t *)ctx)->status = status; }

/* The probe ends the read past MODELS_MAX_BYTES (incomplete). */
static void on_body(void *ctx, const char *data, size_t len)
{
    models_ctx_t *c = ctx;
    evbuffer_add(c->body, data, len);
}

static void on_end(void *ctx, int complete)
{
    models_ctx_t *c = ctx;
    pcr_backend_t *be = c->be;
    if (!complete) {
        models_end(c);
        return;
    }
    uint64_t h[PCR_MAX_MODELS];
    size_t n = 0;
    size_t len = evbuffer_get_length(c->body);
    if (c->status == 200 &&
        pcr_models_parse((const char *)evbuffer_pullup(c->body, -1), len, h, PCR_MAX_MODELS,
                         &n) == 0) {
        int first = !PCR_LOAD(be->pod_models.known);
        pcr_modelset_store(&be->pod_models, h, n);
        if (first)
            pcr_log_info("backend %s serves %zu model(s)", be->conf.name, n);
    } else if (c->status != 404) {
        /* 404: a server without the endpoint; its config's list (or any model) stands. */
        pcr_log_debug("backend %s: GET /v1/models gave no model list (status %d)", be->conf.name,
                      c->status);
    }
    models_end(c);
}

static const pcr_probe_cbs_t models_cbs = {on_head, on_body, on_end};

void pcr_models_fetch(pcr_backend_t *be)
{
    pcr_server_t *srv = be->srv;
    if (be->models_req != NULL || PCR_LOAD(be->removed))
        return;
    models_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL || (c->body = evbuffer_new()) == NULL) {
        free(c);
        return;
    }
    c->be = be;
    be->models_req = pcr_probe_get(be, "/v1/models", "pcrouter-models", "application/json",
                                   srv->cfg->scrape.timeout_ms, MODELS_MAX_BYTES, &models_cbs, c);
    if (be->models_req == NULL) {
        evbuffer_free(c->body);
        free(c);
        return;
    }
    be->models_ctx = c;
    be->models_at_us = pcr_now_us();
}

void pcr_models_cancel(pcr_backend_t *be)
{
    if (be->models_req == NULL)
        return;
    pcr_probe_cancel(be->models_req);
    be->models_req = NULL;
    models_end(be->models_ctx);
}

void pcr_models_tick(pcr_backend_t *be, uint64_t now)
{
    unsigned ms = be->srv->cfg->scrape.models_interval_ms;
    if (ms == 0 || PCR_LOAD(be->up) == 0)
        return;
    if (be->models_at_us == 0 || now - be->models_at_us >= (uint64_t)ms * 1000)
        pcr_models_fetch(be);
}
