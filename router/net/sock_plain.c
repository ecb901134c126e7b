/* router/net/sock_plain.c: the plain TCP transport (sock.h): a non-blocking fd with its own read
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
 * On a worker with batched I/O (pcr_sock_batch_begin, sock.h), a readable event and a flush only
 * queue the socket; the reads, then the writes, of the whole loop turn go to the kernel in one
 * io_uring submit each at its end (pcr_sock_batch_flush), as MSG_DONTWAIT calls that complete
 * inside the submit. The results are handled exactly as the direct calls' are (read_commit,
 * read_report, write_done). A busy loop merges the two (pcr_sock_batch_turn): the writes of a
 * turn that read several sockets wait, the loop looks for events without sleeping, and they go
 * in one submit with the next turn's reads. Under load that is one submit and one epoll_wait
 * per turn, where the turn answers several requests. A phase with one operation alone makes
 * it with a plain call (read_one, write_one).
 *
 * recvmsg and sendmsg, not readv and writev: the socket calls skip the VFS layer (file position
 * lock, iterator setup), a measurable part of the kernel's time per request; MSG_NOSIGNAL
 * replaces ignoring SIGPIPE. With a single buffer, recv and send, direct or batched: they skip
 * copying in the message header and its iovec array too.
 *
 * Over 700 lines, kept whole: the batched path and the plain one share every socket's queues
 * and flags, and a split would put one operation's two paths in two files. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <sys/queue.h>
#include <stddef.h>
#include <liburing.h>

#include "clock.h"
#include "log.h"
#include "sock.h"

#define WRITE_IOV 64               /* chains per sendmsg; the rest goes with the next */

typedef struct plain_s {
    pcr_sock_t base;
    struct event rev, wev;     /* embedded: an idle connection makes no allocation for them */
    struct event *soon;        /* pcr_sock_flush_soon() without batching: made on first use */
    /* NULL while released: an idle socket (pcr_sock_idle) holds neither once both are empty;
     * a read makes both again before it reports (bufs_make). */
    struct evbuffer *in, *out;
    int idle;                  /* the owner waits for a request: buffers may go */
    int wev_added;
    int connecting;            /* connect in progress: the write event waits for it */
    int connect_err;           /* a connect that failed at once, reported from the loop */
    int write_err;             /* a write that failed inside flush(), reported from the loop */
    int ended;                 /* on_end was called: nothing more is reported */
    int batched;               /* on this thread's batch, to be written at the end of the turn */
    TAILQ_ENTRY(plain_s) batch_link;
    int rbatched;              /* 1: to be read at the end of the turn; 2: read, to be reported */
    int unreported;            /* bytes in `in` read while reading was stopped (batched only) */
    TAILQ_ENTRY(plain_s) rlink;
    unsigned slot;             /* its slot in the batch while its read is made */
    int rnv;                   /* the vectors reserved for that read (< 1: none) */
    int rres, wres;            /* the batched read's and write's results */
} plain_t;

/* Output bytes waiting; none while the buffer is released. */
static size_t out_len(const plain_t *p) { return p->out != NULL ? evbuffer_get_length(p->out) : 0; }

/* Both buffers, made again after a release: 0, or -1 when memory ran out. */
static int bufs_make(plain_t *p) { return pcr_sock_bufs_make(&p->in, &p->out); }

/* An idle socket gives its buffers back once both are empty and no read or write of a batch
 * counts on them: about 0.3 KB of every idle keep-alive connection. */
static void bufs_release(plain_t *p)
{
    if (!p->idle || p->batched || p->rbatched || p->unreported || p->connecting ||
        p->in == NULL || p->out == NULL || evbuffer_get_length(p->in) > 0 || out_len(p) > 0)
        return;
    pcr_sock_bufs_free(&p->in, &p->out);
}

#define BATCH_RING 256
typedef struct {
    struct io_uring ring;
    int broken;                /* a submit failed: the thread goes back to direct calls */
    TAILQ_HEAD(, plain_s) queue;         /* to be written */
    TAILQ_HEAD(, plain_s) rqueue, rdone; /* to be read; read, to be reported */
    /* One per operation of a submit: its message header and vectors, which the kernel reads
     * during the submit only (a socket does not carry them: nothing is in flight after it). */
    struct {
        struct msghdr mh;
        struct evbuffer_iovec v[WRITE_IOV];
    } slot[BATCH_RING];
    uint64_t *submits, *ops;   /* the worker's counters (pcr_metrics_t), or NULL */
    uint64_t *merged;          /* its submits that carried a turn's writes with the next reads */
    int deferred;              /* the last turn left its writes for this one's reads */
    int *active;               /* the worker's "batching" flag, cleared on giving up, or NULL */
} batch_t;
static __thread batch_t *tls_batch;
static __thread unsigned tls_readable; /* readable events since pcr_sock_readable_take() */

static void arm_write(plain_t *p, int restart)
{
    if (p->wev_added && !restart)
        return;
    struct timeval tv, *tvp = NULL;
    unsigned ms = p->base.write_timeout_ms;
    if (ms > 0) {
        tv = pcr_ms_to_tv(ms);
        tvp = &tv;
    }
    event_add(&p->wev, tvp);
    p->wev_added = 1;
}

static void disarm_write(plain_t *p)
{
    if (p->wev_added) {
        event_del(&p->wev);
        p->wev_added = 0;
    }
}

static void end(plain_t *p, pcr_sock_end_t why)
{
    if (p->ended)
        return;
    p->ended = 1;
    event_del(&p->rev);
    disarm_write(p);
    p->base.cbs->on_end(&p->base, why, p->base.arg);
}

/* A read's bytes, `n` of the `nv` reserved vectors, into the input (nothing when n <= 0). */
static void read_commit(plain_t *p, struct evbuffer_iovec *v, int nv, ssize_t n)
{
    size_t left = n > 0 ? (size_t)n : 0;
    int used = 0;
    for (int i = 0; i < nv && left > 0; i++, used++) {
        if (v[i].iov_len > left)
            v[i].iov_len = left;
        left -= v[i].iov_len;
    }
    evbuffer_commit_space(p->in, v, used);
}

/* What a read's result `n` (errno in `err` when n < 0) tells the owner. Batched, another
 * socket's callback may have stopped this one's reading after the read was made: its bytes
 * stay unreported until reading is on again (plain_read_start); an end of stream or an error
 * then is read again, as TCP repeats them. */
static void read_report(plain_t *p, ssize_t n, int err)
{
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR)) {
        if (p->unreported && p->base.reading) {
            p->unreported = 0;
            p->base.cbs->on_read(&p->base, p->base.arg);
        }
        return;
    }
    if (n <= 0) {
        if (p->base.reading)
            end(p, n == 0 ? PCR_SOCK_EOF : PCR_SOCK_ERROR);
        return;
    }
    if (!p->base.reading) {
        p->unreported = 1;
        return;
    }
    p->unreported = 0;
    p->base.cbs->on_read(&p->base, p->base.arg);
}

/* One read with a call of its own, into the input's free space; its report. */
static void read_now(plain_t *p)
{
    evutil_socket_t fd = p->base.fd;
    struct evbuffer_iovec v[2];
    int nv = bufs_make(p) == 0 ? evbuffer_reserve_space(p->in, PCR_SOCK_READ_SIZE, v, 2) : -1;
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
    int err = n < 0 ? errno : 0;
    read_commit(p, v, nv, n);
    read_report(p, n, err);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    plain_t *p = arg;
    batch_t *b = tls_batch;
    tls_readable++;
    if (b != NULL) {
        if (!p->rbatched) {
            TAILQ_INSERT_TAIL(&b->rqueue, p, rlink);
            p->rbatched = 1;
        }
        return;
    }
    read_now(p);
}

/* What a send's result `n` (errno in `err` when n < 0) leaves to do. */
static void write_done(plain_t *p, ssize_t n, int err)
{
    if (n > 0)
        evbuffer_drain(p->out, (size_t)n);
    if (n < 0 && err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
        p->write_err = err ? err : EIO;
        event_active(&p->wev, EV_WRITE, 0); /* reported from the loop */
        return;
    }
    if (out_len(p) > 0) {
        arm_write(p, n > 0); /* the timeout restarts only when bytes left */
    } else {
        disarm_write(p);
        bufs_release(p);
    }
}

/* The output's first WRITE_IOV chains, as vectors for one send; how many. */
static int out_vecs(plain_t *p, struct evbuffer_iovec v[WRITE_IOV])
{
    int nv = evbuffer_peek(p->out, -1, NULL, v, WRITE_IOV);
    return nv > WRITE_IOV ? WRITE_IOV : nv;
}

static void write_now(plain_t *p)
{
    if (out_len(p) == 0) {
        disarm_write(p);
        return;
    }
    struct evbuffer_iovec v[WRITE_IOV];
    int nv = out_vecs(p, v);
    ssize_t n;
    if (nv == 1) {
        n = send(p->base.fd, v[0].iov_base, v[0].iov_len, MSG_DONTWAIT | MSG_NOSIGNAL);
    } else {
        struct msghdr mh = {.msg_iov = (struct iovec *)v, .msg_iovlen = (size_t)nv};
        n = sendmsg(p->base.fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    write_done(p, n, n < 0 ? errno : 0);
}

static void write_some(plain_t *p)
{
    batch_t *b = tls_batch;
    if (b != NULL && out_len(p) > 0) {
        if (!p->batched) {
            TAILQ_INSERT_TAIL(&b->queue, p, batch_link);
            p->batched = 1;
        }
        return;
    }
    write_now(p);
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
            event_add(&p->rev, NULL);
        p->base.cbs->on_ready(&p->base, err, p->base.arg);
        return;
    }
    if (p->write_err) {
        end(p, PCR_SOCK_ERROR);
        return;
    }
    if ((what & EV_TIMEOUT) && out_len(p) > 0) {
        end(p, PCR_SOCK_WRITE_TIMEOUT);
        return;
    }
    if (what & EV_WRITE)
        write_some(p);
    if (p->write_err) {
        end(p, PCR_SOCK_ERROR);
        return;
    }
    if (p->base.drain_wanted && out_len(p) <= p->base.drain_low) {
        p->base.drain_wanted = 0;
        p->base.cbs->on_drain(&p->base, p->base.arg);
    }
}

static void plain_free(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (p->rbatched) {
        if (p->rbatched == 1)
            TAILQ_REMOVE(&tls_batch->rqueue, p, rlink);
        else
            TAILQ_REMOVE(&tls_batch->rdone, p, rlink);
        p->rbatched = 0;
    }
    if (p->batched) {
        TAILQ_REMOVE(&tls_batch->queue, p, batch_link);
        p->batched = 0;
        if (!p->ended && !p->write_err && !p->connecting)
            write_now(p); /* what the owner left in the output still goes, as unbatched */
    }
    event_del(&p->rev);
    event_del(&p->wev);
    if (p->soon)
        event_free(p->soon);
    pcr_sock_bufs_free(&p->in, &p->out);
    if (s->fd >= 0)
        close(s->fd);
    free(p);
}

static void plain_read_start(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (!p->connecting && !p->ended) {
        event_add(&p->rev, NULL);
        if (p->unreported)
            event_active(&p->rev, EV_READ, 0); /* bytes read while stopped: reported from the loop */
    }
}

static void plain_read_stop(pcr_sock_t *s) { event_del(&((plain_t *)s)->rev); }

/* The buffers of a released socket are made again here only if its owner touches them between
 * reads while idle, which it does not (pcr_sock_idle); NULL then when memory ran out. */
static struct evbuffer *plain_input(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    (void)bufs_make(p);
    return p->in;
}

static struct evbuffer *plain_output(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    (void)bufs_make(p);
    return p->out;
}

static size_t plain_pending(const pcr_sock_t *s) { return out_len((const plain_t *)s); }

static void plain_idle(pcr_sock_t *s, int idle)
{
    plain_t *p = (plain_t *)s;
    p->idle = idle;
    bufs_release(p);
}

static void plain_flush(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (!p->connecting && !p->write_err && !p->ended)
        write_some(p);
}

/* A write from the loop, after the events that are ready now: an event of its own, made
 * active. Not the write event: libevent re-adds an active persistent event that has a
 * timeout, which would leave it polling a socket that is always writable. Batched, the
 * socket goes on the turn's write queue instead, which is written after every event of the
 * turn: the same order, without the extra pass of the loop (an epoll_wait that finds nothing
 * new, 0.35 a request over HTTP/1.1 under load) that running the event would take. */
static void on_soon(evutil_socket_t fd, short what, void *arg)
{
    plain_t *p = arg;
    if (!p->connecting)
        on_writable(p->base.fd, EV_WRITE, p);
}

static void plain_flush_soon(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (!p->connecting && !p->write_err && !p->ended && out_len(p) > 0) {
        if (tls_batch == NULL && p->soon == NULL)
            p->soon = event_new(event_get_base(&p->rev), -1, 0, on_soon, p);
        if (tls_batch != NULL || p->soon == NULL)
            write_some(p); /* batched; or out of memory for the event: written now */
        else
            event_active(p->soon, 0, 0);
    }
}

static void plain_want_drain(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (!p->connecting && out_len(p) <= s->drain_low)
        event_active(&p->wev, 0, 0); /* already there: say so from the loop */
}

static void plain_set_write_timeout(pcr_sock_t *s)
{
    plain_t *p = (plain_t *)s;
    if (p->wev_added && !p->connecting)
        arm_write(p, 1);
}

static void plain_last_write(pcr_sock_t *s) {}

static const pcr_sock_ops_t plain_ops = {
    plain_free,  plain_read_start, plain_read_stop,  plain_input,
    plain_output, plain_pending,   plain_flush,      plain_flush_soon,
    plain_want_drain, plain_set_write_timeout, plain_idle, plain_last_write,
};

static plain_t *plain_make(struct event_base *base, int fd)
{
    plain_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->base.ops = &plain_ops;
    p->base.fd = fd;
    event_assign(&p->rev, base, fd, EV_READ | EV_PERSIST, on_readable, p);
    event_assign(&p->wev, base, fd, EV_WRITE | EV_PERSIST, on_writable, p);
    if (bufs_make(p) != 0) {
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
        event_active(&p->wev, EV_WRITE, 0);
        return &p->base;
    }
    struct timeval tv = pcr_ms_to_tv(timeout_ms);
    event_add(&p->wev, &tv);
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
     * dup()s a socket, the one case where the changelist is unsafe.
     *
     * Not in the ThreadSanitizer build. There the deferred EPOLL_CTL_DEL of a closed socket
     * reaches epoll_ctl after close(2), when another worker may have been given the same fd
     * number, and TSan reports the two unordered. The call is harmless (it acts on this
     * loop's own epoll set, where the kernel already dropped that number: ENOENT, which
     * libevent ignores). A suppression by name cannot be relied on: a worker out of
     * descriptors (test_attack_conns.py's EMFILE test) leaves TSan none to symbolize with,
     * and the unnamed report is not matched. Without the changelist the events are deleted
     * before the close and there is nothing to report. */
#if !defined(__SANITIZE_THREAD__)
    event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
#endif
    struct event_base *base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    return base;
}

/* ---- batched I/O: a worker's turn ends with its reads, then its writes, in one system call
 * each ----------------------------------------------------------------------------------- */

/* Reads first: what they bring is answered in the same turn, its writes in the write phase. A
 * callback may queue more writes (never reads: those come from epoll), so a turn ends after a
 * round or two; the bound only guards against a loop. */
#define BATCH_ROUNDS 16

static void count(uint64_t *c, uint64_t v)
{
    if (c != NULL)
        __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

/* The ring failed (it should not: every operation is non-blocking and completes inside the
 * submit). The thread goes back to one system call per operation for good; the ring is torn
 * down, which drops what it had not submitted. */
static void batch_give_up(batch_t *b, int err)
{
    pcr_log_error("io_uring: submitting failed (%s): this worker goes back to a system call "
                  "per read and write", strerror(err));
    io_uring_queue_exit(&b->ring);
    b->broken = 1;
    if (b->active != NULL)
        __atomic_store_n(b->active, 0, __ATOMIC_RELAXED);
}

/* The user data of an operation: its socket, with the low bit set for a write. */
#define OP_WRITE ((uintptr_t)1)
/* The result of an operation the kernel did not take (a short submit, or none): its read comes
 * again from epoll, its write goes with a call of its own. */
#define NOT_RUN INT_MIN

/* Submits `k` prepared operations and waits for them; each result goes to its socket's rres (a
 * read) or wres (a write). -1 when the ring failed: the operations it did not take keep
 * NOT_RUN, and the ring is given up (what it left unsubmitted must never run later). The
 * kernel stops a submit short only when it cannot allocate (IORING_SETUP_SUBMIT_ALL), and then
 * does not wait: the operations it took are done, and their results are reaped here. (Every
 * operation taken has completed inside the submit and the completion queue holds twice the
 * ring's operations, so reaping them does not fail.) */
static int batch_run(batch_t *b, unsigned k)
{
    int rc;
    do
        rc = io_uring_submit_and_wait(&b->ring, k);
    while (rc == -EINTR);
    unsigned took = rc > 0 ? ((unsigned)rc < k ? (unsigned)rc : k) : 0;
    if (took > 0) {
        count(b->submits, 1);
        count(b->ops, took);
    }
    for (unsigned got = 0; got < took; got++) {
        struct io_uring_cqe *cqe;
        int wrc = io_uring_wait_cqe(&b->ring, &cqe);
        if (wrc != 0) {
            batch_give_up(b, -wrc);
            return -1;
        }
        uintptr_t d = (uintptr_t)io_uring_cqe_get_data(cqe);
        plain_t *p = (plain_t *)(d & ~OP_WRITE);
        if (d & OP_WRITE)
            p->wres = cqe->res;
        else
            p->rres = cqe->res;
        io_uring_cqe_seen(&b->ring, cqe);
    }
    if (took < k) {
        batch_give_up(b, rc < 0 ? -rc : ENOMEM);
        return -1;
    }
    return 0;
}

/* Whether a queued socket is still to be read, or written, when its turn's batch is made. */
static int can_read(const plain_t *p) { return !p->ended && p->base.reading && !p->connecting; }
static int can_write(const plain_t *p) { return !p->ended && !p->write_err && !p->connecting; }

/* Prepares queued writes as operations from slot `k` on, while the ring has room; their
 * sockets go to `chunk` from *nw on. Returns the next free slot. */
static unsigned prep_writes(batch_t *b, unsigned k, plain_t *chunk[], unsigned *nw)
{
    plain_t *p;
    while (k < BATCH_RING && (p = TAILQ_FIRST(&b->queue)) != NULL) {
        TAILQ_REMOVE(&b->queue, p, batch_link);
        p->batched = 0;
        if (!can_write(p) || out_len(p) == 0)
            continue;
        struct evbuffer_iovec *v = b->slot[k].v;
        int nv = out_vecs(p, v);
        struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring); /* k < the ring's size */
        if (nv == 1) {
            io_uring_prep_send(sqe, p->base.fd, v[0].iov_base, v[0].iov_len,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
        } else {
            struct msghdr *mh = &b->slot[k].mh;
            memset(mh, 0, sizeof(*mh));
            mh->msg_iov = (struct iovec *)v;
            mh->msg_iovlen = (size_t)nv;
            io_uring_prep_sendmsg(sqe, p->base.fd, mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        }
        io_uring_sqe_set_data(sqe, (void *)((uintptr_t)p | OP_WRITE));
        p->wres = NOT_RUN;
        chunk[(*nw)++] = p;
        k++;
    }
    return k;
}

/* A drain its owner waits for is reported from the loop. */
static void drained(plain_t *q)
{
    if (!q->write_err && q->base.drain_wanted && out_len(q) <= q->base.drain_low)
        event_active(&q->wev, 0, 0);
}

/* The results of the writes in `chunk`; a write the ring did not make goes with a call of its
 * own, as without the ring. No callback runs here: failures and drains are reported from the
 * loop, so no socket of the chunk can be freed under it. */
static void finish_writes(plain_t *chunk[], unsigned nw)
{
    for (unsigned i = 0; i < nw; i++) {
        plain_t *q = chunk[i];
        int res = q->wres;
        if (res == NOT_RUN)
            write_now(q);
        else
            write_done(q, res >= 0 ? res : -1, res >= 0 ? 0 : -res);
        drained(q);
    }
}

/* A turn with one operation to make makes it with a call of its own: a submit of one costs
 * about half a microsecond more than the call (liburing 2.3, the ring registered; this
 * machine), and batches nothing. These take the queue's only socket off it, and make its read
 * or its write as prep_reads and prep_writes would have. */
static int one_read(const batch_t *b)
{
    const plain_t *p = TAILQ_FIRST(&b->rqueue);
    return p != NULL && TAILQ_NEXT(p, rlink) == NULL;
}

static void read_one(batch_t *b)
{
    plain_t *p = TAILQ_FIRST(&b->rqueue);
    TAILQ_REMOVE(&b->rqueue, p, rlink);
    p->rbatched = 0;
    if (can_read(p))
        read_now(p);
}

static int one_write(const batch_t *b)
{
    const plain_t *p = TAILQ_FIRST(&b->queue);
    return p != NULL && TAILQ_NEXT(p, batch_link) == NULL;
}

static void write_one(batch_t *b)
{
    plain_t *p = TAILQ_FIRST(&b->queue);
    TAILQ_REMOVE(&b->queue, p, batch_link);
    p->batched = 0;
    if (can_write(p)) {
        write_now(p);
        drained(p);
    }
}

/* Prepares queued reads as operations from slot `k` on, while the ring has room; their
 * sockets go to `rdone`. Returns the next free slot. */
static unsigned prep_reads(batch_t *b, unsigned k)
{
    plain_t *p;
    while (k < BATCH_RING && (p = TAILQ_FIRST(&b->rqueue)) != NULL) {
        TAILQ_REMOVE(&b->rqueue, p, rlink);
        p->rbatched = 0;
        if (!can_read(p))
            continue;
        p->slot = k;
        struct evbuffer_iovec *v = b->slot[k].v;
        struct msghdr *mh = &b->slot[k].mh;
        p->rnv = bufs_make(p) == 0 ? evbuffer_reserve_space(p->in, PCR_SOCK_READ_SIZE, v, 2) : -1;
        p->rres = NOT_RUN;
        TAILQ_INSERT_TAIL(&b->rdone, p, rlink);
        p->rbatched = 2;
        if (p->rnv < 1)
            continue;
        struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring); /* k < the ring's size */
        if (p->rnv == 1) {
            io_uring_prep_recv(sqe, p->base.fd, v[0].iov_base, v[0].iov_len, MSG_DONTWAIT);
        } else {
            memset(mh, 0, sizeof(*mh));
            mh->msg_iov = (struct iovec *)v;
            mh->msg_iovlen = (size_t)p->rnv;
            io_uring_prep_recvmsg(sqe, p->base.fd, mh, MSG_DONTWAIT);
        }
        io_uring_sqe_set_data(sqe, p);
        k++;
    }
    return k;
}

/* The results of the prepared reads. Every read's bytes into its input before any callback
 * runs, so a callback may touch any socket's input; then the reports, in order. A callback may
 * free a socket still on the list: plain_free takes it off. A read the ring did not make
 * reports nothing: its socket is still readable, and epoll says so again. */
static void finish_reads(batch_t *b)
{
    plain_t *p;
    TAILQ_FOREACH(p, &b->rdone, rlink) {
        if (p->rnv > 0)
            read_commit(p, b->slot[p->slot].v, p->rnv, p->rres);
    }
    while ((p = TAILQ_FIRST(&b->rdone)) != NULL) {
        TAILQ_REMOVE(&b->rdone, p, rlink);
        p->rbatched = 0;
        if (p->rnv < 1) {
            end(p, PCR_SOCK_ERROR);
            continue;
        }
        int res = p->rres;
        if (res != NOT_RUN)
            read_report(p, res >= 0 ? res : -1, res >= 0 ? 0 : -res);
    }
}

static void read_phase(batch_t *b)
{
    while (!TAILQ_EMPTY(&b->rqueue) && !b->broken) {
        if (one_read(b)) {
            read_one(b);
            continue;
        }
        unsigned k = prep_reads(b, 0);
        if (k > 0)
            batch_run(b, k);
        finish_reads(b);
    }
}

static void write_phase(batch_t *b)
{
    plain_t *chunk[BATCH_RING];
    while (!TAILQ_EMPTY(&b->queue) && !b->broken) {
        if (one_write(b)) {
            write_one(b);
            continue;
        }
        unsigned nw = 0;
        unsigned k = prep_writes(b, 0, chunk, &nw);
        if (k == 0)
            break;
        batch_run(b, k);
        finish_writes(chunk, nw);
    }
}

int pcr_sock_batch_begin(uint64_t *submits, uint64_t *ops, uint64_t *merged, int *active)
{
    if (tls_batch != NULL)
        return 0;
    batch_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return -ENOMEM;
    /* SUBMIT_ALL: a submit goes on past an operation that fails to start (its completion says
     * why), so only an allocation failure stops one short. COOP_TASKRUN and SINGLE_ISSUER: the
     * worker's thread alone submits, and reaps in the same call, so the kernel neither
     * interrupts it for completions nor locks for other submitters. An older kernel refuses
     * the flags: the ring goes without them. */
    int rc = io_uring_queue_init(BATCH_RING, &b->ring,
                                 IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN |
                                     IORING_SETUP_SINGLE_ISSUER);
    if (rc == -EINVAL)
        rc = io_uring_queue_init(BATCH_RING, &b->ring, 0);
    if (rc < 0) {
        free(b);
        return rc;
    }
    /* Each submit then finds the ring by its registered index, not through the fd table. */
    (void)io_uring_register_ring_fd(&b->ring);
    TAILQ_INIT(&b->queue);
    TAILQ_INIT(&b->rqueue);
    TAILQ_INIT(&b->rdone);
    b->submits = submits;
    b->ops = ops;
    b->merged = merged;
    b->active = active;
    if (active != NULL)
        __atomic_store_n(active, 1, __ATOMIC_RELAXED);
    tls_batch = b;
    return 0;
}

static void batch_unqueue(batch_t *b)
{
    plain_t *p;
    while ((p = TAILQ_FIRST(&b->rqueue)) != NULL) {
        TAILQ_REMOVE(&b->rqueue, p, rlink);
        p->rbatched = 0;
    }
    while ((p = TAILQ_FIRST(&b->queue)) != NULL) {
        TAILQ_REMOVE(&b->queue, p, batch_link);
        p->batched = 0;
        write_now(p);
    }
}

void pcr_sock_batch_flush(void)
{
    batch_t *b = tls_batch;
    if (b == NULL)
        return;
    for (int round = 0; round < BATCH_ROUNDS && !b->broken; round++) {
        if (TAILQ_EMPTY(&b->rqueue) && TAILQ_EMPTY(&b->queue))
            break;
        read_phase(b);
        if (!b->broken)
            write_phase(b);
    }
    /* Whatever is still queued (past the bound, never seen; or the ring broke): the reads come
     * again from epoll, the writes go now. */
    batch_unqueue(b);
    if (b->broken) {
        tls_batch = NULL;
        free(b);
    }
}

int pcr_sock_batch_waiting(void)
{
    batch_t *b = tls_batch;
    return b != NULL && !TAILQ_EMPTY(&b->queue);
}

void pcr_sock_batch_turn(void)
{
    batch_t *b = tls_batch;
    if (b == NULL)
        return;
    if (TAILQ_EMPTY(&b->rqueue) || (TAILQ_EMPTY(&b->queue) && one_read(b))) {
        /* Nothing came in: what waits goes now. Or one read and no write waits: one call. */
        b->deferred = 0;
        pcr_sock_batch_flush();
        return;
    }
    /* The writes left by the last turn, then this turn's reads, in one submit; writes that do
     * not fit one go on their own first. */
    plain_t *chunk[BATCH_RING];
    unsigned nw, k;
    for (;;) {
        nw = 0;
        k = prep_writes(b, 0, chunk, &nw);
        if (TAILQ_EMPTY(&b->queue))
            break;
        int rc = batch_run(b, k);
        finish_writes(chunk, nw);
        if (rc != 0)
            goto out;
    }
    unsigned kw = k;
    k = prep_reads(b, k);
    int rc = k > 0 ? batch_run(b, k) : 0;
    if (rc == 0 && b->deferred && nw > 0 && k > kw)
        count(b->merged, 1);
    b->deferred = 0;
    finish_writes(chunk, nw);
    finish_reads(b);
    if (rc != 0)
        goto out;
    read_phase(b); /* reads that did not fit the submit */
    /* What the reads' callbacks queued waits for the next turn's reads only when this turn had
     * several: a loop that busy finds more ready at once. One read alone is light load, where
     * the look would most often find nothing and cost a call: its writes go now. */
    if (k - kw < 2)
        write_phase(b);
    else
        b->deferred = !TAILQ_EMPTY(&b->queue);
out:
    if (b->broken) {
        batch_unqueue(b);
        tls_batch = NULL;
        free(b);
    }
}

unsigned pcr_sock_readable_take(void)
{
    unsigned n = tls_readable;
    tls_readable = 0;
    return n;
}

void pcr_sock_batch_end(void)
{
    batch_t *b = tls_batch;
    if (b == NULL)
        return;
    pcr_sock_batch_flush();
    if (tls_batch == NULL)
        return; /* given up, freed */
    io_uring_queue_exit(&b->ring);
    free(b);
    tls_batch = NULL;
}
