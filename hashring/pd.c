/* hashring/pd.c: prefill/decode disaggregation, the decision (include/pcr/pd.h). Two
 * cache-aware decisions over the same policy, each over the pods of one role (the others
 * marked unusable in a copy of the loads), and the comparison of their costs in the time the
 * policy learned (pcr_policy_estimate_ttft): each side's expected first token, and on the
 * local side the stall its prefill inflicts on the decode pod's running streams. */
#include <string.h>

#include "pcr/pd.h"

void pcr_pd_opts_default(pcr_pd_opts_t *o)
{
    o->mode = PCR_PD_AUTO;
    o->min_uncached_tokens = 512;
    o->max_ttft_ratio = 1.5;
    o->transfer_us_per_token = 5;
    o->itl_weight = 0; /* off: docs/BENCHMARKS.md, the weights measured */
}

const char *pcr_pd_outcome_name(pcr_pd_outcome_t o)
{
    static const char *const names[PCR_PD__COUNT] = {
        [PCR_PD_REMOTE] = "remote_prefill",   [PCR_PD_LOCAL_CACHED] = "local_cached",
        [PCR_PD_LOCAL_BUSY] = "local_busy",   [PCR_PD_LOCAL_MODE] = "local_mode",
        [PCR_PD_FALLBACK] = "fallback",
    };
    return (unsigned)o < PCR_PD__COUNT ? names[o] : "unknown";
}

/* `loads` into `out`, usable only where the pod has the role asked (prefill pods, or those
 * that decode); 1 if any is usable. */
static int only(const pcr_backend_load_t *loads, const unsigned char *roles, size_t n,
                int prefill, pcr_backend_load_t *out)
{
    int any = 0;
    for (size_t b = 0; b < n; b++) {
        out[b] = loads[b];
        int fits = prefill ? roles[b] == PCR_ROLE_PREFILL : roles[b] != PCR_ROLE_PREFILL;
        if (!fits)
            out[b].usable = 0;
        any |= out[b].usable != 0;
    }
    return any;
}

int pcr_pd_decide(pcr_policy_t *p, const pcr_pd_opts_t *o, const pcr_key_t *key,
                  const pcr_backend_load_t *loads, const unsigned char *roles,
                  pcr_backend_load_t *scratch, size_t n, uint64_t now, pcr_pd_decision_t *out)
{
    if (out == NULL)
        return PCR_ERR_INVAL;
    memset(out, 0, sizeof(*out));
    out->decode.backend = out->prefill.backend = -1;
    if (p == NULL || o == NULL || loads == NULL || roles == NULL || scratch == NULL ||
        n < pcr_policy_backend_slots(p))
        return PCR_ERR_INVAL;
    only(loads, roles, n, 0, scratch);
    int rc = pcr_policy_decide(p, key, scratch, now, &out->decode);
    if (rc != 0)
        return rc;
    if (o->mode == PCR_PD_NEVER) {
        out->outcome = PCR_PD_LOCAL_MODE;
        return 0;
    }
    if (!only(loads, roles, n, 1, scratch)) {
        out->outcome = PCR_PD_FALLBACK;
        return 0;
    }
    if (o->mode == PCR_PD_AUTO && out->decode.uncached_prefill < o->min_uncached_tokens) {
        out->outcome = PCR_PD_LOCAL_CACHED;
        return 0;
    }
    if (pcr_policy_decide(p, key, scratch, now, &out->prefill) != 0) {
        out->prefill.backend = -1;
        out->outcome = PCR_PD_FALLBACK;
        return 0;
    }
    if (o->mode == PCR_PD_AUTO) {
        int d = out->decode.backend, f = out->prefill.backend;
        out->local_us = pcr_policy_estimate_ttft(
            p, d, loads[d].queued_prefill + out->decode.uncached_prefill);
        /* The decode leg then waits behind what the decode pod's engine has queued (its
         * scheduler is first come, first served), but not behind what the router holds for
         * it: a decode leg prefills nothing, so it is never held (routing.hold_tokens). */
        uint64_t engine_q = loads[d].sent_prefill < loads[d].queued_prefill
                                ? loads[d].sent_prefill : loads[d].queued_prefill;
        double decode_wait = pcr_policy_estimate_ttft(p, d, engine_q) -
                             pcr_policy_estimate_ttft(p, d, 0);
        out->remote_us = pcr_policy_estimate_ttft(
                             p, f, loads[f].queued_prefill + out->prefill.uncached_prefill) +
                         o->transfer_us_per_token * (double)out->decode.uncached_prefill +
                         (decode_wait > 0 ? decode_wait : 0);
        /* A local prefill holds every stream the decode pod is running for as long as it
         * takes (each engine step carries its chunks beside their next tokens): that many
         * streams, each stalled by that time, are what a remote prefill spares them. The
         * pod's own count sees other routers' streams, the router's is fresher. */
        double stall = out->local_us - pcr_policy_estimate_ttft(p, d, loads[d].queued_prefill);
        uint32_t streams = loads[d].inflight > loads[d].pod_running ? loads[d].inflight
                                                                     : loads[d].pod_running;
        out->stall_us = stall > 0 ? stall : 0;
        out->itl_us = (double)streams * out->stall_us;
        if (out->remote_us > o->max_ttft_ratio * out->local_us + o->itl_weight * out->itl_us) {
            out->prefill.backend = -1;
            out->outcome = PCR_PD_LOCAL_BUSY;
            return 0;
        }
    }
    out->outcome = PCR_PD_REMOTE;
    return 0;
}
