/* router/net/sock.h: the transport layer. Every socket pcrouter reads or writes (client
 * connections, plain or TLS, and connections to pods) is one pcr_sock_t, and the protocol code
 * above it (h1_server.c, h2_server.c, upstream.c, conn.c) sees only this interface: nothing
 * outside sock_*.c touches a socket, a bufferevent or an SSL object.
 *
 *   input buffer  <- the transport reads when reading is on, then calls on_read
 *   output buffer -> the owner appends, then pcr_sock_flush(): the bytes go out at once (with
 *                    batched I/O, at the end of the loop turn) when the kernel takes them,
 *                    the rest when the socket is writable again
 *   on_drain      <- once the output has fallen to the mark the owner asked for
 *   on_end        <- end of stream, an error, or a write that made no progress for too long
 *
 * Two implementations, in the spirit of h2o's socket layer: sock_plain.c (our own read and
 * write events on a non-blocking fd: one recv(msg) per read and one send(msg) per flush, no
 * FIONREAD, no epoll_ctl per request; or a loop turn's reads and writes in two io_uring
 * submits, below) and sock_tls.c (for TLS listeners and pods with https:// urls: a plain
 * socket carries the ciphertext, so TLS gets all of the above, and OpenSSL does the records
 * through a BIO that reads and writes that socket's buffers).
 *
 * Callbacks never run inside a pcr_sock_* call: a failure found while flushing is reported
 * from the event loop. After pcr_sock_free() no callback runs. */
#ifndef PCR_ROUTER_SOCK_H
#define PCR_ROUTER_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <openssl/ssl.h>

struct event_base;
struct evbuffer;
typedef struct pcr_sock pcr_sock_t;

/* The most a plain socket's read brings (sock_plain.c), TLS records included. */
#define PCR_SOCK_READ_SIZE 16384

typedef enum {
    PCR_SOCK_EOF = 1,           /* the peer closed its side */
    PCR_SOCK_ERROR,             /* a read or write failed (reset, broken pipe, ...) */
    PCR_SOCK_WRITE_TIMEOUT,     /* output waited pcr_sock_set_write_timeout() ms without progress */
    PCR_SOCK_TLS_ERROR,         /* handshake or record layer failure */
} pcr_sock_end_t;

typedef struct {
    /* New bytes are in pcr_sock_input(); the owner drains what it consumed. */
    void (*on_read)(pcr_sock_t *s, void *arg);
    /* The output fell to the mark given to pcr_sock_want_drain(); asked once, called once. */
    void (*on_drain)(pcr_sock_t *s, void *arg);
    /* The connection is over (see pcr_sock_end_t); the owner frees the socket. */
    void (*on_end)(pcr_sock_t *s, pcr_sock_end_t why, void *arg);
    /* Outgoing connections: connected (err 0) or not (an errno value). TLS server sockets:
     * the handshake finished (err 0; the ALPN result is known). */
    void (*on_ready)(pcr_sock_t *s, int err, void *arg);
} pcr_sock_cbs_t;

/* An accepted, non-blocking socket; the fd is owned from here on. NULL when out of memory
 * (the fd is closed then). */
pcr_sock_t *pcr_sock_plain_new(struct event_base *base, int fd);
/* A TLS server connection on an accepted fd; `ssl` is taken. on_ready fires after the
 * handshake. NULL when out of memory (fd closed and ssl freed then). */
pcr_sock_t *pcr_sock_tls_new(struct event_base *base, int fd, SSL *ssl);
/* Starts a non-blocking connect to `sa`; on_ready reports the result, within `timeout_ms`.
 * NULL when no socket could be made (errno set). */
pcr_sock_t *pcr_sock_connect(struct event_base *base, const struct sockaddr *sa, socklen_t len,
                             unsigned timeout_ms);

/* The same, then a TLS handshake with `ssl` (taken; pcr_tls_client_ssl_new()); on_ready
 * reports both together within `timeout_ms`: err 0 once the handshake is over, EPROTO when it
 * failed (pcr_sock_failure() says why: a certificate that does not verify, ...). */
pcr_sock_t *pcr_sock_tls_connect(struct event_base *base, const struct sockaddr *sa, socklen_t len,
                                 unsigned timeout_ms, SSL *ssl);
/* Why a TLS connect failed, in words ("" for other sockets or before a failure). */
const char *pcr_sock_failure(const pcr_sock_t *s);

void pcr_sock_set_cbs(pcr_sock_t *s, const pcr_sock_cbs_t *cbs, void *arg);
/* Batched I/O on this thread (io_uring; the worker loops only). While it is on, a plain socket's
 * reads (when epoll says it is readable) and writes (pcr_sock_flush) wait for the end of the
 * loop turn, pcr_sock_batch_flush(): all the reads in one system call, on_read for each, then
 * all the writes in another. Callbacks run from pcr_sock_batch_flush() then, never inside a
 * pcr_sock_* call. begin: 0, or -errno when the kernel refuses a ring (sockets then make their
 * own calls); `submits` and `ops` (may be NULL) count the system calls and the reads and
 * writes in them, `merged` (may be NULL) the submits of pcr_sock_batch_turn() that carried
 * writes and reads, and `active` (may be NULL) is 1 while the thread batches, 0 once a failed
 * submit made it give up (relaxed atomic stores, this thread only). end: flushes, then frees. */
int pcr_sock_batch_begin(uint64_t *submits, uint64_t *ops, uint64_t *merged, int *active);
/* How many times a socket of this thread (plain, or a TLS socket's plain one) was found
 * readable since the last call (with or without batching): how many events a loop turn
 * brought. */
unsigned pcr_sock_readable_take(void);
void pcr_sock_batch_flush(void);
void pcr_sock_batch_end(void);
/* A busy loop's turn in one system call instead of two. pcr_sock_batch_turn() in place of
 * flush(): the writes left waiting go in one submit with this turn's reads, and when the turn
 * had several reads, what their callbacks write waits for the next turn (with one read, or
 * none, everything goes at once, as flush()). While pcr_sock_batch_waiting() says writes wait,
 * the loop must not sleep: it only looks for events (EVLOOP_ONCE | EVLOOP_NONBLOCK). */
int pcr_sock_batch_waiting(void);
void pcr_sock_batch_turn(void);

void pcr_sock_free(pcr_sock_t *s);  /* closes; NULL is a no-op */

void pcr_sock_read_start(pcr_sock_t *s);
void pcr_sock_read_stop(pcr_sock_t *s);
int pcr_sock_reading(const pcr_sock_t *s);

struct evbuffer *pcr_sock_input(pcr_sock_t *s);
struct evbuffer *pcr_sock_output(pcr_sock_t *s);

/* Writes what the kernel takes now; the rest goes out when the socket is writable. */
void pcr_sock_flush(pcr_sock_t *s);
/* The same, from the event loop once the events ready now have run: a turn's reads are all
 * handled before its writes wake the peers, so a peer woken by one write finds the others'
 * bytes too instead of preempting this thread once per write. For callers that do not look at
 * pcr_sock_pending() right after. */
void pcr_sock_flush_soon(pcr_sock_t *s);
/* Output bytes not yet handed to the kernel. */
size_t pcr_sock_pending(const pcr_sock_t *s);
/* The owner waits for its peer's next request (1) or no longer (0). While idle, a plain
 * socket frees both its buffers once they are empty, and makes them again when bytes arrive,
 * before on_read; an idle keep-alive connection then holds none. The owner touches the
 * buffers of an idle socket only from on_read: anywhere else they may have to be made again,
 * and pcr_sock_input() and pcr_sock_output() return NULL if memory runs out then. A TLS
 * socket does the same with its plaintext buffers and its plain socket's. */
void pcr_sock_idle(pcr_sock_t *s, int idle);
/* Calls on_drain (from the event loop) once pending() <= low. */
void pcr_sock_want_drain(pcr_sock_t *s, size_t low);
/* While output is pending, a writer that makes no progress for `ms` ends the connection with
 * PCR_SOCK_WRITE_TIMEOUT (0: no limit). */
void pcr_sock_set_write_timeout(pcr_sock_t *s, unsigned ms);

/* Half-closes the connection once everything written is with the kernel (call it when
 * pending() is 0): the peer sees the end of the stream while this side can still read what it
 * keeps sending, so closing later does not reset the connection under a response the peer has
 * not read yet (a lingering close). TLS sends no close_notify. */
void pcr_sock_shutdown_write(pcr_sock_t *s);

/* Nothing more will be written, and the socket is freed once pending() is 0 (a close that does
 * not linger). TLS queues its close_notify behind what is pending: one send carries both,
 * instead of a second one at the free. Nothing for a plain socket. */
void pcr_sock_last_write(pcr_sock_t *s);

int pcr_sock_is_tls(const pcr_sock_t *s);
/* TLS: 1 when ALPN selected "h2". */
int pcr_sock_alpn_h2(const pcr_sock_t *s);
/* The peer's address as text ("127.0.0.1:5555"), "-" when unknown. */
const char *pcr_sock_peer(pcr_sock_t *s);
/* The peer's address as accept(2) gave it: pcr_sock_peer() then needs no getpeername(2). */
void pcr_sock_set_peer(pcr_sock_t *s, const struct sockaddr *sa, socklen_t len);
/* Accepted on the admin listener (conn.c marks it): it is answered /metrics and /health only. */
void pcr_sock_set_admin(pcr_sock_t *s);
int pcr_sock_admin(const pcr_sock_t *s);

/* An event base tuned for the transports: epoll with a changelist. */
struct event_base *pcr_sock_base_new(void);

/* ---- for the implementations only ---------------------------------------------------- */

/* A socket's two buffers, which an idle socket releases (pcr_sock_idle): make whichever is
 * missing (0, or -1 when memory ran out), and free both (either may be NULL). */
int pcr_sock_bufs_make(struct evbuffer **in, struct evbuffer **out);
void pcr_sock_bufs_free(struct evbuffer **in, struct evbuffer **out);

typedef struct {
    void (*free)(pcr_sock_t *s);
    void (*read_start)(pcr_sock_t *s);
    void (*read_stop)(pcr_sock_t *s);
    struct evbuffer *(*input)(pcr_sock_t *s);
    struct evbuffer *(*output)(pcr_sock_t *s);
    size_t (*pending)(const pcr_sock_t *s);
    void (*flush)(pcr_sock_t *s);
    void (*flush_soon)(pcr_sock_t *s);
    void (*want_drain)(pcr_sock_t *s);
    void (*set_write_timeout)(pcr_sock_t *s);
    void (*idle)(pcr_sock_t *s, int idle);
    void (*last_write)(pcr_sock_t *s);
} pcr_sock_ops_t;

struct pcr_sock {
    const pcr_sock_ops_t *ops;
    const pcr_sock_cbs_t *cbs;
    void *arg;
    int fd;
    int reading;
    int tls;
    int alpn_h2;
    size_t drain_low;
    int drain_wanted;
    unsigned write_timeout_ms;
    int admin;                  /* accepted on the admin listener */
    char peer[64];              /* filled at accept, or on first use */
};

#endif
