/* router/h2_server.c: owns an HTTP/2 client connection (h2 over TLS, or h2c with prior
 * knowledge): the nghttp2 session (1.52 API) and its streams, one exchange per stream.
 *
 * A stream is created at begin-headers and freed at stream-close, nowhere else. Every read
 * feeds nghttp2_session_mem_recv and then flushes its output; flushing stops above
 * PCR_WRITE_HIGH bytes of unsent output and resumes from the write callback. A response body
 * that has not arrived from upstream yet makes the data source return NGHTTP2_ERR_DEFERRED;
 * upstream data resumes it. Exchange ops never call into nghttp2's send path directly: they
 * queue and activate the deferred `flush` event, so a stream is never closed (and its exchange
 * freed) while the exchange's own code is on the stack. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "exchange.h"
#include "io.h"
#include "log.h"
#include "session.h"

typedef struct h2_sess h2_sess_t;

typedef struct h2_stream {
    int32_t id;
    h2_sess_t *sess;
    pcr_exchange_t *ex;
    struct evbuffer *out;          /* response body not yet taken by nghttp2 */
    size_t header_bytes;
    int reject_status;             /* 413 / 431 decided while receiving */
    int rejected;                  /* the error response went out */
    int eof;                       /* the exchange sent its end */
    int deferred;                  /* the data source returned NGHTTP2_ERR_DEFERRED */
    int head_only;
    int abort;                     /* the response broke: reset once `out` is sent */
    int submitted;                 /* a response with a data source was submitted */
    struct event *rst_timer;       /* the reset of a broken response, sent a little later */
    struct h2_stream *prev, *next;
} h2_stream_t;

struct h2_sess {
    pcr_session_t base;
    pcr_server_t *srv;
    struct bufferevent *bev;
    nghttp2_session *ng;
    struct event *flush;
    h2_stream_t *streams;
    size_t nstreams;
    int closing;
    int plain;                     /* h2c on a plain socket: read and written directly */
    struct event *rev;             /* plain sockets: the read event (io.h) */
};

static void h2_close(h2_sess_t *s);
static void flush_now(h2_sess_t *s);

static void schedule_flush(h2_sess_t *s) { event_active(s->flush, 0, 0); }

static void set_timeouts(h2_sess_t *s)
{
    /* Idle connections time out; one with streams open may be silent for a long stream. */
    unsigned ms = s->srv->cfg->timeouts.client_idle_ms;
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    if (s->plain) {
        bufferevent_set_timeouts(s->bev, NULL, &tv);
        event_add(s->rev, s->nstreams ? NULL : &tv);
    } else {
        bufferevent_set_timeouts(s->bev, s->nstreams ? NULL : &tv, &tv);
    }
}

static void stream_free(h2_stream_t *st)
{
    h2_sess_t *s = st->sess;
    if (st->prev)
        st->prev->next = st->next;
    else
        s->streams = st->next;
    if (st->next)
        st->next->prev = st->prev;
    s->nstreams--;
    pcr_exchange_free(st->ex);
    if (st->rst_timer)
        event_free(st->rst_timer);
    if (st->out)
        evbuffer_free(st->out);
    free(st);
}

/* ---- response ops -------------------------------------------------------------------- */

#define RST_DELAY_US 50000

static void on_rst_timer(evutil_socket_t fd, short what, void *arg)
{
    h2_stream_t *st = arg;
    nghttp2_submit_rst_stream(st->sess->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
    schedule_flush(st->sess);
}

static ssize_t on_data_source_read(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                                   uint32_t *flags, nghttp2_data_source *src, void *user)
{
    h2_stream_t *st = src->ptr;
    size_t avail = evbuffer_get_length(st->out);
    size_t n = avail < length ? avail : length;
    if (n > 0)
        evbuffer_remove(st->out, buf, n);
    if (st->eof && evbuffer_get_length(st->out) == 0) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    } else if (n == 0 && st->abort) {
        /* Everything that arrived went out; the reset follows a moment later, because clients
         * (curl among them) drop DATA that reaches them in the same read as a RST_STREAM. */
        if (st->rst_timer == NULL) {
            st->rst_timer = evtimer_new(st->sess->srv->base, on_rst_timer, st);
            struct timeval tv = {0, RST_DELAY_US};
            if (st->rst_timer)
                evtimer_add(st->rst_timer, &tv);
        }
        st->deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    } else if (n == 0) {
        st->deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    }
    if (st->ex)
        pcr_exchange_on_writable(st->ex);
    return (ssize_t)n;
}

static void op_send_head(pcr_exchange_t *ex, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    h2_stream_t *st = pcr_exchange_session(ex);
    h2_sess_t *s = st->sess;
    nghttp2_nv nva[n + 2];
    char status_str[4], clen_str[24];
    size_t k = 0;
    /* HTTP/2 wants lower-case names; upstream may send any case. */
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += h[i].name_len;
    char *names = malloc(total + 1);
    snprintf(status_str, sizeof(status_str), "%03d", status);
    nva[k++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)status_str, 7, 3, NGHTTP2_NV_FLAG_NONE};
    size_t off = 0;
    for (size_t i = 0; i < n && names != NULL; i++) {
        for (size_t j = 0; j < h[i].name_len; j++)
            names[off + j] = (char)tolower((unsigned char)h[i].name[j]);
        nva[k++] = (nghttp2_nv){(uint8_t *)names + off, (uint8_t *)h[i].value, h[i].name_len,
                                h[i].value_len, NGHTTP2_NV_FLAG_NONE};
        off += h[i].name_len;
    }
    if (clen >= 0) {
        int l = snprintf(clen_str, sizeof(clen_str), "%lld", (long long)clen);
        nva[k++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)clen_str, 14, (size_t)l,
                                NGHTTP2_NV_FLAG_NONE};
    }
    nghttp2_data_provider prd = {.source.ptr = st, .read_callback = on_data_source_read};
    int rc = nghttp2_submit_response(s->ng, st->id, nva, k, st->head_only ? NULL : &prd);
    st->submitted = rc == 0 && !st->head_only;
    free(names);
    if (rc != 0)
        pcr_log_warn("h2 stream %d: cannot submit response: %s", st->id, nghttp2_strerror(rc));
    schedule_flush(s);
}

static void resume(h2_stream_t *st)
{
    if (st->deferred) {
        st->deferred = 0;
        nghttp2_session_resume_data(st->sess->ng, st->id);
    }
    schedule_flush(st->sess);
}

static void op_send_body(pcr_exchange_t *ex, const char *data, size_t len)
{
    h2_stream_t *st = pcr_exchange_session(ex);
    if (st->head_only)
        return;
    evbuffer_add(st->out, data, len);
    resume(st);
}

static void op_send_end(pcr_exchange_t *ex)
{
    h2_stream_t *st = pcr_exchange_session(ex);
    st->eof = 1;
    resume(st);
}

static void op_send_abort(pcr_exchange_t *ex)
{
    h2_stream_t *st = pcr_exchange_session(ex);
    if (st->submitted) {
        st->abort = 1; /* the data source sends what is queued, then resets */
        resume(st);
        return;
    }
    nghttp2_submit_rst_stream(st->sess->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
    schedule_flush(st->sess);
}

static size_t op_pending(pcr_exchange_t *ex)
{
    h2_stream_t *st = pcr_exchange_session(ex);
    return evbuffer_get_length(st->out);
}

static const pcr_exchange_ops_t h2_ops = {op_send_head, op_send_body, op_send_end, op_send_abort,
                                          op_pending};

/* ---- nghttp2 callbacks --------------------------------------------------------------- */

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    h2_sess_t *s = user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    h2_stream_t *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    st->id = frame->hd.stream_id;
    st->sess = s;
    st->out = evbuffer_new();
    st->ex = pcr_exchange_new(s->srv, &h2_ops, st, "HTTP/2");
    st->next = s->streams;
    if (s->streams)
        s->streams->prev = st;
    s->streams = st;
    s->nstreams++;
    if (st->out == NULL || st->ex == NULL) {
        stream_free(st);
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* nghttp2 resets the stream */
    }
    nghttp2_session_set_stream_user_data(ng, st->id, st);
    set_timeouts(s);
    return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *frame, const uint8_t *name, size_t nlen,
                     const uint8_t *value, size_t vlen, uint8_t flags, void *user)
{
    h2_sess_t *s = user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (st == NULL || st->reject_status)
        return 0;
    st->header_bytes += nlen + vlen;
    if (st->header_bytes > s->srv->cfg->limits.max_header_bytes) {
        st->reject_status = 431;
        return 0;
    }
    const char *n = (const char *)name, *v = (const char *)value;
    if (nlen == 7 && memcmp(n, ":method", 7) == 0) {
        if (pcr_exchange_set_method(st->ex, v, vlen) < 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        st->head_only = vlen == 4 && memcmp(v, "HEAD", 4) == 0;
    } else if (nlen == 5 && memcmp(n, ":path", 5) == 0) {
        if (pcr_exchange_set_path(st->ex, v, vlen) < 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    } else if (nlen > 0 && n[0] != ':') {
        if (nlen == 14 && memcmp(n, "content-length", 14) == 0 &&
            strtoull(v, NULL, 10) > s->srv->cfg->limits.max_body_bytes)
            st->reject_status = 413;
        if (pcr_exchange_add_header(st->ex, n, nlen, v, vlen) == PCR_ERR_TOO_LARGE)
            st->reject_status = 431;
    }
    return 0;
}

static void reject(h2_stream_t *st)
{
    h2_sess_t *s = st->sess;
    st->rejected = 1;
    if (st->reject_status == 413)
        pcr_exchange_reject(st->ex, 413, "invalid_request_error", "body_too_large",
                            "request body is larger than limits.max_body_bytes (%zu bytes)",
                            s->srv->cfg->limits.max_body_bytes);
    else
        pcr_exchange_reject(st->ex, 431, "invalid_request_error", "headers_too_large",
                            "request headers are larger than limits.max_header_bytes (%zu bytes)",
                            s->srv->cfg->limits.max_header_bytes);
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (st == NULL)
        return 0;
    if (st->reject_status && !st->rejected) {
        reject(st);
        return 0;
    }
    if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) && !st->rejected && !pcr_exchange_running(st->ex))
        pcr_exchange_run(st->ex);
    return 0;
}

static int on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *user)
{
    h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, id);
    if (st == NULL || st->reject_status)
        return 0;
    if (pcr_exchange_add_body(st->ex, (const char *)data, len) == PCR_ERR_TOO_LARGE) {
        st->reject_status = 413;
        reject(st);
    }
    return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t error_code, void *user)
{
    h2_sess_t *s = user;
    h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, id);
    if (st == NULL)
        return 0;
    nghttp2_session_set_stream_user_data(ng, id, NULL);
    /* A reset by the client, or the natural end: either way the exchange ends here; if its
     * upstream request is still running it is closed, so the pod stops generating. */
    stream_free(st);
    set_timeouts(s);
    if (s->srv->draining)
        pcr_server_check_drained(s->srv);
    return 0;
}

/* ---- connection ---------------------------------------------------------------------- */

static void flush_now(h2_sess_t *s)
{
    struct evbuffer *out = bufferevent_get_output(s->bev);
    while (evbuffer_get_length(out) < PCR_WRITE_HIGH) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(s->ng, &data);
        if (n < 0) {
            pcr_log_debug("h2: send failed: %s", nghttp2_strerror((int)n));
            h2_close(s);
            return;
        }
        if (n == 0)
            break;
        evbuffer_add(out, data, (size_t)n);
    }
    if (s->plain)
        pcr_io_write_now(s->bev);
    if (!nghttp2_session_want_read(s->ng) && !nghttp2_session_want_write(s->ng) &&
        evbuffer_get_length(out) == 0)
        h2_close(s);
}

static void on_flush(evutil_socket_t fd, short what, void *arg) { flush_now(arg); }

static void on_read(struct bufferevent *bev, void *arg)
{
    h2_sess_t *s = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        ssize_t n = nghttp2_session_mem_recv(s->ng, v.iov_base, v.iov_len);
        if (n < 0) {
            /* nghttp2 has queued a GOAWAY for protocol errors; send it, then close. */
            pcr_log_debug("h2: bad input from client: %s", nghttp2_strerror((int)n));
            s->srv->metrics.bad_requests++;
            evbuffer_drain(in, evbuffer_get_length(in));
            if (s->plain)
                event_del(s->rev);
            else
                bufferevent_disable(bev, EV_READ);
            s->closing = 1;
            nghttp2_session_terminate_session(s->ng, NGHTTP2_PROTOCOL_ERROR);
            break;
        }
        evbuffer_drain(in, (size_t)n);
    }
    flush_now(s);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    h2_sess_t *s = arg;
    if (s->closing && evbuffer_get_length(bufferevent_get_output(bev)) == 0 &&
        !nghttp2_session_want_write(s->ng)) {
        h2_close(s);
        return;
    }
    flush_now(s);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    h2_sess_t *s = arg;
    if (what & EV_TIMEOUT) {
        h2_close(s); /* idle past client_idle_ms with no stream open */
        return;
    }
    int n = pcr_io_read_into(s->bev);
    if (n == PCR_IO_AGAIN)
        return;
    if (n <= 0) {
        h2_close(s); /* the client closed or broke the connection */
        return;
    }
    on_read(s->bev, s);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    h2_close(arg); /* EOF, error or timeout: every stream's exchange is abandoned */
}

static void h2_drain(pcr_session_t *base)
{
    h2_sess_t *s = (h2_sess_t *)base;
    /* GOAWAY with the last stream we took: the client retries later ones elsewhere. */
    nghttp2_submit_goaway(s->ng, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(s->ng),
                          NGHTTP2_NO_ERROR, NULL, 0);
    schedule_flush(s);
}

static void h2_force_close(pcr_session_t *base) { h2_close((h2_sess_t *)base); }

static const pcr_session_ops_t h2_session_ops = {h2_drain, h2_force_close};

static void h2_close(h2_sess_t *s)
{
    while (s->streams)
        stream_free(s->streams);
    nghttp2_session_del(s->ng);
    event_free(s->flush);
    if (s->rev)
        event_free(s->rev);
    bufferevent_free(s->bev);
    pcr_session_unregister(&s->base);
    free(s);
}

int pcr_h2_session_start(pcr_server_t *srv, struct bufferevent *bev, int plain)
{
    h2_sess_t *s = calloc(1, sizeof(*s));
    nghttp2_session_callbacks *cbs = NULL;
    if (s == NULL || nghttp2_session_callbacks_new(&cbs) != 0)
        goto fail;
    s->srv = srv;
    s->bev = bev;
    s->plain = plain;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    int rc = nghttp2_session_server_new(&s->ng, cbs, s);
    nghttp2_session_callbacks_del(cbs);
    if (rc != 0)
        goto fail;
    s->flush = event_new(srv->base, -1, 0, on_flush, s);
    if (s->flush == NULL)
        goto fail;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, srv->cfg->limits.max_concurrent_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}, /* prompts are large: 1 MiB per stream */
    };
    nghttp2_submit_settings(s->ng, NGHTTP2_FLAG_NONE, iv, PCR_ARRAY_SIZE(iv));
    nghttp2_session_set_local_window_size(s->ng, NGHTTP2_FLAG_NONE, 0, 16 << 20);
    pcr_session_register(srv, &s->base, &h2_session_ops);
    bufferevent_setcb(bev, on_read, on_write, on_event, s);
    bufferevent_setwatermark(bev, EV_WRITE, PCR_WRITE_LOW, 0);
    if (plain) {
        s->rev = event_new(srv->base, bufferevent_getfd(bev), EV_READ | EV_PERSIST, on_readable, s);
        if (s->rev == NULL) {
            pcr_session_unregister(&s->base);
            goto fail;
        }
        bufferevent_disable(bev, EV_READ);
        bufferevent_enable(bev, EV_WRITE);
    } else {
        bufferevent_enable(bev, EV_READ | EV_WRITE);
    }
    set_timeouts(s);
    if (evbuffer_get_length(bufferevent_get_input(bev)) > 0)
        on_read(bev, s);
    else
        flush_now(s);
    return 0;
fail:
    if (s && s->flush)
        event_free(s->flush);
    if (s && s->ng)
        nghttp2_session_del(s->ng);
    free(s);
    return PCR_ERR_NOMEM;
}
