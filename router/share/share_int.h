/* router/share/share_int.h: what share.c (sending, the link, life, /metrics) and share_sync.c
 * (receiving, snapshots, resync) share: the sharing's state. Private to those two files. */
#ifndef PCR_ROUTER_SHARE_INT_H
#define PCR_ROUTER_SHARE_INT_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "dns.h"
#include "share.h"
#include "share_codec.h"
#include "share_link.h"
#include "share_table.h"

typedef struct {
    uint64_t connected, sent, received, dropped, ignored, rejected;
    uint64_t snapshot_updates, snapshots_loaded, snapshots_written, reconnects, lag_us;
    uint64_t table_entries, table_bytes;
} share_metrics_t;

/* What the sharing knew of one backend slot at its last look (share.c, pcr_share_sync_slots):
 * backends come and go (a reload, DNS discovery), and a slot's entries in the table are only
 * ever those of the backend in it now. */
typedef struct {
    const void *be;               /* the backend in the slot then: compared, never followed */
    uint64_t restarts;            /* its pod's restarts the scrape had seen */
    uint64_t down_since_us;       /* unavailable (down or ejected) since; 0 when available */
    int expired;                  /* unavailable past routing.unavailable_keep_ms: dropped */
    uint64_t cap;                 /* its bound in the table, as last set */
} share_slot_t;

struct pcr_share {
    pcr_server_t *srv;
    pcr_redis_conf_t conf;        /* a copy: a reload frees the config it came from */
    const pcr_redis_conf_t *rc;   /* &conf */
    pcr_dns_t *dns;               /* resolves a redis host given by name, else NULL */
    pcr_share_link_t *link;
    uint64_t replica;             /* this process's random id */
    char self_hex[17];
    char *k_stream, *k_index, *k_self;
    size_t snap_prefix_len;       /* "C:snapshot:" */
    const char **names;           /* [PCR_MAX_BACKENDS] each slot's backend name (heap), or NULL */
    share_slot_t *slots;          /* [PCR_MAX_BACKENDS] */
    size_t nseen;                 /* slots looked at: every one from here on is empty */
    size_t block_bytes, max_prefix_bytes;   /* routing's, as the table's keys were made */
    size_t max_blocks;
    uint64_t *kbuf;               /* one decoded key, max_blocks long */
    pcr_share_table_t *table;
    pcr_share_enc_t enc;          /* the batch being filled (empty outside on_flush) */
    struct event *flush_timer, *snap_timer, *ready_timer;

    char last_id[64];             /* the last stream entry read */
    int have_id;
    int catching_up;              /* reading without BLOCK until the stream's end */
    /* A read was refused for its size (share_link.c): entries are sized (SURVEY) before they
     * are read, the ones too large skipped unread, until a survey finds none. */
    uint64_t oversize_seen;       /* pcr_share_link_oversize() when last looked at */
    int careful;
    unsigned read_asked;          /* COUNT of the XREAD in flight */
    unsigned sync_pending;        /* replies a resync waits for */
    int loaded;                   /* the first resync is done, or was given up */
    int resyncing;                /* a resync runs (its end is logged) */
    unsigned ups;                 /* times the link came up */
    uint64_t start_us;
    unsigned sync_snapshots;      /* snapshots the running resync merged */
    uint64_t sync_updates;        /* updates they brought */
    int snap_writing;
    uint64_t snap_version;        /* the table's version when last written */
    int dropped_while_down;       /* announce our snapshot once back */
    size_t pending_bytes;         /* XADDs not answered */
    uint64_t reject_logged_us, rejects_unlogged;
    share_metrics_t m;            /* written here, read by /metrics on any worker */
};

/* share.c */
uint64_t pcr_share_wall_ms(void);
/* Brings the table and the slots' names in line with the backends there are now, and with
 * routing.block_bytes: a slot whose backend changed, restarted, or stayed unavailable past
 * routing.unavailable_keep_ms loses its entries. Before anything is applied or sent. */
void pcr_share_sync_slots(pcr_share_t *s);
/* Counts a rejection and logs it, at most every 10 s with how many were not logged. */
void pcr_share_reject(pcr_share_t *s, const char *where, const char *why);
/* A reply nobody needs: an error is logged at debug level. */
void pcr_share_ignore_reply(void *arg, redisReply *r);
/* XADDs one finished batch of `nops` updates; takes `blob`. Counted sent once Redis
 * acknowledges it, dropped if it cannot be sent or Redis refuses it. */
void pcr_share_xadd(pcr_share_t *s, unsigned char *blob, size_t len, uint32_t nops);

/* share_sync.c */
/* The link is up: write our snapshot (announced when updates were dropped meanwhile), then
 * read the stream on from where we were, or resync when that is gone. */
void pcr_share_sync_up(pcr_share_t *s);
/* Writes the table as this replica's snapshot; `announce` asks the others to load it. */
void pcr_share_write_snapshot(pcr_share_t *s, int announce);

#endif
