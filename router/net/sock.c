/* router/net/sock.c: the transport interface (sock.h) shared by both implementations: dispatch
 * through the ops table, and what every socket has (callbacks, peer address). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

#include "sock.h"

void pcr_sock_set_cbs(pcr_sock_t *s, const pcr_sock_cbs_t *cbs, void *arg)
{
    s->cbs = cbs;
    s->arg = arg;
}

int pcr_sock_bufs_make(struct evbuffer **in, struct evbuffer **out)
{
    if (*in == NULL)
        *in = evbuffer_new();
    if (*out == NULL)
        *out = evbuffer_new();
    return *in != NULL && *out != NULL ? 0 : -1;
}

void pcr_sock_bufs_free(struct evbuffer **in, struct evbuffer **out)
{
    if (*in != NULL)
        evbuffer_free(*in);
    if (*out != NULL)
        evbuffer_free(*out);
    *in = *out = NULL;
}

void pcr_sock_free(pcr_sock_t *s)
{
    if (s != NULL)
        s->ops->free(s);
}

void pcr_sock_read_start(pcr_sock_t *s)
{
    if (!s->reading) {
        s->reading = 1;
        s->ops->read_start(s);
    }
}

void pcr_sock_read_stop(pcr_sock_t *s)
{
    if (s->reading) {
        s->reading = 0;
        s->ops->read_stop(s);
    }
}

int pcr_sock_reading(const pcr_sock_t *s) { return s->reading; }
struct evbuffer *pcr_sock_input(pcr_sock_t *s) { return s->ops->input(s); }
struct evbuffer *pcr_sock_output(pcr_sock_t *s) { return s->ops->output(s); }
void pcr_sock_flush(pcr_sock_t *s) { s->ops->flush(s); }
void pcr_sock_flush_soon(pcr_sock_t *s) { s->ops->flush_soon(s); }

size_t pcr_sock_pending(const pcr_sock_t *s) { return s->ops->pending(s); }

void pcr_sock_idle(pcr_sock_t *s, int idle) { s->ops->idle(s, idle); }
void pcr_sock_last_write(pcr_sock_t *s) { s->ops->last_write(s); }

void pcr_sock_want_drain(pcr_sock_t *s, size_t low)
{
    s->drain_low = low;
    s->drain_wanted = 1;
    s->ops->want_drain(s);
}

void pcr_sock_set_write_timeout(pcr_sock_t *s, unsigned ms)
{
    if (s->write_timeout_ms != ms) {
        s->write_timeout_ms = ms;
        s->ops->set_write_timeout(s);
    }
}

void pcr_sock_shutdown_write(pcr_sock_t *s)
{
    if (s->fd >= 0)
        (void)shutdown(s->fd, SHUT_WR); /* fails only when the peer is already gone */
}

int pcr_sock_is_tls(const pcr_sock_t *s) { return s->tls; }
int pcr_sock_alpn_h2(const pcr_sock_t *s) { return s->alpn_h2; }

void pcr_sock_set_admin(pcr_sock_t *s) { s->admin = 1; }
int pcr_sock_admin(const pcr_sock_t *s) { return s->admin; }

void pcr_sock_set_peer(pcr_sock_t *s, const struct sockaddr *sa, socklen_t len)
{
    char host[INET6_ADDRSTRLEN];
    snprintf(s->peer, sizeof(s->peer), "-");
    if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        if (inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host)))
            snprintf(s->peer, sizeof(s->peer), "[%s]:%u", host, ntohs(a->sin6_port));
    } else if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        if (inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host)))
            snprintf(s->peer, sizeof(s->peer), "%s:%u", host, ntohs(a->sin_port));
    }
}

const char *pcr_sock_peer(pcr_sock_t *s)
{
    if (s->peer[0] != '\0')
        return s->peer;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (s->fd >= 0 && getpeername(s->fd, (struct sockaddr *)&ss, &len) == 0)
        pcr_sock_set_peer(s, (const struct sockaddr *)&ss, len);
    else
        snprintf(s->peer, sizeof(s->peer), "-");
    return s->peer;
}
