/* bench/sim/sim_http.c: vllm-sim's HTTP/1.1 side: one sim_conn_t per accepted connection.
 *
 * http-parser reads requests; when one is complete the parser is paused so a pipelined next
 * request waits in the input buffer until this response has ended (sim_conn_respond or
 * sim_conn_end), which resumes parsing. One close path (sim_conn_close) cancels a generation
 * in progress, so a client that leaves frees its slot at once. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "sim.h"

static void parse_input(sim_conn_t *c);

static void reset_message(sim_conn_t *c)
{
    free(c->url);
    c->url = NULL;
    c->url_len = 0;
    evbuffer_drain(c->body, evbuffer_get_length(c->body));
    c->header_is_expect = c->expect_continue = c->too_large = 0;
    c->message_ready = 0;
}

static int on_message_begin(http_parser *p)
{
    reset_message(p->data);
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    sim_conn_t *c = p->data;
    if (c->url_len + len > 8192)
        return -1;
    char *u = realloc(c->url, c->url_len + len + 1);
    if (!u)
        return -1;
    memcpy(u + c->url_len, at, len);
    c->url = u;
    c->url_len += len;
    u[c->url_len] = 0;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    sim_conn_t *c = p->data;
    c->header_is_expect = len == 6 && strncasecmp(at, "expect", 6) == 0;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    sim_conn_t *c = p->data;
    if (c->header_is_expect && len >= 12 && strncasecmp(at, "100-continue", 12) == 0)
        c->expect_continue = 1;
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    sim_conn_t *c = p->data;
    if (c->expect_continue)
        bufferevent_write(c->bev, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    sim_conn_t *c = p->data;
    if (evbuffer_get_length(c->body) + len > c->pod->conf->max_body_bytes) {
        c->too_large = 1;
        return 0;
    }
    evbuffer_add(c->body, at, len);
    return 0;
}

static int on_message_complete(http_parser *p)
{
    sim_conn_t *c = p->data;
    c->message_ready = 1;
    c->keep_alive = http_should_keep_alive(p);
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static int path_is(const sim_conn_t *c, const char *path)
{
    size_t n = strlen(path);
    return c->url_len >= n && memcmp(c->url, path, n) == 0 &&
           (c->url[n] == 0 || c->url[n] == '?');
}

static void send_delayed(evutil_socket_t fd, short what, void *arg)
{
    sim_conn_t *c = arg;
    struct evbuffer *b = c->delayed;
    c->delayed = NULL;
    size_t n = evbuffer_get_length(b);
    sim_conn_respond(c, 200, "application/json", (char *)evbuffer_pullup(b, -1), n);
    evbuffer_free(b);
}

/* The toy tokenizer, answered at once or --tokenize-delay-ms (model time) later. */
static void tokenize(sim_conn_t *c, int kind)
{
    const sim_conf_t *conf = c->pod->conf;
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        sim_conn_error(c, 500, "InternalServerError", "out of memory");
        return;
    }
    size_t n = evbuffer_get_length(c->body);
    if (sim_api_tokenize(c, kind, (const char *)evbuffer_pullup(c->body, -1), n, b) != 0) {
        evbuffer_free(b);
        return;   /* answered */
    }
    if (conf->tokenize_delay_us > 0) {
        if (!c->delay)
            c->delay = evtimer_new(c->base, send_delayed, c);
        if (c->delay) {
            double d = conf->tokenize_delay_us / conf->time_scale;
            struct timeval tv = { (time_t)(d / 1e6), (suseconds_t)((long long)d % 1000000) };
            c->delayed = b;
            evtimer_add(c->delay, &tv);
            return;
        }   /* out of memory: at once rather than never */
    }
    n = evbuffer_get_length(b);
    sim_conn_respond(c, 200, "application/json", (char *)evbuffer_pullup(b, -1), n);
    evbuffer_free(b);
}

static int tokenizer_path(const sim_conn_t *c)
{
    return path_is(c, "/tokenize") || path_is(c, "/v1/completions/render") ||
           path_is(c, "/v1/chat/completions/render") || path_is(c, "/sim/tokenizer/stall");
}

/* The request just read, answered on this loop. */
static void serve(sim_conn_t *c)
{
    sim_pod_t *pod = c->pod;
    int method = c->parser.method;
    c->busy = 1;
    if (c->too_large) {
        sim_conn_error(c, 413, "BadRequestError", "request body too large");
        return;
    }
    if (method == HTTP_GET && path_is(c, "/health")) {
        sim_conn_respond(c, 200, "text/plain", "", 0);
    } else if (method == HTTP_GET && path_is(c, "/metrics")) {
        struct evbuffer *b = evbuffer_new();
        sim_api_metrics(pod, b);
        size_t n = evbuffer_get_length(b);
        sim_conn_respond(c, 200, "text/plain; version=0.0.4", (char *)evbuffer_pullup(b, -1), n);
        evbuffer_free(b);
    } else if (method == HTTP_GET && path_is(c, "/v1/models")) {
        struct evbuffer *b = evbuffer_new();
        sim_api_models(pod, b);
        size_t n = evbuffer_get_length(b);
        sim_conn_respond(c, 200, "application/json", (char *)evbuffer_pullup(b, -1), n);
        evbuffer_free(b);
    } else if (path_is(c, "/tokenize") || path_is(c, "/v1/completions/render") ||
               path_is(c, "/v1/chat/completions/render")) {
        if (method != HTTP_POST) {
            sim_conn_error(c, 405, "BadRequestError", "use POST");
            return;
        }
        tokenize(c, path_is(c, "/tokenize") ? SIM_TOK_TOKENIZE :
                    path_is(c, "/v1/completions/render") ? SIM_TOK_RENDER_COMPLETION :
                    SIM_TOK_RENDER_CHAT);
    } else if (path_is(c, "/v1/completions") || path_is(c, "/v1/chat/completions")) {
        if (method != HTTP_POST) {
            sim_conn_error(c, 405, "BadRequestError", "use POST");
            return;
        }
        int chat = path_is(c, "/v1/chat/completions");
        size_t n = evbuffer_get_length(c->body);
        sim_req_t *r = sim_api_parse(c, chat, (const char *)evbuffer_pullup(c->body, -1), n);
        if (!r)
            return;   /* answered */
        if (sim_rand() < pod->conf->fail_rate) {
            pod->failed_injected++;
            sim_req_free(r);
            sim_conn_error(c, 500, "InternalServerError", "injected failure (--fail-rate)");
            return;
        }
        if (sim_rand() < pod->conf->stall_rate) {
            pod->stalled++;
            sim_req_free(r);   /* never answered: the connection stays busy until closed */
            return;
        }
        c->req = r;
        sim_engine_submit(r);
    } else if (path_is(c, "/sim/stall") || path_is(c, "/sim/tokenizer/stall")) {
        /* A test hook: the loop that serves it (the main loop, every pod's streams; or the
         * pod's tokenizer, as one long prompt would) does nothing else for ?ms=N (at most
         * 10 s) of wall-clock time. */
        const char *q = strchr(c->url, '?');
        long ms = q && strncmp(q, "?ms=", 4) == 0 ? strtol(q + 4, NULL, 10) : 0;
        if (method != HTTP_POST || ms < 0 || ms > 10000) {
            sim_conn_error(c, 400, "BadRequestError", "POST /sim/stall?ms=N, N in 0..10000");
            return;
        }
        struct timespec ts = {ms / 1000, ms % 1000 * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        sim_conn_respond(c, 200, "application/json", "{\"stalled\":true}", 16);
    } else if (path_is(c, "/sim/restart")) {
        if (method != HTTP_POST) {
            sim_conn_error(c, 405, "BadRequestError", "use POST");
            return;
        }
        sim_engine_restart(pod, c);
        sim_conn_respond(c, 200, "application/json", "{\"restarted\":true}", 18);
    } else {
        sim_conn_error(c, 404, "NotFoundError", "no such path");
    }
}

void sim_conn_state_dispose(sim_conn_state_t *st)
{
    if (st->in) evbuffer_free(st->in);
    if (st->out) evbuffer_free(st->out);
    if (st->body) evbuffer_free(st->body);
    free(st->url);
    memset(st, 0, sizeof(*st));
}

/* The connection goes to the other loop with the request it has just read (sim_tok.c); run
 * from the loop, never under parse_input, which would read the freed connection. */
static void on_move(evutil_socket_t fd, short what, void *arg)
{
    sim_conn_t *c = arg;
    sim_conn_state_t st = {evbuffer_new(), evbuffer_new(), c->body, c->url, c->url_len,
                           c->parser.method, c->keep_alive, c->too_large};
    c->body = NULL;
    c->url = NULL;
    c->url_len = 0;
    int ok = st.in && st.out;
    if (ok) {
        evbuffer_add_buffer(st.in, bufferevent_get_input(c->bev));
        evbuffer_add_buffer(st.out, bufferevent_get_output(c->bev));
        ok = sim_tok_move(c, c->to_tok, &st) == 0;   /* takes st */
    }
    if (!ok)
        sim_conn_state_dispose(&st);   /* out of memory: the connection is lost */
    sim_conn_close(c);
}

static void dispatch(sim_conn_t *c)
{
    int tok = tokenizer_path(c);
    if (tok != c->on_tok && sim_tok_running()) {
        c->busy = 1;   /* nothing more is read here */
        c->to_tok = tok;
        if (!c->move_ev)
            c->move_ev = evtimer_new(c->base, on_move, c);
        if (c->move_ev) {
            event_active(c->move_ev, EV_TIMEOUT, 1);
            return;
        }
    }
    serve(c);
}

/* Feeds buffered input to the parser until it pauses on a complete request or runs dry.
 * A response that ends inside dispatch() calls back here: in_parse makes that a no-op and
 * this loop carries on. The connection is never freed under it: finish() only closes at once
 * when nothing is left to write, and every response writes something first. */
static void parse_input(sim_conn_t *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    if (c->in_parse)
        return;   /* the loop below is on the stack and goes on by itself */
    c->in_parse = 1;
    while (!c->busy && !c->closing) {
        size_t avail = evbuffer_get_length(in);
        if (avail == 0)
            break;
        struct evbuffer_iovec v;
        evbuffer_peek(in, -1, NULL, &v, 1);
        size_t used = http_parser_execute(&c->parser, &settings, v.iov_base, v.iov_len);
        enum http_errno err = HTTP_PARSER_ERRNO(&c->parser);
        if (err == HPE_PAUSED) {
            /* http-parser stops on the byte after the message when paused. */
            evbuffer_drain(in, used);
            http_parser_pause(&c->parser, 0);
        } else if (err != HPE_OK) {
            c->keep_alive = 0;
            c->busy = 1;
            sim_conn_error(c, 400, "BadRequestError", http_errno_description(err));
            break;
        } else {
            evbuffer_drain(in, used);
        }
        if (c->message_ready) {
            c->message_ready = 0;
            dispatch(c);
        }
    }
    c->in_parse = 0;
}

static void on_read(struct bufferevent *bev, void *arg)
{
    parse_input(arg);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    sim_conn_t *c = arg;
    if (c->closing && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        sim_conn_close(c);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        sim_conn_close(arg);
}

/* A new connection on `base` (the tokenizer's when `tok`), linked on its pod's list. */
static sim_conn_t *conn_new(sim_pod_t *pod, struct event_base *base, int tok, evutil_socket_t fd)
{
    sim_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        evutil_closesocket(fd);
        return NULL;
    }
    c->pod = pod;
    c->base = base;
    c->on_tok = tok;
    c->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->body = evbuffer_new();
    if (!c->bev || !c->body) {
        if (c->bev) bufferevent_free(c->bev); else evutil_closesocket(fd);
        if (c->body) evbuffer_free(c->body);
        free(c);
        return NULL;
    }
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    sim_conn_t **list = tok ? &pod->tok_conns : &pod->conns;
    c->next = *list;
    if (*list) (*list)->prev = c;
    *list = c;
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    return c;
}

void sim_http_accept(sim_pod_t *pod, evutil_socket_t fd)
{
    struct event_base *tok = sim_tok_base(pod);   /* the listener's loop */
    conn_new(pod, tok ? tok : pod->base, tok != NULL, fd);
}

void sim_http_adopt(sim_pod_t *pod, struct event_base *base, int tok, evutil_socket_t fd,
                    sim_conn_state_t *st)
{
    sim_conn_t *c = conn_new(pod, base, tok, fd);
    if (!c) {
        sim_conn_state_dispose(st);
        return;
    }
    evbuffer_free(c->body);
    c->body = st->body;
    c->url = st->url;
    c->url_len = st->url_len;
    c->parser.method = (unsigned)st->method;
    c->keep_alive = st->keep_alive;
    c->too_large = st->too_large;
    evbuffer_add_buffer(bufferevent_get_output(c->bev), st->out);
    evbuffer_add_buffer(bufferevent_get_input(c->bev), st->in);
    st->body = NULL;
    st->url = NULL;
    sim_conn_state_dispose(st);
    /* Its request first, then what followed it (the response that ends it resumes here). */
    c->in_parse = 1;
    serve(c);
    c->in_parse = 0;
    parse_input(c);
}

void sim_conn_close(sim_conn_t *c)
{
    sim_pod_t *pod = c->pod;
    if (c->req) {
        sim_req_t *r = c->req;
        c->req = NULL;
        r->conn = NULL;
        sim_engine_cancel(r);
    }
    if (c->prev) c->prev->next = c->next; else *(c->on_tok ? &pod->tok_conns : &pod->conns) = c->next;
    if (c->next) c->next->prev = c->prev;
    bufferevent_free(c->bev);
    if (c->body)
        evbuffer_free(c->body);
    if (c->delay)
        event_free(c->delay);
    if (c->move_ev)
        event_free(c->move_ev);
    if (c->delayed)
        evbuffer_free(c->delayed);
    free(c->url);
    free(c);
}

/* The exchange is over: either close after the flush or read the next request. */
static void finish(sim_conn_t *c)
{
    c->busy = 0;
    c->req = NULL;
    if (!c->keep_alive) {
        c->closing = 1;
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
            sim_conn_close(c);
        return;
    }
    parse_input(c);
}

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 500: return "Internal Server Error";
    default:  return "Error";
    }
}

void sim_conn_respond(sim_conn_t *c, int status, const char *ctype, const char *body, size_t len)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nx-sim-pod: %s\r\nContent-Type: %s\r\n"
                        "Content-Length: %zu\r\n%s\r\n", status, reason(status), c->pod->name,
                        ctype, len, c->keep_alive ? "" : "Connection: close\r\n");
    evbuffer_add(out, body, len);
    finish(c);
}

void sim_conn_error(sim_conn_t *c, int status, const char *type, const char *msg)
{
    char body[512];
    /* Messages are fixed strings of ours or http-parser's: nothing to escape. */
    int n = snprintf(body, sizeof body,
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":%d}}",
                     msg, type, status);
    sim_conn_respond(c, status, "application/json", body, (size_t)n);
}

void sim_conn_start_stream(sim_conn_t *c)
{
    evbuffer_add_printf(bufferevent_get_output(c->bev),
                        "HTTP/1.1 200 OK\r\nx-sim-pod: %s\r\n"
                        "Content-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"
                        "Transfer-Encoding: chunked\r\n%s\r\n",
                        c->pod->name, c->keep_alive ? "" : "Connection: close\r\n");
}

void sim_conn_chunk(sim_conn_t *c, struct evbuffer *data)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    size_t n = evbuffer_get_length(data);
    if (n == 0)
        return;
    evbuffer_add_printf(out, "%zx\r\n", n);
    evbuffer_add_buffer(out, data);
    evbuffer_add(out, "\r\n", 2);
}

void sim_conn_end(sim_conn_t *c)
{
    evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5);
    finish(c);
}
