/* router/conn.c: owns the listeners and a connection's first moments: accept, the TLS
 * handshake, and the choice of protocol. With TLS, ALPN decides (h2, else HTTP/1.1). On a
 * plain listener the first bytes decide: the HTTP/2 connection preface means h2c with prior
 * knowledge, anything else is HTTP/1.1, so one port serves both. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/listener.h>

#include "log.h"
#include "session.h"

struct pcr_listener {
    pcr_server_t *srv;
    const pcr_listen_conf_t *conf;
    struct evconnlistener *l;
    SSL_CTX *ssl_ctx;
};

typedef struct {
    pcr_server_t *srv;
    struct bufferevent *bev;
    int tls;
} handshake_t;

static const char h2_preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define H2_PREFACE_LEN 24

static void handshake_done(handshake_t *hs, int h2)
{
    pcr_server_t *srv = hs->srv;
    struct bufferevent *bev = hs->bev;
    int plain = !hs->tls;
    srv->nhandshakes--;
    free(hs);
    bufferevent_setcb(bev, NULL, NULL, NULL, NULL);
    int rc = h2 ? pcr_h2_session_start(srv, bev, plain) : pcr_h1_session_start(srv, bev, plain);
    if (rc < 0)
        bufferevent_free(bev);
}

static void handshake_fail(handshake_t *hs)
{
    hs->srv->nhandshakes--;
    bufferevent_free(hs->bev);
    free(hs);
}

static void on_detect_read(struct bufferevent *bev, void *arg)
{
    handshake_t *hs = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t len = evbuffer_get_length(in);
    size_t n = len < H2_PREFACE_LEN ? len : H2_PREFACE_LEN;
    const unsigned char *p = evbuffer_pullup(in, (ev_ssize_t)n);
    if (memcmp(p, h2_preface, n) != 0)
        handshake_done(hs, 0);
    else if (n == H2_PREFACE_LEN)
        handshake_done(hs, 1);
    /* else: a prefix of the preface so far; wait for more bytes */
}

static void on_detect_event(struct bufferevent *bev, short what, void *arg)
{
    handshake_t *hs = arg;
    if ((what & BEV_EVENT_CONNECTED) && hs->tls) {
        SSL *ssl = bufferevent_openssl_get_ssl(bev);
        const unsigned char *alpn = NULL;
        unsigned alen = 0;
        SSL_get0_alpn_selected(ssl, &alpn, &alen);
        handshake_done(hs, alen == 2 && memcmp(alpn, "h2", 2) == 0);
        return;
    }
    if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF | BEV_EVENT_TIMEOUT)) {
        if (hs->tls && (what & BEV_EVENT_ERROR))
            pcr_log_debug("TLS handshake failed: %lu", bufferevent_get_openssl_error(bev));
        handshake_fail(hs);
    }
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
    struct pcr_listener *lst = arg;
    pcr_server_t *srv = lst->srv;
    if (srv->draining || srv->nsessions + srv->nhandshakes >= srv->cfg->limits.max_client_connections) {
        evutil_closesocket(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    evutil_make_socket_nonblocking(fd);
    handshake_t *hs = calloc(1, sizeof(*hs));
    if (hs == NULL) {
        evutil_closesocket(fd);
        return;
    }
    hs->srv = srv;
    hs->tls = lst->ssl_ctx != NULL;
    if (hs->tls) {
        SSL *ssl = SSL_new(lst->ssl_ctx);
        hs->bev = ssl ? bufferevent_openssl_socket_new(srv->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                       BEV_OPT_CLOSE_ON_FREE)
                      : NULL;
        if (hs->bev == NULL && ssl)
            SSL_free(ssl);
    } else {
        hs->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
    }
    if (hs->bev == NULL) {
        evutil_closesocket(fd);
        free(hs);
        return;
    }
    srv->nhandshakes++;
    srv->metrics.client_connections_total++;
    bufferevent_setcb(hs->bev, hs->tls ? NULL : on_detect_read, NULL, on_detect_event, hs);
    unsigned ms = srv->cfg->timeouts.client_idle_ms;
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    bufferevent_set_timeouts(hs->bev, &tv, &tv);
    bufferevent_enable(hs->bev, EV_READ | EV_WRITE);
}

int pcr_listeners_start(pcr_server_t *srv)
{
    const pcr_config_t *cfg = srv->cfg;
    srv->listeners = calloc(cfg->nlisten, sizeof(*srv->listeners));
    if (srv->listeners == NULL)
        return PCR_ERR_NOMEM;
    srv->nlisteners = cfg->nlisten;
    for (size_t i = 0; i < cfg->nlisten; i++) {
        struct pcr_listener *lst = &srv->listeners[i];
        const pcr_listen_conf_t *lc = &cfg->listen[i];
        lst->srv = srv;
        lst->conf = lc;
        if (lc->tls) {
            char err[256];
            lst->ssl_ctx = pcr_tls_ctx_new(lc->cert, lc->key, err, sizeof(err));
            if (lst->ssl_ctx == NULL) {
                pcr_log_error("listen[%zu].tls: cannot load certificate %s and key %s: %s", i,
                              lc->cert, lc->key, err);
                return PCR_ERR_INVAL;
            }
        }
        lst->l = evconnlistener_new_bind(srv->base, on_accept, lst,
                                         LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 1024,
                                         (const struct sockaddr *)&lc->addr, (int)lc->addrlen);
        if (lst->l == NULL) {
            pcr_log_error("listen[%zu]: cannot listen on %s: %s", i, lc->address,
                          evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
            return PCR_ERR_IO;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        char host[INET6_ADDRSTRLEN] = "?";
        unsigned port = 0;
        getsockname(evconnlistener_get_fd(lst->l), (struct sockaddr *)&ss, &sl);
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
            port = ntohs(s6->sin6_port);
            pcr_log_info("listening on [%s]:%u (%s)", host, port,
                         lc->tls ? "TLS: h2, http/1.1" : "http/1.1 + h2c");
        } else {
            struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
            port = ntohs(s4->sin_port);
            pcr_log_info("listening on %s:%u (%s)", host, port,
                         lc->tls ? "TLS: h2, http/1.1" : "http/1.1 + h2c");
        }
    }
    return 0;
}

void pcr_listeners_stop(pcr_server_t *srv)
{
    for (size_t i = 0; i < srv->nlisteners; i++) {
        if (srv->listeners[i].l)
            evconnlistener_free(srv->listeners[i].l);
        srv->listeners[i].l = NULL;
    }
}

void pcr_listeners_free(pcr_server_t *srv)
{
    pcr_listeners_stop(srv);
    for (size_t i = 0; i < srv->nlisteners; i++)
        SSL_CTX_free(srv->listeners[i].ssl_ctx);
    free(srv->listeners);
    srv->listeners = NULL;
    srv->nlisteners = 0;
}

void pcr_session_register(pcr_server_t *srv, pcr_session_t *s, const pcr_session_ops_t *ops)
{
    s->srv = srv;
    s->ops = ops;
    LIST_INSERT_HEAD(&srv->sessions, s, link);
    srv->nsessions++;
}

void pcr_session_unregister(pcr_session_t *s)
{
    LIST_REMOVE(s, link);
    s->srv->nsessions--;
    if (s->srv->draining)
        pcr_server_check_drained(s->srv);
}
