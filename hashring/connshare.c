/* hashring/connshare.c: the light clients' reserve of a pool's connections (pcr/connshare.h). */
#include <stddef.h>

#include "pcr/connshare.h"

unsigned pcr_light_reserve(unsigned max_connections, unsigned pct)
{
    if (pct > PCR_LIGHT_RESERVE_PCT_MAX)
        pct = PCR_LIGHT_RESERVE_PCT_MAX;
    return (unsigned)((unsigned long long)max_connections * pct / 100);
}

unsigned pcr_light_count(const pcr_light_client_t *c, uint64_t now_us)
{
    if (c == NULL)
        return 0;
    unsigned busy = c->busy < PCR_LIGHT_SLOW ? c->busy : PCR_LIGHT_SLOW - 1;
    if (c->blind)
        return busy + PCR_LIGHT_BLIND;
    int slow = c->slow_us != 0 && now_us >= c->slow_us &&
               now_us - c->slow_us < (uint64_t)PCR_LIGHT_KEEP_MS * 1000;
    return slow ? busy + PCR_LIGHT_SLOW : busy;
}

int pcr_light_needed(unsigned client_busy, unsigned pool_busy, unsigned max_connections,
                     unsigned reserve)
{
    if (client_busy >= reserve)
        return 0;
    return pool_busy >= max_connections || max_connections - pool_busy <= reserve;
}

int pcr_light_may_take(unsigned client_busy, unsigned pool_busy, unsigned max_connections,
                       unsigned reserve, int kept)
{
    if (pool_busy >= max_connections)
        return 0;
    if (max_connections - pool_busy > reserve)
        return 1;
    if (!kept && client_busy < PCR_LIGHT_BLIND)
        return 1;
    return client_busy < reserve;
}

int pcr_blind_may_take(unsigned blind, unsigned reserve)
{
    return reserve == 0 || blind < reserve;
}

int pcr_light_fresh(unsigned client_busy, unsigned idle, unsigned nconns,
                    unsigned max_connections, unsigned reserve)
{
    return client_busy >= PCR_LIGHT_SLOW && idle <= reserve && nconns < max_connections;
}
