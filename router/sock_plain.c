/* router/sock_plain.c: the plain TCP transport (sock.h): a non-blocking fd with its own read
 * and write events and two evbuffers.
 *
 * Reading: one recvmsg(2) per readable event straight into the input buffer's free space (no
 * FIONREAD ioctl first, as libevent's evbuffer_read makes). Writing: pcr_sock_flush() writes at
 * once with one sendmsg(2) of the output's chains (pcr_sock_flush_soon() the same from the
 * loop, through the `soon` event); only when the kernel did not take everything is the write
 * event added, so a request that fits the socket buffer costs no epoll_ctl at all (and with the epoll
 * changelist an add and delete in one loop turn cancel). The write event carries the write
 * timeout, restarted only when bytes actually leave, so a peer that stops reading is caught even
 * while its owner keeps appending.
 *
 * The write event also carries everything reported "from the loop": a write error found inside
 * flush(), the result of a connect, and the drain notification, which is why flush() never calls
 * back into its caller.
 *
 * recvmsg and sendmsg, not readv and writev: the socket calls skip the VFS layer (file position
 * lock, iterator setup), a measurable part of the kernel's time per request; MSG_NOSIGNAL
 * replaces ignoring SIGPIPE. With a single buffer, recv and send: they skip copying in the
 * message header and its iovec array too. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "sock.h"

#define READ_SIZE 16384
#define WRITE_IOV 64               /* chains per sendmsg; the rest goes with the next */

typedef struct {
    pcr_sock_t base;
    struct event *rev, *wev;
    struct event *soon;        /* pcr_sock_flush_soon(): a write from the loop */
    struct evbuffer *in, *out;
    int wev_added;
    int connecting;            /* connect in progress: the write event waits for it */
    int connect_err;           /* a connect that failed at once, reported from the loop */
    int write_err;             /* a write that failed inside flush(), reported from the loop */
    int ended;                 /* on_end was called: nothing more is reported */
} plain_t;

static void arm_write(plain_t *p, int restart)
{
    if (p->wev_added && !restart)
        return;
    struct timeval tv, *tvp = NULL;
    unsigned ms = p->base.write_timeout_ms;
    if (ms > 0) {
        tv.tv_sec = ms / 1000;
        tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
        tvp = &tv;
    }
    event_add(p->wev, tvp);
    p->wev_added = 1;
}

static void disarm_write(plain_t *p)
{
    if (p->wev_added) {
        event_del(p->wev);
        p->wev_added = 0;
    }
}

static void end(plain_t *p, pcr_sock_end_t why)
{
    if (p->ended)
        return;
    p->ended = 1;
    event_del(p->rev);
    disarm_write(p);
    p->base.cbs->on_end(&p->base, why, p->base.arg);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    plain_t *p = arg;
    struct evbuffer_iovec v[2];
    int nv = evbuffer_reserve_space(p->in, READ_SIZE, v, 2);
    if (nv < 1) {
        end(p, PCR_SOCK_ERROR);
        return;
    }
    ssize_t n;
    if (nv == 1) {
        n = recv(fd, v[0].iov_base, v[0].iov_len, MSG_DONTWAIT);
    } else {
        struct msghdr mh = {.msg_iov = (struct iovec *)v, .msg_iovlen = (size_t)nv};
        n = recvmsg(fd, &mh, MSG_DONTWAIT);
    }
    if (n <= 0) {
        evbuffer_commit_space(p->in, v, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        end(p, n == 0 ? PCR_SOCK_EOF : PCR_SOCK_ERROR);
        return;
    }
    size_t left = (size_t)n;
    int used = 0;
    for (int i = 0; i < nv && left > 0; i++, used++) {
        if (v[i].iov_len > left)
            v[i].iov_len = left;
        left -= v[i].iov_len;
    }
    evbuffer_commit_space(p->in, v, used);
    p->base.cbs->on_read(&p->base, p->base.arg);
}

static void write_some(plain_t *p)
{
    if (evbuffer_get_length(p->out) == 0) {
        disarm_write(p);
        return;
    }
    struct evbuffer_iovec v[WRITE_IOV];
    int nv = evbuffer_peek(p->out, -1, NULL, v, WRITE_IOV);
    if (nv > WRITE_IOV)
        nv = WRITE_IOV;
    ssize_t n;
    if (nv == 1) {
        n = send(p->base.fd, v[0].iov_base, v[0].iov_len, MSG_DONTWAIT | MSG_NOSIGNAL);
    } else {
        struct msghdr mh = {.msg_iov = (struct iovec *)v, .msg_iovlen = (size_t)nv};
        n = sendmsg(p->base.fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    if (n > 0)
        evbuffer_drain(p->out, (size_t)n);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        p->write_err = errno ? errno : EIO;
        event_active(p->wev, EV_WRITE, 0); /* reported from the loop */
        return;
    }
    if (evbuffer_get_length(p->out) > 0)
        arm_write(p, n > 0); /* the timeout restarts only when bytes left */
    else
        disarm_write(p);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    plain_t *p = arg;
    if (p->ended)
        return;
    if (p->connecting) {
        int err = p->connect_err;
        if (err == 0 && (what & EV_TIMEOUT)) {
            err = ETIMEDOUT;
        } else if (err == 0) {
            socklen_t len = sizeof(err);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
        }
        if (err == EINPROGRESS)
            return; /* spurious */
        p->connecting = 0;
        disarm_write(p);
        if (err == 0 && p->base.reading)
            event_add(p->rev, NULL);
        p->base.cbs->on_ready(&p->base, err, p->base.arg);
        return;
    }
    if (p->write_err) {
        end(p, PCR_SOCK_ERROR);
        return;
    }
    if ((what & EV_TIMEOUT) && evbuffer_get_length(p->out) > 0) {
        end(p, PCR_SOCK_WRITE_TIMEOUT);
        return;
    }
    if (what & EV_WRITE)
        write_some(p);
    if (p->write_err) {
        end(p, PCR_SOCK_ERROR);
        return;
    }
    if (p->base.drain_wanted && evbuffer_get_length(p->out) <= p->base.drain_low) {
        p->base.drain_wanted = 0;
        p->base.cbs->on_drain(&p->base, p->base.arg);
    }
}

static void plain_free(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (p->rev)
        event_free(p->rev);
    if (p->wev)
        event_free(p->wev);
    if (p->soon)
        event_free(p->soon);
    if (p->in)
        evbuffer_free(p->in);
    if (p->out)
        evbuffer_free(p->out);
    if (s->fd >= 0)
        close(s->fd);
    free(p);
}

static void plain_read_start(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (!p->connecting && !p->ended)
        event_add(p->rev, NULL);
}

static void plain_read_stop(pcr_sock_t *s) { event_del(((plain_t *)s)->rev); }
static struct evbuffer *plain_input(pcr_sock_t *s) { return ((plain_t *)s)->in; }
static struct evbuffer *plain_output(pcr_sock_t *s) { return ((plain_t *)s)->out; }

static void plain_flush(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (!p->connecting && !p->write_err && !p->ended)
        write_some(p);
}

/* A write from the loop, after the events that are ready now: an event of its own, made
 * active. Not the write event: libevent re-adds an active persistent event that has a
 * timeout, which would leave it polling a socket that is always writable. */
static void on_soon(evutil_socket_t fd, short what, void *arg)
{
    plain_t *p = arg;
    if (!p->connecting)
        on_writable(p->base.fd, EV_WRITE, p);
}

static void plain_flush_soon(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (!p->connecting && !p->write_err && !p->ended && evbuffer_get_length(p->out) > 0)
        event_active(p->soon, 0, 0);
}

static void plain_want_drain(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (!p->connecting && evbuffer_get_length(p->out) <= s->drain_low)
        event_active(p->wev, 0, 0); /* already there: say so from the loop */
}

static void plain_set_write_timeout(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (p->wev_added && !p->connecting)
        arm_write(p, 1);
}

static const pcr_sock_ops_t plain_ops = {
    plain_free, plain_read_start, plain_read_stop, plain_input,
    plain_output, plain_flush, plain_flush_soon, plain_want_drain, plain_set_write_timeout,
};

static plain_t *plain_make(struct event_base *base, int fd)
{
    plain_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->base.ops = &plain_ops;
    p->base.fd = fd;
    p->rev = event_new(base, fd, EV_READ | EV_PERSIST, on_readable, p);
    p->wev = event_new(base, fd, EV_WRITE | EV_PERSIST, on_writable, p);
    p->soon = event_new(base, -1, 0, on_soon, p);
    p->in = evbuffer_new();
    p->out = evbuffer_new();
    if (p->rev == NULL || p->wev == NULL || p->soon == NULL || p->in == NULL || p->out == NULL) {
        p->base.fd = -1;
        plain_free(&p->base);
        return NULL;
    }
    return p;
}

pcr_sock_t *pcr_sock_plain_new(struct event_base *base, int fd)
{
    plain_t *p = plain_make(base, fd);
    if (p == NULL) {
        close(fd);
        return NULL;
    }
    return &p->base;
}

pcr_sock_t *pcr_sock_connect(struct event_base *base, const struct sockaddr *sa, socklen_t len,
                             unsigned timeout_ms)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    plain_t *p = plain_make(base, fd);
    if (p == NULL) {
        close(fd);
        errno = ENOMEM;
        return NULL;
    }
    p->connecting = 1;
    int err = connect(fd, sa, len) == 0 ? 0 : errno;
    if (err != EINPROGRESS) {
        p->connect_err = err;
        /* Done (or failed) at once: still reported from the loop. */
        event_active(p->wev, EV_WRITE, 0);
        return &p->base;
    }
    struct timeval tv = {timeout_ms / 1000, (suseconds_t)(timeout_ms % 1000) * 1000};
    event_add(p->wev, &tv);
    p->wev_added = 1;
    return &p->base;
}

struct event_base *pcr_sock_base_new(void)
{
    struct event_config *cfg = event_config_new();
    if (cfg == NULL)
        return NULL;
    /* Merges the add/delete pairs of one loop turn into at most one epoll_ctl: a write that
     * had to wait a turn adds and deletes its event without a system call. pcrouter never
     * dup()s a socket, the one case where the changelist is unsafe. */
    event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    struct event_base *base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    return base;
}
