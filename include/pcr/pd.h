/* pcr/pd.h: prefill/decode disaggregation, the decision.
 *
 * A disaggregated fleet has prefill pods, decode pods and pods that do both. A request goes
 * to a decode pod, chosen with the cache-aware cost among the pods that decode (its cache
 * holds the prefixes pulled to it); then, per request, the router decides whether its prefill
 * runs on a prefill pod (whose KV blocks the decode pod pulls) or on the decode pod itself:
 *   - mode "never" (or no prefill pod usable): on the decode pod;
 *   - mode "always": on a prefill pod, chosen with the cache-aware cost among prefill pods;
 *   - mode "auto" (the default): on the decode pod when what it must prefill there is small
 *     (under min_uncached_tokens: a long prefill is what stalls the decode pod's streams, a
 *     short one costs them little), or when the prefill pods are busy enough that the first
 *     token would come more than max_ttft_ratio times later than prefilling locally (their
 *     queue, the prompt's own prefill there, the transfer of the blocks the decode pod
 *     pulls and the decode pod's engine queue (sent, not held), which the decode leg then
 *     waits behind, against
 *     that queue and the prefill on the decode pod, each in the time the policy learned), plus
 *     itl_weight times what the local prefill costs the decode pod's running streams (each
 *     stalled for the prefill's time: the inter-token latency the split is for); else on a
 *     prefill pod.
 * A fixed rule ("always past N tokens") can make the first token many times later when the
 * prefill pods queue; this one keeps the gain where there is one. Pure, as policy.h. */
#ifndef PCR_PD_H
#define PCR_PD_H

#include "pcr/policy.h"

typedef enum {
    PCR_ROLE_BOTH = 0,         /* prefills and decodes (today's pods) */
    PCR_ROLE_PREFILL,
    PCR_ROLE_DECODE,
} pcr_role_t;

typedef enum { PCR_PD_AUTO = 0, PCR_PD_ALWAYS, PCR_PD_NEVER } pcr_pd_mode_t;

typedef struct {
    pcr_pd_mode_t mode;
    uint64_t min_uncached_tokens; /* auto: smaller prefills stay on the decode pod; default 512 */
    double max_ttft_ratio;        /* auto: remote's expected first token at most this times
                                   * local's; default 1.5 */
    double transfer_us_per_token; /* pulling one token's KV blocks, us; default 5 (about
                                   * 128 KiB a token at 25 GB/s) */
    double itl_weight;            /* auto: a microsecond of one running stream's stall on the
                                   * decode pod against one of this request's first token
                                   * (0: first tokens alone); default 0.05 */
} pcr_pd_opts_t;

void pcr_pd_opts_default(pcr_pd_opts_t *o);

typedef enum {
    PCR_PD_REMOTE = 0,         /* prefill on d.prefill, decode on d.decode */
    PCR_PD_LOCAL_CACHED,       /* auto: little left to prefill on the decode pod */
    PCR_PD_LOCAL_BUSY,         /* auto: the prefill pods would make it slower */
    PCR_PD_LOCAL_MODE,         /* mode never */
    PCR_PD_FALLBACK,           /* no prefill pod usable */
    PCR_PD__COUNT
} pcr_pd_outcome_t;

const char *pcr_pd_outcome_name(pcr_pd_outcome_t o); /* "remote_prefill", "local_cached", ... */

typedef struct {
    pcr_pd_outcome_t outcome;
    pcr_decision_t decode;     /* the decode pod's decision (commit it, feed it back) */
    pcr_decision_t prefill;    /* the prefill pod's, when outcome is REMOTE (backend -1 else) */
    double local_us, remote_us;/* auto: the two expected first tokens compared (0 otherwise) */
    double stall_us;           /* auto: how long a local prefill would stall each of the
                                * decode pod's running streams (its prefill time there) */
    double itl_us;             /* auto: that, times those streams (max of the router's
                                * in-flight count and the pod's scraped running count) */
} pcr_pd_decision_t;

/* Decides for `key` given every backend's load and role (roles[n], n = the loads' count, as
 * for pcr_policy_decide). 0, or PCR_ERR_UNAVAIL when no pod that decodes is usable (then
 * out->decode.backend is -1), PCR_ERR_INVAL for bad arguments. Uses `loads` as given;
 * `scratch[n]` is the caller's room for a copy. */
int pcr_pd_decide(pcr_policy_t *p, const pcr_pd_opts_t *o, const pcr_key_t *key,
                  const pcr_backend_load_t *loads, const unsigned char *roles,
                  pcr_backend_load_t *scratch, size_t n, uint64_t now, pcr_pd_decision_t *out);

#endif
