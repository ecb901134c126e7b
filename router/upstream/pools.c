/* router/upstream/pools.c: owns a worker's upstream pools (pools.h): their table by backend slot,
 * their owner's slot in the backend's rank order of held streams, and the word sent to the other
 * workers when a pod's prefill budget opens while they hold streams for it. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pcr/common.h"
#include "backend.h"
#include "pools.h"

/* A backend's prefill budget is open and workers other than `self` hold streams for it: each
 * is told through its command pipe, at most one word on the way to each, and sends what its
 * pools may (pcr_pools_kick_held). */
static void wake_held(void *arg)
{
    pcr_worker_t *self = arg;
    pcr_server_t *srv = self->srv;
    for (unsigned i = 0; i < srv->nworkers; i++) {
        pcr_worker_t *w = &srv->workers[i];
        if (w == self || __atomic_exchange_n(&w->hold_wake, 1, __ATOMIC_ACQ_REL))
            continue;
        ssize_t n = write(w->cmd_fd[1], "H", 1);
        (void)n; /* the pipe cannot be full: this is the only word that is not rare */
    }
}

/* The table's entry for slot `id`, grown to hold it; NULL when out of memory. */
static pcr_pool_t **table_slot(pcr_pool_t ***pools, size_t *npools, size_t id)
{
    if (id >= *npools) {
        size_t old = *npools;
        if (pcr_grow_elems(pools, npools, id + 1, sizeof(**pools), 8, PCR_MAX_BACKENDS, NULL) != 0)
            return NULL;
        memset(*pools + old, 0, (*npools - old) * sizeof(**pools));
    }
    return &(*pools)[id];
}

/* A tokenization is one short request: two connections per worker keep a burst moving. */
#define TOKENIZE_CONNECTIONS 2

pcr_pool_t *pcr_pools_tokenize(pcr_worker_t *w, pcr_backend_t *be)
{
    pcr_pool_t **slot = table_slot(&w->tok_pools, &w->ntok_pools, (size_t)be->id);
    if (slot == NULL)
        return NULL;
    if (*slot != NULL)
        return (*slot)->be == be ? *slot : NULL;
    pcr_pool_t *pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return NULL;
    pcr_pool_init(pool, be, w->base, TOKENIZE_CONNECTIONS, &w->draining, &w->cfg);
    pcr_backend_ref(be);
    *slot = pool;
    return pool;
}

pcr_pool_t *pcr_pools_get(pcr_worker_t *w, pcr_backend_t *be)
{
    size_t id = (size_t)be->id;
    if (table_slot(&w->pools, &w->npools, id) == NULL)
        return NULL;
    pcr_pool_t *pool = w->pools[id];
    if (pool != NULL && pool->be == be)
        return pool;
    /* A slot is reused only once the backend that had it is gone, pools included. */
    if (pool != NULL)
        return NULL;
    pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return NULL;
    /* The backend's bound is for the process: each worker gets its share. */
    unsigned max = PCR_LOAD(be->max_connections);
    pcr_pool_init(pool, be, w->base, (max + w->srv->nworkers - 1) / w->srv->nworkers, &w->draining,
                  &w->cfg);
    pcr_pool_set_owner(pool, (int)w->id, wake_held, w);
    pcr_backend_ref(be);
    w->pools[id] = pool;
    return pool;
}

/* Pools of backends that left: idle connections close now, the pool goes with its last one. */
static void release_table(pcr_pool_t **pools, size_t npools, int all)
{
    for (size_t i = 0; i < npools; i++) {
        pcr_pool_t *pool = pools[i];
        if (pool == NULL || (!all && !PCR_LOAD(pool->be->removed)))
            continue;
        pcr_upstream_close_idle(pool);
        if (pool->nconns == 0 && TAILQ_EMPTY(&pool->waiters)) {
            pcr_backend_unref(pool->be);
            free(pool);
            pools[i] = NULL;
        }
    }
}

static void release_pools(pcr_worker_t *w, int all)
{
    release_table(w->pools, w->npools, all);
    release_table(w->tok_pools, w->ntok_pools, all);
}

/* Streams held for a backend that went out of rotation (down, ejected, removed) are routed
 * again now: waiting for its prefill queue to drain could take until timeouts.response_ms.
 * The others go if the pod's budget is open (what no wake-up told this worker). */
static void fail_held_out(pcr_worker_t *w)
{
    uint64_t now = 0;
    for (size_t i = 0; i < w->npools; i++) {
        pcr_pool_t *pool = w->pools[i];
        if (pool == NULL || pool->nheld == 0)
            continue;
        if (now == 0)
            now = pcr_now_us();
        pcr_backend_t *be = pool->be;
        if (!PCR_LOAD(be->up) || PCR_LOAD(be->removed) || pcr_backend_ejected(be, now))
            pcr_upstream_fail_held(pool);
        else
            pcr_upstream_kick(pool);
    }
}

void pcr_pools_tick(pcr_worker_t *w)
{
    fail_held_out(w);
    release_pools(w, 0);
}

void pcr_pools_kick_held(pcr_worker_t *w)
{
    __atomic_store_n(&w->hold_wake, 0, __ATOMIC_RELEASE); /* a later wake writes again */
    for (size_t i = 0; i < w->npools; i++)
        if (w->pools[i] != NULL && w->pools[i]->nheld > 0)
            pcr_upstream_kick(w->pools[i]);
}

void pcr_pools_close_idle(pcr_worker_t *w)
{
    for (size_t i = 0; i < w->npools; i++)
        if (w->pools[i] != NULL)
            pcr_upstream_close_idle(w->pools[i]);
    for (size_t i = 0; i < w->ntok_pools; i++)
        if (w->tok_pools[i] != NULL)
            pcr_upstream_close_idle(w->tok_pools[i]);
}

void pcr_pools_free(pcr_worker_t *w)
{
    release_pools(w, 1);
    free(w->pools);
    w->pools = NULL;
    w->npools = 0;
    free(w->tok_pools);
    w->tok_pools = NULL;
    w->ntok_pools = 0;
}
