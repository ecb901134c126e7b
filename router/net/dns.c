/* router/dns.c: asynchronous name resolution (dns.h) over c-ares, driven by the control loop.
 *
 * Why c-ares and not libevent's evdns: evdns sends no EDNS0 and has no TCP fallback, so an
 * answer larger than 512 bytes (about 28 A records, a headless Service of 40 pods) came back
 * truncated and every lookup failed. c-ares asks with EDNS0 (a 1232-byte UDP payload, as the
 * DNS flag day of 2020 advises) and repeats a truncated query over TCP by itself.
 *
 * c-ares tells which sockets it wants watched (sock_state_cb); each gets a libevent event that
 * calls ares_process_fd(), and one timer follows ares_timeout(). An answer is never reported
 * from inside c-ares: its callback keeps the result and activates the query's own event, so a
 * caller's callback runs from the loop, never inside pcr_dns_resolve() nor inside c-ares
 * (where freeing the resolver would pull the channel from under it).
 *
 * c-ares cannot cancel one query. A cancelled query stays in c-ares, marked, until its answer
 * or its timeout comes; then it is freed and nothing is reported. pcr_dns_free() destroys the
 * channel, which calls back every query still in it (ARES_EDESTRUCTION) at once, so a resolver
 * is gone when pcr_dns_free() returns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/queue.h>

#include <ares.h>
#include <event2/event.h>

#include "dns.h"
#include "log.h"
#include "pcr/common.h"

#define EDNS_PAYLOAD 1232

struct pcr_dns_query {
    pcr_dns_t *dns;
    LIST_ENTRY(pcr_dns_query) link;
    struct event *later;           /* reports the answer from the loop */
    pcr_dns_cb cb;
    void *arg;
    int in_ares;                   /* c-ares still holds it: its callback will come */
    int cancelled;
    int err;
    char errmsg[96];
    pcr_dns_addr_t *addrs;
    size_t naddrs;
    char host[64];                 /* for the log line when an answer is cut */
};

typedef struct {
    ares_socket_t fd;
    short what;                    /* EV_READ, EV_WRITE or both */
    struct event *ev;
} dns_sock_t;

struct pcr_dns {
    struct event_base *base;
    ares_channel ch;
    struct event *timer;           /* ares_timeout(): retries and query deadlines */
    LIST_HEAD(, pcr_dns_query) queries;
    dns_sock_t *socks;
    size_t nsocks, capsocks;
};

static void update_timer(pcr_dns_t *dns)
{
    struct timeval tv, *t = ares_timeout(dns->ch, NULL, &tv);
    if (t != NULL)
        evtimer_add(dns->timer, t);
    else
        evtimer_del(dns->timer);
}

static void on_sock(evutil_socket_t fd, short what, void *arg)
{
    pcr_dns_t *dns = arg;
    ares_process_fd(dns->ch, (what & EV_READ) ? fd : ARES_SOCKET_BAD,
                    (what & EV_WRITE) ? fd : ARES_SOCKET_BAD);
    update_timer(dns);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    pcr_dns_t *dns = arg;
    ares_process_fd(dns->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
    update_timer(dns);
}

/* c-ares opens, closes and changes interest in its sockets through this. An event freed here
 * may be the one whose callback is running: libevent allows that on the loop's own thread. */
static void on_sock_state(void *data, ares_socket_t fd, int readable, int writable)
{
    pcr_dns_t *dns = data;
    short what = (short)((readable ? EV_READ : 0) | (writable ? EV_WRITE : 0));
    size_t i = 0;
    while (i < dns->nsocks && dns->socks[i].fd != fd)
        i++;
    if (i < dns->nsocks) {
        if (dns->socks[i].what == what)
            return;
        event_free(dns->socks[i].ev);
        dns->socks[i] = dns->socks[--dns->nsocks];
    }
    if (what == 0)
        return;
    /* Bounded by the descriptors c-ares opens, each watched once. Unwatched (no memory): the
     * query times out through the timer. */
    if (pcr_grow_elems(&dns->socks, &dns->capsocks, dns->nsocks + 1, sizeof(*dns->socks), 4,
                       65536, NULL) != 0)
        return;
    struct event *ev = event_new(dns->base, fd, (short)(what | EV_PERSIST), on_sock, dns);
    if (ev == NULL || event_add(ev, NULL) != 0) {
        if (ev != NULL)
            event_free(ev);
        return;
    }
    dns->socks[dns->nsocks++] = (dns_sock_t){fd, what, ev};
}

/* One "IP" or "IP:PORT" list for c-ares ("IP:PORT,IP:PORT"). */
static char *servers_csv(char *const *ns, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(ns[i]) + 1;
    char *s = malloc(len), *p = s;
    if (s == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s%s", i ? "," : "", ns[i]);
    *p = '\0';
    return s;
}

pcr_dns_t *pcr_dns_new(struct event_base *base, char *const *nameservers, size_t n,
                       unsigned timeout_ms, char *err, size_t errlen)
{
    static int lib_ready;
    if (!lib_ready) {
        if (ares_library_init(ARES_LIB_INIT_ALL) != ARES_SUCCESS) {
            snprintf(err, errlen, "cannot set up the resolver library");
            return NULL;
        }
        lib_ready = 1;
    }
    pcr_dns_t *dns = calloc(1, sizeof(*dns));
    if (dns == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    dns->base = base;
    LIST_INIT(&dns->queries);
    dns->timer = evtimer_new(base, on_timer, dns);
    if (dns->timer == NULL) {
        snprintf(err, errlen, "out of memory");
        free(dns);
        return NULL;
    }
    struct ares_options o;
    memset(&o, 0, sizeof(o));
    o.flags = ARES_FLAG_EDNS;
    o.ednspsz = EDNS_PAYLOAD;
    o.timeout = (int)timeout_ms;
    o.tries = 2;
    o.sock_state_cb = on_sock_state;
    o.sock_state_cb_data = dns;
    int mask = ARES_OPT_FLAGS | ARES_OPT_EDNSPSZ | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES |
               ARES_OPT_SOCK_STATE_CB;
    /* With nameservers of its own, pcrouter asks only them (a test's resolver, a cluster's):
     * no /etc/hosts, no search domains from the machine's resolv.conf. */
    char lookups[] = "b";
    if (n > 0) {
        o.lookups = lookups;
        o.ndomains = 0;
        o.ndots = 1;
        mask |= ARES_OPT_LOOKUPS | ARES_OPT_DOMAINS | ARES_OPT_NDOTS;
    }
    int rc = ares_init_options(&dns->ch, &o, mask);
    if (rc != ARES_SUCCESS) {
        snprintf(err, errlen, "cannot set up the resolver: %s", ares_strerror(rc));
        event_free(dns->timer);
        free(dns);
        return NULL;
    }
    if (n > 0) {
        char *csv = servers_csv(nameservers, n);
        rc = csv != NULL ? ares_set_servers_ports_csv(dns->ch, csv) : ARES_ENOMEM;
        free(csv);
        if (rc != ARES_SUCCESS) {
            snprintf(err, errlen, "dns.nameservers: cannot use them (%s)", ares_strerror(rc));
            pcr_dns_free(dns);
            return NULL;
        }
    }
    return dns;
}

static void query_free(pcr_dns_query_t *q)
{
    LIST_REMOVE(q, link);
    if (q->later)
        event_free(q->later);
    free(q->addrs);
    free(q);
}

static void on_later(evutil_socket_t fd, short what, void *arg)
{
    pcr_dns_query_t *q = arg;
    pcr_dns_cb cb = q->cb;
    void *cbarg = q->arg;
    pcr_dns_addr_t *addrs = q->addrs;
    size_t n = q->naddrs;
    int err = q->err;
    char msg[sizeof(q->errmsg)];
    memcpy(msg, q->errmsg, sizeof(msg));
    q->addrs = NULL;
    query_free(q);
    cb(addrs, n, err, msg, cbarg);
    free(addrs);
}

/* Address order, so that an answer cut at PCR_DNS_MAX_ADDRS keeps the same addresses whatever
 * order the server rotates them in. */
static int addr_cmp(const void *a, const void *b)
{
    const pcr_dns_addr_t *x = a, *y = b;
    if (x->addr.ss_family != y->addr.ss_family)
        return x->addr.ss_family < y->addr.ss_family ? -1 : 1;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return memcmp(&x->addr, &y->addr, x->len);
}

static void take_answer(pcr_dns_query_t *q, const struct ares_addrinfo *res)
{
    size_t n = 0, total = 0;
    for (const struct ares_addrinfo_node *ai = res ? res->nodes : NULL; ai; ai = ai->ai_next)
        total += ai->ai_addrlen <= sizeof(struct sockaddr_storage);
    q->addrs = calloc(total ? total : 1, sizeof(*q->addrs));
    if (q->addrs == NULL) {
        q->err = PCR_DNS_FAIL;
        snprintf(q->errmsg, sizeof(q->errmsg), "out of memory");
        return;
    }
    for (const struct ares_addrinfo_node *ai = res ? res->nodes : NULL; ai; ai = ai->ai_next) {
        if (ai->ai_addrlen > sizeof(struct sockaddr_storage))
            continue;
        pcr_dns_addr_t *a = &q->addrs[n];
        memset(a, 0, sizeof(*a));
        memcpy(&a->addr, ai->ai_addr, ai->ai_addrlen);
        a->len = (socklen_t)ai->ai_addrlen;
        n++;
    }
    qsort(q->addrs, n, sizeof(*q->addrs), addr_cmp);
    size_t k = 0; /* an address listed twice counts once */
    for (size_t i = 0; i < n; i++)
        if (k == 0 || addr_cmp(&q->addrs[k - 1], &q->addrs[i]) != 0)
            q->addrs[k++] = q->addrs[i];
    if (k > PCR_DNS_MAX_ADDRS) {
        pcr_log_warn("dns: %s has %zu addresses; the first %u in address order are used", q->host,
                     k, PCR_DNS_MAX_ADDRS);
        k = PCR_DNS_MAX_ADDRS;
    }
    q->naddrs = k;
}

static void on_answer(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
    pcr_dns_query_t *q = arg;
    q->in_ares = 0;
    if (q->cancelled || status == ARES_EDESTRUCTION || status == ARES_ECANCELLED) {
        if (res)
            ares_freeaddrinfo(res);
        query_free(q);
        return;
    }
    if (status == ARES_SUCCESS) {
        take_answer(q, res);
    } else {
        q->err = status == ARES_ENOTFOUND || status == ARES_ENODATA ? PCR_DNS_NONAME : PCR_DNS_FAIL;
        snprintf(q->errmsg, sizeof(q->errmsg), "%s", ares_strerror(status));
    }
    if (res)
        ares_freeaddrinfo(res);
    event_active(q->later, 0, 0);
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
    snprintf(q->host, sizeof(q->host), "%s", host);
    q->later = event_new(dns->base, -1, 0, on_later, q);
    if (q->later == NULL) {
        free(q);
        return NULL;
    }
    LIST_INSERT_HEAD(&dns->queries, q, link);
    char service[8];
    snprintf(service, sizeof(service), "%u", port);
    struct ares_addrinfo_hints hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    /* No RFC 6724 sorting: it connects a UDP socket to every address to find its source, and
     * the order is ours (addr_cmp) anyway. */
    hints.ai_flags = ARES_AI_NUMERICSERV | ARES_AI_NOSORT;
    q->in_ares = 1;
    ares_getaddrinfo(dns->ch, host, service, &hints, on_answer, q);
    update_timer(dns);
    return q;
}

void pcr_dns_cancel(pcr_dns_query_t *q)
{
    if (q == NULL || q->cancelled)
        return;
    if (q->in_ares) {
        q->cancelled = 1; /* on_answer frees it when c-ares is done with it */
        return;
    }
    query_free(q); /* answered: its report has not run, and now never will */
}

void pcr_dns_free(pcr_dns_t *dns)
{
    if (dns == NULL)
        return;
    pcr_dns_query_t *q, *next;
    for (q = LIST_FIRST(&dns->queries); q != NULL; q = next) {
        next = LIST_NEXT(q, link);
        if (q->in_ares)
            q->cancelled = 1;
        else
            query_free(q);
    }
    /* Calls back every query still in it (freed there), and closes its sockets through
     * on_sock_state. */
    ares_destroy(dns->ch);
    for (size_t i = 0; i < dns->nsocks; i++)
        event_free(dns->socks[i].ev);
    free(dns->socks);
    event_free(dns->timer);
    free(dns);
}
