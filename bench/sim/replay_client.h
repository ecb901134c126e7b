/* bench/sim/replay_client.h: the replayer's HTTP/1.1 client (libevent + http-parser).
 *
 * A pool per target keeps idle keep-alive connections and opens new ones up to a bound;
 * requests beyond it wait in FIFO order. Each request has a wall-clock timeout. A request sent
 * on a reused connection that the server had already closed (EOF before any response byte) is
 * retried once on a fresh connection, since nothing reached the server.
 *
 * Ownership: rc_pool_new / rc_pool_free; a request is owned by the pool from rc_send until its
 * on_done callback, which is called exactly once (possibly from inside rc_send on a
 * synchronous failure) and after which no other callback comes. */
#ifndef PCR_BENCH_REPLAY_CLIENT_H
#define PCR_BENCH_REPLAY_CLIENT_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <stddef.h>
#include <sys/socket.h>

typedef struct rc_pool rc_pool_t;

/* A target URL "http://host:port[/path]", resolved once (getaddrinfo, before the loop runs). */
typedef struct {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char hostport[300];    /* for Host / :authority */
    const char *path;      /* points into the URL; "/" when absent */
} rc_target_t;

/* 0, or -1 with a message on stderr. */
int rc_target_parse(const char *url, rc_target_t *t);

typedef struct {
    void (*on_status)(void *arg, int status);
    /* The x-sim-pod response header, when present. */
    void (*on_pod)(void *arg, const char *value, size_t len);
    void (*on_body)(void *arg, const char *data, size_t len);
    /* err: 0 complete response, else a PCR_ERR_* (IO: connection lost or refused,
     * TIMEOUT, PARSE: not HTTP). */
    void (*on_done)(void *arg, int err);
} rc_cb_t;

/* url: "http://host:port" with an optional path, which is returned in *path (points into url,
 * "/" when absent). NULL (and a message on stderr) when url is not like that. */
rc_pool_t *rc_pool_new(struct event_base *base, const char *url, unsigned max_conns,
                       const char **path);
void rc_pool_free(rc_pool_t *pool);   /* closes every connection; pending requests are dropped
                                          without callbacks */

/* Sends method path with body (may be NULL; its contents are moved). */
void rc_send(rc_pool_t *pool, const char *method, const char *path, struct evbuffer *body,
             double timeout_s, const rc_cb_t *cb, void *arg);

unsigned rc_pool_open_conns(const rc_pool_t *pool);

#endif
