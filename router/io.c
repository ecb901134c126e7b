/* router/io.c: owns the write shortcut the proxy takes on plain sockets.
 *
 * A bufferevent does not write when data is added to its output: it adds the EV_WRITE event,
 * waits for epoll to say the socket is writable, writes, and removes the event again. That is
 * two epoll_ctl calls and a loop turn per response per socket, and on this class of machine a
 * system call is what a request costs most. Here the data goes out with one writev right away;
 * when the output empties, the write event the bufferevent added is deleted again in the same
 * loop turn, and with the epoll changelist the add and the delete cancel without any system
 * call. A write that leaves data behind (the socket is full) keeps the event, and the
 * bufferevent carries on as usual, with its watermarks and write timeout.
 *
 * Reading the same way saves the FIONREAD ioctl libevent's evbuffer_read makes before each
 * read: one system call per request on each side of the proxy. */
#include <errno.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_struct.h>
#include <event2/event.h>

#include "io.h"

void pcr_io_write_now(struct bufferevent *bev)
{
    struct evbuffer *out = bufferevent_get_output(bev);
    if (evbuffer_get_length(out) == 0)
        return;
    evutil_socket_t fd = bufferevent_getfd(bev);
    if (fd < 0)
        return;
    /* A socket bufferevent keeps the front of its output frozen and thaws it only around its
     * own writes; do the same. An error is left for the bufferevent's own write, which reports
     * it through the event callback, the one close path. */
    evbuffer_unfreeze(out, 1);
    int n = evbuffer_write(out, fd);
    evbuffer_freeze(out, 1);
    if (n > 0 && evbuffer_get_length(out) == 0)
        event_del(&bev->ev_write);
}

int pcr_io_read_into(struct bufferevent *bev)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    evutil_socket_t fd = bufferevent_getfd(bev);
    struct evbuffer_iovec v;
    /* The bufferevent keeps the end of its input frozen outside its own reads; so do we. */
    evbuffer_unfreeze(in, 0);
    if (evbuffer_reserve_space(in, 16384, &v, 1) < 1) {
        evbuffer_freeze(in, 0);
        return -1;
    }
    ssize_t n = read(fd, v.iov_base, v.iov_len);
    v.iov_len = n > 0 ? (size_t)n : 0;
    evbuffer_commit_space(in, &v, n > 0 ? 1 : 0);
    evbuffer_freeze(in, 0);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? PCR_IO_AGAIN : -1;
    return (int)n;
}

struct event_base *pcr_io_base_new(void)
{
    struct event_config *cfg = event_config_new();
    if (cfg == NULL)
        return NULL;
    /* Merges the add/delete pairs of one loop turn into at most one epoll_ctl. pcrouter never
     * dup()s a socket, the one case where the changelist is unsafe. */
    event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    struct event_base *base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    return base;
}
