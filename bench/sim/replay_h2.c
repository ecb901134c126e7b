/* bench/sim/replay_h2.c: the replayer's h2c client (HTTP/2 over cleartext TCP, prior
 * knowledge), behind the same rc_cb_t callbacks as the HTTP/1.1 pool.
 *
 * One h2_conn_t owns its bufferevent and its nghttp2 client session; requests are spread over
 * `nconns` connections round robin, one stream each. nghttp2 queues streams beyond the
 * server's SETTINGS_MAX_CONCURRENT_STREAMS and handles flow control. Every read feeds
 * nghttp2_session_mem_recv, then flushes nghttp2_session_send. A stream's request is freed at
 * its stream-close (or its timeout, which resets the stream first); on_done is called once. */
#include "replay_h2.h"

#include <event2/bufferevent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcr/common.h"

typedef struct h2_conn h2_conn_t;

typedef struct h2_req h2_req_t;

struct h2_req {
    h2_conn_t *conn;
    h2_req_t *prev, *next;  /* the connection's live requests */
    int32_t stream_id;
    struct evbuffer *body;
    const rc_cb_t *cb;
    void *arg;
    struct event *timer;
    int status;
    int finished;           /* on_done was called; the stream may still be closing */
};

struct h2_conn {
    rh2_pool_t *pool;
    struct bufferevent *bev;
    nghttp2_session *session;
    h2_req_t *reqs;
    int dead;
};

struct rh2_pool {
    struct event_base *base;
    rc_target_t t;
    h2_conn_t **conns;
    unsigned nconns, next;
};

static void req_finish(h2_req_t *r, int err)
{
    if (r->finished)
        return;
    r->finished = 1;
    if (r->timer)
        evtimer_del(r->timer);
    r->cb->on_done(r->arg, err);
}

static void req_free(h2_req_t *r)
{
    h2_conn_t *c = r->conn;
    if (c) {
        if (r->prev) r->prev->next = r->next; else c->reqs = r->next;
        if (r->next) r->next->prev = r->prev;
    }
    if (r->timer)
        event_free(r->timer);
    if (r->body)
        evbuffer_free(r->body);
    free(r);
}

static ssize_t on_send(nghttp2_session *s, const uint8_t *data, size_t len, int flags, void *ud)
{
    h2_conn_t *c = ud;
    bufferevent_write(c->bev, data, len);
    return (ssize_t)len;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
                     size_t nl, const uint8_t *value, size_t vl, uint8_t flags, void *ud)
{
    h2_req_t *r = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
    if (!r || r->finished || f->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (nl == 7 && memcmp(name, ":status", 7) == 0) {
        r->status = atoi((const char *)value);
        r->cb->on_status(r->arg, r->status);
    } else if (nl == 9 && memcmp(name, "x-sim-pod", 9) == 0 && r->cb->on_pod) {
        r->cb->on_pod(r->arg, (const char *)value, vl);
    }
    return 0;
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data,
                   size_t len, void *ud)
{
    h2_req_t *r = nghttp2_session_get_stream_user_data(s, id);
    if (r && !r->finished)
        r->cb->on_body(r->arg, (const char *)data, len);
    return 0;
}

static int on_close(nghttp2_session *s, int32_t id, uint32_t error_code, void *ud)
{
    h2_req_t *r = nghttp2_session_get_stream_user_data(s, id);
    if (!r)
        return 0;
    nghttp2_session_set_stream_user_data(s, id, NULL);
    req_finish(r, error_code == NGHTTP2_NO_ERROR ? 0 : PCR_ERR_IO);
    req_free(r);
    return 0;
}

static ssize_t read_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
                         uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    h2_req_t *r = src->ptr;
    int n = evbuffer_remove(r->body, buf, len);
    if (n < 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (evbuffer_get_length(r->body) == 0)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return n;
}

/* The connection is unusable: every open stream fails, the session goes. */
static void conn_kill(h2_conn_t *c)
{
    if (c->dead)
        return;
    c->dead = 1;
    /* nghttp2_session_del calls no stream-close callback: fail and free the requests here. */
    while (c->reqs) {
        h2_req_t *r = c->reqs;
        req_finish(r, PCR_ERR_IO);
        req_free(r);
    }
    nghttp2_session_del(c->session);
    c->session = NULL;
    bufferevent_free(c->bev);
    c->bev = NULL;
}

static void flush(h2_conn_t *c)
{
    if (!c->dead && nghttp2_session_send(c->session) != 0)
        conn_kill(c);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    h2_conn_t *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n = evbuffer_get_length(in);
    ssize_t used = nghttp2_session_mem_recv(c->session, evbuffer_pullup(in, -1), n);
    if (used < 0) {
        fprintf(stderr, "replay: h2c: %s\n", nghttp2_strerror((int)used));
        conn_kill(c);
        return;
    }
    evbuffer_drain(in, (size_t)used);
    flush(c);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    h2_conn_t *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return;
    }
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        conn_kill(c);
}

static h2_conn_t *conn_open(rh2_pool_t *pool)
{
    h2_conn_t *c = calloc(1, sizeof(*c));
    nghttp2_session_callbacks *cbs = NULL;
    if (!c || nghttp2_session_callbacks_new(&cbs) != 0) {
        free(c);
        return NULL;
    }
    nghttp2_session_callbacks_set_send_callback(cbs, on_send);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_close);
    int rv = nghttp2_session_client_new(&c->session, cbs, c);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0) {
        free(c);
        return NULL;
    }
    c->pool = pool;
    c->bev = bufferevent_socket_new(pool->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev) {
        nghttp2_session_del(c->session);
        free(c);
        return NULL;
    }
    bufferevent_setcb(c->bev, on_read, NULL, on_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&pool->t.addr,
                                   (int)pool->t.addrlen)) {
        conn_kill(c);
        return c;
    }
    /* A large connection window: responses are many small DATA frames, never held back. */
    nghttp2_settings_entry iv[] = {
        { NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 1000 },
        { NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20 },
    };
    nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, 2);
    nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0, 1 << 24);
    flush(c);
    return c;
}

rh2_pool_t *rh2_pool_new(struct event_base *base, const char *url, unsigned nconns,
                         const char **path)
{
    rc_target_t t;
    if (rc_target_parse(url, &t) != 0)
        return NULL;
    rh2_pool_t *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return NULL;
    pool->base = base;
    pool->t = t;
    pool->nconns = nconns ? nconns : 1;
    pool->conns = calloc(pool->nconns, sizeof(h2_conn_t *));
    if (!pool->conns) {
        free(pool);
        return NULL;
    }
    *path = t.path;
    return pool;
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    h2_req_t *r = arg;
    h2_conn_t *c = r->conn;
    req_finish(r, PCR_ERR_TIMEOUT);
    /* The stream closes later (on_close frees the request). */
    if (!c->dead && r->stream_id > 0) {
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, r->stream_id, NGHTTP2_CANCEL);
        flush(c);
    }
}

void rh2_send(rh2_pool_t *pool, const char *path, struct evbuffer *body, double timeout_s,
              const rc_cb_t *cb, void *arg)
{
    unsigned k = pool->next++ % pool->nconns;
    h2_conn_t *c = pool->conns[k];
    if (!c || c->dead) {
        if (c)
            free(c);
        c = pool->conns[k] = conn_open(pool);
    }
    h2_req_t *r = calloc(1, sizeof(*r));
    if (!c || c->dead || !r || !(r->body = evbuffer_new()) ||
        !(r->timer = evtimer_new(pool->base, on_timeout, r))) {
        if (r)
            req_free(r);
        cb->on_done(arg, c && !c->dead ? PCR_ERR_NOMEM : PCR_ERR_IO);
        return;
    }
    r->conn = c;
    r->next = c->reqs;
    if (c->reqs) c->reqs->prev = r;
    c->reqs = r;
    r->cb = cb;
    r->arg = arg;
    evbuffer_add_buffer(r->body, body);
    char clen[24];
    snprintf(clen, sizeof clen, "%zu", evbuffer_get_length(r->body));
#define NV(n, v) { (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE }
    nghttp2_nv nva[] = {
        NV(":method", "POST"), NV(":scheme", "http"), NV(":authority", pool->t.hostport),
        NV(":path", path), NV("content-type", "application/json"), NV("content-length", clen),
    };
#undef NV
    nghttp2_data_provider dp = { .source.ptr = r, .read_callback = read_body };
    r->stream_id = nghttp2_submit_request(c->session, NULL, nva, PCR_ARRAY_SIZE(nva), &dp, r);
    if (r->stream_id < 0) {
        req_free(r);
        cb->on_done(arg, PCR_ERR_IO);
        return;
    }
    struct timeval tv = { (time_t)timeout_s, (suseconds_t)((timeout_s - (time_t)timeout_s) * 1e6) };
    evtimer_add(r->timer, &tv);
    flush(c);
}

void rh2_pool_free(rh2_pool_t *pool)
{
    if (!pool)
        return;
    for (unsigned i = 0; i < pool->nconns; i++) {
        h2_conn_t *c = pool->conns[i];
        if (!c)
            continue;
        for (h2_req_t *r = c->reqs; r; r = r->next)
            r->finished = 1;   /* dropped without callbacks, as the header says */
        conn_kill(c);
        free(c);
    }
    free(pool->conns);
    free(pool);
}
