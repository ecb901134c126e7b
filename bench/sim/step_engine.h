/* bench/sim/step_engine.h: a simulated pod that runs in engine steps, after vLLM v1's scheduler.
 *
 * Each step takes, in order: every running sequence's next tokens (one for a decode, the next
 * chunk for a prefill not yet done), then new sequences from the waiting queue in FIFO order,
 * all within a token budget (max_batched_tokens) and at most max_num_seqs running; with
 * long_prefill set, no sequence takes more than that many tokens in one step (vLLM's
 * long_prefill_token_threshold), so a long prompt's chunks leave room for others. A sequence
 * holds its prompt's named blocks from its admission and private blocks for the tokens it has
 * computed beyond them, one more each time its context crosses a block. When a running
 * sequence needs a block and none is free, the newest running sequence is preempted: it gives
 * back every block (they stay cached, evictable), goes to the head of the waiting queue and
 * recomputes its prompt and its output so far when admitted again (vLLM's recompute mode).
 * In a step where something was preempted, nobody new is admitted, as in vLLM.
 *
 * With priority scheduling (vLLM's --scheduling-policy priority; `priority` in the conf) each
 * sequence has a priority, lower served earlier, ties by arrival: the waiting queue is kept in
 * that order (a preempted sequence goes back into it by its own priority and arrival, not to
 * the head), and a running sequence that needs a block preempts the running sequence of the
 * worst priority, latest arrival (which may be itself), as vLLM v1 does. Beyond vLLM v1 (its
 * waiting requests never displace running ones; vLLM v0's _schedule_priority_preemption
 * did): a waiting sequence that cannot be admitted whole (the budget left in the step short
 * of its next chunk, max_num_seqs running, or no room in the cache) preempts running
 * sequences of a strictly worse priority, worst first, until it can; a sequence preempted
 * so gives back the step's tokens it was given, and in
 * that step only sequences better than every one preempted are admitted after it. A
 * preempted sequence keeps cached only the full prompt blocks it had computed.
 *
 * A step's time is base + prefill tokens * prefill_us_per_token + decode sequences *
 * decode_us_per_seq + context tokens read * ctx_us_per_token: a decode step is bound by
 * reading the weights (base) and each sequence's KV cache (context); prefill tokens are
 * compute. A sequence samples a token at the end of the step that computes its last
 * uncomputed token: its first token ends its prefill, the others are one decode each.
 *
 * vllm_sim (one timer per pod, on the wall clock divided by its time scale) and routing_offline
 * (an event per pod step, in virtual time) both drive this file, so the two agree.
 * Pure: no I/O, no clock. Ownership: the caller owns every sim_step_seq_t (embedded in its own
 * request) and the cache; sim_step_init / sim_step_dispose own the step's scratch array. */
#ifndef PCR_BENCH_STEP_ENGINE_H
#define PCR_BENCH_STEP_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"

typedef struct {
    unsigned max_num_seqs;         /* running sequences at most (--max-num-seqs) */
    unsigned max_batched_tokens;   /* tokens per step at most (--max-num-batched-tokens) */
    double base_us;                /* a step's fixed time: weights read, launch (--step-base-ms) */
    double prefill_us_per_token;   /* per prefill token (--prefill-us-per-token) */
    double decode_us_per_seq;      /* per decoding sequence (--step-seq-us) */
    double ctx_us_per_token;       /* per context token a scheduled sequence reads
                                    * (--step-kv-ns-per-token / 1000) */
    int priority;                  /* --scheduling-policy priority (0: fcfs) */
    unsigned long_prefill;         /* a sequence computes at most this many tokens a step
                                    * (--long-prefill-token-threshold; 0: no limit) */
} sim_step_conf_t;

/* Llama-3.1-8B in BF16 on one H100 SXM (docs/BENCH_ENGINE.md says where each comes from). */
#define SIM_STEP_DEFAULTS {256, 8192, 7400.0, 70.0, 30.0, 0.039, 0, 0}

enum { SIM_SEQ_NEW, SIM_SEQ_WAITING, SIM_SEQ_RUNNING, SIM_SEQ_FINISHED };

typedef struct sim_step_seq sim_step_seq_t;
struct sim_step_seq {
    /* The caller's, set before sim_step_add and left alone after. */
    const uint64_t *hashes;        /* the prompt's full blocks, chained (kvcache.h) */
    size_t nblocks;
    size_t prompt_tokens, max_tokens;   /* max_tokens >= 1 */
    int priority;                  /* lower first (priority scheduling only) */
    void *owner;
    /* The engine's; the caller reads them. */
    int state;
    size_t computed;               /* tokens whose KV is computed (prompt, then output) */
    size_t generated;              /* output tokens sampled */
    size_t hit_tokens;             /* served from the cache at its first admission */
    unsigned preemptions;
    /* The engine's alone. */
    sim_step_seq_t *prev, *next;
    size_t private_blocks;         /* held beyond the named prompt blocks */
    size_t scheduled;              /* tokens it computes in the current step */
    int admitted;                  /* it was admitted once (its hit is counted) */
    uint64_t arrival;              /* order of sim_step_add: ties of priority */
};

typedef struct {
    sim_step_seq_t *head, *tail;
    unsigned n;
} sim_step_list_t;

typedef struct {
    sim_step_conf_t c;
    pcr_kvcache_t *kv;
    sim_step_list_t waiting, running;
    sim_step_seq_t **batch;        /* the current step's sequences (NULL: left since) */
    unsigned nbatch;
    int in_step;                   /* from a sim_step_begin that composed a step to the end
                                    * of its sim_step_end: a new sequence waits for it */
    /* The current step's make-up, for tests and reports. */
    size_t step_prefill_tokens;
    unsigned step_decodes;
    /* Totals. */
    uint64_t steps, preemptions;
    uint64_t priority_preemptions; /* of them, made for a waiting sequence of better priority */
    uint64_t next_arrival;
    uint64_t prefix_queries, prefix_hits;   /* tokens, at first admissions */
} sim_step_t;

/* 0, or -1 when out of memory. */
int sim_step_init(sim_step_t *e, const sim_step_conf_t *c, pcr_kvcache_t *kv);
void sim_step_dispose(sim_step_t *e);

/* Can a sequence of this size ever run alone on this cache? */
int sim_step_fits(const sim_step_t *e, size_t nblocks, size_t prompt_tokens, size_t max_tokens);

/* Queues s (its fields above the line set): at the waiting tail, or with priority scheduling
 * after every waiting sequence of the same or a better priority. */
void sim_step_add(sim_step_t *e, sim_step_seq_t *s);

/* Takes s out wherever it is (the client left): gives back its blocks. s is the caller's
 * again; a finished sequence is already out. */
void sim_step_abort(sim_step_t *e, sim_step_seq_t *s);

/* Composes the next step: returns its time in microseconds of model time, or 0 when there is
 * nothing to run (nothing running, and the waiting head does not fit). */
double sim_step_begin(sim_step_t *e);

/* Ends the step that sim_step_begin composed: every sequence that sampled a token gets
 * emit(arg, s) with s->generated counting it; one that reached max_tokens is FINISHED, out of
 * the engine, its blocks given back, before its call. emit may abort or free only the sequence
 * it is given, and may add new ones. */
void sim_step_end(sim_step_t *e, void (*emit)(void *arg, sim_step_seq_t *s), void *arg);

#endif
