/* router/dns.c: asynchronous name resolution (dns.h) over libevent's evdns.
 *
 * evdns may answer inside evdns_getaddrinfo() (a numeric host, a cached answer, an error); the
 * query then keeps the answer and a zero-delay event reports it from the loop, so a caller never
 * sees its callback run inside its own call. Cancelling a query still in evdns asks evdns to
 * cancel it; evdns then calls back with EVUTIL_EAI_CANCEL from a later loop turn (a deferred
 * callback), and that callback only frees the query.
 *
 * Those deferred callbacks read the query and the evdns base, so neither may be freed before
 * they ran: pcr_dns_free cancels what is in flight and leaves the resolver "retiring"; the last
 * cancelled query's callback arms a zero-delay event, which frees the evdns base one loop turn
 * later (after any callback evdns deferred meanwhile, such as the internal cancel of a
 * getaddrinfo timeout). pcr_dns_retiring() says how many resolvers are still on their way out,
 * so that the process can run its loop until they are gone before it exits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/queue.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <event2/util.h>

#include "dns.h"
#include "pcr/common.h"

struct pcr_dns_query {
    pcr_dns_t *dns;
    LIST_ENTRY(pcr_dns_query) link;
    struct evdns_getaddrinfo_request *req;
    struct event *later;           /* reports an answer that came at once */
    pcr_dns_cb cb;
    void *arg;
    int cancelled;
    int in_evdns;
    int err;
    char errmsg[96];
    pcr_dns_addr_t *addrs;
    size_t naddrs;
};

struct pcr_dns {
    struct event_base *base;
    struct evdns_base *evdns;
    LIST_HEAD(, pcr_dns_query) queries;
    int used;                      /* a query ever went into evdns */
    int retiring;                  /* pcr_dns_free was called: gone once evdns is done */
    struct event *bury;            /* frees it, a loop turn after its last callback */
};

static unsigned retiring_count;    /* control thread only */

static void dns_destroy(pcr_dns_t *dns)
{
    if (dns->evdns)
        evdns_base_free(dns->evdns, 0); /* nothing of ours is in it any more */
    if (dns->bury)
        event_free(dns->bury);
    free(dns);
}

static void on_bury(evutil_socket_t fd, short what, void *arg)
{
    retiring_count--;
    dns_destroy(arg);
}

/* A retiring resolver whose last query called back: freed at the next loop turn. */
static void bury_later(pcr_dns_t *dns)
{
    if (dns->bury == NULL)
        dns->bury = evtimer_new(dns->base, on_bury, dns);
    if (dns->bury == NULL) {
        /* Out of memory: leak it rather than free what a deferred callback may still read. */
        retiring_count--;
        return;
    }
    struct timeval now = {0, 0};
    evtimer_add(dns->bury, &now);
}

unsigned pcr_dns_retiring(void) { return retiring_count; }

pcr_dns_t *pcr_dns_new(struct event_base *base, char *const *nameservers, size_t n,
                       unsigned timeout_ms, char *err, size_t errlen)
{
    pcr_dns_t *dns = calloc(1, sizeof(*dns));
    if (dns == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    dns->base = base;
    LIST_INIT(&dns->queries);
    /* With nameservers of its own, pcrouter asks only them (a test's resolver, a cluster's),
     * without the machine's /etc/hosts either. */
    dns->evdns = evdns_base_new(base, n == 0 ? EVDNS_BASE_INITIALIZE_NAMESERVERS : 0);
    if (dns->evdns == NULL) {
        snprintf(err, errlen, "cannot set up the resolver (no nameserver in /etc/resolv.conf?)");
        free(dns);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (evdns_base_nameserver_ip_add(dns->evdns, nameservers[i]) != 0) {
            snprintf(err, errlen, "dns.nameservers[%zu]: cannot use %s", i, nameservers[i]);
            pcr_dns_free(dns);
            return NULL;
        }
    }
    char secs[32];
    snprintf(secs, sizeof(secs), "%.3f", timeout_ms / 1000.0);
    evdns_base_set_option(dns->evdns, "timeout:", secs);
    evdns_base_set_option(dns->evdns, "attempts:", "2");
    return dns;
}

static void query_free(pcr_dns_query_t *q)
{
    pcr_dns_t *dns = q->dns;
    LIST_REMOVE(q, link);
    if (q->later)
        event_free(q->later);
    free(q->addrs);
    free(q);
    if (dns->retiring && LIST_EMPTY(&dns->queries))
        bury_later(dns);
}

static void report(pcr_dns_query_t *q)
{
    pcr_dns_cb cb = q->cb;
    void *arg = q->arg;
    pcr_dns_addr_t *addrs = q->addrs;
    size_t n = q->naddrs;
    int err = q->err;
    char msg[sizeof(q->errmsg)];
    memcpy(msg, q->errmsg, sizeof(msg));
    q->addrs = NULL;
    query_free(q);
    cb(addrs, n, err, msg, arg);
    free(addrs);
}

static void on_later(evutil_socket_t fd, short what, void *arg) { report(arg); }

static void on_answer(int result, struct evutil_addrinfo *res, void *arg)
{
    pcr_dns_query_t *q = arg;
    q->in_evdns = 0;
    q->req = NULL;
    if (q->cancelled || result == EVUTIL_EAI_CANCEL) {
        if (res)
            evutil_freeaddrinfo(res);
        query_free(q);
        return;
    }
    q->err = result;
    if (result != 0) {
        snprintf(q->errmsg, sizeof(q->errmsg), "%s", evutil_gai_strerror(result));
    } else {
        size_t n = 0;
        for (struct evutil_addrinfo *ai = res; ai != NULL; ai = ai->ai_next)
            n += ai->ai_addrlen <= sizeof(struct sockaddr_storage);
        if (n > PCR_DNS_MAX_ADDRS)
            n = PCR_DNS_MAX_ADDRS;
        q->addrs = calloc(n ? n : 1, sizeof(*q->addrs));
        for (struct evutil_addrinfo *ai = res; ai != NULL && q->addrs && q->naddrs < n; ai = ai->ai_next) {
            if (ai->ai_addrlen > sizeof(struct sockaddr_storage))
                continue;
            memcpy(&q->addrs[q->naddrs].addr, ai->ai_addr, ai->ai_addrlen);
            q->addrs[q->naddrs].len = (socklen_t)ai->ai_addrlen;
            q->naddrs++;
        }
        if (q->addrs == NULL) {
            q->err = EVUTIL_EAI_MEMORY;
            snprintf(q->errmsg, sizeof(q->errmsg), "out of memory");
        }
    }
    if (res)
        evutil_freeaddrinfo(res);
    if (q->later != NULL)
        event_active(q->later, 0, 0); /* answered inside pcr_dns_resolve: report from the loop */
    else
        report(q);
}

pcr_dns_query_t *pcr_dns_resolve(pcr_dns_t *dns, const char *host, unsigned port, pcr_dns_cb cb,
                                 void *arg)
{
    pcr_dns_query_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    q->dns = dns;
    q->cb = cb;
    q->arg = arg;
    q->later = event_new(dns->base, -1, 0, on_later, q);
    if (q->later == NULL) {
        free(q);
        return NULL;
    }
    LIST_INSERT_HEAD(&dns->queries, q, link);
    dns->used = 1;
    char service[8];
    snprintf(service, sizeof(service), "%u", port);
    struct evutil_addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    q->in_evdns = 1;
    q->req = evdns_getaddrinfo(dns->evdns, host, service, &hints, on_answer, q);
    if (!q->in_evdns)
        return q; /* answered already; on_later reports it */
    /* Pending: the answer comes later, straight to on_answer. */
    event_free(q->later);
    q->later = NULL;
    return q;
}

void pcr_dns_cancel(pcr_dns_query_t *q)
{
    if (q == NULL || q->cancelled)
        return; /* a cancelled query waits for its callback from evdns: once is enough */
    if (q->in_evdns && q->req != NULL) {
        q->cancelled = 1;
        evdns_getaddrinfo_cancel(q->req); /* on_answer frees it */
        return;
    }
    query_free(q);
}

void pcr_dns_free(pcr_dns_t *dns)
{
    if (dns == NULL || dns->retiring)
        return;
    if (!dns->used) {
        dns_destroy(dns); /* evdns never had a query: nothing can call back */
        return;
    }
    dns->retiring = 1;
    retiring_count++;
    pcr_dns_query_t *q = LIST_FIRST(&dns->queries), *next;
    if (q == NULL) {
        bury_later(dns);
        return;
    }
    /* The last query out buries the resolver (query_free). */
    for (; q != NULL; q = next) {
        next = LIST_NEXT(q, link);
        if (q->in_evdns && q->req != NULL) {
            if (!q->cancelled) {
                q->cancelled = 1;
                evdns_getaddrinfo_cancel(q->req); /* on_answer frees it, later */
            }
        } else {
            query_free(q); /* answered at once; its report is not sent */
        }
    }
}
