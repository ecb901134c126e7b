/* router/io.h: small helpers over libevent socket bufferevents for the hot path. */
#ifndef PCR_ROUTER_IO_H
#define PCR_ROUTER_IO_H

#include <event2/bufferevent.h>

/* Writes what it can of a plain socket bufferevent's output now, instead of a loop turn later
 * when EV_WRITE fires. Not for TLS bufferevents (they have their own write path). */
void pcr_io_write_now(struct bufferevent *bev);

/* Reads what a plain socket has (up to 16 KiB) into a socket bufferevent's input buffer with
 * one read(2), where libevent's own read path asks FIONREAD first. For a bufferevent whose
 * EV_READ is disabled and whose socket the caller watches with its own event. Returns the bytes
 * read, 0 at end of stream, PCR_IO_AGAIN when there was nothing, -1 on error. */
#define PCR_IO_AGAIN (-2)
int pcr_io_read_into(struct bufferevent *bev);

/* An event base tuned for a proxy: epoll with a changelist. */
struct event_base *pcr_io_base_new(void);

#endif
