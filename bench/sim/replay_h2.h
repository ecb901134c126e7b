/* bench/sim/replay_h2.h: the replayer's h2c client (nghttp2 client sessions on libevent).
 *
 * Same callbacks and guarantees as replay_client.h (on_done exactly once per request), over
 * `nconns` HTTP/2 cleartext connections opened with prior knowledge, requests spread round
 * robin, one stream each. Ownership: rh2_pool_new / rh2_pool_free (requests still open are
 * dropped without callbacks). */
#ifndef PCR_BENCH_REPLAY_H2_H
#define PCR_BENCH_REPLAY_H2_H

#include "replay_client.h"

typedef struct rh2_pool rh2_pool_t;

rh2_pool_t *rh2_pool_new(struct event_base *base, const char *url, unsigned nconns,
                         const char **path);
void rh2_pool_free(rh2_pool_t *pool);

/* POSTs body (moved) as JSON on a new stream. */
void rh2_send(rh2_pool_t *pool, const char *path, struct evbuffer *body, double timeout_s,
              const rc_cb_t *cb, void *arg);

#endif
