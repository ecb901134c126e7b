/* bench/sim/sim_model.h: the simulated pod's latency model and admission rule, pure.
 *
 * vllm_sim (sim_engine.c, on the wall clock, time-scaled) and routing_offline (offline.c, in
 * virtual time) both admit requests and time their tokens through these functions, so the
 * offline simulator's pods are the same pods the replayer talks to.
 *
 * Model time, in microseconds, is what a real pod would take; `scale` divides every duration
 * (vllm_sim passes its --time-scale, the offline simulator 1). No I/O, no clock. */
#ifndef PCR_BENCH_SIM_MODEL_H
#define PCR_BENCH_SIM_MODEL_H

#include <stddef.h>

#include "kvcache.h"

typedef struct {
    double prefill_us_per_token;  /* uncached prompt token, at batch 1 */
    double prefill_batch_slowdown;/* prefill slower by this much per running request */
    double overhead_ms;           /* scheduling + first decode step */
    double itl_ms;                /* decode step at batch 1 */
    double itl_per_seq_us;        /* added to a decode step per running request */
    unsigned max_num_seqs;        /* running requests at most */
} sim_model_t;

/* The flags' defaults: about 14k prefill tokens/s, an 8B model on one modern GPU. */
#define SIM_MODEL_DEFAULTS {70.0, 0.005, 15.0, 12.0, 60.0, 256}

/* Inter-token time while `running` requests decode. */
static inline double sim_model_itl_us(const sim_model_t *m, unsigned running, double scale)
{
    return (m->itl_ms * 1000.0 + m->itl_per_seq_us * running) / scale;
}

/* Blocks a request reserves besides its named prompt blocks: its partial last block and its
 * output. */
static inline size_t sim_model_private_blocks(size_t prompt_tokens, size_t nblocks,
                                              size_t max_tokens)
{
    return (prompt_tokens - nblocks * PCR_KV_BLOCK_TOKENS + max_tokens + PCR_KV_BLOCK_TOKENS -
            1) / PCR_KV_BLOCK_TOKENS;
}

/* One admission, as vLLM's scheduler would make it: the cache pins the prompt's blocks and
 * reserves its private ones, or refuses (nonzero return, nothing changed: the request keeps
 * waiting). On success the request's prefill runs after every prefill admitted before it
 * (*busy_until, advanced here) at a rate the `running` decodes slow down, and its first token
 * is due one overhead later. */
typedef struct {
    size_t hit_tokens;            /* served from the cache (what vLLM reports as cached) */
    double first_token_us;
} sim_admit_t;

int sim_model_admit(const sim_model_t *m, pcr_kvcache_t *kv, const uint64_t *hashes,
                    size_t nblocks, size_t private_blocks, size_t prompt_tokens,
                    unsigned running, double now_us, double scale, double *busy_until_us,
                    sim_admit_t *out);

#endif
