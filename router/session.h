/* router/session.h: a client connection once its protocol is known. h1_server.c and
 * h2_server.c each embed pcr_session_t first in their session struct; the server keeps every
 * session in one list so SIGTERM can ask each to drain. */
#ifndef PCR_ROUTER_SESSION_H
#define PCR_ROUTER_SESSION_H

#include <sys/queue.h>

#include <event2/bufferevent.h>

#include "server.h"

typedef struct {
    /* Stop taking new requests; close once the ones in flight are answered. */
    void (*drain)(pcr_session_t *s);
    /* Close now, abandoning whatever is in flight (end of a drain that timed out). */
    void (*close)(pcr_session_t *s);
} pcr_session_ops_t;

struct pcr_session {
    pcr_server_t *srv;
    const pcr_session_ops_t *ops;
    LIST_ENTRY(pcr_session) link;
};

void pcr_session_register(pcr_server_t *srv, pcr_session_t *s, const pcr_session_ops_t *ops);
void pcr_session_unregister(pcr_session_t *s);

/* Protocol sessions, started on a connection whose first bytes (if any) are already in the
 * bufferevent's input buffer. They own `bev` from here on; `plain` says it is a socket
 * bufferevent (not TLS), which may be written to directly (io.h). */
int pcr_h1_session_start(pcr_server_t *srv, struct bufferevent *bev, int plain);
int pcr_h2_session_start(pcr_server_t *srv, struct bufferevent *bev, int plain);

/* Listeners (conn.c): accept, TLS handshake and ALPN, h2c preface detection. */
int pcr_listeners_start(pcr_server_t *srv);
void pcr_listeners_stop(pcr_server_t *srv);   /* stop accepting */
void pcr_listeners_free(pcr_server_t *srv);   /* and free TLS contexts */

/* TLS (tls.c): a server SSL_CTX offering ALPN h2 and http/1.1. */
SSL_CTX *pcr_tls_ctx_new(const char *cert, const char *key, char *err, size_t errlen);

#endif
