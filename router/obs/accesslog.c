/* router/obs/accesslog.c: the access log's writer thread and its per-worker queues (accesslog.h).
 *
 * A queue is a ring of bytes holding whole lines: the worker copies a line in and publishes
 * the new head; the writer copies from tail to head, writes, and publishes the new tail. The
 * writer sleeps in poll() on an eventfd; a worker wakes it only when its queue was empty (the
 * writer, which drained it, may be asleep), so a busy log costs one syscall per batch, not
 * per line. Head and tail are sequentially consistent: either the writer, re-reading the head
 * after its tail store, sees the new line, or the worker sees the queue was empty and wakes it.
 * A timeout bounds the sleep anyway.
 *
 * Writes to stderr go out in pieces of at most PIPE_BUF bytes cut at line ends, so a line is
 * never split by a log line another thread writes to the same pipe meanwhile. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "accesslog.h"
#include "log.h"
#include "pcr/common.h"

#define STAGE_BYTES (64 * 1024)
#define IDLE_MS 100

#define SC_LOAD(x) __atomic_load_n(&(x), __ATOMIC_SEQ_CST)
#define SC_STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_SEQ_CST)

typedef struct {
    char *buf;
    size_t mask;                 /* capacity - 1 (a power of two) */
    uint64_t head;               /* written by the worker */
    uint64_t tail;               /* written by the writer */
} queue_t;

struct pcr_accesslog {
    queue_t *q;
    unsigned nq;
    int wake_fd;                 /* eventfd */
    pthread_t thread;
    int started;
    int stop;                    /* atomic */
    int reopen;                  /* atomic: reopen requested */
    pthread_mutex_t lock;        /* guards path_next */
    char *path_next;             /* a reload's new path, taken at the reopen */
    /* The writer's own. */
    char *path;                  /* "" for stderr */
    int fd;
    char stage[STAGE_BYTES];
    /* Counters (atomic). */
    uint64_t dropped;
    uint64_t reopens;
};

static int open_path(const char *path, char *err, size_t errlen)
{
    if (path == NULL || path[0] == '\0')
        return STDERR_FILENO;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0)
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return fd;
}

static void wake(pcr_accesslog_t *al)
{
    uint64_t one = 1;
    ssize_t n = write(al->wake_fd, &one, sizeof(one));
    (void)n; /* EAGAIN only when the counter is full: the writer is awake then anyway */
}

int pcr_accesslog_write(pcr_accesslog_t *al, unsigned qi, const char *line, size_t len)
{
    if (al == NULL || qi >= al->nq || len == 0)
        return PCR_ERR_INVAL;
    queue_t *q = &al->q[qi];
    uint64_t h = q->head, t = SC_LOAD(q->tail);
    if (len > PCR_ACCESSLOG_MAX_LINE || len > q->mask + 1 - (h - t)) {
        __atomic_fetch_add(&al->dropped, 1, __ATOMIC_RELAXED);
        return len > PCR_ACCESSLOG_MAX_LINE ? PCR_ERR_TOO_LARGE : PCR_ERR_FULL;
    }
    size_t at = (size_t)(h & q->mask), first = q->mask + 1 - at;
    if (first > len)
        first = len;
    memcpy(q->buf + at, line, first);
    memcpy(q->buf, line + first, len - first);
    SC_STORE(q->head, h + len);
    if (SC_LOAD(q->tail) == h)
        wake(al);
    return 0;
}

/* Writes all of buf; to stderr in pieces of at most PIPE_BUF cut at line ends. */
static void write_out(pcr_accesslog_t *al, const char *buf, size_t len)
{
    while (len > 0) {
        size_t n = len;
        if (al->fd == STDERR_FILENO && n > PIPE_BUF) {
            n = PIPE_BUF;
            while (n > 0 && buf[n - 1] != '\n')
                n--;
            if (n == 0)
                n = len; /* one line longer than PIPE_BUF: whole, interleaving or not */
        }
        ssize_t w = write(al->fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            size_t lines = 0;
            for (size_t i = 0; i < len; i++)
                lines += buf[i] == '\n';
            __atomic_fetch_add(&al->dropped, lines, __ATOMIC_RELAXED);
            return;
        }
        buf += w;
        len -= (size_t)w;
    }
}

/* Writes what queue q held when called (lines added meanwhile wait for the next pass, so a
 * busy worker cannot keep the writer from a reopen or a stop). Returns 1 when it wrote any. */
static int drain_queue(pcr_accesslog_t *al, queue_t *q)
{
    uint64_t h = SC_LOAD(q->head);
    int any = 0;
    while (q->tail != h) {
        uint64_t t = q->tail;
        size_t n = (size_t)(h - t) < STAGE_BYTES ? (size_t)(h - t) : STAGE_BYTES;
        size_t at = (size_t)(t & q->mask), first = q->mask + 1 - at;
        if (first > n)
            first = n;
        memcpy(al->stage, q->buf + at, first);
        memcpy(al->stage + first, q->buf, n - first);
        /* Whole lines only: the rest waits for the next round (a line is never longer than
         * the stage, so there is at least one). */
        size_t whole = n;
        while (whole > 0 && al->stage[whole - 1] != '\n')
            whole--;
        if (whole == 0)
            whole = n;
        write_out(al, al->stage, whole);
        SC_STORE(q->tail, t + whole);
        any = 1;
    }
    return any;
}

/* One pass over every queue. Returns 1 when it wrote anything. */
static int drain_all(pcr_accesslog_t *al)
{
    int any = 0;
    for (unsigned i = 0; i < al->nq; i++)
        any |= drain_queue(al, &al->q[i]);
    return any;
}

static void do_reopen(pcr_accesslog_t *al)
{
    pthread_mutex_lock(&al->lock);
    char *next = al->path_next;
    al->path_next = NULL;
    pthread_mutex_unlock(&al->lock);
    const char *path = next != NULL ? next : al->path;
    char err[512];
    int fd = open_path(path, err, sizeof(err));
    if (fd < 0) {
        pcr_log_error("access log: %s; still writing to %s", err,
                      al->path[0] ? al->path : "stderr");
        free(next);
        return;
    }
    if (al->fd != STDERR_FILENO)
        close(al->fd);
    al->fd = fd;
    if (next != NULL) {
        free(al->path);
        al->path = next;
    }
    __atomic_fetch_add(&al->reopens, 1, __ATOMIC_RELAXED);
}

static void *writer_main(void *arg)
{
    pcr_accesslog_t *al = arg;
    struct pollfd pfd = {.fd = al->wake_fd, .events = POLLIN};
    for (;;) {
        /* What was queued before a reopen was asked for goes to the old file. */
        int wrote = drain_all(al);
        if (__atomic_exchange_n(&al->reopen, 0, __ATOMIC_ACQ_REL)) {
            drain_all(al);
            do_reopen(al);
            continue;
        }
        if (__atomic_load_n(&al->stop, __ATOMIC_ACQUIRE)) {
            while (drain_all(al)) /* the workers have stopped: this ends */
                ;
            return NULL;
        }
        /* Sleep only after a pass that found every queue empty: a worker that adds to an
         * empty queue from then on wakes the writer. */
        if (!wrote && poll(&pfd, 1, IDLE_MS) > 0) {
            uint64_t v;
            ssize_t n = read(al->wake_fd, &v, sizeof(v));
            (void)n;
        }
    }
}

pcr_accesslog_t *pcr_accesslog_new(const char *path, unsigned nqueues, size_t queue_bytes,
                                   char *err, size_t errlen)
{
    pcr_accesslog_t *al = calloc(1, sizeof(*al));
    if (al == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    al->fd = -1;
    al->wake_fd = -1;
    pthread_mutex_init(&al->lock, NULL);
    size_t cap = PCR_ACCESSLOG_MAX_LINE;
    while (cap < queue_bytes)
        cap *= 2;
    al->nq = nqueues;
    al->q = calloc(nqueues ? nqueues : 1, sizeof(*al->q));
    al->path = strdup(path != NULL ? path : "");
    if (al->q == NULL || al->path == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (unsigned i = 0; i < nqueues; i++) {
        al->q[i].mask = cap - 1;
        if ((al->q[i].buf = malloc(cap)) == NULL) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    }
    if ((al->fd = open_path(al->path, err, errlen)) < 0)
        goto fail;
    if ((al->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        goto fail;
    }
    /* Signals belong to the control loop: the writer starts with every one blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&al->thread, NULL, writer_main, al);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the writer thread: %s", strerror(rc));
        goto fail;
    }
    al->started = 1;
    return al;
fail:
    pcr_accesslog_free(al);
    return NULL;
}

void pcr_accesslog_free(pcr_accesslog_t *al)
{
    if (al == NULL)
        return;
    if (al->started) {
        __atomic_store_n(&al->stop, 1, __ATOMIC_RELEASE);
        wake(al);
        pthread_join(al->thread, NULL);
    }
    if (al->fd >= 0 && al->fd != STDERR_FILENO)
        close(al->fd);
    if (al->wake_fd >= 0)
        close(al->wake_fd);
    for (unsigned i = 0; al->q != NULL && i < al->nq; i++)
        free(al->q[i].buf);
    free(al->q);
    free(al->path);
    free(al->path_next);
    pthread_mutex_destroy(&al->lock);
    free(al);
}

void pcr_accesslog_reopen(pcr_accesslog_t *al, const char *path)
{
    if (al == NULL)
        return;
    if (path != NULL) {
        char *copy = strdup(path);
        if (copy == NULL) {
            pcr_log_error("access log: out of memory; still writing to the previous file");
            return;
        }
        pthread_mutex_lock(&al->lock);
        free(al->path_next);
        al->path_next = copy;
        pthread_mutex_unlock(&al->lock);
    }
    __atomic_store_n(&al->reopen, 1, __ATOMIC_RELEASE);
    wake(al);
}

void pcr_accesslog_drop(pcr_accesslog_t *al)
{
    if (al != NULL)
        __atomic_fetch_add(&al->dropped, 1, __ATOMIC_RELAXED);
}

uint64_t pcr_accesslog_dropped(const pcr_accesslog_t *al)
{
    return al != NULL ? __atomic_load_n(&al->dropped, __ATOMIC_RELAXED) : 0;
}

uint64_t pcr_accesslog_reopens(const pcr_accesslog_t *al)
{
    return al != NULL ? __atomic_load_n(&al->reopens, __ATOMIC_RELAXED) : 0;
}
