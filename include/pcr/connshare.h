/* pcr/connshare.h: the share of a pod's connections that a heavy client may not take.
 *
 * A pool's connections carry one request each. One client with many requests in flight (an
 * HTTP/2 connection with many streams, or one whose readers never drain their answers) can take
 * every connection at once, and a light client that comes next waits until one of those answers
 * ends, however short its own. The pool's queue already puts the client with fewest requests on
 * pod connections first, but only a connection that frees lets anyone go. So the last few free
 * connections of each pool (the reserve, `upstream.light_reserve_pct` of its bound) are kept for
 * light clients, those holding fewer requests on pod connections than the reserve counts
 * connections, while one may need them: from the time a light client found no free connection
 * but the reserve's (pcr_light_needed) for PCR_LIGHT_KEEP_MS. Until a light client needs it
 * the reserve is lent to whoever asks, so a heavy client alone keeps all of the pod's
 * concurrency; once one did, a heavy client's requests past the rest wait in the queue.
 *
 * "A client" is a client connection: the one identity the router has that a client cannot
 * make up (its address may be shared behind a proxy, its headers are its own word). A client
 * with many connections is many light clients here; tenancy (API keys: pcr/flowq.h) is what
 * ties those together.
 *
 * Pure; implemented in hashring/connshare.c. The upstream pools (router/upstream/) ask it
 * before a request takes a connection and when they choose the waiter a freed one goes to. */
#ifndef PCR_CONNSHARE_H
#define PCR_CONNSHARE_H

/* upstream.light_reserve_pct's default: a tenth of each pool (per worker) kept for light
 * clients; pools under ten connections keep none. */
#define PCR_LIGHT_RESERVE_PCT_DEFAULT 10
/* Its bound: half of a pool may be kept, no more. */
#define PCR_LIGHT_RESERVE_PCT_MAX 50

/* The reserve of a pool of `max_connections` at `pct` percent: rounded down, so a small pool
 * keeps none (a client of two streams on a pool of two connections keeps both). */
unsigned pcr_light_reserve(unsigned max_connections, unsigned pct);

/* How long the reserve is kept once a light client needed it: longer than the period of any
 * burst a heavy client could time to come just as it is lent again. */
#define PCR_LIGHT_KEEP_MS 60000

/* Whether a light client needs the reserve: its client holds fewer than `reserve` requests on
 * pod connections and no more than the reserve is free of a pool's `max_connections`
 * (`pool_busy` carry a request). From then the pool keeps the reserve (pcr_light_may_take's
 * `kept`) for PCR_LIGHT_KEEP_MS. */
int pcr_light_needed(unsigned client_busy, unsigned pool_busy, unsigned max_connections,
                     unsigned reserve);

/* Whether a request whose client holds `client_busy` requests on pod connections may take a
 * connection of a pool with `pool_busy` of its `max_connections` carrying a request and a
 * reserve of `reserve`: not when none is free; any client while more than the reserve is free
 * or while the reserve is not `kept`; else a light client only (`client_busy` < `reserve`).
 * Decreasing in `client_busy`: when the waiter with fewest may not, none may. */
int pcr_light_may_take(unsigned client_busy, unsigned pool_busy, unsigned max_connections,
                       unsigned reserve, int kept);

#endif
