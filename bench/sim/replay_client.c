/* bench/sim/replay_client.c: a small HTTP/1.1 client pool, see replay_client.h.
 *
 * One rc_conn_t per TCP connection, owning its bufferevent and http-parser; one rc_req_t per
 * exchange, owning its wire bytes (kept for the one retry) and its timeout. A connection is
 * either busy with one request or on the idle list. */
#include "replay_client.h"

#include <event2/bufferevent.h>
#include <http_parser.h>
#include <netdb.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pcr/common.h"

typedef struct rc_conn rc_conn_t;
typedef struct rc_req rc_req_t;

struct rc_req {
    rc_pool_t *pool;
    rc_req_t *next;              /* pending queue */
    rc_conn_t *conn;
    struct evbuffer *wire;
    const rc_cb_t *cb;
    void *arg;
    struct event *timer;
    int retried;
};

struct rc_conn {
    rc_pool_t *pool;
    rc_conn_t *prev, *next;      /* all connections */
    rc_conn_t *idle_next;
    int idle;
    struct bufferevent *bev;
    http_parser parser;
    rc_req_t *req;
    int reused;                  /* served a request before this one */
    size_t got;                  /* response bytes read for the current request */
    char hname[16];
    size_t hname_len;
    int hname_long, in_value;
    int is_pod;
    char pod[128];
    size_t pod_len;
    int complete;
};

struct rc_pool {
    struct event_base *base;
    rc_target_t t;
    unsigned max_conns, nconns;
    rc_conn_t *conns, *idle;
    rc_req_t *pend_head, *pend_tail;
};

static void dispatch(rc_pool_t *pool, rc_req_t *req, int fresh);

int rc_target_parse(const char *url, rc_target_t *t)
{
    if (strncmp(url, "http://", 7) != 0) {
        fprintf(stderr, "replay: only http:// URLs: %s\n", url);
        return -1;
    }
    const char *h = url + 7, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    char host[256], port[16] = "80", *colon;
    if (hl == 0 || hl >= sizeof host) {
        fprintf(stderr, "replay: bad URL %s\n", url);
        return -1;
    }
    memcpy(host, h, hl);
    host[hl] = 0;
    if ((colon = strrchr(host, ':')) != NULL) {
        snprintf(port, sizeof port, "%s", colon + 1);
        *colon = 0;
    }
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
    int e = getaddrinfo(host, port, &hints, &ai);
    if (e) {
        fprintf(stderr, "replay: cannot resolve %s: %s\n", url, gai_strerror(e));
        return -1;
    }
    memcpy(&t->addr, ai->ai_addr, ai->ai_addrlen);
    t->addrlen = ai->ai_addrlen;
    freeaddrinfo(ai);
    snprintf(t->hostport, sizeof t->hostport, "%.*s", (int)hl, h);
    t->path = slash ? slash : "/";
    return 0;
}

rc_pool_t *rc_pool_new(struct event_base *base, const char *url, unsigned max_conns,
                       const char **path)
{
    rc_target_t t;
    if (rc_target_parse(url, &t) != 0)
        return NULL;
    rc_pool_t *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return NULL;
    pool->base = base;
    pool->t = t;
    pool->max_conns = max_conns ? max_conns : 1;
    *path = t.path;
    return pool;
}

unsigned rc_pool_open_conns(const rc_pool_t *pool) { return pool->nconns; }

static void conn_free(rc_conn_t *c)
{
    rc_pool_t *pool = c->pool;
    if (c->idle) {
        rc_conn_t **pp = &pool->idle;
        while (*pp != c)
            pp = &(*pp)->idle_next;
        *pp = c->idle_next;
    }
    if (c->prev) c->prev->next = c->next; else pool->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    pool->nconns--;
    bufferevent_free(c->bev);
    free(c);
}

static void req_free(rc_req_t *req)
{
    if (req->timer)
        event_free(req->timer);
    if (req->wire)
        evbuffer_free(req->wire);
    free(req);
}

/* Ends a request: callbacks last, after the request left every structure. */
static void req_done(rc_req_t *req, int err)
{
    if (req->conn)
        req->conn->req = NULL;
    req->conn = NULL;
    const rc_cb_t *cb = req->cb;
    void *arg = req->arg;
    req_free(req);
    cb->on_done(arg, err);
}

static void start_pending(rc_pool_t *pool)
{
    while (pool->pend_head && (pool->idle || pool->nconns < pool->max_conns)) {
        rc_req_t *req = pool->pend_head;
        pool->pend_head = req->next;
        if (!pool->pend_head)
            pool->pend_tail = NULL;
        req->next = NULL;
        dispatch(pool, req, 0);
    }
}

/* Connection finished with its request: keep it when it can serve another. */
static void conn_release(rc_conn_t *c, int keep)
{
    rc_pool_t *pool = c->pool;
    if (keep) {
        c->idle = 1;
        c->idle_next = pool->idle;
        pool->idle = c;
        c->reused = 1;
    } else {
        conn_free(c);
    }
    start_pending(pool);
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    rc_conn_t *c = p->data;
    if (c->in_value) {
        c->in_value = 0;
        c->hname_len = 0;
        c->hname_long = 0;
    }
    if (c->hname_len + len > sizeof c->hname) {
        c->hname_long = 1;
        return 0;
    }
    memcpy(c->hname + c->hname_len, at, len);
    c->hname_len += len;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    rc_conn_t *c = p->data;
    if (!c->in_value) {
        c->in_value = 1;
        c->is_pod = !c->hname_long && c->hname_len == 9 && strncasecmp(c->hname, "x-sim-pod", 9) == 0;
        if (c->is_pod)
            c->pod_len = 0;
    }
    if (c->is_pod && c->pod_len + len <= sizeof c->pod) {
        memcpy(c->pod + c->pod_len, at, len);
        c->pod_len += len;
    }
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    rc_conn_t *c = p->data;
    if (c->req) {
        c->req->cb->on_status(c->req->arg, p->status_code);
        if (c->pod_len && c->req->cb->on_pod)
            c->req->cb->on_pod(c->req->arg, c->pod, c->pod_len);
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    rc_conn_t *c = p->data;
    if (c->req)
        c->req->cb->on_body(c->req->arg, at, len);
    return 0;
}

static int on_message_complete(http_parser *p)
{
    rc_conn_t *c = p->data;
    c->complete = 1;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings settings = {
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* After the parser stopped: finish the exchange if the response is complete. Returns 1 when
 * the connection is gone or reassigned (callers must not touch it further). */
static int after_parse(rc_conn_t *c, int eof)
{
    if (!c->complete) {
        return 0;
    }
    int keep = !eof && http_should_keep_alive(&c->parser) &&
               evbuffer_get_length(bufferevent_get_input(c->bev)) == 0;
    rc_req_t *req = c->req;
    c->req = NULL;
    if (req) {
        req->conn = NULL;
        req_done(req, 0);
    }
    conn_release(c, keep);
    return 1;
}

static void on_read(struct bufferevent *bev, void *arg)
{
    rc_conn_t *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (!c->req) {   /* bytes on an idle connection: not HTTP we expect, drop it */
        conn_free(c);
        return;
    }
    while (evbuffer_get_length(in) && !c->complete) {
        struct evbuffer_iovec v;
        evbuffer_peek(in, -1, NULL, &v, 1);
        size_t used = http_parser_execute(&c->parser, &settings, v.iov_base, v.iov_len);
        enum http_errno err = HTTP_PARSER_ERRNO(&c->parser);
        c->got += used;
        evbuffer_drain(in, used);
        if (err != HPE_OK && err != HPE_PAUSED) {
            rc_req_t *req = c->req;
            rc_pool_t *pool = c->pool;
            conn_free(c);
            req->conn = NULL;
            req_done(req, PCR_ERR_PARSE);
            start_pending(pool);
            return;
        }
    }
    after_parse(c, 0);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    rc_conn_t *c = arg;
    rc_pool_t *pool = c->pool;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return;
    }
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    rc_req_t *req = c->req;
    if (!req) {
        conn_free(c);
        return;
    }
    if (what & BEV_EVENT_EOF) {
        /* A response delimited by the close completes now. */
        http_parser_execute(&c->parser, &settings, NULL, 0);
        if (after_parse(c, 1))
            return;
    }
    int reused = c->reused, got = c->got > 0;
    c->req = NULL;
    req->conn = NULL;
    conn_free(c);
    if (reused && !got && !req->retried) {
        req->retried = 1;
        dispatch(pool, req, 1);
        return;
    }
    req_done(req, PCR_ERR_IO);
    start_pending(pool);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    rc_req_t *req = arg;
    rc_pool_t *pool = req->pool;
    if (req->conn) {
        rc_conn_t *c = req->conn;
        c->req = NULL;
        req->conn = NULL;
        conn_free(c);
    } else {
        rc_req_t **pp = &pool->pend_head, *prev = NULL;
        while (*pp && *pp != req) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = req->next;
            if (pool->pend_tail == req)
                pool->pend_tail = prev;
        }
    }
    req_done(req, PCR_ERR_TIMEOUT);
    start_pending(pool);
}

static rc_conn_t *conn_open(rc_pool_t *pool)
{
    rc_conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->pool = pool;
    c->bev = bufferevent_socket_new(pool->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev) {
        free(c);
        return NULL;
    }
    bufferevent_setcb(c->bev, on_read, NULL, on_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    c->next = pool->conns;
    if (pool->conns) pool->conns->prev = c;
    pool->conns = c;
    pool->nconns++;
    if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&pool->t.addr, (int)pool->t.addrlen)) {
        conn_free(c);
        return NULL;
    }
    return c;
}

static void dispatch(rc_pool_t *pool, rc_req_t *req, int fresh)
{
    rc_conn_t *c = NULL;
    if (!fresh && pool->idle) {
        c = pool->idle;
        pool->idle = c->idle_next;
        c->idle = 0;
    } else if (pool->nconns < pool->max_conns || fresh) {
        c = conn_open(pool);
        if (!c) {
            req_done(req, PCR_ERR_IO);
            return;
        }
    } else {
        req->next = NULL;
        if (pool->pend_tail) pool->pend_tail->next = req; else pool->pend_head = req;
        pool->pend_tail = req;
        return;
    }
    c->req = req;
    req->conn = c;
    c->got = 0;
    c->complete = 0;
    c->in_value = 0;
    c->hname_len = 0;
    c->pod_len = 0;
    http_parser_init(&c->parser, HTTP_RESPONSE);
    c->parser.data = c;
    size_t n = evbuffer_get_length(req->wire);
    bufferevent_write(c->bev, evbuffer_pullup(req->wire, -1), n);
}

void rc_send(rc_pool_t *pool, const char *method, const char *path, struct evbuffer *body,
             double timeout_s, const rc_cb_t *cb, void *arg)
{
    rc_req_t *req = calloc(1, sizeof(*req));
    if (!req || !(req->wire = evbuffer_new()) ||
        !(req->timer = evtimer_new(pool->base, on_timeout, req))) {
        if (req)
            req_free(req);
        cb->on_done(arg, PCR_ERR_NOMEM);
        return;
    }
    req->pool = pool;
    req->cb = cb;
    req->arg = arg;
    size_t blen = body ? evbuffer_get_length(body) : 0;
    evbuffer_add_printf(req->wire, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, pool->t.hostport);
    if (body)
        evbuffer_add_printf(req->wire, "Content-Type: application/json\r\nContent-Length: %zu\r\n",
                            blen);
    evbuffer_add(req->wire, "\r\n", 2);
    if (body)
        evbuffer_add_buffer(req->wire, body);
    struct timeval tv = { (time_t)timeout_s, (suseconds_t)((timeout_s - (time_t)timeout_s) * 1e6) };
    evtimer_add(req->timer, &tv);
    dispatch(pool, req, 0);
}

void rc_pool_free(rc_pool_t *pool)
{
    if (!pool)
        return;
    while (pool->conns) {
        rc_conn_t *c = pool->conns;
        if (c->req) {
            c->req->conn = NULL;
            req_free(c->req);
        }
        conn_free(c);
    }
    while (pool->pend_head) {
        rc_req_t *r = pool->pend_head;
        pool->pend_head = r->next;
        req_free(r);
    }
    free(pool);
}
