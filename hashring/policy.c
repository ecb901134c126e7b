/* hashring/policy.c: the routing policy object (include/pcr/policy.h): its creation, the
 * prefix key, the dispatch to one balancing algorithm through its ops table, and the index
 * bookkeeping (commit, forget, reset) that only cache_aware uses. */
#include <stdlib.h>
#include <string.h>

#include "pcr/prefix.h"
#include "policy_int.h"

void pcr_policy_opts_default(pcr_policy_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->kind = PCR_POLICY_CACHE_AWARE;
    o->block_bytes = 256;
    o->max_prefix_bytes = (size_t)1 << 20;
    o->index_max_bytes = (size_t)256 << 20;
    o->load_factor = 1.25;
    o->inflight_factor = 3.0;
    o->load_weight = 1.0;
    o->load_scale = 1024;
    o->share_factor = 1.1;
    o->share_penalty = 2048;
    o->share_margin = 0;
    o->share_exempt_tokens = 16384;
    o->share_reserve = 0.8;
    o->share_reserve_tokens = 4096;
    o->zone_penalty = 2048;
    o->zone = NULL;
    o->vnodes = 160;
    o->unavailable_keep = 300000000; /* 300 s in microseconds */
    o->prefill_us_per_token = 70;
    o->ttft_overhead_us = 20000;
    o->index_events = 0;
    o->kv_block_tokens = 16;
    o->kv_speculative_ttl = 2000000; /* 2 s in microseconds */
}

static const pcr_lb_ops_t *ops_of(pcr_policy_kind_t kind)
{
    switch (kind) {
    case PCR_POLICY_ROUND_ROBIN:     return &pcr_lb_round_robin;
    case PCR_POLICY_LEAST_LOADED:    return &pcr_lb_least_loaded;
    case PCR_POLICY_CONSISTENT_HASH: return &pcr_lb_consistent_hash;
    case PCR_POLICY_CACHE_AWARE:     return &pcr_lb_cache_aware;
    case PCR_POLICY_RANDOM:          return &pcr_lb_random;
    }
    return NULL;
}

static void expire_unavailable(pcr_policy_t *p, uint64_t now);

#define MAX_OVERHEAD_US 60e6   /* a minute: past that the pool is not answering at all */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The lines the cost uses, pooled (include/pcr/ttft.h says why). One overhead for the pool,
 * fitted from every backend's observations with the configured one as k observations of
 * prior. Each backend's rate is its fit with that overhead, pulled toward the centre, the
 * median of what the observed backends' observations alone say (the configured rate until one
 * is observed): a backend seen little looks like the others, not like a guess that may be off
 * ten times. Then it is moved toward the centre by PCR_RATE_BAND of it (soft threshold, see
 * policy_int.h), and the speeds (the bounds' weights) follow. A backend that looks slow is
 * given less work, hence fewer observations to correct a wrong look (a few unlucky first
 * requests, a pause now over): what it differs from the centre by shrinks as observations of
 * the others go by without one of its own, halving after a window's worth per backend. */
static void rates_update(pcr_policy_t *p)
{
    double num = PCR_TTFT_PRIOR_WEIGHT * p->o.ttft_overhead_us, den = PCR_TTFT_PRIOR_WEIGHT;
    for (size_t b = 0; b < p->n; b++)
        pcr_ttft_overhead_terms(&p->ttft[b], &num, &den);
    double c = num / den;
    c = c < 0 ? 0 : c > MAX_OVERHEAD_US ? MAX_OVERHEAD_US : c;
    size_t k = 0;
    for (size_t b = 0; b < p->n; b++)
        if (p->ttft[b].n > 0)
            p->sorted[k++] = pcr_ttft_rate_observed(&p->ttft[b], c);
    double centre = p->o.prefill_us_per_token;
    if (k > 0) {
        qsort(p->sorted, k, sizeof(double), cmp_double);
        centre = k % 2 ? p->sorted[k / 2] : (p->sorted[k / 2 - 1] + p->sorted[k / 2]) / 2;
    }
    double band = PCR_RATE_BAND * centre, window = PCR_TTFT_WINDOW * (double)p->n;
    for (size_t b = 0; b < p->n; b++) {
        double stale = (double)(p->observed - p->observed_at[b]);
        double a = pcr_ttft_rate(&p->ttft[b], c, centre);
        a = centre + (a - centre) / (1.0 + stale / window);
        p->ttft[b].a = a;          /* the line its next observation is clipped against */
        p->ttft[b].c = c;
        p->rate[b] = a > centre + band ? a - band : a < centre - band ? a + band : centre;
        p->speed[b] = centre / p->rate[b];
    }
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s != NULL ? s : "");
    char *d = malloc(n + 1);
    if (d != NULL)
        memcpy(d, s != NULL ? s : "", n + 1);
    return d;
}

/* In precise mode the index_max_bytes bound is shared (policy.h says how). */
static size_t radix_max_bytes(const pcr_policy_opts_t *o)
{
    return o->index_events && o->index_max_bytes != 0 ? o->index_max_bytes / 4 : o->index_max_bytes;
}

static size_t kv_max_bytes(const pcr_policy_opts_t *o)
{
    return o->index_max_bytes - radix_max_bytes(o);
}

static int opts_valid(const pcr_policy_opts_t *o, size_t n)
{
    return o != NULL && ops_of(o->kind) != NULL && n <= PCR_INDEX_MAX_BACKENDS &&
           o->block_bytes >= 1 && o->max_prefix_bytes >= 1 &&
           pcr_prefix_max_blocks(o->block_bytes, o->max_prefix_bytes) <= UINT32_MAX &&
           o->load_factor >= 1.0 && o->inflight_factor >= 1.0 && o->load_weight >= 0 &&
           o->load_scale >= 0 &&
           o->zone_penalty >= 0 &&
           (o->share_factor == 0 || o->share_factor >= 1.0) && o->share_penalty >= 0 &&
           o->share_margin >= 0 && o->share_exempt_tokens >= 0 &&
           o->share_reserve >= 0 && o->share_reserve <= 1 && o->share_reserve_tokens >= 0 &&
           o->vnodes >= 1 && o->prefill_us_per_token > 0 && o->ttft_overhead_us >= 0 &&
           o->kv_block_tokens >= 1 && o->kv_block_tokens <= 65536;
}

pcr_policy_t *pcr_policy_new(const pcr_policy_opts_t *opts, const pcr_backend_desc_t *backends,
                             size_t n)
{
    pcr_policy_t *p = NULL;
    const char **names = NULL;
    uint32_t *weights = NULL;

    if (!opts_valid(opts, n) || (backends == NULL && n > 0))
        return NULL;
    for (size_t b = 0; b < n; b++)
        if (backends[b].name == NULL || backends[b].weight == 0)
            return NULL;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->o = *opts;
    p->n = n;
    p->ops = ops_of(opts->kind);
    p->rng = PCR_RANDOM_SEED;
    p->max_blocks = pcr_prefix_max_blocks(opts->block_bytes, opts->max_prefix_bytes);
    p->zone = dup_str(opts->zone);
    p->o.zone = p->zone;
    size_t alloc = n ? n : 1; /* no backend yet: they join later (pcr_policy_backend_set) */
    p->be = calloc(alloc, sizeof(*p->be));
    p->matched = calloc(alloc, sizeof(*p->matched));
    p->load = calloc(alloc, sizeof(*p->load));
    p->usable = calloc(alloc, sizeof(*p->usable));
    p->over_share = calloc(alloc, sizeof(*p->over_share));
    p->ttft = calloc(alloc, sizeof(*p->ttft));
    p->cap_conf = calloc(alloc, sizeof(*p->cap_conf));
    p->cap_eff = calloc(alloc, sizeof(*p->cap_eff));
    p->served = calloc(alloc, sizeof(*p->served));
    p->rate = calloc(alloc, sizeof(*p->rate));
    p->speed = calloc(alloc, sizeof(*p->speed));
    p->sorted = calloc(alloc, sizeof(*p->sorted));
    p->observed_at = calloc(alloc, sizeof(*p->observed_at));
    p->served_unit = 1;
    names = calloc(alloc, sizeof(*names));
    weights = calloc(alloc, sizeof(*weights));
    if (p->zone == NULL || p->be == NULL || p->matched == NULL || p->load == NULL ||
        p->usable == NULL || p->over_share == NULL || p->ttft == NULL || p->cap_conf == NULL || p->cap_eff == NULL ||
        p->served == NULL || p->rate == NULL || p->speed == NULL || p->sorted == NULL ||
        p->observed_at == NULL ||
        names == NULL || weights == NULL)
        goto fail;
    for (size_t b = 0; b < n; b++) {
        const char *z = backends[b].zone != NULL ? backends[b].zone : "";
        if ((p->be[b].name = dup_str(backends[b].name)) == NULL ||
            (p->be[b].zone = dup_str(z)) == NULL)
            goto fail;
        p->be[b].weight = backends[b].weight;
        p->be[b].in_zone = p->zone[0] == '\0' || strcmp(z, p->zone) == 0;
        names[b] = p->be[b].name;
        weights[b] = backends[b].weight;
        pcr_ttft_init(&p->ttft[b], opts->prefill_us_per_token, opts->ttft_overhead_us);
        p->cap_conf[b] = p->cap_eff[b] = backends[b].capacity_blocks != 0
                                              ? backends[b].capacity_blocks
                                              : PCR_INDEX_UNLIMITED;
    }
    rates_update(p);
    if (n > 0 && (opts->kind == PCR_POLICY_CONSISTENT_HASH || opts->kind == PCR_POLICY_CACHE_AWARE)) {
        p->ring = pcr_ring_new(names, weights, n, opts->vnodes);
        if (p->ring == NULL)
            goto fail;
    }
    if (opts->kind == PCR_POLICY_CACHE_AWARE) {
        pcr_index_opts_t io = {.nbackends = alloc, .max_bytes = radix_max_bytes(opts)};
        p->index = pcr_index_new(&io);
        if (p->index == NULL)
            goto fail;
        if (opts->index_events) {
            pcr_kvtable_opts_t ko = {alloc, opts->kv_block_tokens, kv_max_bytes(opts),
                                     opts->kv_speculative_ttl};
            p->kvt = pcr_kvtable_new(&ko);
            p->kv_gpu = calloc(alloc, sizeof(*p->kv_gpu));
            if (p->kvt == NULL || p->kv_gpu == NULL)
                goto fail;
        }
        for (size_t b = 0; b < n; b++)
            pcr_index_set_capacity(p->index, (unsigned)b, p->cap_eff[b]);
    }
    free(names);
    free(weights);
    return p;
fail:
    free(names);
    free(weights);
    pcr_policy_free(p);
    return NULL;
}

/* The ring over the slots that hold a backend (a left slot weighs 0: no points). */
static int ring_rebuild(pcr_policy_t *p)
{
    if (p->o.kind != PCR_POLICY_CONSISTENT_HASH && p->o.kind != PCR_POLICY_CACHE_AWARE)
        return 0;
    const char **names = calloc(p->n, sizeof(*names));
    uint32_t *weights = calloc(p->n, sizeof(*weights));
    pcr_ring_t *ring = NULL;
    int rc = PCR_ERR_NOMEM;
    if (names != NULL && weights != NULL) {
        size_t live = 0;
        for (size_t b = 0; b < p->n; b++) {
            names[b] = p->be[b].name;
            weights[b] = p->be[b].name != NULL ? p->be[b].weight : 0;
            live += p->be[b].name != NULL;
        }
        ring = live > 0 ? pcr_ring_new(names, weights, p->n, p->o.vnodes) : NULL;
        rc = live == 0 || ring != NULL ? 0 : PCR_ERR_NOMEM;
    }
    free(names);
    free(weights);
    if (rc == 0) {
        pcr_ring_free(p->ring);
        p->ring = ring;
    }
    return rc;
}

/* Backend b serves others too (2), only this router (1), or was not reported (0). */
static void set_shared(pcr_policy_t *p, size_t b, uint8_t v)
{
    uint8_t was = p->be[b].shared;
    if (was == v)
        return;
    p->nshared -= was == 2;
    p->nprivate -= was == 1;
    p->nshared += v == 2;
    p->nprivate += v == 1;
    p->be[b].shared = v;
    if (v == 2 && p->nshared == 1)
        p->tails_start = p->tails;   /* others' tails may come now: wait for the first again */
}

/* Drops what either index believes a backend holds. */
static void drop_backend(pcr_policy_t *p, unsigned b)
{
    if (p->index != NULL)
        pcr_index_remove_backend(p->index, b);
    if (p->kvt != NULL)
        pcr_kvtable_clear(p->kvt, b);
}

/* A slot's learned state as for a backend never seen: the configured rate, the capacity
 * given, no share of recent requests. */
static void slot_fresh(pcr_policy_t *p, size_t b, uint64_t capacity_blocks)
{
    pcr_ttft_init(&p->ttft[b], p->o.prefill_us_per_token, p->o.ttft_overhead_us);
    p->cap_conf[b] = p->cap_eff[b] = capacity_blocks != 0 ? capacity_blocks : PCR_INDEX_UNLIMITED;
    p->served[b] = 0;
    p->rate[b] = p->o.prefill_us_per_token;
    p->speed[b] = 1;
    p->sorted[b] = 0;
    p->observed_at[b] = p->observed;
}

/* Room for slot `id` in every per-backend array. */
static int grow(pcr_policy_t *p, size_t n)
{
    if (n <= p->n)
        return 0;
    if (n > PCR_INDEX_MAX_BACKENDS)
        return PCR_ERR_INVAL;
    pcr_pbackend_t *be = realloc(p->be, n * sizeof(*be));
    if (be != NULL)
        p->be = be;
    uint32_t *matched = realloc(p->matched, n * sizeof(*matched));
    if (matched != NULL)
        p->matched = matched;
    uint64_t *load = realloc(p->load, n * sizeof(*load));
    if (load != NULL)
        p->load = load;
    unsigned char *usable = realloc(p->usable, n * sizeof(*usable));
    if (usable != NULL)
        p->usable = usable;
#define GROW(field)                                                                        \
    do {                                                                                   \
        void *np = realloc(p->field, n * sizeof(*p->field));                               \
        if (np == NULL)                                                                    \
            return PCR_ERR_NOMEM;                                                          \
        p->field = np;                                                                     \
    } while (0)
    if (be == NULL || matched == NULL || load == NULL || usable == NULL)
        return PCR_ERR_NOMEM;
    GROW(ttft);
    GROW(cap_conf);
    GROW(cap_eff);
    GROW(served);
    GROW(over_share);
    GROW(rate);
    GROW(speed);
    GROW(sorted);
    GROW(observed_at);
#undef GROW
    if (p->index != NULL && pcr_index_grow(p->index, n) != 0)
        return PCR_ERR_NOMEM;
    if (p->kvt != NULL) {
        uint32_t *g = realloc(p->kv_gpu, n * sizeof(*g));
        if (g == NULL)
            return PCR_ERR_NOMEM;
        p->kv_gpu = g;
        if (pcr_kvtable_grow(p->kvt, n) != 0)
            return PCR_ERR_NOMEM;
    }
    for (size_t b = p->n; b < n; b++) {
        p->be[b] = (pcr_pbackend_t){NULL, NULL, 0, 0, 0, 0};
        slot_fresh(p, b, 0);
    }
    p->n = n;
    rates_update(p);
    return 0;
}

int pcr_policy_backend_set(pcr_policy_t *p, int id, const pcr_backend_desc_t *d)
{
    if (p == NULL || d == NULL || d->name == NULL || d->weight == 0 || id < 0 ||
        (size_t)id >= PCR_INDEX_MAX_BACKENDS)
        return PCR_ERR_INVAL;
    int rc = grow(p, (size_t)id + 1);
    if (rc != 0)
        return rc;
    pcr_pbackend_t *b = &p->be[id];
    const char *z = d->zone != NULL ? d->zone : "";
    char *name = dup_str(d->name), *zone = dup_str(z);
    if (name == NULL || zone == NULL) {
        free(name);
        free(zone);
        return PCR_ERR_NOMEM;
    }
    /* Another backend in the slot: what the index believed of the old one is not its. */
    if (b->name != NULL && strcmp(b->name, d->name) != 0 && p->index != NULL)
        drop_backend(p, (unsigned)id);
    pcr_pbackend_t old = *b;
    int same = old.name != NULL && strcmp(old.name, d->name) == 0;
    *b = (pcr_pbackend_t){name, zone, d->weight, p->zone[0] == '\0' || strcmp(z, p->zone) == 0,
                          same ? old.down_since : 0, old.shared};
    if (old.down_since != 0 && b->down_since == 0)
        p->ndown--;
    rc = ring_rebuild(p);
    if (rc != 0) {
        free(name);
        free(zone);
        *b = old;
        return rc;
    }
    uint64_t cap = d->capacity_blocks ? d->capacity_blocks : PCR_INDEX_UNLIMITED;
    if (old.name == NULL || strcmp(old.name, d->name) != 0) {
        slot_fresh(p, (size_t)id, d->capacity_blocks);
        rates_update(p);
    } else if (p->cap_conf[id] != cap) {
        p->cap_conf[id] = p->cap_eff[id] = cap; /* feedback learns afresh from there */
    }
    if (!same)
        set_shared(p, (size_t)id, 0);
    free(old.name);
    free(old.zone);
    if (p->index != NULL)
        pcr_index_set_capacity(p->index, (unsigned)id, p->cap_eff[id]);
    return 0;
}

pcr_policy_t *pcr_policy_renew(const pcr_policy_t *old, const pcr_policy_opts_t *opts)
{
    if (old == NULL)
        return NULL;
    pcr_policy_t *p = pcr_policy_new(opts, NULL, 0);
    if (p == NULL)
        return NULL;
    p->clock_ns = old->clock_ns;
    for (size_t b = 0; b < old->n; b++) {
        const pcr_pbackend_t *ob = &old->be[b];
        if (ob->name == NULL)
            continue;
        /* Blocks of the old size, counted in the new one until the caller says again. */
        uint64_t cap = old->cap_conf[b] == PCR_INDEX_UNLIMITED ? 0 : old->cap_conf[b];
        if (cap != 0 && opts->block_bytes != old->o.block_bytes)
            cap = (cap * old->o.block_bytes + opts->block_bytes - 1) / opts->block_bytes;
        pcr_backend_desc_t d = {ob->name, ob->zone, ob->weight, cap};
        if (pcr_policy_backend_set(p, (int)b, &d) != 0) {
            pcr_policy_free(p);
            return NULL;
        }
        if (ob->down_since != 0) {
            p->be[b].down_since = ob->down_since;
            p->ndown++;
        }
        set_shared(p, b, ob->shared);
    }
    return p;
}

int pcr_policy_backend_remove(pcr_policy_t *p, int id)
{
    if (p == NULL || id < 0 || (size_t)id >= p->n)
        return PCR_ERR_INVAL;
    pcr_pbackend_t *b = &p->be[id];
    if (b->name == NULL)
        return 0;
    char *name = b->name;
    b->name = NULL;
    int rc = ring_rebuild(p);
    if (rc != 0) {
        b->name = name;
        return rc;
    }
    free(name);
    free(b->zone);
    b->zone = NULL;
    if (b->down_since != 0)
        p->ndown--;
    b->down_since = 0;
    set_shared(p, (size_t)id, 0);
    if (p->index != NULL)
        drop_backend(p, (unsigned)id);
    slot_fresh(p, (size_t)id, 0);
    rates_update(p);
    return 0;
}

int pcr_policy_tune(pcr_policy_t *p, const pcr_policy_opts_t *o)
{
    if (p == NULL || !opts_valid(o, 0))
        return PCR_ERR_INVAL;
    if (o->kind != p->o.kind || o->block_bytes != p->o.block_bytes ||
        o->max_prefix_bytes != p->o.max_prefix_bytes || !o->index_events != !p->o.index_events ||
        o->kv_block_tokens != p->o.kv_block_tokens)
        return PCR_ERR_INVAL; /* keys, index or ring would mean something else */
    char *zone = dup_str(o->zone);
    if (zone == NULL)
        return PCR_ERR_NOMEM;
    unsigned old_vnodes = p->o.vnodes;
    p->o.load_factor = o->load_factor;
    p->o.inflight_factor = o->inflight_factor;
    p->o.load_weight = o->load_weight;
    p->o.load_scale = o->load_scale;
    p->o.share_factor = o->share_factor;
    p->o.share_penalty = o->share_penalty;
    p->o.share_margin = o->share_margin;
    p->o.share_exempt_tokens = o->share_exempt_tokens;
    p->o.share_reserve = o->share_reserve;
    p->o.share_reserve_tokens = o->share_reserve_tokens;
    p->o.zone_penalty = o->zone_penalty;
    p->o.unavailable_keep = o->unavailable_keep;
    p->o.vnodes = o->vnodes;
    if (o->vnodes != old_vnodes && ring_rebuild(p) != 0) {
        p->o.vnodes = old_vnodes;
        free(zone);
        return PCR_ERR_NOMEM;
    }
    free(p->zone);
    p->zone = zone;
    p->o.zone = zone;
    for (size_t b = 0; b < p->n; b++)
        p->be[b].in_zone = zone[0] == '\0' || (p->be[b].zone && strcmp(p->be[b].zone, zone) == 0);
    if (o->prefill_us_per_token != p->o.prefill_us_per_token ||
        o->ttft_overhead_us != p->o.ttft_overhead_us) {
        /* The prior changes; what was observed stays (pcr_ttft_init would drop it). */
        p->o.prefill_us_per_token = o->prefill_us_per_token;
        p->o.ttft_overhead_us = o->ttft_overhead_us;
        rates_update(p);
    }
    if (o->index_max_bytes != p->o.index_max_bytes ||
        o->kv_speculative_ttl != p->o.kv_speculative_ttl) {
        p->o.index_max_bytes = o->index_max_bytes;
        p->o.kv_speculative_ttl = o->kv_speculative_ttl;
        pcr_index_set_max_bytes(p->index, radix_max_bytes(&p->o));
        pcr_kvtable_set_limits(p->kvt, kv_max_bytes(&p->o), p->o.kv_speculative_ttl);
    }
    return 0;
}

void pcr_policy_set_clock(pcr_policy_t *p, uint64_t (*clock_ns)(void))
{
    if (p != NULL)
        p->clock_ns = clock_ns;
}

size_t pcr_policy_backend_slots(const pcr_policy_t *p) { return p != NULL ? p->n : 0; }

void pcr_policy_free(pcr_policy_t *p)
{
    if (p == NULL)
        return;
    for (size_t b = 0; p->be != NULL && b < p->n; b++) {
        free(p->be[b].name);
        free(p->be[b].zone);
    }
    free(p->be);
    free(p->zone);
    free(p->matched);
    free(p->load);
    free(p->usable);
    free(p->over_share);
    free(p->ttft);
    free(p->cap_conf);
    free(p->cap_eff);
    free(p->served);
    free(p->rate);
    free(p->speed);
    free(p->sorted);
    free(p->observed_at);
    pcr_ring_free(p->ring);
    pcr_index_free(p->index);
    pcr_kvtable_free(p->kvt);
    free(p->kv_gpu);
    free(p);
}

size_t pcr_policy_max_blocks(const pcr_policy_t *p)
{
    return p != NULL ? p->max_blocks : 0;
}

int pcr_policy_key(const pcr_policy_t *p, const char *model, size_t model_len, const void *bytes,
                   size_t len, pcr_key_t *key)
{
    if (p == NULL || key == NULL || (model == NULL && model_len > 0) ||
        (bytes == NULL && len > 0) || (key->blocks == NULL && len > 0))
        return PCR_ERR_INVAL;
    key->nblocks = pcr_prefix_hash(model, model_len, bytes, len, p->o.block_bytes,
                                   p->o.max_prefix_bytes, key->blocks);
    key->prompt_tokens = len / 4 + (len % 4 != 0);
    return 0;
}

uint64_t pcr_policy_ring_key(const pcr_policy_t *p, const pcr_key_t *key)
{
    size_t depth = PCR_HASH_PREFIX_BYTES / p->o.block_bytes;
    if (depth == 0)
        depth = 1;
    if (depth > key->nblocks)
        depth = key->nblocks;
    return key->blocks[depth - 1];
}

int pcr_policy_ring_place(pcr_policy_t *p, uint64_t ring_key, const pcr_backend_load_t *loads,
                          int fill)
{
    for (size_t b = 0; b < p->n; b++) {
        if (fill)
            p->usable[b] = loads[b].usable != 0;
        p->load[b] = loads[b].inflight;
    }
    return pcr_ring_lookup(p->ring, ring_key, p->load, p->usable, p->o.load_factor);
}

int pcr_policy_decide(pcr_policy_t *p, const pcr_key_t *key, const pcr_backend_load_t *loads,
                      uint64_t now, pcr_decision_t *out)
{
    size_t usable = 0;

    if (out == NULL)
        return PCR_ERR_INVAL;
    memset(out, 0, sizeof(*out));
    out->backend = -1;
    out->reason = PCR_REASON_NO_BACKEND;
    if (p == NULL || loads == NULL || (key != NULL && key->nblocks > 0 && key->blocks == NULL))
        return PCR_ERR_INVAL;
    for (size_t b = 0; b < p->n; b++)
        usable += loads[b].usable != 0;
    if (usable == 0)
        return PCR_ERR_UNAVAIL;
    expire_unavailable(p, now);
    if (p->kvt != NULL)
        pcr_kvtable_expire(p->kvt, now);
    out->total_blocks = key != NULL ? (uint32_t)key->nblocks : 0;
    out->uncached_prefill = key != NULL ? key->prompt_tokens : 0;
    /* Three clock reads time both phases: here, after the match (the policy's op reads it from
     * decide_t0), and at the end, which the caller takes as its own (done_ns). */
    if (p->clock_ns != NULL)
        p->decide_t0 = p->clock_ns();
    p->ops->decide(p, key, loads, now, out);
    if (p->clock_ns != NULL) {
        out->done_ns = p->clock_ns();
        uint64_t spent = out->done_ns - p->decide_t0;
        out->cost_ns = spent > out->match_ns ? spent - out->match_ns : 0;
    }
    if (out->backend < 0) {
        out->reason = PCR_REASON_NO_BACKEND;
        return PCR_ERR_UNAVAIL;
    }
    return 0;
}

int pcr_policy_commit(pcr_policy_t *p, int backend, const pcr_key_t *key, uint64_t now,
                      uint32_t *added_from)
{
    size_t from;
    int rc;

    if (added_from != NULL)
        *added_from = key != NULL ? (uint32_t)key->nblocks : 0;
    if (p == NULL || backend < 0 || (size_t)backend >= p->n)
        return PCR_ERR_INVAL;
    /* Every commit weighs 1/keep times the one before: the same as decaying every backend's
     * count by `keep` per commit, in O(1). The counts are rescaled long before overflow.
     * Until a window's worth of commits has been made, every one weighs the same: the decay
     * would weigh a pod's first requests less than its last, and what the share bound let
     * through early on (SHARE_SLACK, lb_cache.c) would fade from the window but not from the
     * pod's true count, which then ends over share_factor (docs/TUNING.md). Counted flat, the
     * bound holds on the counts themselves; past a window's worth the decay takes over from
     * the same total (the decayed sum's limit is the window), so nothing jumps. */
    p->served[backend] += p->served_unit;
    if (p->commits < (uint64_t)PCR_SHARE_WINDOW)
        p->commits++;
    else
        p->served_unit /= 1.0 - 1.0 / PCR_SHARE_WINDOW;
    if (p->served_unit > 1e100) {
        for (size_t b = 0; b < p->n; b++)
            p->served[b] /= p->served_unit;
        p->served_unit = 1;
    }
    /* Precise mode: the blocks count as held until the pod's events confirm them (or not). A
     * table at its bound refuses and counts; the request is sent all the same. */
    if (p->kvt != NULL && key != NULL && key->ntblocks > 0)
        pcr_kvtable_speculate(p->kvt, (unsigned)backend, key->tblocks, key->ntblocks, now);
    if (p->index == NULL || key == NULL || key->nblocks == 0)
        return 0;
    rc = pcr_index_insert(p->index, (unsigned)backend, key->blocks, key->nblocks, now, &from);
    if (added_from != NULL)
        *added_from = (uint32_t)from;
    return rc;
}

void pcr_policy_forget(pcr_policy_t *p, int backend, const pcr_key_t *key, uint32_t added_from)
{
    if (p == NULL || p->index == NULL || key == NULL || backend < 0 || (size_t)backend >= p->n)
        return;
    pcr_index_erase(p->index, (unsigned)backend, key->blocks, key->nblocks, added_from);
}

/* Backends unavailable for longer than opts.unavailable_keep lose their entries. */
static void expire_unavailable(pcr_policy_t *p, uint64_t now)
{
    if (p->ndown == 0)
        return;
    for (size_t b = 0; b < p->n; b++) {
        uint64_t since = p->be[b].down_since;
        if (since != 0 && now >= since && now - since >= p->o.unavailable_keep) {
            if (p->index != NULL)
                drop_backend(p, (unsigned)b);
            p->be[b].down_since = 0;
            p->ndown--;
        }
    }
}

int pcr_policy_backend_state(pcr_policy_t *p, int backend, pcr_backend_state_t state,
                             uint64_t now)
{
    if (p == NULL || backend < 0 || (size_t)backend >= p->n)
        return PCR_ERR_INVAL;
    pcr_pbackend_t *b = &p->be[backend];
    switch (state) {
    case PCR_BACKEND_UNAVAILABLE:
        if (b->down_since == 0) {
            b->down_since = now ? now : 1;
            p->ndown++;
        }
        break;
    case PCR_BACKEND_AVAILABLE:
        if (b->down_since != 0) {
            b->down_since = 0;
            p->ndown--;
        }
        break;
    case PCR_BACKEND_SHARED:
    case PCR_BACKEND_PRIVATE:
        set_shared(p, (size_t)backend, state == PCR_BACKEND_SHARED ? 2 : 1);
        return 0;
    case PCR_BACKEND_RESTARTED:
        /* In events mode the pod's events report a restart themselves (AllBlocksCleared, a
         * sequence from 0), and what it published since is true: only the guesses go. */
        if (p->kvt != NULL) {
            pcr_index_remove_backend(p->index, (unsigned)backend);
            pcr_kvtable_clear_speculative(p->kvt, (unsigned)backend);
        } else if (p->index != NULL) {
            drop_backend(p, (unsigned)backend);
        }
        break;
    default:
        return PCR_ERR_INVAL;
    }
    expire_unavailable(p, now);
    return 0;
}

void pcr_policy_backend_reset(pcr_policy_t *p, int backend)
{
    if (p == NULL || p->index == NULL || backend < 0 || (size_t)backend >= p->n)
        return;
    drop_backend(p, (unsigned)backend);
}

int pcr_policy_set_capacity(pcr_policy_t *p, int backend, uint64_t capacity_blocks)
{
    if (p == NULL || backend < 0 || (size_t)backend >= p->n)
        return PCR_ERR_INVAL;
    uint64_t cap = capacity_blocks ? capacity_blocks : PCR_INDEX_UNLIMITED;
    p->cap_conf[backend] = p->cap_eff[backend] = cap;
    if (p->index == NULL)
        return 0;
    return pcr_index_set_capacity(p->index, (unsigned)backend, cap);
}

uint64_t pcr_policy_backend_capacity(const pcr_policy_t *p, int backend)
{
    if (p == NULL || p->index == NULL || backend < 0 || (size_t)backend >= p->n)
        return 0;
    return p->cap_eff[backend];
}

int pcr_policy_observe(pcr_policy_t *p, int backend, uint64_t uncached_tokens,
                       uint64_t queued_ahead, uint64_t ttfb_us)
{
    if (p == NULL || backend < 0 || (size_t)backend >= p->n)
        return PCR_ERR_INVAL;
    pcr_ttft_observe(&p->ttft[backend], (double)uncached_tokens + (double)queued_ahead,
                     (double)ttfb_us);
    p->observed_at[backend] = ++p->observed;
    rates_update(p);
    return 0;
}

double pcr_policy_estimate_ttft(const pcr_policy_t *p, int backend, uint64_t tokens)
{
    if (p == NULL || backend < 0 || (size_t)backend >= p->n)
        return 0;
    return p->ttft[backend].c + p->rate[backend] * (double)tokens;
}

void pcr_policy_stats(const pcr_policy_t *p, pcr_policy_stats_t *out)
{
    if (out == NULL)
        return;
    out->index_bytes = p != NULL ? pcr_index_bytes(p->index) + pcr_kvtable_bytes(p->kvt) : 0;
    out->index_nodes = p != NULL ? pcr_index_nodes(p->index) : 0;
    out->index_evictions = p != NULL ? pcr_index_evictions(p->index) : 0;
}

uint64_t pcr_policy_backend_blocks(const pcr_policy_t *p, int backend)
{
    if (p == NULL || backend < 0 || (size_t)backend >= p->n)
        return 0;
    return pcr_index_backend_blocks(p->index, (unsigned)backend);
}

/* ---- precise mode: the pods' own word (pcr/kvtable.h) ------------------------------------ */

size_t pcr_policy_max_tblocks(const pcr_policy_t *p)
{
    return p != NULL && p->kvt != NULL ? p->o.max_prefix_bytes / 4 / p->o.kv_block_tokens : 0;
}

uint32_t pcr_policy_kv_block_tokens(const pcr_policy_t *p)
{
    return p != NULL ? p->o.kv_block_tokens : 0;
}

size_t pcr_policy_ntblocks(const pcr_policy_t *p, size_t ntokens)
{
    size_t max = pcr_policy_max_tblocks(p);
    size_t n = max > 0 ? ntokens / p->o.kv_block_tokens : 0;
    return n < max ? n : max;
}

/* Unknown tails (PCR_PREFIX_PROBE) wait while one of the last PCR_PROBE_RUN reports paid. A
 * wait pays rarely but a lot: another replica's conversation is a long prompt, and its
 * prefill is the pod's time, which every queued request waits for. Two replicas of the
 * conversation trace find one in 18, many of them early, as the first turns come: so the first
 * PCR_PROBE_RUN tails wait too, and then one in PROBE_SAMPLE, so that a change in the traffic
 * is seen; unless every pod is known to serve this router alone (PCR_BACKEND_PRIVATE), where
 * only what its own text index let go can pay, and another sender would show in the pods'
 * counts first (a pod that turns shared starts it all again). The tails that go without
 * waiting are checked too, on their tokens asked in the background (when the worker has none
 * asked already), and count as reports. */
#define PROBE_SAMPLE 16

static int probe_now(pcr_policy_t *p)
{
    p->tails++;
    if (p->probe_paid >= 1)
        return 1;
    size_t live = 0;
    for (size_t b = 0; b < p->n; b++)
        live += p->be[b].name != NULL;
    if (p->nshared == 0 && p->nprivate >= live)
        return 0;   /* a pool this router alone uses */
    return p->tails - p->tails_start <= PCR_PROBE_RUN || p->tails % PROBE_SAMPLE == 0;
}

/* The token blocks of a text block, and one more for a block cut across its end: a holder of
 * more than that past what every holder holds is news. */
static size_t probe_slack(const pcr_policy_t *p)
{
    return p->o.block_bytes / 4 / p->o.kv_block_tokens + 1;
}

pcr_prefix_use_t pcr_policy_prefix_use(pcr_policy_t *p, const pcr_key_t *key, size_t n)
{
    if (p == NULL || p->index == NULL || key == NULL || key->nblocks == 0)
        return PCR_PREFIX_TOKENS;
    size_t sent = pcr_index_match(p->index, key->blocks, key->nblocks, p->matched);
    size_t most = p->n;
    for (size_t b = 0; sent > n + 1 && b < p->n; b++)
        if (p->matched[b] == sent)
            most = b;
    if (p->kvt == NULL || key->ntblocks == 0)
        return most < p->n ? PCR_PREFIX_WAIT : PCR_PREFIX_TOKENS;
    pcr_kvtable_match(p->kvt, key->tblocks, key->ntblocks, p->kv_gpu, p->matched);
    size_t holders = 0;
    for (size_t b = 0; b < p->n; b++)
        holders += p->matched[b] >= key->ntblocks;
    if (most < p->n)
        return holders == 1 && p->matched[most] >= key->ntblocks ? PCR_PREFIX_TEXT
                                                                  : PCR_PREFIX_WAIT;
    if (holders < 2)
        return PCR_PREFIX_TOKENS;
    return probe_now(p) ? PCR_PREFIX_PROBE : PCR_PREFIX_UNPROBED;
}

int pcr_policy_prefix_probed(pcr_policy_t *p, const pcr_key_t *key, size_t known)
{
    if (p == NULL || p->kvt == NULL || key == NULL || key->ntblocks == 0)
        return 0;
    /* A backend this router sent the whole prompt holds it for that reason (a tail checked
     * after its request went); the text index names them. */
    unsigned char *sent = p->usable;   /* scratch: no decision is under way */
    int text = p->index != NULL && key->nblocks > 0;
    if (text)
        pcr_index_match(p->index, key->blocks, key->nblocks, p->matched);
    for (size_t b = 0; b < p->n; b++)
        sent[b] = text && p->matched[b] >= key->nblocks;
    pcr_kvtable_match(p->kvt, key->tblocks, key->ntblocks, p->kv_gpu, p->matched);
    int paid = 0;
    for (size_t b = 0; b < p->n; b++)
        paid |= !sent[b] && p->matched[b] > known + probe_slack(p);
    uint64_t *w = &p->probe_bits[p->probe_pos / 64], bit = 1ull << (p->probe_pos % 64);
    p->probe_paid -= (*w & bit) != 0;
    p->probe_paid += paid != 0;
    *w = paid ? *w | bit : *w & ~bit;
    p->probe_pos = (p->probe_pos + 1) % PCR_PROBE_RUN;
    return paid;
}

int pcr_policy_key_tokens(const pcr_policy_t *p, uint64_t seed, const uint32_t *tokens,
                          size_t ntokens, pcr_key_t *key)
{
    if (p == NULL || p->kvt == NULL || key == NULL || key->tblocks == NULL ||
        (ntokens > 0 && tokens == NULL))
        return PCR_ERR_INVAL;
    key->ntblocks = pcr_kvtable_key(seed, p->o.kv_block_tokens, tokens, ntokens, key->tblocks,
                                    pcr_policy_max_tblocks(p));
    key->prompt_tokens = ntokens;
    return 0;
}

int pcr_policy_kv_stored(pcr_policy_t *p, int backend, const pcr_kvt_stored_t *ev, uint64_t now)
{
    if (p == NULL || p->kvt == NULL || backend < 0 || (size_t)backend >= p->n)
        return PCR_ERR_INVAL;
    return pcr_kvtable_stored(p->kvt, (unsigned)backend, ev, now);
}

size_t pcr_policy_kv_removed(pcr_policy_t *p, int backend, const uint64_t *hashes, size_t n,
                             pcr_kvt_medium_t medium)
{
    if (p == NULL || p->kvt == NULL || backend < 0 || (size_t)backend >= p->n)
        return 0;
    return pcr_kvtable_removed(p->kvt, (unsigned)backend, hashes, n, medium);
}

void pcr_policy_kv_clear(pcr_policy_t *p, int backend)
{
    if (p != NULL && p->kvt != NULL && backend >= 0 && (size_t)backend < p->n)
        pcr_kvtable_clear(p->kvt, (unsigned)backend);
}

const pcr_kvtable_t *pcr_policy_kvtable(const pcr_policy_t *p) { return p ? p->kvt : NULL; }
