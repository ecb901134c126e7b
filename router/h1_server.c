/* router/h1_server.c: owns an HTTP/1.1 client connection: request parsing with http-parser,
 * keep-alive, pipelining and response framing.
 *
 * Pipelined requests are answered in order, one at a time: when a request is complete the
 * parser is paused, later bytes wait in the input buffer, and parsing resumes once the
 * response has ended. Responses of unknown length are chunked (an SSE stream reaches the client
 * event by event). Output above PCR_WRITE_HIGH pauses the upstream; the write callback, fired
 * below PCR_WRITE_LOW, resumes it.
 *
 * One close path, h1_close(); the exchange is freed from the deferred `advance` event or from
 * a bufferevent callback, never from inside the exchange's own calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <http_parser.h>

#include "exchange.h"
#include "io.h"
#include "log.h"
#include "session.h"

typedef struct {
    pcr_session_t base;
    pcr_server_t *srv;
    struct bufferevent *bev;
    http_parser parser;
    pcr_exchange_t *ex;            /* the request being parsed or answered */
    struct event *advance;         /* deferred: the response ended or broke */
    char *url;
    size_t url_len, url_cap;
    char *name, *value;            /* the header being parsed */
    size_t name_len, value_len, name_cap, value_cap;
    int in_value;
    size_t header_bytes;
    int expect_continue;
    int reject_status;             /* set by a callback that refused the request (413, 431) */
    int keep_alive;                /* of the current request */
    int head_only;
    int chunked;                   /* the current response is chunked */
    int closing;                   /* close once the output is written */
    int abort;                     /* close now, unwritten output dropped */
    int draining;
    int read_stopped;              /* reading paused: too many pipelined bytes wait */
    int plain;                     /* a plain socket (not TLS): read and written directly */
    struct event *rev;             /* plain sockets: the read event; its timeout is the idle one */
} h1_sess_t;

static void h1_close(h1_sess_t *s);
static void parse_input(h1_sess_t *s);
static void arm_timeouts(h1_sess_t *s, int idle);
static void stop_reading(h1_sess_t *s);

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
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default:  return "Status";
    }
}

static h1_sess_t *sess_of(pcr_exchange_t *ex) { return pcr_exchange_session(ex); }

/* ---- response ops -------------------------------------------------------------------- */

static void op_send_head(pcr_exchange_t *ex, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    h1_sess_t *s = sess_of(ex);
    struct evbuffer *out = bufferevent_get_output(s->bev);
    int http10 = s->parser.http_major == 1 && s->parser.http_minor == 0;
    if (!s->keep_alive || s->draining || s->srv->draining)
        s->closing = 1;
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", status, reason_phrase(status));
    for (size_t i = 0; i < n; i++) {
        evbuffer_add(out, h[i].name, h[i].name_len);
        evbuffer_add(out, ": ", 2);
        evbuffer_add(out, h[i].value, h[i].value_len);
        evbuffer_add(out, "\r\n", 2);
    }
    s->chunked = 0;
    if (clen >= 0) {
        evbuffer_add_printf(out, "Content-Length: %lld\r\n", (long long)clen);
    } else if (http10) {
        s->closing = 1; /* HTTP/1.0 has no chunking: the close ends the body */
    } else {
        evbuffer_add(out, "Transfer-Encoding: chunked\r\n", 28);
        s->chunked = 1;
    }
    evbuffer_add_printf(out, "Connection: %s\r\n\r\n", s->closing ? "close" : "keep-alive");
}

static void op_send_body(pcr_exchange_t *ex, const char *data, size_t len)
{
    h1_sess_t *s = sess_of(ex);
    if (s->head_only || len == 0)
        return;
    struct evbuffer *out = bufferevent_get_output(s->bev);
    if (s->chunked) {
        evbuffer_add_printf(out, "%zx\r\n", len);
        evbuffer_add(out, data, len);
        evbuffer_add(out, "\r\n", 2);
    } else {
        evbuffer_add(out, data, len);
    }
    if (s->plain)
        pcr_io_write_now(s->bev);
}

static void op_send_end(pcr_exchange_t *ex)
{
    h1_sess_t *s = sess_of(ex);
    if (s->chunked && !s->head_only)
        evbuffer_add(bufferevent_get_output(s->bev), "0\r\n\r\n", 5);
    if (s->plain)
        pcr_io_write_now(s->bev);
    event_active(s->advance, 0, 0);
}

static void op_send_abort(pcr_exchange_t *ex)
{
    h1_sess_t *s = sess_of(ex);
    /* A chunked body without its last chunk tells the client the response is incomplete; what
     * already arrived from the pod is written first. */
    s->abort = 1;
    event_active(s->advance, 0, 0);
}

static size_t op_pending(pcr_exchange_t *ex)
{
    return evbuffer_get_length(bufferevent_get_output(sess_of(ex)->bev));
}

static const pcr_exchange_ops_t h1_ops = {op_send_head, op_send_body, op_send_end, op_send_abort,
                                          op_pending};

/* ---- request parsing ----------------------------------------------------------------- */

static int grow_append(char **buf, size_t *len, size_t *cap, const char *at, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t ncap = *cap ? *cap * 2 : 256;
        while (ncap < *len + n + 1)
            ncap *= 2;
        char *nb = realloc(*buf, ncap);
        if (nb == NULL)
            return -1;
        *buf = nb;
        *cap = ncap;
    }
    memcpy(*buf + *len, at, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

static int count_header_bytes(h1_sess_t *s, size_t n)
{
    s->header_bytes += n;
    if (s->header_bytes > s->srv->cfg->limits.max_header_bytes) {
        s->reject_status = 431;
        return -1;
    }
    return 0;
}

static int flush_header(h1_sess_t *s)
{
    if (s->name_len == 0)
        return 0;
    if (s->name_len == 6 && strncasecmp(s->name, "expect", 6) == 0 && s->value_len == 12 &&
        strncasecmp(s->value, "100-continue", 12) == 0)
        s->expect_continue = 1;
    int rc = pcr_exchange_add_header(s->ex, s->name, s->name_len, s->value ? s->value : "", s->value_len);
    s->name_len = s->value_len = 0;
    s->in_value = 0;
    if (rc == PCR_ERR_TOO_LARGE)
        s->reject_status = 431;
    return rc;
}

static int on_message_begin(http_parser *p)
{
    h1_sess_t *s = p->data;
    s->ex = pcr_exchange_new(s->srv, &h1_ops, s, "HTTP/1.1");
    if (s->ex == NULL)
        return -1;
    s->url_len = s->name_len = s->value_len = s->header_bytes = 0;
    s->in_value = s->expect_continue = s->reject_status = 0;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    h1_sess_t *s = p->data;
    if (count_header_bytes(s, n) < 0)
        return -1;
    return grow_append(&s->url, &s->url_len, &s->url_cap, at, n);
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    h1_sess_t *s = p->data;
    if (count_header_bytes(s, n) < 0)
        return -1;
    if (s->in_value && flush_header(s) < 0)
        return -1;
    return grow_append(&s->name, &s->name_len, &s->name_cap, at, n);
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    h1_sess_t *s = p->data;
    if (count_header_bytes(s, n) < 0)
        return -1;
    s->in_value = 1;
    return grow_append(&s->value, &s->value_len, &s->value_cap, at, n);
}

static int on_headers_complete(http_parser *p)
{
    h1_sess_t *s = p->data;
    if (flush_header(s) < 0)
        return -1;
    const char *m = http_method_str((enum http_method)p->method);
    if (pcr_exchange_set_method(s->ex, m, strlen(m)) < 0 ||
        pcr_exchange_set_path(s->ex, s->url ? s->url : "/", s->url_len) < 0)
        return -1;
    s->keep_alive = http_should_keep_alive(p);
    s->head_only = p->method == HTTP_HEAD;
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > s->srv->cfg->limits.max_body_bytes) {
        s->reject_status = 413;
        return -1;
    }
    if (s->expect_continue)
        evbuffer_add(bufferevent_get_output(s->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    h1_sess_t *s = p->data;
    int rc = pcr_exchange_add_body(s->ex, at, n);
    if (rc == PCR_ERR_TOO_LARGE)
        s->reject_status = 413;
    return rc < 0 ? -1 : 0;
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
static void reject(h1_sess_t *s, enum http_errno e)
{
    s->keep_alive = 0;
    s->closing = 1;
    if (s->ex == NULL)
        s->ex = pcr_exchange_new(s->srv, &h1_ops, s, "HTTP/1.1");
    if (s->ex == NULL) {
        h1_close(s);
        return;
    }
    stop_reading(s);
    switch (s->reject_status) {
    case 413:
        pcr_exchange_reject(s->ex, 413, "invalid_request_error", "body_too_large",
                            "request body is larger than limits.max_body_bytes (%zu bytes)",
                            s->srv->cfg->limits.max_body_bytes);
        break;
    case 431:
        pcr_exchange_reject(s->ex, 431, "invalid_request_error", "headers_too_large",
                            "request headers are larger than limits.max_header_bytes (%zu bytes)",
                            s->srv->cfg->limits.max_header_bytes);
        break;
    default:
        s->srv->metrics.bad_requests++;
        if (e == HPE_HEADER_OVERFLOW)
            pcr_exchange_reject(s->ex, 431, "invalid_request_error", "headers_too_large",
                                "request headers are too large");
        else
            pcr_exchange_reject(s->ex, 400, "invalid_request_error", "bad_request",
                                "malformed HTTP/1.1 request: %s", http_errno_description(e));
        break;
    }
}

static void parse_input(h1_sess_t *s)
{
    struct evbuffer *in = bufferevent_get_input(s->bev);
    while (evbuffer_get_length(in) > 0) {
        if (s->ex != NULL && pcr_exchange_running(s->ex))
            return; /* answering; the next pipelined request waits its turn */
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            return;
        size_t n = http_parser_execute(&s->parser, &req_settings, v.iov_base, v.iov_len);
        enum http_errno e = HTTP_PARSER_ERRNO(&s->parser);
        if (e == HPE_PAUSED) {
            evbuffer_drain(in, n);
            /* The response may finish synchronously (a local endpoint): `advance` runs later,
             * from the loop. */
            arm_timeouts(s, 0);
            pcr_exchange_run(s->ex);
            return;
        }
        if (e != HPE_OK) {
            evbuffer_drain(in, evbuffer_get_length(in));
            reject(s, e);
            return;
        }
        evbuffer_drain(in, n);
    }
}

/* ---- connection events --------------------------------------------------------------- */

/* Timeouts: a client that stops reading what we send is always timed out; one that sends
 * nothing only while no request of its own is being answered (a long stream may take minutes).
 * TLS connections read through their bufferevent, plain ones through `rev` (io.h). */
static void arm_timeouts(h1_sess_t *s, int idle)
{
    unsigned ms = s->srv->cfg->timeouts.client_idle_ms;
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    if (s->plain) {
        bufferevent_set_timeouts(s->bev, NULL, &tv);
        event_add(s->rev, idle ? &tv : NULL);
    } else {
        bufferevent_set_timeouts(s->bev, idle ? &tv : NULL, &tv);
    }
}

static void stop_reading(h1_sess_t *s)
{
    if (s->plain)
        event_del(s->rev);
    else
        bufferevent_disable(s->bev, EV_READ);
}

static void on_advance(evutil_socket_t fd, short what, void *arg)
{
    h1_sess_t *s = arg;
    if (s->ex == NULL || !pcr_exchange_finished(s->ex))
        return;
    pcr_exchange_free(s->ex);
    s->ex = NULL;
    if (s->abort)
        s->closing = 1; /* what did arrive is still delivered, then the close cuts it */
    if (s->closing) {
        stop_reading(s);
        if (evbuffer_get_length(bufferevent_get_output(s->bev)) == 0)
            h1_close(s);
        return; /* on_write closes once the output is out */
    }
    http_parser_pause(&s->parser, 0);
    if (s->read_stopped && !s->plain)
        bufferevent_enable(s->bev, EV_READ);
    s->read_stopped = 0;
    arm_timeouts(s, 1); /* (re)adds the read event of a plain socket */
    parse_input(s);
}

/* Pipelined requests wait in the input buffer while one is answered; past this much, reading
 * stops until the answer is out, so a client cannot make pcrouter buffer without bound. */
#define PIPELINE_MAX_BYTES (1024 * 1024)

static void on_read(struct bufferevent *bev, void *arg)
{
    h1_sess_t *s = arg;
    if (s->closing)
        return;
    parse_input(s);
    if (s->ex != NULL && pcr_exchange_running(s->ex) &&
        evbuffer_get_length(bufferevent_get_input(bev)) > PIPELINE_MAX_BYTES) {
        stop_reading(s);
        s->read_stopped = 1;
    }
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    h1_sess_t *s = arg;
    if (what & EV_TIMEOUT) {
        h1_close(s); /* idle past client_idle_ms */
        return;
    }
    int n = pcr_io_read_into(s->bev);
    if (n == PCR_IO_AGAIN)
        return;
    if (n <= 0) {
        h1_close(s); /* the client closed or broke the connection */
        return;
    }
    on_read(s->bev, s);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    h1_sess_t *s = arg;
    if (s->ex != NULL)
        pcr_exchange_on_writable(s->ex);
    if (s->closing && s->ex == NULL && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        h1_close(s);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    h1_sess_t *s = arg;
    /* EOF, error or timeout: the client is gone (or stuck); whatever it asked is abandoned
     * and its upstream request closed, so the pod stops generating. */
    h1_close(s);
}

static void h1_drain(pcr_session_t *base)
{
    h1_sess_t *s = (h1_sess_t *)base;
    s->draining = 1;
    if (s->ex == NULL || !pcr_exchange_running(s->ex))
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
    event_free(s->advance);
    if (s->rev)
        event_free(s->rev);
    bufferevent_free(s->bev);
    free(s->url);
    free(s->name);
    free(s->value);
    pcr_session_unregister(&s->base);
    free(s);
}

int pcr_h1_session_start(pcr_server_t *srv, struct bufferevent *bev, int plain)
{
    h1_sess_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return PCR_ERR_NOMEM;
    s->srv = srv;
    s->bev = bev;
    s->plain = plain;
    s->advance = event_new(srv->base, -1, 0, on_advance, s);
    if (s->advance == NULL) {
        free(s);
        return PCR_ERR_NOMEM;
    }
    if (plain) {
        s->rev = event_new(srv->base, bufferevent_getfd(bev), EV_READ | EV_PERSIST, on_readable, s);
        if (s->rev == NULL) {
            event_free(s->advance);
            free(s);
            return PCR_ERR_NOMEM;
        }
    }
    http_parser_init(&s->parser, HTTP_REQUEST);
    s->parser.data = s;
    pcr_session_register(srv, &s->base, &h1_session_ops);
    bufferevent_setcb(bev, on_read, on_write, on_event, s);
    bufferevent_setwatermark(bev, EV_WRITE, PCR_WRITE_LOW, 0);
    if (plain) {
        bufferevent_disable(bev, EV_READ);
        bufferevent_enable(bev, EV_WRITE);
    } else {
        bufferevent_enable(bev, EV_READ | EV_WRITE);
    }
    arm_timeouts(s, 1);
    if (evbuffer_get_length(bufferevent_get_input(bev)) > 0)
        parse_input(s);
    return 0;
}
