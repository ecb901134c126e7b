/* router/net/sock_tls.c: the TLS transport (sock.h) through libevent's bufferevent_openssl
 * (OpenSSL 3 does the record layer; libevent drives it from the loop): server connections
 * (accepted on a TLS listener) and client ones (to a pod with an https:// url).
 *
 * The handshake reads and writes whatever the owner asked, so reading is forced on until it
 * completes; on_ready then reports it and the ALPN choice. The bufferevent's write callback,
 * with its low watermark set to the owner's drain mark, is the drain notification. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/bufferevent_struct.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "clock.h"
#include "sock.h"
#include "tls.h"

typedef struct {
    pcr_sock_t base;
    struct bufferevent *bev;
    int handshaking;
    int client;                 /* connects to a pod: a failed handshake is a failed connect */
    int failed;                 /* a TLS or socket error ended it: no close_notify then */
    int in_flush;               /* inside tls_flush: the owner's callbacks wait for the loop */
    char why[192];              /* client: why the connect or the handshake failed */
} tls_t;

static void on_bev_read(struct bufferevent *bev, void *arg)
{
    tls_t *t = arg;
    t->base.cbs->on_read(&t->base, t->base.arg);
}

static void on_bev_write(struct bufferevent *bev, void *arg)
{
    tls_t *t = arg;
    if (t->in_flush) {
        /* Written from tls_flush: the drain is reported from the loop, as always. */
        if (t->base.drain_wanted)
            bufferevent_trigger(bev, EV_WRITE, BEV_TRIG_DEFER_CALLBACKS | BEV_TRIG_IGNORE_WATERMARKS);
        return;
    }
    if (t->base.drain_wanted &&
        evbuffer_get_length(bufferevent_get_output(bev)) <= t->base.drain_low) {
        t->base.drain_wanted = 0;
        t->base.cbs->on_drain(&t->base, t->base.arg);
    }
}

static void on_bev_event(struct bufferevent *bev, short what, void *arg)
{
    tls_t *t = arg;
    if (t->in_flush) {
        /* A write from tls_flush failed: the end is reported from the loop. */
        t->failed = 1;
        bufferevent_trigger_event(bev, what, BEV_TRIG_DEFER_CALLBACKS);
        return;
    }
    if (what & BEV_EVENT_CONNECTED) {
        t->handshaking = 0;
        if (t->client) {
            /* The connect's deadline is over; the owner's write timeout is the only one now. */
            struct timeval tv = pcr_ms_to_tv(t->base.write_timeout_ms);
            bufferevent_set_timeouts(bev, NULL, t->base.write_timeout_ms ? &tv : NULL);
        }
        const unsigned char *alpn = NULL;
        unsigned alen = 0;
        SSL_get0_alpn_selected(bufferevent_openssl_get_ssl(bev), &alpn, &alen);
        t->base.alpn_h2 = alen == 2 && alpn[0] == 'h' && alpn[1] == '2';
        if (!t->base.reading)
            bufferevent_disable(bev, EV_READ);
        t->base.cbs->on_ready(&t->base, 0, t->base.arg);
        return;
    }
    if (t->client && t->handshaking) {
        /* Not connected: the owner hears it as a failed connect, with the reason kept. */
        int err = EVUTIL_SOCKET_ERROR();
        unsigned long ossl = bufferevent_get_openssl_error(bev);
        SSL *ssl = bufferevent_openssl_get_ssl(bev);
        if (what & BEV_EVENT_TIMEOUT) {
            err = ETIMEDOUT;
            snprintf(t->why, sizeof(t->why), "connect or handshake timed out");
        } else if (ossl != 0 || (ssl != NULL && SSL_get_verify_result(ssl) != X509_V_OK)) {
            err = EPROTO;
            pcr_tls_failure(ssl, ossl, t->why, sizeof(t->why));
        } else if (err == 0 || (what & BEV_EVENT_EOF)) {
            err = ECONNRESET;
            pcr_tls_failure(NULL, 0, t->why, sizeof(t->why));
        } else {
            snprintf(t->why, sizeof(t->why), "%s", strerror(err));
        }
        ERR_clear_error();
        t->handshaking = 0;
        t->failed = 1;
        bufferevent_disable(bev, EV_READ | EV_WRITE);
        t->base.cbs->on_ready(&t->base, err, t->base.arg);
        return;
    }
    pcr_sock_end_t why = PCR_SOCK_ERROR;
    unsigned long ossl = 0;
    if (what & BEV_EVENT_TIMEOUT)
        why = PCR_SOCK_WRITE_TIMEOUT;
    else if (what & BEV_EVENT_EOF)
        why = PCR_SOCK_EOF;
    else if (t->handshaking || (ossl = bufferevent_get_openssl_error(bev)) != 0)
        why = PCR_SOCK_TLS_ERROR;
    t->failed = why != PCR_SOCK_EOF;
    /* With TLS 1.3 a pod that refuses the client's certificate says so after the handshake,
     * at the first read: keep its reason too. */
    if (why == PCR_SOCK_TLS_ERROR && t->client)
        pcr_tls_failure(bufferevent_openssl_get_ssl(bev), ossl, t->why, sizeof(t->why));
    ERR_clear_error();
    bufferevent_disable(bev, EV_READ | EV_WRITE);
    t->base.cbs->on_end(&t->base, why, t->base.arg);
}

static void tls_free(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (t->bev) {
        /* close_notify before the fd goes (libevent closes without one): a peer that reads to
         * the end, an HTTP/1.0 client for one, otherwise sees a truncated stream, and an
         * OpenSSL client then drops the TLS 1.3 session ticket it was given. One non-blocking
         * attempt, only on a connection whose handshake finished and that saw no TLS error. */
        SSL *ssl = bufferevent_openssl_get_ssl(t->bev);
        if (ssl != NULL && !t->handshaking && !t->failed && SSL_is_init_finished(ssl))
            (void)SSL_shutdown(ssl);
        ERR_clear_error();
        bufferevent_free(t->bev); /* closes the fd and frees the SSL */
    }
    free(t);
}

static void tls_read_start(pcr_sock_t *s)
{
    bufferevent_enable(((tls_t *)s)->bev, EV_READ);
}

static void tls_read_stop(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (!t->handshaking)
        bufferevent_disable(t->bev, EV_READ);
}

static struct evbuffer *tls_input(pcr_sock_t *s) { return bufferevent_get_input(((tls_t *)s)->bev); }
static struct evbuffer *tls_output(pcr_sock_t *s) { return bufferevent_get_output(((tls_t *)s)->bev); }

static size_t tls_pending(const pcr_sock_t *s)
{
    return evbuffer_get_length(bufferevent_get_output(((const tls_t *)s)->bev));
}

static void tls_idle(pcr_sock_t *s, int idle) {}
/* libevent's bufferevent_openssl adds its write event when output arrives and writes only once
 * epoll reports the socket writable: a loop turn later, and two epoll_ctl per response (add
 * EPOLLOUT, remove it). Flushing runs its write handler at once instead: the bytes the kernel
 * takes go now, and when that empties the output the event is deleted in the turn it was
 * added, which the loop's changelist merges into no system call. A write the kernel refuses
 * leaves the event added, as before. The owner's callbacks the handler would run (drain, end)
 * are deferred to the loop: none runs inside this call. */
static void tls_flush(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (t->handshaking || t->failed || t->in_flush ||
        evbuffer_get_length(bufferevent_get_output(t->bev)) == 0)
        return;
    struct event *ev = &t->bev->ev_write;
    event_callback_fn write_handler = event_get_callback(ev);
    t->in_flush = 1;
    write_handler(event_get_fd(ev), EV_WRITE, event_get_callback_arg(ev));
    t->in_flush = 0;
}

static void tls_want_drain(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    bufferevent_setwatermark(t->bev, EV_WRITE, s->drain_low, 0);
    if (evbuffer_get_length(bufferevent_get_output(t->bev)) <= s->drain_low)
        bufferevent_trigger(t->bev, EV_WRITE, BEV_TRIG_DEFER_CALLBACKS | BEV_TRIG_IGNORE_WATERMARKS);
}

static void tls_set_write_timeout(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (t->client && t->handshaking)
        return; /* the connect's deadline holds until the handshake ends */
    unsigned ms = s->write_timeout_ms;
    struct timeval tv = pcr_ms_to_tv(ms);
    bufferevent_set_timeouts(t->bev, NULL, ms ? &tv : NULL);
}

static const pcr_sock_ops_t tls_ops = {
    tls_free, tls_read_start, tls_read_stop, tls_input,
    tls_output, tls_pending, tls_flush, tls_flush, tls_want_drain, tls_set_write_timeout, tls_idle,
};

pcr_sock_t *pcr_sock_tls_new(struct event_base *base, int fd, SSL *ssl)
{
    tls_t *t = calloc(1, sizeof(*t));
    if (t != NULL)
        t->bev = bufferevent_openssl_socket_new(base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                BEV_OPT_CLOSE_ON_FREE);
    if (t == NULL || t->bev == NULL) {
        free(t);
        SSL_free(ssl);
        close(fd);
        return NULL;
    }
    t->base.ops = &tls_ops;
    t->base.fd = fd;
    t->base.tls = 1;
    t->handshaking = 1;
    bufferevent_openssl_set_allow_dirty_shutdown(t->bev, 1);
    bufferevent_setcb(t->bev, on_bev_read, on_bev_write, on_bev_event, t);
    bufferevent_enable(t->bev, EV_READ | EV_WRITE);
    return &t->base;
}

pcr_sock_t *pcr_sock_tls_connect(struct event_base *base, const struct sockaddr *sa, socklen_t len,
                                 unsigned timeout_ms, SSL *ssl)
{
    tls_t *t = calloc(1, sizeof(*t));
    if (t != NULL)
        t->bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                                BEV_OPT_CLOSE_ON_FREE);
    if (t == NULL || t->bev == NULL) {
        free(t);
        SSL_free(ssl);
        errno = ENOMEM;
        return NULL;
    }
    t->base.ops = &tls_ops;
    t->base.tls = 1;
    t->client = 1;
    t->handshaking = 1;
    t->base.reading = 0;
    bufferevent_openssl_set_allow_dirty_shutdown(t->bev, 1);
    bufferevent_setcb(t->bev, on_bev_read, on_bev_write, on_bev_event, t);
    /* One deadline for the TCP connect and the handshake together. */
    struct timeval tv = pcr_ms_to_tv(timeout_ms);
    bufferevent_set_timeouts(t->bev, timeout_ms ? &tv : NULL, timeout_ms ? &tv : NULL);
    if (bufferevent_socket_connect(t->bev, (struct sockaddr *)sa, (int)len) != 0) {
        int err = EVUTIL_SOCKET_ERROR();
        bufferevent_free(t->bev);
        free(t);
        errno = err ? err : ECONNREFUSED;
        return NULL;
    }
    t->base.fd = bufferevent_getfd(t->bev);
    bufferevent_enable(t->bev, EV_READ | EV_WRITE);
    return &t->base;
}

const char *pcr_sock_failure(const pcr_sock_t *s)
{
    return s->tls && ((const tls_t *)s)->client ? ((const tls_t *)s)->why : "";
}
