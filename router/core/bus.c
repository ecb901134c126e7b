/* router/core/bus.c: the workers' index-update inboxes (bus.h).
 *
 * A message is a fixed header and the key's block hashes:
 *   op (u8) | pad (u8) | backend (u16) | nblocks (u32) | arg (u64: now, added_from, blocks) |
 *   prompt_tokens (u64) | blocks (nblocks x u64)
 * copied into each target inbox (a growable byte buffer) under its mutex. A membership message
 * (OP_SET) carries the backend's weight in prompt_tokens, its capacity in arg, and its name and
 * zone, NUL-terminated, in the words where a key's blocks would be. OP_OBSERVE carries the
 * uncached tokens in prompt_tokens and the queued work in one word; OP_FEEDBACK three words
 * (matched blocks, their time, settled_before) before the key's blocks.
 *
 * A worker applies its inbox a slice at a time (pcr_worker_sync, here because it is the bus's
 * drain with the worker's timer for the rest). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "pcr/common.h"
#include "bus.h"
#include "server.h"

enum { OP_COMMIT = PCR_BUS_OP_COMMIT, OP_FORGET, OP_CAPACITY, OP_SET, OP_REMOVE, OP_TUNE,
       OP_STATE, OP_OBSERVE, OP_FEEDBACK, OP_KV_STORED, OP_KV_REMOVED, OP_KV_CLEAR };
/* OP_KV_STORED: prompt_tokens = medium | has_parent << 8 | block_size << 32; words: parent,
 * seed, nhashes, the hashes, then the tokens, two to a word. */
#define KV_STORED_WORDS 3
#define FEEDBACK_WORDS 3

/* OP_TUNE's payload: the options but the zone, then the zone, NUL-terminated. */
typedef struct {
    uint32_t kind, vnodes;
    uint64_t block_bytes, max_prefix_bytes, index_max_bytes, unavailable_keep;
    double load_factor, load_weight, zone_penalty;
    double inflight_factor, load_scale, share_factor, prefill_us_per_token, ttft_overhead_us;
    double share_penalty, share_margin, share_exempt_tokens, share_reserve, share_reserve_tokens;
    uint64_t index_events, kv_block_tokens, kv_speculative_ttl;
} tune_t;

typedef struct {
    uint8_t op, pad;
    uint16_t backend;
    uint32_t nblocks;
    uint64_t arg;
    uint64_t prompt_tokens;
} msg_t;

typedef struct {
    pthread_mutex_t mu;
    unsigned char *buf;          /* messages waiting, under mu */
    size_t len, cap;
    size_t pending;              /* == len, read without the lock (atomic) */
    unsigned char *work;         /* the drainer's: messages taken from buf (swapped), those from */
    size_t work_len, work_cap;   /* work_off on not applied yet (a drain's budget ran out) */
    size_t work_off;
} inbox_t;

struct pcr_bus {
    unsigned n;                  /* workers; in[n] is the tap's inbox */
    int tap;                     /* the workers' updates also go to in[n] */
    inbox_t *in;
    uint64_t dropped;            /* atomic */
};

pcr_bus_t *pcr_bus_new(unsigned nworkers)
{
    pcr_bus_t *bus = calloc(1, sizeof(*bus));
    if (bus == NULL)
        return NULL;
    bus->n = nworkers;
    bus->in = calloc(nworkers + 1, sizeof(*bus->in));
    if (bus->in == NULL) {
        free(bus);
        return NULL;
    }
    for (unsigned i = 0; i <= nworkers; i++)
        pthread_mutex_init(&bus->in[i].mu, NULL);
    return bus;
}

void pcr_bus_free(pcr_bus_t *bus)
{
    if (bus == NULL)
        return;
    for (unsigned i = 0; i <= bus->n; i++) {
        pthread_mutex_destroy(&bus->in[i].mu);
        free(bus->in[i].buf);
        free(bus->in[i].work);
    }
    free(bus->in);
    free(bus);
}

static void put(pcr_bus_t *bus, inbox_t *ib, const msg_t *m, const uint64_t *blocks)
{
    size_t need = sizeof(*m) + (size_t)m->nblocks * sizeof(uint64_t);
    pthread_mutex_lock(&ib->mu);
    if (ib->len + need > PCR_BUS_MAX_BYTES) {
        pthread_mutex_unlock(&ib->mu);
        PCR_ADD(bus->dropped, 1);
        return;
    }
    if (pcr_grow(&ib->buf, &ib->cap, ib->len + need, 16384, PCR_BUS_MAX_BYTES, NULL) != 0) {
        pthread_mutex_unlock(&ib->mu);
        PCR_ADD(bus->dropped, 1);
        return;
    }
    memcpy(ib->buf + ib->len, m, sizeof(*m));
    if (m->nblocks && blocks != NULL)
        memcpy(ib->buf + ib->len + sizeof(*m), blocks, (size_t)m->nblocks * sizeof(uint64_t));
    ib->len += need;
    PCR_STORE(ib->pending, ib->len);
    pthread_mutex_unlock(&ib->mu);
}

static void publish(pcr_bus_t *bus, int from, const msg_t *m, const uint64_t *blocks)
{
    if (bus == NULL)
        return;
    for (unsigned i = 0; i < bus->n; i++)
        if ((int)i != from)
            put(bus, &bus->in[i], m, blocks);
    if (bus->tap && from != PCR_BUS_CONTROL)
        put(bus, &bus->in[bus->n], m, blocks);
}

void pcr_bus_enable_tap(pcr_bus_t *bus) { bus->tap = 1; }

void pcr_bus_commit(pcr_bus_t *bus, int from, int backend, const pcr_key_t *key, uint64_t now)
{
    msg_t m = {OP_COMMIT, 0, (uint16_t)backend, (uint32_t)key->nblocks, now, key->prompt_tokens};
    publish(bus, from, &m, key->blocks);
}

void pcr_bus_forget(pcr_bus_t *bus, int from, int backend, const pcr_key_t *key,
                    uint32_t added_from)
{
    msg_t m = {OP_FORGET, 0, (uint16_t)backend, (uint32_t)key->nblocks, added_from,
               key->prompt_tokens};
    publish(bus, from, &m, key->blocks);
}

void pcr_bus_capacity(pcr_bus_t *bus, int from, int backend, uint64_t blocks)
{
    msg_t m = {OP_CAPACITY, 0, (uint16_t)backend, 0, blocks, 0};
    publish(bus, from, &m, NULL);
}

/* What applying a message costs, in blocks: a budget of them bounds a drain. */
static size_t msg_cost(const msg_t *m, const uint64_t *words)
{
    if (m->op == OP_KV_STORED)
        return m->nblocks >= KV_STORED_WORDS && words[2] < m->nblocks ? 1 + (size_t)words[2] : 1;
    return 1 + m->nblocks;
}

/* Calls `fn` on inbox `ib`'s messages, in order, until they cost `budget` blocks (at least
 * one message): those taken and not applied stay for the next drain, before any newer. The
 * buffers are swapped and reused. */
static size_t drain(inbox_t *ib, void (*fn)(const pcr_bus_msg_t *m, void *arg), void *arg,
                    size_t budget)
{
    if (ib->work_off >= ib->work_len) {
        if (PCR_LOAD(ib->pending) == 0)
            return 0;
        pthread_mutex_lock(&ib->mu);
        unsigned char *b = ib->buf;
        size_t cap = ib->cap;
        ib->buf = ib->work;
        ib->cap = ib->work_cap;
        ib->work = b;
        ib->work_cap = cap;
        ib->work_len = ib->len;
        ib->work_off = 0;
        ib->len = 0;
        PCR_STORE(ib->pending, 0);
        pthread_mutex_unlock(&ib->mu);
    }
    unsigned char *buf = ib->work;
    size_t len = ib->work_len;
    size_t n = 0, off = ib->work_off, spent = 0;
    while (off + sizeof(msg_t) <= len && (n == 0 || spent < budget)) {
        msg_t m;
        memcpy(&m, buf + off, sizeof(m));
        off += sizeof(m);
        size_t bytes = (size_t)m.nblocks * sizeof(uint64_t);
        if (off + bytes > len) {
            off = len;
            break;
        }
        /* The blocks are 8-byte aligned in the buffer: header and blocks are multiples of 8. */
        spent += msg_cost(&m, (const uint64_t *)(const void *)(buf + off));
        pcr_key_t key = {.blocks = (uint64_t *)(void *)(buf + off), .nblocks = m.nblocks,
                         .prompt_tokens = m.prompt_tokens};
        pcr_bus_msg_t bm = {(pcr_bus_op_t)m.op, m.backend, &key, m.arg, NULL, NULL, 0, 0, {0}, 0,
                            {0}};
        if (m.op == OP_OBSERVE && m.nblocks == 1) {
            bm.uncached = m.prompt_tokens;
            bm.queued_ahead = key.blocks[0];
        }
        if (m.op == OP_FEEDBACK) {
            if (m.nblocks < FEEDBACK_WORDS) {
                off += bytes;
                continue;
            }
            bm.decision.backend = m.backend;
            bm.decision.matched_blocks = (uint32_t)key.blocks[0];
            bm.decision.matched_time = key.blocks[1];
            bm.settled_before = key.blocks[2];
            key.blocks += FEEDBACK_WORDS;
            key.nblocks -= FEEDBACK_WORDS;
        }
        if (m.op == OP_KV_STORED) {
            uint64_t nh = m.nblocks >= KV_STORED_WORDS ? key.blocks[2] : UINT64_MAX;
            uint32_t bs = (uint32_t)(m.prompt_tokens >> 32);
            /* Made by pcr_bus_kv_stored alone; checked all the same. */
            if (nh > m.nblocks || bs == 0 ||
                KV_STORED_WORDS + nh + (nh * bs + 1) / 2 != m.nblocks) {
                off += bytes;
                continue;
            }
            bm.kv = (pcr_kvt_stored_t){
                .hashes = key.blocks + KV_STORED_WORDS, .nhashes = (size_t)nh,
                .has_parent = (int)((m.prompt_tokens >> 8) & 1), .parent = key.blocks[0],
                .tokens = (const uint32_t *)(const void *)(key.blocks + KV_STORED_WORDS + nh),
                .block_size = bs, .medium = (pcr_kvt_medium_t)(m.prompt_tokens & 0xff),
                .seed = key.blocks[1]};
        }
        if (m.op == OP_KV_REMOVED)
            bm.kv.medium = (pcr_kvt_medium_t)m.prompt_tokens;
        pcr_backend_desc_t desc;
        pcr_policy_opts_t opts;
        if (m.op == OP_TUNE && bytes > sizeof(tune_t)) {
            tune_t t;
            memcpy(&t, buf + off, sizeof(t));
            const char *zone = (const char *)(buf + off + sizeof(t));
            if (strnlen(zone, bytes - sizeof(t)) < bytes - sizeof(t)) {
                pcr_policy_opts_default(&opts);
                opts.kind = (pcr_policy_kind_t)t.kind;
                opts.vnodes = t.vnodes;
                opts.block_bytes = t.block_bytes;
                opts.max_prefix_bytes = t.max_prefix_bytes;
                opts.index_max_bytes = t.index_max_bytes;
                opts.unavailable_keep = t.unavailable_keep;
                opts.load_factor = t.load_factor;
                opts.load_weight = t.load_weight;
                opts.zone_penalty = t.zone_penalty;
                opts.inflight_factor = t.inflight_factor;
                opts.load_scale = t.load_scale;
                opts.share_factor = t.share_factor;
                opts.share_penalty = t.share_penalty;
                opts.share_margin = t.share_margin;
                opts.share_exempt_tokens = t.share_exempt_tokens;
                opts.share_reserve = t.share_reserve;
                opts.share_reserve_tokens = t.share_reserve_tokens;
                opts.prefill_us_per_token = t.prefill_us_per_token;
                opts.ttft_overhead_us = t.ttft_overhead_us;
                opts.index_events = (int)t.index_events;
                opts.kv_block_tokens = (uint32_t)t.kv_block_tokens;
                opts.kv_speculative_ttl = t.kv_speculative_ttl;
                opts.zone = zone;
                bm.opts = &opts;
            }
        }
        if (m.op == OP_SET) {
            const char *name = (const char *)(buf + off);
            size_t room = bytes, nl = strnlen(name, room);
            if (nl + 1 < room) {
                desc = (pcr_backend_desc_t){name, name + nl + 1, (uint32_t)m.prompt_tokens, m.arg};
                bm.desc = &desc;
            }
        }
        fn(&bm, arg);
        off += bytes;
        n++;
    }
    ib->work_off = off;
    return n;
}

void pcr_bus_backend_set(pcr_bus_t *bus, int from, int backend, const pcr_backend_desc_t *d)
{
    const char *zone = d->zone ? d->zone : "";
    size_t nl = strlen(d->name) + 1, zl = strlen(zone) + 1;
    size_t words = (nl + zl + 7) / 8;
    uint64_t text[words];
    memset(text, 0, sizeof(text));
    memcpy(text, d->name, nl);
    memcpy((char *)text + nl, zone, zl);
    msg_t m = {OP_SET, 0, (uint16_t)backend, (uint32_t)words, d->capacity_blocks, d->weight};
    publish(bus, from, &m, text);
}

void pcr_bus_tune(pcr_bus_t *bus, const pcr_policy_opts_t *o)
{
    const char *zone = o->zone ? o->zone : "";
    size_t zl = strlen(zone) + 1;
    size_t words = (sizeof(tune_t) + zl + 7) / 8;
    uint64_t payload[words];
    memset(payload, 0, sizeof(payload));
    tune_t t = {(uint32_t)o->kind, o->vnodes, o->block_bytes, o->max_prefix_bytes,
                o->index_max_bytes, o->unavailable_keep, o->load_factor, o->load_weight,
                o->zone_penalty, o->inflight_factor, o->load_scale, o->share_factor,
                o->prefill_us_per_token, o->ttft_overhead_us, o->share_penalty,
                o->share_margin, o->share_exempt_tokens, o->share_reserve,
                o->share_reserve_tokens, (uint64_t)o->index_events, o->kv_block_tokens,
                o->kv_speculative_ttl};
    memcpy(payload, &t, sizeof(t));
    memcpy((char *)payload + sizeof(t), zone, zl);
    msg_t m = {OP_TUNE, 0, 0, (uint32_t)words, 0, 0};
    publish(bus, PCR_BUS_CONTROL, &m, payload);
}

void pcr_bus_state(pcr_bus_t *bus, int backend, pcr_backend_state_t state, uint64_t now)
{
    msg_t m = {OP_STATE, 0, (uint16_t)backend, 0, now, (uint64_t)state};
    publish(bus, PCR_BUS_CONTROL, &m, NULL);
}

void pcr_bus_observe(pcr_bus_t *bus, int from, int backend, uint64_t uncached_tokens,
                     uint64_t queued_ahead, uint64_t ttfb_us)
{
    msg_t m = {OP_OBSERVE, 0, (uint16_t)backend, 1, ttfb_us, uncached_tokens};
    publish(bus, from, &m, &queued_ahead);
}

void pcr_bus_feedback(pcr_bus_t *bus, int from, const pcr_key_t *key, const pcr_decision_t *d,
                      uint64_t delivered_tokens, uint64_t settled_before)
{
    if (bus == NULL || key->nblocks > UINT32_MAX - FEEDBACK_WORDS)
        return;
    /* One per answered request: on the stack unless the key is unusually long. */
    uint64_t local[FEEDBACK_WORDS + 1024];
    size_t words = FEEDBACK_WORDS + key->nblocks;
    uint64_t *payload = words <= PCR_ARRAY_SIZE(local) ? local : malloc(words * sizeof(uint64_t));
    if (payload == NULL) {
        PCR_ADD(bus->dropped, 1);
        return;
    }
    payload[0] = d->matched_blocks;
    payload[1] = d->matched_time;
    payload[2] = settled_before;
    if (key->nblocks)
        memcpy(payload + FEEDBACK_WORDS, key->blocks, key->nblocks * sizeof(uint64_t));
    msg_t m = {OP_FEEDBACK, 0, (uint16_t)d->backend, (uint32_t)words, delivered_tokens,
               key->prompt_tokens};
    publish(bus, from, &m, payload);
    if (payload != local)
        free(payload);
}

void pcr_bus_backend_remove(pcr_bus_t *bus, int from, int backend)
{
    msg_t m = {OP_REMOVE, 0, (uint16_t)backend, 0, 0, 0};
    publish(bus, from, &m, NULL);
}

void pcr_bus_kv_stored(pcr_bus_t *bus, int backend, const pcr_kvt_stored_t *ev, uint64_t now)
{
    size_t ntok = ev->nhashes * (size_t)ev->block_size;
    size_t words = KV_STORED_WORDS + ev->nhashes + (ntok + 1) / 2;
    if (bus == NULL || ev->block_size == 0 || words > UINT32_MAX)
        return;
    uint64_t *payload = calloc(words, sizeof(uint64_t));
    if (payload == NULL) {
        PCR_ADD(bus->dropped, 1);
        return;
    }
    payload[0] = ev->has_parent ? ev->parent : 0;
    payload[1] = ev->seed;
    payload[2] = ev->nhashes;
    memcpy(payload + KV_STORED_WORDS, ev->hashes, ev->nhashes * sizeof(uint64_t));
    memcpy(payload + KV_STORED_WORDS + ev->nhashes, ev->tokens, ntok * sizeof(uint32_t));
    uint64_t packed = (uint64_t)(ev->medium & 0xff) | (uint64_t)(ev->has_parent != 0) << 8 |
                      (uint64_t)ev->block_size << 32;
    msg_t m = {OP_KV_STORED, 0, (uint16_t)backend, (uint32_t)words, now, packed};
    publish(bus, PCR_BUS_CONTROL, &m, payload);
    free(payload);
}

void pcr_bus_kv_removed(pcr_bus_t *bus, int backend, const uint64_t *hashes, size_t n,
                        pcr_kvt_medium_t medium)
{
    if (n > UINT32_MAX)
        return;
    msg_t m = {OP_KV_REMOVED, 0, (uint16_t)backend, (uint32_t)n, 0, (uint64_t)medium};
    publish(bus, PCR_BUS_CONTROL, &m, hashes);
}

void pcr_bus_kv_clear(pcr_bus_t *bus, int backend)
{
    msg_t m = {OP_KV_CLEAR, 0, (uint16_t)backend, 0, 0, 0};
    publish(bus, PCR_BUS_CONTROL, &m, NULL);
}

static void apply(const pcr_bus_msg_t *m, void *arg)
{
    pcr_policy_t **pp = arg, *policy = *pp;
    uint32_t from;
    switch (m->op) {
    case PCR_BUS_OP_COMMIT:
        pcr_policy_commit(policy, m->backend, m->key, m->arg, &from);
        break;
    case PCR_BUS_OP_FORGET:
        pcr_policy_forget(policy, m->backend, m->key, (uint32_t)m->arg);
        break;
    case PCR_BUS_OP_CAPACITY:
        pcr_policy_set_capacity(policy, m->backend, m->arg);
        break;
    case PCR_BUS_OP_SET:
        if (m->desc != NULL)
            pcr_policy_backend_set(policy, m->backend, m->desc);
        break;
    case PCR_BUS_OP_REMOVE:
        pcr_policy_backend_remove(policy, m->backend);
        break;
    case PCR_BUS_OP_STATE:
        pcr_policy_backend_state(policy, m->backend, (pcr_backend_state_t)m->key->prompt_tokens,
                                 m->arg);
        break;
    case PCR_BUS_OP_OBSERVE:
        pcr_policy_observe(policy, m->backend, m->uncached, m->queued_ahead, m->arg);
        break;
    case PCR_BUS_OP_FEEDBACK:
        pcr_policy_feedback(policy, m->key, &m->decision, m->arg, m->settled_before);
        break;
    case PCR_BUS_OP_KV_STORED:
        pcr_policy_kv_stored(policy, m->backend, &m->kv, m->arg);
        break;
    case PCR_BUS_OP_KV_REMOVED:
        pcr_policy_kv_removed(policy, m->backend, m->key->blocks, m->key->nblocks, m->kv.medium);
        break;
    case PCR_BUS_OP_KV_CLEAR:
        pcr_policy_kv_clear(policy, m->backend);
        break;
    case PCR_BUS_OP_TUNE:
        if (m->opts != NULL && pcr_policy_tune(policy, m->opts) != 0) {
            /* The keys change meaning: a new policy with an empty index and the same
             * backends, so that a request decided before the control thread's next messages
             * (every slot's membership, published after the tune) still finds its pods. Kept as
             * is when even that fails. */
            pcr_policy_t *fresh = pcr_policy_renew(policy, m->opts);
            if (fresh != NULL) {
                pcr_policy_free(policy);
                *pp = fresh;
            }
        }
        break;
    }
}

size_t pcr_bus_drain(pcr_bus_t *bus, unsigned id, pcr_policy_t **policy)
{
    /* What an earlier drain left, then what came since. */
    size_t n = pcr_bus_drain_some(bus, id, policy, SIZE_MAX);
    return n + pcr_bus_drain_some(bus, id, policy, SIZE_MAX);
}

size_t pcr_bus_drain_some(pcr_bus_t *bus, unsigned id, pcr_policy_t **policy, size_t budget)
{
    if (bus == NULL || id >= bus->n)
        return 0;
    return drain(&bus->in[id], apply, policy, budget);
}

int pcr_bus_backlog(pcr_bus_t *bus, unsigned id)
{
    if (bus == NULL || id >= bus->n)
        return 0;
    const inbox_t *ib = &bus->in[id];
    return ib->work_off < ib->work_len || PCR_LOAD(ib->pending) != 0;
}

/* A slice of the bus's updates in one loop turn: a pod's event of a long prompt's blocks,
 * applied on every worker's replica, takes a millisecond or more, and the streams the worker
 * relays would wait that long. */
#define SYNC_BLOCKS 1024

void pcr_worker_sync(pcr_worker_t *w)
{
    pcr_bus_t *bus = w->srv->bus;
    if (w->sync_more == NULL) {
        pcr_bus_drain(bus, w->id, &w->policy); /* no loop yet */
        return;
    }
    pcr_bus_drain_some(bus, w->id, &w->policy, SYNC_BLOCKS);
    if (pcr_bus_backlog(bus, w->id) && !evtimer_pending(w->sync_more, NULL)) {
        /* A timer, not event_active: the loop polls its sockets before it runs. */
        struct timeval now = {0, 0};
        evtimer_add(w->sync_more, &now);
    }
}

size_t pcr_bus_drain_tap(pcr_bus_t *bus, void (*fn)(const pcr_bus_msg_t *m, void *arg), void *arg)
{
    if (bus == NULL || !bus->tap)
        return 0;
    return drain(&bus->in[bus->n], fn, arg, SIZE_MAX);
}

uint64_t pcr_bus_dropped(const pcr_bus_t *bus)
{
    return bus ? PCR_LOAD(((pcr_bus_t *)bus)->dropped) : 0;
}
