/* hashring/tenancy.c: rate limits (GCRA), the pool's saturation and a session's pod; see
 * include/pcr/tenancy.h. Pure: no I/O, no clock, no threads.
 *
 * An affinity word, 64 bits:
 *
 *   63            28 27      16 15            0
 *   +---------------+----------+---------------+
 *   | tag (36 bits) | backend  | seen (16 bits)|
 *   +---------------+----------+---------------+
 *
 * tag: the session hash's high bits (never 0, so an empty word matches nothing); backend: its
 * slot + 1 (12 bits, 0 = none); seen: the time in seconds, modulo 65536, compared modulo too
 * (a TTL is well under 18 hours). */
#include "pcr/tenancy.h"

int pcr_gcra_take(uint64_t tat, uint64_t now, uint64_t cost, uint64_t tolerance,
                  uint64_t *new_tat, uint64_t *retry_after)
{
    if (cost > tolerance)
        cost = tolerance;
    uint64_t from = tat > now ? tat : now;
    uint64_t next = from + cost;
    if (next - now <= tolerance) {
        *new_tat = next;
        return 1;
    }
    *retry_after = next - now - tolerance;
    return 0;
}

double pcr_saturation_pod(const pcr_sat_pod_t *p, const pcr_sat_opts_t *o)
{
    double level = 0;
    if (o->queue_threshold > 0 && p->waiting / o->queue_threshold > level)
        level = p->waiting / o->queue_threshold;
    if (o->kv_threshold > 0 && p->kv_usage >= 0 && p->kv_usage / o->kv_threshold > level)
        level = p->kv_usage / o->kv_threshold;
    if (o->inflight_threshold > 0 && p->inflight / o->inflight_threshold > level)
        level = p->inflight / o->inflight_threshold;
    if (o->prefill_threshold > 0 && (double)p->prefill / o->prefill_threshold > level)
        level = (double)p->prefill / o->prefill_threshold;
    return level;
}

double pcr_saturation(const pcr_sat_pod_t *pods, size_t n, const pcr_sat_opts_t *o)
{
    double least = -1;
    for (size_t i = 0; i < n; i++) {
        if (!pods[i].usable)
            continue;
        double l = pcr_saturation_pod(&pods[i], o);
        if (least < 0 || l < least)
            least = l;
    }
    if (least < 0)
        return 0;
    return least > 1 ? 1 : least;
}

uint64_t pcr_pod_preemptible(const int *prio, size_t n, int p)
{
    uint64_t set = 0;
    for (size_t i = 0; i < n && i < 64; i++)
        if (prio[i] > p)
            set |= 1ull << i;
    return set;
}

#define TAG_SHIFT 28
#define BACKEND_SHIFT 16

static uint64_t tag_of(uint64_t h)
{
    uint64_t t = h >> TAG_SHIFT;
    return t != 0 ? t : 1;
}

size_t pcr_affinity_set(uint64_t h, size_t nsets)
{
    return (size_t)(h & (nsets - 1)) * PCR_AFFINITY_WAYS;
}

uint64_t pcr_affinity_word(uint64_t h, int backend, uint64_t now_s)
{
    return tag_of(h) << TAG_SHIFT | ((uint64_t)(backend + 1) & 0xfff) << BACKEND_SHIFT |
           (now_s & 0xffff);
}

static uint64_t age_of(uint64_t word, uint64_t now_s)
{
    return (now_s - (word & 0xffff)) & 0xffff;
}

int pcr_affinity_backend(uint64_t word, uint64_t h, uint64_t now_s, uint64_t ttl_s)
{
    if (word == 0 || word >> TAG_SHIFT != tag_of(h) || age_of(word, now_s) > ttl_s)
        return -1;
    return (int)((word >> BACKEND_SHIFT) & 0xfff) - 1;
}

int pcr_affinity_victim(const uint64_t w[PCR_AFFINITY_WAYS], uint64_t h, uint64_t now_s,
                        uint64_t ttl_s)
{
    for (int i = 0; i < PCR_AFFINITY_WAYS; i++)
        if (w[i] != 0 && w[i] >> TAG_SHIFT == tag_of(h))
            return i;
    for (int i = 0; i < PCR_AFFINITY_WAYS; i++)
        if (w[i] == 0 || age_of(w[i], now_s) > ttl_s)
            return i;
    return age_of(w[0], now_s) >= age_of(w[1], now_s) ? 0 : 1;
}

int pcr_affinity_keep(uint32_t inflight, double mean_inflight, double factor, double pod_level)
{
    return pod_level < 1 && inflight <= factor * mean_inflight + 1;
}
