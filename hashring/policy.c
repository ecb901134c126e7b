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
    o->max_prefix_bytes = 131072;
    o->index_max_bytes = (size_t)256 << 20;
    o->load_factor = 1.25;
    o->load_weight = 0.25;
    o->zone_penalty = 2048;
    o->zone = NULL;
    o->vnodes = 160;
    o->unavailable_keep = 300000000; /* 300 s in microseconds */
}

static const pcr_lb_ops_t *ops_of(pcr_policy_kind_t kind)
{
    switch (kind) {
    case PCR_POLICY_ROUND_ROBIN:     return &pcr_lb_round_robin;
    case PCR_POLICY_LEAST_LOADED:    return &pcr_lb_least_loaded;
    case PCR_POLICY_CONSISTENT_HASH: return &pcr_lb_consistent_hash;
    case PCR_POLICY_CACHE_AWARE:     return &pcr_lb_cache_aware;
    }
    return NULL;
}

static void expire_unavailable(pcr_policy_t *p, uint64_t now);

static char *dup_str(const char *s)
{
    size_t n = strlen(s != NULL ? s : "");
    char *d = malloc(n + 1);
    if (d != NULL)
        memcpy(d, s != NULL ? s : "", n + 1);
    return d;
}

static int opts_valid(const pcr_policy_opts_t *o, size_t n)
{
    return o != NULL && ops_of(o->kind) != NULL && n <= PCR_INDEX_MAX_BACKENDS &&
           o->block_bytes >= 1 && o->max_prefix_bytes >= 1 &&
           pcr_prefix_max_blocks(o->block_bytes, o->max_prefix_bytes) <= UINT32_MAX &&
           o->load_factor >= 1.0 && o->load_weight >= 0 && o->zone_penalty >= 0 &&
           o->vnodes >= 1;
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
    p->max_blocks = pcr_prefix_max_blocks(opts->block_bytes, opts->max_prefix_bytes);
    p->zone = dup_str(opts->zone);
    p->o.zone = p->zone;
    size_t alloc = n ? n : 1; /* no backend yet: they join later (pcr_policy_backend_set) */
    p->be = calloc(alloc, sizeof(*p->be));
    p->matched = calloc(alloc, sizeof(*p->matched));
    p->load = calloc(alloc, sizeof(*p->load));
    p->usable = calloc(alloc, sizeof(*p->usable));
    names = calloc(alloc, sizeof(*names));
    weights = calloc(alloc, sizeof(*weights));
    if (p->zone == NULL || p->be == NULL || p->matched == NULL || p->load == NULL ||
        p->usable == NULL || names == NULL || weights == NULL)
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
    }
    if (n > 0 && (opts->kind == PCR_POLICY_CONSISTENT_HASH || opts->kind == PCR_POLICY_CACHE_AWARE)) {
        p->ring = pcr_ring_new(names, weights, n, opts->vnodes);
        if (p->ring == NULL)
            goto fail;
    }
    if (opts->kind == PCR_POLICY_CACHE_AWARE) {
        pcr_index_opts_t io = {.nbackends = alloc, .max_bytes = opts->index_max_bytes};
        p->index = pcr_index_new(&io);
        if (p->index == NULL)
            goto fail;
        for (size_t b = 0; b < n; b++)
            if (backends[b].capacity_blocks != 0)
                pcr_index_set_capacity(p->index, (unsigned)b, backends[b].capacity_blocks);
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
    if (be == NULL || matched == NULL || load == NULL || usable == NULL)
        return PCR_ERR_NOMEM;
    if (p->index != NULL && pcr_index_grow(p->index, n) != 0)
        return PCR_ERR_NOMEM;
    for (size_t b = p->n; b < n; b++)
        p->be[b] = (pcr_pbackend_t){NULL, NULL, 0, 0, 0};
    p->n = n;
    return 0;
}

int pcr_policy_backend_set(pcr_policy_t *p, int id, const pcr_backend_desc_t *d)
{
    if (p == NULL || d == NULL || d->name == NULL || d->weight == 0 || id < 0 ||
        (size_t)id > p->n)
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
        pcr_index_remove_backend(p->index, (unsigned)id);
    pcr_pbackend_t old = *b;
    *b = (pcr_pbackend_t){name, zone, d->weight, p->zone[0] == '\0' || strcmp(z, p->zone) == 0,
                          old.name != NULL && strcmp(old.name, d->name) == 0 ? old.down_since : 0};
    if (old.down_since != 0 && b->down_since == 0)
        p->ndown--;
    rc = ring_rebuild(p);
    if (rc != 0) {
        free(name);
        free(zone);
        *b = old;
        return rc;
    }
    free(old.name);
    free(old.zone);
    if (p->index != NULL)
        pcr_index_set_capacity(p->index, (unsigned)id,
                               d->capacity_blocks ? d->capacity_blocks : PCR_INDEX_UNLIMITED);
    return 0;
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
    if (p->index != NULL)
        pcr_index_remove_backend(p->index, (unsigned)id);
    return 0;
}

int pcr_policy_tune(pcr_policy_t *p, const pcr_policy_opts_t *o)
{
    if (p == NULL || !opts_valid(o, 0))
        return PCR_ERR_INVAL;
    if (o->kind != p->o.kind || o->block_bytes != p->o.block_bytes ||
        o->max_prefix_bytes != p->o.max_prefix_bytes)
        return PCR_ERR_INVAL; /* keys, index or ring would mean something else */
    char *zone = dup_str(o->zone);
    if (zone == NULL)
        return PCR_ERR_NOMEM;
    unsigned old_vnodes = p->o.vnodes;
    p->o.load_factor = o->load_factor;
    p->o.load_weight = o->load_weight;
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
    if (o->index_max_bytes != p->o.index_max_bytes) {
        p->o.index_max_bytes = o->index_max_bytes;
        pcr_index_set_max_bytes(p->index, o->index_max_bytes);
    }
    return 0;
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
    pcr_ring_free(p->ring);
    pcr_index_free(p->index);
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
    out->total_blocks = key != NULL ? (uint32_t)key->nblocks : 0;
    out->uncached_prefill = key != NULL ? key->prompt_tokens : 0;
    p->ops->decide(p, key, loads, now, out);
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
                pcr_index_remove_backend(p->index, (unsigned)b);
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
    case PCR_BACKEND_RESTARTED:
        if (p->index != NULL)
            pcr_index_remove_backend(p->index, (unsigned)backend);
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
    pcr_index_remove_backend(p->index, (unsigned)backend);
}

int pcr_policy_set_capacity(pcr_policy_t *p, int backend, uint64_t capacity_blocks)
{
    if (p == NULL || backend < 0 || (size_t)backend >= p->n)
        return PCR_ERR_INVAL;
    if (p->index == NULL)
        return 0;
    return pcr_index_set_capacity(p->index, (unsigned)backend,
                                  capacity_blocks ? capacity_blocks : PCR_INDEX_UNLIMITED);
}

void pcr_policy_stats(const pcr_policy_t *p, pcr_policy_stats_t *out)
{
    if (out == NULL)
        return;
    out->index_bytes = p != NULL ? pcr_index_bytes(p->index) : 0;
    out->index_nodes = p != NULL ? pcr_index_nodes(p->index) : 0;
    out->index_evictions = p != NULL ? pcr_index_evictions(p->index) : 0;
}

uint64_t pcr_policy_backend_blocks(const pcr_policy_t *p, int backend)
{
    if (p == NULL || backend < 0 || (size_t)backend >= p->n)
        return 0;
    return pcr_index_backend_blocks(p->index, (unsigned)backend);
}
