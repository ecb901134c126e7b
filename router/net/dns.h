/* router/dns.h: asynchronous name resolution on the control loop (libevent's evdns), for
 * backend URLs named by host at a reload and for DNS discovery. Never blocks the loop; every
 * query has dns.timeout_ms. Numeric addresses answer at once (still through the callback,
 * from the loop). */
#ifndef PCR_ROUTER_DNS_H
#define PCR_ROUTER_DNS_H

#include <stddef.h>
#include <sys/socket.h>

struct event_base;
typedef struct pcr_dns pcr_dns_t;
typedef struct pcr_dns_query pcr_dns_query_t;

#define PCR_DNS_MAX_ADDRS 256

typedef struct {
    struct sockaddr_storage addr;
    socklen_t len;
} pcr_dns_addr_t;

/* The answer: `n` addresses (port set), or err != 0 with a message (naddrs 0). */
typedef void (*pcr_dns_cb)(const pcr_dns_addr_t *addrs, size_t naddrs, int err,
                           const char *errmsg, void *arg);

/* `nameservers`: "IP" or "IP:PORT" strings, none for /etc/resolv.conf. NULL on failure, with
 * why in `err`. */
pcr_dns_t *pcr_dns_new(struct event_base *base, char *const *nameservers, size_t n,
                       unsigned timeout_ms, char *err, size_t errlen);
/* Cancels what is in flight (no callback of ours follows); the resolver itself goes a loop turn
 * after evdns has called back for the last of them (dns.c says why). */
void pcr_dns_free(pcr_dns_t *dns);
/* Resolvers freed but not gone yet: before exiting, run the loop until this is 0. */
unsigned pcr_dns_retiring(void);

/* Resolves `host` (port `port`); the callback runs once, from the loop, unless cancelled.
 * NULL when out of memory. */
pcr_dns_query_t *pcr_dns_resolve(pcr_dns_t *dns, const char *host, unsigned port, pcr_dns_cb cb,
                                 void *arg);
void pcr_dns_cancel(pcr_dns_query_t *q);  /* no callback follows; NULL is a no-op */

#endif
