/* router/http/conn.c: owns the listeners and a connection's first moments: accept, the connection
 * limit, the TLS handshake, and the choice of protocol. With TLS, ALPN decides (h2, else
 * HTTP/1.1). On a plain listener the first bytes decide: the HTTP/2 connection preface means h2c
 * with prior knowledge, anything else is HTTP/1.1, so one port serves both. The whole handshake
 * (TLS included) must finish within timeouts.request_header_ms.
 *
 * Accepting: each listener accepts in a loop until the kernel has nothing more. When the process
 * runs out of file descriptors (EMFILE, ENFILE), accept would fail at once forever, a busy loop
 * that serves nobody; instead the listener gives back a spare descriptor it keeps for this, takes
 * the waiting connection and closes it (the client learns at once rather than timing out), then
 * stops accepting for a back-off that doubles while it lasts, and logs once per back-off. This is
 * what nginx and HAProxy do.
 *
 * The connection limit (limits.max_client_connections) counts every session, handshakes
 * included; at the limit, the session that has waited longest for its client is closed to make
 * room (session.h), and only when every session has a request in flight is the new one refused.
 *
 * Under memory pressure (the overload action stop_accepting, pcr/overload.h) the public
 * listeners stop accepting until it ends: new connections wait in the kernel's backlog, and
 * those past it are refused by the kernel. The admin listener goes on accepting.
 *
 * The admin listener (admin.address) is one more listener of the same plan, after those of
 * `listen`: every worker accepts on it, so /metrics is answered by a loop that sees the
 * workers' counters as any public request would, a reload keeps or moves it like the others,
 * and no second HTTP server is needed. Its connections are marked (pcr_sock_set_admin): the
 * exchange then serves /metrics and /health there, and nothing else. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "log.h"
#include "session.h"

#define ACCEPT_BATCH 64
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1600

struct pcr_listener {
    pcr_worker_t *w;
    const pcr_listen_conf_t *conf;
    int fd;
    struct event *ev;
    struct event *backoff;
    unsigned backoff_ms;
    uint64_t refused;           /* connections closed unserved during this back-off */
    SSL_CTX *ssl_ctx;
    int admin;                  /* the admin listener: its connections are marked */
};

/* ---- the handshake ------------------------------------------------------------------- */

typedef struct {
    pcr_session_t base;
    pcr_sock_t *sock;
    struct event *deadline;
} handshake_t;

static const char h2_preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define H2_PREFACE_LEN 24

static void handshake_free(handshake_t *hs)
{
    pcr_session_unregister(&hs->base);
    if (hs->deadline)
        event_free(hs->deadline);
    pcr_sock_free(hs->sock);
    free(hs);
}

static void handshake_done(handshake_t *hs, int h2)
{
    pcr_worker_t *w = hs->base.w;
    pcr_sock_t *sock = hs->sock;
    hs->sock = NULL;
    handshake_free(hs);
    /* The socket goes on reading: the session sets its callbacks before the loop runs again.
     * Stopping here and starting again there would cost an epoll_ctl at the next turn. */
    int rc = h2 ? pcr_h2_session_start(w, sock) : pcr_h1_session_start(w, sock);
    if (rc < 0)
        pcr_sock_free(sock);
}

static void on_hs_read(pcr_sock_t *sock, void *arg)
{
    handshake_t *hs = arg;
    struct evbuffer *in = pcr_sock_input(sock);
    size_t len = evbuffer_get_length(in);
    size_t n = len < H2_PREFACE_LEN ? len : H2_PREFACE_LEN;
    const unsigned char *p = evbuffer_pullup(in, (ev_ssize_t)n);
    if (memcmp(p, h2_preface, n) != 0)
        handshake_done(hs, 0);
    else if (n == H2_PREFACE_LEN)
        handshake_done(hs, 1);
    /* else: a prefix of the preface so far; wait for more bytes */
}

static void on_hs_ready(pcr_sock_t *sock, int err, void *arg)
{
    handshake_t *hs = arg;
    handshake_done(hs, pcr_sock_alpn_h2(sock));
}

static void on_hs_end(pcr_sock_t *sock, pcr_sock_end_t why, void *arg)
{
    if (why == PCR_SOCK_TLS_ERROR)
        pcr_log_debug("TLS handshake with %s failed", pcr_sock_peer(sock));
    handshake_free(arg);
}

static void on_hs_drain(pcr_sock_t *sock, void *arg) {}

static const pcr_sock_cbs_t hs_cbs = {on_hs_read, on_hs_drain, on_hs_end, on_hs_ready};

static void on_hs_deadline(evutil_socket_t fd, short what, void *arg)
{
    handshake_t *hs = arg;
    pcr_log_debug("connection from %s: no protocol chosen within %u ms", pcr_sock_peer(hs->sock),
                  hs->base.w->cfg->timeouts.request_header_ms);
    handshake_free(hs);
}

static void hs_close(pcr_session_t *s) { handshake_free((handshake_t *)s); }

static const pcr_session_ops_t hs_ops = {hs_close, hs_close};

static void start_handshake(struct pcr_listener *lst, int fd, const struct sockaddr *peer,
                            socklen_t peerlen)
{
    pcr_worker_t *w = lst->w;
    handshake_t *hs = calloc(1, sizeof(*hs));
    if (hs == NULL) {
        close(fd);
        return;
    }
    if (lst->ssl_ctx != NULL) {
        SSL *ssl = SSL_new(lst->ssl_ctx);
        if (ssl == NULL) {
            close(fd);
            free(hs);
            return;
        }
        hs->sock = pcr_sock_tls_new(w->base, fd, ssl);
    } else {
        hs->sock = pcr_sock_plain_new(w->base, fd);
    }
    if (hs->sock != NULL) {
        pcr_sock_set_peer(hs->sock, peer, peerlen);
        if (lst->admin)
            pcr_sock_set_admin(hs->sock);
    }
    hs->deadline = evtimer_new(w->base, on_hs_deadline, hs);
    if (hs->sock == NULL || hs->deadline == NULL) {
        pcr_sock_free(hs->sock);
        if (hs->deadline)
            event_free(hs->deadline);
        free(hs);
        return;
    }
    pcr_session_register(w, &hs->base, &hs_ops,
                         lst->ssl_ctx != NULL ? PCR_CONN_H1_TLS : PCR_CONN_H1);
    pcr_session_set_waiting(&hs->base, 1);
    PCR_INC(w->metrics.client_connections_total);
    unsigned ms = w->cfg->timeouts.request_header_ms;
    struct timeval tv = pcr_ms_to_tv(ms);
    evtimer_add(hs->deadline, &tv);
    pcr_sock_set_cbs(hs->sock, &hs_cbs, hs);
    pcr_sock_set_write_timeout(hs->sock, w->cfg->timeouts.client_write_ms);
    pcr_sock_read_start(hs->sock);
}

/* ---- accepting ----------------------------------------------------------------------- */

/* This worker's share of limits.max_client_connections. */
static size_t conn_limit(const pcr_worker_t *w)
{
    size_t n = w->cfg->limits.max_client_connections / w->srv->nworkers;
    return n ? n : 1;
}

/* Room for one more connection: at the limit, the session waiting longest goes. */
static int make_room(pcr_worker_t *w)
{
    if (w->nsessions < conn_limit(w))
        return 1;
    pcr_session_t *oldest = TAILQ_FIRST(&w->waiting);
    if (oldest == NULL)
        return 0;
    PCR_INC(w->metrics.connections_evicted);
    oldest->ops->close(oldest);
    return w->nsessions < conn_limit(w);
}

static void spare_take(pcr_worker_t *w)
{
    if (w->spare_fd < 0)
        w->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void pcr_listeners_pause(pcr_worker_t *w, int pause)
{
    if (w->accept_paused == pause)
        return;
    w->accept_paused = pause;
    if (pause)
        PCR_INC(w->metrics.accept_pauses);
    for (size_t i = 0; i < w->nlisteners; i++) {
        struct pcr_listener *lst = &w->listeners[i];
        if (lst->admin || lst->ev == NULL)
            continue;
        if (pause)
            event_del(lst->ev);
        else if (!w->draining && !evtimer_pending(lst->backoff, NULL))
            event_add(lst->ev, NULL); /* a back-off that runs re-adds it itself */
    }
}

static void on_backoff(evutil_socket_t fd, short what, void *arg)
{
    struct pcr_listener *lst = arg;
    spare_take(lst->w);
    if (lst->w->draining || lst->fd < 0 || (lst->w->accept_paused && !lst->admin))
        return;
    pcr_log_info("listen %s: accepting again after %u ms (%llu connection(s) refused meanwhile)",
                 lst->conf->address, lst->backoff_ms, (unsigned long long)lst->refused);
    event_add(lst->ev, NULL);
}

/* Out of descriptors: close one waiting connection with the spare, pause, log once. */
static void out_of_fds(struct pcr_listener *lst, int err)
{
    pcr_worker_t *w = lst->w;
    if (w->spare_fd >= 0) {
        close(w->spare_fd);
        w->spare_fd = -1;
        int fd = accept4(lst->fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            close(fd);
            lst->refused++;
        }
        spare_take(w);
    }
    PCR_INC(w->metrics.accept_fd_exhausted);
    unsigned prev = lst->backoff_ms;
    lst->backoff_ms = prev == 0 ? BACKOFF_MIN_MS : prev * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : prev * 2;
    if (prev == 0)
        pcr_log_warn("listen %s: accept failed: %s; pausing %u ms (open connections: %zu)",
                     lst->conf->address, strerror(err), lst->backoff_ms, w->nsessions);
    event_del(lst->ev);
    struct timeval tv = pcr_ms_to_tv(lst->backoff_ms);
    evtimer_add(lst->backoff, &tv);
}

static void on_acceptable(evutil_socket_t lfd, short what, void *arg)
{
    struct pcr_listener *lst = arg;
    pcr_worker_t *w = lst->w;
    /* The memory account past stop_accepting: connections wait in the kernel's backlog. */
    if (!lst->admin && pcr_mem_action_fresh(w->srv, PCR_OVERLOAD_STOP_ACCEPTING)) {
        pcr_listeners_pause(w, 1);
        return;
    }
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        struct sockaddr_storage peer;
        socklen_t peerlen = sizeof(peer);
        int fd = accept4(lfd, (struct sockaddr *)&peer, &peerlen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if (err == EINTR || err == ECONNABORTED)
                continue;
            if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
                out_of_fds(lst, err);
                return;
            }
            if (err != EAGAIN && err != EWOULDBLOCK)
                pcr_log_warn("listen %s: accept failed: %s", lst->conf->address, strerror(err));
            break;
        }
        if (lst->backoff_ms != 0) {
            lst->backoff_ms = 0; /* descriptors are back */
            lst->refused = 0;
        }
        if (w->draining || !make_room(w)) {
            PCR_INC(w->metrics.connections_refused);
            close(fd);
            continue;
        }
        start_handshake(lst, fd, (const struct sockaddr *)&peer, peerlen);
    }
}

static int listen_socket(const struct sockaddr *sa, socklen_t len, int reuseport, char *err,
                         size_t errlen)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0)
        goto fail;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* Linux gives an accepted socket the listener's TCP_NODELAY: one call here, none per
     * connection. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0)
        goto fail;
    if (bind(fd, sa, len) != 0 || listen(fd, 4096) != 0)
        goto fail;
    return fd;
fail:
    snprintf(err, errlen, "%s", strerror(errno));
    if (fd >= 0)
        close(fd);
    return -1;
}

static void log_listening(const pcr_listen_conf_t *lc, const struct sockaddr_storage *ss,
                          unsigned nworkers, int admin)
{
    char host[INET6_ADDRSTRLEN] = "?";
    const char *proto = admin     ? "admin: /metrics, /health; http/1.1 + h2c"
                        : lc->tls ? "TLS: h2, http/1.1"
                                  : "http/1.1 + h2c";
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
        pcr_log_info("listening on [%s]:%u (%s, %u worker(s))", host, ntohs(s6->sin6_port), proto,
                     nworkers);
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
        pcr_log_info("listening on %s:%u (%s, %u worker(s))", host, ntohs(s4->sin_port), proto,
                     nworkers);
    }
}

/* The plan's listeners: those of `listen`, then the admin one when there is one. */
static size_t plan_count(const pcr_config_t *cfg)
{
    return cfg->nlisten + (cfg->admin.addrlen != 0);
}

static const pcr_listen_conf_t *plan_conf(const pcr_config_t *cfg, size_t i)
{
    return i < cfg->nlisten ? &cfg->listen[i] : &cfg->admin;
}

/* Whether the running listener `old` can keep its sockets for `nw` (the same address as
 * written, and TLS or not alike). */
static int same_listener(const pcr_listen_conf_t *old, const pcr_listen_conf_t *nw)
{
    return strcmp(old->address, nw->address) == 0 && old->tls == nw->tls;
}

void pcr_listen_plan_free(pcr_listen_plan_t *plan)
{
    if (plan == NULL)
        return;
    for (size_t i = 0; plan->fds != NULL && i < plan->n * plan->nworkers; i++)
        if (plan->fds[i] >= 0)
            close(plan->fds[i]);
    for (size_t i = 0; plan->ctx != NULL && i < plan->n; i++)
        SSL_CTX_free(plan->ctx[i]);
    free(plan->fds);
    free(plan->ctx);
    free(plan->keep);
    free(plan);
}

pcr_listen_plan_t *pcr_listen_plan_new(pcr_server_t *srv, const pcr_config_t *cfg,
                                       const pcr_config_t *old)
{
    unsigned nw = srv->nworkers;
    pcr_listen_plan_t *plan = calloc(1, sizeof(*plan));
    if (plan == NULL)
        return NULL;
    size_t n = plan_count(cfg);
    plan->n = n;
    plan->nworkers = nw;
    plan->fds = malloc((n ? n : 1) * nw * sizeof(int));
    plan->ctx = calloc(n ? n : 1, sizeof(*plan->ctx));
    plan->keep = malloc((n ? n : 1) * sizeof(*plan->keep));
    if (plan->fds == NULL || plan->ctx == NULL || plan->keep == NULL) {
        pcr_listen_plan_free(plan);
        return NULL;
    }
    for (size_t i = 0; i < n * nw; i++)
        plan->fds[i] = -1;
    for (size_t i = 0; i < n; i++) {
        const pcr_listen_conf_t *lc = plan_conf(cfg, i);
        char what[32], err[256];
        if (i < cfg->nlisten)
            snprintf(what, sizeof(what), "listen[%zu]", i);
        else
            snprintf(what, sizeof(what), "admin");
        plan->keep[i] = -1;
        for (size_t j = 0; old != NULL && j < plan_count(old) && plan->keep[i] < 0; j++) {
            int taken = 0;
            for (size_t k = 0; k < i; k++)
                taken |= plan->keep[k] == (int)j;
            if (!taken && same_listener(plan_conf(old, j), lc))
                plan->keep[i] = (int)j;
        }
        /* TLS: the files are read again even for a kept listener, so a renewed certificate
         * takes effect at a reload; connections already open keep theirs. */
        if (lc->tls) {
            plan->ctx[i] = pcr_tls_ctx_new(lc->cert, lc->key, err, sizeof(err));
            if (plan->ctx[i] == NULL) {
                pcr_log_error("%s.tls: cannot load certificate %s and key %s: %s", what,
                              lc->cert, lc->key, err);
                pcr_listen_plan_free(plan);
                return NULL;
            }
        }
        if (plan->keep[i] >= 0)
            continue;
        /* One socket per worker on the same address (SO_REUSEPORT: the kernel spreads the
         * connections). The first one binds what the config says, port 0 included; the others
         * bind the port it got. */
        struct sockaddr_storage ss = lc->addr;
        socklen_t sl = lc->addrlen;
        for (unsigned k = 0; k < nw; k++) {
            int fd = listen_socket((const struct sockaddr *)&ss, sl, nw > 1, err, sizeof(err));
            if (fd < 0) {
                pcr_log_error("%s: cannot listen on %s: %s", what, lc->address, err);
                pcr_listen_plan_free(plan);
                return NULL;
            }
            plan->fds[i * nw + k] = fd;
            if (k == 0) {
                sl = sizeof(ss);
                getsockname(fd, (struct sockaddr *)&ss, &sl);
            }
        }
        log_listening(lc, &ss, nw, i >= cfg->nlisten);
    }
    return plan;
}

static void listener_close(struct pcr_listener *lst)
{
    if (lst->ev)
        event_free(lst->ev);
    if (lst->backoff)
        event_free(lst->backoff);
    lst->ev = lst->backoff = NULL;
    if (lst->fd >= 0)
        close(lst->fd);
    lst->fd = -1;
}

int pcr_listeners_adopt(pcr_worker_t *w, pcr_listen_plan_t *plan, const pcr_config_t *cfg)
{
    struct pcr_listener *nl = calloc(plan->n ? plan->n : 1, sizeof(*nl));
    if (nl == NULL)
        return PCR_ERR_NOMEM;
    spare_take(w);
    char *kept = calloc(w->nlisteners + 1, 1);
    if (kept == NULL) {
        free(nl);
        return PCR_ERR_NOMEM;
    }
    int rc = 0;
    for (size_t i = 0; i < plan->n; i++) {
        struct pcr_listener *lst = &nl[i];
        int k = plan->keep[i];
        if (k >= 0 && (size_t)k < w->nlisteners) {
            /* The same socket and events (re-pointed below), a new config and TLS context. */
            struct pcr_listener *old = &w->listeners[k];
            if (old->ev)
                event_del(old->ev);
            if (old->backoff)
                event_del(old->backoff);
            old->backoff_ms = 0;
            *lst = *old;
            kept[k] = 1;
        } else {
            lst->w = w;
            /* The descriptor is the worker's from here on. */
            lst->fd = plan->fds[i * plan->nworkers + w->id];
            plan->fds[i * plan->nworkers + w->id] = -1;
        }
        lst->conf = plan_conf(cfg, i);
        lst->admin = i >= cfg->nlisten;
        lst->ssl_ctx = plan->ctx[i];
        if (lst->ev == NULL && lst->fd >= 0) {
            lst->ev = event_new(w->base, lst->fd, EV_READ | EV_PERSIST, on_acceptable, lst);
            lst->backoff = evtimer_new(w->base, on_backoff, lst);
            if (lst->ev == NULL || lst->backoff == NULL)
                rc = PCR_ERR_NOMEM;
        }
    }
    for (size_t j = 0; j < w->nlisteners; j++)
        if (!kept[j])
            listener_close(&w->listeners[j]);
    free(kept);
    free(w->listeners);
    w->listeners = nl;
    w->nlisteners = plan->n;
    /* The events point at the listener structs, which moved; none is pending now. */
    for (size_t i = 0; i < w->nlisteners; i++) {
        struct pcr_listener *lst = &w->listeners[i];
        if (lst->ev == NULL || lst->backoff == NULL)
            continue;
        event_assign(lst->ev, w->base, lst->fd, EV_READ | EV_PERSIST, on_acceptable, lst);
        event_assign(lst->backoff, w->base, -1, 0, on_backoff, lst);
        if (!w->draining && !(w->accept_paused && !lst->admin))
            event_add(lst->ev, NULL);
    }
    return rc;
}

void pcr_listeners_stop(pcr_worker_t *w)
{
    for (size_t i = 0; i < w->nlisteners; i++)
        listener_close(&w->listeners[i]);
}

void pcr_listeners_free(pcr_worker_t *w)
{
    pcr_listeners_stop(w);
    free(w->listeners);
    w->listeners = NULL;
    w->nlisteners = 0;
    if (w->spare_fd >= 0)
        close(w->spare_fd);
    w->spare_fd = -1;
}
