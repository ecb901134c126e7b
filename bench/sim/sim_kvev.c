/* bench/sim/sim_kvev.c: the KV-event publisher of sim_kvev.h.
 *
 * Pending events are kept as small records over two growing arrays (block names, token ids)
 * until the flush, which the first event of a batch schedules on the loop (event_active), so
 * one loop turn makes one batch. A stored block whose parent is the last block of the last
 * BlockStored extends it, consecutive evictions share one BlockRemoved, as vLLM groups a
 * request's blocks. */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <zmq.h>

#include "sim.h"
#include "sim_kvev.h"

enum { EV_STORED = 1, EV_REMOVED, EV_CLEARED };

typedef struct {
    int kind;
    int has_parent;
    uint64_t parent;
    size_t h0, nh;              /* block names: hs[h0 .. h0+nh) */
    size_t t0;                  /* STORED: token ids toks[t0 .. t0 + nh * 16) */
} ev_t;

typedef struct {
    uint64_t seq;
    char *data;
    size_t len;
} batch_t;

struct sim_kvev {
    sim_pod_t *pod;
    void *pub, *replay;
    struct event *replay_ev, *flush_ev, *pub_ev;
    char topic[160];
    size_t topic_len;
    int map;                    /* events are maps (SIM_KVEV_MAP or _MAP_BATCH) */
    int map_batch;              /* the batch too, with no topic in replay answers */
    double drop;
    uint64_t rng;
    ev_t *evs;
    size_t nevs, evcap;
    uint64_t *hs;
    size_t nhs, hcap;
    uint32_t *toks;
    size_t ntoks, tcap;
    batch_t ring[SIM_KVEV_RING];  /* batch seq lives at ring[seq % SIM_KVEV_RING] */
    uint64_t first_seq;           /* the oldest batch the ring holds ... */
    uint64_t next_seq;            /* ... up to the one before the next batch's sequence */
    size_t ring_bytes;
    sim_kvev_stats_t st;
};

static double kv_rand(sim_kvev_t *k)
{
    k->rng ^= k->rng >> 12;
    k->rng ^= k->rng << 25;
    k->rng ^= k->rng >> 27;
    return (double)((k->rng * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

/* Makes room for n more elements of size `sz` in *arr (count *len, capacity *cap). */
static int grow(void **arr, size_t *cap, size_t len, size_t n, size_t sz)
{
    if (len + n <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < len + n)
        c *= 2;
    void *p = realloc(*arr, c * sz);
    if (!p)
        return -1;
    *arr = p;
    *cap = c;
    return 0;
}

static ev_t *new_event(sim_kvev_t *k, int kind)
{
    if (grow((void **)&k->evs, &k->evcap, k->nevs, 1, sizeof(ev_t)) != 0)
        return NULL;
    if (k->nevs == 0)
        event_active(k->flush_ev, EV_TIMEOUT, 1);
    ev_t *e = &k->evs[k->nevs++];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->h0 = k->nhs;
    e->t0 = k->ntoks;
    k->st.events++;
    return e;
}

static void on_stored(void *arg, const uint64_t *hashes, size_t i)
{
    sim_kvev_t *k = arg;
    const unsigned char *bytes = sim_engine_block_bytes(k->pod, hashes);
    if (!bytes) {
        k->st.unknown_owner++;   /* not expected: every admission names its prompt */
        return;
    }
    if (grow((void **)&k->hs, &k->hcap, k->nhs, 1, sizeof(uint64_t)) != 0 ||
        grow((void **)&k->toks, &k->tcap, k->ntoks, PCR_KV_BLOCK_TOKENS, sizeof(uint32_t)) != 0)
        return;
    /* The block extends the last BlockStored when its parent is that event's last block. */
    ev_t *e = k->nevs ? &k->evs[k->nevs - 1] : NULL;
    if (!e || e->kind != EV_STORED || i == 0 || k->hs[k->nhs - 1] != hashes[i - 1]) {
        if (!(e = new_event(k, EV_STORED)))
            return;
        e->has_parent = i > 0;
        e->parent = i > 0 ? hashes[i - 1] : 0;
    }
    e->nh++;
    k->hs[k->nhs++] = hashes[i];
    const unsigned char *b = bytes + i * PCR_KV_BLOCK_BYTES;
    for (size_t t = 0; t < PCR_KV_BLOCK_TOKENS; t++, b += PCR_KV_TOKEN_BYTES)
        k->toks[k->ntoks++] = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                              (uint32_t)b[3] << 24;
}

static void on_removed(void *arg, uint64_t hash)
{
    sim_kvev_t *k = arg;
    if (grow((void **)&k->hs, &k->hcap, k->nhs, 1, sizeof(uint64_t)) != 0)
        return;
    ev_t *e = k->nevs ? &k->evs[k->nevs - 1] : NULL;
    if (!e || e->kind != EV_REMOVED)
        if (!(e = new_event(k, EV_REMOVED)))
            return;
    e->nh++;
    k->hs[k->nhs++] = hash;
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_hashes(sim_kvev_t *k, msgpack_packer *pk, const ev_t *e)
{
    msgpack_pack_array(pk, e->nh);
    for (size_t j = 0; j < e->nh; j++)
        msgpack_pack_uint64(pk, k->hs[e->h0 + j]);
}

/* One event: ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
 * medium], ["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"], or the same fields
 * in a map with "type" (with map-batch, a BlockStored has lora_name too). */
static void pack_event(sim_kvev_t *k, msgpack_packer *pk, const ev_t *e)
{
    static const char *const names[] = {NULL, "BlockStored", "BlockRemoved", "AllBlocksCleared"};
    size_t nfields = e->kind == EV_STORED ? 7 + k->map_batch : e->kind == EV_REMOVED ? 3 : 1;
    if (k->map) {
        msgpack_pack_map(pk, nfields);
        pack_str(pk, "type");
    } else {
        msgpack_pack_array(pk, nfields);
    }
    pack_str(pk, names[e->kind]);
    if (e->kind == EV_CLEARED)
        return;
    if (k->map) pack_str(pk, "block_hashes");
    pack_hashes(k, pk, e);
    if (e->kind == EV_STORED) {
        if (k->map) pack_str(pk, "parent_block_hash");
        if (e->has_parent) msgpack_pack_uint64(pk, e->parent); else msgpack_pack_nil(pk);
        if (k->map) pack_str(pk, "token_ids");
        size_t nt = e->nh * PCR_KV_BLOCK_TOKENS;
        msgpack_pack_array(pk, nt);
        for (size_t j = 0; j < nt; j++)
            msgpack_pack_uint32(pk, k->toks[e->t0 + j]);
        if (k->map) pack_str(pk, "block_size");
        msgpack_pack_int(pk, PCR_KV_BLOCK_TOKENS);
        if (k->map) pack_str(pk, "lora_id");
        msgpack_pack_nil(pk);
    }
    if (k->map) pack_str(pk, "medium");
    pack_str(pk, "GPU");
    if (e->kind == EV_STORED && k->map_batch) {
        pack_str(pk, "lora_name");
        msgpack_pack_nil(pk);
    }
}

static void on_pub(evutil_socket_t fd, short what, void *arg);

static void drop_oldest(sim_kvev_t *k)
{
    batch_t *b = &k->ring[k->first_seq % SIM_KVEV_RING];
    k->ring_bytes -= b->len;
    free(b->data);
    *b = (batch_t){0};
    k->first_seq++;
}

static void put_seq(unsigned char out[8], uint64_t seq)
{
    for (int i = 7; i >= 0; i--, seq >>= 8)
        out[i] = (unsigned char)seq;
}

/* Packs what is pending into the next batch, publishes it (unless --kv-events-drop says
 * not) and keeps it in the replay buffer. */
static void flush(sim_kvev_t *k)
{
    if (k->nevs == 0)
        return;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    double ts = (double)tv.tv_sec + tv.tv_usec / 1e6;
    if (k->map_batch) {
        msgpack_pack_map(&pk, 3);
        pack_str(&pk, "ts");
        msgpack_pack_double(&pk, ts);
        pack_str(&pk, "events");
    } else {
        msgpack_pack_array(&pk, 3);
        msgpack_pack_double(&pk, ts);
    }
    msgpack_pack_array(&pk, k->nevs);
    for (size_t i = 0; i < k->nevs; i++)
        pack_event(k, &pk, &k->evs[i]);
    if (k->map_batch) {
        pack_str(&pk, "data_parallel_rank");
        msgpack_pack_int(&pk, 0);   /* vLLM's publisher fills in its rank, 0 without DP */
    } else {
        msgpack_pack_nil(&pk);      /* data_parallel_rank: one engine, no data parallelism */
    }
    k->nevs = k->nhs = k->ntoks = 0;
    size_t len = sb.size;
    char *data = msgpack_sbuffer_release(&sb);
    if (!data)
        return;   /* the packer ran out of memory: the batch is lost, as a gap shows */
    uint64_t seq = k->next_seq++;
    unsigned char sq[8];
    put_seq(sq, seq);
    if (k->drop > 0 && kv_rand(k) < k->drop) {
        k->st.dropped++;
    } else {
        if (zmq_send(k->pub, k->topic, k->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
            zmq_send(k->pub, sq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
            zmq_send(k->pub, data, len, ZMQ_DONTWAIT);   /* PUB never blocks: a full queue drops */
        on_pub(-1, 0, k);   /* the sends may have taken the FD's edge: look again */
    }
    k->st.batches++;
    /* The ring keeps the last SIM_KVEV_RING batches, fewer when they pass
     * SIM_KVEV_RING_BYTES: the oldest go first. */
    if (seq - k->first_seq >= SIM_KVEV_RING)
        drop_oldest(k);
    while (k->first_seq < seq && k->ring_bytes + len > SIM_KVEV_RING_BYTES)
        drop_oldest(k);
    k->ring[seq % SIM_KVEV_RING] = (batch_t){seq, data, len};
    k->ring_bytes += len;
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    flush(arg);
}

/* Answers one replay request: every buffered batch from `start`, then the end marker. */
static void answer_replay(sim_kvev_t *k, zmq_msg_t *id, uint64_t start)
{
    if (start < k->first_seq)
        start = k->first_seq;
    k->st.replays++;
    const void *idp = zmq_msg_data(id);
    size_t idn = zmq_msg_size(id);
    for (uint64_t s = start; s < k->next_seq; s++) {
        const batch_t *b = &k->ring[s % SIM_KVEV_RING];
        unsigned char sq[8];
        put_seq(sq, s);
        /* A ROUTER drops what it cannot queue (ZMQ_SNDHWM), so this never blocks. */
        zmq_send(k->replay, idp, idn, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(k->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        if (k->map && !k->map_batch)
            zmq_send(k->replay, k->topic, k->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(k->replay, sq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(k->replay, b->data, b->len, ZMQ_DONTWAIT);
    }
    static const unsigned char end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    zmq_send(k->replay, idp, idn, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(k->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(k->replay, end, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(k->replay, "", 0, ZMQ_DONTWAIT);
}

/* Reads one whole message from the ROUTER: [id, "", start] is answered, anything else is
 * read to its end and ignored. Returns -1 when nothing was there. */
static int replay_one(sim_kvev_t *k)
{
    zmq_msg_t parts[3];
    int n = 0, more = 1, rc = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, k->replay, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            rc = n ? 0 : -1;   /* a message's parts arrive together: only the first can fail */
            break;
        }
        more = zmq_msg_more(&m);
        if (n < 3) {
            zmq_msg_init(&parts[n]);
            zmq_msg_move(&parts[n], &m);
        }
        zmq_msg_close(&m);
        n++;
    }
    if (n == 3 && zmq_msg_size(&parts[1]) == 0 && zmq_msg_size(&parts[2]) == 8) {
        const unsigned char *p = zmq_msg_data(&parts[2]);
        uint64_t start = 0;
        for (int i = 0; i < 8; i++)
            start = start << 8 | p[i];
        answer_replay(k, &parts[0], start);
    }
    for (int i = 0; i < n && i < 3; i++)
        zmq_msg_close(&parts[i]);
    return rc;
}

/* ZMQ_FD fired (an edge): serve while the socket says it has input, 64 requests per turn at
 * most; when more wait, come back next turn rather than waiting for an edge that will not
 * come. */
static void on_replay(evutil_socket_t fd, short what, void *arg)
{
    sim_kvev_t *k = arg;
    for (int served = 0;; served++) {
        int ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(k->replay, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
            return;
        if (served == 64) {
            event_active(k->replay_ev, EV_READ, 1);
            return;
        }
        if (replay_one(k) != 0)
            return;
    }
}

/* The PUB socket's ZMQ_FD fired: a subscriber came, went or subscribed. Asking ZMQ_EVENTS
 * makes ZMQ take it in now rather than at the next send, so a new subscription is in place
 * as soon as it arrives. */
static void on_pub(evutil_socket_t fd, short what, void *arg)
{
    sim_kvev_t *k = arg;
    int ev;
    size_t sz = sizeof ev;
    zmq_getsockopt(k->pub, ZMQ_EVENTS, &ev, &sz);
}

static void *bind_socket(void *zctx, int type, const char *host, int port, char *ep, size_t eplen)
{
    void *s = zmq_socket(zctx, type);
    if (!s)
        return NULL;
    int linger = 0, hwm = type == ZMQ_ROUTER ? 16 * SIM_KVEV_RING : 10000;
    int64_t maxmsg = 64;   /* replay requests are 3 small frames: a larger one cuts the peer */
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (type == ZMQ_ROUTER)
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    char want[128];
    if (port)
        snprintf(want, sizeof want, "tcp://%s:%d", host, port);
    else
        snprintf(want, sizeof want, "tcp://%s:*", host);
    if (zmq_bind(s, want) != 0) {
        fprintf(stderr, "vllm-sim: cannot bind %s: %s\n", want, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    size_t n = eplen;
    if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n) != 0)
        snprintf(ep, eplen, "%s", want);
    return s;
}

sim_kvev_t *sim_kvev_new(sim_pod_t *pod, void *zctx, const char *host, int pub_port,
                         int replay_port, int encoding, double drop, uint64_t seed)
{
    sim_kvev_t *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->pod = pod;
    k->map = encoding != SIM_KVEV_ARRAY;
    k->map_batch = encoding == SIM_KVEV_MAP_BATCH;
    k->drop = drop;
    k->rng = seed * 0x9E3779B97F4A7C15ULL + 1;
    k->topic_len = (size_t)snprintf(k->topic, sizeof k->topic, "kv@%s", pod->name);
    char pub_ep[256], rep_ep[256];
    int fd = -1, pfd = -1;
    size_t fdsz = sizeof fd, pfdsz = sizeof pfd;
    if (!(k->pub = bind_socket(zctx, ZMQ_PUB, host, pub_port, pub_ep, sizeof pub_ep)) ||
        !(k->replay = bind_socket(zctx, ZMQ_ROUTER, host, replay_port, rep_ep, sizeof rep_ep)) ||
        zmq_getsockopt(k->replay, ZMQ_FD, &fd, &fdsz) != 0 ||
        zmq_getsockopt(k->pub, ZMQ_FD, &pfd, &pfdsz) != 0 ||
        !(k->pub_ev = event_new(pod->base, pfd, EV_READ | EV_PERSIST, on_pub, k)) ||
        event_add(k->pub_ev, NULL) != 0 ||
        !(k->replay_ev = event_new(pod->base, fd, EV_READ | EV_PERSIST, on_replay, k)) ||
        !(k->flush_ev = event_new(pod->base, -1, 0, on_flush, k)) ||
        event_add(k->replay_ev, NULL) != 0) {
        sim_kvev_free(k);
        return NULL;
    }
    pcr_kvcache_observer_t obs = {on_stored, on_removed, k};
    pcr_kvcache_observe(pod->kv, &obs);
    fprintf(stderr, "vllm-sim: pod %s kv-events %s replay %s\n", pod->name, pub_ep, rep_ep);
    return k;
}

static void forget(sim_kvev_t *k)
{
    while (k->first_seq < k->next_seq)
        drop_oldest(k);
    k->nevs = k->nhs = k->ntoks = 0;
}

void sim_kvev_free(sim_kvev_t *k)
{
    if (!k)
        return;
    if (k->pod->kv)
        pcr_kvcache_observe(k->pod->kv, NULL);
    if (k->replay_ev) event_free(k->replay_ev);
    if (k->flush_ev) event_free(k->flush_ev);
    if (k->pub_ev) event_free(k->pub_ev);
    if (k->pub) zmq_close(k->pub);
    if (k->replay) zmq_close(k->replay);
    forget(k);
    free(k->evs);
    free(k->hs);
    free(k->toks);
    free(k);
}

void sim_kvev_restart(sim_kvev_t *k)
{
    forget(k);
    k->first_seq = k->next_seq = 0;
    k->st = (sim_kvev_stats_t){0};
    new_event(k, EV_CLEARED);
    flush(k);
}

void sim_kvev_stats(const sim_kvev_t *k, sim_kvev_stats_t *out)
{
    *out = k->st;
}
