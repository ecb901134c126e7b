/* bench/sim/sim_model.c: the admission rule of sim_model.h. */
#include "sim_model.h"

int sim_model_admit(const sim_model_t *m, pcr_kvcache_t *kv, const uint64_t *hashes,
                    size_t nblocks, size_t private_blocks, size_t prompt_tokens,
                    unsigned running, double now_us, double scale, double *busy_until_us,
                    sim_admit_t *out)
{
    size_t hit_blocks;
    int rc = pcr_kvcache_acquire(kv, hashes, nblocks, private_blocks, &hit_blocks);
    if (rc != 0)
        return rc;
    out->hit_tokens = pcr_kvcache_hit_tokens(hit_blocks, prompt_tokens);
    double start = *busy_until_us > now_us ? *busy_until_us : now_us;
    double per_tok = m->prefill_us_per_token * (1.0 + m->prefill_batch_slowdown * running);
    double end = start + (double)(prompt_tokens - out->hit_tokens) * per_tok / scale;
    *busy_until_us = end;
    out->first_token_us = end + m->overhead_ms * 1000.0 / scale;
    return 0;
}
