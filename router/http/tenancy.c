/* router/http/tenancy.c: owns who a request is and when it may go to the pool: the API key
 * (auth), the tenant and its priority, the tenant's limits, the pool's saturation, the flow
 * queue a request waits in while the pool is saturated, and a session's pod. The decisions are
 * the library's (pcr/tenancy.h, pcr/flowq.h); this file reads headers and counters and answers.
 *
 *   identify: API key (Authorization: Bearer K, x-api-key: K) -> tenant, else the tenant
 *             header (a trusted gateway in front), else "default"; the objective header may
 *             name a tenant whose priority the request takes (its pod_priority too: what
 *             the pods are told, proxy_req.c). A missing or unknown key: 401.
 *   admit:    max_concurrent, requests_per_s, tokens_per_min (process-wide, atomics) -> 429;
 *             saturated pool: a sheddable request (priority < 0) gets 429 at once without flow
 *             control; with it, the request waits in the worker's flow queue, released by
 *             priority band and token fairness as pods free up, or 429 past its TTL.
 *
 * An API key is hashed with SHA-256 (OpenSSL EVP) and the digest compared with every configured
 * digest in constant time (CRYPTO_memcmp, no early exit), so the time taken does not depend on
 * which key matched or how much of one did. The key is never copied out of the request's
 * headers: not into a log, a metric or an error message. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <xxhash.h>

#include "exchange_int.h"
#include "log.h"
#include "tenants.h"
#include "pcr/tenancy.h"

/* A session stays on its pod this long after its last request. */
#define SESSION_TTL_S 600
/* Sessions the process remembers (two ways per set). */
#define SESSION_SETS 65536

/* ---- identify -------------------------------------------------------------------------- */

/* The value of the request's only field `name` (lower case): 1 and *v, *vlen; 0 when absent;
 * -1 when it came more than once. */
static int header_one(const pcr_exchange_t *ex, const char *name, const char **v, size_t *vlen)
{
    size_t nlen = strlen(name);
    int found = 0;
    for (size_t i = 0; i + 1 < ex->nh; i += 2) {
        if (ex->hf[i].len != nlen || strncasecmp(ex->hbuf + ex->hf[i].off, name, nlen) != 0)
            continue;
        if (found)
            return -1;
        found = 1;
        *v = ex->hbuf + ex->hf[i + 1].off;
        *vlen = ex->hf[i + 1].len;
    }
    return found;
}

static void trim(const char **v, size_t *n)
{
    while (*n > 0 && (**v == ' ' || **v == '\t'))
        (*v)++, (*n)--;
    while (*n > 0 && ((*v)[*n - 1] == ' ' || (*v)[*n - 1] == '\t'))
        (*n)--;
}

/* The key of the request: 1 and *key, *klen; 0 when it brings none; -1 when malformed (not
 * "Bearer KEY", an empty key, a field twice, two different keys). */
static int api_key(const pcr_exchange_t *ex, const char **key, size_t *klen)
{
    const char *a = NULL, *x = NULL;
    size_t alen = 0, xlen = 0;
    int ha = header_one(ex, "authorization", &a, &alen);
    int hx = header_one(ex, "x-api-key", &x, &xlen);
    if (ha < 0 || hx < 0)
        return -1;
    if (ha) {
        trim(&a, &alen);
        if (alen < 7 || strncasecmp(a, "bearer ", 7) != 0)
            return -1;
        a += 7, alen -= 7;
        trim(&a, &alen);
        if (alen == 0 || memchr(a, ' ', alen) != NULL)
            return -1;
    }
    if (hx) {
        trim(&x, &xlen);
        if (xlen == 0)
            return -1;
    }
    if (ha && hx && (alen != xlen || CRYPTO_memcmp(a, x, alen) != 0))
        return -1;
    if (!ha && !hx)
        return 0;
    *key = ha ? a : x;
    *klen = ha ? alen : xlen;
    return 1;
}

/* The tenant index of `key` among cfg's keys, or -1. Every configured digest is compared,
 * whichever matches. */
static int key_tenant(const pcr_config_t *cfg, const char *key, size_t klen)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_Digest(key, klen, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != 32)
        return -1;
    int found = -1;
    for (size_t i = 0; i < cfg->auth.nkeys; i++) {
        int eq = CRYPTO_memcmp(md, cfg->auth.keys[i].sha256, 32) == 0;
        /* No branch on the secret's comparison: the index is selected arithmetically. */
        int mask = -eq;
        found = (found & ~mask) | ((int)cfg->auth.keys[i].tenant_index & mask);
    }
    OPENSSL_cleanse(md, sizeof md);
    return found;
}

static int tenant_named(const pcr_config_t *cfg, const char *v, size_t n)
{
    for (size_t i = 0; i < cfg->ntenants; i++)
        if (strlen(cfg->tenants[i].name) == n && memcmp(cfg->tenants[i].name, v, n) == 0)
            return (int)i;
    return -1;
}

static void count_reject(pcr_exchange_t *ex, pcr_reject_t why)
{
    PCR_INC(ex->w->metrics.tenants[ex->tslot].rejected[why]);
}

int pcr_tenancy_identify(pcr_exchange_t *ex)
{
    const pcr_config_t *cfg = ex->w->cfg;
    if (ex->identified)
        return 0;
    int t = 0;
    if (cfg->auth.enabled) {
        const char *key = NULL;
        size_t klen = 0;
        int has = api_key(ex, &key, &klen);
        t = has > 0 ? key_tenant(cfg, key, klen) : -1;
        if (t < 0) {
            static const char realm[] = "Bearer realm=\"pcrouter\"";
            pcr_hdr_t h = {"www-authenticate", 16, realm, sizeof realm - 1};
            ex->tslot = cfg->tenants[0].slot;
            count_reject(ex, PCR_REJECT_AUTH);
            pcr_exchange_error_with(ex, 401, "invalid_request_error", "invalid_api_key", &h, 1,
                has == 0 ? "no API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
                : has < 0 ? "malformed API key header: send 'Authorization: Bearer KEY' or "
                            "'x-api-key: KEY', once"
                          : "incorrect API key");
            return -1;
        }
    } else if (cfg->routing.tenant_header[0] != '\0') {
        const char *v;
        size_t n;
        if (header_one(ex, cfg->routing.tenant_header, &v, &n) > 0) {
            trim(&v, &n);
            t = tenant_named(cfg, v, n);
            if (t < 0)
                t = 0;
        }
    }
    ex->tslot = ex->qslot = cfg->tenants[t].slot;
    ex->priority = cfg->tenants[t].priority;
    ex->pod_priority = cfg->tenants[t].pod_priority;
    ex->has_pod_priority = cfg->tenants[t].has_pod_priority;
    if (cfg->routing.objective_header[0] != '\0') {
        const char *v;
        size_t n;
        if (header_one(ex, cfg->routing.objective_header, &v, &n) > 0) {
            trim(&v, &n);
            int o = tenant_named(cfg, v, n);
            if (o >= 0) {
                ex->priority = cfg->tenants[o].priority;
                ex->qslot = cfg->tenants[o].slot;
                ex->pod_priority = cfg->tenants[o].pod_priority;
                ex->has_pod_priority = cfg->tenants[o].has_pod_priority;
            }
        }
    }
    if (cfg->routing.session_header[0] != '\0') {
        const char *v;
        size_t n;
        if (header_one(ex, cfg->routing.session_header, &v, &n) > 0) {
            trim(&v, &n);
            if (n > 0)
                ex->session = XXH3_64bits(v, n) | 1;
        }
    }
    ex->identified = 1;
    return 0;
}

/* ---- limits ---------------------------------------------------------------------------- */

static const pcr_tenant_conf_t *tenant_conf(const pcr_config_t *cfg, unsigned slot)
{
    for (size_t i = 0; i < cfg->ntenants; i++)
        if (cfg->tenants[i].slot == slot)
            return &cfg->tenants[i];
    return &cfg->tenants[0];
}

static void reject(pcr_exchange_t *ex, pcr_reject_t why, uint64_t retry_us, const char *fmt,
                   const char *what)
{
    char secs[24];
    uint64_t s = (retry_us + 999999) / 1000000;
    snprintf(secs, sizeof secs, "%llu", (unsigned long long)(s ? s : 1));
    const char *reason = pcr_reject_names[why];
    pcr_hdr_t h[2] = {{"retry-after", 11, secs, strlen(secs)},
                      {"x-pcrouter-reject", 17, reason, strlen(reason)}};
    count_reject(ex, why);
    pcr_exchange_error_with(ex, 429, "rate_limit_exceeded", reason, h, 2, fmt, what);
}

/* A GCRA step on an atomic state word: 1 when `cost` passes (and is charged), else 0 with
 * *retry. */
static int gcra(uint64_t *tat, uint64_t now, uint64_t cost, uint64_t tolerance, uint64_t *retry,
                int charge)
{
    for (int tries = 0; tries < 64; tries++) {
        uint64_t old = PCR_LOAD(*tat), next;
        if (!pcr_gcra_take(old, now, cost, tolerance, &next, retry))
            return 0;
        if (!charge || __atomic_compare_exchange_n(tat, &old, next, 0, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED))
            return 1;
    }
    return 1; /* contended past reason: let it pass rather than spin */
}

/* The tenant's limits: 0, or -1 when answered with 429. Concurrency is taken here and given
 * back when the request ends (pcr_exchange_to). */
static int limits(pcr_exchange_t *ex, const pcr_tenant_conf_t *t)
{
    pcr_tenant_state_t *st = &ex->w->srv->tenants[ex->tslot];
    uint64_t now = pcr_now_us(), retry = 0;
    if (t->max_concurrent > 0) {
        uint32_t was = __atomic_fetch_add(&st->concurrent, 1, __ATOMIC_RELAXED);
        if (was >= t->max_concurrent) {
            PCR_SUB(st->concurrent, 1);
            reject(ex, PCR_REJECT_CONCURRENCY, 1000000,
                   "tenant '%s' has max_concurrent requests in flight", t->name);
            return -1;
        }
    } else {
        __atomic_fetch_add(&st->concurrent, 1, __ATOMIC_RELAXED);
    }
    ex->admitted = 1;
    /* Tolerances: a second's requests, a minute's tokens (the buckets' sizes). */
    uint64_t rq_cost = t->requests_per_s > 0 ? (uint64_t)(1e6 / t->requests_per_s) : 0;
    uint64_t rq_tol = rq_cost > 1000000 ? rq_cost : 1000000;
    /* A request larger than a bucket costs a bucket (pcr_gcra_take): the cap keeps the product
     * in range for a max_tokens of any size. */
    uint64_t tokens = ex->tokens < (1ull << 32) ? ex->tokens : (1ull << 32);
    uint64_t tk_cost = t->tokens_per_min > 0 ? tokens * 60000000ull / t->tokens_per_min : 0;
    int pass_rq = t->requests_per_s <= 0 || gcra(&st->tat_requests, now, rq_cost, rq_tol, &retry, 0);
    if (!pass_rq) {
        reject(ex, PCR_REJECT_RATE, retry, "tenant '%s' is over its requests_per_s", t->name);
        return -1;
    }
    if (t->tokens_per_min > 0 && !gcra(&st->tat_tokens, now, tk_cost, 60000000, &retry, 1)) {
        reject(ex, PCR_REJECT_TOKENS, retry, "tenant '%s' is over its tokens_per_min", t->name);
        return -1;
    }
    if (t->requests_per_s > 0)
        gcra(&st->tat_requests, now, rq_cost, rq_tol, &retry, 1);
    return 0;
}

/* ---- saturation and the flow queue ------------------------------------------------------ */

static void sat_opts(const pcr_config_t *cfg, pcr_sat_opts_t *o)
{
    o->queue_threshold = cfg->flow_control.queue_threshold;
    o->kv_threshold = cfg->flow_control.kv_threshold;
    o->inflight_threshold = cfg->flow_control.inflight_per_pod;
    o->prefill_threshold = (double)cfg->flow_control.prefill_per_pod;
}

static void flow_tenants(const pcr_config_t *cfg, pcr_flow_tenant_t *t, pcr_flowq_opts_t *o)
{
    for (unsigned i = 0; i < PCR_MAX_TENANTS; i++)
        t[i] = (pcr_flow_tenant_t){0, 1};
    for (size_t i = 0; i < cfg->ntenants; i++)
        t[cfg->tenants[i].slot] = (pcr_flow_tenant_t){cfg->tenants[i].priority,
                                                      cfg->tenants[i].weight};
    *o = (pcr_flowq_opts_t){
        .max_requests = cfg->flow_control.max_queue_requests,
        .max_bytes = cfg->flow_control.max_queue_bytes,
        .ttl = (uint64_t)cfg->flow_control.ttl_ms * 1000u,
        .output_weight = cfg->flow_control.output_weight,
    };
}

static pcr_exchange_t *of_entry(pcr_flowq_entry_t *e)
{
    return (pcr_exchange_t *)((char *)e - offsetof(pcr_exchange_t, fentry));
}

/* The pool's saturation as `ex` sees it. With pod priorities the pods serve it before the
 * requests of a worse pod priority, preempting their prefill: that prefill fills no pod for
 * it (pcr_pod_preemptible), so an interactive request goes while batch prompts fill the
 * pods, and they wait for it there. */
static double saturation_for(const pcr_exchange_t *ex)
{
    const pcr_config_t *cfg = ex->w->cfg;
    if (!cfg->pod_priorities)
        return pcr_backends_saturation(ex->w->srv, cfg);
    return pcr_backends_saturation_for(ex->w->srv, cfg, pcr_tenancy_passes(ex));
}

uint64_t pcr_tenancy_passes(const pcr_exchange_t *ex)
{
    const pcr_config_t *cfg = ex->w->cfg;
    if (!cfg->pod_priorities)
        return 0;
    int prio[PCR_MAX_TENANTS];
    for (unsigned i = 0; i < PCR_MAX_TENANTS; i++)
        prio[i] = INT_MIN;   /* no tenant: nothing of it to pass */
    for (size_t i = 0; i < cfg->ntenants; i++)
        prio[cfg->tenants[i].slot] = cfg->tenants[i].has_pod_priority
                                         ? cfg->tenants[i].pod_priority : 0; /* vLLM's default */
    return pcr_pod_preemptible(prio, PCR_MAX_TENANTS, ex->has_pod_priority ? ex->pod_priority : 0);
}

double pcr_tenancy_fair(const pcr_exchange_t *ex)
{
    return pcr_flowq_counter(ex->w->flowq, ex->qslot);
}

/* While something waits the worker looks at its queue every flow_control.tick_ms: TTLs and
 * the room other workers' requests free. Its own requests wake it at once when they free room
 * (a first token, the end of a request: exchange.c). */
static void flow_arm(pcr_worker_t *w)
{
    unsigned ms = w->cfg->flow_control.tick_ms ? w->cfg->flow_control.tick_ms : 5;
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    if (!evtimer_pending(w->flow_ev, NULL))
        evtimer_add(w->flow_ev, &tv);
}

/* Expired requests get their 429; then, while the pool has room, the next one goes. */
static void on_flow(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    pcr_worker_t *w = arg;
    const pcr_config_t *cfg = w->cfg;
    if (w->flowq == NULL)
        return;
    if (w->flow_cfg != cfg) {
        pcr_flow_tenant_t t[PCR_MAX_TENANTS];
        pcr_flowq_opts_t o;
        flow_tenants(cfg, t, &o);
        pcr_flowq_tune(w->flowq, &o, t, PCR_MAX_TENANTS);
        w->flow_cfg = cfg;
    }
    uint64_t now = pcr_now_us();
    pcr_flowq_entry_t *e;
    while ((e = pcr_flowq_expired(w->flowq, now)) != NULL) {
        pcr_exchange_t *ex = of_entry(e);
        PCR_SUB(w->metrics.tenants[ex->tslot].waiting, 1);
        reject(ex, PCR_REJECT_TTL, 1000000, "%s",
               "the pool stayed saturated for flow_control.ttl_ms while the request waited");
    }
    /* Without flow control (a reload turned it off) everything waiting goes. */
    while ((e = pcr_flowq_peek(w->flowq)) != NULL &&
           (!cfg->flow_control.enabled || saturation_for(of_entry(e)) < 1)) {
        pcr_flowq_remove(w->flowq, e);
        pcr_exchange_t *ex = of_entry(e);
        pcr_tenant_counts_t *tc = &w->metrics.tenants[ex->tslot];
        uint64_t waited = now - ex->t_queued;
        PCR_SUB(tc->waiting, 1);
        PCR_INC(tc->waited);
        PCR_ADD(tc->wait_us, waited);
        ex->t_parse_ns += waited * 1000u; /* the decision's phases leave the wait out */
        pcr_flowq_served(w->flowq, ex->qslot, ex->tokens, 0);
        w->flow_go(ex);
    }
    if (pcr_flowq_total(w->flowq) > 0)
        flow_arm(w);
}

/* The worker's queue, made at its first use (on the worker's thread). */
static int flow_init(pcr_worker_t *w)
{
    if (w->flowq != NULL)
        return 0;
    pcr_flow_tenant_t t[PCR_MAX_TENANTS];
    pcr_flowq_opts_t o;
    flow_tenants(w->cfg, t, &o);
    w->flowq = pcr_flowq_new(&o, t, PCR_MAX_TENANTS);
    w->flow_ev = w->flowq != NULL ? evtimer_new(w->base, on_flow, w) : NULL;
    if (w->flow_ev == NULL) {
        pcr_flowq_free(w->flowq);
        w->flowq = NULL;
        return PCR_ERR_NOMEM;
    }
    w->flow_cfg = w->cfg;
    return 0;
}

void pcr_tenancy_worker_free(pcr_worker_t *w)
{
    if (w->flow_ev != NULL)
        event_free(w->flow_ev);
    w->flow_ev = NULL;
    pcr_flowq_free(w->flowq);
    w->flowq = NULL;
}

int pcr_tenancy_admit(pcr_exchange_t *ex, int (*go)(pcr_exchange_t *ex))
{
    pcr_worker_t *w = ex->w;
    const pcr_config_t *cfg = w->cfg;
    const pcr_tenant_conf_t *t = tenant_conf(cfg, ex->tslot);
    if (ex->has_key)
        ex->tokens = ex->key.prompt_tokens + ex->req.max_tokens;
    if (limits(ex, t) < 0)
        return -1;
    pcr_tenant_counts_t *tc = &w->metrics.tenants[ex->tslot];
    int flow = cfg->flow_control.enabled;
    int waiting = w->flowq != NULL && pcr_flowq_total(w->flowq) > 0;
    double sat = (flow || ex->priority < 0) ? saturation_for(ex) : 0;
    if (!flow && ex->priority < 0 && sat >= 1) {
        reject(ex, PCR_REJECT_SHED, 1000000,
               "tenant '%s' is sheddable (priority < 0) and the pool is saturated", t->name);
        return -1;
    }
    PCR_INC(tc->requests);
    PCR_ADD(tc->prompt_tokens, ex->has_key ? ex->key.prompt_tokens : 0);
    /* Nothing waits and the pool has room: straight on (the prefill is charged to the
     * tenant's fairness counter all the same, so a later wait sees it). */
    if (!flow || (sat < 1 && !waiting)) {
        if (w->flowq != NULL)
            pcr_flowq_served(w->flowq, ex->qslot, ex->tokens, 0);
        return 0;
    }
    if (flow_init(w) < 0) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return -1;
    }
    w->flow_go = go;
    ex->t_queued = pcr_now_us();
    int rc = pcr_flowq_push(w->flowq, &ex->fentry, ex->qslot, ex->body_counted, ex->t_queued);
    if (rc < 0) {
        reject(ex, PCR_REJECT_QUEUE_FULL, 1000000,
               "tenant '%s' has flow_control.max_queue_requests (or _bytes) waiting", t->name);
        return -1;
    }
    PCR_INC(tc->waiting);
    /* The first to wait, or one with room of its own (pod priorities): see at once whether
     * it may go. */
    if (!waiting || sat < 1)
        event_active(w->flow_ev, EV_TIMEOUT, 1);
    flow_arm(w);
    return 1;
}

void pcr_tenancy_served(pcr_exchange_t *ex, uint64_t output_tokens)
{
    pcr_worker_t *w = ex->w;
    PCR_ADD(w->metrics.tenants[ex->tslot].output_tokens, output_tokens);
    if (w->flowq != NULL && output_tokens > 0)
        pcr_flowq_served(w->flowq, ex->qslot, 0, output_tokens);
}

/* ---- sessions -------------------------------------------------------------------------- */

int pcr_tenancy_session_pod(pcr_exchange_t *ex, const pcr_backend_load_t *loads, size_t n)
{
    pcr_server_t *srv = ex->w->srv;
    if (ex->session == 0 && ex->has_key && ex->req.has_user)
        ex->session = ex->req.user_hash | 1;
    if (ex->session == 0 || srv->session_words == NULL)
        return -1;
    uint64_t now_s = pcr_now_us() / 1000000u;
    size_t at = pcr_affinity_set(ex->session, srv->session_words_n);
    int be = -1;
    for (int i = 0; i < PCR_AFFINITY_WAYS && be < 0; i++)
        be = pcr_affinity_backend(PCR_LOAD(srv->session_words[at + i]), ex->session, now_s,
                                  SESSION_TTL_S);
    if (be < 0 || (size_t)be >= n || !loads[be].usable)
        return -1;
    double sum = 0;
    size_t usable = 0;
    for (size_t i = 0; i < n; i++)
        if (loads[i].usable) {
            sum += loads[i].inflight;
            usable++;
        }
    pcr_sat_opts_t o;
    sat_opts(ex->w->cfg, &o);
    pcr_backend_t *b = pcr_backend_at(srv, (size_t)be);
    pcr_sat_pod_t p = {1, loads[be].inflight, loads[be].pod_waiting,
                       b != NULL && PCR_LOAD(b->pod_kv_usage_known)
                           ? PCR_LOAD(b->pod_kv_usage_ppm) / 1e6 : -1, loads[be].queued_prefill};
    double mean = usable ? sum / (double)usable : 0;
    if (!pcr_affinity_keep(loads[be].inflight, mean, ex->w->cfg->routing.load_factor,
                           pcr_saturation_pod(&p, &o)))
        return -1;
    return be;
}

void pcr_tenancy_session_went(pcr_exchange_t *ex, int backend)
{
    pcr_server_t *srv = ex->w->srv;
    if (ex->session == 0 || srv->session_words == NULL || backend < 0 || backend >= 4095)
        return;
    uint64_t now_s = pcr_now_us() / 1000000u;
    size_t at = pcr_affinity_set(ex->session, srv->session_words_n);
    uint64_t ways[PCR_AFFINITY_WAYS];
    for (int i = 0; i < PCR_AFFINITY_WAYS; i++)
        ways[i] = PCR_LOAD(srv->session_words[at + i]);
    int v = pcr_affinity_victim(ways, ex->session, now_s, SESSION_TTL_S);
    uint64_t word = pcr_affinity_word(ex->session, backend, now_s);
    if (ways[v] != word)
        PCR_STORE(srv->session_words[at + v], word);
}

/* ---- slots ----------------------------------------------------------------------------- */

void pcr_tenancy_assign(pcr_server_t *srv, pcr_config_t *cfg)
{
    if (srv->session_words == NULL) {
        srv->session_words = calloc((size_t)SESSION_SETS * PCR_AFFINITY_WAYS, sizeof(uint64_t));
        srv->session_words_n = srv->session_words != NULL ? SESSION_SETS : 0;
    }
    for (size_t i = 0; i < cfg->ntenants; i++) {
        const char *name = cfg->tenants[i].name;
        unsigned slot = 0, free_slot = 0;
        for (unsigned s = 0; s < PCR_MAX_TENANTS; s++) {
            if (strcmp(srv->tenants[s].name, name) == 0) {
                slot = s;
                goto found;
            }
            if (free_slot == 0 && s > 0 && srv->tenants[s].name[0] == '\0')
                free_slot = s;
        }
        if (i == 0) {
            slot = 0; /* "default" */
        } else if (free_slot != 0) {
            slot = free_slot;
        } else {
            pcr_log_warn("tenant '%s': every one of the %d tenant slots was used by an earlier "
                         "config; it shares the limits of \"default\"", name, PCR_MAX_TENANTS);
            slot = 0;
        }
        snprintf(srv->tenants[slot].name, sizeof srv->tenants[slot].name, "%s", name);
found:
        cfg->tenants[i].slot = slot;
    }
}
