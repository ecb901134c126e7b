/* test/fuzz/fuzz_dns.c: DNS answers as a nameserver (or anyone who can spoof its UDP) sends
 * them, read by c-ares's own parsers for the two record types pcrouter's resolver asks for
 * (router/net/dns.c: ares_getaddrinfo, A and AAAA). pcrouter parses no DNS itself; this target
 * keeps the parsing it relies on under the same sanitizers as the rest.
 *
 * Invariants, beyond "no crash, no leak, no undefined behaviour":
 *   1. A rejected answer yields no host entry.
 *   2. An accepted one yields a host entry of its family (4 or 16 bytes an address), and at
 *      most as many TTL records as room was given, each the address the host entry lists at
 *      the same place.
 *   3. The same bytes parse the same way twice.
 *
 * The first byte picks the record type (A or AAAA) and how much room the TTLs get (0..15).
 * Corpus: test/fuzz/corpus/dns/. */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ares.h>

#include "fuzz.h"

#define MAX_TTLS 15

static size_t count_addrs(const struct hostent *h)
{
    size_t n = 0;
    while (h->h_addr_list != NULL && h->h_addr_list[n] != NULL)
        n++;
    return n;
}

static int parse(int aaaa, const unsigned char *buf, int len, int room, struct hostent **h,
                 void *ttls, int *nttls)
{
    *nttls = room;
    *h = NULL;
    return aaaa ? ares_parse_aaaa_reply(buf, len, h, (struct ares_addr6ttl *)ttls, nttls)
                : ares_parse_a_reply(buf, len, h, (struct ares_addrttl *)ttls, nttls);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    int aaaa = data[0] & 1, room = (data[0] >> 1) & MAX_TTLS;
    const unsigned char *buf = data + 1;
    int len = (int)(size - 1);
    struct ares_addr6ttl t6[MAX_TTLS], u6[MAX_TTLS];
    struct ares_addrttl t4[MAX_TTLS], u4[MAX_TTLS];
    struct hostent *h, *h2;
    int n, n2;
    int rc = parse(aaaa, buf, len, room, &h, aaaa ? (void *)t6 : (void *)t4, &n);
    int rc2 = parse(aaaa, buf, len, room, &h2, aaaa ? (void *)u6 : (void *)u4, &n2);
    FUZZ_CHECKF(rc == rc2, "parsed twice: %d then %d", rc, rc2);
    if (rc != ARES_SUCCESS) {
        FUZZ_CHECK(h == NULL && h2 == NULL);
        return 0;
    }
    FUZZ_CHECK(h != NULL && h2 != NULL);
    int fam = aaaa ? AF_INET6 : AF_INET, alen = aaaa ? 16 : 4;
    FUZZ_CHECKF(h->h_addrtype == fam && h->h_length == alen, "family %d, length %d",
                h->h_addrtype, h->h_length);
    size_t na = count_addrs(h);
    FUZZ_CHECKF(n >= 0 && n <= room && n == n2, "%d TTL records for room %d (then %d)", n, room, n2);
    FUZZ_CHECKF((size_t)n <= na, "%d TTL records for %zu addresses", n, na);
    FUZZ_CHECK(count_addrs(h2) == na);
    for (int i = 0; i < n; i++) {
        const void *a = aaaa ? (const void *)&t6[i].ip6addr : (const void *)&t4[i].ipaddr;
        const void *b = aaaa ? (const void *)&u6[i].ip6addr : (const void *)&u4[i].ipaddr;
        FUZZ_CHECKF(memcmp(a, h->h_addr_list[i], (size_t)alen) == 0,
                    "TTL record %d is not the host entry's address %d", i, i);
        FUZZ_CHECK(memcmp(a, b, (size_t)alen) == 0);
    }
    for (size_t i = 0; i < na; i++)
        FUZZ_CHECK(memcmp(h->h_addr_list[i], h2->h_addr_list[i], (size_t)alen) == 0);
    ares_free_hostent(h);
    ares_free_hostent(h2);
    return 0;
}
