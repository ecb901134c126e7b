/* bench/sim/sim_pd.c: --role prefill|decode, vLLM's NixlConnector "pull" mode as the pods of
 * one vllm_sim process play it.
 *
 *   prefill side  a completion whose kv_transfer_params say do_remote_decode, that stopped
 *                 on max_tokens 1, answers with kv_transfer_params {do_remote_prefill: true,
 *                 do_remote_decode: false, remote_block_ids, remote_engine_id,
 *                 remote_request_id, remote_host, remote_port, tp_size}; the blocks are put
 *                 in the process's registry for a decode pod to pull, once.
 *   decode side   a completion whose kv_transfer_params say do_remote_prefill is checked
 *                 against the registry: the engine, request, host (the address the pod is
 *                 bound to: --kv-advertise-host may make the prefill pod name another, which
 *                 a proxy must replace), port and block ids must be those the prefill pod
 *                 gave, and the prompt's blocks the ones it computed. Valid: the request
 *                 reaches the engine after the transfer (tokens pulled at
 *                 --kv-transfer-tokens-per-s, model time) with the pulled blocks in the
 *                 pod's cache, so its prefill is skipped. Invalid or missing: it prefills
 *                 itself, counted in /metrics.
 *
 * A registry entry that nobody pulls leaves after REG_TTL_S (model time) or when the ring
 * wraps, as vLLM frees blocks held for a decode pod that never came. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define REG_SLOTS 4096
#define REG_TTL_S 120.0

typedef struct {
    char req_id[96];
    const sim_pod_t *pod;     /* the prefill pod (NULL: free slot) */
    uint64_t first_id;        /* remote_block_ids are first_id .. first_id + n - 1 */
    size_t n;
    uint64_t *hashes;
    double expires_us;        /* wall clock */
} reg_entry_t;

static reg_entry_t reg[REG_SLOTS];
static size_t reg_next;
static uint64_t next_block_id = 1;

const char *sim_pd_role_name(int role)
{
    return role == SIM_ROLE_PREFILL ? "prefill" : role == SIM_ROLE_DECODE ? "decode" : "both";
}

static void engine_id(const sim_pod_t *pod, char *out, size_t cap)
{
    snprintf(out, cap, "sim-engine-%s", pod->name);
}

static void reg_clear(reg_entry_t *e)
{
    free(e->hashes);
    memset(e, 0, sizeof(*e));
}

void sim_pd_parse(sim_req_t *r, const cJSON *root)
{
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(root, "kv_transfer_params");
    if (!cJSON_IsObject(kv))
        return;
    sim_pod_t *pod = r->pod;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(kv, "do_remote_decode"))) {
        r->kv_remote_decode = pod->role != SIM_ROLE_DECODE;
        return;
    }
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(kv, "do_remote_prefill")))
        return;
    /* A decode request: valid parameters, or the pod prefills itself. */
    const cJSON *eng = cJSON_GetObjectItemCaseSensitive(kv, "remote_engine_id");
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(kv, "remote_request_id");
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(kv, "remote_host");
    const cJSON *port = cJSON_GetObjectItemCaseSensitive(kv, "remote_port");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(kv, "remote_block_ids");
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(kv, "tp_size");
    reg_entry_t *e = NULL;
    double now = sim_now_us();
    if (pod->role != SIM_ROLE_PREFILL && cJSON_IsString(eng) && cJSON_IsString(rid) &&
        cJSON_IsString(host) && cJSON_IsNumber(port) && cJSON_IsArray(ids) &&
        cJSON_IsNumber(tp) && tp->valuedouble == 1 &&
        strcmp(host->valuestring, pod->conf->host) == 0) {
        for (size_t i = 0; i < REG_SLOTS && e == NULL; i++)
            if (reg[i].pod != NULL && strcmp(reg[i].req_id, rid->valuestring) == 0)
                e = &reg[i];
    }
    int ok = e != NULL && e->expires_us > now && e->pod->port == (int)port->valuedouble &&
             (size_t)cJSON_GetArraySize(ids) == e->n && e->n <= r->nblocks;
    if (ok) {
        char want[160];
        engine_id(e->pod, want, sizeof want);
        ok = strcmp(want, eng->valuestring) == 0;
        size_t k = 0;
        const cJSON *id;
        cJSON_ArrayForEach(id, ids) {
            if (!cJSON_IsNumber(id) || (uint64_t)id->valuedouble != e->first_id + k)
                ok = 0;
            k++;
        }
        ok = ok && (e->n == 0 || memcmp(e->hashes, r->hashes, e->n * sizeof(uint64_t)) == 0);
    }
    if (!ok) {
        pod->kv_pull_invalid++;
        return;
    }
    r->pull_blocks = e->n;
    r->pull_us = (double)(e->n * PCR_KV_BLOCK_TOKENS) / pod->conf->kv_transfer_tps * 1e6;
    reg_clear(e); /* pulled once: the prefill pod frees its blocks */
}

void sim_pd_pulled(sim_req_t *r)
{
    sim_pod_t *pod = r->pod;
    size_t hit;
    if (r->pull_blocks == 0 || r->pulled)
        return;
    r->pulled = 1;
    /* Named and pinned, then released: in the cache as the most recent, as blocks written
     * by a transfer are; the request's own admission then finds them. */
    if (pcr_kvcache_acquire(pod->kv, r->hashes, r->pull_blocks, 0, &hit) == 0)
        pcr_kvcache_release(pod->kv, r->hashes, r->pull_blocks, 0);
    pod->kv_pulls++;
    pod->kv_pulled_tokens += r->pull_blocks * PCR_KV_BLOCK_TOKENS;
}

void sim_pd_answer(const sim_req_t *r, struct evbuffer *out)
{
    sim_pod_t *pod = r->pod;
    if (!r->kv_remote_decode || r->max_tokens != 1 || r->sent != 1)
        return;
    reg_entry_t *e = &reg[reg_next];
    reg_next = (reg_next + 1) % REG_SLOTS;
    reg_clear(e);
    e->hashes = malloc((r->nblocks ? r->nblocks : 1) * sizeof(uint64_t));
    if (e->hashes == NULL)
        return; /* no parameters: the decode pod prefills itself */
    memcpy(e->hashes, r->hashes, r->nblocks * sizeof(uint64_t));
    e->pod = pod;
    e->n = r->nblocks;
    e->first_id = next_block_id;
    next_block_id += r->nblocks;
    e->expires_us = sim_now_us() + REG_TTL_S * 1e6 / pod->conf->time_scale;
    snprintf(e->req_id, sizeof e->req_id, "%s-%s-%llu", r->chat ? "chatcmpl" : "cmpl",
             pod->name, (unsigned long long)r->seq);
    char eng[160];
    engine_id(pod, eng, sizeof eng);
    evbuffer_add_printf(out, ",\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                        "\"do_remote_decode\":false,\"remote_block_ids\":[");
    for (size_t i = 0; i < e->n; i++)
        evbuffer_add_printf(out, i ? ",%llu" : "%llu", (unsigned long long)(e->first_id + i));
    evbuffer_add_printf(out, "],\"remote_engine_id\":\"%s\",\"remote_request_id\":\"%s\","
                        "\"remote_host\":\"%s\",\"remote_port\":%d,\"tp_size\":1}", eng,
                        e->req_id, pod->conf->kv_advertise_host, pod->port);
    pod->kv_handed++;
}
