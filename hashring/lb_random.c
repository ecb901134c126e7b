/* hashring/lb_random.c: the random baseline, what a Kubernetes Service does in kube-proxy's
 * iptables mode (each new connection to one endpoint drawn uniformly). It keeps no index; the
 * draws come from a xorshift64* state in the policy, seeded with a constant, so the same
 * requests go to the same backends every run (the library reads no clock and no entropy). */
#include "policy_int.h"

static uint64_t draw(pcr_policy_t *p)
{
    p->rng ^= p->rng >> 12;
    p->rng ^= p->rng << 25;
    p->rng ^= p->rng >> 27;
    return p->rng * 0x2545f4914f6cdd1dull;
}

static void random_decide(pcr_policy_t *p, const pcr_key_t *key, const pcr_backend_load_t *loads,
                          uint64_t now, pcr_decision_t *out)
{
    (void)key;
    (void)now;
    size_t usable = 0;
    for (size_t b = 0; b < p->n; b++)
        usable += loads[b].usable != 0;
    if (usable == 0)
        return;
    /* The k-th usable backend: uniform among them, whichever are down. */
    size_t k = (size_t)((draw(p) >> 11) % usable);
    for (size_t b = 0; b < p->n; b++) {
        if (loads[b].usable && k-- == 0) {
            out->backend = (int)b;
            out->reason = PCR_REASON_RANDOM;
            return;
        }
    }
}

const pcr_lb_ops_t pcr_lb_random = {random_decide};
