/* router/dns.h: asynchronous name resolution on the control loop (c-ares), for backend URLs
 * named by host at a reload, the Redis host, and DNS discovery. Never blocks the loop; every
 * query has dns.timeout_ms per try, two tries. Queries carry EDNS0 and a truncated answer is
 * asked again over TCP, so a name with hundreds of addresses resolves whole. Numeric addresses
 * answer at once (still through the callback, from the loop). */
#ifndef PCR_ROUTER_DNS_H
#define PCR_ROUTER_DNS_H

#include <stddef.h>
#include <sys/socket.h>

struct event_base;
typedef struct pcr_dns pcr_dns_t;
typedef struct pcr_dns_query pcr_dns_query_t;

/* At most this many addresses per answer: the lowest in address order (dns.c), so a cut
 * answer names the same pods at every lookup. */
#define PCR_DNS_MAX_ADDRS 256

/* The callback's err: 0, the name does not exist or has no address, or any other failure
 * (timeout, refused, malformed answer, out of memory). */
enum { PCR_DNS_NONAME = 1, PCR_DNS_FAIL = 2 };

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
/* Cancels what is in flight (no callback of ours follows) and frees the resolver at once.
 * Not from inside a query's callback of this resolver. */
void pcr_dns_free(pcr_dns_t *dns);

/* Resolves `host` (port `port`); the callback runs once, from the loop, unless cancelled.
 * NULL when out of memory. */
pcr_dns_query_t *pcr_dns_resolve(pcr_dns_t *dns, const char *host, unsigned port, pcr_dns_cb cb,
                                 void *arg);
void pcr_dns_cancel(pcr_dns_query_t *q);  /* no callback follows; NULL is a no-op */

#endif
