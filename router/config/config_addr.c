/* router/config/config_addr.c: parsing the listen addresses, backend URLs and the Redis URL of the
 * config file (contract in config_addr.h). It knows their syntax only; the loader decides what to say. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_addr.h"

/* "0".."65535" exactly (digits only); -1 otherwise. */
static long parse_port(const char *s, size_t len)
{
    long v = 0;
    if (len == 0 || len > 5)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v <= 65535 ? v : -1;
}

const char *pcr_cfg_parse_listen_address(const char *s, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[INET6_ADDRSTRLEN + 1];
    const char *port;
    size_t hlen;
    memset(ss, 0, sizeof *ss);
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (close == NULL)
            return "missing \"]\"";
        if (close[1] != ':')
            return "missing \":PORT\" after \"]\"";
        hlen = (size_t)(close - s - 1);
        port = close + 2;
        if (hlen >= sizeof host)
            return "not a numeric IPv6 address";
        memcpy(host, s + 1, hlen);
        host[hlen] = '\0';
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
            return "not a numeric IPv6 address";
        a->sin6_family = AF_INET6;
        *len = sizeof *a;
    } else {
        const char *colon = strrchr(s, ':');
        if (colon == NULL)
            return "missing \":PORT\"";
        hlen = (size_t)(colon - s);
        port = colon + 1;
        if (memchr(s, ':', hlen) != NULL)
            return "an IPv6 address must be in brackets, as in \"[::1]:8080\"";
        if (hlen >= sizeof host)
            return "not a numeric IPv4 address";
        memcpy(host, s, hlen);
        host[hlen] = '\0';
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
            return "not a numeric IPv4 address (host names are not resolved)";
        a->sin_family = AF_INET;
        *len = sizeof *a;
    }
    long p = parse_port(port, strlen(port));
    if (p < 0)
        return "the port must be a number from 0 to 65535";
    if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)p);
    else
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)p);
    return NULL;
}

static int is_host_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '.' || ch == '_';
}

/* The host of a URL at `h`: a name, an IPv4 address or a bracketed IPv6 address. Sets *start
 * and *end to the host without brackets and *rest to what follows; NULL, or why not. */
static const char *parse_host(const char *h, const char **start, const char **end,
                              const char **rest)
{
    if (*h == '[') {
        char tmp[INET6_ADDRSTRLEN + 1];
        struct in6_addr a6;
        const char *close = strchr(h, ']');
        h++;
        if (close == NULL || (size_t)(close - h) >= sizeof tmp)
            return "not a valid bracketed IPv6 address";
        memcpy(tmp, h, (size_t)(close - h));
        tmp[close - h] = '\0';
        if (inet_pton(AF_INET6, tmp, &a6) != 1)
            return "not a valid bracketed IPv6 address";
        *start = h;
        *end = close;
        *rest = close + 1;
        return NULL;
    }
    const char *e;
    for (e = h; is_host_char(*e); e++)
        ;
    if (e == h)
        return "the host is missing";
    *start = h;
    *end = *rest = e;
    return NULL;
}

const char *pcr_cfg_parse_url(const char *url, char **host, uint16_t *port, int *tls)
{
    const char *h, *end;   /* the host as written, brackets of an IPv6 address excluded */
    const char *rest;      /* what follows the host */
    const char *why;
    long p = 80;
    size_t skip = 7;
    *tls = 0;
    if (strncasecmp(url, "https://", 8) == 0) {
        *tls = 1;
        p = 443;
        skip = 8;
    } else if (strncasecmp(url, "http://", 7) != 0) {
        return "";
    }
    if ((why = parse_host(url + skip, &h, &end, &rest)) != NULL)
        return why;
    if (*rest == ':') {
        size_t plen = strcspn(rest + 1, "/?#");
        p = parse_port(rest + 1, plen);
        if (p < 1)
            return "the port must be a number from 1 to 65535";
        rest += 1 + plen;
    }
    if (rest[0] == '/' && rest[1] == '\0')
        rest++;
    if (*rest == '/' || *rest == '?' || *rest == '#')
        return "a path or query is not allowed";
    if (*rest != '\0')
        return "the host may hold only letters, digits, \"-\", \".\" and \"_\"";
    *host = strndup(h, (size_t)(end - h));
    *port = (uint16_t)p;
    return *host == NULL ? "out of memory" : NULL;
}

static int hex_value(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* s[0..n) with %XX sequences decoded, into a heap string; NULL when a sequence is broken or
 * decodes to NUL (hiredis takes C strings) or when out of memory. */
static char *percent_decode(const char *s, size_t n)
{
    char *out = malloc(n + 1), *o = out;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            *o++ = s[i];
            continue;
        }
        int hi = i + 2 < n ? hex_value(s[i + 1]) : -1;
        int lo = i + 2 < n ? hex_value(s[i + 2]) : -1;
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
            free(out);
            return NULL;
        }
        *o++ = (char)(hi * 16 + lo);
        i += 2;
    }
    *o = '\0';
    return out;
}

const char *pcr_cfg_parse_redis_url(const char *url, char **host, uint16_t *port, char **user,
                                    char **password, unsigned *db)
{
    const char *h, *end, *rest, *at, *why = NULL;
    long p = 6379, d = 0;
    *host = *user = *password = NULL;
    if (strncasecmp(url, "rediss://", 9) == 0)
        return "TLS is not supported (hiredis 0.14 has none): reach a TLS Redis through a local "
               "tunnel such as stunnel, and point redis:// at it";
    if (strncasecmp(url, "redis://", 8) != 0)
        return "";
    h = url + 8;
    /* The userinfo ends at the last '@' before the path: a password may hold '@' if encoded,
     * and a raw one is taken up to the host all the same. */
    at = NULL;
    for (const char *q = h; *q && *q != '/'; q++)
        if (*q == '@')
            at = q;
    if (at != NULL) {
        const char *colon = memchr(h, ':', (size_t)(at - h));
        if (colon == NULL)
            return "the part before \"@\" must be \"[USER]:PASSWORD\"";
        if (colon > h && (*user = percent_decode(h, (size_t)(colon - h))) == NULL) {
            why = "the user has a broken %-escape";
            goto fail;
        }
        if ((*password = percent_decode(colon + 1, (size_t)(at - colon - 1))) == NULL) {
            why = "the password has a broken %-escape";
            goto fail;
        }
        if ((*password)[0] == '\0') {
            free(*password);
            *password = NULL;
        }
        h = at + 1;
    }
    if ((why = parse_host(h, &h, &end, &rest)) != NULL)
        goto fail;
    if (*rest == ':') {
        size_t plen = strcspn(rest + 1, "/");
        p = parse_port(rest + 1, plen);
        if (p < 1) {
            why = "the port must be a number from 1 to 65535";
            goto fail;
        }
        rest += 1 + plen;
    }
    if (*rest == '/' && rest[1] != '\0') {
        d = parse_port(rest + 1, strlen(rest + 1));
        if (d < 0) {
            why = "the database must be a number from 0 to 65535";
            goto fail;
        }
        rest += strlen(rest);
    } else if (*rest == '/') {
        rest++;
    }
    if (*rest != '\0') {
        why = "the host may hold only letters, digits, \"-\", \".\" and \"_\"";
        goto fail;
    }
    if ((*host = strndup(h, (size_t)(end - h))) == NULL) {
        why = "out of memory";
        goto fail;
    }
    *port = (uint16_t)p;
    *db = (unsigned)d;
    return NULL;
fail:
    free(*user);
    free(*password);
    *user = *password = NULL;
    return why;
}
