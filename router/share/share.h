/* router/share/share.h: several pcrouter replicas share what they learn of the pods' prefix caches
 * through Redis (docs/SHARING.md). It runs on the control thread only, and the hot path never
 * touches it: every worker keeps routing from its own replica of the index.
 *
 *   workers' commits, forgets --bus tap--> share: batches every redis.flush_ms --XADD--> stream
 *   stream --XREAD BLOCK--> share: decode, check --pcr_bus_*(PCR_BUS_CONTROL)--> every worker
 *   share's table of what every backend holds --SET PX, every snapshot_interval_ms--> snapshot
 *   a cold start, or a gap in the stream: every replica's snapshot --GET--> merge --> workers
 *
 * While a replica starting cold loads the snapshots (at most redis.ready_timeout_ms), the
 * server's `share_loading` flag is set and /health answers 503 "loading". Redis unreachable,
 * slow or restarted: updates to send are dropped and counted, the link reconnects with
 * back-off, and the snapshots fill the gap both ways once it is back. */
#ifndef PCR_ROUTER_SHARE_H
#define PCR_ROUTER_SHARE_H

#include "server.h"

struct evbuffer;

/* When the config has a "redis" section: sets *out to the sharing, enables the bus tap (call
 * before the workers start) and sets srv->share_loading. Without one, *out is NULL and nothing
 * changes. 0, PCR_ERR_NOMEM, or PCR_ERR_INVAL (no resolver for a redis host given by name;
 * logged). The backends it shares are those in srv's slots whenever it looks: they may come
 * and go. */
int pcr_share_new(pcr_server_t *srv, pcr_share_t **out);

/* On the control thread once the workers run: connect, flush, watch the ready timeout. */
void pcr_share_start(pcr_share_t *s);

/* SIGTERM: write this replica's snapshot now, so that its replacement finds it fresh. */
void pcr_share_drain(pcr_share_t *s);

/* Once the workers are joined: publishes what they learned last and waits (at most
 * redis.timeout_ms) for the snapshot to reach Redis, so that a replacement starts warm. */
void pcr_share_finish(pcr_share_t *s);

/* After the workers are joined, before the control loop's base is freed. NULL is a no-op. */
void pcr_share_free(pcr_share_t *s);

/* The pcrouter_share_* series of /metrics (any thread; `s` NULL renders sharing as off). */
void pcr_share_render_metrics(const pcr_share_t *s, struct evbuffer *out);

#endif
