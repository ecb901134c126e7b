/* router/upstream/upstream_h1.c: owns the HTTP/1.1 client of the upstream pools, the transport
 * table pcr_up_h1 (upstream_int.h): the connections to a pod, the request written on one, the
 * response read back with http-parser and handed to the caller as it arrives.
 *
 * Pods are checked as strictly as clients (http1.h): a status outside 100-599, 101, a header
 * name that is not a token, a value with CR/LF/NUL, folded lines, a Transfer-Encoding other
 * than "chunked", headers past MAX_RESP_HEADER_BYTES: the response is malformed
 * (PCR_UP_PROTOCOL, a 502 when nothing reached the client yet), decided here and only here.
 *
 * Deadlines, one timer per connection: connecting (the transport's connect timeout), waiting
 * for the head (timeouts.response_ms, from the request: bytes before the head do not restart
 * it), silence inside a body (timeouts.stream_idle_ms, restarted by every read, stopped while
 * the client side paused reading), idle in the pool (timeouts.upstream_keepalive_ms).
 *
 * Freeing: a callback may cancel its own request; the connection notices through `req == NULL`
 * after the parser returns, never touching freed memory (one close path, conn_close()). */

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <http_parser.h>

#include "pcr/common.h"
#include "log.h"
#include "pcr/hold.h"
#include "upstream_int.h"

static void conn_to_pool(pcr_upconn_t *c);
static void conn_close(pcr_upconn_t *c);
static void conn_assign(pcr_upconn_t *c, pcr_upreq_t *r);
static void h1_dispatch(pcr_upreq_t *r);

/* (Re)arms the connection's deadline, unless the response is paused by the client side. */
static void conn_arm(pcr_upconn_t *c, unsigned ms)
{
    c->timer_ms = ms;
    if (c->req != NULL && c->req->paused)
        return;
    struct timeval tv = pcr_ms_to_tv(ms);
    evtimer_add(c->timer, &tv);
}

/* ---- response parsing ---------------------------------------------------------------- */

static int malformed(pcr_upconn_t *c, const char *why)
{
    if (!c->malformed)
        pcr_log_warn("backend %s: malformed response: %s", c->be->conf.name, why);
    c->malformed = 1;
    return -1;
}

/* Appends to the current header name or value slot, opening a new slot when the parser moves
 * from names to values or back (it may deliver one name or value in several pieces). */
static int hdr_append(pcr_upconn_t *c, const char *at, size_t len, int is_value)
{
    if (c->hlen + len > MAX_RESP_HEADER_BYTES)
        return malformed(c, "headers larger than 64 KiB");
    if (c->nh == 0 || is_value != c->last_was_value) {
        if (c->nh >= MAX_RESP_HEADERS * 2)
            return malformed(c, "more than 64 header fields");
        c->hoff[c->nh] = c->hlen;
        c->hsz[c->nh] = 0;
        c->nh++;
        c->last_was_value = is_value;
    }
    if (pcr_grow(&c->hbuf, &c->hcap, c->hlen + len, 1024, MAX_RESP_HEADER_BYTES, NULL) != 0)
        return -1;
    memcpy(c->hbuf + c->hlen, at, len);
    c->hlen += len;
    c->hsz[c->nh - 1] += len;
    return 0;
}

static int on_hfield(http_parser *p, const char *at, size_t len)
{
    pcr_upconn_t *c = p->data;
    if (c->got_head)
        return 0; /* a chunked body's trailer field: dropped (http-parser bounds its size) */
    pcr_fold_field(&c->fold);
    return hdr_append(c, at, len, 0);
}

static int on_hvalue(http_parser *p, const char *at, size_t len)
{
    pcr_upconn_t *c = p->data;
    if (c->got_head)
        return 0; /* a trailer's value */
    if (pcr_fold_value(&c->fold, at, len) < 0)
        return malformed(c, "obsolete line folding in a header field");
    return hdr_append(c, at, len, 1);
}

static int on_headers_complete(http_parser *p)
{
    pcr_upconn_t *c = p->data;
    pcr_upreq_t *r = c->req;
    if (r == NULL)
        return -1;
    unsigned status = p->status_code;
    if (status < 100 || status > 599)
        return malformed(c, "status code outside 100-599");
    if (status == 101)
        return malformed(c, "101 Switching Protocols to a request that asked for no upgrade");
    if (status < 200) {
        /* 1xx interim response: drop it and wait for the final one. Like 204 and 304 below, it
         * ends at the blank line whatever its Content-Length says (RFC 9112, 6.3); returning 1
         * tells http-parser so. */
        c->nh = c->hlen = 0;
        return 1;
    }
    pcr_hdr_t hdrs[MAX_RESP_HEADERS];
    size_t n = 0;
    for (size_t i = 0; i + 1 < c->nh; i += 2) {
        const char *name = c->hbuf + c->hoff[i], *value = c->hbuf + c->hoff[i + 1];
        if (!pcr_http_token_valid(name, c->hsz[i]) || !pcr_http_value_valid(value, c->hsz[i + 1]))
            return malformed(c, "invalid header field");
        if (c->hsz[i] == 17 && strncasecmp(name, "transfer-encoding", 17) == 0 &&
            !pcr_http_te_is_chunked(value, c->hsz[i + 1]))
            return malformed(c, "Transfer-Encoding other than \"chunked\"");
        hdrs[n].name = name;
        hdrs[n].name_len = c->hsz[i];
        hdrs[n].value = value;
        hdrs[n].value_len = c->hsz[i + 1];
        n++;
    }
    int64_t clen = -1;
    if (!(p->flags & F_CHUNKED) && p->content_length != ULLONG_MAX)
        clen = (int64_t)p->content_length;
    c->got_head = 1;
    /* The response started: from here on, silence is measured by the stream idle timeout,
     * armed when this read is parsed (conn_parse), unless the response ended in it. */
    c->timer_ms = tmo(c->pool)->stream_idle_ms;
    r->cbs->on_head(r->ctx, (int)status, hdrs, n, clen);
    return status == 204 || status == 304;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    pcr_upconn_t *c = p->data;
    if (c->req == NULL)
        return -1;
    c->req->cbs->on_body(c->req->ctx, at, len);
    return 0;
}

static int on_message_complete(http_parser *p)
{
    pcr_upconn_t *c = p->data;
    if (!c->got_head) {
        pcr_fold_reset(&c->fold);
        return 0; /* the end of a 1xx */
    }
    c->done = 1;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings resp_settings = {
    .on_header_field = on_hfield,
    .on_header_value = on_hvalue,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ---- connection life ----------------------------------------------------------------- */

static void conn_to_pool(pcr_upconn_t *c)
{
    pcr_pool_t *pool = c->pool;
    c->req = NULL;
    c->reused = 1;
    pool->handing = 1; /* `c` is free to whoever goes next */
    pcr_upreq_t *w = pcr_upq_next(pool);
    pool->handing = 0;
    if (w != NULL && !w->resent) {
        pcr_upq_take_to_send(w);
        conn_assign(c, w);
        return;
    }
    if (w != NULL || *pool->draining) {
        /* The oldest waiter needs a fresh connection: closing this one makes room for it. */
        conn_close(c);
        return;
    }
    /* Idle: keep reading so a close by the backend is seen, and age out after keepalive. */
    pcr_sock_read_start(c->sock);
    conn_arm(c, tmo(c->pool)->upstream_keepalive_ms);
    TAILQ_INSERT_HEAD(&pool->idle, c, idle_link);
    c->in_idle = 1;
    pool->nidle++;
}

static void conn_close(pcr_upconn_t *c)
{
    pcr_pool_t *pool = c->pool;
    if (c->in_idle) {
        TAILQ_REMOVE(&pool->idle, c, idle_link);
        pool->nidle--;
    }
    event_free(c->timer);
    pcr_sock_free(c->sock);
    free(c->hbuf);
    free(c);
    pool->nconns--;
    PCR_SUB(pool->be->conns, 1);
    /* A slot freed up: give it to the next waiter. */
    pcr_upreq_t *w = pcr_upq_next(pool);
    if (w != NULL && !*pool->draining)
        pcr_upq_send(w);
}

/* The current request failed on this connection: re-send it once, on a fresh connection, if
 * this was a reused one that the backend had closed (nothing was received), else report; then
 * close. */
static void conn_fail(pcr_upconn_t *c, pcr_up_error_t err)
{
    pcr_upreq_t *r = c->req;
    pcr_pool_t *pool = c->pool;
    int stale = c->reused && !c->got_bytes && err == PCR_UP_RESET;
    int got_head = c->got_head;
    c->req = NULL;
    if (r != NULL) {
        r->conn = NULL;
        pcr_upreq_off_conn(r);
        if (err == PCR_UP_CONNECT)
            PCR_ADD(c->be->connect_errors, 1);
        else if (!stale)
            PCR_ADD(c->be->upstream_errors, 1);
    }
    conn_close(c);
    if (r == NULL)
        return;
    if (stale && !r->resent) {
        r->resent = 1;
        pcr_upreq_to(r, UPR_READY);
        h1_dispatch(r); /* still charged: it is not held again */
        return;
    }
    pcr_upq_uncharge(r);
    pcr_upq_freed(pool);
    pcr_upreq_fail(r, err, got_head);
}

/* The response ended: the request goes back to its owner, the connection to the pool. */
static void conn_done(pcr_upconn_t *c, int keep)
{
    pcr_upreq_t *r = c->req;
    pcr_pool_t *pool = c->pool;
    const pcr_upstream_cbs_t *cbs = r->cbs;
    void *ctx = r->ctx;
    r->conn = NULL;
    c->req = NULL;
    pcr_upreq_free(r); /* off the connection too (pcr_upreq_off_conn) */
    if (keep)
        conn_to_pool(c);
    else
        conn_close(c);
    pcr_upq_freed(pool);
    cbs->on_done(ctx);
}

/* Parses what the input holds; the connection may be closed or back in the pool after. */
static void conn_parse(pcr_upconn_t *c)
{
    struct evbuffer *in = pcr_sock_input(c->sock);
    c->got_bytes = 1;
    c->in_read = 1;
    enum http_errno e = HPE_OK;
    size_t trailing = 0;
    while (evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        pcr_fold_begin(&c->fold, v.iov_base, v.iov_len);
        size_t n = http_parser_execute(&c->parser, &resp_settings, v.iov_base, v.iov_len);
        pcr_fold_end(&c->fold);
        evbuffer_drain(in, n);
        e = HTTP_PARSER_ERRNO(&c->parser);
        if (c->req == NULL || e != HPE_OK || c->done) {
            trailing = evbuffer_get_length(in);
            break;
        }
    }
    c->in_read = 0;
    if (c->req == NULL) {
        /* Cancelled from inside a callback: close, so the pod stops generating. */
        conn_close(c);
    } else if (e != HPE_OK && e != HPE_PAUSED) {
        if (!c->malformed)
            pcr_log_warn("backend %s: malformed response: %s", c->be->conf.name,
                         http_errno_description(e));
        conn_fail(c, PCR_UP_PROTOCOL);
    } else if (c->done) {
        /* Keep-alive only when nothing trails the response and the request went out whole. */
        int keep = http_should_keep_alive(&c->parser) && trailing == 0 &&
                   pcr_sock_pending(c->sock) == 0;
        conn_done(c, keep);
    } else if (c->req != NULL && !c->req->paused && c->got_head) {
        /* Inside a body, silence is measured from the last byte. Before the head, the deadline
         * stays where it was set: a pod dribbling its head, or sending 1xx after 1xx, still
         * gets its 504 at timeouts.response_ms. */
        conn_arm(c, c->timer_ms);
    }
}

static void on_sock_read(pcr_sock_t *sock, void *arg)
{
    pcr_upconn_t *c = arg;
    if (c->req == NULL) {
        /* Bytes on an idle connection: the backend broke the protocol. */
        conn_close(c);
        return;
    }
    conn_parse(c);
}

/* The read side ended (EOF, error): a close-delimited body may be complete, else it failed. */
static void on_sock_end(pcr_sock_t *sock, pcr_sock_end_t why, void *arg)
{
    pcr_upconn_t *c = arg;
    if (why == PCR_SOCK_TLS_ERROR && pcr_sock_failure(sock)[0] != '\0') {
        PCR_ADD(c->be->tls_errors, 1);
        pcr_log_warn("backend %s: TLS to the pod failed: %s", c->be->conf.name, pcr_sock_failure(sock));
    }
    if (c->req == NULL) {
        conn_close(c); /* an idle connection the backend closed */
        return;
    }
    if (why == PCR_SOCK_EOF && c->got_head) {
        http_parser_execute(&c->parser, &resp_settings, NULL, 0);
        if (c->done) {
            conn_done(c, 0);
            return;
        }
    }
    conn_fail(c, why == PCR_SOCK_WRITE_TIMEOUT ? PCR_UP_TIMEOUT : PCR_UP_RESET);
}

static void on_sock_drain(pcr_sock_t *sock, void *arg) {}

static void on_sock_ready(pcr_sock_t *sock, int err, void *arg)
{
    pcr_upconn_t *c = arg;
    if (err != 0) {
        if (c->req == NULL) {
            conn_close(c);
            return;
        }
        const char *tls_why = pcr_sock_failure(sock);
        if (tls_why[0] != '\0') {
            /* Never a fallback to plain text: the pod is failing, and says why. */
            PCR_ADD(c->be->tls_errors, 1);
            pcr_log_warn("backend %s: TLS to the pod failed: %s", c->be->conf.name, tls_why);
        } else {
            pcr_log_warn("backend %s: connect failed: %s", c->be->conf.name, strerror(err));
        }
        conn_fail(c, PCR_UP_CONNECT);
        return;
    }
    c->connected = 1;
    if (c->req == NULL) {
        conn_to_pool(c); /* its request was cancelled while connecting */
        return;
    }
    pcr_sock_flush(c->sock);
    pcr_sock_read_start(c->sock);
    conn_arm(c, tmo(c->pool)->response_ms);
}

static const pcr_sock_cbs_t up_sock_cbs = {on_sock_read, on_sock_drain, on_sock_end, on_sock_ready};

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    pcr_upconn_t *c = arg;
    if (c->req == NULL)
        conn_close(c); /* idle past upstream_keepalive_ms */
    else
        conn_fail(c, PCR_UP_TIMEOUT);
}

/* What evbuffer_add_buffer_reference() could not reference (no memory for its chains) is
 * copied instead, chain by chain. */
static void add_copy(struct evbuffer *out, struct evbuffer *src)
{
    struct evbuffer_ptr at;
    struct evbuffer_iovec v;
    evbuffer_ptr_set(src, &at, 0, EVBUFFER_PTR_SET);
    while (evbuffer_peek(src, -1, &at, &v, 1) >= 1 && v.iov_len > 0) {
        if (evbuffer_add(out, v.iov_base, v.iov_len) != 0)
            return;
        if (evbuffer_ptr_set(src, &at, v.iov_len, EVBUFFER_PTR_ADD) != 0)
            return;
    }
}

static void conn_assign(pcr_upconn_t *c, pcr_upreq_t *r)
{
    c->req = r;
    r->conn = c;
    if (r->owner != NULL && r->owner->blind && !r->blind_on) {
        r->blind_on = 1;
        r->pool->nblind++;
    }
    pcr_upreq_to(r, UPR_ON_CONN);
    pcr_upq_charge(r);
    c->got_bytes = c->got_head = c->done = c->malformed = 0;
    c->nh = c->hlen = 0;
    c->last_was_value = 0;
    pcr_fold_reset(&c->fold);
    http_parser_init(&c->parser, HTTP_RESPONSE);
    c->parser.data = c;
    /* Copy, not move: the bytes are kept for one re-send if this pooled conn proves stale.
     * The body, most of the bytes, is only referenced: the output's chains point into the
     * caller's buffer (libevent keeps it alive while they do). */
    struct evbuffer *out = pcr_sock_output(c->sock);
    size_t len = evbuffer_get_length(r->request);
    evbuffer_add(out, evbuffer_pullup(r->request, -1), len);
    if (r->body != NULL && evbuffer_get_length(r->body) > 0 &&
        evbuffer_add_buffer_reference(out, r->body) != 0)
        add_copy(out, r->body);
    if (c->connected) {
        pcr_sock_read_start(c->sock);
        conn_arm(c, tmo(c->pool)->response_ms);
        pcr_sock_flush_soon(c->sock);
    }
}

static pcr_upconn_t *conn_open(pcr_pool_t *pool)
{
    pcr_backend_t *be = pool->be;
    pcr_upconn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->pool = pool;
    c->be = be;
    c->timer = evtimer_new(pool->base, on_timer, c);
    if (__atomic_load_n(&be->tls_ctx, __ATOMIC_ACQUIRE) != NULL) {
        SSL *ssl = pcr_backend_tls_ssl(be);
        c->sock = ssl == NULL ? NULL
                              : pcr_sock_tls_connect(pool->base, (struct sockaddr *)&be->addr,
                                                     be->addrlen, tmo(pool)->connect_ms, ssl);
    } else {
        c->sock = pcr_sock_connect(pool->base, (struct sockaddr *)&be->addr, be->addrlen,
                                   tmo(pool)->connect_ms);
    }
    if (c->timer == NULL || c->sock == NULL) {
        if (c->timer)
            event_free(c->timer);
        pcr_sock_free(c->sock);
        free(c);
        return NULL;
    }
    pcr_sock_set_cbs(c->sock, &up_sock_cbs, c);
    /* A pod that does not read the request is as stuck as one that does not answer. */
    pcr_sock_set_write_timeout(c->sock, tmo(pool)->response_ms);
    pool->nconns++;
    PCR_ADD(be->conns, 1);
    return c;
}

static void h1_dispatch(pcr_upreq_t *r)
{
    pcr_pool_t *pool = r->pool;
    if (pcr_upreq_budgeted(r) && !r->charged &&
        ((!pcr_upq_open(pool, r) && !pcr_hold_small(r->prefill)) || pcr_upq_bringer(pool, r) != NULL)) {
        /* The backend's prefill queue is full (and this one's own prefill is not too small
         * to matter), or what it counts on waits. */
        pcr_upq_add(r, 1);
        return;
    }
    pcr_upq_note_light(pool, r);
    if (!pcr_upq_may_take(pool, r)) {
        /* No connection free, or only the light clients' reserve, kept, and its client is
         * heavy. */
        pcr_upq_add(r, 0);
        return;
    }
    /* A re-sent request, or one whose client takes no answer byte now while few are idle
     * (pcr_upq_fresh), opens a fresh connection: the idle ones stay for light clients. */
    pcr_upconn_t *c = r->resent || pcr_upq_fresh(pool, r) ? NULL : TAILQ_FIRST(&pool->idle);
    if (c != NULL) {
        TAILQ_REMOVE(&pool->idle, c, idle_link);
        c->in_idle = 0;
        pool->nidle--;
        conn_assign(c, r);
        return;
    }
    if (pool->nconns >= pool->max_connections && r->resent &&
        (c = TAILQ_LAST(&pool->idle, pcr_upconn_idle)) != NULL)
        conn_close(c); /* room for the fresh connection: the oldest idle one goes */
    if (pool->nconns < pool->max_connections) {
        c = conn_open(pool);
        if (c != NULL) {
            conn_assign(c, r);
            return;
        }
    }
    pcr_upq_add(r, 0); /* wait for a slot */
}

/* ---- the transport table ------------------------------------------------------------- */

static void h1_abort(pcr_upreq_t *r)
{
    pcr_upconn_t *c = r->conn;
    c->req = NULL;
    r->conn = NULL;
    /* Inside its own read callback the connection sees req == NULL once the parser returns and
     * closes itself there; otherwise close it now. Either way the pod sees the connection
     * close and stops generating. */
    pcr_upreq_free(r);
    if (!c->in_read)
        conn_close(c);
}

static void h1_pause(pcr_upreq_t *r)
{
    pcr_sock_read_stop(r->conn->sock);
    evtimer_del(r->conn->timer); /* the client is slow, not the pod */
}

static void h1_resume(pcr_upreq_t *r)
{
    pcr_upconn_t *c = r->conn;
    pcr_sock_read_start(c->sock);
    conn_arm(c, c->timer_ms);
    /* Bytes read before the pause are still in the input buffer. */
    if (evbuffer_get_length(pcr_sock_input(c->sock)) > 0 && !c->in_read)
        conn_parse(c);
}

static void h1_close_idle(pcr_pool_t *pool)
{
    pcr_upconn_t *c;
    while ((c = TAILQ_FIRST(&pool->idle)) != NULL)
        conn_close(c);
}

const pcr_up_transport_t pcr_up_h1 = {
    .dispatch = h1_dispatch,
    .abort = h1_abort,
    .pause = h1_pause,
    .resume = h1_resume,
    .close_idle = h1_close_idle,
};
