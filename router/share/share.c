/* router/share/share.c: sharing the prefix index between replicas through Redis (share.h): its
 * life, what this replica sends (the workers' updates, from the bus tap, batched into the
 * stream), the link's ups and downs, the ready timeout, and /metrics. What comes back, and the
 * snapshots, are share_sync.c; the connection share_link.c, the bytes share_codec.c, the
 * snapshot's content share_table.c.
 *
 * Keys, for redis.channel C (docs/SHARING.md):
 *   C:stream            a stream, XADD MAXLEN ~ redis.stream_maxlen, field "b" = one batch
 *   C:snapshot:<id>     replica <id>'s snapshot (16 hex digits), SET PX redis.snapshot_ttl_ms
 *   C:snapshots         sorted set of the replica ids with a snapshot, scored by expiry (ms) */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "backend.h"
#include "bus.h"
#include "log.h"
#include "pcr/common.h"
#include "share_int.h"

#define REJECT_LOG_US 10000000  /* a rejection is logged at most every 10 s */

uint64_t pcr_share_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void pcr_share_reject(pcr_share_t *s, const char *where, const char *why)
{
    PCR_INC(s->m.rejected);
    uint64_t now = pcr_now_us();
    if (s->reject_logged_us != 0 && now - s->reject_logged_us < REJECT_LOG_US) {
        s->rejects_unlogged++;
        return;
    }
    pcr_log_warn("share: rejected %s: %s (%llu more rejected since the last report)", where,
                 why, (unsigned long long)s->rejects_unlogged);
    s->reject_logged_us = now;
    s->rejects_unlogged = 0;
}

void pcr_share_ignore_reply(void *arg, redisReply *r)
{
    if (r != NULL && r->type == REDIS_REPLY_ERROR)
        pcr_log_debug("share: redis answered %.200s", r->str);
}

/* ---- sending ------------------------------------------------------------------------- */

typedef struct {
    pcr_share_t *s;
    size_t len;
    uint32_t nops;
} xadd_t;

static void on_xadd(void *arg, redisReply *r)
{
    xadd_t *x = arg;
    pcr_share_t *s = x->s;
    s->pending_bytes -= x->len;
    if (r != NULL && r->type != REDIS_REPLY_ERROR) {
        PCR_BUMP(s->m.sent, x->nops);
    } else {
        PCR_BUMP(s->m.dropped, x->nops);
        s->dropped_while_down = 1;
        if (r != NULL)
            pcr_share_reject(s, "our own XADD", r->str);
    }
    free(x);
}

void pcr_share_xadd(pcr_share_t *s, unsigned char *blob, size_t len, uint32_t nops)
{
    char maxlen[16];
    snprintf(maxlen, sizeof maxlen, "%u", s->rc->stream_maxlen);
    const char *argv[8] = {"XADD", s->k_stream, "MAXLEN", "~", maxlen, "*", "b", (const char *)blob};
    size_t lens[8] = {4, strlen(s->k_stream), 6, 1, strlen(maxlen), 1, 1, len};
    xadd_t *x = malloc(sizeof(*x));
    if (x == NULL || s->pending_bytes + len > s->rc->max_pending_bytes ||
        pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_xadd, x, 8, argv, lens) < 0) {
        /* Not connected, or Redis is slower than our updates: routing does not wait. */
        free(x);
        PCR_BUMP(s->m.dropped, nops);
        s->dropped_while_down = 1;
    } else {
        *x = (xadd_t){s, len, nops};
        s->pending_bytes += len;
    }
    free(blob);
}

static void send_batch(pcr_share_t *s)
{
    uint32_t nops = pcr_share_enc_count(&s->enc);
    if (nops == 0)
        return;
    pcr_share_hdr_t h = {0, (uint32_t)s->block_bytes, s->replica, pcr_share_wall_ms()};
    unsigned char *blob;
    size_t len;
    if (pcr_share_enc_finish(&s->enc, &h, &blob, &len) < 0)
        PCR_BUMP(s->m.dropped, nops);
    else
        pcr_share_xadd(s, blob, len, nops);
    pcr_share_enc_reset(&s->enc);
}

static void add_op(pcr_share_t *s, pcr_share_opcode_t op, int backend, const pcr_key_t *key,
                   uint64_t arg)
{
    if (!pcr_share_link_up(s->link)) {
        PCR_INC(s->m.dropped);
        s->dropped_while_down = 1;
        return;
    }
    size_t more = PCR_SHARE_OP_BYTES + key->nblocks * 8 + 1 + PCR_SHARE_NAME_MAX;
    if (pcr_share_enc_size(&s->enc) + more > s->rc->batch_max_bytes)
        send_batch(s);
    if (pcr_share_enc_add(&s->enc, op, (unsigned)backend, key->blocks, key->nblocks, arg) < 0)
        PCR_INC(s->m.dropped);
}

/* What a worker learned, from the tap: into the table, and into the batch. The slot's name is
 * the one pcr_share_sync_slots saw just before the tap was drained; an update a worker made
 * for a backend that left its slot within that flush interval is taken for the new one's (the
 * workers' own replicas have the same window: a hint, at worst a cold decision). */
static void on_tap(const pcr_bus_msg_t *m, void *arg)
{
    pcr_share_t *s = arg;
    if (m->backend < 0 || (size_t)m->backend >= s->nseen || s->names[m->backend] == NULL ||
        m->key->nblocks == 0 || m->key->nblocks > s->max_blocks)
        return;
    if (m->op == PCR_BUS_OP_COMMIT) {
        pcr_share_table_commit(s->table, (unsigned)m->backend, m->key->blocks, m->key->nblocks,
                               m->arg);
        add_op(s, PCR_SHARE_COMMIT, m->backend, m->key, 0);
    } else if (m->op == PCR_BUS_OP_FORGET) {
        pcr_share_table_forget(s->table, (unsigned)m->backend, m->key->blocks, m->key->nblocks,
                               (size_t)m->arg);
        add_op(s, PCR_SHARE_FORGET, m->backend, m->key, m->arg);
    }
}

/* ---- following the backends ---------------------------------------------------------- */

/* The table keeps, for each backend, about what its pod can hold: its KV capacity (reported,
 * else configured) in blocks, twice over, since a prefix two keys share counts twice there. */
#define TABLE_SLACK 2

/* Slot `i` now holds `be` (or nothing): what the table knew of the slot goes. */
static void slot_changed(pcr_share_t *s, size_t i, const pcr_backend_t *be)
{
    /* The names are the batch's: none may change under ops already in it. */
    send_batch(s);
    pcr_share_table_reset(s->table, (unsigned)i);
    free((void *)s->names[i]);
    s->names[i] = NULL;
    s->slots[i] = (share_slot_t){0};
    if (be == NULL)
        return;
    s->names[i] = strdup(be->conf.name);
    if (s->names[i] == NULL)
        return;   /* out of memory: the slot is not shared until the backend changes */
    s->slots[i].be = be;
    s->slots[i].restarts = PCR_LOAD(((pcr_backend_t *)be)->restarts);
}

/* routing.block_bytes or max_prefix_bytes changed (a reload): the workers start afresh with
 * keys of the new size (bus.c), and so does the table. */
static void follow_routing(pcr_share_t *s)
{
    const pcr_config_t *cfg = s->srv->cfg;
    size_t bb = cfg->routing.block_bytes, mp = cfg->routing.max_prefix_bytes;
    if (bb == s->block_bytes && mp == s->max_prefix_bytes)
        return;
    size_t max_blocks = (mp + bb - 1) / bb;
    uint64_t *kbuf = realloc(s->kbuf, max_blocks * sizeof(*kbuf));
    if (kbuf == NULL)
        return;   /* tried again at the next flush */
    send_batch(s);
    s->kbuf = kbuf;
    s->max_blocks = max_blocks;
    if (s->block_bytes != 0) {
        pcr_log_info("share: routing.block_bytes or max_prefix_bytes changed: this replica's "
                     "shared entries start afresh");
        for (size_t i = 0; i < s->nseen; i++)
            pcr_share_table_reset(s->table, (unsigned)i);
    }
    s->block_bytes = bb;
    s->max_prefix_bytes = mp;
}

void pcr_share_sync_slots(pcr_share_t *s)
{
    pcr_server_t *srv = s->srv;
    follow_routing(s);
    size_t n = pcr_backend_slots(srv);
    if (n > PCR_MAX_BACKENDS)
        n = PCR_MAX_BACKENDS;
    uint64_t now = pcr_now_us();
    uint64_t keep = (uint64_t)srv->cfg->routing.unavailable_keep_ms * 1000;
    for (size_t i = 0; i < (n > s->nseen ? n : s->nseen); i++) {
        pcr_backend_t *be = i < n ? pcr_backend_at(srv, i) : NULL;
        share_slot_t *sl = &s->slots[i];
        /* A backend's name never changes; another name is another backend, even at an
         * address the allocator gave again. */
        if ((const void *)be != sl->be || (be != NULL && (s->names[i] == NULL ||
                                                          strcmp(be->conf.name, s->names[i]) != 0)))
            slot_changed(s, i, be);
        if (be == NULL || s->names[i] == NULL)
            continue;
        /* Down is not forgotten (pcr_policy_backend_state): a pod unreachable for a while
         * still holds its cache. A restart empties it; unavailable past unavailable_keep_ms,
         * it is dropped as the workers drop it. */
        uint64_t restarts = PCR_LOAD(be->restarts);
        if (restarts != sl->restarts) {
            sl->restarts = restarts;
            pcr_share_table_reset(s->table, (unsigned)i);
        }
        if (PCR_LOAD(be->up) && !pcr_backend_ejected(be, now)) {
            sl->down_since_us = 0;
            sl->expired = 0;
        } else if (sl->down_since_us == 0) {
            sl->down_since_us = now ? now : 1;
        } else if (!sl->expired && now - sl->down_since_us >= keep) {
            sl->expired = 1;
            pcr_share_table_reset(s->table, (unsigned)i);
        }
        pcr_backend_desc_t d;
        pcr_backend_desc(be, &d);
        uint64_t blocks = d.capacity_blocks > UINT64_MAX / TABLE_SLACK
                              ? UINT64_MAX : d.capacity_blocks * TABLE_SLACK;
        if (blocks != sl->cap) {
            sl->cap = blocks;
            pcr_share_table_set_capacity(s->table, (unsigned)i, blocks ? blocks : 1);
        }
    }
    s->nseen = n;
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    pcr_share_t *s = arg;
    pcr_share_sync_slots(s);
    pcr_bus_drain_tap(s->srv->bus, on_tap, s);
    send_batch(s);
    PCR_STORE(s->m.table_entries, pcr_share_table_count(s->table));
    PCR_STORE(s->m.table_bytes, pcr_share_table_bytes(s->table));
}

static void on_snap_timer(evutil_socket_t fd, short what, void *arg)
{
    pcr_share_t *s = arg;
    /* A table that emptied (its backends left, restarted or stayed away) is written too, once
     * one was: the snapshot in Redis must not go on naming what this replica dropped. */
    if (pcr_share_table_version(s->table) != s->snap_version &&
        (pcr_share_table_count(s->table) > 0 || PCR_LOAD(s->m.snapshots_written) > 0))
        pcr_share_write_snapshot(s, 0);
}

/* ---- the link ------------------------------------------------------------------------ */

static void on_up(void *arg)
{
    pcr_share_t *s = arg;
    if (s->ups++ > 0)
        PCR_INC(s->m.reconnects);
    PCR_STORE(s->m.connected, 1);
    pcr_share_sync_up(s);
}

static void on_down(void *arg, const char *why)
{
    pcr_share_t *s = arg;
    PCR_STORE(s->m.connected, 0);
    s->sync_pending = 0;
    s->catching_up = 0;
}

static void on_ready_timeout(evutil_socket_t fd, short what, void *arg)
{
    pcr_share_t *s = arg;
    if (s->loaded)
        return;
    s->loaded = 1;
    PCR_STORE(s->srv->share_loading, 0);
    pcr_log_warn("share: the shared index was not loaded within redis.ready_timeout_ms (%u ms);"
                 " serving from the local index", s->rc->ready_timeout_ms);
}

/* ---- life ---------------------------------------------------------------------------- */

static char *key_of(const char *channel, const char *suffix)
{
    size_t n = strlen(channel) + strlen(suffix) + 2;
    char *k = malloc(n);
    if (k != NULL)
        snprintf(k, n, "%s:%s", channel, suffix);
    return k;
}

int pcr_share_new(pcr_server_t *srv, pcr_share_t **out)
{
    *out = NULL;
    if (!srv->cfg->redis.enabled)
        return 0;
    pcr_share_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return PCR_ERR_NOMEM;
    s->srv = srv;
    s->rc = &s->conf;
    if (pcr_redis_conf_copy(&s->conf, &srv->cfg->redis) < 0) {
        free(s);
        return PCR_ERR_NOMEM;
    }
    const pcr_redis_conf_t *rc = s->rc;
    if (getrandom(&s->replica, sizeof s->replica, GRND_NONBLOCK) != sizeof s->replica)
        s->replica = pcr_now_us() ^ ((uint64_t)getpid() << 40) ^ pcr_share_wall_ms() << 20;
    snprintf(s->self_hex, sizeof s->self_hex, "%016" PRIx64, s->replica);
    char self[40];
    snprintf(self, sizeof self, "snapshot:%s", s->self_hex);
    s->k_stream = key_of(rc->channel, "stream");
    s->k_index = key_of(rc->channel, "snapshots");
    s->k_self = key_of(rc->channel, self);
    s->snap_prefix_len = strlen(rc->channel) + strlen(":snapshot:");
    s->names = calloc(PCR_MAX_BACKENDS, sizeof(*s->names));
    s->slots = calloc(PCR_MAX_BACKENDS, sizeof(*s->slots));
    s->table = pcr_share_table_new(PCR_MAX_BACKENDS, rc->snapshot_max_bytes, s->replica);
    /* A host given by name is resolved as the backends' are, through dns.nameservers (as at
     * start: the link keeps its resolver), never blocking the loop. */
    unsigned char tmp[sizeof(struct in6_addr)];
    int numeric = inet_pton(AF_INET, rc->host, tmp) == 1 || inet_pton(AF_INET6, rc->host, tmp) == 1;
    if (!numeric) {
        char err[256];
        s->dns = pcr_dns_new(srv->base, srv->cfg->dns.nameservers, srv->cfg->dns.nnameservers,
                             srv->cfg->dns.timeout_ms, err, sizeof err);
        if (s->dns == NULL) {
            pcr_log_error("share: redis.url: cannot resolve its host: %s", err);
            pcr_share_free(s);
            return PCR_ERR_INVAL;
        }
    }
    static const pcr_share_link_cbs_t cbs = {on_up, on_down};
    s->link = pcr_share_link_new(srv->base, rc, s->dns, &cbs, s);
    s->flush_timer = event_new(srv->base, -1, EV_PERSIST, on_flush, s);
    s->snap_timer = event_new(srv->base, -1, EV_PERSIST, on_snap_timer, s);
    s->ready_timer = evtimer_new(srv->base, on_ready_timeout, s);
    if (s->k_stream == NULL || s->k_index == NULL || s->k_self == NULL || s->names == NULL ||
        s->slots == NULL || s->table == NULL || s->link == NULL || s->flush_timer == NULL ||
        s->snap_timer == NULL || s->ready_timer == NULL ||
        pcr_share_enc_init(&s->enc, s->names, PCR_MAX_BACKENDS) < 0) {
        pcr_share_free(s);
        return PCR_ERR_NOMEM;
    }
    pcr_share_sync_slots(s);
    if (s->kbuf == NULL) {
        pcr_share_free(s);
        return PCR_ERR_NOMEM;
    }
    pcr_bus_enable_tap(srv->bus);
    s->loaded = rc->ready_timeout_ms == 0;
    PCR_STORE(srv->share_loading, !s->loaded);
    *out = s;
    return 0;
}

void pcr_share_start(pcr_share_t *s)
{
    if (s == NULL)
        return;
    s->start_us = pcr_now_us();
    struct timeval flush = pcr_ms_to_tv(s->rc->flush_ms);
    unsigned si = s->rc->snapshot_interval_ms, rt = s->rc->ready_timeout_ms;
    struct timeval snap = pcr_ms_to_tv(si);
    struct timeval ready = pcr_ms_to_tv(rt);
    event_add(s->flush_timer, &flush);
    event_add(s->snap_timer, &snap);
    if (!s->loaded)
        evtimer_add(s->ready_timer, &ready);
    pcr_log_info("share: sharing the prefix index through redis %s:%u, channel \"%s\", as "
                 "replica %s", s->rc->host, (unsigned)s->rc->port, s->rc->channel, s->self_hex);
    pcr_share_link_start(s->link);
}

void pcr_share_drain(pcr_share_t *s)
{
    if (s == NULL)
        return;
    on_flush(-1, 0, s);
    if (pcr_share_table_count(s->table) > 0)
        pcr_share_write_snapshot(s, 0);
}

void pcr_share_finish(pcr_share_t *s)
{
    if (s == NULL)
        return;
    on_flush(-1, 0, s);
    /* The loop has ended: turn it by hand until Redis has the snapshot (a write begun at
     * SIGTERM first, then one with what came since). The link's watchdog ticks every 50 ms,
     * so each turn is short; timeout_ms bounds them all. */
    uint64_t deadline = pcr_now_us() + (uint64_t)s->rc->timeout_ms * 1000;
    for (int round = 0; round < 2; round++) {
        if (!s->snap_writing && pcr_share_table_count(s->table) > 0 &&
            pcr_share_table_version(s->table) != s->snap_version)
            pcr_share_write_snapshot(s, 0);
        while (s->snap_writing && pcr_share_link_up(s->link) && pcr_now_us() < deadline)
            event_base_loop(s->srv->base, EVLOOP_ONCE);
    }
    if (s->snap_writing && pcr_share_link_up(s->link))
        pcr_log_warn("share: the last snapshot did not reach redis before the exit");
}

void pcr_share_free(pcr_share_t *s)
{
    if (s == NULL)
        return;
    /* The link first: commands in flight are answered NULL while everything they touch is
     * still there. */
    pcr_share_link_free(s->link);
    if (s->flush_timer)
        event_free(s->flush_timer);
    if (s->snap_timer)
        event_free(s->snap_timer);
    if (s->ready_timer)
        event_free(s->ready_timer);
    pcr_share_enc_dispose(&s->enc);
    pcr_share_table_free(s->table);
    free(s->kbuf);
    for (size_t i = 0; s->names != NULL && i < PCR_MAX_BACKENDS; i++)
        free((void *)s->names[i]);
    free(s->names);
    free(s->slots);
    free(s->k_stream);
    free(s->k_index);
    free(s->k_self);
    /* After the link, whose lookup, if any, it cancelled. */
    pcr_dns_free(s->dns);
    pcr_redis_conf_dispose(&s->conf);
    free(s);
}

/* ---- /metrics ------------------------------------------------------------------------ */

void pcr_share_render_metrics(const pcr_share_t *s, struct evbuffer *out)
{
    share_metrics_t z;
    memset(&z, 0, sizeof z);
    const share_metrics_t *m = s ? &s->m : &z;
#define V(f) (unsigned long long)PCR_LOAD(((share_metrics_t *)m)->f)
    evbuffer_add_printf(out,
        "# HELP pcrouter_share_enabled 1 when the prefix index is shared through Redis (a \"redis\" section).\n"
        "# TYPE pcrouter_share_enabled gauge\npcrouter_share_enabled %d\n"
        "# HELP pcrouter_share_connected 1 while the connection to Redis is up.\n"
        "# TYPE pcrouter_share_connected gauge\npcrouter_share_connected %llu\n"
        "# HELP pcrouter_share_loading 1 while a cold start loads the shared index (/health answers 503).\n"
        "# TYPE pcrouter_share_loading gauge\npcrouter_share_loading %d\n"
        "# HELP pcrouter_share_updates_sent_total Index updates this replica published (acknowledged by Redis).\n"
        "# TYPE pcrouter_share_updates_sent_total counter\npcrouter_share_updates_sent_total %llu\n"
        "# HELP pcrouter_share_updates_received_total Index updates from other replicas' streamed batches applied here.\n"
        "# TYPE pcrouter_share_updates_received_total counter\npcrouter_share_updates_received_total %llu\n"
        "# HELP pcrouter_share_updates_dropped_total Updates not published: Redis unreachable, too slow, or refusing.\n"
        "# TYPE pcrouter_share_updates_dropped_total counter\npcrouter_share_updates_dropped_total %llu\n"
        "# HELP pcrouter_share_updates_ignored_total Updates received for a backend name this replica does not have, or another block size.\n"
        "# TYPE pcrouter_share_updates_ignored_total counter\npcrouter_share_updates_ignored_total %llu\n"
        "# HELP pcrouter_share_rejected_total Stream entries, snapshots and replies rejected as malformed or foreign.\n"
        "# TYPE pcrouter_share_rejected_total counter\npcrouter_share_rejected_total %llu\n"
        "# HELP pcrouter_share_lag_seconds Age of the last batch read from the stream when applied (sender's clock to ours).\n"
        "# TYPE pcrouter_share_lag_seconds gauge\npcrouter_share_lag_seconds %.6f\n"
        "# HELP pcrouter_share_reconnects_total Times the connection to Redis came back after a loss.\n"
        "# TYPE pcrouter_share_reconnects_total counter\npcrouter_share_reconnects_total %llu\n"
        "# HELP pcrouter_share_snapshots_loaded_total Other replicas' snapshots merged.\n"
        "# TYPE pcrouter_share_snapshots_loaded_total counter\npcrouter_share_snapshots_loaded_total %llu\n"
        "# HELP pcrouter_share_snapshot_updates_total Entries of other replicas' snapshots that were new here, applied.\n"
        "# TYPE pcrouter_share_snapshot_updates_total counter\npcrouter_share_snapshot_updates_total %llu\n"
        "# HELP pcrouter_share_snapshots_written_total Snapshots of this replica written to Redis.\n"
        "# TYPE pcrouter_share_snapshots_written_total counter\npcrouter_share_snapshots_written_total %llu\n"
        "# HELP pcrouter_share_snapshot_entries Keys in this replica's snapshot table.\n"
        "# TYPE pcrouter_share_snapshot_entries gauge\npcrouter_share_snapshot_entries %llu\n"
        "# HELP pcrouter_share_snapshot_bytes Bytes of this replica's snapshot table, against redis.snapshot_max_bytes.\n"
        "# TYPE pcrouter_share_snapshot_bytes gauge\npcrouter_share_snapshot_bytes %llu\n",
        s != NULL, V(connected), s ? (int)PCR_LOAD(s->srv->share_loading) : 0, V(sent),
        V(received), V(dropped), V(ignored), V(rejected), (double)V(lag_us) / 1e6, V(reconnects),
        V(snapshots_loaded), V(snapshot_updates), V(snapshots_written), V(table_entries), V(table_bytes));
#undef V
    evbuffer_add_printf(out,
        "# HELP pcrouter_share_replies_too_large_total Redis replies refused while arriving for their size (a stream read over its batches' bound, a snapshot over redis.snapshot_max_bytes); the link starts over.\n"
        "# TYPE pcrouter_share_replies_too_large_total counter\npcrouter_share_replies_too_large_total %llu\n",
        (unsigned long long)(s && s->link ? pcr_share_link_oversize(s->link) : 0));
}
