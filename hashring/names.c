/* hashring/names.c: the names of policies and decision reasons, as they appear in the config
 * file and in /metrics labels. Kept apart so the config loader can use them alone. */
#include <string.h>

#include "pcr/policy.h"

static const char *const policy_names[] = {
    [PCR_POLICY_ROUND_ROBIN] = "round_robin",
    [PCR_POLICY_LEAST_LOADED] = "least_loaded",
    [PCR_POLICY_CONSISTENT_HASH] = "consistent_hash",
    [PCR_POLICY_CACHE_AWARE] = "cache_aware",
    [PCR_POLICY_RANDOM] = "random",
};

static const char *const reason_names[PCR_REASON__COUNT] = {
    [PCR_REASON_WARM] = "warm",
    [PCR_REASON_COLD] = "cold",
    [PCR_REASON_OVERLOAD_SPILL] = "overload_spill",
    [PCR_REASON_ZONE_SPILL] = "zone_spill",
    [PCR_REASON_ROUND_ROBIN] = "round_robin",
    [PCR_REASON_LEAST_LOADED] = "least_loaded",
    [PCR_REASON_HASH] = "hash",
    [PCR_REASON_NO_BACKEND] = "no_backend",
    [PCR_REASON_RANDOM] = "random",
};

int pcr_policy_kind_parse(const char *name, pcr_policy_kind_t *out)
{
    for (size_t i = 0; i < PCR_ARRAY_SIZE(policy_names); i++) {
        if (name != NULL && strcmp(name, policy_names[i]) == 0) {
            *out = (pcr_policy_kind_t)i;
            return 0;
        }
    }
    return PCR_ERR_INVAL;
}

const char *pcr_policy_kind_name(pcr_policy_kind_t kind)
{
    if ((size_t)kind >= PCR_ARRAY_SIZE(policy_names))
        return "unknown";
    return policy_names[kind];
}

const char *pcr_reason_name(pcr_reason_t reason)
{
    if ((unsigned)reason >= PCR_REASON__COUNT)
        return "unknown";
    return reason_names[reason];
}
