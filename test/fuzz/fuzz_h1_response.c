/* test/fuzz/fuzz_h1_response.c: HTTP/1.1 responses from a pod, as router/upstream/upstream.c reads
 * them (http-parser and its callbacks, the checks of router/core/http1.c, 1xx, Content-Length,
 * chunked and close-delimited bodies, keep-alive and the pool, deadlines, pausing, cancelling).
 *
 * Each input: a pool of one connection to a backend whose address is a loopback listener of
 * the harness (pcr_pool_init), one request sent through it (pcr_upstream_send); the harness
 * accepts the pool's connection, reads the request, and answers with the input's bytes, cut
 * into writes, then closes or keeps the connection open; the event loop runs until a callback
 * ends the request, time passing virtually (fuzz_net.h) so that every deadline can fire. The
 * event loop and the listener are made once and kept: each run must leave no event on the
 * loop and no connection open.
 *
 * Input: three control bytes, then the pod's bytes.
 *   byte 0  bit 0     the pod closes the connection after its last write (else keeps it open)
 *           bit 1     the caller pauses the response at its head, resumes after the next write
 *           bit 2     the caller cancels the request at its first body bytes
 *           bits 3-5  virtual time between two writes: 0, 0, 0, 0, 0.1, 1, 2.9 or 3.1 s
 *   byte 1  the cut into writes: 0 one write, else the seed of the cutter
 *   byte 2  bits 0-3: longest write is 2^n bytes
 *
 * Invariants, beyond "no crash, no leak, no undefined behaviour, no hang":
 *   1. Exactly one of on_done and on_error, and no callback after it (nor any after a cancel).
 *   2. on_head at most once, before any body, with a status within 200..599 (interim responses
 *      are the router's to drop); a pod's first final status outside 100..599, or 101, is an
 *      error, PCR_UP_PROTOCOL (or a timeout, when time passed first), never a head.
 *   3. The body delivered is what http-parser reads as the body of the pod's response, cut
 *      short at most: never more bytes than the input, and all of it on on_done; on_done
 *      comes only for a response http-parser reads whole, with the length on_head announced,
 *      and such a response ends in on_done unless the router's own checks refused it (or
 *      time passed first). No body after 1xx, 204 or 304, whatever the length says.
 *   4. The connection goes back to the pool only after a complete keep-alive response with no
 *      bytes after it, the pod still connected; then (and whenever those hold) a second request
 *      goes over that same connection and is answered.
 *   5. The cut into writes changes nothing (without time passing, pausing or cancelling): the
 *      same outcome, status, body and pooling as the bytes in one write.
 *   6. Every connection is closed once the pool is disposed of. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <http_parser.h>

#include "backend.h"
#include "config.h"
#include "fuzz.h"
#include "fuzz_net.h"
#include "log.h"
#include "upstream.h"

#define CTRL 3
#define MAX_INPUT_BYTES (64 * 1024)
#define TURNS (100 * 1000)
#define FINAL_STEP_MS 500
#define FINAL_STEPS 40           /* 20 s: past every deadline below */

static const char config_text[] =
    "{\"listen\": [{\"address\": \"127.0.0.1:1\"}],\n"
    " \"backends\": [{\"name\": \"pod\", \"url\": \"http://127.0.0.1:1\"}],\n"
    " \"timeouts\": {\"connect_ms\": 1000, \"response_ms\": 3000, \"stream_idle_ms\": 3000,\n"
    "   \"upstream_keepalive_ms\": 6000},\n"
    " \"health\": {\"interval_ms\": 0}, \"scrape\": {\"interval_ms\": 0}}\n";

static const char request1[] =
    "POST /v1/completions HTTP/1.1\r\nHost: pod\r\nContent-Length: 2\r\n\r\n{}";
static const char request2[] = "GET /v1/models HTTP/1.1\r\nHost: pod\r\n\r\n";
static const char answer2[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

/* ---- the mirror: the pod's bytes as http-parser reads them ----------------------------- */

typedef struct {
    int status;              /* the first final response's, 0 before its head */
    int head;                /* its head was read */
    int complete;            /* and all of it */
    int keep_alive;          /* at its end */
    int error;               /* http-parser refused the bytes */
    size_t end;              /* bytes up to its end */
    fuzz_buf_t body;
} mirror_t;

static int mi_headers_complete(http_parser *p)
{
    mirror_t *m = p->data;
    int status = p->status_code;
    /* As the router reads them (RFC 9112, 6.3): no body after 1xx, 204, 304. */
    int bodiless = status < 200 || status == 204 || status == 304;
    if (status >= 200 || status < 100 || status == 101) {
        m->status = status;
        m->head = 1;
    }
    return bodiless;
}

static int mi_body(http_parser *p, const char *at, size_t n)
{
    mirror_t *m = p->data;
    if (m->head)
        fuzz_buf_add(&m->body, at, n);
    return 0;
}

static int mi_complete(http_parser *p)
{
    mirror_t *m = p->data;
    if (!m->head)
        return 0; /* a 1xx */
    m->complete = 1;
    m->keep_alive = http_should_keep_alive(p);
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings mirror_settings = {
    .on_headers_complete = mi_headers_complete, .on_body = mi_body,
    .on_message_complete = mi_complete,
};

/* `eof`: the pod closes after these bytes. */
static void mirror_run(mirror_t *m, const uint8_t *data, size_t len, int eof)
{
    http_parser p;
    http_parser_init(&p, HTTP_RESPONSE);
    p.data = m;
    size_t n = http_parser_execute(&p, &mirror_settings, (const char *)data, len);
    enum http_errno e = HTTP_PARSER_ERRNO(&p);
    m->end = n;
    if (e != HPE_OK && e != HPE_PAUSED) {
        m->error = 1;
        return;
    }
    /* A status outside 100-599 stops the router at the head, whatever follows. */
    if (m->head && (m->status < 100 || m->status > 599 || m->status == 101))
        return;
    if (!m->complete && eof && n == len) {
        http_parser_execute(&p, &mirror_settings, NULL, 0);
        m->error = !m->complete;
    }
}

/* ---- one run ------------------------------------------------------------------------------ */

typedef struct {
    /* What the callbacks saw. */
    int heads, status, done, error, err, err_got_head, cancelled, calls_after_end;
    int64_t clen;
    fuzz_buf_t body;
    int pooled;              /* the connection was idle in the pool after the response */
    int second_ok;           /* the second request was answered over it */
} outcome_t;

typedef struct {
    const uint8_t *ctl, *resp;
    size_t resp_len;
    int close_after, pause, cancel;
    unsigned gap;
    pcr_pool_t pool;
    pcr_backend_t *be;
    struct event_base *base;
    pcr_upreq_t *req;
    int lfd, fd, fd_eof;
    unsigned accepted;
    fuzz_buf_t in;           /* what the pod received */
    outcome_t *o;
    int ended;
    unsigned turns;
} h1p_t;

static const pcr_config_t *fuzz_cfg;

static void note_call(h1p_t *t)
{
    if (t->ended)
        t->o->calls_after_end++;
}

static void on_head(void *ctx, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    h1p_t *t = ctx;
    note_call(t);
    FUZZ_CHECKF(t->o->heads == 0 && t->o->body.len == 0, "a second head, or a head after body");
    FUZZ_CHECKF(status >= 200 && status <= 599, "on_head with status %d", status);
    t->o->heads++;
    t->o->status = status;
    t->o->clen = clen;
    if (t->pause)
        pcr_upstream_pause(t->req);
}

static void on_body(void *ctx, const char *data, size_t len)
{
    h1p_t *t = ctx;
    note_call(t);
    FUZZ_CHECKF(t->o->heads == 1, "body before the head");
    fuzz_buf_add(&t->o->body, data, len);
    if (t->cancel && !t->ended) {
        pcr_upstream_cancel(t->req);
        t->req = NULL;
        t->o->cancelled = 1;
        t->ended = 1;
    }
}

static void on_done(void *ctx)
{
    h1p_t *t = ctx;
    note_call(t);
    t->o->done++;
    t->ended = 1;
    t->req = NULL;
}

static void on_error(void *ctx, pcr_up_error_t err, int got_head)
{
    h1p_t *t = ctx;
    note_call(t);
    t->o->error++;
    t->o->err = err;
    t->o->err_got_head = got_head;
    t->ended = 1;
    t->req = NULL;
}

static const pcr_upstream_cbs_t cbs = {on_head, on_body, on_done, on_error, NULL, NULL, NULL, NULL};

/* The second request's own callbacks: a plain 200 with "ok". */
typedef struct {
    int status, done, error;
    fuzz_buf_t body;
} second_t;

static void s_head(void *ctx, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    ((second_t *)ctx)->status = status;
}

static void s_body(void *ctx, const char *data, size_t len)
{
    fuzz_buf_add(&((second_t *)ctx)->body, data, len);
}

static void s_done(void *ctx) { ((second_t *)ctx)->done++; }

static void s_error(void *ctx, pcr_up_error_t err, int got_head) { ((second_t *)ctx)->error++; }

static const pcr_upstream_cbs_t second_cbs = {s_head, s_body, s_done, s_error, NULL, NULL,
                                               NULL, NULL};

/* One poll() first: a quiet turn, the most common, is one system call rather than a read and
 * an accept (which, on Linux, makes and frees a socket even when none is waiting). */
static int step(void *arg)
{
    h1p_t *t = arg;
    int moved = 0, fd;
    struct pollfd pf[2] = {{.fd = t->lfd, .events = POLLIN},
                           {.fd = t->fd_eof ? -1 : t->fd, .events = POLLIN}};
    int rc;
    while ((rc = poll(pf, 2, 0)) < 0 && errno == EINTR)
        ;
    FUZZ_CHECKF(rc >= 0, "poll: %s", strerror(errno));
    int accepted = 0;
    while (pf[0].revents != 0 && (fd = fuzz_accept(t->lfd)) >= 0) {
        t->accepted++;
        if (t->fd < 0) {
            t->fd = fd;
            t->fd_eof = 0;
            accepted = 1;
        } else {
            close(fd); /* the pool opened a second connection: counted, checked by the caller */
        }
        moved = 1;
    }
    if (t->fd >= 0 && !t->fd_eof && (accepted || pf[1].revents != 0))
        moved |= fuzz_read(t->fd, &t->in, &t->fd_eof) > 0 || t->fd_eof;
    return moved;
}

static void run(h1p_t *t)
{
    FUZZ_CHECKF(fuzz_run(t->base, step, t, &t->turns) == 0,
                "the loop did not go quiet within %u turns", TURNS);
}

/* Runs until the pod holds `want` bytes of request. */
static void read_request(h1p_t *t, size_t want)
{
    run(t);
    FUZZ_CHECKF(t->fd >= 0 && t->in.len == want, "the pod got %zu of %zu request bytes",
                t->in.len, want);
}

/* The event loop and the pod's listener, made on the first run and kept until exit: making
 * them costs more than a short input. */
static struct event_base *kept_base;
static int kept_lfd = -1;
static uint16_t kept_port;

static void kept_free(void)
{
    event_base_free(kept_base);
    kept_base = NULL;
    close(kept_lfd);
    kept_lfd = -1;
}

static void kept_get(struct event_base **base, int *lfd, uint16_t *port)
{
    if (kept_base == NULL) {
        kept_base = event_base_new();
        FUZZ_CHECK(kept_base != NULL);
        kept_lfd = fuzz_listen(&kept_port);
        FUZZ_CHECK(atexit(kept_free) == 0);
    }
    *base = kept_base;
    *lfd = kept_lfd;
    *port = kept_port;
}

static void run_once(h1p_t *t, uint32_t seed, outcome_t *o)
{
    t->o = o;
    t->fd = -1;
    t->ended = 0;
    t->accepted = 0;
    t->turns = TURNS;
    t->in.len = 0;
    fuzz_clock_start();
    uint16_t port;
    kept_get(&t->base, &t->lfd, &port);
    t->be = calloc(1, sizeof(*t->be));
    FUZZ_CHECK(t->be != NULL);
    static char pod_name[] = "pod";
    static pcr_server_t srv; /* what the pool reads of the process (the light clients' note) */
    t->be->conf.name = pod_name;
    t->be->srv = &srv;
    struct sockaddr_in *sa = (struct sockaddr_in *)&t->be->addr;
    sa->sin_family = AF_INET;
    sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa->sin_port = htons(port);
    t->be->addrlen = sizeof(*sa);
    static const int draining = 0;
    pcr_pool_init(&t->pool, t->be, t->base, 1, &draining, &fuzz_cfg);

    struct evbuffer *req = evbuffer_new();
    FUZZ_CHECK(req != NULL);
    evbuffer_add(req, request1, sizeof(request1) - 1);
    t->req = pcr_upstream_send(&t->pool, &(pcr_up_send_t){.head = req}, &cbs, t);
    FUZZ_CHECK(t->req != NULL);
    read_request(t, sizeof(request1) - 1);
    FUZZ_CHECK(fuzz_mem_eq(t->in.p, request1, t->in.len));

    fuzz_split_t cut;
    fuzz_split_init(&cut, seed, (size_t)1 << (t->ctl[2] & 15));
    size_t off = 0;
    while (off < t->resp_len && !t->fd_eof) {
        size_t n = fuzz_split_next(&cut, t->resp_len - off);
        /* The request's socket buffer takes a whole input: the router may stop reading (a
         * pause, a cancel, an error), the kernel still takes the bytes. */
        size_t w = fuzz_write(t->fd, t->resp + off, n);
        off += n;
        run(t);
        if (w < n)
            break;
        if (t->pause && t->req != NULL && o->heads) {
            pcr_upstream_resume(t->req);
            run(t);
        }
        if (t->gap > 0 && off < t->resp_len) {
            fuzz_clock_advance(t->gap);
            run(t);
        }
    }
    int closed = t->close_after || t->fd_eof;
    if (t->close_after && t->fd >= 0) {
        close(t->fd);
        t->fd = -1;
    }
    run(t);
    if (t->req != NULL && t->pause) {
        pcr_upstream_resume(t->req);
        run(t);
    }
    for (int i = 0; i < FINAL_STEPS && !t->ended; i++) {
        fuzz_clock_advance(FINAL_STEP_MS);
        run(t);
    }
    FUZZ_CHECKF(t->ended, "the request was still open after %u s", FINAL_STEPS * FINAL_STEP_MS / 1000);
    FUZZ_CHECKF(t->accepted == 1, "the pool opened %u connections for one request", t->accepted);
    o->pooled = t->pool.nidle == 1;
    FUZZ_CHECK(t->pool.nidle <= 1 && t->pool.nconns == t->pool.nidle);
    if (o->pooled) {
        FUZZ_CHECKF(!closed, "a connection the pod closed is back in the pool");
        /* The pooled connection carries the next request. */
        second_t s = {0};
        req = evbuffer_new();
        FUZZ_CHECK(req != NULL);
        evbuffer_add(req, request2, sizeof(request2) - 1);
        t->in.len = 0;
        FUZZ_CHECK(pcr_upstream_send(&t->pool, &(pcr_up_send_t){.head = req}, &second_cbs, &s) != NULL);
        read_request(t, sizeof(request2) - 1);
        FUZZ_CHECK(fuzz_mem_eq(t->in.p, request2, t->in.len));
        FUZZ_CHECK(fuzz_write(t->fd, answer2, sizeof(answer2) - 1) == sizeof(answer2) - 1);
        run(t);
        FUZZ_CHECKF(t->accepted == 1 && s.done == 1 && s.error == 0 && s.status == 200 &&
                        s.body.len == 2 && fuzz_mem_eq(s.body.p, "ok", 2),
                    "the second request over the pooled connection: %u accepts, %d done, "
                    "%d errors, status %d", t->accepted, s.done, s.error, s.status);
        o->second_ok = 1;
        fuzz_buf_free(&s.body);
    }
    pcr_pool_dispose(&t->pool);
    FUZZ_CHECKF(t->pool.nconns == 0 && t->be->conns == 0, "%u connections left open",
                t->pool.nconns);
    if (t->fd >= 0)
        fuzz_close_reset(t->fd);
    int fd;
    while ((fd = fuzz_accept(t->lfd)) >= 0)
        close(fd);
    /* The loop and the listener are kept for the next run: nothing of this one may be left
     * on them. */
    FUZZ_CHECKF(event_base_get_num_events(t->base, EVENT_BASE_COUNT_ADDED) == 0,
                "%d events left on the loop", event_base_get_num_events(t->base,
                                                                        EVENT_BASE_COUNT_ADDED));
    free(t->be);
    fuzz_clock_stop();
}

/* FUZZ_TRACE=1: what the caller saw, and what http-parser made of the bytes. */
static void trace(const outcome_t *o, const mirror_t *m)
{
    static int on = -1;
    if (on < 0)
        on = getenv("FUZZ_TRACE") != NULL;
    if (on)
        fprintf(stderr, "heads %d status %d clen %lld body %zu done %d error %d (%d, head %d) "
                "cancelled %d pooled %d second %d | mirror: status %d complete %d keep-alive %d "
                "end %zu body %zu error %d\n", o->heads, o->status, (long long)o->clen,
                o->body.len, o->done, o->error, o->err, o->err_got_head, o->cancelled, o->pooled,
                o->second_ok, m->status, m->complete, m->keep_alive, m->end, m->body.len,
                m->error);
}

static void check(const h1p_t *t, const outcome_t *o, const mirror_t *m, int closed)
{
    trace(o, m);
    FUZZ_CHECKF(o->calls_after_end == 0, "%d callbacks after the end", o->calls_after_end);
    if (o->cancelled) {
        FUZZ_CHECK(o->done == 0 && o->error == 0);
    } else {
        FUZZ_CHECKF(o->done + o->error == 1, "%d done, %d errors", o->done, o->error);
    }
    FUZZ_CHECKF(o->body.len <= t->resp_len, "%zu body bytes from %zu input bytes", o->body.len,
                t->resp_len);
    /* The body is the one http-parser reads, cut short at most. */
    FUZZ_CHECKF(o->body.len <= m->body.len && fuzz_mem_eq(o->body.p, m->body.p, o->body.len),
                "the body delivered (%zu bytes) is not what the pod sent (%zu)", o->body.len,
                m->body.len);
    int bad_status = m->head && (m->status < 100 || m->status > 599 || m->status == 101);
    if (bad_status) {
        FUZZ_CHECKF(o->heads == 0 && o->error == 1 &&
                        (o->err == PCR_UP_PROTOCOL || (o->err == PCR_UP_TIMEOUT && t->gap > 0)),
                    "status %d: %d heads, error %d", m->status, o->heads, o->err);
    }
    if (o->heads)
        FUZZ_CHECKF(m->head && o->status == m->status, "status %d, the pod's was %d", o->status,
                    m->status);
    if (o->error)
        FUZZ_CHECK(o->err_got_head == (o->heads > 0));
    /* A response http-parser reads whole ends in on_done, unless the router's own checks
     * (stricter than http-parser's) refused it, or time passed first. */
    if (m->complete && !bad_status && !o->cancelled)
        FUZZ_CHECKF(o->done || o->err == PCR_UP_PROTOCOL || (o->err == PCR_UP_TIMEOUT && t->gap > 0),
                    "a whole response (status %d) ended in error %d", m->status, o->err);
    if (o->done) {
        FUZZ_CHECKF(o->heads == 1 && m->complete && o->body.len == m->body.len,
                    "done with %d heads, %zu of %zu body bytes, mirror %s", o->heads, o->body.len,
                    m->body.len, m->complete ? "complete" : "incomplete");
        FUZZ_CHECKF(o->clen < 0 || o->status == 204 || o->status == 304 ||
                        (uint64_t)o->clen == o->body.len,
                    "Content-Length %lld, %zu body bytes", (long long)o->clen, o->body.len);
    }
    int reusable = o->done && m->keep_alive && m->end == t->resp_len && !closed;
    FUZZ_CHECKF(!o->pooled || reusable, "pooled after %s", !o->done ? "no response"
                : !m->keep_alive ? "a response that does not keep the connection alive"
                : m->end != t->resp_len ? "a response with bytes after it" : "the pod closed");
    /* No time passes after the last byte: the idle connection cannot have aged out. */
    FUZZ_CHECKF(o->pooled || !reusable, "a reusable connection was not pooled");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const unsigned gaps[8] = {0, 0, 0, 0, 100, 1000, 2900, 3100};
    if (fuzz_cfg == NULL) {
        signal(SIGPIPE, SIG_IGN);
        pcr_log_set_level(PCR_LOG_ERROR);
        char *errors = NULL;
        fuzz_cfg = pcr_config_parse(config_text, "fuzz.json", &errors);
        FUZZ_CHECKF(fuzz_cfg != NULL, "%s", errors ? errors : "config");
    }
    if (size < CTRL || size > MAX_INPUT_BYTES)
        return 0;
    h1p_t t;
    memset(&t, 0, sizeof(t));
    t.ctl = data;
    t.resp = data + CTRL;
    t.resp_len = size - CTRL;
    t.close_after = data[0] & 1;
    t.pause = (data[0] >> 1) & 1;
    t.cancel = (data[0] >> 2) & 1;
    t.gap = gaps[(data[0] >> 3) & 7];

    mirror_t m;
    memset(&m, 0, sizeof(m));
    mirror_run(&m, t.resp, t.resp_len, t.close_after);
    outcome_t o;
    memset(&o, 0, sizeof(o));
    run_once(&t, data[1], &o);
    check(&t, &o, &m, t.close_after);

    if (data[1] != 0 && t.gap == 0 && !t.pause && !t.cancel) {
        outcome_t whole;
        memset(&whole, 0, sizeof(whole));
        run_once(&t, 0, &whole);
        FUZZ_CHECKF(whole.done == o.done && whole.error == o.error && whole.err == o.err &&
                        whole.heads == o.heads && whole.status == o.status &&
                        whole.body.len == o.body.len && whole.pooled == o.pooled,
                    "cut into writes: done %d error %d (%d) status %d body %zu pooled %d; "
                    "whole: done %d error %d (%d) status %d body %zu pooled %d", o.done, o.error,
                    o.err, o.status, o.body.len, o.pooled, whole.done, whole.error, whole.err,
                    whole.status, whole.body.len, whole.pooled);
        fuzz_buf_free(&whole.body);
    }
    fuzz_buf_free(&o.body);
    fuzz_buf_free(&m.body);
    fuzz_buf_free(&t.in);
    return 0;
}
