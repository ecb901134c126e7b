/* router/share/share_link.h: the connection to Redis for the index sharing (share.c): two hiredis
 * 0.14 async connections on the control thread's event loop, one for commands and one for the
 * stream's blocking reads (XREAD BLOCK holds its connection until it returns).
 *
 * It never blocks: host names are resolved on the loop (dns.c), connects are non-blocking,
 * and since hiredis 0.14's async API has no timeouts of its own, a watchdog gives every command
 * and connect `timeout_ms` (plus what a blocking command asks for). Any failure closes both
 * connections (every command in flight is answered NULL), reports `on_down` once, and a
 * reconnect follows after a back-off that doubles from reconnect_min_ms to reconnect_max_ms,
 * with jitter. On (re)connect it sends AUTH and SELECT as the url asks, then PING, and reports
 * `on_up` when both connections have answered. */
#ifndef PCR_ROUTER_SHARE_LINK_H
#define PCR_ROUTER_SHARE_LINK_H

#include <stddef.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "config.h"
#include "dns.h"

typedef struct pcr_share_link pcr_share_link_t;

typedef enum { PCR_LINK_CMD = 0, PCR_LINK_READ = 1 } pcr_link_conn_t;

typedef struct {
    void (*on_up)(void *arg);
    void (*on_down)(void *arg, const char *why);
} pcr_share_link_cbs_t;

/* Called exactly once per command: with the reply (valid during the call only), or with NULL
 * when the command was lost with its connection (or the link is being freed). */
typedef void (*pcr_link_reply_fn)(void *arg, redisReply *reply);

/* NULL when out of memory. Nothing happens until pcr_share_link_start. `rc` and `dns` are
 * borrowed and outlive the link; `dns` resolves rc->host, or is NULL when rc->host is an IP
 * address. */
pcr_share_link_t *pcr_share_link_new(struct event_base *base, const pcr_redis_conf_t *rc,
                                     pcr_dns_t *dns, const pcr_share_link_cbs_t *cbs, void *arg);
void pcr_share_link_start(pcr_share_link_t *l);
/* Closes everything: commands in flight are answered NULL first. NULL is a no-op. */
void pcr_share_link_free(pcr_share_link_t *l);

/* 1 once both connections answered, until the link goes down. */
int pcr_share_link_up(const pcr_share_link_t *l);

/* Sends one command (binary-safe arguments) on connection `which`; `extra_ms` is added to its
 * timeout (a blocking read's BLOCK). 0, or PCR_ERR_UNAVAIL when the link is not up (then `fn`
 * is not called). */
int pcr_share_link_cmd(pcr_share_link_t *l, pcr_link_conn_t which, unsigned extra_ms,
                       pcr_link_reply_fn fn, void *arg, int argc, const char **argv,
                       const size_t *lens);

/* Takes the link down (a reply made no sense, a key has the wrong type): reconnect with
 * back-off. Deferred: safe from inside a reply callback. */
void pcr_share_link_fail(pcr_share_link_t *l, const char *why);

/* Stream entries one XREAD asks for: as many batches of redis.batch_max_bytes as fit in 64 MiB,
 * 1..256. */
unsigned pcr_share_read_count(const pcr_redis_conf_t *rc);
/* Replies larger than their connection's bound (a snapshot: redis.snapshot_max_bytes; a read:
 * pcr_share_read_count() batches), or arrays of more than a million elements, are refused
 * while they arrive, before they are buffered whole: the link goes down, as for any failure.
 * How many were, since the start. */
uint64_t pcr_share_link_oversize(const pcr_share_link_t *l);

#endif
