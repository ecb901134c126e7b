/* router/http/session.h: a client connection. Every accepted connection is a session from the
 * moment it is accepted: first a handshake (conn.c: TLS, ALPN, h2c preface detection), then an
 * HTTP/1.1 or HTTP/2 session (h1_server.c, h2_server.c) that embeds pcr_session_t first.
 *
 * Each worker keeps its sessions in one list, so SIGTERM can ask each to drain, and the ones
 * that are waiting for a client (no request of theirs in flight: a handshake, an idle keep-alive
 * connection, a request head still arriving) in a second list, oldest first. When the
 * connection limit is reached, a new connection evicts the session that has waited longest, so
 * slow or idle clients cannot lock out the others. */
#ifndef PCR_ROUTER_SESSION_H
#define PCR_ROUTER_SESSION_H

#include <stdint.h>
#include <sys/queue.h>

#include "server.h"
#include "sock.h"
#include "tls.h"
#include "pcr/connshare.h"

typedef struct {
    /* Stop taking new requests; close once the ones in flight are answered. */
    void (*drain)(pcr_session_t *s);
    /* Close now, abandoning whatever is in flight (end of a drain that timed out, eviction). */
    void (*close)(pcr_session_t *s);
} pcr_session_ops_t;

struct pcr_session {
    pcr_worker_t *w;
    const pcr_session_ops_t *ops;
    LIST_ENTRY(pcr_session) link;
    TAILQ_ENTRY(pcr_session) wait_link;
    int waiting;                   /* on w->waiting */
    pcr_conn_kind_t kind;          /* its protocol, for the memory account (memacct.h) */
    pcr_light_client_t load;       /* its requests on pod connections now (the fewer, the
                                    * sooner its next one gets a free one) and when an answer
                                    * of it was last reset unread (pcr/connshare.h) */
};

/* The worker's lists (sessions.c): a session joins at accept and leaves when it closes (which
 * may end a draining worker's loop). Its `kind` is counted in the worker's nconns. */
void pcr_session_register(pcr_worker_t *w, pcr_session_t *s, const pcr_session_ops_t *ops,
                          pcr_conn_kind_t kind);
void pcr_session_unregister(pcr_session_t *s);
/* Moves the session onto (1) or off (0) the waiting list; going on puts it last (youngest). */
void pcr_session_set_waiting(pcr_session_t *s, int waiting);

/* Protocol sessions, started on a socket whose first bytes (if any) are already in its input
 * buffer. They own `sock` from here on; on failure (PCR_ERR_*) the caller still owns it. */
int pcr_h1_session_start(pcr_worker_t *w, pcr_sock_t *sock);
int pcr_h2_session_start(pcr_worker_t *w, pcr_sock_t *sock);

/* Listeners (conn.c). The main thread makes a plan (binds one socket per new listener and
 * worker, loads the TLS contexts; `old`: the config whose listeners run now, NULL at start);
 * each worker adopts it (keeps, opens, closes its listeners) and then accepts on its own
 * sockets: TLS handshake and ALPN, h2c preface detection. */
pcr_listen_plan_t *pcr_listen_plan_new(pcr_server_t *srv, const pcr_config_t *cfg,
                                       const pcr_config_t *old);
void pcr_listen_plan_free(pcr_listen_plan_t *plan);  /* sockets no worker took, TLS contexts */
int pcr_listeners_adopt(pcr_worker_t *w, pcr_listen_plan_t *plan, const pcr_config_t *cfg);
void pcr_listeners_stop(pcr_worker_t *w);      /* stop accepting */
/* Pauses (1) or resumes (0) accepting on the public listeners, for the overload action
 * stop_accepting; the admin listener is left accepting. */
void pcr_listeners_pause(pcr_worker_t *w, int pause);
void pcr_listeners_free(pcr_worker_t *w);

#endif
