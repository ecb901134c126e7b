/* router/http/h1_server.c: owns an HTTP/1.1 client connection: request parsing with http-parser,
 * framing checked as strictly as RFC 9112 asks, keep-alive, pipelining, response framing, and
 * the connection's deadlines and budgets.
 *
 * Pipelined requests are answered in order, one at a time: when a request is complete the
 * parser is paused, later bytes wait in the input buffer (reading stops past PIPELINE_MAX_BYTES),
 * and parsing resumes once the response has ended. Responses of unknown length are chunked (an
 * SSE stream reaches the client event by event). Past PCR_WRITE_HIGH of output the exchange
 * keeps the answer itself (respond.c), up to a bound, then pauses the upstream; the transport's
 * drain notification at PCR_WRITE_LOW (pcr_exchange_on_writable) takes more of it.
 *
 * Framing: header names must be tokens (no whitespace before the colon), values free of CR, LF
 * and NUL, obs-fold is refused, Transfer-Encoding must be exactly "chunked" and never comes with
 * Content-Length, at most one Content-Length, exactly one Host on HTTP/1.1; anything else is a
 * 400 and the connection closes, since the rest of the stream cannot be trusted to be in sync.
 * An absolute-form target is taken as its path.
 *
 * Where the connection stands is one state (h1_state_t), changed only by h1_to(), which also
 * sets the one timer's deadline for it:
 *   IDLE    no request begun: closed quietly after timeouts.client_idle_ms
 *   HEAD    a request head is arriving: 408 unless complete within timeouts.request_header_ms
 *   BODY    the body is arriving: 408 when no byte came for timeouts.client_idle_ms
 *   BUSY    the request is being answered (or refused): the client may be silent (a stream can
 *           take minutes); a client that accepts no bytes for timeouts.client_write_ms is cut by
 *           the transport
 *   LINGER  a refused request's answer is out: half-closed, input discarded for LINGER_MS
 *
 *   IDLE -> HEAD -> BODY -> BUSY -> IDLE (keep-alive: the next request)
 *   IDLE | HEAD | BODY -> BUSY (refused) -> LINGER -> closed
 * Any state may end in h1_close(). What is not where the connection stands stays a flag: how
 * the current response is framed, and decisions about its end (close after it, linger).
 * Body budget (budget.h): a connection reads a body only while what it holds plus one more read
 * fits its allowance (PCR_BODY_ALLOWANCE) and what it reserved; past that it reserves more
 * (BODY_GRANT at a time) before reading on, or stops reading and waits for budget. A body that
 * cannot get budget for timeouts.client_idle_ms is answered 503, as is one waiting while the
 * memory account refuses requests, at the worker's next tick (budget_shed). A body that fits the
 * allowance (most prompts) never asks; the reservation goes back when the request is freed.
 *
 * Lingering close: a request refused before its body was read (400, 408, 413, 431) leaves
 * unread bytes behind; closing then would make the kernel answer them with a reset that can
 * destroy the error response before the client reads it. So the answer is written, the sending
 * side shut down, and what still arrives is read and thrown away until the client closes or
 * LINGER_MS pass (nginx's lingering_close, HAProxy's "nolinger" being the exception).
 *
 * One close path, h1_close(); the exchange is freed from the deferred `advance` event or from a
 * transport callback, never from inside the exchange's own calls.
 *
 * Over 700 lines, kept whole: it is one session's state, and its framing checks, timer modes,
 * pipelining and lingering close each read and write the same fields. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <http_parser.h>

#include "pcr/common.h"
#include "budget.h"
#include "exchange.h"
#include "http1.h"
#include "log.h"
#include "session.h"

typedef enum { H1_IDLE, H1_HEAD, H1_BODY, H1_BUSY, H1_LINGER } h1_state_t;

/* How long a rejected request's connection keeps reading (and discarding) after its answer. */
#define LINGER_MS 2000

/* A body segment of at least PCR_BODY_TAKE_MIN bytes (exchange.h) is moved to the request
 * with the read buffer it is in (whole buffers by reference, evbuffer_remove_buffer) instead
 * of being copied; at most TAKE_MAX segments per chunk parsed (a chunked body may have more:
 * the rest are copied). */
#define TAKE_MAX 8

/* Budget is reserved this much at a time, so that an upload asks the shared count once every
 * few reads. */
#define BODY_GRANT (64 * 1024)

/* What reading a request takes and an idle connection does not: made when bytes arrive
 * (parse_input), freed with the head's buffers when the connection waits again (ps_free). */
typedef struct {
    char *url;
    size_t url_len, url_cap;
    char *name, *value;            /* the header being parsed */
    size_t name_len, value_len, name_cap, value_cap;
    int in_value;
    size_t header_bytes;
    /* Request framing as seen in the head. */
    unsigned n_host, n_cl, n_te;
    int te_bad;
    int expect_continue;
    pcr_fold_t fold;               /* obs-fold detection across reads */
    /* Body bytes of the chunk being parsed that are moved, not copied, to the request once
     * http_parser_execute returns (see on_body). */
    const char *take_base;         /* the chunk */
    struct {
        size_t off, len;
    } take[TAKE_MAX];
    unsigned ntake;
    int take_copy;                 /* this chunk's body bytes are copied, from here on */
} h1_parse_t;

typedef struct {
    pcr_session_t base;
    pcr_worker_t *w;
    pcr_sock_t *sock;
    http_parser parser;
    pcr_exchange_t *ex;            /* the request being parsed or answered */
    struct event advance;          /* deferred: the response ended or broke */
    struct event timer;            /* the deadline of `state` (h1_to) */
    h1_state_t state;
    pcr_budget_waiter_t budget;
    size_t reserved;               /* body budget reserved for the current request */
    h1_parse_t *ps;                /* while reading: NULL while the connection is idle */
    int reject_status;             /* decided by a callback: 400, 413, 431, 503 */
    int overloaded;                /* the 503 is the memory account's (refuse_requests) */
    const char *reject_why;
    /* The current request's and response's framing: properties of what is being answered, read
     * by the response ops in whatever state. */
    int keep_alive;                /* of the current request */
    int head_only;
    int bodiless;                  /* the response has no body whatever its length: 1xx, 204, 304 */
    int chunked;                   /* the current response is chunked */
    int sse;                       /* the current response is an SSE stream */
    /* Decisions about how the connection ends, taken at any time while it is answered (the
     * request's Connection, HTTP/1.0 close-delimiting, a refusal, a drain) and acted on when the
     * answer is out: not states of their own, since the answer goes on the same way meanwhile. */
    int closing;                   /* close once the output is written */
    int linger;                    /* a rejected request: half-close, then discard input */
    int draining;                  /* the worker drains: no further request */
    /* Reading stopped (pipelined bytes wait, or the body budget): in BODY or BUSY alike. */
    int read_paused;
} h1_sess_t;

static void h1_close(h1_sess_t *s);
static void parse_input(h1_sess_t *s);
static void h1_to(h1_sess_t *s, h1_state_t to);

#define PIPELINE_MAX_BYTES (1024 * 1024)

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default:  return "Status";
    }
}

static h1_sess_t *sess_of(pcr_exchange_t *ex) { return pcr_exchange_session(ex); }

/* A connection that is closing closes once its answer is out, without lingering, unless the
 * request was rejected (close_written); op_send_end sends close_notify with the answer then. */
static int close_at_once(const h1_sess_t *s) { return !s->linger || s->draining; }

/* ---- response ops -------------------------------------------------------------------- */

static char *put(char *p, const char *src, size_t n)
{
    memcpy(p, src, n);
    return p + n;
}

/* The head is written once into space of its exact size, without printf (which cost more than
 * the rest of the head). */
static void op_send_head(pcr_exchange_t *ex, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    h1_sess_t *s = sess_of(ex);
    struct evbuffer *out = pcr_sock_output(s->sock);
    int http10 = s->parser.http_major == 1 && s->parser.http_minor == 0;
    if (!s->keep_alive || s->draining || s->w->draining)
        s->closing = 1;
    s->chunked = 0;
    s->sse = 0;
    for (size_t i = 0; i < n; i++)
        if (h[i].name_len == 12 && strncasecmp(h[i].name, "content-type", 12) == 0 &&
            h[i].value_len >= 17 && strncasecmp(h[i].value, "text/event-stream", 17) == 0)
            s->sse = 1;
    /* These statuses end at the blank line (RFC 9112, 6.3): chunked framing, or a body, would
     * be read as the start of the next response. A 304 may say the length a 200 would have. */
    s->bodiless = status < 200 || status == 204 || status == 304;
    if (!s->bodiless && clen < 0 && http10)
        s->closing = 1; /* HTTP/1.0 has no chunking: the close ends the body */
    else if (!s->bodiless && clen < 0)
        s->chunked = 1;

    /* "HTTP/1.1 <status> <reason>\r\n", the fields, the framing, Connection, CRLF. */
    const char *reason = reason_phrase(status);
    size_t rlen = strlen(reason);
    size_t need = 9 + 20 + 1 + rlen + 2 + 16 + 20 + 2 + 28 + 24 + 2;
    for (size_t i = 0; i < n; i++)
        need += h[i].name_len + 2 + h[i].value_len + 2;
    /* A body of known, moderate length gets room right after the head: one buffer, written
     * with one send. */
    size_t room = clen > 0 && clen <= 65536 && !s->head_only && !s->bodiless ? (size_t)clen : 0;
    struct evbuffer_iovec v;
    if (evbuffer_reserve_space(out, (ev_ssize_t)(need + room), &v, 1) != 1)
        return; /* no memory: the client sees the connection end without an answer */
    char *p = v.iov_base;
    p = put(p, "HTTP/1.1 ", 9);
    p += pcr_http_put_dec(p, (uint64_t)(unsigned)status); /* 100-599: ours, or checked */
    *p++ = ' ';
    p = put(p, reason, rlen);
    p = put(p, "\r\n", 2);
    for (size_t i = 0; i < n; i++) {
        p = put(p, h[i].name, h[i].name_len);
        p = put(p, ": ", 2);
        p = put(p, h[i].value, h[i].value_len);
        p = put(p, "\r\n", 2);
    }
    if (clen >= 0 && (!s->bodiless || status == 304)) {
        p = put(p, "Content-Length: ", 16);
        p += pcr_http_put_dec(p, (uint64_t)clen);
        p = put(p, "\r\n", 2);
    } else if (s->chunked) {
        p = put(p, "Transfer-Encoding: chunked\r\n", 28);
    }
    if (s->closing)
        p = put(p, "Connection: close\r\n\r\n", 21);
    else
        p = put(p, "Connection: keep-alive\r\n\r\n", 26);
    v.iov_len = (size_t)(p - (char *)v.iov_base);
    evbuffer_commit_space(out, &v, 1);
}

static void op_send_body(pcr_exchange_t *ex, const char *data, size_t len)
{
    h1_sess_t *s = sess_of(ex);
    if (s->head_only || s->bodiless || len == 0)
        return;
    struct evbuffer *out = pcr_sock_output(s->sock);
    if (s->chunked) {
        char size[20];
        size_t k = pcr_http_put_hex(size, len);
        size[k++] = '\r';
        size[k++] = '\n';
        evbuffer_add(out, size, k);
        evbuffer_add(out, data, len);
        evbuffer_add(out, "\r\n", 2);
    } else {
        evbuffer_add(out, data, len);
    }
    pcr_sock_flush_soon(s->sock);
    if (pcr_sock_pending(s->sock) > PCR_WRITE_LOW)
        pcr_sock_want_drain(s->sock, PCR_WRITE_LOW);
}

static void op_send_end(pcr_exchange_t *ex)
{
    h1_sess_t *s = sess_of(ex);
    if (s->chunked && !s->head_only)
        evbuffer_add(pcr_sock_output(s->sock), "0\r\n\r\n", 5);
    pcr_sock_flush_soon(s->sock); /* written before on_advance runs: it was queued first */
    if (s->closing && close_at_once(s))
        pcr_sock_last_write(s->sock); /* on_advance closes, without lingering */
    event_active(&s->advance, 0, 0);
}

/* The last event of a stream the pod broke: an SSE client that ignores how the connection
 * ended still sees that the answer is incomplete. */
static const char sse_error[] =
    "event: error\ndata: {\"error\":{\"message\":\"the backend stopped answering in the middle "
    "of the response\",\"type\":\"upstream_error\",\"code\":\"response_cut\"}}\n\n";

static void op_send_abort(pcr_exchange_t *ex)
{
    h1_sess_t *s = sess_of(ex);
    /* A chunked body without its last chunk tells the client the response is incomplete; what
     * already arrived from the pod is written first, then an SSE error event for a stream, then
     * the connection closes. The head alone may still be unflushed (the pod broke in the read
     * that brought it): the flush below covers it, or the close would wait for a drain that no
     * write event is armed to report. */
    if (s->sse && s->chunked && !s->head_only)
        evbuffer_add_printf(pcr_sock_output(s->sock), "%zx\r\n%s\r\n", sizeof(sse_error) - 1,
                            sse_error);
    s->closing = 1;
    pcr_sock_flush(s->sock);
    event_active(&s->advance, 0, 0);
}

static size_t op_pending(pcr_exchange_t *ex) { return pcr_sock_pending(sess_of(ex)->sock); }

static const pcr_exchange_ops_t h1_ops = {op_send_head, op_send_body, op_send_end, op_send_abort,
                                          op_pending};

/* ---- request parsing ----------------------------------------------------------------- */

/* Appends to the target, a header name or a value: count_header_bytes() has kept the head's
 * bytes within limits.max_header_bytes. */
static int grow_append(h1_sess_t *s, char **buf, size_t *len, size_t *cap, const char *at, size_t n)
{
    if (pcr_grow(buf, cap, *len + n + 1, 256, s->w->cfg->limits.max_header_bytes + 1, NULL) != 0)
        return -1;
    memcpy(*buf + *len, at, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

static int refuse(h1_sess_t *s, int status, const char *why)
{
    if (s->reject_status == 0) {
        s->reject_status = status;
        s->reject_why = why;
    }
    return -1;
}

static int count_header_bytes(h1_sess_t *s, size_t n)
{
    s->ps->header_bytes += n;
    if (s->ps->header_bytes > s->w->cfg->limits.max_header_bytes)
        return refuse(s, 431, NULL);
    return 0;
}

static int name_is(const h1_sess_t *s, const char *want)
{
    size_t n = strlen(want);
    return s->ps->name_len == n && strncasecmp(s->ps->name, want, n) == 0;
}

static int flush_header(h1_sess_t *s)
{
    if (s->ps->name_len == 0)
        return 0;
    const char *v = s->ps->value ? s->ps->value : "";
    size_t vlen = s->ps->value_len;
    if (name_is(s, "host")) {
        s->ps->n_host++;
    } else if (name_is(s, "content-length")) {
        s->ps->n_cl++;
    } else if (name_is(s, "transfer-encoding")) {
        s->ps->n_te++;
        s->ps->te_bad |= !pcr_http_te_is_chunked(v, vlen);
    } else if (name_is(s, "expect") && vlen == 12 && strncasecmp(v, "100-continue", 12) == 0) {
        s->ps->expect_continue = 1;
    }
    int rc = pcr_exchange_add_header(s->ex, s->ps->name, s->ps->name_len, v, vlen);
    s->ps->name_len = s->ps->value_len = 0;
    s->ps->in_value = 0;
    if (rc == PCR_ERR_TOO_LARGE)
        return refuse(s, 431, NULL);
    if (rc == PCR_ERR_INVAL)
        return refuse(s, 400, "invalid header field (a name must be a token, with no whitespace "
                              "before the colon; a value must not hold CR, LF or NUL)");
    return rc;
}

static int on_message_begin(http_parser *p)
{
    h1_sess_t *s = p->data;
    s->ex = pcr_exchange_new(s->w, &h1_ops, s, "HTTP/1.1");
    if (s->ex == NULL)
        return -1;
    pcr_exchange_set_client(s->ex, pcr_sock_peer(s->sock), pcr_sock_admin(s->sock),
                            &s->base.load);
    s->ps->url_len = s->ps->name_len = s->ps->value_len = s->ps->header_bytes = 0;
    s->ps->in_value = s->ps->expect_continue = s->reject_status = 0;
    s->ps->n_host = s->ps->n_cl = s->ps->n_te = 0;
    s->ps->te_bad = 0;
    s->reject_why = NULL;
    pcr_fold_reset(&s->ps->fold);
    h1_to(s, H1_HEAD);
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    h1_sess_t *s = p->data;
    if (count_header_bytes(s, n) < 0)
        return -1;
    return grow_append(s, &s->ps->url, &s->ps->url_len, &s->ps->url_cap, at, n);
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    h1_sess_t *s = p->data;
    if (count_header_bytes(s, n) < 0)
        return -1;
    if (s->state != H1_HEAD)
        return 0; /* past the head: a chunked body's trailer field, dropped, never merged */
    if (s->ps->in_value && flush_header(s) < 0)
        return -1;
    pcr_fold_field(&s->ps->fold);
    return grow_append(s, &s->ps->name, &s->ps->name_len, &s->ps->name_cap, at, n);
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    h1_sess_t *s = p->data;
    if (count_header_bytes(s, n) < 0)
        return -1;
    if (s->state != H1_HEAD)
        return 0; /* a trailer's value (on_header_field) */
    if (pcr_fold_value(&s->ps->fold, at, n) < 0)
        return refuse(s, 400, "obsolete line folding (obs-fold) in a header field");
    s->ps->in_value = 1;
    return grow_append(s, &s->ps->value, &s->ps->value_len, &s->ps->value_cap, at, n);
}

/* The head's buffers and the reading state go while the connection waits for its next
 * request: an idle keep-alive connection holds none of them, and the next request takes new
 * ones from malloc's per-thread cache. */
static void ps_free(h1_sess_t *s)
{
    if (s->ps == NULL)
        return;
    free(s->ps->url);
    free(s->ps->name);
    free(s->ps->value);
    free(s->ps);
    s->ps = NULL;
}

/* The request target: origin-form as is; absolute-form ("http://host/path") as its path. */
static int set_target(h1_sess_t *s)
{
    const char *u = s->ps->url ? s->ps->url : "/";
    size_t len = s->ps->url ? s->ps->url_len : 1;
    if (len > 0 && u[0] == '/')
        return pcr_exchange_set_path(s->ex, u, len);
    if (len == 1 && u[0] == '*')
        return pcr_exchange_set_path(s->ex, u, len);
    struct http_parser_url pu;
    http_parser_url_init(&pu);
    if (http_parser_parse_url(u, len, 0, &pu) != 0 || !(pu.field_set & (1 << UF_SCHEMA)) ||
        !(pu.field_set & (1 << UF_HOST)))
        return refuse(s, 400, "the request target must be a path (\"/v1/...\") or an absolute URL");
    if (!(pu.field_set & (1 << UF_PATH)))
        return pcr_exchange_set_path(s->ex, "/", 1);
    size_t off = pu.field_data[UF_PATH].off;
    return pcr_exchange_set_path(s->ex, u + off, len - off);
}

static int on_headers_complete(http_parser *p)
{
    h1_sess_t *s = p->data;
    if (flush_header(s) < 0)
        return -1;
    const char *m = http_method_str((enum http_method)p->method);
    if (pcr_exchange_set_method(s->ex, m, strlen(m)) < 0 || set_target(s) < 0)
        return -1;
    s->keep_alive = http_should_keep_alive(p);
    s->head_only = p->method == HTTP_HEAD;
    int http11 = p->http_major == 1 && p->http_minor >= 1;
    if (http11 && s->ps->n_host != 1)
        return refuse(s, 400, s->ps->n_host ? "more than one Host header" : "missing Host header");
    if (s->ps->n_te > 0 && (s->ps->te_bad || s->ps->n_te > 1))
        return refuse(s, 400, "Transfer-Encoding must be exactly \"chunked\"");
    if (s->ps->n_te > 0 && s->ps->n_cl > 0)
        return refuse(s, 400, "Content-Length together with Transfer-Encoding");
    if (s->ps->n_cl > 1)
        return refuse(s, 400, "more than one Content-Length");
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > s->w->cfg->limits.max_body_bytes)
        return refuse(s, 413, NULL);
    /* Refused before its body is read: the memory it would take is what is short. */
    if (pcr_exchange_overloaded(s->ex)) {
        s->overloaded = 1;
        return refuse(s, 503, NULL);
    }
    if (s->ps->expect_continue) {
        evbuffer_add(pcr_sock_output(s->sock), "HTTP/1.1 100 Continue\r\n\r\n", 25);
        pcr_sock_flush(s->sock);
    }
    h1_to(s, H1_BODY);
    return 0;
}

/* Copies the segments recorded so far, in order, and the rest of this chunk's from here on:
 * segments reach the body in the order they came. */
static int take_as_copies(h1_sess_t *s)
{
    for (unsigned i = 0; i < s->ps->ntake; i++)
        if (evbuffer_add(pcr_exchange_body(s->ex), s->ps->take_base + s->ps->take[i].off,
                         s->ps->take[i].len) != 0)
            return -1;
    s->ps->ntake = 0;
    s->ps->take_copy = 1;
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    h1_sess_t *s = p->data;
    /* A body not begun while memory is short is refused as its head would have been, its bytes
     * not held (h2_server.c's on_data_chunk says why). */
    if (n > 0 && pcr_exchange_body_bytes(s->ex) == 0 && pcr_exchange_overloaded(s->ex)) {
        s->overloaded = 1;
        return refuse(s, 503, NULL);
    }
    int rc = pcr_exchange_see_body(s->ex, at, n);
    if (rc == PCR_ERR_TOO_LARGE)
        return refuse(s, 413, NULL);
    if (rc < 0)
        return -1;
    /* Moved after the parse (parse_input), or copied now; once one is to be moved, the ones
     * after it in this chunk are too, or all are copied, so the order holds. */
    if (!s->ps->take_copy && (s->ps->ntake > 0 || n >= PCR_BODY_TAKE_MIN)) {
        if (s->ps->ntake < TAKE_MAX) {
            s->ps->take[s->ps->ntake].off = (size_t)(at - s->ps->take_base);
            s->ps->take[s->ps->ntake].len = n;
            s->ps->ntake++;
            return 0;
        }
        if (take_as_copies(s) != 0)
            return -1;
    }
    return evbuffer_add(pcr_exchange_body(s->ex), at, n) == 0 ? 0 : -1;
}

/* After http_parser_execute took n bytes of the chunk at the front of `in`: the recorded body
 * segments move to the request, the rest of the n bytes are dropped. */
static int consume(h1_sess_t *s, struct evbuffer *in, size_t n)
{
    size_t at = 0;
    int rc = 0;
    for (unsigned i = 0; i < s->ps->ntake && rc == 0; i++) {
        evbuffer_drain(in, s->ps->take[i].off - at);
        rc = pcr_exchange_take_body(s->ex, in, s->ps->take[i].len);
        at = s->ps->take[i].off + s->ps->take[i].len;
    }
    s->ps->ntake = 0;
    evbuffer_drain(in, rc == 0 ? n - at : evbuffer_get_length(in));
    return rc;
}

static int on_message_complete(http_parser *p)
{
    http_parser_pause(p, 1); /* answer this one before parsing the next */
    return 0;
}

static const http_parser_settings req_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* The request could not be taken: answer with a clear error, then close (the rest of the
 * stream cannot be trusted to be in sync). */
static void reject(h1_sess_t *s, int status, const char *detail)
{
    pcr_worker_t *w = s->w;
    s->keep_alive = 0;
    s->closing = 1;
    s->linger = 1;
    pcr_sock_read_stop(s->sock);
    pcr_budget_unwait(w, &s->budget);
    if (s->ex == NULL)
        s->ex = pcr_exchange_new(w, &h1_ops, s, "HTTP/1.1");
    if (s->ex == NULL) {
        h1_close(s);
        return;
    }
    h1_to(s, H1_BUSY);
    switch (status) {
    case 413:
        pcr_exchange_error(s->ex, 413, "invalid_request_error", "body_too_large",
                           "request body is larger than limits.max_body_bytes (%zu bytes)",
                           w->cfg->limits.max_body_bytes);
        break;
    case 431:
        pcr_exchange_error(s->ex, 431, "invalid_request_error", "headers_too_large",
                           "request headers are larger than limits.max_header_bytes (%zu bytes)",
                           w->cfg->limits.max_header_bytes);
        break;
    case 503:
        if (s->overloaded)
            pcr_exchange_overload_refused(s->ex);
        else
            pcr_exchange_budget_refused(s->ex);
        break;
    case 408:
        PCR_INC(w->metrics.request_timeouts);
        pcr_exchange_error(s->ex, 408, "invalid_request_error", "request_timeout", "%s", detail);
        break;
    default:
        PCR_INC(w->metrics.bad_requests);
        pcr_exchange_error(s->ex, 400, "invalid_request_error", "bad_request",
                           "malformed HTTP/1.1 request: %s", detail);
        break;
    }
}

static void parse_input(h1_sess_t *s)
{
    struct evbuffer *in = pcr_sock_input(s->sock);
    while (evbuffer_get_length(in) > 0) {
        if (s->ex != NULL && pcr_exchange_running(s->ex))
            break; /* answering; the next pipelined request waits its turn */
        if (s->ps == NULL && (s->ps = calloc(1, sizeof(*s->ps))) == NULL) {
            reject(s, 400, "out of memory while reading the request");
            return;
        }
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        pcr_fold_begin(&s->ps->fold, v.iov_base, v.iov_len);
        s->ps->take_base = v.iov_base;
        s->ps->ntake = 0;
        s->ps->take_copy = 0;
        size_t n = http_parser_execute(&s->parser, &req_settings, v.iov_base, v.iov_len);
        pcr_fold_end(&s->ps->fold);
        enum http_errno e = HTTP_PARSER_ERRNO(&s->parser);
        if (e != HPE_OK && e != HPE_PAUSED) {
            s->ps->ntake = 0; /* the request is refused: its body goes with the input, below */
        } else if (consume(s, in, n) != 0) {
            reject(s, 400, "out of memory while reading the request body");
            return;
        }
        if (e == HPE_PAUSED) {
            /* The response may finish synchronously (a local endpoint): `advance` runs later,
             * from the loop. */
            h1_to(s, H1_BUSY);
            pcr_exchange_run(s->ex);
            return;
        }
        if (e != HPE_OK) {
            evbuffer_drain(in, evbuffer_get_length(in));
            if (s->reject_status == 413 || s->reject_status == 431 || s->reject_status == 503)
                reject(s, s->reject_status, NULL);
            else if (s->reject_status != 0)
                reject(s, 400, s->reject_why ? s->reject_why : "invalid request");
            else if (e == HPE_HEADER_OVERFLOW)
                reject(s, 431, NULL);
            else
                reject(s, 400, http_errno_description(e));
            return;
        }
    }
    if (s->state == H1_BODY)
        h1_to(s, H1_BODY); /* a read that brought body bytes restarts the body's idle time */
}

/* ---- deadlines and reading ----------------------------------------------------------- */

static void arm(h1_sess_t *s, unsigned ms)
{
    struct timeval tv = pcr_ms_to_tv(ms);
    evtimer_add(&s->timer, &tv);
}

static const char *const h1_state_name[] = {"IDLE", "HEAD", "BODY", "BUSY", "LINGER"};

/* Which states each state may move to (bit per h1_state_t): the picture in the header. */
static const unsigned h1_next[] = {
    [H1_IDLE] = 1u << H1_HEAD | 1u << H1_BUSY,
    [H1_HEAD] = 1u << H1_BODY | 1u << H1_BUSY,
    [H1_BODY] = 1u << H1_BODY | 1u << H1_BUSY,
    [H1_BUSY] = 1u << H1_IDLE | 1u << H1_LINGER,
    [H1_LINGER] = 0,
};

/* The one place the connection's state changes: it sets the timer for the new state and
 * whether the session waits for its client (first to go when connections run short). BODY to
 * BODY re-arms: each read that brought body bytes restarts its idle time; any other move to
 * the same state changes nothing. A move the picture does not have is a bug: logged, and made
 * anyway so the connection still ends by its deadlines. */
static void h1_to(h1_sess_t *s, h1_state_t to)
{
    const pcr_timeouts_conf_t *t = &s->w->cfg->timeouts;
    h1_state_t from = s->state;
    if (from == to && to != H1_BODY)
        return;
    if (!(h1_next[from] & (1u << to)))
        pcr_log_warn("client %s: invalid state transition of its HTTP/1.1 session: %s -> %s",
                     pcr_sock_peer(s->sock), h1_state_name[from], h1_state_name[to]);
    s->state = to;
    if (from == H1_IDLE)
        pcr_sock_idle(s->sock, 0);
    pcr_session_set_waiting(&s->base, to != H1_BUSY);
    switch (to) {
    case H1_IDLE: arm(s, t->client_idle_ms); break;
    case H1_HEAD: arm(s, t->request_header_ms); break;
    case H1_BODY: arm(s, t->client_idle_ms); break;
    case H1_BUSY: event_del(&s->timer); break;
    case H1_LINGER: arm(s, LINGER_MS); break;
    }
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    h1_sess_t *s = arg;
    const pcr_timeouts_conf_t *t = &s->w->cfg->timeouts;
    char msg[160];
    switch (s->state) {
    case H1_IDLE:
        h1_close(s); /* idle past client_idle_ms */
        break;
    case H1_HEAD:
        snprintf(msg, sizeof(msg), "the request head was not complete within %u ms "
                 "(timeouts.request_header_ms)", t->request_header_ms);
        reject(s, 408, msg);
        break;
    case H1_BODY:
        if (s->budget.queued) {
            reject(s, 503, NULL); /* it was the router that stopped reading */
            break;
        }
        snprintf(msg, sizeof(msg), "no byte of the request body arrived for %u ms "
                 "(timeouts.client_idle_ms)", t->client_idle_ms);
        reject(s, 408, msg);
        break;
    case H1_BUSY:
        break;
    case H1_LINGER:
        h1_close(s);
        break;
    }
}

/* The answer is out: close, or half-close and linger after a rejected request. */
static void close_written(h1_sess_t *s)
{
    if (close_at_once(s)) {
        h1_close(s);
        return;
    }
    h1_to(s, H1_LINGER); /* waiting: first to go when connections run short */
    pcr_sock_shutdown_write(s->sock);
    evbuffer_drain(pcr_sock_input(s->sock), evbuffer_get_length(pcr_sock_input(s->sock)));
    pcr_sock_read_start(s->sock);
}

/* Whether the body being read may take one more read: what it holds and a read fit the
 * connection's allowance and its reservation, or more budget could be reserved. A body of
 * known length reserves all the rest of it at once: the budget then goes to bodies that can
 * complete, instead of being spread over partial ones none of which could. */
static int body_room(h1_sess_t *s)
{
    size_t held = pcr_exchange_body_bytes(s->ex);
    size_t next = PCR_SOCK_READ_SIZE;
    if (s->parser.flags & F_CONTENTLENGTH)
        next = (size_t)s->parser.content_length; /* what is left of the body */
    size_t have = PCR_BODY_ALLOWANCE + s->reserved;
    if (held + next <= have)
        return 1;
    size_t n = held + next - have;
    if (n < BODY_GRANT)
        n = BODY_GRANT;
    if (!pcr_budget_reserve(s->w, s->ex, n))
        return 0;
    s->reserved += n;
    return 1;
}

/* The request's body is freed: its reservation goes back. */
static void reserved_drop(h1_sess_t *s)
{
    pcr_budget_release(s->w, s->reserved);
    s->reserved = 0;
}

/* A body that waits for budget while the memory account refuses requests (budget.h, `shed`)
 * gets its 503 now, and what it holds of its allowance is freed; the request allowed past the
 * budget never waits, so it goes on. */
static int shed_due(h1_sess_t *s)
{
    return !pcr_budget_exempt(s->w, s->ex) && pcr_exchange_overloaded(s->ex);
}

static void shed(h1_sess_t *s)
{
    pcr_exchange_drop_body(s->ex);
    reserved_drop(s);
    /* Unread bytes of the body, which the lingering close would discard anyway. */
    struct evbuffer *in = pcr_sock_input(s->sock);
    evbuffer_drain(in, evbuffer_get_length(in));
    s->overloaded = 1;
    reject(s, 503, NULL);
}

/* After a read: pause reading while pipelined bytes pile up behind a running request, or while
 * a body arrives that has no budget for its next read. */
static void check_pause(h1_sess_t *s)
{
    size_t queued = evbuffer_get_length(pcr_sock_input(s->sock));
    int running = s->ex != NULL && pcr_exchange_running(s->ex);
    if (running && queued > PIPELINE_MAX_BYTES) {
        pcr_sock_read_stop(s->sock);
        s->read_paused = 1;
    } else if (!running && s->state == H1_BODY && !body_room(s)) {
        if (shed_due(s)) {
            shed(s);
            return;
        }
        pcr_sock_read_stop(s->sock);
        s->read_paused = 1;
        pcr_budget_wait(s->w, &s->budget);
    }
}

/* The worker's tick, while the account refuses requests: see shed(). */
static void budget_shed(pcr_budget_waiter_t *w)
{
    h1_sess_t *s = (h1_sess_t *)((char *)w - offsetof(h1_sess_t, budget));
    if (!s->read_paused || s->closing || s->ex == NULL || s->state != H1_BODY)
        return;
    if (shed_due(s))
        shed(s);
    else
        pcr_budget_wait(s->w, &s->budget);
}

static void budget_resume(pcr_budget_waiter_t *w)
{
    h1_sess_t *s = (h1_sess_t *)((char *)w - offsetof(h1_sess_t, budget));
    if (!s->read_paused || s->closing || s->ex == NULL || s->state != H1_BODY)
        return;
    if (!body_room(s)) {
        pcr_budget_wait(s->w, &s->budget); /* taken again: at the back of the queue */
        return;
    }
    s->read_paused = 0;
    pcr_sock_read_start(s->sock);
    parse_input(s);
    if (!s->closing && s->ex != NULL)
        check_pause(s);
}

static void on_read(pcr_sock_t *sock, void *arg)
{
    h1_sess_t *s = arg;
    if (s->state == H1_LINGER) {
        evbuffer_drain(pcr_sock_input(sock), evbuffer_get_length(pcr_sock_input(sock)));
        return;
    }
    if (s->closing)
        return;
    parse_input(s);
    if (!s->closing && s->ex != NULL)
        check_pause(s);
}

static void on_drain(pcr_sock_t *sock, void *arg)
{
    h1_sess_t *s = arg;
    if (s->ex != NULL)
        pcr_exchange_on_writable(s->ex);
    if (s->closing && s->state != H1_LINGER && s->ex == NULL && pcr_sock_pending(sock) == 0)
        close_written(s);
}

static void on_end(pcr_sock_t *sock, pcr_sock_end_t why, void *arg)
{
    h1_sess_t *s = arg;
    if (why == PCR_SOCK_WRITE_TIMEOUT) {
        PCR_INC(s->w->metrics.write_timeouts);
        pcr_log_info("client %s accepted no bytes for %u ms: connection closed", pcr_sock_peer(sock),
                     s->w->cfg->timeouts.client_write_ms);
    }
    /* EOF, error or timeout: the client is gone (or stuck); whatever it asked is abandoned and
     * its upstream request closed, so the pod stops generating. */
    h1_close(s);
}

static void on_ready(pcr_sock_t *sock, int err, void *arg) {}

static const pcr_sock_cbs_t h1_sock_cbs = {on_read, on_drain, on_end, on_ready};

static void on_advance(evutil_socket_t fd, short what, void *arg)
{
    h1_sess_t *s = arg;
    if (s->ex == NULL || !pcr_exchange_finished(s->ex))
        return;
    pcr_exchange_free(s->ex);
    s->ex = NULL;
    reserved_drop(s);
    s->head_only = 0; /* the next request's, once its head is read: a refusal may come first */
    if (s->closing) {
        pcr_sock_read_stop(s->sock);
        if (pcr_sock_pending(s->sock) == 0)
            close_written(s);
        else
            pcr_sock_want_drain(s->sock, 0); /* on_drain closes once the output is out */
        return;
    }
    h1_to(s, H1_IDLE);
    ps_free(s);
    http_parser_pause(&s->parser, 0);
    if (s->read_paused) {
        s->read_paused = 0;
        pcr_budget_unwait(s->w, &s->budget);
        pcr_sock_read_start(s->sock);
    }
    parse_input(s);
    if (!s->closing && s->ex != NULL)
        check_pause(s);
    else if (s->state == H1_IDLE)
        pcr_sock_idle(s->sock, 1); /* its buffers go once the answer is out */
}

static void h1_drain(pcr_session_t *base)
{
    h1_sess_t *s = (h1_sess_t *)base;
    s->draining = 1;
    if (s->state == H1_LINGER || s->ex == NULL || !pcr_exchange_running(s->ex))
        h1_close(s); /* idle: nothing to finish */
    else
        s->closing = 1;
}

static void h1_force_close(pcr_session_t *base) { h1_close((h1_sess_t *)base); }

static const pcr_session_ops_t h1_session_ops = {h1_drain, h1_force_close};

static void h1_close(h1_sess_t *s)
{
    pcr_exchange_free(s->ex);
    s->ex = NULL;
    reserved_drop(s);
    pcr_budget_unwait(s->w, &s->budget);
    event_del(&s->advance);
    event_del(&s->timer);
    pcr_sock_free(s->sock);
    ps_free(s);
    pcr_session_unregister(&s->base);
    free(s);
}

int pcr_h1_session_start(pcr_worker_t *w, pcr_sock_t *sock)
{
    h1_sess_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return PCR_ERR_NOMEM;
    s->w = w;
    s->sock = sock;
    event_assign(&s->advance, w->base, -1, 0, on_advance, s);
    evtimer_assign(&s->timer, w->base, on_timer, s);
    s->budget.resume = budget_resume;
    s->budget.shed = budget_shed;
    http_parser_init(&s->parser, HTTP_REQUEST);
    s->parser.data = s;
    pcr_session_register(w, &s->base, &h1_session_ops,
                         pcr_sock_is_tls(sock) ? PCR_CONN_H1_TLS : PCR_CONN_H1);
    pcr_sock_set_cbs(sock, &h1_sock_cbs, s);
    pcr_sock_set_write_timeout(sock, w->cfg->timeouts.client_write_ms);
    s->state = H1_BUSY; /* entering IDLE arms its deadline and puts it on the waiting list */
    h1_to(s, H1_IDLE);
    pcr_sock_read_start(sock);
    /* The handshake already read the first bytes of a request head. */
    if (evbuffer_get_length(pcr_sock_input(sock)) > 0)
        on_read(sock, s);
    return 0;
}
