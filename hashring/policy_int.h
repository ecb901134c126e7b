/* hashring/policy_int.h: the policy object and the ops table each balancing algorithm fills
 * (lb_simple.c: round_robin, least_loaded; lb_chash.c: consistent_hash; lb_cache.c:
 * cache_aware). policy.c owns the object, the key and the index bookkeeping; feedback.c what
 * the index learns from the pods' delivered cached tokens. */
#ifndef PCR_POLICY_INT_H
#define PCR_POLICY_INT_H

#include "pcr/index.h"
#include "pcr/policy.h"
#include "pcr/ring.h"
#include "pcr/ttft.h"

/* consistent_hash (and cache_aware's cold placement) key on the hash of the block that ends
 * the first PCR_HASH_PREFIX_BYTES of the prompt (or its last block when shorter). 4 KiB is
 * 1024 tokens: longer than the 512-token first block every request of the Mooncake
 * conversation trace shares (keying on the first block would send all of it to one pod), yet
 * short enough that a conversation's later turns, which extend its first, keep the key. */
#define PCR_HASH_PREFIX_BYTES 4096u

typedef struct {
    char *name;                /* NULL for a slot whose backend left */
    char *zone;
    uint32_t weight;
    int in_zone;               /* the router has no zone, or this backend is in it */
    uint64_t down_since;       /* reported unavailable at (0: available, or forgotten already) */
    uint8_t shared;            /* reported PCR_BACKEND_SHARED: 2, _PRIVATE: 1, not yet: 0 */
} pcr_pbackend_t;

typedef struct {
    /* Fills `out` (backend, reason, matched, uncached); at least one backend is usable. */
    void (*decide)(pcr_policy_t *p, const pcr_key_t *key, const pcr_backend_load_t *loads,
                   uint64_t now, pcr_decision_t *out);
} pcr_lb_ops_t;

/* Unknown tails wait while one of the last PCR_PROBE_RUN reports paid (policy.c). */
#define PCR_PROBE_RUN 128

struct pcr_policy {
    pcr_policy_opts_t o;       /* o.zone points at `zone` */
    char *zone;
    size_t n;
    pcr_pbackend_t *be;
    const pcr_lb_ops_t *ops;
    pcr_ring_t *ring;          /* consistent_hash, cache_aware */
    pcr_index_t *index;        /* cache_aware */
    pcr_kvtable_t *kvt;        /* cache_aware in precise mode: what the pods say they hold */
    uint32_t *kv_gpu;          /* scratch for one decision: blocks matched on a pod's GPU */
    pcr_ttft_t *ttft;          /* per backend: its time to first token, learned */
    uint64_t *cap_conf;        /* per backend: capacity in blocks as configured or scraped */
    uint64_t *cap_eff;         /* ... and as feedback corrected it (PCR_INDEX_UNLIMITED: none) */
    double *served;            /* per backend: requests committed, older ones weighing less */
    double served_unit;        /* what the next commit adds (see pcr_policy_commit) */
    uint64_t commits;          /* pcr_policy_commit calls so far, up to PCR_SHARE_WINDOW */
    size_t max_blocks;
    uint64_t rotation;         /* round_robin position, least_loaded tie rotation */
    uint64_t rng;              /* random: xorshift64 state, from PCR_RANDOM_SEED at creation */
    size_t ndown;              /* backends with down_since set */
    /* Scratch for one decision (a policy is used by one thread). */
    uint32_t *matched;
    uint64_t *load;
    unsigned char *usable;
    double *over_share;        /* per backend: how far its share of recent requests is over its
                                * fair one, 1 at the share bound (lb_cache.c) */
    double pool_work;          /* this decision's usable backends' load, tokens (lb_cache.c) */
    size_t pool_usable;        /* ... and how many they are */
    double *rate;              /* per backend: its learned rate as the cost uses it (see
                                * pcr_policy_observe), us per token */
    double *speed;             /* per backend: the pool's median rate / rate: its weight in
                                * the bounds, 1 for a pod like the others */
    double *sorted;            /* scratch for the median */
    uint64_t observed;         /* pcr_policy_observe calls so far */
    uint64_t *observed_at;     /* per backend: the count at its last observation */
    uint64_t (*clock_ns)(void); /* times the decision's phases when set (pcr_policy_set_clock) */
    uint64_t decide_t0;         /* with it: its reading as the decision began (pcr_policy_decide) */
    /* Precise mode's unknown tails (pcr_policy_prefix_use): how many came; the last
     * PCR_PROBE_RUN reports (pcr_policy_prefix_probed), a bit each (1: paid), the next to
     * replace, and how many of them paid. */
    uint64_t tails, tails_start;     /* ... and the count when the start's waits began */
    size_t nshared, nprivate;        /* backends reported shared, private */
    uint64_t probe_bits[PCR_PROBE_RUN / 64];
    uint32_t probe_pos, probe_paid;
};

extern const pcr_lb_ops_t pcr_lb_round_robin;
extern const pcr_lb_ops_t pcr_lb_least_loaded;
extern const pcr_lb_ops_t pcr_lb_random;

/* random's first state: every policy draws the same sequence, so runs repeat. */
#define PCR_RANDOM_SEED 0x9e3779b97f4a7c15ull
extern const pcr_lb_ops_t pcr_lb_consistent_hash;
extern const pcr_lb_ops_t pcr_lb_cache_aware;

/* Learned prefill rates within PCR_RATE_BAND of the pool's median count as the median: a busy
 * pod's rate wanders that much with the waiting no token count explains, and the cost would
 * otherwise move all new work to whichever identical pod looks 10% faster this minute (the
 * load term, discounted at high load, cannot pull it back), which the share bound then spills,
 * at the price of hit rate. A pod really slower (another GPU, a larger model) is far out, and
 * only what it differs by beyond the band counts. */
#define PCR_RATE_BAND 0.35

/* The share of recent requests is counted over about this many commits (the first this many
 * all count in full, see pcr_policy_commit). */
#define PCR_SHARE_WINDOW 2048.0

/* The block consistent_hash keys on (see PCR_HASH_PREFIX_BYTES). */
uint64_t pcr_policy_ring_key(const pcr_policy_t *p, const pcr_key_t *key);

/* Fewest in-flight among usable backends, ties by rotation; shared by least_loaded and by
 * every policy asked to place a request without a key. */
int pcr_policy_least_inflight(pcr_policy_t *p, const pcr_backend_load_t *loads);

/* The ring with bounded loads on in-flight requests over usable backends (p->usable may be
 * narrowed by the caller first; it is filled from loads when `fill` is set). */
int pcr_policy_ring_place(pcr_policy_t *p, uint64_t ring_key, const pcr_backend_load_t *loads,
                          int fill);

#endif
