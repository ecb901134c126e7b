/* router/core/bus.h: index updates between the workers' policy replicas.
 *
 * Each worker routes from its own replica of the policy (no lock on the hot path). Whatever
 * changes what a policy knows is applied by the thread that learned it to its own replica (a
 * worker) and published here to every other one: a prefix committed to a backend, a prefix
 * forgotten after the backend failed the request, a backend whose entries are dropped, a
 * backend's capacity learned from its pod. A worker applies its inbox before each decision and
 * on a short tick, so what any worker learns every worker uses within one tick at most, and
 * at once for any request decided after the update was published (unless a burst of the
 * pods' events is ahead of it: a worker applies it a slice a loop turn, pcr_bus_drain_some).
 *
 * The replicas can differ a little: updates are applied in a different order on each worker
 * (its own first), so LRU eviction at capacity may pick differently. Every replica stays a
 * valid index of what the pods may hold, and the differences fade as entries age out.
 *
 * Thread-safety: publishing takes each target inbox's mutex for the copy of one message;
 * draining swaps the inbox's buffer under the mutex and applies outside it; one thread drains
 * an inbox (its worker; the tap's, the control thread). An inbox that a stalled worker does
 * not drain is bounded (PCR_BUS_MAX_BYTES); past it updates are dropped and counted. */
#ifndef PCR_ROUTER_BUS_H
#define PCR_ROUTER_BUS_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/policy.h"

#define PCR_BUS_MAX_BYTES (64u << 20)
#define PCR_BUS_CONTROL (-1)      /* the publisher is not a worker: every inbox gets it */

typedef struct pcr_bus pcr_bus_t;

pcr_bus_t *pcr_bus_new(unsigned nworkers);
void pcr_bus_free(pcr_bus_t *bus);   /* NULL is a no-op */

/* Publishers: `from` is the publishing worker's id (its own inbox is skipped) or
 * PCR_BUS_CONTROL. */
void pcr_bus_commit(pcr_bus_t *bus, int from, int backend, const pcr_key_t *key, uint64_t now);
void pcr_bus_forget(pcr_bus_t *bus, int from, int backend, const pcr_key_t *key,
                    uint32_t added_from);
void pcr_bus_capacity(pcr_bus_t *bus, int from, int backend, uint64_t blocks);
/* What a worker learned of a backend's speed and of what its pod holds: every replica applies
 * it (pcr_policy_observe, pcr_policy_feedback), so every worker's cost and index agree. */
void pcr_bus_observe(pcr_bus_t *bus, int from, int backend, uint64_t uncached_tokens,
                     uint64_t queued_ahead, uint64_t ttfb_us);
void pcr_bus_feedback(pcr_bus_t *bus, int from, const pcr_key_t *key, const pcr_decision_t *d,
                      uint64_t delivered_tokens, uint64_t settled_before);
/* What was seen of a backend (any thread): every replica applies it (pcr_policy_backend_state). */
void pcr_bus_state(pcr_bus_t *bus, int backend, pcr_backend_state_t state, uint64_t now);
/* A reload (the control thread): the policy's options change; every slot's membership follows. */
void pcr_bus_tune(pcr_bus_t *bus, const pcr_policy_opts_t *opts);
/* Membership (the control thread): slot `backend` now holds `desc` (copied), or is empty. */
void pcr_bus_backend_set(pcr_bus_t *bus, int from, int backend, const pcr_backend_desc_t *desc);
void pcr_bus_backend_remove(pcr_bus_t *bus, int from, int backend);

/* Precise mode (the subscriber's thread, kv_sub.h): what a pod said it stored, removed or
 * cleared, for every replica's pods' table (pcr_policy_kv_stored, _removed, _clear). */
void pcr_bus_kv_stored(pcr_bus_t *bus, int backend, const pcr_kvt_stored_t *ev, uint64_t now);
void pcr_bus_kv_removed(pcr_bus_t *bus, int backend, const uint64_t *hashes, size_t n,
                        pcr_kvt_medium_t medium);
void pcr_bus_kv_clear(pcr_bus_t *bus, int backend);

/* Applies worker `id`'s pending updates to `*policy`; returns how many. Cheap when empty (one
 * relaxed load). A reload that changes what the keys mean replaces `*policy` with a new one
 * (the membership follows on the bus). */
size_t pcr_bus_drain(pcr_bus_t *bus, unsigned id, pcr_policy_t **policy);
/* The same, in order, until the updates applied cost `budget` blocks (at least one update; a
 * pod's event of a request's 6,000 blocks costs 6,000): a worker's loop turn is not taken by a
 * burst. pcr_bus_backlog says whether any are left. */
size_t pcr_bus_drain_some(pcr_bus_t *bus, unsigned id, pcr_policy_t **policy, size_t budget);
int pcr_bus_backlog(pcr_bus_t *bus, unsigned id);

/* The tap: a consumer on the control thread (the Redis sharing, share.c) that sees every update
 * the workers publish, not those the control thread publishes itself. Off until enabled,
 * before the workers start. */
typedef enum {
    PCR_BUS_OP_COMMIT = 1,     /* backend now holds key (arg: the time of the commit) */
    PCR_BUS_OP_FORGET,         /* backend failed the request: drop key's blocks from arg on */
    PCR_BUS_OP_CAPACITY,       /* backend's capacity is arg blocks */
    PCR_BUS_OP_SET,            /* slot backend holds desc (membership: control only) */
    PCR_BUS_OP_REMOVE,         /* slot backend is empty (membership: control only) */
    PCR_BUS_OP_TUNE,           /* the policy's options (a reload: control only) */
    PCR_BUS_OP_STATE,          /* what was seen of a backend (key->prompt_tokens: the state) */
    PCR_BUS_OP_OBSERVE,        /* a time to first byte (arg: ttfb_us; uncached, queued_ahead) */
    PCR_BUS_OP_FEEDBACK,       /* delivered cached tokens (arg) for key, decision, settled_before */
    PCR_BUS_OP_KV_STORED,      /* a pod's BlockStored (kv; arg: now) (control only) */
    PCR_BUS_OP_KV_REMOVED,     /* a pod's BlockRemoved (key->blocks: its hashes; kv.medium) */
    PCR_BUS_OP_KV_CLEAR,       /* every entry of the pod goes (control only) */
} pcr_bus_op_t;

typedef struct {
    pcr_bus_op_t op;
    int backend;
    const pcr_key_t *key;      /* blocks valid during the callback only */
    uint64_t arg;
    const pcr_backend_desc_t *desc;  /* PCR_BUS_OP_SET */
    const pcr_policy_opts_t *opts;   /* PCR_BUS_OP_TUNE */
    uint64_t uncached, queued_ahead; /* PCR_BUS_OP_OBSERVE */
    pcr_decision_t decision;         /* PCR_BUS_OP_FEEDBACK: backend, matched_blocks, matched_time */
    uint64_t settled_before;         /* PCR_BUS_OP_FEEDBACK (pcr_policy_feedback) */
    pcr_kvt_stored_t kv;             /* PCR_BUS_OP_KV_STORED; medium for KV_REMOVED */
} pcr_bus_msg_t;

void pcr_bus_enable_tap(pcr_bus_t *bus);
size_t pcr_bus_drain_tap(pcr_bus_t *bus, void (*fn)(const pcr_bus_msg_t *m, void *arg), void *arg);

/* Updates dropped because an inbox was full, since start. */
uint64_t pcr_bus_dropped(const pcr_bus_t *bus);

#endif
