/* pcr/policy.h: the routing decision, the one call the router makes per request.
 *
 * The router (router/) never decides where a request goes: it builds the canonical prompt
 * bytes, asks pcr_policy_decide() with the live load of every backend, sends the request
 * where it is told, and reports back with pcr_policy_commit()/pcr_policy_forget(). Everything
 * here is pure: no I/O, no clock (the caller passes `now`), deterministic for equal inputs.
 *
 * Backends are named by their position (0..n-1) in the array given to pcr_policy_new(); the
 * router keeps the same order. This header names no libevent, nghttp2 or router type. */
#ifndef PCR_POLICY_H
#define PCR_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/common.h"
#include "pcr/kvtable.h"

typedef enum {
    PCR_POLICY_ROUND_ROBIN = 0,
    PCR_POLICY_LEAST_LOADED,
    PCR_POLICY_CONSISTENT_HASH,
    PCR_POLICY_CACHE_AWARE,
    PCR_POLICY_RANDOM,          /* a Kubernetes Service: kube-proxy's iptables mode */
} pcr_policy_kind_t;

/* "round_robin" | "least_loaded" | "consistent_hash" | "cache_aware" | "random" -> kind; 0 or
 * PCR_ERR_INVAL. */
int pcr_policy_kind_parse(const char *name, pcr_policy_kind_t *out);
const char *pcr_policy_kind_name(pcr_policy_kind_t kind);

typedef enum {
    PCR_REASON_WARM = 0,        /* cache_aware: the chosen backend holds a prefix of the prompt */
    PCR_REASON_COLD,            /* no backend holds any block: the ring placed it */
    PCR_REASON_OVERLOAD_SPILL,  /* the warmest backend was over the bounded-load limit */
    PCR_REASON_ZONE_SPILL,      /* chosen outside the router's zone */
    PCR_REASON_ROUND_ROBIN,
    PCR_REASON_LEAST_LOADED,
    PCR_REASON_HASH,            /* consistent_hash placement */
    PCR_REASON_NO_BACKEND,      /* no usable backend: the decision's backend is -1 */
    PCR_REASON_RANDOM,          /* random: drawn uniformly among the usable backends */
    PCR_REASON__COUNT
} pcr_reason_t;

const char *pcr_reason_name(pcr_reason_t reason);  /* "warm", "cold", "overload_spill", ... */

typedef struct {
    const char *name;          /* stable identity: places the backend on the ring */
    const char *zone;          /* "" or NULL when none */
    uint32_t weight;           /* >= 1 */
    uint64_t capacity_blocks;  /* how many prefix blocks the index may believe it holds; 0 = unknown, no limit */
} pcr_backend_desc_t;

typedef struct {
    pcr_policy_kind_t kind;
    size_t block_bytes;        /* default 256 */
    size_t max_prefix_bytes;   /* default 1048576 */
    size_t index_max_bytes;    /* hard cap on the radix index's memory, default 256 MiB */
    double load_factor;        /* bounded-load c of the ring (consistent_hash, and where
                                * cache_aware places a prefix nobody holds), default 1.25 */
    double inflight_factor;    /* cache_aware: a backend with more than this times its fair
                                * share of the requests in flight (4 at least) is passed over
                                * while another is under, default 3 */
    double load_weight;        /* the weight of a backend's queued work against a request's
                                * uncached prefill on an idle pool, default 1 (the honest time
                                * to first token) */
    double load_scale;         /* ... divided by (1 + the other backends' mean queued work /
                                * this many tokens): the busier they are, the dearer new
                                * prefill work is against waiting; default 1024 (0: fixed) */
    double share_factor;       /* cache_aware: a backend whose share of the recent requests
                                * (pcr_policy_commit) is over this times its fair share (8
                                * requests more at least) is passed over while another is
                                * under, default 1.1; 0 = no such bound */
    double share_margin;       /* requests the share bound (share_factor's, not the 8 of slack)
                                * keeps in hand for decisions made at the same moment on other
                                * replicas of this policy, which it has not seen yet (the
                                * router sets its workers - 1); default 0 */
    double share_penalty;      /* cache_aware: tokens of cost a backend at the share bound is
                                * charged, in proportion to how far its share is over its fair
                                * one, while the pool is idle (fading as load_weight does):
                                * requests any warm pod serves as well are steered off a pod
                                * nearing the bound, so that the ones only it holds warm need
                                * not spill; default 2048, 0 = none */
    double share_exempt_tokens;/* cache_aware: a request with at least this many tokens of
                                * uncached prefill at its warmest backend is not held to the
                                * share bound (the in-flight bound stands): it moves a share by
                                * one request, but sent where the bound leaves room, behind the
                                * longest queues, it waits seconds and delays all queued after
                                * it; default 16384, 0 = none */
    double share_reserve;      /* cache_aware: a backend this far from its fair share to the
                                * share bound (0..1; 1 at the bound) takes only requests it
                                * saves at least share_reserve_tokens of prefill over every
                                * other backend, or half their prompt, while another is under
                                * both bounds: its last requests under the bound are kept for
                                * those that would lose the most by spilling; default 0.8,
                                * 0 = none */
    double share_reserve_tokens; /* cache_aware: the prefill, in tokens, a backend past
                                  * share_reserve must save a request over every other
                                  * backend to take it (or half its prompt); default 4096,
                                  * 0 = none */
    double zone_penalty;       /* in tokens (4 bytes of canonical prompt = 1 token), default 2048 */
    const char *zone;          /* the router's own zone, "" or NULL when none */
    unsigned vnodes;           /* ring points per unit of weight, default 160 */
    /* How long a backend reported unavailable keeps its entries, in the unit of `now` (the
     * router passes microseconds): default 300 s. A pod unreachable for a while still holds
     * its KV cache; only a restart empties it (PCR_BACKEND_RESTARTED). */
    uint64_t unavailable_keep;
    /* Precise mode (routing.index "events"): cache_aware also keeps what each pod says it
     * holds (pcr/kvtable.h, fed by pcr_policy_kv_*), and a key that carries the prompt's
     * token chains (pcr_policy_key_tokens) is matched there, exactly. A key without them
     * (the pod's tokenizer did not answer in time) is matched in the approximate index, which
     * goes on learning from every commit. The index_max_bytes bound is shared: a quarter for
     * the approximate index, the rest for the pods' table. */
    int index_events;          /* 0: the approximate index only (default) */
    uint32_t kv_block_tokens;  /* tokens per block of the pods' caches (vLLM's --block-size),
                                * default 16 */
    uint64_t kv_speculative_ttl; /* how long a block counts as held after a request was sent
                                  * with it, until the pod's event confirms it, in `now` units;
                                  * default 2 s (2000000 us) */
    /* What cache_aware assumes of a pod before pcr_policy_observe has taught it better
     * (include/pcr/ttft.h): time to first token = overhead + per_token * prefill tokens.
     * The in-flight bound's fair shares are weighted by weight and by the speed learned; the
     * share bound's by configured weight alone (hashring/lb_cache.c says why). */
    double prefill_us_per_token; /* default 70 (about 14k tokens/s) */
    double ttft_overhead_us;   /* default 20000 */
} pcr_policy_opts_t;

/* Fills `opts` with the defaults above (kind = cache_aware). */
void pcr_policy_opts_default(pcr_policy_opts_t *opts);

/* The live state of one backend at decision time, as the router counts it. */
typedef struct {
    int usable;                /* healthy and serves the request's model; 0 = never chosen */
    uint32_t inflight;         /* requests sent and not finished */
    uint64_t queued_prefill;   /* uncached prefill tokens of those in-flight requests */
    uint64_t sent_prefill;     /* the part of them sent to the pod (the rest is held in the
                                * router, routing.hold_tokens): what its engine has queued */
    uint32_t pod_waiting;      /* vllm:num_requests_waiting as the pod last reported (0 if unknown) */
    uint32_t pod_running;      /* vllm:num_requests_running as the pod last reported (0 if unknown) */
} pcr_backend_load_t;

typedef struct pcr_policy pcr_policy_t;

/* Creates a policy over `n` backends (0 is allowed: they join later, pcr_policy_backend_set).
 * Copies what it needs from `opts` and `backends`. Returns NULL when out of memory or when an
 * argument is invalid. */
pcr_policy_t *pcr_policy_new(const pcr_policy_opts_t *opts, const pcr_backend_desc_t *backends,
                             size_t n);
void pcr_policy_free(pcr_policy_t *p);  /* NULL is a no-op */

/* A new policy under `opts` (whose keys may mean something else: another kind, block_bytes or
 * max_prefix_bytes, pcr_policy_tune) with `old`'s backends in the same slots: names, zones,
 * weights, configured capacities and unavailability. It knows nothing of their caches. `old`
 * is left as it was. NULL when out of memory or `opts` is invalid. */
pcr_policy_t *pcr_policy_renew(const pcr_policy_t *old, const pcr_policy_opts_t *opts);

/* The prefix key of one request: its canonical prompt bytes, hashed into chained blocks. */
typedef struct {
    uint64_t *blocks;          /* chained block hashes; blocks[i] names the prefix 0..i */
    size_t nblocks;
    size_t prompt_tokens;      /* canonical prompt bytes / 4, rounded up (all of it, not only
                                * hashed); the exact count when tblocks are there */
    /* Precise mode: the chains of the prompt's whole token blocks, when the router has its
     * tokens (pcr_policy_key_tokens); NULL and 0 otherwise. */
    uint64_t *tblocks;
    size_t ntblocks;
} pcr_key_t;

/* Hashes the canonical prompt `bytes` with `model` mixed in (pcr/prefix.h) into `key->blocks`,
 * which must have room for pcr_policy_max_blocks(p) entries. Returns 0. A request whose body
 * is read as it arrives gets the same key from router/body/body.h's reader, which also mixes in a
 * chat request's tools. */
int pcr_policy_key(const pcr_policy_t *p, const char *model, size_t model_len, const void *bytes,
                   size_t len, pcr_key_t *key);
size_t pcr_policy_max_blocks(const pcr_policy_t *p);

/* Precise mode: the chains of `tokens` (pcr_kvtable_key, with `seed`: 0 for the base model)
 * into key->tblocks, which has room for pcr_policy_ntblocks(p, ntokens) (one a whole block of
 * kv_block_tokens, at most pcr_policy_max_tblocks(p)), and their exact count into
 * key->prompt_tokens. Tokens past max_prefix_bytes / 4 are not chained. Returns 0, or
 * PCR_ERR_INVAL when the policy is not in precise mode. */
int pcr_policy_key_tokens(const pcr_policy_t *p, uint64_t seed, const uint32_t *tokens,
                          size_t ntokens, pcr_key_t *key);
size_t pcr_policy_ntblocks(const pcr_policy_t *p, size_t ntokens);
size_t pcr_policy_max_tblocks(const pcr_policy_t *p);
/* The tokens a chain covers (kv_block_tokens, which a reload may change); 0 for NULL. */
uint32_t pcr_policy_kv_block_tokens(const pcr_policy_t *p);

/* Precise mode, a prompt whose first `n` text blocks the router has tokens for (those of an
 * earlier prompt that began the same, in key->tblocks): what its decision may go on now. */
typedef enum {
    /* The prompt's own tokens, worth the wait: a backend was sent more of the text (below) but
     * no longer holds all of key->tblocks, so it may have evicted the rest too, or others
     * hold them too. */
    PCR_PREFIX_WAIT = 0,
    /* key->tblocks: the prompt's own tokens would show nothing more. */
    PCR_PREFIX_TOKENS,
    /* The text key alone (the approximate index): a backend was sent more than n + 1 of key's
     * text blocks (the approximate index learns every commit: say a conversation's previous
     * turn, whose tokens the router never had; the one block of slack is the earlier prompt's
     * last, which may have been whole), and it alone holds all of key->tblocks. */
    PCR_PREFIX_TEXT,
    /* The prompt's own tokens, as a probe of an unknown tail: two backends or more hold all
     * of key->tblocks (a shared system prompt, say) and none was sent more of the text. Only
     * what this router never sent (another replica's conversation, or what its own index
     * let go) can be beyond them. Such waits are taken while one of the last 128 reports
     * paid (pcr_policy_prefix_probed); else, where the pods are shared or not known to serve
     * this router alone (PCR_BACKEND_SHARED), for the first 128 and then one in 16; else
     * PCR_PREFIX_UNPROBED. */
    PCR_PREFIX_PROBE,
    /* key->tblocks, as PCR_PREFIX_TOKENS: an unknown tail not waited for. The caller checks
     * it all the same once it has the prompt's own tokens, in the background, and reports. */
    PCR_PREFIX_UNPROBED,
} pcr_prefix_use_t;
pcr_prefix_use_t pcr_policy_prefix_use(pcr_policy_t *p, const pcr_key_t *key, size_t n);

/* After a PCR_PREFIX_PROBE wait, or the background tokenization of a PCR_PREFIX_UNPROBED
 * tail: key with the prompt's own token chains (and its text blocks), `known` the chains it
 * had before. Returns whether it paid: a backend holds more than a text block's worth of token
 * blocks past `known`, one this router did not send the whole prompt (by its text index: a
 * tail that went is held where it went). Counted for pcr_policy_prefix_use's next answers. */
int pcr_policy_prefix_probed(pcr_policy_t *p, const pcr_key_t *key, size_t known);

/* Precise mode: what a pod said, applied to this replica (as pcr_kvtable_stored, _removed,
 * _clear; PCR_ERR_INVAL, or nothing, when the policy keeps no pods' table). */
int pcr_policy_kv_stored(pcr_policy_t *p, int backend, const pcr_kvt_stored_t *ev, uint64_t now);
size_t pcr_policy_kv_removed(pcr_policy_t *p, int backend, const uint64_t *hashes, size_t n,
                             pcr_kvt_medium_t medium);
void pcr_policy_kv_clear(pcr_policy_t *p, int backend);
/* The pods' table, for its counts (NULL when not in precise mode). */
const pcr_kvtable_t *pcr_policy_kvtable(const pcr_policy_t *p);

typedef struct {
    int backend;               /* 0..n-1, or -1 when no backend is usable */
    pcr_reason_t reason;
    uint32_t matched_blocks;   /* leading blocks of the key the chosen backend holds */
    uint32_t total_blocks;     /* key->nblocks */
    uint64_t uncached_prefill; /* tokens the chosen backend will have to prefill */
    uint64_t matched_time;     /* when the index saw the chosen backend last use its deepest
                                * matched block (a `now` passed in before); 0 when none */
    int precise;               /* matched on the key's token chains, in the pods' table:
                                * matched_blocks and total_blocks count token blocks */
    /* With a clock (pcr_policy_set_clock), the decision's time in its two phases, ns: the
     * index match (cache_aware only), and the rest (costs, bounded loads, the ring). 0 without. */
    uint64_t match_ns, cost_ns;
    uint64_t done_ns;          /* with a clock: its last reading, as the decision returned */
} pcr_decision_t;

/* Chooses a backend for `key` given `loads[n]`. `key` may be NULL (a request with no prompt,
 * e.g. an embeddings call): then the policy balances load only. Same inputs, same decision.
 * Returns 0, or PCR_ERR_UNAVAIL when no backend is usable (out->backend = -1). */
int pcr_policy_decide(pcr_policy_t *p, const pcr_key_t *key, const pcr_backend_load_t *loads,
                      uint64_t now, pcr_decision_t *out);

/* Records that the request was sent to `backend` (its share of the recent requests, for
 * share_factor) and that `backend` now holds the prefix `key` (so a burst of siblings lands
 * together). `key` may be NULL (a request without a prompt). Sets *added_from to the first block the backend did not
 * hold before (key->nblocks if it held all), for pcr_policy_forget(). Returns 0 or PCR_ERR_NOMEM
 * (the index stays valid). No-op for policies that keep no index. */
int pcr_policy_commit(pcr_policy_t *p, int backend, const pcr_key_t *key, uint64_t now,
                      uint32_t *added_from);

/* Undoes a speculative commit when the backend failed the request: drops blocks
 * [added_from, key->nblocks) of `key` for `backend`. */
void pcr_policy_forget(pcr_policy_t *p, int backend, const pcr_key_t *key, uint32_t added_from);

/* Membership. Backends live in numbered slots; the router hands out slot numbers and must pass
 * usable = 0 for a slot that holds no backend. Both calls are deterministic, so replicas given
 * the same calls agree on slots, ring and index.
 * - pcr_policy_backend_set: slot `id` (any below PCR_INDEX_MAX_BACKENDS; slots up to it that
 *   did not exist are made empty) now holds the backend `desc` (copied). Gaps are allowed
 *   because the router's slots keep their numbers when a backend leaves, and a fresh policy
 *   (a reload that changes the keys) is refilled from those numbers. The same name keeps its entries (a change of weight, zone or
 *   capacity); another name starts empty. The ring is rebuilt: about 1/n of the keys move.
 * - pcr_policy_backend_remove: slot `id` is empty: its entries are dropped, it leaves the ring.
 * 0, PCR_ERR_INVAL or PCR_ERR_NOMEM (then nothing changed). */
int pcr_policy_backend_set(pcr_policy_t *p, int id, const pcr_backend_desc_t *desc);
int pcr_policy_backend_remove(pcr_policy_t *p, int id);
size_t pcr_policy_backend_slots(const pcr_policy_t *p);

/* A reload: applies every option in place but the kind, block_bytes and max_prefix_bytes;
 * PCR_ERR_INVAL when `opts` is invalid or changes one of those three (the keys and the index
 * would mean something else, so the caller makes a new policy). A new prefill prior keeps what
 * was observed. */
int pcr_policy_tune(pcr_policy_t *p, const pcr_policy_opts_t *opts);

/* Drops every entry of a backend. */
void pcr_policy_backend_reset(pcr_policy_t *p, int backend);

/* What the router saw of a backend, and what it means for its entries (decided here, not in
 * the router): UNAVAILABLE (down, ejected) keeps them for opts.unavailable_keep from `now`,
 * then drops them; AVAILABLE again keeps them; RESTARTED (the pod's counters went back, its
 * start time or cache geometry changed) drops them at once: its cache is empty. In events
 * mode it drops the approximate entries and the speculative ones only: the pod's own events
 * report its restart (AllBlocksCleared, a sequence from 0), and the blocks it published since
 * are true, however late the scrape notices. */
typedef enum {
    PCR_BACKEND_AVAILABLE = 0,
    PCR_BACKEND_UNAVAILABLE,
    PCR_BACKEND_RESTARTED,
    /* The pod serves others too (another replica of the router, a client that calls it
     * directly: it counts more requests than this router sent it), or only this router. Until
     * every pod is known to be private, unknown tails are waited for at first
     * (PCR_PREFIX_PROBE); in a pool this router alone uses, only what its own text index let
     * go can lie beyond them, and they wait only after a check found some. */
    PCR_BACKEND_SHARED,
    PCR_BACKEND_PRIVATE,
} pcr_backend_state_t;
int pcr_policy_backend_state(pcr_policy_t *p, int backend, pcr_backend_state_t state,
                             uint64_t now);

/* A clock in ns (the caller's, say CLOCK_MONOTONIC) the policy reads only to time its own
 * phases into pcr_decision_t (match_ns, cost_ns); NULL (the default) times nothing. The library
 * never reads a clock of its own: time is passed in. */
void pcr_policy_set_clock(pcr_policy_t *p, uint64_t (*clock_ns)(void));

/* Updates a backend's capacity in blocks (0 = unknown, no limit), e.g. once its pod reports
 * vllm:cache_config_info; evicts its least recently used blocks down to it, and starts what
 * pcr_policy_feedback learns of it afresh from there. 0 or PCR_ERR_INVAL. */
int pcr_policy_set_capacity(pcr_policy_t *p, int backend, uint64_t capacity_blocks);

/* The time to first byte of a request `backend` answered: `ttfb_us` from sending it to the
 * first byte of its answer that carries a token (a stream's first event), for the decision's
 * `uncached_tokens` (uncached_prefill) behind `queued_ahead` tokens: the uncached prefill the
 * backend had been sent and had not finished when this request went to it (not what the
 * decision saw queued, which may hold requests still waiting in the router). cache_aware
 * learns each backend's prefill rate from these (include/pcr/ttft.h); other policies ignore
 * them.
 * Deterministic. 0, or PCR_ERR_INVAL for a backend out of range. */
int pcr_policy_observe(pcr_policy_t *p, int backend, uint64_t uncached_tokens,
                       uint64_t queued_ahead, uint64_t ttfb_us);

/* What cache_aware expects `backend` to take to a first token behind `tokens` of prefill, us. */
double pcr_policy_estimate_ttft(const pcr_policy_t *p, int backend, uint64_t tokens);

/* A backend's own account of a request it served (`d` as pcr_policy_decide gave it, for
 * `key`): it reused `delivered_tokens` of the prompt (vLLM's usage.prompt_tokens_details.
 * cached_tokens). Call it when the response ends. The index keeps the commit's record of the
 * prompt (its decision time); it does not stamp it again with the end of the request.
 * `settled_before`: every request committed to d->backend before this time (the clock of the
 * commits) had reached its first token, so its prompt was in the pod's cache, when this one was
 * sent; UINT64_MAX when all had.
 * - Delivered less than predicted (beyond the last block, which a pod always recomputes): the
 *   pod evicted a block the index believed it held, so it evicted everything it used before
 *   that block too; the index forgets those, and the backend's capacity in the index shrinks
 *   to what is left. Unless the block's last commit (d->matched_time) is at or after
 *   `settled_before`: the request that was to bring it may not have been prefilled yet (it
 *   was still in the pod's queue, or held), and the answer says nothing of evictions.
 * - Delivered more: the pod held blocks the index had let go; the capacity grows by as much.
 * - As predicted: the capacity grows back slowly toward the configured one.
 * Deterministic. 0, PCR_ERR_INVAL, or PCR_ERR_NOMEM (the index stays valid). No-op (0) for
 * policies that keep no index. */
int pcr_policy_feedback(pcr_policy_t *p, const pcr_key_t *key, const pcr_decision_t *d,
                        uint64_t delivered_tokens, uint64_t settled_before);

/* The capacity in blocks the index gives `backend` now: the configured one, as feedback has
 * corrected it (UINT64_MAX when none; 0 for policies that keep no index). */
uint64_t pcr_policy_backend_capacity(const pcr_policy_t *p, int backend);

typedef struct {
    size_t index_bytes;        /* memory the radix index holds */
    uint64_t index_nodes;
    uint64_t index_evictions;  /* (block, backend) pairs the index evicted (pcr_index_evictions) */
} pcr_policy_stats_t;

void pcr_policy_stats(const pcr_policy_t *p, pcr_policy_stats_t *out);
uint64_t pcr_policy_backend_blocks(const pcr_policy_t *p, int backend);  /* blocks it is believed to hold */

#endif
