/* router/net/sock_tls.c: the TLS transport (sock.h), riding on the plain one. A TLS socket owns
 * a plain socket (sock_plain.c) that carries its ciphertext, and an SSL object whose BIO reads
 * and writes that socket's buffers: OpenSSL 3 does every record, the plain socket every system
 * call. So TLS sockets read with one recv per readable socket however many records it brings
 * (or in the worker's io_uring batch), write with one send per flush, are counted when a
 * worker gathers events, and keep the write timeout and the release of idle buffers of plain
 * sockets. Server connections (accepted on a TLS listener) and client ones (to a pod with an
 * https:// url).
 *
 *   owner <-> in, out (plaintext) <-> SSL (record layer) <-> BIO <-> inner's input and output
 *
 * Reading: the inner socket's on_read runs the handshake, then SSL_read until OpenSSL wants
 * more bytes, into the plaintext input, then the owner's on_read once. Writing: a flush hands
 * the plaintext to SSL_write (records of up to 16 KiB) and flushes the inner socket. The inner
 * socket reads while the handshake runs, whatever the owner asked; afterwards as the owner
 * asks. Callbacks the owner gets are called from the inner socket's (from the loop), or from
 * an event of this socket's own (`later`) for what a pcr_sock_* call found: never inside one. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "clock.h"
#include "sock.h"
#include "tls.h"

#define RECORD_MAX 16384           /* the most plaintext one TLS record carries */
#define WRITE_DIRECT_MIN 4096      /* a chain this long is written as it is, not copied first */
#define WHY_LEN 192
#define TIMED_OUT "connect or handshake timed out"

typedef struct {
    pcr_sock_t base;
    pcr_sock_t *inner;          /* the plain socket with the ciphertext; owned */
    SSL *ssl;
    /* Plaintext, NULL while released: an idle socket frees them once both are empty. */
    struct evbuffer *in, *out;
    struct event later;         /* reports what a pcr_sock_* call found, from the loop */
    struct event *deadline;     /* client: the connect and handshake together */
    int *gone;                  /* set by tls_free while an owner's callback runs */
    unsigned handshaking : 1;
    unsigned client : 1;        /* connects to a pod: a failed handshake is a failed connect */
    unsigned failed : 1;        /* a TLS or socket error ended it: no close_notify then */
    unsigned ended : 1;         /* on_end (or a failed on_ready) was called: nothing more */
    unsigned idle : 1;
    unsigned unreported : 1;    /* plaintext decrypted while the owner was not reading */
    unsigned peer_closed : 1;   /* close_notify came while the owner was not reading */
    unsigned write_failed : 1;  /* SSL_write failed inside a flush: reported from the loop */
    char why[];                 /* client: why the connect or the handshake failed */
} tls_t;

/* ---- the BIO: OpenSSL's ciphertext is the inner socket's input and output --------------- */

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static int bio_read(BIO *b, char *buf, size_t len, size_t *got)
{
    tls_t *t = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    struct evbuffer *in = pcr_sock_input(t->inner);
    int n = in != NULL ? evbuffer_remove(in, buf, len) : -1;
    if (n <= 0) {
        BIO_set_retry_read(b); /* nothing yet: OpenSSL says SSL_ERROR_WANT_READ */
        return 0;
    }
    *got = (size_t)n;
    return 1;
}

static int bio_write(BIO *b, const char *buf, size_t len, size_t *put)
{
    tls_t *t = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    struct evbuffer *out = pcr_sock_output(t->inner);
    if (out == NULL || evbuffer_add(out, buf, len) != 0)
        return 0; /* out of memory: the SSL call fails */
    *put = len;
    return 1;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    tls_t *t = BIO_get_data(b);
    switch (cmd) {
    case BIO_CTRL_FLUSH: /* the inner socket is flushed after each SSL call */
    case BIO_CTRL_DUP:
        return 1;
    case BIO_CTRL_PENDING: {
        struct evbuffer *in = t != NULL ? pcr_sock_input(t->inner) : NULL;
        return in != NULL ? (long)evbuffer_get_length(in) : 0;
    }
    case BIO_CTRL_WPENDING: /* everything written is in the inner socket's output already */
    default:
        return 0;
    }
}

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static void bio_method_make(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "pcr_sock");
    if (m != NULL && (BIO_meth_set_read_ex(m, bio_read) != 1 ||
                      BIO_meth_set_write_ex(m, bio_write) != 1 ||
                      BIO_meth_set_ctrl(m, bio_ctrl) != 1 || BIO_meth_set_create(m, bio_create) != 1)) {
        BIO_meth_free(m);
        m = NULL;
    }
    bio_method = m;
}

/* ---- the plaintext buffers -------------------------------------------------------------- */

static size_t out_len(const tls_t *t) { return t->out != NULL ? evbuffer_get_length(t->out) : 0; }

static int bufs_make(tls_t *t) { return pcr_sock_bufs_make(&t->in, &t->out); }

/* An idle socket gives its plaintext buffers back once both are empty (its inner socket does
 * the same with the ciphertext's). */
static void bufs_release(tls_t *t)
{
    if (!t->idle || t->unreported || t->in == NULL || t->out == NULL ||
        evbuffer_get_length(t->in) > 0 || evbuffer_get_length(t->out) > 0)
        return;
    pcr_sock_bufs_free(&t->in, &t->out);
}

/* ---- reporting to the owner ------------------------------------------------------------- */

/* Each returns -1 when the owner freed the socket in its callback (nothing may touch it then). */
static void guard_enter(tls_t *t, int *gone, int **prev)
{
    *gone = 0;
    *prev = t->gone;
    t->gone = gone;
}

static int guard_leave(tls_t *t, int *gone, int *prev)
{
    if (*gone) {
        if (prev != NULL)
            *prev = 1;
        return -1;
    }
    t->gone = prev;
    return 0;
}

static int report_read(tls_t *t)
{
    int gone, *prev;
    guard_enter(t, &gone, &prev);
    t->unreported = 0;
    t->base.cbs->on_read(&t->base, t->base.arg);
    return guard_leave(t, &gone, prev);
}

static int report_ready(tls_t *t, int err)
{
    int gone, *prev;
    guard_enter(t, &gone, &prev);
    t->base.cbs->on_ready(&t->base, err, t->base.arg);
    return guard_leave(t, &gone, prev);
}

static void deadline_stop(tls_t *t)
{
    if (t->deadline != NULL) {
        event_free(t->deadline);
        t->deadline = NULL;
    }
}

/* Nothing more is reported, read or timed: the socket has ended. */
static void stop(tls_t *t)
{
    t->ended = 1;
    deadline_stop(t);
    event_del(&t->later);
    pcr_sock_read_stop(t->inner);
}

/* The end, once: the owner frees the socket. */
static void end(tls_t *t, pcr_sock_end_t why)
{
    if (t->ended)
        return;
    if (why != PCR_SOCK_EOF)
        t->failed = 1;
    stop(t);
    t->base.cbs->on_end(&t->base, why, t->base.arg);
}

/* A client's connect or handshake failed: the owner hears a failed connect (err), and
 * pcr_sock_failure() says why. */
static void connect_failed(tls_t *t, int err)
{
    if (t->ended)
        return;
    t->failed = 1;
    t->handshaking = 0;
    stop(t);
    ERR_clear_error();
    t->base.cbs->on_ready(&t->base, err, t->base.arg);
}

/* The reason of a TLS failure, kept for pcr_sock_failure() (clients only). */
static void keep_failure(tls_t *t, unsigned long ossl)
{
    if (t->client)
        pcr_tls_failure(t->ssl, ossl, t->why, WHY_LEN);
}

/* What OpenSSL wrote (handshake flights, alerts, tickets, key update answers) goes out. */
static void inner_flush(tls_t *t)
{
    if (pcr_sock_pending(t->inner) > 0)
        pcr_sock_flush(t->inner);
}

/* ---- writing ---------------------------------------------------------------------------- */

/* The plaintext output through SSL_write into the inner socket's output: a chain of
 * WRITE_DIRECT_MIN bytes or more as it is, shorter ones gathered into one record first (an
 * HTTP/1.1 head and its body in one record rather than two). 0, or -1 when SSL_write failed
 * (out of memory: the BIO takes everything else). */
static int encrypt_out(tls_t *t)
{
    size_t len;
    while ((len = out_len(t)) > 0) {
        struct evbuffer_iovec v;
        size_t n = len < RECORD_MAX ? len : RECORD_MAX;
        unsigned char *p = NULL;
        if (evbuffer_peek(t->out, -1, NULL, &v, 1) >= 1 &&
            (v.iov_len >= n || v.iov_len >= WRITE_DIRECT_MIN)) {
            n = v.iov_len < n ? v.iov_len : n;
            p = v.iov_base;
        } else {
            p = evbuffer_pullup(t->out, (ev_ssize_t)n);
        }
        ERR_clear_error();
        size_t put = 0;
        if (p == NULL || SSL_write_ex(t->ssl, p, n, &put) != 1) {
            ERR_clear_error();
            return -1;
        }
        evbuffer_drain(t->out, put);
    }
    return 0;
}

/* The handshake is over: what the owner wrote meanwhile goes, and a drain it asked for is
 * now the inner socket's to report. */
static void after_handshake_output(tls_t *t)
{
    if (out_len(t) > 0 && encrypt_out(t) != 0) {
        t->write_failed = 1;
        event_active(&t->later, 0, 0);
    }
    inner_flush(t);
    if (t->base.drain_wanted)
        pcr_sock_want_drain(t->inner, t->base.drain_low);
}

/* ---- reading ---------------------------------------------------------------------------- */

/* One step of the handshake with the bytes there are. 0: over, and the owner still has the
 * socket; 1: it waits for more; -1: it failed, or the owner freed the socket. */
static int handshake_step(tls_t *t)
{
    ERR_clear_error();
    int rc = SSL_do_handshake(t->ssl);
    int e = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(t->ssl, rc);
    unsigned long ossl = ERR_peek_last_error();
    inner_flush(t); /* the next flight, or the alert that ends it */
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 1;
    if (e != SSL_ERROR_NONE) {
        if (t->client) {
            keep_failure(t, ossl);
            connect_failed(t, EPROTO);
        } else {
            ERR_clear_error();
            end(t, PCR_SOCK_TLS_ERROR);
        }
        return -1;
    }
    t->handshaking = 0;
    deadline_stop(t);
    const unsigned char *alpn = NULL;
    unsigned alen = 0;
    SSL_get0_alpn_selected(t->ssl, &alpn, &alen);
    t->base.alpn_h2 = alen == 2 && alpn[0] == 'h' && alpn[1] == '2';
    if (!t->base.reading)
        pcr_sock_read_stop(t->inner);
    after_handshake_output(t);
    return report_ready(t, 0);
}

/* Every whole record the inner socket holds, decrypted into the plaintext input; then the
 * owner's on_read (when it reads), the end of the stream (close_notify), or a TLS error. */
static void decrypt(tls_t *t)
{
    if (bufs_make(t) != 0) {
        end(t, PCR_SOCK_ERROR);
        return;
    }
    size_t before = evbuffer_get_length(t->in);
    int closed = 0, bad = 0;
    unsigned long ossl = 0;
    for (;;) {
        /* The input's free space, or a new chain about as large as the ciphertext waiting
         * (the plaintext is shorter), up to a record: one record's plaintext at most per call,
         * OpenSSL keeps the rest of a record for the next. */
        struct evbuffer_iovec v[2];
        struct evbuffer *cin = pcr_sock_input(t->inner);
        size_t want = cin != NULL ? evbuffer_get_length(cin) : 0;
        want = want < 512 ? 512 : want > RECORD_MAX ? RECORD_MAX : want;
        if (evbuffer_reserve_space(t->in, (ev_ssize_t)want, v, 2) < 1) {
            bad = -1;
            break;
        }
        size_t got = 0;
        ERR_clear_error();
        int rc = SSL_read_ex(t->ssl, v[0].iov_base, v[0].iov_len, &got);
        if (rc == 1) {
            v[0].iov_len = got;
            evbuffer_commit_space(t->in, v, 1);
            continue;
        }
        evbuffer_commit_space(t->in, v, 0);
        int e = SSL_get_error(t->ssl, rc);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
            break;
        if (e == SSL_ERROR_ZERO_RETURN) {
            closed = 1;
        } else {
            bad = 1;
            ossl = ERR_peek_last_error();
        }
        break;
    }
    inner_flush(t);
    if (bad != 0) {
        if (bad > 0)
            keep_failure(t, ossl);
        ERR_clear_error();
        end(t, bad > 0 ? PCR_SOCK_TLS_ERROR : PCR_SOCK_ERROR);
        return;
    }
    if (evbuffer_get_length(t->in) > before) {
        if (!t->base.reading)
            t->unreported = 1;
        else if (report_read(t) != 0)
            return;
    } else {
        bufs_release(t); /* a ticket or a key update: an idle socket keeps no buffer for it */
    }
    if (closed) {
        /* The peer said it is done: nothing more is read. Reported like a plain socket's end
         * of stream, only while the owner reads. */
        pcr_sock_read_stop(t->inner);
        if (t->base.reading)
            end(t, PCR_SOCK_EOF);
        else
            t->peer_closed = 1;
    }
}

/* ---- the inner socket's callbacks ------------------------------------------------------- */

static void on_inner_read(pcr_sock_t *inner, void *arg)
{
    tls_t *t = arg;
    if (t->ended || t->peer_closed)
        return;
    if (t->handshaking && handshake_step(t) != 0)
        return;
    decrypt(t); /* kept as unreported when the owner does not read */
}

static void on_inner_drain(pcr_sock_t *inner, void *arg)
{
    tls_t *t = arg;
    if (t->ended || !t->base.drain_wanted)
        return;
    if (out_len(t) + pcr_sock_pending(inner) > t->base.drain_low) {
        pcr_sock_want_drain(inner, t->base.drain_low);
        return;
    }
    t->base.drain_wanted = 0;
    t->base.cbs->on_drain(&t->base, t->base.arg);
}

static void on_inner_end(pcr_sock_t *inner, pcr_sock_end_t why, void *arg)
{
    tls_t *t = arg;
    if (t->ended)
        return;
    if (t->client && t->handshaking) {
        if (why == PCR_SOCK_WRITE_TIMEOUT) {
            snprintf(t->why, WHY_LEN, "%s", TIMED_OUT);
            connect_failed(t, ETIMEDOUT);
        } else {
            pcr_tls_failure(NULL, 0, t->why, WHY_LEN); /* the peer closed it or sent no TLS */
            connect_failed(t, ECONNRESET);
        }
        return;
    }
    /* An end of stream without close_notify is allowed (most HTTP clients close so). */
    if (t->handshaking && why == PCR_SOCK_ERROR)
        why = PCR_SOCK_TLS_ERROR;
    end(t, why);
}

/* Clients: the TCP connect is over; the handshake starts. */
static void on_inner_ready(pcr_sock_t *inner, int err, void *arg)
{
    tls_t *t = arg;
    if (t->ended)
        return;
    if (err != 0) {
        if (err == ETIMEDOUT)
            snprintf(t->why, WHY_LEN, "%s", TIMED_OUT);
        else
            snprintf(t->why, WHY_LEN, "%s", strerror(err));
        connect_failed(t, err);
        return;
    }
    (void)handshake_step(t); /* the ClientHello */
}

static const pcr_sock_cbs_t inner_cbs = {on_inner_read, on_inner_drain, on_inner_end, on_inner_ready};

/* What a pcr_sock_* call found, from the loop: a failed write, plaintext or an end of stream
 * kept while the owner did not read. */
static void on_later(evutil_socket_t fd, short what, void *arg)
{
    tls_t *t = arg;
    if (t->ended)
        return;
    if (t->write_failed) {
        end(t, PCR_SOCK_TLS_ERROR);
        return;
    }
    if (!t->base.reading)
        return;
    if (t->unreported && report_read(t) != 0)
        return;
    if (t->peer_closed && t->base.reading)
        end(t, PCR_SOCK_EOF);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    tls_t *t = arg;
    snprintf(t->why, WHY_LEN, "%s", TIMED_OUT);
    connect_failed(t, ETIMEDOUT);
}

/* ---- the transport's operations --------------------------------------------------------- */

static void tls_free(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (t->gone != NULL)
        *t->gone = 1;
    deadline_stop(t);
    event_del(&t->later);
    /* close_notify before the fd goes: a peer that reads to the end, an HTTP/1.0 client for
     * one, otherwise sees a truncated stream, and an OpenSSL client then drops the TLS 1.3
     * session ticket it was given. One non-blocking attempt (the inner socket writes what it
     * holds as it is freed), only on a connection whose handshake finished and that saw no
     * TLS error, unless tls_last_write sent it already. */
    if (!t->handshaking && !t->failed && SSL_is_init_finished(t->ssl) &&
        !(SSL_get_shutdown(t->ssl) & SSL_SENT_SHUTDOWN)) {
        (void)SSL_shutdown(t->ssl);
        inner_flush(t);
    }
    ERR_clear_error();
    SSL_free(t->ssl); /* and its BIO */
    pcr_sock_free(t->inner);
    pcr_sock_bufs_free(&t->in, &t->out);
    free(t);
}

static void tls_read_start(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (t->ended)
        return;
    if (!t->handshaking && !t->peer_closed)
        pcr_sock_read_start(t->inner);
    if (t->unreported || t->peer_closed)
        event_active(&t->later, 0, 0);
}

static void tls_read_stop(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (!t->handshaking)
        pcr_sock_read_stop(t->inner);
}

static struct evbuffer *tls_input(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    (void)bufs_make(t);
    return t->in;
}

static struct evbuffer *tls_output(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    (void)bufs_make(t);
    return t->out;
}

static size_t tls_pending(const pcr_sock_t *s)
{
    const tls_t *t = (const tls_t *)s;
    return out_len(t) + pcr_sock_pending(t->inner);
}

/* Encrypts what the owner wrote; 0 when the inner socket is to write it. */
static int tls_encrypt(tls_t *t)
{
    if (t->handshaking || t->ended || t->write_failed || out_len(t) == 0)
        return -1;
    if (encrypt_out(t) != 0) {
        t->write_failed = 1;
        event_active(&t->later, 0, 0);
        return -1;
    }
    bufs_release(t);
    return 0;
}

static void tls_flush(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (tls_encrypt(t) == 0)
        pcr_sock_flush(t->inner);
}

static void tls_flush_soon(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (tls_encrypt(t) == 0)
        pcr_sock_flush_soon(t->inner);
}

static void tls_want_drain(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (!t->handshaking && !t->ended)
        pcr_sock_want_drain(t->inner, s->drain_low); /* the inner socket reports from the loop */
}

static void tls_set_write_timeout(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    pcr_sock_set_write_timeout(t->inner, s->write_timeout_ms);
}

static void tls_idle(pcr_sock_t *s, int idle)
{
    tls_t *t = (tls_t *)s;
    t->idle = idle != 0;
    bufs_release(t);
    pcr_sock_idle(t->inner, idle);
}

/* close_notify now, behind the records of what the owner wrote (encrypted first), on the
 * connection as tls_free would send it: the inner socket's next write carries both. */
static void tls_last_write(pcr_sock_t *s)
{
    tls_t *t = (tls_t *)s;
    if (t->handshaking || t->failed || t->ended || !SSL_is_init_finished(t->ssl))
        return;
    if (out_len(t) > 0 && tls_encrypt(t) != 0)
        return;
    (void)SSL_shutdown(t->ssl);
    ERR_clear_error();
    pcr_sock_flush_soon(t->inner);
}

static const pcr_sock_ops_t tls_ops = {
    tls_free, tls_read_start, tls_read_stop, tls_input,
    tls_output, tls_pending, tls_flush, tls_flush_soon, tls_want_drain, tls_set_write_timeout, tls_idle,
    tls_last_write,
};

/* A TLS socket over `inner` (taken: freed on failure, as `ssl` is). */
static tls_t *tls_make(struct event_base *base, pcr_sock_t *inner, SSL *ssl, int client)
{
    pthread_once(&bio_once, bio_method_make);
    tls_t *t = inner != NULL ? calloc(1, sizeof(*t) + (client ? WHY_LEN : 1)) : NULL;
    BIO *bio = t != NULL && bio_method != NULL ? BIO_new(bio_method) : NULL;
    if (bio == NULL || bufs_make(t) != 0) {
        if (t != NULL)
            pcr_sock_bufs_free(&t->in, &t->out);
        BIO_free(bio);
        free(t);
        SSL_free(ssl);
        pcr_sock_free(inner);
        return NULL;
    }
    BIO_set_data(bio, t);
    SSL_set_bio(ssl, bio, bio); /* the SSL owns the BIO from here on */
    t->base.ops = &tls_ops;
    t->base.fd = inner->fd;
    t->base.tls = 1;
    t->inner = inner;
    t->ssl = ssl;
    t->client = client != 0;
    t->handshaking = 1;
    event_assign(&t->later, base, -1, 0, on_later, t);
    pcr_sock_set_cbs(inner, &inner_cbs, t);
    pcr_sock_read_start(inner); /* the handshake reads whatever the owner asks */
    return t;
}

pcr_sock_t *pcr_sock_tls_new(struct event_base *base, int fd, SSL *ssl)
{
    tls_t *t = tls_make(base, pcr_sock_plain_new(base, fd), ssl, 0);
    if (t == NULL)
        return NULL; /* the inner socket, when made, closed the fd */
    SSL_set_accept_state(ssl);
    return &t->base;
}

pcr_sock_t *pcr_sock_tls_connect(struct event_base *base, const struct sockaddr *sa, socklen_t len,
                                 unsigned timeout_ms, SSL *ssl)
{
    pcr_sock_t *inner = pcr_sock_connect(base, sa, len, timeout_ms);
    if (inner == NULL) {
        int err = errno;
        SSL_free(ssl);
        errno = err;
        return NULL;
    }
    tls_t *t = tls_make(base, inner, ssl, 1);
    if (t == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    SSL_set_connect_state(ssl);
    /* One deadline for the TCP connect and the handshake together. */
    if (timeout_ms > 0) {
        t->deadline = evtimer_new(base, on_deadline, t);
        struct timeval tv = pcr_ms_to_tv(timeout_ms);
        if (t->deadline == NULL || evtimer_add(t->deadline, &tv) != 0) {
            tls_free(&t->base);
            errno = ENOMEM;
            return NULL;
        }
    }
    return &t->base;
}

const char *pcr_sock_failure(const pcr_sock_t *s)
{
    return s->tls && ((const tls_t *)s)->client ? ((const tls_t *)s)->why : "";
}
