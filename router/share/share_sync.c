/* router/share/share_sync.c: what comes back from Redis (share_int.h): other replicas' batches read
 * from the stream and applied to every worker, snapshots written and loaded, and the resync
 * that follows a cold start or a gap in the stream (docs/SHARING.md).
 *
 * Every update applied from Redis goes to the workers with pcr_bus_*(PCR_BUS_CONTROL), which
 * the tap does not hand back: nothing is echoed. Backends travel by name, looked up among the
 * backends there are when the batch is applied (a reload or DNS discovery may have changed
 * them since the last one); an update for a name this replica does not have (or no longer
 * has), or keyed with another block size, is ignored and counted. Times:
 * an update's age travels (the sender's wall clock at sending, plus a snapshot entry's age),
 * and is subtracted from this process's monotonic clock. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bus.h"
#include "log.h"
#include "pcr/common.h"
#include "share_int.h"

#define READ_BLOCK_MS 1000      /* how long one XREAD waits for news */
#define MAX_SNAPSHOTS 64        /* snapshots read at most in one resync */
#define CLOCK_AHEAD_MS 60000    /* a sender's clock further ahead than ours is ignored */

/* Now minus `age_ms`, on the monotonic clock of pcr_now_us; at least 1. */
static uint64_t time_of_age(uint64_t age_ms)
{
    uint64_t now = pcr_now_us();
    return age_ms >= now / 1000 ? 1 : now - age_ms * 1000;
}

/* ---- applying what others learned ---------------------------------------------------- */

/* The slot of each of the batch's names among today's backends (-1: none by that name, or no
 * longer); NULL when out of memory. Names are looked up as the batch is applied, never kept:
 * a slot may hold another backend by the next batch. */
static int *map_names(pcr_share_t *s, const pcr_share_batch_t *b)
{
    int *map = malloc((b->nnames ? b->nnames : 1) * sizeof(*map));
    if (map == NULL)
        return NULL;
    size_t pos = 0, len, k = 0;
    const char *name;
    char z[PCR_SHARE_NAME_MAX + 1];
    while (pcr_share_next_name(b, &pos, &name, &len)) {
        memcpy(z, name, len);   /* len <= PCR_SHARE_NAME_MAX: the decoder checked it */
        z[len] = '\0';
        pcr_backend_t *be = pcr_backend_find(s->srv, z);
        map[k++] = be != NULL && (size_t)be->id < s->nseen && s->names[be->id] != NULL ? be->id : -1;
    }
    return map;
}

/* Applies a checked batch from another replica: a stream batch (every op, at its age) or a
 * snapshot (only what the table did not know). Returns the updates applied. */
static uint64_t apply(pcr_share_t *s, pcr_share_batch_t *b, int snapshot)
{
    if (b->hdr.block_bytes != s->block_bytes) {
        PCR_BUMP(s->m.ignored, b->nops);
        return 0;
    }
    int *map = map_names(s, b);
    if (map == NULL) {
        PCR_BUMP(s->m.dropped, b->nops);
        return 0;
    }
    uint64_t now_ms = pcr_share_wall_ms(), applied = 0;
    /* The sender's clock: 0, or ahead of ours by more than CLOCK_AHEAD_MS, is no clock (a
     * broken or hostile writer): its entries count as just sent, and the lag gauge keeps the
     * last plausible age instead of decades. */
    int clock_ok = b->hdr.sent_ms != 0 && b->hdr.sent_ms <= now_ms + CLOCK_AHEAD_MS;
    uint64_t sent_age = clock_ok && b->hdr.sent_ms < now_ms ? now_ms - b->hdr.sent_ms : 0;
    if (!snapshot && clock_ok)
        PCR_STORE(s->m.lag_us, sent_age * 1000);
    pcr_share_op_t op;
    while (pcr_share_next(b, s->kbuf, &op) == 1) {
        int be = map[op.name];
        if (be < 0) {
            PCR_INC(s->m.ignored);
            continue;
        }
        pcr_key_t key = {.blocks = (uint64_t *)op.blocks, .nblocks = op.nblocks};
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
        pcr_share_reject(s, "a stream entry", "not shaped as [id, [field, value, ...]]");
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
        pcr_share_reject(s, "a stream entry", "no \"b\" field");
        return;
    }
    pcr_share_batch_t b;
    const char *why = pcr_share_decode(blob->str, blob->len, s->max_blocks, &b);
    if (why != NULL) {
        pcr_share_reject(s, "a stream entry", why);
        return;
    }
    if (b.hdr.replica == s->replica)
        return;   /* our own, echoed by the stream */
    if (b.hdr.flags & PCR_SHARE_F_SNAPSHOT) {
        pcr_share_reject(s, "a stream entry", "a snapshot where a batch belongs");
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
        pcr_share_reject(s, "the stream", r->str);
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
            /* Before decoding: the batches are read against today's backends and key size. */
            pcr_share_sync_slots(s);
            for (size_t i = 0; i < n; i++)
                read_entry(s, st->element[1]->element[i]);
            s->sync_updates += s->catching_up ? PCR_LOAD(s->m.received) - before : 0;
        } else {
            pcr_share_reject(s, "the stream", "an XREAD reply not shaped as [[key, entries]]");
        }
    }
    if (s->catching_up && n < s->read_asked)
        caught_up(s);
    read_stream(s);
}

/* The ids and sizes of the entries after `last_id`, without the entries: a reply of a few
 * bytes each, whatever they hold. */
static const char SURVEY[] =
    "local r = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', tonumber(ARGV[2])) "
    "local out = {} "
    "for i, e in ipairs(r) do local n = 0 "
    "for _, v in ipairs(e[2]) do n = n + #v end out[i] = {e[1], n} end "
    "return out";

static void xread(pcr_share_t *s, unsigned count);

/* Skips the leading entries too large to be a batch (counted, never read), then reads the ones
 * before the next such entry, if any; careful reading goes on while one is in sight. */
static void on_survey(void *arg, redisReply *r)
{
    pcr_share_t *s = arg;
    if (r == NULL)
        return;
    if (r->type != REDIS_REPLY_ARRAY) {
        pcr_share_reject(s, "the stream", r->type == REDIS_REPLY_ERROR ? r->str : "a survey not a list");
        pcr_share_link_fail(s->link, "cannot size the stream's entries");
        return;
    }
    size_t max = s->conf.batch_max_bytes + 4096, i = 0, good = 0;
    int big = 0;
    for (; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
            e->element[0]->type != REDIS_REPLY_STRING || e->element[1]->type != REDIS_REPLY_INTEGER)
            break;
        int too = e->element[1]->integer < 0 || (unsigned long long)e->element[1]->integer > max;
        if (too && good == 0 && e->element[0]->len < sizeof s->last_id) {
            memcpy(s->last_id, e->element[0]->str, e->element[0]->len);
            s->last_id[e->element[0]->len] = '\0';
            s->have_id = 1;
            pcr_share_reject(s, "a stream entry", "larger than redis.batch_max_bytes: skipped unread");
            continue;
        }
        if (too) {
            big = 1;
            break;
        }
        good++;
    }
    s->careful = big || good == 0 ? (i > 0) : 0;
    if (good == 0) {
        if (i > 0)
            read_stream(s); /* skipped some: look again */
        else
            xread(s, pcr_share_read_count(&s->conf)); /* nothing after: wait for news */
        return;
    }
    xread(s, (unsigned)good);
}

static void read_stream(pcr_share_t *s)
{
    uint64_t o = pcr_share_link_oversize(s->link);
    if (o != s->oversize_seen) {
        s->oversize_seen = o;
        s->careful = 1;
    }
    if (!s->careful) {
        xread(s, pcr_share_read_count(&s->conf));
        return;
    }
    char from[72], count[16];
    snprintf(from, sizeof from, "%s%s", s->have_id ? "(" : "", s->have_id ? s->last_id : "-");
    snprintf(count, sizeof count, "%u", pcr_share_read_count(&s->conf));
    const char *argv[6] = {"EVAL", SURVEY, "1", s->k_stream, from, count};
    if (pcr_share_link_cmd(s->link, PCR_LINK_READ, 0, on_survey, s, 6, argv, NULL) < 0 &&
        pcr_share_link_up(s->link))
        pcr_share_link_fail(s->link, "cannot send EVAL");
}

static void xread(pcr_share_t *s, unsigned n)
{
    char count[16], block[16];
    snprintf(count, sizeof count, "%u", n);
    snprintf(block, sizeof block, "%d", READ_BLOCK_MS);
    s->read_asked = n;
    const char *id = s->have_id ? s->last_id : "0-0";
    int rc;
    if (s->catching_up || s->careful) {
        const char *argv[6] = {"XREAD", "COUNT", count, "STREAMS", s->k_stream, id};
        rc = pcr_share_link_cmd(s->link, PCR_LINK_READ, 0, on_xread, s, 6, argv, NULL);
    } else {
        const char *argv[8] = {"XREAD", "COUNT", count, "BLOCK", block, "STREAMS", s->k_stream, id};
        rc = pcr_share_link_cmd(s->link, PCR_LINK_READ, READ_BLOCK_MS, on_xread, s, 8, argv, NULL);
    }
    /* A reader that stopped would stop the sharing unseen: start over instead. */
    if (rc < 0 && pcr_share_link_up(s->link))
        pcr_share_link_fail(s->link, "cannot send XREAD");
}

/* ---- snapshots ----------------------------------------------------------------------- */

typedef struct {
    pcr_share_t *s;
    int sync;                     /* part of a resync: counted in sync_pending */
    char key[256];
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
        pcr_share_sync_slots(s);
        const char *why = pcr_share_decode(r->str, r->len, s->max_blocks, &b);
        if (why == NULL && !(b.hdr.flags & PCR_SHARE_F_SNAPSHOT))
            why = "a batch where a snapshot belongs";
        if (why != NULL) {
            pcr_share_reject(s, "a snapshot", why);
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
        pcr_share_reject(s, "a snapshot", r->type == REDIS_REPLY_ERROR ? r->str : "not a string");
    }
    if (sync)
        sync_step_done(s);
}

/* STRLEN first: a snapshot larger than redis.snapshot_max_bytes is refused unread (the link
 * would refuse the reply anyway, and then read it again at every resync), a key of another
 * type is refused as well; only then GET. */
static void on_snapshot_len(void *arg, redisReply *r)
{
    get_t *g = arg;
    pcr_share_t *s = g->s;
    if (r == NULL) {
        free(g);
        return;
    }
    const char *why = NULL;
    if (r->type == REDIS_REPLY_ERROR)
        why = r->str;
    else if (r->type != REDIS_REPLY_INTEGER)
        why = "not a string";
    else if (r->integer <= 0)
        why = ""; /* gone since it was listed */
    else if ((unsigned long long)r->integer > s->conf.snapshot_max_bytes)
        why = "larger than redis.snapshot_max_bytes: skipped unread";
    if (why == NULL) {
        const char *argv[2] = {"GET", g->key};
        if (pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_snapshot, g, 2, argv, NULL) == 0)
            return; /* on_snapshot ends the step */
    } else if (why[0] != '\0') {
        pcr_share_reject(s, "a snapshot", why);
    }
    int sync = g->sync;
    free(g);
    if (sync)
        sync_step_done(s);
}

static void fetch_snapshot(pcr_share_t *s, const char *hex, int sync)
{
    get_t *g = malloc(sizeof(*g));
    if (g == NULL)
        return;
    *g = (get_t){s, sync, ""};
    snprintf(g->key, sizeof g->key, "%.*s%s", (int)s->snap_prefix_len, s->k_self, hex);
    const char *argv[2] = {"STRLEN", g->key};
    if (pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_snapshot_len, g, 2, argv, NULL) < 0) {
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
                pcr_share_reject(s, "the snapshot index", "a member that is not a replica id");
                continue;
            }
            if (memcmp(m->str, s->self_hex, 16) != 0) {
                fetch_snapshot(s, m->str, 1);
                n++;
            }
        }
    } else {
        pcr_share_reject(s, "the snapshot index",
                         r->type == REDIS_REPLY_ERROR ? r->str : "not a list");
    }
    sync_step_done(s);   /* the ZRANGE itself */
}

/* Loads every replica's snapshot, then reads the whole stream: a cold start, or a gap. */
static void resync(pcr_share_t *s)
{
    char now[24];
    snprintf(now, sizeof now, "%" PRIu64, pcr_share_wall_ms());
    const char *prune[4] = {"ZREMRANGEBYSCORE", s->k_index, "-inf", now};
    pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, pcr_share_ignore_reply, s, 4, prune, NULL);
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
        pcr_share_reject(s, "our own snapshot", r->str);
    }
    free(w);
}

/* Oldest entries first, each with its age, so that a replica loading it rebuilds its LRU order. */
void pcr_share_write_snapshot(pcr_share_t *s, int announce)
{
    if (!pcr_share_link_up(s->link) || s->snap_writing)
        return;
    const pcr_share_entry_t **v;
    size_t n;
    pcr_share_enc_t e;
    if (pcr_share_table_list(s->table, &v, &n) < 0)
        return;
    if (pcr_share_enc_init(&e, s->names, PCR_MAX_BACKENDS) < 0) {
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
    pcr_share_hdr_t h = {PCR_SHARE_F_SNAPSHOT, (uint32_t)s->block_bytes,
                         s->replica, pcr_share_wall_ms()};
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
    snprintf(expiry, sizeof expiry, "%" PRIu64, pcr_share_wall_ms() + s->rc->snapshot_ttl_ms);
    const char *set[5] = {"SET", s->k_self, (const char *)blob, "PX", ttl};
    size_t set_lens[5] = {3, strlen(s->k_self), len, 2, strlen(ttl)};
    if (pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_snapshot_written, w, 5, set,
                           set_lens) < 0) {
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
    pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, pcr_share_ignore_reply, s, 4, zadd, NULL);
    pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, pcr_share_ignore_reply, s, 3, exp_index, NULL);
    pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, pcr_share_ignore_reply, s, 3, exp_stream, NULL);
    if (announce) {
        /* Behind the SET on the same connection: whoever reads the announce finds the
         * snapshot written. */
        pcr_share_enc_t empty;
        if (pcr_share_enc_init(&empty, s->names, 0) == 0) {
            pcr_share_hdr_t ah = {PCR_SHARE_F_ANNOUNCE, h.block_bytes, s->replica,
                                  pcr_share_wall_ms()};
            if (pcr_share_enc_finish(&empty, &ah, &blob, &len) == 0)
                pcr_share_xadd(s, blob, len, 0);
            pcr_share_enc_dispose(&empty);
        }
    }
}

void pcr_share_sync_up(pcr_share_t *s)
{
    /* Back after a loss, the snapshot is written at once: Redis may have lost it (a restart),
     * and when updates were dropped meanwhile, the others are told to load it. */
    s->snap_writing = 0;
    if (pcr_share_table_count(s->table) > 0)
        pcr_share_write_snapshot(s, s->dropped_while_down);
    s->dropped_while_down = 0;
    if (!s->have_id) {
        resync(s);
        return;
    }
    const char *argv[4] = {"XRANGE", s->k_stream, s->last_id, s->last_id};
    pcr_share_link_cmd(s->link, PCR_LINK_CMD, 0, on_gap_check, s, 4, argv, NULL);
}
