/* router/reload.c: SIGHUP reads the config file again and applies it without a restart, on the
 * control thread:
 *
 *   read + validate -> resolve new backend hosts (async) -> bind new listeners, load TLS
 *   -> backends: added ones join free slots, removed ones leave theirs and drain, changed ones
 *      are updated in place (weight, zone, role, capacity, models, max_connections) or replaced (url)
 *   -> routing knobs to every policy replica (bus), the log level, the DNS settings, discovery
 *   -> each worker adopts the new config and listeners at its next command; the old config and
 *      TLS contexts are freed once every worker has.
 *
 * A config with any error (or a host that does not resolve, or an address that cannot be
 * bound) is refused as a whole: its errors are logged and the running config stays. In-flight
 * requests and open client connections are untouched: a removed backend finishes what it has,
 * a removed listener's accepted connections stay open. `workers` cannot change at a reload (it
 * is logged), nor can the `redis` section (logged too; the rest of the reload applies).
 * pcrouter_config_reloads_total{result} counts the outcomes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accesslog.h"
#include "backend.h"
#include "control.h"
#include "bus.h"
#include "discovery.h"
#include "dns.h"
#include "log.h"
#include "precise.h"
#include "reload.h"
#include "tenants.h"
#include "session.h"
#include "tls.h"
#include "worker.h"

struct pcr_reload {
    pcr_server_t *srv;
    pcr_config_t *cfg;
    size_t pending;
    pcr_dns_query_t **queries;     /* per backend of cfg */
    size_t nqueries;
    pcr_dns_addr_t *addrs;         /* per backend of cfg: its resolved address */
    int failed;
    char why[512];
};

static void reload_free(pcr_reload_t *r)
{
    for (size_t i = 0; r->queries != NULL && i < r->nqueries; i++)
        pcr_dns_cancel(r->queries[i]);
    free(r->queries);
    free(r->addrs);
    pcr_config_free(r->cfg);
    free(r);
}

static void count(pcr_server_t *srv, int ok)
{
    if (ok)
        PCR_ADD(srv->reloads_ok, 1);
    else
        PCR_ADD(srv->reloads_failed, 1);
}

static void refuse(pcr_reload_t *r, const char *why)
{
    pcr_server_t *srv = r->srv;
    pcr_log_error("reload refused, still running the previous config: %s", why);
    count(srv, 0);
    srv->reload = NULL;
    reload_free(r);
    if (srv->reload_again) {
        srv->reload_again = 0;
        pcr_reload_start(srv);
    }
}

static int same_str(const char *a, const char *b)
{
    return a == b || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* The same pod, reached the same way: its url, and with TLS the name it must prove and whether
 * that is checked (certificate files may change in place: they are read again). */
static int same_place(const pcr_backend_conf_t *a, const pcr_backend_conf_t *b)
{
    const char *an = a->tls.server_name ? a->tls.server_name : "";
    const char *bn = b->tls.server_name ? b->tls.server_name : "";
    return strcmp(a->url, b->url) == 0 && strcmp(an, bn) == 0 && a->tls.verify == b->tls.verify;
}

/* Every TLS setting of the new config can be used (the files parse, the key fits its
 * certificate), or why not: checked before anything is applied. */
static int tls_usable(const pcr_config_t *cfg, char *why, size_t len)
{
    char err[256];
    for (size_t i = 0; i < cfg->nbackends + cfg->ndiscovery; i++) {
        int disc = i >= cfg->nbackends;
        size_t k = disc ? i - cfg->nbackends : i;
        const pcr_upstream_tls_conf_t *t = disc ? &cfg->discovery[k].tmpl.tls : &cfg->backends[k].tls;
        if (!t->enabled)
            continue;
        pcr_tls_client_opts_t o = {t->ca_file, t->cert, t->key, t->verify};
        SSL_CTX *ctx = pcr_tls_client_ctx_new(&o, err, sizeof(err));
        if (ctx == NULL) {
            snprintf(why, len, "%s[%zu].tls: %s", disc ? "discovery" : "backends", k, err);
            return 0;
        }
        SSL_CTX_free(ctx);
    }
    return 1;
}

/* Certificates, keys and CAs read again for every backend that speaks TLS. */
static void renew_tls(pcr_server_t *srv, const pcr_config_t *cfg)
{
    char err[256];
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL || be->tls_ctx == NULL)
            continue;
        const pcr_upstream_tls_conf_t *t = NULL;
        if (!be->discovered) {
            for (size_t j = 0; j < cfg->nbackends && t == NULL; j++)
                if (strcmp(cfg->backends[j].name, be->conf.name) == 0)
                    t = &cfg->backends[j].tls;
        } else {
            for (size_t j = 0; j < cfg->ndiscovery && t == NULL; j++)
                if (strcmp(cfg->discovery[j].dns, be->disc_dns) == 0 &&
                    cfg->discovery[j].port == be->disc_port)
                    t = &cfg->discovery[j].tmpl.tls;
        }
        if (t != NULL && pcr_backend_tls_set(be, t, err, sizeof(err)) < 0)
            pcr_log_error("reload: backend %s keeps its TLS context: %s", be->conf.name, err);
    }
}

static int same_models(const pcr_backend_conf_t *a, const pcr_backend_conf_t *b)
{
    if (a->nmodels != b->nmodels)
        return 0;
    for (size_t i = 0; i < a->nmodels; i++)
        if (strcmp(a->models[i], b->models[i]) != 0)
            return 0;
    return 1;
}

/* The running backends against the new config's: keep, update, replace, add, remove. Discovered
 * backends belong to discovery (its entries are re-read below). Counts into *added etc. */
static void apply_backends(pcr_reload_t *r, size_t *added, size_t *removed, size_t *changed)
{
    pcr_server_t *srv = r->srv;
    const pcr_config_t *cfg = r->cfg;
    char *seen = calloc(cfg->nbackends ? cfg->nbackends : 1, 1);
    /* Backends whose names the new config lacks leave after the new ones have joined, so that
     * a worker never finds the pool empty between the two (a request would get 404 or 503).
     * One replaced in place (same name, another url) leaves first: two of one name would
     * share a ring position and a metrics label. */
    size_t nslots = pcr_backend_slots(srv), nleaving = 0;
    pcr_backend_t **leaving = calloc(nslots ? nslots : 1, sizeof(*leaving));
    for (size_t i = 0; i < nslots; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL || be->discovered)
            continue;
        size_t j = 0;
        while (j < cfg->nbackends && strcmp(cfg->backends[j].name, be->conf.name) != 0)
            j++;
        if (j == cfg->nbackends && leaving != NULL) {
            leaving[nleaving++] = be;
            continue;
        }
        if (j == cfg->nbackends || !same_place(&be->conf, &cfg->backends[j])) {
            pcr_log_info("reload: backend %s leaves (it drains what it has)", be->conf.name);
            pcr_backend_remove(be);
            (*removed)++;
            continue;
        }
        if (seen)
            seen[j] = 1;
        const pcr_backend_conf_t *nc = &cfg->backends[j];
        int policy_change = nc->weight != be->conf.weight || strcmp(nc->zone, be->conf.zone) != 0 ||
                            nc->capacity_tokens != be->conf.capacity_tokens;
        int kv_change = !same_str(nc->kv_endpoint, be->conf.kv_endpoint) ||
                        !same_str(nc->kv_replay, be->conf.kv_replay);
        int other_change = !same_models(nc, &be->conf) ||
                           nc->max_connections != be->conf.max_connections ||
                           nc->role != be->conf.role || kv_change;
        if (!policy_change && !other_change)
            continue;
        (*changed)++;
        /* Workers read conf.name (logs, response headers, /metrics) while this runs, so name,
         * url and host are left as they are (the same, or this would be a replacement); the
         * fields that change are the control thread's, and reach workers as atomics and model
         * sets. */
        pcr_backend_conf_t copy;
        if (pcr_backend_conf_copy(&copy, nc) == 0) {
            free(be->conf.zone);
            for (size_t k = 0; k < be->conf.nmodels; k++)
                free(be->conf.models[k]);
            free(be->conf.models);
            be->conf.zone = copy.zone;
            be->conf.models = copy.models;
            be->conf.nmodels = copy.nmodels;
            be->conf.weight = copy.weight;
            be->conf.capacity_tokens = copy.capacity_tokens;
            be->conf.max_connections = copy.max_connections;
            /* The KV-event endpoints are the control thread's alone (precise.c). */
            free(be->conf.kv_endpoint);
            free(be->conf.kv_replay);
            be->conf.kv_endpoint = copy.kv_endpoint;
            be->conf.kv_replay = copy.kv_replay;
            copy.kv_endpoint = copy.kv_replay = NULL;
            copy.zone = NULL;
            copy.models = NULL;
            copy.nmodels = 0;
            pcr_backend_conf_dispose(&copy); /* its name, url and host */
        }
        PCR_STORE(be->max_connections, nc->max_connections);
        PCR_STORE(be->conf.role, nc->role); /* workers read it at each decision */
        pcr_backend_config_models(be, nc);
        pcr_log_info("reload: backend %s changes in place", be->conf.name);
    }
    for (size_t j = 0; j < cfg->nbackends; j++) {
        if (seen && seen[j])
            continue;
        pcr_backend_t *be = pcr_backend_add(srv, &cfg->backends[j],
                                            (const struct sockaddr *)&r->addrs[j].addr,
                                            r->addrs[j].len);
        if (be != NULL) {
            pcr_log_info("reload: backend %s joins", be->conf.name);
            (*added)++;
        }
    }
    for (size_t k = 0; k < nleaving; k++) {
        pcr_log_info("reload: backend %s leaves (it drains what it has)", leaving[k]->conf.name);
        pcr_backend_remove(leaving[k]);
        (*removed)++;
    }
    free(leaving);
    free(seen);
}

static int dns_changed(const pcr_config_t *a, const pcr_config_t *b)
{
    if (a->dns.nnameservers != b->dns.nnameservers || a->dns.timeout_ms != b->dns.timeout_ms)
        return 1;
    for (size_t i = 0; i < a->dns.nnameservers; i++)
        if (strcmp(a->dns.nameservers[i], b->dns.nameservers[i]) != 0)
            return 1;
    return 0;
}

/* Everything is resolved: switch. */
static void apply(pcr_reload_t *r)
{
    pcr_server_t *srv = r->srv;
    pcr_config_t *cfg = r->cfg, *old = srv->cfg;
    if (cfg->workers != old->workers)
        pcr_log_warn("reload: workers stays %u until a restart", srv->nworkers);
    if (cfg->io_uring != old->io_uring)
        pcr_log_warn("reload: io_uring stays %s until a restart", old->io_uring ? "on" : "off");
    char tls_why[320];
    if (!tls_usable(cfg, tls_why, sizeof(tls_why))) {
        refuse(r, tls_why);
        return;
    }
    pcr_listen_plan_t *plan = pcr_listen_plan_new(srv, cfg, old);
    if (plan == NULL) {
        refuse(r, "the listeners could not be set up (see above)");
        return;
    }
    pcr_dns_t *dns = NULL;
    if (dns_changed(old, cfg)) {
        char err[256];
        dns = pcr_dns_new(srv->base, cfg->dns.nameservers, cfg->dns.nnameservers,
                          cfg->dns.timeout_ms, err, sizeof(err));
        if (dns == NULL) {
            pcr_listen_plan_free(plan);
            refuse(r, err);
            return;
        }
    }
    /* The sharing through Redis keeps what it started with (its link, its channel, its
     * replica id and the bus tap are set up once, before the workers start): the new file's
     * redis section is set aside, and the config keeps describing what runs, so the next
     * reload compares against that again. */
    if (!pcr_redis_conf_equal(&old->redis, &cfg->redis)) {
        pcr_log_warn("reload: redis.* changes need a restart: the rest of the config applies, "
                     "the index sharing goes on as it was started (%s)",
                     old->redis.enabled ? "through redis" : "off");
        pcr_redis_conf_t running = old->redis;
        old->redis = cfg->redis;
        cfg->redis = running;
    }
    /* From here on nothing fails: the new config is the control thread's. */
    pcr_tenancy_assign(srv, cfg);
    srv->cfg = cfg;
    pcr_log_set_level(cfg->log.level);
    /* Another access log file: the writer moves to it once what is queued is written (the
     * format changes with each worker's config). */
    if (strcmp(cfg->log.access_log_path, old->log.access_log_path) != 0)
        pcr_accesslog_reopen(srv->access_log, cfg->log.access_log_path);
    if (dns != NULL) {
        pcr_discovery_stop(srv); /* its queries belong to the old resolver */
        pcr_dns_free(srv->dns);
        srv->dns = dns;
    }
    pcr_policy_opts_t o;
    pcr_config_policy_opts(cfg, srv->nworkers, &o);
    pcr_bus_tune(srv->bus, &o);
    size_t added = 0, removed = 0, changed = 0;
    renew_tls(srv, cfg);
    apply_backends(r, &added, &removed, &changed);
    /* After a tune, every slot again: a replica that had to start afresh (new keys) learns
     * its backends, one that tuned in place keeps its entries (same names). */
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL)
            continue;
        pcr_backend_desc_t d;
        pcr_backend_desc(be, &d);
        pcr_bus_backend_set(srv->bus, PCR_BUS_CONTROL, be->id, &d);
    }
    pcr_discovery_reload(srv);
    pcr_backends_retime(srv);
    pcr_precise_apply(srv); /* after the backends: the pods it follows are theirs */
    /* The workers take the new config and listeners at their next command; the old ones go
     * once every worker has (pcr_reload_collect). */
    pcr_switch_t *sw = calloc(1, sizeof(*sw));
    if (sw != NULL) {
        sw->cfg = cfg;
        sw->plan = plan;
        sw->gen = PCR_LOAD(srv->cfg_gen) + 1;
        sw->old_cfg = old;
        sw->old_plan = srv->listen_plan;
        srv->listen_plan = plan;
        __atomic_store_n(&srv->pending_switch, sw, __ATOMIC_RELEASE);
        PCR_STORE(srv->cfg_gen, sw->gen);
        pcr_workers_command(srv, 'R');
    }
    pcr_log_info("config reloaded from %s: %zu backend(s) joined, %zu left, %zu changed; %zu "
                 "listener(s)", cfg->path, added, removed, changed, cfg->nlisten);
    count(srv, 1);
    srv->reload = NULL;
    r->cfg = NULL; /* the server's now */
    reload_free(r);
}

void pcr_reload_collect(pcr_server_t *srv)
{
    pcr_switch_t *sw = srv->switching;
    if (sw == NULL) {
        sw = __atomic_load_n(&srv->pending_switch, __ATOMIC_ACQUIRE);
        if (sw == NULL)
            return;
        srv->switching = sw;
    }
    for (unsigned k = 0; k < srv->nworkers; k++) {
        pcr_worker_t *w = &srv->workers[k];
        /* Acquire, pairing with worker_switch: its reads of the old config are over. */
        if (!__atomic_load_n(&w->stopped, __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&w->cfg_gen, __ATOMIC_ACQUIRE) < sw->gen)
            return;
    }
    /* Every worker runs the new config: the old one and its listeners' leftovers can go. */
    __atomic_store_n(&srv->pending_switch, NULL, __ATOMIC_RELEASE);
    srv->switching = NULL;
    pcr_config_free(sw->old_cfg);
    pcr_listen_plan_free(sw->old_plan);
    free(sw);
    if (srv->reload_again && srv->reload == NULL) {
        srv->reload_again = 0;
        pcr_reload_start(srv);
    }
}

/* One lookup (or the hold taken while they are sent) is over; the last one decides. */
static void one_done(pcr_reload_t *r)
{
    if (--r->pending > 0)
        return;
    if (r->failed)
        refuse(r, r->why[0] ? r->why : "a backend host did not resolve");
    else
        apply(r);
}

typedef struct {
    pcr_reload_t *r;
    size_t i;
} query_ctx_t;

static void on_backend_resolved(const pcr_dns_addr_t *addrs, size_t n, int err, const char *msg,
                                void *arg)
{
    query_ctx_t *q = arg;
    pcr_reload_t *r = q->r;
    size_t i = q->i;
    free(q);
    r->queries[i] = NULL;
    if (err == 0 && n > 0) {
        r->addrs[i] = addrs[0];
    } else {
        if (!r->failed)
            snprintf(r->why, sizeof(r->why), "backends[%zu].url: cannot resolve host \"%s\": %s",
                     i, r->cfg->backends[i].host, err ? msg : "no address");
        r->failed = 1;
    }
    one_done(r);
}

void pcr_reload_start(pcr_server_t *srv)
{
    if (srv->reload != NULL || srv->switching != NULL ||
        __atomic_load_n(&srv->pending_switch, __ATOMIC_ACQUIRE) != NULL) {
        srv->reload_again = 1; /* one at a time: the next starts when this one is done */
        return;
    }
    char *errors = NULL;
    pcr_config_t *cfg = pcr_config_load(srv->cfg->path, &errors);
    if (cfg == NULL) {
        /* Every error, one log line each, as --check-config prints them. */
        char *line = errors, *next;
        for (; line != NULL && *line != '\0'; line = next) {
            next = strchr(line, '\n');
            if (next != NULL)
                *next++ = '\0';
            pcr_log_error("reload: %s", line);
        }
        pcr_log_error("reload refused, still running the previous config: %s has errors",
                      srv->cfg->path);
        free(errors);
        count(srv, 0);
        return;
    }
    pcr_reload_t *r = calloc(1, sizeof(*r));
    size_t nb = cfg->nbackends ? cfg->nbackends : 1;
    if (r == NULL || (r->queries = calloc(nb, sizeof(*r->queries))) == NULL ||
        (r->addrs = calloc(nb, sizeof(*r->addrs))) == NULL) {
        if (r != NULL) {
            free(r->queries);
            free(r);
        }
        pcr_config_free(cfg);
        pcr_log_error("reload refused: out of memory");
        count(srv, 0);
        return;
    }
    r->srv = srv;
    r->cfg = cfg;
    r->nqueries = cfg->nbackends;
    srv->reload = r;
    pcr_log_info("SIGHUP: reloading %s", cfg->path);
    /* Hosts of backends that stay where they are need no lookup; the others resolve on the
     * control loop (a name that does not resolve refuses the reload). */
    r->pending = 1; /* held until every query is out, so none can finish the reload early */
    for (size_t i = 0; i < cfg->nbackends; i++) {
        pcr_backend_t *be = pcr_backend_find(srv, cfg->backends[i].name);
        if (be != NULL && !be->discovered && same_place(&be->conf, &cfg->backends[i])) {
            memcpy(&r->addrs[i].addr, &be->addr, be->addrlen);
            r->addrs[i].len = be->addrlen;
            continue;
        }
        query_ctx_t *q = malloc(sizeof(*q));
        if (q == NULL) {
            r->failed = 1;
            continue;
        }
        q->r = r;
        q->i = i;
        r->pending++;
        r->queries[i] = pcr_dns_resolve(srv->dns, cfg->backends[i].host, cfg->backends[i].port,
                                        on_backend_resolved, q);
        if (r->queries[i] == NULL) {
            free(q);
            r->pending--;
            r->failed = 1;
        }
    }
    one_done(r); /* releases the hold */
}

void pcr_reload_dispose(pcr_server_t *srv)
{
    if (srv->reload != NULL) {
        reload_free(srv->reload);
        srv->reload = NULL;
    }
    pcr_switch_t *sw = srv->switching ? srv->switching
                                      : __atomic_load_n(&srv->pending_switch, __ATOMIC_ACQUIRE);
    if (sw != NULL) {
        pcr_config_free(sw->old_cfg);
        pcr_listen_plan_free(sw->old_plan);
        free(sw);
    }
    srv->switching = NULL;
    srv->pending_switch = NULL;
}
