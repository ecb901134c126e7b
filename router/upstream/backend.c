/* router/upstream/backend.c: owns the backends' registry (backend.h): the slots they live in and
 * their lifetime, the up/down state that active health checks move, passive outlier detection
 * (ejection), and the model lists the pods report. It sends nothing to a pod itself: the control
 * thread's checks (control.c: health.c, scrape.c, models.c) are started and stopped through the
 * hooks it is given, so a backend added by a reload or by discovery gets them too.
 *
 * A backend goes down after `fall` failed checks in a row and comes back after `rise`
 * successful ones. A backend that is down keeps its entries in the index: a pod unreachable for
 * a while still holds its KV cache; only a restart empties it, and the scrape sees that.
 * Outcomes of real requests come from the workers, hence the atomics: consecutive errors eject
 * a backend for a back-off that grows with repeated ejections. An ejected pod is probed (a
 * health check, so one that cannot be reached is soon marked down). One ejected because it
 * refused connections comes back as soon as a probe succeeds, so a pod that restarts in a few
 * milliseconds costs a fraction of a second; one ejected for 5xx or resets serves its ejection
 * (it may answer /health while failing requests), and is back in rotation when the ejection
 * ends. */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <xxhash.h>

#include "backend.h"
#include "bus.h"
#include "dns.h"
#include "log.h"
#include "pcr/tenancy.h"
#include "tls.h"

/* ---- slots and lifetime -------------------------------------------------------------- */

pcr_backend_t *pcr_backend_at(const pcr_server_t *srv, size_t id)
{
    if (id >= PCR_MAX_BACKENDS)
        return NULL;
    return __atomic_load_n(&srv->backends[id], __ATOMIC_ACQUIRE);
}

size_t pcr_backend_slots(const pcr_server_t *srv) { return PCR_LOAD(((pcr_server_t *)srv)->nslots); }

void pcr_backend_ref(pcr_backend_t *be) { PCR_ADD(be->refs, 1); }
/* Release: what the holder did with the backend happens before the control thread, seeing no
 * reference left (an acquire load), frees it. */
void pcr_backend_unref(pcr_backend_t *be) { __atomic_fetch_sub(&be->refs, 1, __ATOMIC_RELEASE); }

uint64_t pcr_backend_settled_before(const pcr_backend_t *be)
{
    uint64_t t = UINT64_MAX;
    for (unsigned i = 0; i < be->npending; i++) {
        uint64_t s = PCR_LOAD(((pcr_backend_t *)be)->pending[i].since);
        t = s < t ? s : t;
    }
    return t;
}

void pcr_backend_desc(const pcr_backend_t *be, pcr_backend_desc_t *d)
{
    const pcr_config_t *cfg = be->srv->cfg;
    d->name = be->conf.name;
    d->zone = be->conf.zone;
    d->weight = be->conf.weight;
    /* Capacity in tokens -> blocks (PCR_BYTES_PER_TOKEN). What the pod reports
     * (vllm:cache_config_info) replaces the configured guess. */
    uint64_t tokens = PCR_LOAD(((pcr_backend_t *)be)->pod_cache_tokens);
    if (tokens == 0)
        tokens = be->conf.capacity_tokens;
    uint64_t blocks = tokens * PCR_BYTES_PER_TOKEN / cfg->routing.block_bytes;
    d->capacity_blocks = blocks ? blocks : 1;
}

pcr_backend_t *pcr_backend_find(pcr_server_t *srv, const char *name)
{
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be != NULL && strcmp(be->conf.name, name) == 0)
            return be;
    }
    return NULL;
}

static void backend_free(pcr_backend_t *be);

static pcr_backend_t *backend_add(pcr_server_t *srv, const pcr_backend_conf_t *bc,
                                  const struct sockaddr *sa, socklen_t salen, const char *dns,
                                  unsigned dport);

pcr_backend_t *pcr_backend_add(pcr_server_t *srv, const pcr_backend_conf_t *bc,
                               const struct sockaddr *sa, socklen_t salen)
{
    return backend_add(srv, bc, sa, salen, NULL, 0);
}

pcr_backend_t *pcr_backend_add_discovered(pcr_server_t *srv, const pcr_backend_conf_t *bc,
                                          const struct sockaddr *sa, socklen_t salen,
                                          const char *dns, unsigned port)
{
    return backend_add(srv, bc, sa, salen, dns, port);
}

static pcr_backend_t *backend_add(pcr_server_t *srv, const pcr_backend_conf_t *bc,
                                  const struct sockaddr *sa, socklen_t salen, const char *dns,
                                  unsigned dport)
{
    size_t id = 0;
    while (id < PCR_MAX_BACKENDS && (srv->slot_taken[id]))
        id++;
    if (id >= PCR_MAX_BACKENDS) {
        pcr_log_error("backend %s: no free slot (at most %d backends)", bc->name, PCR_MAX_BACKENDS);
        return NULL;
    }
    pcr_backend_t *be = calloc(1, sizeof(*be));
    if (be == NULL || pcr_backend_conf_copy(&be->conf, bc) != 0) {
        free(be);
        return NULL;
    }
    const pcr_config_t *cfg = srv->cfg;
    be->srv = srv;
    be->id = (int)id;
    if (dns != NULL) {
        be->discovered = 1;
        be->disc_dns = strdup(dns);
        be->disc_port = dport;
        if (be->disc_dns == NULL) {
            backend_free(be);
            return NULL;
        }
    }
    be->up = 1; /* optimistic: the first check or request says otherwise */
    be->max_connections = bc->max_connections ? bc->max_connections : cfg->upstream.max_connections;
    memcpy(&be->addr, sa, salen);
    be->addrlen = salen;
    size_t hl = strlen(bc->host) + 16;
    be->host_header = malloc(hl);
    be->npending = srv->nworkers ? srv->nworkers : 1;
    be->pending = calloc(be->npending, sizeof(*be->pending));
    if (be->host_header == NULL || be->pending == NULL) {
        backend_free(be);
        return NULL;
    }
    for (unsigned i = 0; i < be->npending; i++) {
        TAILQ_INIT(&be->pending[i].list);
        be->pending[i].since = UINT64_MAX;
    }
    if (strchr(bc->host, ':'))
        snprintf(be->host_header, hl, "[%s]:%u", bc->host, bc->port);
    else
        snprintf(be->host_header, hl, "%s:%u", bc->host, bc->port);
    /* Its checks' connection and timer, before any thread can see it. */
    if (srv->backend_hooks != NULL && srv->backend_hooks->prepare(be) < 0) {
        backend_free(be);
        return NULL;
    }
    char terr[256];
    if (bc->tls.enabled && pcr_backend_tls_set(be, &bc->tls, terr, sizeof(terr)) < 0) {
        pcr_log_error("backend %s: TLS: %s", bc->name, terr);
        backend_free(be);
        return NULL;
    }
    pcr_backend_config_models(be, bc);
    srv->slot_taken[id] = 1;
    /* The policy replicas learn the slot before any worker can see the backend in it. */
    if (id >= pcr_backend_slots(srv))
        PCR_STORE(srv->nslots, id + 1);
    pcr_backend_desc_t d;
    pcr_backend_desc(be, &d);
    pcr_bus_backend_set(srv->bus, PCR_BUS_CONTROL, (int)id, &d);
    __atomic_store_n(&srv->backends[id], be, __ATOMIC_RELEASE);
    if (srv->backend_hooks != NULL)
        srv->backend_hooks->join(be);
    return be;
}

/* Empties the slot at once; the memory goes once nothing holds it (pcr_backends_collect). */
void pcr_backend_remove(pcr_backend_t *be)
{
    pcr_server_t *srv = be->srv;
    PCR_STORE(be->removed, 1);
    __atomic_store_n(&srv->backends[be->id], NULL, __ATOMIC_RELEASE);
    pcr_bus_backend_remove(srv->bus, PCR_BUS_CONTROL, be->id);
    if (srv->backend_hooks != NULL)
        srv->backend_hooks->leave(be);
    /* Release: a worker that reads the new epoch (acquire) reads the emptied slot too. */
    be->retired_epoch = __atomic_fetch_add(&srv->epoch, 1, __ATOMIC_RELEASE) + 1;
    LIST_INSERT_HEAD(&srv->retired, be, retired_link);
}

/* A TLS context swapped out by a reload: workers that read the old pointer during a callback
 * may still make an SSL from it until they pass the epoch (the SSL then holds its own
 * reference). */
struct pcr_tls_retired {
    SSL_CTX *ctx;
    uint64_t epoch;
    struct pcr_tls_retired *next;
};

static void tls_collect(pcr_backend_t *be, uint64_t seen)
{
    struct pcr_tls_retired **pp = &be->tls_retired;
    while (*pp != NULL) {
        struct pcr_tls_retired *r = *pp;
        if (r->epoch > seen) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        SSL_CTX_free(r->ctx);
        free(r);
    }
}

int pcr_backend_tls_set(pcr_backend_t *be, const pcr_upstream_tls_conf_t *t, char *err,
                        size_t errlen)
{
    if (t == NULL || !t->enabled)
        return 0;
    pcr_tls_client_opts_t o = {t->ca_file, t->cert, t->key, t->verify};
    SSL_CTX *ctx = pcr_tls_client_ctx_new(&o, err, errlen);
    char *name = strdup(t->server_name ? t->server_name : be->conf.host);
    struct pcr_tls_retired *r = calloc(1, sizeof(*r));
    if (ctx == NULL || name == NULL || r == NULL) {
        if (ctx != NULL)
            snprintf(err, errlen, "out of memory");
        SSL_CTX_free(ctx);
        free(name);
        free(r);
        return PCR_ERR_INVAL;
    }
    SSL_CTX *old = __atomic_exchange_n(&be->tls_ctx, ctx, __ATOMIC_ACQ_REL);
    /* The name and the verify flag are read with the context by workers: they change only
     * with a backend's first context (a server_name change comes as a replacement). */
    if (be->tls_name == NULL) {
        be->tls_name = name;
        be->tls_verify = t->verify;
    } else {
        free(name);
    }
    if (old == NULL) {
        free(r);
        return 0;
    }
    r->ctx = old;
    r->epoch = __atomic_fetch_add(&be->srv->epoch, 1, __ATOMIC_RELEASE) + 1;
    r->next = be->tls_retired;
    be->tls_retired = r;
    return 0;
}

SSL *pcr_backend_tls_ssl(pcr_backend_t *be)
{
    SSL_CTX *ctx = __atomic_load_n(&be->tls_ctx, __ATOMIC_ACQUIRE);
    return ctx != NULL ? pcr_tls_client_ssl_new(ctx, be->tls_name, be->tls_verify) : NULL;
}

void pcr_backends_collect(pcr_server_t *srv)
{
    uint64_t seen = UINT64_MAX;
    for (unsigned k = 0; k < srv->nworkers && srv->workers != NULL; k++) {
        pcr_worker_t *w = &srv->workers[k];
        /* Acquire, pairing with the worker's release stores: whatever it did with a retired
         * backend before it passed the epoch (or stopped) happens before the free below. */
        uint64_t e = __atomic_load_n(&w->stopped, __ATOMIC_ACQUIRE)
                         ? UINT64_MAX
                         : __atomic_load_n(&w->epoch_seen, __ATOMIC_ACQUIRE);
        if (e < seen)
            seen = e;
    }
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *live = pcr_backend_at(srv, i);
        if (live != NULL)
            tls_collect(live, seen);
    }
    pcr_backend_t *be = LIST_FIRST(&srv->retired), *next;
    for (; be != NULL; be = next) {
        next = LIST_NEXT(be, retired_link);
        if (be->retired_epoch > seen || __atomic_load_n(&be->refs, __ATOMIC_ACQUIRE) != 0 ||
            (srv->backend_hooks != NULL && srv->backend_hooks->busy(be)))
            continue;
        LIST_REMOVE(be, retired_link);
        srv->slot_taken[be->id] = 0;
        pcr_log_info("backend %s has drained and is gone", be->conf.name);
        backend_free(be);
    }
}

/* ---- health: up and down ------------------------------------------------------------- */

/* Moves `up` once, whichever thread saw the threshold crossed first. */
static void set_up(pcr_backend_t *be, int up)
{
    int want = !up;
    if (!__atomic_compare_exchange_n(&be->up, &want, up, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    if (up)
        pcr_log_info("backend %s is up", be->conf.name);
    else
        pcr_log_warn("backend %s is down after %u failed health checks", be->conf.name,
                     PCR_LOAD(be->consecutive_failures));
    pcr_bus_state(be->srv->bus, be->id, up ? PCR_BACKEND_AVAILABLE : PCR_BACKEND_UNAVAILABLE,
                  pcr_now_us());
}

void pcr_backend_check_result(pcr_backend_t *be, int ok)
{
    const pcr_health_conf_t *h = &be->srv->cfg->health;
    if (ok) {
        PCR_STORE(be->consecutive_failures, 0);
        unsigned n = PCR_ADD(be->consecutive_successes, 1) + 1;
        if (!PCR_LOAD(be->up) && n >= h->rise)
            set_up(be, 1);
    } else {
        PCR_STORE(be->consecutive_successes, 0);
        unsigned n = PCR_ADD(be->consecutive_failures, 1) + 1;
        if (PCR_LOAD(be->up) && n >= h->fall)
            set_up(be, 0);
    }
}

size_t pcr_backends_up(const pcr_server_t *srv)
{
    size_t n = 0;
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        n += be != NULL && PCR_LOAD(be->up) ? 1 : 0;
    }
    return n;
}

size_t pcr_backends_count(const pcr_server_t *srv)
{
    size_t n = 0;
    for (size_t i = 0; i < pcr_backend_slots(srv); i++)
        n += pcr_backend_at(srv, i) != NULL;
    return n;
}

/* ---- passive outlier detection -------------------------------------------------------- */

int pcr_backend_ejected(const pcr_backend_t *be, uint64_t now_us)
{
    return PCR_LOAD(((pcr_backend_t *)be)->ejected_until_us) > now_us;
}

static void eject(pcr_backend_t *be, const pcr_outlier_conf_t *o, uint64_t now, const char *why,
                  unsigned count, int connects)
{
    uint64_t until = PCR_LOAD(be->ejected_until_us);
    if (until > now)
        return; /* already out */
    /* A backend back to health for a while starts its back-off afresh. */
    if (PCR_LOAD(be->ejected_at_us) + (uint64_t)o->max_ejection_ms * 1000 * 2 < now)
        PCR_STORE(be->ejections, 0);
    unsigned k = PCR_LOAD(be->ejections);
    uint64_t ms = o->ejection_ms;
    for (unsigned i = 0; i < k && ms < o->max_ejection_ms; i++)
        ms *= 2;
    if (ms > o->max_ejection_ms)
        ms = o->max_ejection_ms;
    /* Whichever worker crossed the threshold first does it. */
    if (!__atomic_compare_exchange_n(&be->ejected_until_us, &until, now + ms * 1000, 0,
                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    PCR_STORE(be->ejected_for_connects, connects);
    PCR_STORE(be->ejected_at_us, now);
    PCR_ADD(be->ejections, 1);
    PCR_ADD(be->ejections_total, 1);
    PCR_STORE(be->consecutive_errors, 0);
    PCR_STORE(be->consecutive_connect_errors, 0);
    pcr_log_warn("backend %s ejected for %llu ms after %u %s in a row", be->conf.name,
                 (unsigned long long)ms, count, why);
    pcr_bus_state(be->srv->bus, be->id, PCR_BACKEND_UNAVAILABLE, now);
}

void pcr_backend_report(pcr_backend_t *be, const pcr_outlier_conf_t *o, pcr_outcome_t outcome,
                        uint64_t now_us)
{
    switch (outcome) {
    case PCR_OUTCOME_OK:
        if (PCR_LOAD(be->consecutive_errors))
            PCR_STORE(be->consecutive_errors, 0);
        if (PCR_LOAD(be->consecutive_connect_errors))
            PCR_STORE(be->consecutive_connect_errors, 0);
        break;
    case PCR_OUTCOME_5XX:
    case PCR_OUTCOME_ERROR: {
        unsigned n = PCR_ADD(be->consecutive_errors, 1) + 1;
        if (o->consecutive_errors > 0 && n >= o->consecutive_errors)
            eject(be, o, now_us, outcome == PCR_OUTCOME_5XX ? "errors (5xx)" : "errors", n, 0);
        break;
    }
    case PCR_OUTCOME_CONNECT: {
        unsigned n = PCR_ADD(be->consecutive_connect_errors, 1) + 1;
        PCR_ADD(be->consecutive_errors, 1);
        if (o->consecutive_connect_errors > 0 && n >= o->consecutive_connect_errors)
            eject(be, o, now_us, "failed connects", n, 1);
        break;
    }
    }
}

/* Ends the ejection that `until` (read by the caller) describes; a no-op when another ended it
 * first or a new one began. */
static void ejection_over(pcr_backend_t *be, uint64_t until, const char *why)
{
    if (until == 0 || !__atomic_compare_exchange_n(&be->ejected_until_us, &until, 0, 0,
                                                   __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    PCR_STORE(be->consecutive_errors, 0);
    PCR_STORE(be->consecutive_connect_errors, 0);
    pcr_log_info("backend %s %s: back in rotation", be->conf.name, why);
    /* The policy was told it was unavailable: it keeps the entries only for so long. */
    if (PCR_LOAD(be->up))
        pcr_bus_state(be->srv->bus, be->id, PCR_BACKEND_AVAILABLE, pcr_now_us());
}

void pcr_backend_uneject(pcr_backend_t *be)
{
    ejection_over(be, PCR_LOAD(be->ejected_until_us), "answers its probe");
}

void pcr_backend_ejection_served(pcr_backend_t *be, uint64_t until)
{
    ejection_over(be, until, "has served its ejection");
}

/* ---- models -------------------------------------------------------------------------- */

uint64_t pcr_model_hash(const char *model, size_t len) { return XXH3_64bits(model, len); }

void pcr_modelset_store(pcr_modelset_t *set, const uint64_t *hashes, size_t n)
{
    if (n > PCR_MAX_MODELS)
        n = PCR_MAX_MODELS;
    __atomic_fetch_add(&set->seq, 1, __ATOMIC_ACQ_REL); /* odd: being written */
    for (size_t i = 0; i < n; i++)
        PCR_STORE(set->h[i], hashes[i]);
    PCR_STORE(set->n, (uint32_t)n);
    PCR_STORE(set->known, 1);
    __atomic_fetch_add(&set->seq, 1, __ATOMIC_RELEASE);
}

void pcr_backend_config_models(pcr_backend_t *be, const pcr_backend_conf_t *conf)
{
    uint64_t h[PCR_MAX_MODELS];
    size_t n = conf->nmodels < PCR_MAX_MODELS ? conf->nmodels : PCR_MAX_MODELS;
    for (size_t i = 0; i < n; i++)
        h[i] = pcr_model_hash(conf->models[i], strlen(conf->models[i]));
    pcr_modelset_store(&be->cfg_models, h, n);
}

/* Whether `set` holds `h`: -1 never written, 0 no, 1 yes; *count gets its size. A reader that
 * meets a write in progress tries again; writes are rare (a reload, a models refresh). */
static int modelset_has(const pcr_modelset_t *cset, uint64_t h, uint32_t *count)
{
    pcr_modelset_t *set = (pcr_modelset_t *)cset;
    for (;;) {
        uint32_t s1 = __atomic_load_n(&set->seq, __ATOMIC_ACQUIRE);
        if (s1 & 1)
            continue;
        /* Acquire loads: the second read of the sequence cannot move before them (a fence
         * would do, but ThreadSanitizer does not model fences). */
        int found = -1;
        uint32_t n = 0;
        if (__atomic_load_n(&set->known, __ATOMIC_ACQUIRE)) {
            found = 0;
            n = __atomic_load_n(&set->n, __ATOMIC_ACQUIRE);
            for (uint32_t i = 0; i < n && i < PCR_MAX_MODELS; i++)
                if (__atomic_load_n(&set->h[i], __ATOMIC_ACQUIRE) == h)
                    found = 1;
        }
        if (__atomic_load_n(&set->seq, __ATOMIC_RELAXED) == s1) {
            *count = n;
            return found;
        }
    }
}

int pcr_backend_serves(const pcr_backend_t *be, const char *model, uint64_t model_hash)
{
    if (model == NULL || model[0] == '\0')
        return 1;
    uint32_t ncfg = 0, npod = 0;
    if (modelset_has(&be->cfg_models, model_hash, &ncfg) == 1)
        return 1;
    int pod = modelset_has(&be->pod_models, model_hash, &npod);
    if (pod >= 0)
        return pod;
    return ncfg == 0; /* the pod has not said yet: only a config list can say no */
}

/* ---- set-up -------------------------------------------------------------------------- */

typedef struct {
    int done, err;
    char msg[96];
    pcr_dns_addr_t addr;
} startup_answer_t;

static void on_startup_answer(const pcr_dns_addr_t *addrs, size_t n, int err, const char *msg,
                              void *arg)
{
    startup_answer_t *a = arg;
    a->done = 1;
    a->err = err != 0 || n == 0;
    if (err != 0)
        snprintf(a->msg, sizeof(a->msg), "%s", msg);
    else if (n == 0)
        snprintf(a->msg, sizeof(a->msg), "no address");
    else
        a->addr = addrs[0];
}

/* Resolves a backend's host at start-up, before the workers run. With dns.nameservers, through
 * them, as a reload would (the control loop runs only this lookup until c-ares answers, within
 * dns.timeout_ms per attempt); without, with the system's resolver (getaddrinfo). */
static int resolve_now(pcr_server_t *srv, const pcr_backend_conf_t *bc,
                       struct sockaddr_storage *ss, socklen_t *len, char *err, size_t errlen)
{
    if (srv->cfg->dns.nnameservers > 0 && srv->dns != NULL) {
        startup_answer_t a = {0};
        if (pcr_dns_resolve(srv->dns, bc->host, bc->port, on_startup_answer, &a) == NULL) {
            snprintf(err, errlen, "out of memory");
            return PCR_ERR_NOMEM;
        }
        while (!a.done) {
            if (event_base_loop(srv->base, EVLOOP_ONCE) != 0) {
                snprintf(err, errlen, "the lookup could not run");
                return PCR_ERR_IO; /* the query is freed with the resolver */
            }
        }
        if (a.err) {
            snprintf(err, errlen, "%s", a.msg);
            return PCR_ERR_INVAL;
        }
        memcpy(ss, &a.addr.addr, a.addr.len);
        *len = a.addr.len;
        return 0;
    }
    char port[8];
    snprintf(port, sizeof(port), "%u", bc->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC}, *res = NULL;
    int rc = getaddrinfo(bc->host, port, &hints, &res);
    if (rc != 0 || res == NULL) {
        snprintf(err, errlen, "%s", gai_strerror(rc));
        return PCR_ERR_INVAL;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int pcr_backends_open(pcr_server_t *srv, const pcr_backend_hooks_t *hooks)
{
    const pcr_config_t *cfg = srv->cfg;
    srv->backend_hooks = hooks;
    srv->backends = calloc(PCR_MAX_BACKENDS, sizeof(*srv->backends));
    srv->slot_taken = calloc(PCR_MAX_BACKENDS, 1);
    if (srv->backends == NULL || srv->slot_taken == NULL)
        return PCR_ERR_NOMEM;
    LIST_INIT(&srv->retired);
    for (size_t i = 0; i < cfg->nbackends; i++) {
        const pcr_backend_conf_t *bc = &cfg->backends[i];
        struct sockaddr_storage ss;
        socklen_t len;
        char err[128];
        if (resolve_now(srv, bc, &ss, &len, err, sizeof(err)) < 0) {
            pcr_log_error("backends[%zu].url: cannot resolve host \"%s\": %s", i, bc->host, err);
            return PCR_ERR_INVAL;
        }
        if (pcr_backend_add(srv, bc, (struct sockaddr *)&ss, len) == NULL)
            return PCR_ERR_NOMEM;
    }
    return 0;
}

static void backend_free(pcr_backend_t *be)
{
    if (be->srv->backend_hooks != NULL)
        be->srv->backend_hooks->dispose(be);
    pcr_backend_conf_dispose(&be->conf);
    tls_collect(be, UINT64_MAX);
    SSL_CTX_free(be->tls_ctx);
    free(be->tls_name);
    free(be->pending);
    free(be->host_header);
    free(be->disc_dns);
    free(be);
}

void pcr_backends_close(pcr_server_t *srv)
{
    for (size_t i = 0; srv->backends != NULL && i < PCR_MAX_BACKENDS; i++) {
        if (srv->backends[i] != NULL)
            backend_free(srv->backends[i]);
        srv->backends[i] = NULL;
    }
    while (!LIST_EMPTY(&srv->retired)) {
        pcr_backend_t *be = LIST_FIRST(&srv->retired);
        LIST_REMOVE(be, retired_link);
        backend_free(be);
    }
    free(srv->backends);
    free(srv->slot_taken);
    srv->backends = NULL;
    srv->slot_taken = NULL;
    srv->nslots = 0;
}

double pcr_backends_saturation(pcr_server_t *srv, const pcr_config_t *cfg)
{
    return pcr_backends_saturation_for(srv, cfg, 0);
}

double pcr_backends_saturation_for(pcr_server_t *srv, const pcr_config_t *cfg, uint64_t passes)
{
    size_t n = pcr_backend_slots(srv);
    pcr_sat_pod_t pods[n ? n : 1];
    uint64_t now = pcr_now_us();
    for (size_t i = 0; i < n; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        pods[i] = (pcr_sat_pod_t){0};
        if (be == NULL)
            continue;
        pods[i].usable = PCR_LOAD(be->up) && !pcr_backend_ejected(be, now);
        pods[i].inflight = PCR_LOAD(be->inflight);
        pods[i].waiting = PCR_LOAD(be->pod_waiting);
        pods[i].prefill = PCR_LOAD(be->queued_prefill);
        for (uint64_t m = passes; m != 0; m &= m - 1) {
            uint64_t p = PCR_LOAD(be->prefill_by_slot[__builtin_ctzll(m)]);
            pods[i].prefill = pods[i].prefill > p ? pods[i].prefill - p : 0;
        }
        pods[i].kv_usage = PCR_LOAD(be->pod_kv_usage_known) ? PCR_LOAD(be->pod_kv_usage_ppm) / 1e6
                                                            : -1;
    }
    pcr_sat_opts_t o = {
        .queue_threshold = cfg->flow_control.queue_threshold,
        .kv_threshold = cfg->flow_control.kv_threshold,
        .inflight_threshold = cfg->flow_control.inflight_per_pod,
        .prefill_threshold = (double)cfg->flow_control.prefill_per_pod,
    };
    return pcr_saturation(pods, n, &o);
}
