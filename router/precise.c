/* router/precise.c: owns precise mode's subscriber (kv_sub.h) on the control side: its start
 * and stop with routing.index, the list of pods it follows (each backend with a kv_events
 * endpoint, by slot), and the translation of what it decodes into bus messages, so that every
 * worker's replica applies each event to its pods' table (pcr_policy_kv_*). The callbacks run
 * on the subscriber's thread; the bus is made for any thread. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bus.h"
#include "kv_sub.h"
#include "log.h"
#include "precise.h"

/* Blocks of a LoRA adapter chain from another seed than the base model's: the router keys
 * requests on the base model's chains only, so an adapter's blocks never match them. */
static uint64_t lora_seed(const pcr_kv_event_t *e)
{
    return e->has_lora && e->lora_id != 0 ? 0x9E3779B97F4A7C15ull ^ (uint64_t)e->lora_id : 0;
}

static pcr_kvt_medium_t medium_of(pcr_kv_medium_t m)
{
    return m == PCR_KV_MEDIUM_CPU ? PCR_KVT_CPU : PCR_KVT_GPU;
}

/* vLLM sends one BlockRemoved per evicted block: consecutive ones on the same medium go out
 * as one bus message of up to REMOVED_RUN hashes, one call per worker, which the table
 * applies with its slots fetched ahead (hashring/kvtable.c). */
#define REMOVED_RUN 256

typedef struct {
    uint64_t hashes[REMOVED_RUN];
    size_t n;
    pcr_kvt_medium_t medium;
} removed_run_t;

static void removed_flush(pcr_server_t *srv, unsigned backend, removed_run_t *r)
{
    if (r->n > 0)
        pcr_bus_kv_removed(srv->bus, (int)backend, r->hashes, r->n, r->medium);
    r->n = 0;
}

static void on_batch(void *arg, unsigned backend, const pcr_kv_decoder_t *d,
                     const pcr_kv_batch_t *b)
{
    pcr_server_t *srv = arg;
    uint64_t now = pcr_now_us();
    removed_run_t run; /* 2 KiB */
    run.n = 0;
    for (uint32_t i = 0; i < b->nevents; i++) {
        const pcr_kv_event_t *e = pcr_kv_decoded_event(d, i);
        if (e == NULL)
            continue;
        /* A medium this router does not know (neither GPU nor CPU) is not a hit it can use. */
        if (e->kind != PCR_KV_CLEARED && e->medium == PCR_KV_MEDIUM_OTHER)
            continue;
        if (e->kind == PCR_KV_REMOVED) {
            if (run.n > 0 && run.medium != medium_of(e->medium))
                removed_flush(srv, backend, &run);
            if (run.n + e->nhashes > REMOVED_RUN) {
                removed_flush(srv, backend, &run);
                if (e->nhashes > REMOVED_RUN) { /* a long one goes as it came */
                    pcr_bus_kv_removed(srv->bus, (int)backend, e->hashes, e->nhashes,
                                       medium_of(e->medium));
                    continue;
                }
            }
            if (e->nhashes > 0) /* an empty list may have no array */
                memcpy(run.hashes + run.n, e->hashes, e->nhashes * sizeof(uint64_t));
            run.n += e->nhashes;
            run.medium = medium_of(e->medium);
            continue;
        }
        removed_flush(srv, backend, &run); /* the order of events is kept */
        switch (e->kind) {
        case PCR_KV_STORED: {
            pcr_kvt_stored_t ev = {e->hashes, e->nhashes, e->has_parent, e->parent, e->tokens,
                                   e->block_size, medium_of(e->medium), lora_seed(e)};
            pcr_bus_kv_stored(srv->bus, (int)backend, &ev, now);
            break;
        }
        case PCR_KV_CLEARED:
            pcr_bus_kv_clear(srv->bus, (int)backend);
            break;
        default:
            break;
        }
    }
    removed_flush(srv, backend, &run);
}

static void on_clear(void *arg, unsigned backend, pcr_kv_clear_t why)
{
    pcr_server_t *srv = arg;
    pcr_bus_kv_clear(srv->bus, (int)backend);
}

void pcr_precise_refresh(pcr_server_t *srv)
{
    pcr_kv_sub_t *sub = srv->kv_sub;
    if (sub == NULL || !srv->cfg->routing.index_events)
        return;
    size_t n = pcr_backend_slots(srv), k = 0;
    pcr_kv_pod_t *pods = calloc(n ? n : 1, sizeof(*pods));
    if (pods == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL || be->conf.kv_endpoint == NULL)
            continue;
        pods[k++] = (pcr_kv_pod_t){(unsigned)be->id, be->conf.name, be->conf.kv_endpoint,
                                   be->conf.kv_replay};
    }
    if (pcr_kv_sub_set_pods(sub, pods, k) != 0)
        pcr_log_error("precise mode: out of memory updating the pods' KV-event subscriptions");
    free(pods);
}

int pcr_precise_apply(pcr_server_t *srv)
{
    /* A subscriber once started stays until the process ends (/metrics reads its counters
     * from the workers): leaving the mode leaves it with no pod to follow. */
    if (!srv->cfg->routing.index_events) {
        if (srv->kv_sub != NULL)
            pcr_kv_sub_set_pods(srv->kv_sub, NULL, 0);
        return 0;
    }
    if (srv->kv_sub == NULL) {
        pcr_kv_sub_t *sub;
        /* A frame as large as the router would read a request body; replays wait 1 s at most,
         * and what arrives live meanwhile is held up to 1024 batches. */
        pcr_kv_sub_opts_t o = {srv->cfg->limits.max_body_bytes, 1000, 1024};
        pcr_kv_sub_cbs_t cbs = {on_batch, on_clear, srv};
        char err[256] = "";
        sub = pcr_kv_sub_new(&o, &cbs, err, sizeof(err));
        __atomic_store_n(&srv->kv_sub, sub, __ATOMIC_RELEASE);
        if (sub == NULL) {
            pcr_log_error("precise mode: the KV-event subscriber could not start: %s", err);
            return PCR_ERR_NOMEM;
        }
    }
    pcr_precise_refresh(srv);
    return 0;
}

void pcr_precise_stop(pcr_server_t *srv)
{
    if (srv->kv_sub == NULL)
        return;
    pcr_kv_sub_free(srv->kv_sub);
    srv->kv_sub = NULL;
}
