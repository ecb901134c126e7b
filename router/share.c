/* router/share.c: sharing the prefix index between replicas through Redis (share.h). It owns
 * the keys, what goes into them and when, and how what comes out reaches the workers; the
 * connection is share_link.c, the bytes share_codec.c, the snapshot's content share_table.c.
 *
 * Keys, for redis.channel C (docs/SHARING.md):
 *   C:stream            a stream, XADD MAXLEN ~ redis.stream_maxlen, field "b" = one batch
 *   C:snapshot:<id>     replica <id>'s snapshot (16 hex digits), SET PX redis.snapshot_ttl_ms
 *   C:snapshots         sorted set of the replica ids with a snapshot, scored by expiry (ms)
 *
 * Every update a replica applies from Redis goes to its workers with pcr_bus_*(PCR_BUS_CONTROL),
 * which the tap does not hand back: nothing is echoed. Backends travel by name; an update for
 * a name this replica does not have, or keyed with another block size, is ignored and counted.
 * Times: an update's age travels (the sender's wall clock at sending, plus a snapshot entry's
 * age), and is subtracted from this process's monotonic clock. */
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
#include "share.h"
#include "share_codec.h"
#include "share_link.h"
#include "share_table.h"

#define READ_COUNT 256          /* stream entries per XREAD */
#define READ_BLOCK_MS 1000      /* how long one XREAD waits for news */
#define MAX_SNAPSHOTS 64        /* snapshots read at most in one resync */
#define REJECT_LOG_US 10000000  /* a rejection is logged at most every 10 s */

typedef struct {
    uint64_t connected, sent, received, dropped, ignored, rejected;
    uint64_t snapshot_updates, snapshots_loaded, snapshots_written, reconnects, lag_us;
    uint64_t table_entries, table_bytes;
} share_metrics_t;

struct pcr_share {
    pcr_server_t *srv;
    const pcr_redis_conf_t *rc;
    pcr_share_link_t *link;
    uint64_t replica;             /* this process's random id */
    char self_hex[17];
    char *k_stream, *k_index, *k_self;
    size_t snap_prefix_len;       /* "C:snapshot:" */
    const char **names;           /* backend names, by id */
    int *was_up;                  /* each backend's up state at the last flush */
    size_t nbackends, max_blocks;
    uint64_t *kbuf;               /* one decoded key */
    pcr_share_table_t *table;
    pcr_share_enc_t enc;          /* the batch being filled */
    struct event *flush_timer, *snap_timer, *ready_timer;

    char last_id[64];             /* the last stream entry read */
    int have_id;
    int catching_up;              /* reading without BLOCK until the stream's end */
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

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Now minus `age_ms`, on the monotonic clock of pcr_now_us; at least 1. */
static uint64_t time_of_age(uint64_t age_ms)
{
    uint64_t now = pcr_now_us();
    return age_ms >= now / 1000 ? 1 : now - age_ms * 1000;
}

static void reject(pcr_share_t *s, const char *where, const char *why)
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

static void on_ignore(void *arg, redisReply *r)
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
            reject(s, "our own XADD", r->str);
    }
    free(x);
}

/* XADDs a finished batch; takes `blob`. */
static void xadd(pcr_share_t *s, unsigned char *blob, size_t len, uint32_t nops)
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
    pcr_share_hdr_t h = {0, (uint32_t)s->srv->cfg->routing.block_bytes, s->replica, wall_ms()};
    unsigned char *blob;
    size_t len;
    if (pcr_share_enc_finish(&s->enc, &h, &blob, &len) < 0)
        PCR_BUMP(s->m.dropped, nops);
    else
        xadd(s, blob, len, nops);
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

/* What a worker learned, from the tap: into the table, and into the batch. */
static void on_tap(const pcr_bus_msg_t *m, void *arg)
{
    pcr_share_t *s = arg;
    if (m->backend < 0 || (size_t)m->backend >= s->nbackends || m->key->nblocks == 0)
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

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    pcr_share_t *s = arg;
    /* A backend that went down lost its entries in every worker (backend.c); the snapshot
     * forgets them too. */
    for (size_t i = 0; i < s->nbackends; i++) {
        int up = PCR_LOAD(s->srv->backends[i].up);
        if (s->was_up[i] && !up)
            pcr_share_table_reset(s->table, (unsigned)i);
        s->was_up[i] = up;
    }
    pcr_bus_drain_tap(s->srv->bus, on_tap, s);
    send_batch(s);
    PCR_STORE(s->m.table_entries, pcr_share_table_count(s->table));
    PCR_STORE(s->m.table_bytes, pcr_share_table_bytes(s->table));
}

/* ---- applying what others learned ---------------------------------------------------- */

/* Local backend ids for the batch's names (-1: none by that name); NULL when out of memory. */
static int *map_names(pcr_share_t *s, const pcr_share_batch_t *b)
{
    int *map = malloc((b->nnames ? b->nnames : 1) * sizeof(*map));
    if (map == NULL)
        return NULL;
    size_t pos = 0, len, k = 0;
    const char *name;
    while (pcr_share_next_name(b, &pos, &name, &len)) {
        map[k] = -1;
        for (size_t i = 0; i < s->nbackends; i++)
            if (strlen(s->names[i]) == len && memcmp(s->names[i], name, len) == 0)
                map[k] = (int)i;
        k++;
    }
    return map;
}

/* Applies a checked batch from another replica: a stream batch (every op, at its age) or a
 * snapshot (only what the table did not know). Returns the updates applied. */
static uint64_t apply(pcr_share_t *s, pcr_share_batch_t *b, int snapshot)
{
    if (b->hdr.block_bytes != s->srv->cfg->routing.block_bytes) {
        PCR_BUMP(s->m.ignored, b->nops);
        return 0;
    }
    int *map = map_names(s, b);
    if (map == NULL) {
        PCR_BUMP(s->m.dropped, b->nops);
        return 0;
    }
    uint64_t now_ms = wall_ms(), applied = 0;
    uint64_t sent_age = b->hdr.sent_ms < now_ms ? now_ms - b->hdr.sent_ms : 0;
    if (!snapshot)
        PCR_STORE(s->m.lag_us, sent_age * 1000);
    pcr_share_op_t op;
    while (pcr_share_next(b, s->kbuf, &op) == 1) {
        int be = map[op.name];
        if (be < 0) {
            PCR_INC(s->m.ignored);
            continue;
        }
        pcr_key_t key = {(uint64_t *)op.blocks, op.nblocks, 0};
        if (op.op == PCR_SHARE_FORGET) {
            pcr_share_table_forget(s->table, (unsigned)be, op.blocks, op.nblocks, (size_t)op.arg);
            pcr_bus_forget(s->srv->bus, PCR_BUS_CONTROL, be, &key, (uint32_t)op.arg);
        } else {
            uint64_t age = op.arg > UINT64_MAX / 2 ? UINT64_MAX / 2 : op.arg;
            uint64_t t = time_of_age(sent_age + age);
            int fresh = pcr_share_table_commit(s->table, (unsigned)be, op.blocks, op.nblocks, t);
            /* A snapshot's entry the table knows already is known to the workers too. */
            if (snapshot && fresh == 0)
                continue;
            pcr_bus_commit(s->srv->bus, PCR_BUS_CONTROL, be, &key, t);
        }
        applied++;
    }
    if (snapshot)
        PCR_BUMP(s->m.snapshot_updates, applied);
    else
        PCR_BUMP(s->m.received, applied);
    free(map);
    return applied;
}

static void fetch_snapshot(pcr_share_t *s, const char *hex, int sync);

/* One stream entry: [id, [field, value, ...]]. */
static void read_entry(pcr_share_t *s, const redisReply *e)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
        e->element[0]->type != REDIS_REPLY_STRING || e->element[1]->type != REDIS_REPLY_ARRAY) {
        reject(s, "a stream entry", "not shaped as [id, [field, value, ...]]");
        return;
    }
    const redisReply *id = e->element[0], *fields = e->element[1], *blob = NULL;
    if (id->len < sizeof s->last_id) {
        memcpy(s->last_id, id->str, id->len);
        s->last_id[id->len] = '\0';
        s->have_id = 1;
    }
    for (size_t i = 0; i + 1 < fields->elements; i += 2)
        if (fields->element[i]->type == REDIS_REPLY_STRING && fields->element[i]->len == 1 &&
            fields->element[i]->str[0] == 'b' && fields->element[i + 1]->type == REDIS_REPLY_STRING)
            blob = fields->element[i + 1];
    if (blob == NULL) {
        reject(s, "a stream entry", "no \"b\" field");
        return;
    }
    pcr_share_batch_t b;
    const char *why = pcr_share_decode(blob->str, blob->len, s->max_blocks, &b);
    if (why != NULL) {
        reject(s, "a stream entry", why);
        return;
    }
    if (b.hdr.replica == s->replica)
        return;   /* our own, echoed by the stream */
    if (b.hdr.flags & PCR_SHARE_F_SNAPSHOT) {
        reject(s, "a stream entry", "a snapshot where a batch belongs");
        return;
    }
    apply(s, &b, 0);
    if (b.hdr.flags & PCR_SHARE_F_ANNOUNCE) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, b.hdr.replica);
        fetch_snapshot(s, hex, 0);
    }
}

static void read_stream(pcr_share_t *s);

static void caught_up(pcr_share_t *s)
{
    s->catching_up = 0;
    if (s->loaded && s->resyncing)
        pcr_log_info("share: resynchronised: %llu update(s) from %u snapshot(s) and the stream",
                     (unsigned long long)s->sync_updates, s->sync_snapshots);
    s->resyncing = 0;
    if (s->loaded)
        return;
    s->loaded = 1;
    PCR_STORE(s->srv->share_loading, 0);
    pcr_log_info("share: ready: %llu update(s) from %u snapshot(s) and the stream in %llu ms",
                 (unsigned long long)s->sync_updates, s->sync_snapshots,
                 (unsigned long long)((pcr_now_us() - s->start_us) / 1000));
}

static void on_xread(void *arg, redisReply *r)
{
    pcr_share_t *s = arg;
    if (r == NULL)
        return;   /* the link is down; reading restarts when it is back */
    if (r->type == REDIS_REPLY_ERROR) {
        reject(s, "the stream", r->str);
        pcr_share_link_fail(s->link, "XREAD refused");
        return;
    }
    size_t n = 0;
    if (r->type == REDIS_REPLY_ARRAY && r->elements >= 1) {
        const redisReply *st = r->element[0];
        if (st->type == REDIS_REPLY_ARRAY && st->elements == 2 &&
            st->element[1]->type == REDIS_REPLY_ARRAY) {
            n = st->element[1]->elements;
            uint64_t before = PCR_LOAD(s->m.received);
            for (size_t i = 0; i < n; i++)
                read_entry(s, st->element[1]->element[i]);
            s->sync_updates += s->catching_up ? PCR_LOAD(s->m.received) - before : 0;
        } else {
            reject(s, "the stream", "an XREAD reply not shaped as [[key, entries]]");
        }
    }
    if (s->catching_up && n < READ_COUNT)
        caught_up(s);
    read_stream(s);
}

static void read_stream(pcr_share_t *s)
{
    char count[16], block[16];
    snprintf(count, sizeof count, "%d", READ_COUNT);
    snprintf(block, sizeof block, "%d", READ_BLOCK_MS);
    const char *id = s->have_id ? s->last_id : "0-0";
    if (s->catching_up) {
        const char *argv[6] = {"XREAD", "COUNT", count, "STREAMS", s->k_stream, id};
        pcr_share_link_cmd(s->link, PCR_LINK_READ, 0, on_xread, s, 6, argv, NULL);
    } else {
        const char *argv[8] = {"XREAD", "COUNT", count, "BLOCK", block, "STREAMS", s->k_stream, id};
        pcr_share_link_cmd(s->link, PCR_LINK_READ, READ_BLOCK_MS, on_xread, s, 8, argv, NULL);
    }
}

/* ---- snapshots ----------------------------------------------------------------------- */

typedef struct {
    pcr_share_t *s;
    int sync;                     /* part of a resync: counted in sync_pending */
} get_t;

static void sync_step_done(pcr_share_t *s)
{
    if (s->sync_pending > 0 && --s->sync_pending == 0) {
        s->catching_up = 1;
        read_stream(s);
    }
}

static void on_snapshot(void *arg, redisReply *r)
{
    get_t *g = arg;
    pcr_share_t *s = g->s;
    int sync = g->sync;
    free(g);
    if (r == NULL)
        return;
    if (r->type == REDIS_REPLY_STRING) {
        pcr_share_batch_t b;
        const char *why = pcr_share_decode(r->str, r->len, s->max_blocks, &b);
        if (why == NULL && !(b.hdr.flags & PCR_SHARE_F_SNAPSHOT))
            why = "a batch where a snapshot belongs";
        if (why != NULL) {
            reject(s, "a snapshot", why);
        } else if (b.hdr.replica != s->replica) {
            uint64_t n = apply(s, &b, 1);
            PCR_INC(s->m.snapshots_loaded);
            if (sync) {
                s->sync_snapshots++;
                s->sync_updates += n;
            }
        }
    } else if (r->type != REDIS_REPLY_NIL) {
        /* NIL: it expired since it was listed. Anything else is not ours. */
        reject(s, "a snapshot", r->type == REDIS_REPLY_ERROR ? r->str : "not a string");
    }
    if (sync)
        sync_step_done(s);
}

static void fetch_snapshot(pcr_share_t *s, const char *hex, int sync)
{
    char key[256];
    snprintf(key, sizeof key, "%.*s%s", (int)s->snap_prefix_len, s->k_self, hex);
    get_t *g = malloc(sizeof(*g));
    const char *argv[2] = {"GET", key};
    if (g == NULL)
        return;
    *g = (get_t){s, sync};
    if (pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_snapshot, g, 2, argv, NULL) < 0) {
        free(g);
        return;
    }
    if (sync)
        s->sync_pending++;
}

static void on_index(void *arg, redisReply *r)
{
    pcr_share_t *s = arg;
    if (r == NULL)
        return;
    if (r->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0, n = 0; i < r->elements && n < MAX_SNAPSHOTS; i++) {
            const redisReply *m = r->element[i];
            if (m->type != REDIS_REPLY_STRING || m->len != 16 ||
                strspn(m->str, "0123456789abcdef") != 16) {
                reject(s, "the snapshot index", "a member that is not a replica id");
                continue;
            }
            if (memcmp(m->str, s->self_hex, 16) != 0) {
                fetch_snapshot(s, m->str, 1);
                n++;
            }
        }
    } else {
        reject(s, "the snapshot index", r->type == REDIS_REPLY_ERROR ? r->str : "not a list");
    }
    sync_step_done(s);   /* the ZRANGE itself */
}

/* Loads every replica's snapshot, then reads the whole stream: a cold start, or a gap. */
static void resync(pcr_share_t *s)
{
    char now[24];
    snprintf(now, sizeof now, "%" PRIu64, wall_ms());
    const char *prune[4] = {"ZREMRANGEBYSCORE", s->k_index, "-inf", now};
    pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_ignore, s, 4, prune, NULL);
    const char *list[4] = {"ZRANGE", s->k_index, "0", "-1"};
    s->have_id = 0;
    s->resyncing = 1;
    s->sync_pending = 0;
    s->sync_snapshots = 0;
    s->sync_updates = 0;
    if (pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_index, s, 4, list, NULL) == 0)
        s->sync_pending = 1;
}

/* XRANGE last_id last_id: the entry read last is still there, so nothing after it was
 * trimmed and reading on from it misses nothing; else (trimmed, or a new Redis) resync. */
static void on_gap_check(void *arg, redisReply *r)
{
    pcr_share_t *s = arg;
    if (r == NULL)
        return;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1) {
        s->catching_up = 1;
        read_stream(s);
    } else {
        pcr_log_info("share: updates were missed while away; loading the snapshots");
        resync(s);
    }
}

typedef struct {
    pcr_share_t *s;
    uint64_t version;
} set_t;

static void on_snapshot_written(void *arg, redisReply *r)
{
    set_t *w = arg;
    pcr_share_t *s = w->s;
    s->snap_writing = 0;
    if (r != NULL && r->type != REDIS_REPLY_ERROR) {
        PCR_INC(s->m.snapshots_written);
        s->snap_version = w->version;
    } else if (r != NULL) {
        reject(s, "our own snapshot", r->str);
    }
    free(w);
}

/* Writes the table as this replica's snapshot, oldest entries first, each with its age;
 * `announce` tells the others to load it (they may have missed what we learned). */
static void write_snapshot(pcr_share_t *s, int announce)
{
    if (!pcr_share_link_up(s->link) || s->snap_writing)
        return;
    const pcr_share_entry_t **v;
    size_t n;
    pcr_share_enc_t e;
    if (pcr_share_table_list(s->table, &v, &n) < 0)
        return;
    if (pcr_share_enc_init(&e, s->names, s->nbackends) < 0) {
        free(v);
        return;
    }
    uint64_t now = pcr_now_us();
    for (size_t i = 0; i < n; i++) {
        uint64_t age_ms = now > v[i]->time ? (now - v[i]->time) / 1000 : 0;
        if (pcr_share_enc_add(&e, PCR_SHARE_COMMIT, v[i]->backend, v[i]->blocks, v[i]->nblocks,
                              age_ms) < 0)
            break;
    }
    free(v);
    pcr_share_hdr_t h = {PCR_SHARE_F_SNAPSHOT, (uint32_t)s->srv->cfg->routing.block_bytes,
                         s->replica, wall_ms()};
    unsigned char *blob;
    size_t len;
    int rc = pcr_share_enc_finish(&e, &h, &blob, &len);
    pcr_share_enc_dispose(&e);
    set_t *w = malloc(sizeof(*w));
    if (rc < 0 || w == NULL) {
        free(w);
        if (rc == 0)
            free(blob);
        return;
    }
    *w = (set_t){s, pcr_share_table_version(s->table)};
    char ttl[16], expiry[24];
    snprintf(ttl, sizeof ttl, "%u", s->rc->snapshot_ttl_ms);
    snprintf(expiry, sizeof expiry, "%" PRIu64, wall_ms() + s->rc->snapshot_ttl_ms);
    const char *set[5] = {"SET", s->k_self, (const char *)blob, "PX", ttl};
    size_t set_lens[5] = {3, strlen(s->k_self), len, 2, strlen(ttl)};
    if (pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_snapshot_written, w, 5, set, set_lens) < 0) {
        free(w);
        free(blob);
        return;
    }
    free(blob);
    s->snap_writing = 1;
    /* The index lists it until it expires; the index and the stream expire too once every
     * replica is gone for snapshot_ttl_ms. */
    const char *zadd[4] = {"ZADD", s->k_index, expiry, s->self_hex};
    const char *exp_index[3] = {"PEXPIRE", s->k_index, ttl};
    const char *exp_stream[3] = {"PEXPIRE", s->k_stream, ttl};
    pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_ignore, s, 4, zadd, NULL);
    pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_ignore, s, 3, exp_index, NULL);
    pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_ignore, s, 3, exp_stream, NULL);
    if (announce) {
        /* Behind the SET on the same connection: whoever reads the announce finds the
         * snapshot written. */
        pcr_share_enc_t empty;
        if (pcr_share_enc_init(&empty, s->names, 0) == 0) {
            pcr_share_hdr_t ah = {PCR_SHARE_F_ANNOUNCE, h.block_bytes, s->replica, wall_ms()};
            if (pcr_share_enc_finish(&empty, &ah, &blob, &len) == 0)
                xadd(s, blob, len, 0);
            pcr_share_enc_dispose(&empty);
        }
    }
}

static void on_snap_timer(evutil_socket_t fd, short what, void *arg)
{
    pcr_share_t *s = arg;
    if (pcr_share_table_count(s->table) > 0 && pcr_share_table_version(s->table) != s->snap_version)
        write_snapshot(s, 0);
}

/* ---- the link ------------------------------------------------------------------------ */

static void on_up(void *arg)
{
    pcr_share_t *s = arg;
    if (s->ups++ > 0)
        PCR_INC(s->m.reconnects);
    PCR_STORE(s->m.connected, 1);
    s->snap_writing = 0;
    /* Back after a loss, the snapshot is written at once: Redis may have lost it (a restart),
     * and when updates were dropped meanwhile, the others are told to load it. */
    if (pcr_share_table_count(s->table) > 0)
        write_snapshot(s, s->dropped_while_down);
    s->dropped_while_down = 0;
    if (!s->have_id) {
        resync(s);
        return;
    }
    const char *argv[4] = {"XRANGE", s->k_stream, s->last_id, s->last_id};
    pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_gap_check, s, 4, argv, NULL);
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
    const pcr_redis_conf_t *rc = &srv->cfg->redis;
    if (!rc->enabled)
        return 0;
    pcr_share_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return PCR_ERR_NOMEM;
    s->srv = srv;
    s->rc = rc;
    s->nbackends = srv->nbackends;
    if (getrandom(&s->replica, sizeof s->replica, GRND_NONBLOCK) != sizeof s->replica)
        s->replica = pcr_now_us() ^ ((uint64_t)getpid() << 40) ^ wall_ms() << 20;
    snprintf(s->self_hex, sizeof s->self_hex, "%016" PRIx64, s->replica);
    char self[40];
    snprintf(self, sizeof self, "snapshot:%s", s->self_hex);
    s->k_stream = key_of(rc->channel, "stream");
    s->k_index = key_of(rc->channel, "snapshots");
    s->k_self = key_of(rc->channel, self);
    s->snap_prefix_len = strlen(rc->channel) + strlen(":snapshot:");
    s->names = calloc(s->nbackends, sizeof(*s->names));
    s->was_up = calloc(s->nbackends, sizeof(*s->was_up));
    s->max_blocks = (srv->cfg->routing.max_prefix_bytes + srv->cfg->routing.block_bytes - 1) /
                    srv->cfg->routing.block_bytes;
    s->kbuf = malloc(s->max_blocks * sizeof(*s->kbuf));
    s->table = pcr_share_table_new(s->nbackends, rc->snapshot_max_bytes, s->replica);
    static const pcr_share_link_cbs_t cbs = {on_up, on_down};
    s->link = pcr_share_link_new(srv->base, rc, &cbs, s);
    s->flush_timer = event_new(srv->base, -1, EV_PERSIST, on_flush, s);
    s->snap_timer = event_new(srv->base, -1, EV_PERSIST, on_snap_timer, s);
    s->ready_timer = evtimer_new(srv->base, on_ready_timeout, s);
    if (s->k_stream == NULL || s->k_index == NULL || s->k_self == NULL || s->names == NULL ||
        s->was_up == NULL || s->kbuf == NULL || s->table == NULL || s->link == NULL ||
        s->flush_timer == NULL || s->snap_timer == NULL || s->ready_timer == NULL) {
        pcr_share_free(s);
        return PCR_ERR_NOMEM;
    }
    for (size_t i = 0; i < s->nbackends; i++) {
        s->names[i] = srv->backends[i].conf->name;
        s->was_up[i] = PCR_LOAD(srv->backends[i].up);
    }
    int rc2 = pcr_share_enc_init(&s->enc, s->names, s->nbackends);
    if (rc2 < 0) {
        if (rc2 == PCR_ERR_INVAL)
            pcr_log_error("share: every backend name must be 1 to %d bytes to be shared",
                          PCR_SHARE_NAME_MAX);
        pcr_share_free(s);
        return rc2;
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
    struct timeval flush = {s->rc->flush_ms / 1000, (suseconds_t)(s->rc->flush_ms % 1000) * 1000};
    unsigned si = s->rc->snapshot_interval_ms, rt = s->rc->ready_timeout_ms;
    struct timeval snap = {si / 1000, (suseconds_t)(si % 1000) * 1000};
    struct timeval ready = {rt / 1000, (suseconds_t)(rt % 1000) * 1000};
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
        write_snapshot(s, 0);
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
    free(s->names);
    free(s->was_up);
    free(s->k_stream);
    free(s->k_index);
    free(s->k_self);
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
}
