/* router/config/config_addr.h: the address forms of the config file, parsed: a listen address, a
 * backend URL and the Redis URL. Private to the config loader (config.c); nothing else
 * includes this. All are pure functions of their text and return why it is wrong rather than
 * an error code, so that the loader can put the reason into its message. */
#ifndef PCR_ROUTER_CONFIG_ADDR_H
#define PCR_ROUTER_CONFIG_ADDR_H

#include <stdint.h>
#include <sys/socket.h>

/* "IP:PORT" or "[IPv6]:PORT", numeric (a listener is never named by a host to resolve), into
 * *ss and *len. Returns NULL, or why the address is wrong. */
const char *pcr_cfg_parse_listen_address(const char *s, struct sockaddr_storage *ss,
                                         socklen_t *len);

/* "http://HOST[:PORT][/]" or "https://...", HOST a name, an IPv4 address or a bracketed IPv6
 * address. On success sets *host (heap, without brackets), *port (80 or 443 by default) and
 * *tls (1 for https) and returns NULL; otherwise returns
 * why, or "" when the scheme is wrong (the generic message says it all). */
const char *pcr_cfg_parse_url(const char *url, char **host, uint16_t *port, int *tls);

/* "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]" (HOST as in a backend URL, PORT default 6379,
 * DB default 0; USER and PASSWORD percent-decoded). On success sets *host, *user (NULL when
 * none), *password (NULL when none) (heap) and *port, *db, and returns NULL; otherwise returns
 * why, with every output NULL. */
const char *pcr_cfg_parse_redis_url(const char *url, char **host, uint16_t *port, char **user,
                                    char **password, unsigned *db);

#endif
