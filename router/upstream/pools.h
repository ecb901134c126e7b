/* router/upstream/pools.h: a worker's upstream pools, one per backend slot (upstream.h), made on
 * first use with the worker's share of the backend's max_connections, and what its tick does with
 * them: held streams of a backend out of rotation fail over, pools of backends that left go. */
#ifndef PCR_ROUTER_POOLS_H
#define PCR_ROUTER_POOLS_H

#include "server.h"
#include "upstream.h"

/* This worker's pool of connections to `be` (made on first use; it holds a reference). NULL
 * when out of memory. */
pcr_pool_t *pcr_pools_get(pcr_worker_t *w, pcr_backend_t *be);
/* This worker's pool of connections to `be` for tokenizing (precise mode): a few connections
 * of their own, so a tokenization never waits behind generations. NULL when out of memory. */
pcr_pool_t *pcr_pools_tokenize(pcr_worker_t *w, pcr_backend_t *be);
/* The worker's tick: streams held for a backend out of rotation route again, the others go if
 * the pod's budget is open; pools of backends that left close their idle connections and go
 * with their last one. */
void pcr_pools_tick(pcr_worker_t *w);
/* Another worker left a backend's prefill budget open ('H'): this one's held streams go. */
void pcr_pools_kick_held(pcr_worker_t *w);
/* Drain: every pool closes its idle connections. */
void pcr_pools_close_idle(pcr_worker_t *w);
/* Teardown: every pool goes once its connections and waiters are gone. */
void pcr_pools_free(pcr_worker_t *w);

#endif
