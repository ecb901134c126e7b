/* router/discovery.c: DNS discovery (discovery.h). One watcher per config entry: a timer, a
 * lookup through the control loop's resolver (dns.c), and the membership it keeps.
 *
 * A discovered backend remembers which entry found it (its name and port), so that a reload
 * that drops or changes the entry can take its backends along, and so that two entries never
 * fight over a backend. Static backends (config backends[]) are never touched here. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "backend.h"
#include "bus.h"
#include "discovery.h"
#include "dns.h"
#include "log.h"

struct pcr_watch {
    pcr_server_t *srv;
    size_t idx;                    /* in srv->cfg->discovery */
    struct event *timer;
    pcr_dns_query_t *query;
    uint64_t lookups, failures;
};

static int found_by(const pcr_backend_t *be, const pcr_discovery_conf_t *d)
{
    return be->discovered && be->disc_port == d->port && strcmp(be->disc_dns, d->dns) == 0;
}

/* "10.1.2.3:8000", "[fd00::1]:8000", and the host part alone. */
static int addr_text(const pcr_dns_addr_t *a, char *host, size_t hl, char *name, size_t nl,
                     unsigned *port)
{
    if (a->addr.ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)&a->addr;
        if (inet_ntop(AF_INET, &s4->sin_addr, host, (socklen_t)hl) == NULL)
            return -1;
        *port = ntohs(s4->sin_port);
        snprintf(name, nl, "%s:%u", host, *port);
        return 0;
    }
    if (a->addr.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&a->addr;
        if (inet_ntop(AF_INET6, &s6->sin6_addr, host, (socklen_t)hl) == NULL)
            return -1;
        *port = ntohs(s6->sin6_port);
        snprintf(name, nl, "[%s]:%u", host, *port);
        return 0;
    }
    return -1;
}

static void add_found(pcr_server_t *srv, const pcr_discovery_conf_t *d, const pcr_dns_addr_t *a)
{
    char host[64], name[96], url[128], kv[128], kv_replay[128];
    unsigned port;
    if (addr_text(a, host, sizeof(host), name, sizeof(name), &port) < 0)
        return;
    pcr_backend_t *be = pcr_backend_find(srv, name);
    if (be != NULL)
        return; /* known already (found by this entry, or configured by hand) */
    snprintf(url, sizeof(url), "%s://%s", d->tmpl.tls.enabled ? "https" : "http", name);
    pcr_backend_conf_t bc = d->tmpl;
    bc.name = name;
    bc.url = url;
    bc.host = host;
    bc.port = (uint16_t)port;
    /* Precise mode: the pod's KV-event sockets on its own address, at the entry's ports. */
    int v6 = strchr(host, ':') != NULL;
    if (d->tmpl.kv_port != 0) {
        snprintf(kv, sizeof(kv), v6 ? "tcp://[%s]:%u" : "tcp://%s:%u", host, d->tmpl.kv_port);
        bc.kv_endpoint = kv;
    }
    if (d->tmpl.kv_port != 0 && d->tmpl.kv_replay_port != 0) {
        snprintf(kv_replay, sizeof(kv_replay), v6 ? "tcp://[%s]:%u" : "tcp://%s:%u", host,
                 d->tmpl.kv_replay_port);
        bc.kv_replay = kv_replay;
    }
    be = pcr_backend_add_discovered(srv, &bc, (const struct sockaddr *)&a->addr, a->len, d->dns,
                                    d->port);
    if (be != NULL)
        pcr_log_info("discovery %s: backend %s joins", d->dns, name);
}

static void schedule(struct pcr_watch *wt)
{
    const pcr_discovery_conf_t *d = &wt->srv->cfg->discovery[wt->idx];
    struct timeval tv = {d->interval_ms / 1000, (suseconds_t)(d->interval_ms % 1000) * 1000};
    evtimer_add(wt->timer, &tv);
}

static void on_answer(const pcr_dns_addr_t *addrs, size_t n, int err, const char *msg, void *arg)
{
    struct pcr_watch *wt = arg;
    pcr_server_t *srv = wt->srv;
    const pcr_discovery_conf_t *d = &srv->cfg->discovery[wt->idx];
    wt->query = NULL;
    wt->lookups++;
    PCR_ADD(srv->discovery_lookups, 1);
    int no_such_name = err == PCR_DNS_NONAME;
    if (err != 0 && !no_such_name) {
        /* Not an answer: keep what we have. */
        wt->failures++;
        PCR_ADD(srv->discovery_failures, 1);
        pcr_log_warn("discovery %s: lookup failed (%s); keeping its %s backends", d->dns, msg,
                     "current");
        schedule(wt);
        return;
    }
    /* The pool is what the name says now: those it no longer names leave and drain. */
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL || !found_by(be, d))
            continue;
        int still = 0;
        for (size_t k = 0; k < n && !still; k++)
            still = addrs[k].len == be->addrlen && memcmp(&addrs[k].addr, &be->addr, be->addrlen) == 0;
        if (!still) {
            pcr_log_info("discovery %s: backend %s left (it drains what it has)", d->dns,
                         be->conf.name);
            pcr_backend_remove(be);
        }
    }
    for (size_t k = 0; k < n; k++)
        add_found(srv, d, &addrs[k]);
    schedule(wt);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct pcr_watch *wt = arg;
    const pcr_discovery_conf_t *d = &wt->srv->cfg->discovery[wt->idx];
    if (wt->query != NULL || PCR_LOAD(wt->srv->draining))
        return;
    wt->query = pcr_dns_resolve(wt->srv->dns, d->dns, d->port, on_answer, wt);
    if (wt->query == NULL)
        schedule(wt);
}

void pcr_discovery_start(pcr_server_t *srv)
{
    const pcr_config_t *cfg = srv->cfg;
    if (cfg->ndiscovery == 0 || srv->dns == NULL)
        return;
    srv->watches = calloc(cfg->ndiscovery, sizeof(*srv->watches));
    if (srv->watches == NULL)
        return;
    srv->nwatches = cfg->ndiscovery;
    for (size_t i = 0; i < cfg->ndiscovery; i++) {
        struct pcr_watch *wt = &srv->watches[i];
        wt->srv = srv;
        wt->idx = i;
        wt->timer = evtimer_new(srv->base, on_timer, wt);
        if (wt->timer != NULL)
            event_active(wt->timer, EV_TIMEOUT, 0); /* the first lookup now */
    }
}

void pcr_discovery_stop(pcr_server_t *srv)
{
    for (size_t i = 0; i < srv->nwatches; i++) {
        struct pcr_watch *wt = &srv->watches[i];
        pcr_dns_cancel(wt->query);
        if (wt->timer)
            event_free(wt->timer);
    }
    free(srv->watches);
    srv->watches = NULL;
    srv->nwatches = 0;
}

void pcr_discovery_reload(pcr_server_t *srv)
{
    pcr_discovery_stop(srv);
    const pcr_config_t *cfg = srv->cfg;
    for (size_t i = 0; i < pcr_backend_slots(srv); i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL || !be->discovered)
            continue;
        int kept = 0;
        for (size_t j = 0; j < cfg->ndiscovery && !kept; j++)
            kept = found_by(be, &cfg->discovery[j]);
        if (!kept) {
            pcr_log_info("reload: backend %s leaves with its discovery entry", be->conf.name);
            pcr_backend_remove(be);
        }
    }
    pcr_discovery_start(srv);
}
