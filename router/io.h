/* router/io.h: small helpers over libevent socket bufferevents for the hot path. */
#ifndef PCR_ROUTER_IO_H
#define PCR_ROUTER_IO_H

#include <event2/bufferevent.h>

/* Writes what it can of a plain socket bufferevent's output now, instead of a loop turn later
 * when EV_WRITE fires. Not for TLS bufferevents (they have their own write path). */
void pcr_io_write_now(struct bufferevent *bev);

/* An event base tuned for a proxy: epoll with a changelist. */
struct event_base *pcr_io_base_new(void);

#endif
