/* hashring/lb_chash.c: the consistent_hash baseline, the bounded-load ring keyed on the
 * prompt's prefix (see PCR_HASH_PREFIX_BYTES for how deep). What is hashed is decided in
 * policy.c; where it lands is the ring's business. */
#include "policy_int.h"

static void ch_decide(pcr_policy_t *p, const pcr_key_t *key, const pcr_backend_load_t *loads,
                      uint64_t now, pcr_decision_t *out)
{
    (void)now;
    if (key == NULL || key->nblocks == 0) {
        out->backend = pcr_policy_least_inflight(p, loads);
        out->reason = PCR_REASON_LEAST_LOADED;
        return;
    }
    out->backend = pcr_policy_ring_place(p, pcr_policy_ring_key(p, key), loads, 1);
    out->reason = PCR_REASON_HASH;
}

const pcr_lb_ops_t pcr_lb_consistent_hash = {ch_decide};
