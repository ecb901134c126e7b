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
 * but a reserve's (pcr_light_needed), on any pod and worker, for PCR_LIGHT_KEEP_MS, every
 * pool keeps its reserve. Until a light client needs one the reserve is lent to whoever asks,
 * so a heavy client alone keeps all of the pod's concurrency; once one did, a heavy client's
 * requests past the rest wait in the queue. A client whose answer was reset because it read
 * none of it counts as heavy for as long, whatever it holds (pcr_light_count).
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
#include <stdint.h>

/* A client's standing with the pools, kept by its session and read by the pools: its requests
 * on pod connections now, when the router last reset one of its answers because the client
 * accepted no bytes of it for timeouts.client_write_ms (0: never), and whether it can take no
 * answer byte at all (`blind`: an HTTP/2 client that announced an initial window of 0 and has
 * opened no stream's window since). */
typedef struct {
    unsigned busy;
    uint64_t slow_us;
    unsigned blind;
} pcr_light_client_t;

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

/* What a client counts for here at `now_us`: its `busy` requests, or, for PCR_LIGHT_KEEP_MS
 * after an answer of it was reset unread, PCR_LIGHT_SLOW more: heavier than any reserve, and
 * after every other client in the queue. A client whose readers stall holds pod connections
 * for answers it does not take; and its streams, all reset at once, would leave it light again
 * just as it opens the next ones, which then took the reserve. */
#define PCR_LIGHT_SLOW 65536u
/* A blind client counts PCR_LIGHT_BLIND more than its requests (and than a slow one): after
 * every other client in the queue, and never given the reserve, kept or not (pcr_light_may_take).
 * Whatever a pod answers it, the answer waits on the pod's connection until the client opens
 * a window or its stream is reset at client_write_ms; lending it the last connections of a
 * pool only makes the next light client wait for that reset. */
#define PCR_LIGHT_BLIND (2 * PCR_LIGHT_SLOW)
unsigned pcr_light_count(const pcr_light_client_t *c, uint64_t now_us);
/* Whether a light client needs the reserve: its client holds fewer than `reserve` requests on
 * pod connections and no more than the reserve is free of a pool's `max_connections`
 * (`pool_busy` carry a request). From then the pool keeps the reserve (pcr_light_may_take's
 * `kept`) for PCR_LIGHT_KEEP_MS. */
int pcr_light_needed(unsigned client_busy, unsigned pool_busy, unsigned max_connections,
                     unsigned reserve);

/* Whether a request whose client counts `client_busy` (pcr_light_count) may take a connection
 * of a pool with `pool_busy` of its `max_connections` carrying a request and a reserve of
 * `reserve`: not when none is free; any client while more than the reserve is free; any but a
 * blind one while the reserve is not `kept`; else a light client only (`client_busy` <
 * `reserve`). Decreasing in `client_busy`: when the waiter with fewest may not, none may. */
int pcr_light_may_take(unsigned client_busy, unsigned pool_busy, unsigned max_connections,
                       unsigned reserve, int kept);

/* Whether one more blind client's request may take a connection of a pool whose connections
 * carry `blind` such requests now: blind clients together hold no more than the reserve
 * counts connections (none kept from them when there is no reserve). */
int pcr_blind_may_take(unsigned blind, unsigned reserve);

/* Whether a request whose client counts `client_busy` (pcr_light_count) should open a fresh
 * connection rather than take an idle one of a pool with `idle` idle connections of `nconns`
 * open (`max_connections` at most), `reserve` its light clients' reserve: yes for a client
 * that takes no answer byte now (slow or blind) while no more than the reserve is idle and the
 * pool may grow. A warm connection buys that client nothing, since its answer waits on the
 * connection anyway; the next light client would pay the connect instead, behind that client's
 * other connects at the pod. */
int pcr_light_fresh(unsigned client_busy, unsigned idle, unsigned nconns,
                    unsigned max_connections, unsigned reserve);

#endif
