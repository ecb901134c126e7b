/* test/fuzz/fuzz_pod.c: the pod behind the router under fuzzing (fuzz_pod.h). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_pod.h"

static void pod_flush_header(fuzz_pod_t *c)
{
    if (c->name.len == 0 && !c->in_value)
        return;
    const char *n = (const char *)c->name.p;
    size_t len = c->name.len;
    if (len == 4 && strncasecmp(n, "host", 4) == 0) {
        c->n_host++;
        FUZZ_CHECKF(c->value.len == strlen(c->host) &&
                        fuzz_mem_eq(c->value.p, c->host, c->value.len),
                    "the pod's Host is %.*s", (int)c->value.len, (char *)c->value.p);
    } else if (len == 14 && strncasecmp(n, "content-length", 14) == 0) {
        c->n_cl++;
        snprintf(c->cl, sizeof(c->cl), "%.*s", (int)c->value.len, (char *)c->value.p);
    } else if (len == 17 && strncasecmp(n, "transfer-encoding", 17) == 0) {
        c->n_te++;
    }
    static const char *const hop[] = {"connection", "keep-alive", "proxy-connection", "te",
                                      "trailer", "upgrade", "expect", "http2-settings"};
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        FUZZ_CHECKF(!(strlen(hop[i]) == len && strncasecmp(n, hop[i], len) == 0),
                    "a hop-by-hop field reached the pod: %.*s", (int)len, n);
    FUZZ_CHECKF(len > 0 && n[0] != ':', "field name \"%.*s\" reached the pod", (int)len, n);
    fuzz_buf_add(&c->hnames, n, len);
    fuzz_buf_add(&c->hnames, "", 1);
    c->name.len = c->value.len = 0;
    c->in_value = 0;
}

static int pod_begin(http_parser *p)
{
    fuzz_pod_t *c = p->data;
    c->name.len = c->value.len = c->url.len = c->body.len = c->hnames.len = 0;
    c->in_value = 0;
    c->n_host = c->n_cl = c->n_te = 0;
    c->cl[0] = '\0';
    return 0;
}

static int pod_url(http_parser *p, const char *at, size_t n)
{
    fuzz_buf_add(&((fuzz_pod_t *)p->data)->url, at, n);
    return 0;
}

static int pod_field(http_parser *p, const char *at, size_t n)
{
    fuzz_pod_t *c = p->data;
    if (c->in_value)
        pod_flush_header(c);
    fuzz_buf_add(&c->name, at, n);
    return 0;
}

static int pod_value(http_parser *p, const char *at, size_t n)
{
    fuzz_pod_t *c = p->data;
    c->in_value = 1;
    fuzz_buf_add(&c->value, at, n);
    return 0;
}

static int pod_headers_complete(http_parser *p)
{
    pod_flush_header(p->data);
    return 0;
}

static int pod_body(http_parser *p, const char *at, size_t n)
{
    fuzz_buf_add(&((fuzz_pod_t *)p->data)->body, at, n);
    return 0;
}

/* A whole request: the parser stops there, so that it is checked and answered in turn. */
static int pod_complete(http_parser *p)
{
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings pod_settings = {
    .on_message_begin = pod_begin, .on_url = pod_url, .on_header_field = pod_field,
    .on_header_value = pod_value, .on_headers_complete = pod_headers_complete,
    .on_body = pod_body, .on_message_complete = pod_complete,
};

/* Writes what the socket takes of the answer; closes once it is out, for a closing one. */
static int pod_send(fuzz_pod_t *c)
{
    size_t n = c->outq.len ? fuzz_write(c->fd, c->outq.p, c->outq.len) : 0;
    fuzz_buf_consume(&c->outq, n);
    if (c->outq.len == 0 && c->close_when_sent) {
        close(c->fd);
        c->fd = -1;
        return 1;
    }
    return n > 0;
}

/* `readable`: poll() saw something to read (or an end) on it; else nothing is read, and what
 * is parsed is what an earlier turn left, which is nothing: each turn parses all it read. */
static int pod_step(fuzz_pod_t *c, int readable)
{
    if (c->fd < 0)
        return 0;
    size_t got = readable ? fuzz_read(c->fd, &c->in, &c->eof) : 0;
    size_t off = 0;
    while (off < c->in.len && !c->silent && !c->close_when_sent) {
        size_t n = http_parser_execute(&c->p, &pod_settings, (const char *)c->in.p + off,
                                       c->in.len - off);
        off += n;
        enum http_errno e = HTTP_PARSER_ERRNO(&c->p);
        FUZZ_CHECKF(e == HPE_OK || e == HPE_PAUSED, "the router sent the pod a malformed "
                    "request: %s", http_errno_description(e));
        if (e != HPE_PAUSED)
            break;
        http_parser_pause(&c->p, 0);
        c->ops->check(c);
        c->ops->answer(c);
    }
    if (c->silent || c->close_when_sent)
        off = c->in.len;
    fuzz_buf_consume(&c->in, off);
    int sent = pod_send(c);
    if (c->eof && c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
        return 1;
    }
    return got > 0 || sent;
}

static int listener_fd = -1;
static uint16_t listener_port;

static void listener_close(void)
{
    int fd;
    while ((fd = fuzz_accept(listener_fd)) >= 0)
        close(fd);
    close(listener_fd);
    listener_fd = -1;
}

int fuzz_pods_listener(uint16_t *port)
{
    if (listener_fd < 0) {
        listener_fd = fuzz_listen(&listener_port);
        FUZZ_CHECK(atexit(listener_close) == 0);
    }
    *port = listener_port;
    return listener_fd;
}

int fuzz_pods_accept(fuzz_pods_t *ps, int lfd, const fuzz_pod_ops_t *ops, void *owner,
                     const char *host)
{
    int fd, moved = 0;
    while ((fd = fuzz_accept(lfd)) >= 0) {
        /* A closed connection's slot is taken again: a long pipeline may open many in turn. */
        size_t i = 0;
        while (i < ps->n && ps->pods[i].fd >= 0)
            i++;
        FUZZ_CHECKF(i < FUZZ_MAX_PODS, "more than %d pod connections open at once",
                    FUZZ_MAX_PODS);
        if (i == ps->n)
            ps->n++;
        fuzz_pod_t *c = &ps->pods[i];
        c->owner = owner;
        c->ops = ops;
        c->host = host;
        c->fd = fd;
        c->eof = c->silent = c->close_when_sent = 0;
        c->in.len = c->outq.len = 0;
        http_parser_init(&c->p, HTTP_REQUEST);
        c->p.data = c;
        moved = 1;
    }
    return moved;
}

int fuzz_pods_turn(fuzz_pods_t *ps, int lfd, const fuzz_pod_ops_t *ops, void *owner,
                   const char *host, int client_fd, fuzz_buf_t *out, int *client_eof)
{
    struct pollfd pf[2 + FUZZ_MAX_PODS];
    pf[0] = (struct pollfd){.fd = client_fd, .events = POLLIN};
    pf[1] = (struct pollfd){.fd = lfd, .events = POLLIN};
    size_t npods = ps->n;
    for (size_t i = 0; i < npods; i++)
        pf[2 + i] = (struct pollfd){.fd = ps->pods[i].fd, .events = POLLIN};
    int rc;
    while ((rc = poll(pf, 2 + npods, 0)) < 0 && errno == EINTR)
        ;
    FUZZ_CHECKF(rc >= 0, "poll: %s", strerror(errno));
    int moved = 0;
    if (client_fd >= 0 && pf[0].revents != 0)
        moved |= fuzz_read(client_fd, out, client_eof) > 0 || *client_eof;
    if (pf[1].revents != 0)
        moved |= fuzz_pods_accept(ps, lfd, ops, owner, host);
    /* A connection taken in this turn, or on a slot taken again, was not polled: it is read. */
    for (size_t i = 0; i < ps->n; i++)
        moved |= pod_step(&ps->pods[i], i >= npods || pf[2 + i].fd != ps->pods[i].fd ||
                                            pf[2 + i].revents != 0);
    return moved;
}

void fuzz_pods_close(fuzz_pods_t *ps)
{
    for (size_t i = 0; i < ps->n; i++) {
        if (ps->pods[i].fd >= 0) {
            close(ps->pods[i].fd);
            ps->pods[i].fd = -1;
        }
    }
}

void fuzz_pods_free(fuzz_pods_t *ps)
{
    for (size_t i = 0; i < ps->n; i++) {
        fuzz_pod_t *c = &ps->pods[i];
        if (c->fd >= 0)
            fuzz_close_reset(c->fd);
        fuzz_buf_free(&c->in);
        fuzz_buf_free(&c->name);
        fuzz_buf_free(&c->value);
        fuzz_buf_free(&c->url);
        fuzz_buf_free(&c->body);
        fuzz_buf_free(&c->hnames);
        fuzz_buf_free(&c->outq);
    }
}
