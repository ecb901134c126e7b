/* hashring/lb_cache.c: cache_aware, the default policy: the backend with the earliest
 * expected first token among those under two bounds.
 *
 * Work is counted in prompt tokens (4 bytes of canonical prompt = 1 token), then turned into
 * time by each backend's learned rate (include/pcr/ttft.h, fed by pcr_policy_observe; rates
 * within PCR_RATE_BAND (35%) of the pool's median count as the median, see policy_int.h):
 *
 *   cost(b) = overhead + rate(b) * (w(b) * load(b) + uncached(b) + zone_penalty(b) + share(b))
 *   uncached(b) = prompt_tokens - matched(b) * block_bytes / 4, at least 0 (0 when b holds all
 *                 the prompt the key covers)
 *   load(b) = queued_prefill(b)                       uncached prefill of its in-flight requests
 *           + INFLIGHT_TOKENS * inflight(b)           decode work each in-flight request adds
 *           + WAITING_TOKENS * pod_waiting(b)         requests queued at the pod, of unknown size
 *   w(b) = load_weight / (1 + mean load of the other usable backends / load_scale)
 *   share(b) = min(share_penalty * over(b) * w(b) / load_weight, SHARE_CAP * prompt_tokens)
 *   over(b) = how far b's share of the recent requests is over its fair share, 1 at the share
 *             bound below (0 under its fair share)
 *
 * With w = 1 the cost is the pod's expected time to first token: a pod prefills in arrival
 * order, so a request waits for the queued prefill and then does its own; that is the weight
 * while the other pods are idle. When they are busy, the prefill a request would make one of
 * them do (its uncached part, which a warm pod skips) delays every request queued there after
 * it, so new work costs more than waiting: w falls, and prefixes stay on their pods. A fixed
 * weight either lost hit rate past the knee or queued cold prompts behind each other on an
 * idle pool.
 *
 * Bounds: a backend with
 * inflight + 1 > max(BOUND_FLOOR, ceil(inflight_factor * (total_inflight + 1) * its share)), its
 * share weighted by its configured weight and its learned speed, or whose share of the recent
 * requests (pcr_policy_commit) is over share_factor times its fair share (by configured weight
 * alone) plus SHARE_SLACK requests, is passed over while any other is under both. The in-flight
 * bound stops a burst piling onto one warm pod faster than its queue shows; the share bound
 * stops a few hot prefixes (a system prompt, an agent's tool prompt) taking a pod's whole
 * share at light load, when nothing is in flight long enough for the first to act. The floor
 * is ours, not the paper's: at light traffic the pure bound is 1 (one request in flight
 * anywhere puts its pod over), which would turn a conversation's next turn away from its warm
 * pod although a vLLM pod batches hundreds of requests.
 *
 * The share bound is a cliff: whatever request comes when a pod is over it spills. share(b)
 * steers the requests that cost nothing to move (as warm elsewhere) off a pod as it nears the
 * bound, so that the ones only it holds warm seldom meet the cliff. It fades with w(b): on a
 * busy pool equal warmth rarely means equal cost.
 *
 * The share bound counts requests, not work, so the pods it leaves open are often those that
 * took long prompts whose prefill is still queued. A prompt with share_exempt_tokens or more
 * uncached at its warmest pod is not held to it: it adds one request to a share, and seconds
 * to a queue.
 *
 * Past the knee the share charge has faded, so pods reach the bound with requests any pod
 * would serve as well, and then a long prompt only one pod holds warm spills and is prefilled
 * again elsewhere. So a pod share_reserve of the way from its fair share to the bound keeps the
 * rest for requests it saves at least share_reserve_tokens of prefill over every other pod, or
 * half their prompt (RESERVE_SHARE, which keeps a short conversation's next turn on its pod).
 *
 * The share bound counts requests by configured weight only: a learned speed wanders past a
 * pool's knee, and a bound that followed it gave identical pods that looked faster more than
 * their share. A pod really slower is given less by its cost and its in-flight bound.
 *
 * Zones: when the router has one, its zone's backends are a tier. The share bound counts a
 * home backend's fair share among the zone's, not the pool's (which put half the requests
 * over the bound at light load and sent them across). Each tier's best is chosen by the cost
 * above; the other zone's wins only when its expected first token, behind its queued prefill
 * at full weight and with zone_penalty added, is earlier than the home one's (zone_better):
 * a saturated zone spills, an idle one keeps its traffic. Cold prompts likewise (place_cold).
 *
 * The figures behind each choice, and the defaults', are in docs/TUNING.md.
 *
 * When no backend holds a block of the prompt, the ring places it (see place_cold). Ties go to
 * the lowest mix of the prefix's ring key and the backend index, so equal inputs give equal
 * decisions while different prefixes spread. */
#include <math.h>
#include <string.h>

#include "policy_int.h"

/* One in-flight request costs its pod a decode slot in every step of the batch until it ends;
 * 256 tokens of prefill is about what that slows the pod over a typical request's life. */
#define INFLIGHT_TOKENS 256.0
/* A request waiting at the pod will prefill a prompt we did not see; count a typical 1k-token
 * prompt half cached. Requests pcrouter sent are also in queued_prefill: a little double
 * counting that errs toward spreading. */
#define WAITING_TOKENS 512.0

/* In-flight requests a backend may always have before the bounded-load limit applies. */
#define BOUND_FLOOR 4
/* Requests a backend may always be ahead of its fair share before share_factor applies. */
#define SHARE_SLACK 8.0
/* The share charge is at most this much of the request's own prompt, so that a pod holding
 * all of a short prompt still costs less than one holding none of it, other things equal: the
 * charge is there to move requests that are as warm elsewhere, and a 1k-token prompt only its
 * pod holds is not one of them (share_penalty is 2048 tokens). Below the share bound, such a
 * request stays. */
#define SHARE_CAP 0.75

/* A request whose warmest backend saves it at least this share of its prompt is not one the
 * share reserve moves, however short: most of its prefill is at stake (a conversation's next
 * turn, a system prompt's next user), as SHARE_CAP says of the charge. */
#define RESERVE_SHARE 0.5

/* Scratch states in p->usable. */
enum { NOT_USABLE = 0, OVER_BOUND = 1, UNDER_BOUND = 2, RESERVED = 3 };

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static double load_tokens(const pcr_backend_load_t *l)
{
    return (double)l->queued_prefill + INFLIGHT_TOKENS * l->inflight +
           WAITING_TOKENS * l->pod_waiting;
}

/* A prompt longer than max_prefix_bytes is hashed only that far. When a backend holds all of
 * that, it is most likely the same conversation or agent going on, whose earlier turns, the
 * rest of the prompt but its end, the pod holds too: count it cached rather than charge the
 * pod a prefill of everything past the horizon, which it will not do. */
static int precise(const pcr_policy_t *p, const pcr_key_t *key)
{
    return p->kvt != NULL && key->ntblocks > 0;
}

static uint64_t uncached_tokens(const pcr_policy_t *p, const pcr_key_t *key, uint32_t matched)
{
    if (precise(p, key)) {
        /* Token blocks, and the prompt's exact count: what is left is at least the part of
         * a block that no cache holds, but past the chained horizon as above. */
        uint64_t cached = (uint64_t)matched * p->o.kv_block_tokens;
        if (matched > 0 && matched >= key->ntblocks && key->ntblocks >= pcr_policy_max_tblocks(p))
            return 0;
        return cached >= key->prompt_tokens ? 0 : key->prompt_tokens - cached;
    }
    uint64_t cached = (uint64_t)matched * p->o.block_bytes / 4;
    if (matched > 0 && matched >= key->nblocks)
        return 0;
    return cached >= key->prompt_tokens ? 0 : key->prompt_tokens - cached;
}

/* The match: in the pods' own table when the key has token chains (a block held only on a
 * pod's CPU counts half: loading it back is cheaper than prefilling it, dearer than a GPU
 * hit), else in the approximate index. */
static void match(pcr_policy_t *p, const pcr_key_t *key)
{
    if (!precise(p, key)) {
        pcr_index_match(p->index, key->blocks, key->nblocks, p->matched);
        return;
    }
    pcr_kvtable_match(p->kvt, key->tblocks, key->ntblocks, p->kv_gpu, p->matched);
    for (size_t b = 0; b < p->n; b++)
        p->matched[b] = p->kv_gpu[b] + (p->matched[b] - p->kv_gpu[b]) / 2;
}

/* Marks every usable backend under both bounds (in flight, share of recent requests) or over
 * one, and returns whether any is under both; when none is (each bound spares a backend, not
 * always the same one), the callers consider every usable backend. Also notes the pool's load
 * for load_weight(). */
static int mark_bounds(pcr_policy_t *p, const pcr_backend_load_t *loads, int *any_in_zone,
                       int exempt)
{
    uint64_t total = 0;
    double served = 0, unit = p->served_unit, work = 0, weight = 0, conf_weight = 0;
    double zserved = 0, zweight = 0;   /* the same over the usable backends in the zone */
    size_t nusable = 0;
    int any_under = 0;
    *any_in_zone = 0;
    for (size_t b = 0; b < p->n; b++) {
        if (loads[b].usable) {
            total += loads[b].inflight;
            weight += p->be[b].weight * p->speed[b];
            conf_weight += p->be[b].weight;
            served += p->served[b];
            work += load_tokens(&loads[b]);
            nusable++;
            *any_in_zone |= p->be[b].in_zone;
            if (p->be[b].in_zone) {
                zserved += p->served[b];
                zweight += p->be[b].weight;
            }
        }
    }
    p->pool_work = work;
    p->pool_usable = nusable;
    for (size_t b = 0; b < p->n; b++) {
        if (!loads[b].usable) {
            p->usable[b] = NOT_USABLE;
            continue;
        }
        /* In the in-flight bound a backend's weight counts its speed: a pod half as fast
         * takes half as much. */
        double w = p->be[b].weight * p->speed[b];
        double limit = ceil(p->o.inflight_factor * (double)(total + 1) * w / weight);
        if (limit < BOUND_FLOOR)
            limit = BOUND_FLOOR;
        int under = (double)loads[b].inflight + 1 <= limit;
        /* The share bound, in the same form on the recent request counts; a backend may
         * always be SHARE_SLACK requests ahead of its fair share, so that a conversation's
         * next turn is not turned away early in a run for lack of requests to compare. */
        double fair = (served + unit) * p->be[b].weight / conf_weight;
        /* In the router's zone the fair share is the zone's: the zone cost keeps traffic
         * home, so a share of the whole pool would put half the requests over the bound at
         * light load and send them across (out of the zone, the pool's share stands). */
        if (*any_in_zone && p->be[b].in_zone)
            fair = (zserved + unit) * p->be[b].weight / zweight;
        /* share_margin: room for what other replicas send it at this moment, unseen here. The
         * slack is not cut by it: a conversation's early turns stay where they are warm. */
        double cap = p->o.share_factor * fair - p->o.share_margin * unit;
        if (cap < fair + SHARE_SLACK * unit)
            cap = fair + SHARE_SLACK * unit;
        if (p->o.share_factor > 0 && p->served[b] + unit > cap && !exempt)
            under = 0;
        double over = p->served[b] + unit - fair;
        p->over_share[b] = p->o.share_factor > 0 && over > 0 ? over / (cap - fair) : 0;
        p->usable[b] = under ? UNDER_BOUND : OVER_BOUND;
        any_under |= under;
    }
    return any_under;
}

/* After mark_bounds: a backend under both bounds but share_reserve of the way to the share bound
 * is passed over for a request it does not save share_reserve_tokens of prefill on against the
 * next warmest usable backend, nor RESERVE_SHARE of the request's own prompt, while another
 * backend stays under both bounds. t1, t2: the usable backends' longest and next longest matches
 * (ca_decide). */
static void keep_reserve(pcr_policy_t *p, const pcr_key_t *key, uint32_t t1, uint32_t t2)
{
    if (p->o.share_reserve <= 0 || p->o.share_factor <= 0)
        return;
    /* Tokens the warmest saves over the next (0 for every other backend), within the prompt. */
    double saving = (double)(uncached_tokens(p, key, t2) - uncached_tokens(p, key, t1));
    size_t left = 0, passed = 0;
    for (size_t b = 0; b < p->n; b++) {
        if (p->usable[b] != UNDER_BOUND)
            continue;
        double save = p->matched[b] == t1 ? saving : 0;
        if (p->over_share[b] >= p->o.share_reserve && save < p->o.share_reserve_tokens &&
            save < RESERVE_SHARE * (double)key->prompt_tokens) {
            p->usable[b] = RESERVED;
            passed++;
        } else {
            left++;
        }
    }
    for (size_t b = 0; passed > 0 && b < p->n; b++)
        if (p->usable[b] == RESERVED)
            p->usable[b] = left > 0 ? OVER_BOUND : UNDER_BOUND;
}

static double zone_cost(const pcr_policy_t *p, size_t b)
{
    return p->be[b].in_zone ? 0.0 : p->o.zone_penalty;
}

/* b's expected time to first token, us, behind `tokens` of prefill (policy_int.h: rate). */
static double ttft_us(const pcr_policy_t *p, size_t b, double tokens)
{
    return p->ttft[b].c + p->rate[b] * tokens;
}

/* The weight of b's queued work against new prefill: load_weight while the other pods are
 * idle, falling as their mean queued work grows past load_scale. Waiting behind b's queue
 * delays this request alone; prefill it makes another pod do delays every request queued
 * there after it, which costs little while they are idle and more the busier they are. A
 * pool-wide mean would discount a lone long queue by its own length. */
static double load_weight(const pcr_policy_t *p, double own)
{
    if (p->o.load_scale <= 0 || p->pool_usable < 2)
        return p->o.load_weight;
    double others = (p->pool_work - own) / (double)(p->pool_usable - 1);
    return p->o.load_weight / (1.0 + (others > 0 ? others : 0) / p->o.load_scale);
}

/* What b would cost, in expected microseconds to the first token, for `tokens` of its own,
 * with its share charge at most `share_cap` tokens. */
static double time_cost(const pcr_policy_t *p, const pcr_backend_load_t *loads, size_t b,
                        double tokens, double share_cap)
{
    double load = load_tokens(&loads[b]);
    double w = load_weight(p, load);
    double share = p->o.share_penalty * p->over_share[b] *
                   (p->o.load_weight > 0 ? w / p->o.load_weight : 1.0);
    if (share > share_cap)
        share = share_cap;
    return ttft_us(p, b, w * load + tokens + zone_cost(p, b) + share);
}

/* b's expected time to first token for `tokens` of its own behind the prefill queued there,
 * us, as include/pcr/ttft.h models it: the prefill sent and not yet at its first token, and
 * the pod's own queue, at full weight (no discount for what its prefill costs others, no
 * charge for decode slots, which delay a first token little). The zone decision compares
 * these (zone_better). */
static double honest_us(const pcr_policy_t *p, const pcr_backend_load_t *loads, size_t b,
                        double tokens)
{
    return ttft_us(p, b, (double)loads[b].queued_prefill +
                             WAITING_TOKENS * loads[b].pod_waiting + tokens);
}

/* Whether far backend f, for `f_tokens` of its own, beats home backend h, for `h_tokens`: its
 * expected first token, and the zone cost (zone_penalty at f's rate), come before h's. The
 * home tier is chosen by the discounted cost, which weighs a queue less the busier the pool
 * is; across zones that discount would keep a saturated zone's traffic home while the other
 * zone idles, so here each queue counts in full. */
static int zone_better(const pcr_policy_t *p, const pcr_backend_load_t *loads, size_t f,
                       double f_tokens, size_t h, double h_tokens)
{
    return honest_us(p, loads, f, f_tokens + zone_cost(p, f)) < honest_us(p, loads, h, h_tokens);
}

/* A cold prompt pays its whole prefill wherever it goes, so the one thing that makes its first
 * token late is the prefill queued ahead of it: one 100k-token prompt holds a pod for seconds.
 * Among the candidates in p->usable, pass over those whose expected first token (their queue,
 * then the prompt, at their own rate) is later than COLD_SLACK times the earliest: the ring's
 * choice stands while it costs little, and an idle pod takes the prompt when it would wait. */
#define COLD_SLACK 1.2

static void pass_over_long_queues(pcr_policy_t *p, const pcr_key_t *key,
                                  const pcr_backend_load_t *loads)
{
    double first = -1;
    for (size_t b = 0; b < p->n; b++) {
        if (!p->usable[b])
            continue;
        double t = ttft_us(p, b, (double)loads[b].queued_prefill + (double)key->prompt_tokens);
        if (first < 0 || t < first)
            first = t;
    }
    for (size_t b = 0; b < p->n; b++) {
        double t = ttft_us(p, b, (double)loads[b].queued_prefill + (double)key->prompt_tokens);
        if (p->usable[b] && t > COLD_SLACK * first)
            p->usable[b] = 0;
    }
}

/* A prefix nobody holds: the ring places it among the in-zone backends (all, when none is
 * usable in the zone) under the bounds mark_bounds set (all, when none is), with bounded loads
 * on in-flight requests and on blocks held, so new prefixes also spread the cache itself
 * evenly; unless the other zone's least queued backend would give it an earlier first token,
 * crossing included (zone_better). The next request with the prefix is warm. */
static int place_cold(pcr_policy_t *p, const pcr_key_t *key, const pcr_backend_load_t *loads,
                      int any_in_zone, int any_under)
{
    uint64_t held = 0, weight = 0;
    size_t left = 0, under = 0;
    int far = -1;   /* the other zone's earliest first token, under the bounds if any is */
    double far_us = 0;
    for (size_t b = 0; b < p->n; b++) {
        under += p->usable[b] == UNDER_BOUND && (!any_in_zone || p->be[b].in_zone);
        if (any_in_zone && !p->be[b].in_zone && p->usable[b] != NOT_USABLE &&
            (!any_under || p->usable[b] == UNDER_BOUND)) {
            double t = honest_us(p, loads, b, (double)key->prompt_tokens);
            if (far < 0 || t < far_us) {
                far = (int)b;
                far_us = t;
            }
        }
    }
    for (size_t b = 0; b < p->n; b++) {
        p->usable[b] = loads[b].usable && (!any_in_zone || p->be[b].in_zone) &&
                       (under == 0 || p->usable[b] == UNDER_BOUND);
        if (p->usable[b]) {
            held += pcr_index_backend_blocks(p->index, (unsigned)b);
            weight += p->be[b].weight;
        }
    }
    for (size_t b = 0; b < p->n; b++) {
        if (!p->usable[b])
            continue;
        /* Blocks held now, against load_factor times the mean: counting the new prompt in,
         * as the ring's bound counts the new request, would turn every pod away while the
         * index is nearly empty (the first prompts are all larger than a share of it). */
        double limit = p->o.load_factor * (double)held * p->be[b].weight / (double)weight;
        uint64_t mine = pcr_index_backend_blocks(p->index, (unsigned)b);
        p->usable[b] = (double)mine <= limit ? 2 : 1;
        left += p->usable[b] == 2;
    }
    for (size_t b = 0; b < p->n; b++)
        p->usable[b] = left > 0 ? p->usable[b] == 2 : p->usable[b] != 0;
    pass_over_long_queues(p, key, loads);
    int home = pcr_policy_ring_place(p, pcr_policy_ring_key(p, key), loads, 0);
    /* The zone saturated: the prompt waits less in the other zone, crossing included. */
    if (far >= 0 && home >= 0 &&
        zone_better(p, loads, (size_t)far, (double)key->prompt_tokens, (size_t)home,
                    (double)key->prompt_tokens))
        return far;
    return home;
}

/* No prompt: the least loaded (in tokens, zone included) under the limit, ties by rotation. */
static void decide_keyless(pcr_policy_t *p, const pcr_backend_load_t *loads, int any_under,
                           int any_in_zone, pcr_decision_t *out)
{
    int best = -1;
    double best_cost = 0;
    size_t start = (size_t)(p->rotation++ % p->n);
    for (size_t k = 0; k < p->n; k++) {
        size_t b = (start + k) % p->n;
        if (p->usable[b] == NOT_USABLE || (any_under && p->usable[b] != UNDER_BOUND))
            continue;
        double cost = time_cost(p, loads, b, 0, INFINITY);
        if (best < 0 || cost < best_cost) {
            best = (int)b;
            best_cost = cost;
        }
    }
    out->backend = best;
    out->reason = best >= 0 && any_in_zone && !p->be[best].in_zone ? PCR_REASON_ZONE_SPILL
                                                                   : PCR_REASON_LEAST_LOADED;
}

static void ca_decide(pcr_policy_t *p, const pcr_key_t *key, const pcr_backend_load_t *loads,
                      uint64_t now, pcr_decision_t *out)
{
    uint32_t top = 0, second = 0; /* the usable backends' longest and next longest matches */
    (void)now;

    if (key == NULL || (key->nblocks == 0 && !precise(p, key))) {
        int any_in_zone, any_under = mark_bounds(p, loads, &any_in_zone, 0);
        decide_keyless(p, loads, any_under, any_in_zone, out);
        return;
    }
    /* The match comes first, so that its time runs from the decision's start (decide_t0): one
     * clock read less. It reads the index only; the bounds below do not depend on it. */
    match(p, key);
    out->precise = precise(p, key);
    out->total_blocks = (uint32_t)(out->precise ? key->ntblocks : key->nblocks);
    if (p->clock_ns != NULL)
        out->match_ns = p->clock_ns() - p->decide_t0;
    for (size_t b = 0; b < p->n; b++) {
        if (!loads[b].usable)
            continue;
        if (p->matched[b] > top) {
            second = top;
            top = p->matched[b];
        } else if (p->matched[b] > second) {
            second = p->matched[b];
        }
    }
    int exempt = p->o.share_exempt_tokens > 0 &&
                 (double)uncached_tokens(p, key, top) >= p->o.share_exempt_tokens;
    int any_in_zone, any_under = mark_bounds(p, loads, &any_in_zone, exempt);
    if (any_under && !exempt)
        keep_reserve(p, key, top, second);
    if (top == 0) {
        out->backend = place_cold(p, key, loads, any_in_zone, any_under);
        out->reason = out->backend >= 0 && any_in_zone && !p->be[out->backend].in_zone
                          ? PCR_REASON_ZONE_SPILL : PCR_REASON_COLD;
        return;
    }

    uint64_t rk = pcr_policy_ring_key(p, key);
    /* Each zone's best by cost, [0] the router's (every backend's when it has none), [1] the
     * other's; then zone_better decides between them. */
    int tier_best[2] = {-1, -1}, warmest = -1, warmest_skipped = 0;
    double tier_cost[2] = {0, 0}, warm_base = 0;
    uint64_t tier_tie[2] = {0, 0};
    for (size_t b = 0; b < p->n; b++) {
        if (p->usable[b] == NOT_USABLE)
            continue;
        double base = (double)uncached_tokens(p, key, p->matched[b]) + zone_cost(p, b);
        if (p->matched[b] == top && (warmest < 0 || base < warm_base)) {
            warmest = (int)b;
            warm_base = base;
            warmest_skipped = any_under && p->usable[b] != UNDER_BOUND;
        }
        if (any_under && p->usable[b] != UNDER_BOUND)
            continue;
        double cost = time_cost(p, loads, b, (double)uncached_tokens(p, key, p->matched[b]),
                                SHARE_CAP * (double)key->prompt_tokens);
        uint64_t tie = mix64(rk ^ ((uint64_t)b * 0x9E3779B97F4A7C15ull));
        int t = any_in_zone && !p->be[b].in_zone;
        if (tier_best[t] < 0 || cost < tier_cost[t] ||
            (cost == tier_cost[t] && tie < tier_tie[t])) {
            tier_best[t] = (int)b;
            tier_cost[t] = cost;
            tier_tie[t] = tie;
        }
    }
    int best = tier_best[0];
    if (best < 0 ||
        (tier_best[1] >= 0 &&
         zone_better(p, loads, (size_t)tier_best[1],
                     (double)uncached_tokens(p, key, p->matched[tier_best[1]]), (size_t)best,
                     (double)uncached_tokens(p, key, p->matched[best]))))
        best = tier_best[1];
    out->backend = best;
    out->matched_blocks = p->matched[best];
    out->matched_time = out->precise ? 0
                                     : pcr_index_last_use(p->index, (unsigned)best, key->blocks,
                                                          p->matched[best]);
    out->uncached_prefill = uncached_tokens(p, key, p->matched[best]);
    /* Why not the warmest: the bound skipped it, or its load outweighed its saving. */
    double chosen_base = (double)out->uncached_prefill + zone_cost(p, (size_t)best);
    if (p->matched[best] < top && (warmest_skipped || warm_base <= chosen_base))
        out->reason = PCR_REASON_OVERLOAD_SPILL;
    else if (any_in_zone && !p->be[best].in_zone)
        out->reason = PCR_REASON_ZONE_SPILL;
    else if (p->matched[best] > 0)
        out->reason = PCR_REASON_WARM;
    else
        out->reason = PCR_REASON_COLD;  /* the zone penalty kept it home, on a cold pod */
}

const pcr_lb_ops_t pcr_lb_cache_aware = {ca_decide};
