/* router/http/h2_server.c: owns an HTTP/2 client connection (h2 over TLS, or h2c with prior
 * knowledge): the nghttp2 session (1.52 API) and its streams, one exchange per stream.
 *
 * A stream is created at begin-headers and freed at stream-close, nowhere else. Every read
 * feeds nghttp2_session_mem_recv and then flushes. Flushing asks nghttp2 for frames until the
 * transport holds pcr_write_high() unsent bytes (PCR_WRITE_HIGH, less while memory is short:
 * the answers then wait in their streams' buffers, which pause their pods), writes, and goes
 * on while the kernel took them and nghttp2 has more; only when the socket is full does it
 * wait, for the transport's drain notification. A response body that has not arrived from
 * upstream yet makes the data source return NGHTTP2_ERR_DEFERRED; upstream data resumes it.
 * Exchange ops never call into nghttp2's send path directly: they queue and activate the
 * deferred `flush` event, so a stream is never closed (and its exchange freed) while the
 * exchange's own code is on the stack.
 *
 * Budgets and deadlines:
 * - Flow control is consumed by hand (no automatic WINDOW_UPDATE) against the body budget
 *   (budget.h). The connection window stays at its initial 65535 bytes (PCR_BODY_ALLOWANCE), as
 *   does each stream's. What the session holds of request bodies plus the window the client
 *   still has may pass that allowance only by what the session reserved from the budget: a DATA
 *   frame's bytes are given back to the client's windows once the session could reserve them,
 *   so streams over the budget wait on their windows instead of growing memory, and resume
 *   when some is released. A body that fits a window (most prompts) never waits. Past the
 *   budget one request at a time may still finish its body (budget.h); the session it belongs
 *   to then stops holding its connection window, which the other streams' held bytes would
 *   otherwise keep shut: only stream windows hold those bytes back (one window each). A stream
 *   that waited for budget for timeouts.client_idle_ms is answered 503, and so is one waiting
 *   while the memory account refuses requests, at the worker's next tick (budget_shed).
 * - One timer per connection: with no stream open it is the idle timeout
 *   (timeouts.client_idle_ms); with streams it ticks, and a stream whose head is not complete
 *   within timeouts.request_header_ms, or whose body stalls for timeouts.client_idle_ms, is
 *   answered 408; one whose response made no progress towards the client for
 *   timeouts.client_write_ms (a zero window) is reset, and its pod request cancelled; the
 *   connection then counts as a heavy client in the pools for a while (pcr/connshare.h).
 *
 * - Idle: a second after the last stream, the socket is marked idle and the session, when
 *   nothing is in flight, hibernates: nghttp2 is freed and rebuilt at the next bytes (wake).
 *   HPACK state cannot be rebuilt, so neither side keeps a dynamic table (ng_make).
 *
 * Over 700 lines, kept whole: nghttp2's callbacks, the flow control taken by hand and the
 * referenced DATA pieces all work on one session and its streams. */
#include <limits.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "evmem.h"
#include "budget.h"
#include "exchange.h"
#include "http1.h"
#include "log.h"
#include "memcount.h"
#include "session.h"

typedef struct h2_sess h2_sess_t;

/* DATA bytes of at least PCR_BODY_TAKE_MIN (exchange.h) in one piece are referenced where
 * they arrived instead of being copied into the request: the read chain they are in is moved
 * out of the socket's input into a hold, which lives while any request body points into it. A
 * piece must also be at least a quarter of its chain, however long the chain, so that a hold
 * keeps at most 4x the body bytes it carries, as on HTTP/1.1 (h1_server.c). */

typedef struct {
    struct evbuffer *buf;          /* the read chain, moved whole */
    unsigned refs;                 /* body references, and on_read's own while it feeds */
} h2_hold_t;

/* nghttp2 keeps a 16 KiB frame buffer per session for its whole life, most of an idle
 * connection's memory. The session's allocator (ng_mem) gives blocks of at least BIG_MIN bytes
 * made while the session is created (that buffer) whole pages of their own, and once no stream
 * has been open for IDLE_TRIM_MS and nghttp2 has nothing left to send, their pages go back to
 * the system (madvise MADV_DONTNEED): the buffer holds no state between frames, and the next
 * frame written there takes the pages back, zeroed, at a page fault each. */
#define BIG_MIN 16384
#define NBIG 2
#define IDLE_TRIM_MS 1000

/* After the last frame (a GOAWAY), how long input is read and thrown away before closing. */
#define LINGER_MS 2000
/* How many of a client's latest stream ids are remembered (on_begin_frame). */
#define OPENED_RING 256

typedef struct h2_stream {
    int32_t id;
    h2_sess_t *sess;
    pcr_exchange_t *ex;
    struct evbuffer *out;          /* response body not yet taken by nghttp2 */
    size_t header_bytes;
    size_t unconsumed;             /* DATA bytes not yet given back to the stream window (budget) */
    size_t conn_held;              /* of those, not yet given back to the connection window */
    size_t held;                   /* DATA bytes of this stream in its request body */
    uint64_t t_begin;              /* begin-headers */
    uint64_t t_recv;               /* last request byte */
    uint64_t t_progress;           /* last response byte taken by nghttp2 (or output began) */
    int headers_done;
    int req_done;                  /* END_STREAM from the client */
    int reject_status;             /* 413 / 431 decided while receiving; 503: refused for
                                      memory at its HEADERS (refuse_requests) */
    int rejected;                  /* the error response went out */
    int shed;                      /* that response was a 503 for memory (reject) */
    int eof;                       /* the exchange sent its end */
    int deferred;                  /* the data source returned NGHTTP2_ERR_DEFERRED */
    int head_only;
    int abort;                     /* the response broke: reset once `out` is sent */
    int submitted;                 /* a response with a data source was submitted */
    int run_queued;                /* complete: to run once the whole read is processed */
    struct event *rst_timer;       /* a reset sent a little after the response (rst_later) */
    uint32_t rst_code;
    struct h2_stream *prev, *next;
} h2_stream_t;

struct h2_sess {
    pcr_session_t base;
    pcr_worker_t *w;
    pcr_sock_t *sock;
    nghttp2_session *ng;
    struct event *flush;
    struct event *timer;           /* idle timeout, or the streams' deadline tick */
    pcr_budget_waiter_t budget;
    h2_stream_t *exempt;           /* the stream allowed past the body budget, if it is ours */
    size_t held;                   /* request-body bytes its streams hold */
    size_t window;                 /* connection window the client may still use (at most) */
    size_t reserved;               /* body budget reserved: held + window - allowance, or more */
    h2_stream_t *streams;
    size_t nstreams;
    size_t nqueued;                /* streams with run_queued set */
    int closing;
    int in_flush;
    int lingering;                 /* nghttp2 is done: half-closed, discarding input (linger) */
    /* The client's latest stream ids opened by HEADERS (a ring, made by the first and freed
     * while hibernated), to tell a HEADERS for one of them (trailers, or a frame racing our
     * reset: nghttp2 ignores it) from one for an id never used and now below the highest (a
     * connection error, RFC 9113 5.1.1). */
    int32_t *opened;
    unsigned nopened;
    int32_t max_opened;
    int32_t opened_floor;          /* ids at or below it are out of the ring: nghttp2 decides */
    /* The read chain nghttp2 is being fed (on_read), for DATA taken by reference. */
    const uint8_t *seg;
    size_t seg_len;
    h2_hold_t *hold;               /* the chain, once moved out of the input; NULL before */
    /* nghttp2's memory (ng_mem): its large blocks made at creation, whose pages are given
     * back while the session is idle (trim_idle). */
    nghttp2_mem mem;
    int creating;                  /* inside nghttp2_session_server_new3 */
    struct {
        void *p;
        size_t n;
        size_t counted;            /* what the account counts for it (ng_realloc) */
    } big[NBIG];
    int trimmed;                   /* idle, and the pages went back; a new stream clears it */
    int sock_idle;                 /* pcr_sock_idle(1) was said; a new stream says 0 */
    /* Hibernation (hibernate, wake): what rebuilds an idle session freed with its nghttp2. */
    int hibernated;
    int waking;                    /* inside wake: callbacks see nghttp2's replay, not a client */
    int settings_acked;            /* the client acknowledged our SETTINGS */
    int settings_seen;             /* the client's first SETTINGS arrived */
    int goaway;                    /* a GOAWAY went out or came in: never hibernated again */
    uint32_t no_rfc7540_prio;      /* the client's SETTINGS_NO_RFC7540_PRIORITIES */
    uint32_t remote[7];            /* the client's settings, ids 1-6 and 8, while hibernated */
    int32_t remote_window;         /* what we may still send on the connection, ditto */
    size_t wake_data;              /* DATA bytes the replayed response still owes (wake) */
    uint32_t max_streams;          /* our SETTINGS, as sent at the start */
    uint32_t max_header_list;
    uint64_t idle_close_us;        /* with no stream: when the idle connection closes */
    /* Where nghttp2's input stands (walk_frames): a session is rebuilt only between frames. */
    uint32_t in_left;              /* bytes left of the current frame's payload (or preface) */
    uint32_t in_len;               /* the frame header's length field, as read so far */
    unsigned in_hd;                /* bytes of the next frame header read (0-8) */
};


static void h2_close(h2_sess_t *s);
static void flush_now(h2_sess_t *s);
static void arm_timer(h2_sess_t *s);
static void on_flush(evutil_socket_t fd, short what, void *arg);
static void on_timer(evutil_socket_t fd, short what, void *arg);
static int hibernate(h2_sess_t *s);
static int goaway(h2_sess_t *s);

static void schedule_flush(h2_sess_t *s) { event_active(s->flush, 0, 0); }

/* ---- nghttp2's memory ---------------------------------------------------------------- */

/* Read by every worker: the first to ask stores it, relaxed (each stores the same value). */
static long page_size(void)
{
    static long page;
    long pg = __atomic_load_n(&page, __ATOMIC_RELAXED);
    if (pg == 0) {
        pg = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
        __atomic_store_n(&page, pg, __ATOMIC_RELAXED);
    }
    return pg;
}

static int big_find(const h2_sess_t *s, const void *p)
{
    for (int i = 0; p != NULL && i < NBIG; i++)
        if (s->big[i].p == p)
            return i;
    return -1;
}

static void ng_free(void *p, void *user);

/* The memory account counts every block nghttp2 holds (memcount.h): a session's state grows
 * with its streams, which no fixed cost per connection follows. A block counts at malloc's
 * usable size, but a big block made at creation (the frame buffer) counts one page: the
 * frames written there are small (DATA goes by reference, on_send_data), so one page is what
 * it holds in RSS, and none once trim_idle gave it back. A header block over a page would
 * touch more: the account errs low by at most the buffer's other pages. */
static void *ng_realloc(void *p, size_t n, void *user)
{
    h2_sess_t *s = user;
    if (p == NULL && n >= BIG_MIN && s->creating) {
        for (int i = 0; i < NBIG; i++) {
            if (s->big[i].p != NULL)
                continue;
            size_t pg = (size_t)page_size();
            void *q = NULL;
            if (posix_memalign(&q, pg, (n + pg - 1) / pg * pg) != 0)
                return NULL;
            s->big[i].p = q;
            s->big[i].n = n;
            s->big[i].counted = pg;
            pcr_memcount_add(PCR_MEMCOUNT_NGHTTP2, (int64_t)pg);
            return q;
        }
    }
    if (n == 0 && p != NULL) {
        ng_free(p, user); /* what realloc(p, 0) does, counted */
        return NULL;
    }
    int i = big_find(s, p);
    size_t was = i >= 0 ? s->big[i].counted : p != NULL ? malloc_usable_size(p) : 0;
    void *q = realloc(p, n);
    if (q == NULL)
        return NULL; /* p, if any, is as it was */
    size_t now = malloc_usable_size(q);
    pcr_memcount_add(PCR_MEMCOUNT_NGHTTP2, (int64_t)now - (int64_t)was);
    if (i >= 0) {
        s->big[i].p = q;
        s->big[i].n = n;
        s->big[i].counted = now;
    }
    return q;
}

static void *ng_malloc(size_t n, void *user) { return ng_realloc(NULL, n, user); }

static void *ng_calloc(size_t k, size_t n, void *user)
{
    if (n != 0 && k > SIZE_MAX / n)
        return NULL;
    void *p = ng_realloc(NULL, k * n, user);
    if (p != NULL)
        memset(p, 0, k * n);
    return p;
}

static void ng_free(void *p, void *user)
{
    h2_sess_t *s = user;
    if (p == NULL)
        return;
    int i = big_find(s, p);
    size_t was = i >= 0 ? s->big[i].counted : malloc_usable_size(p);
    if (i >= 0)
        s->big[i].p = NULL;
    pcr_memcount_add(PCR_MEMCOUNT_NGHTTP2, -(int64_t)was);
    free(p);
}

/* The session is idle (no stream, nothing to send): the large blocks' whole pages go back to
 * the system. Their bytes are no state of nghttp2's between frames. */
static void trim_idle(h2_sess_t *s)
{
    uintptr_t pg = (uintptr_t)page_size();
    s->trimmed = 1;
    if (s->ng == NULL || nghttp2_session_want_write(s->ng))
        return;
    for (int i = 0; i < NBIG; i++) {
        if (s->big[i].p == NULL)
            continue;
        uintptr_t a = ((uintptr_t)s->big[i].p + pg - 1) / pg * pg;
        uintptr_t b = ((uintptr_t)s->big[i].p + s->big[i].n) / pg * pg;
        if (b > a)
            (void)madvise((void *)a, b - a, MADV_DONTNEED);
    }
}

static void stream_free(h2_stream_t *st)
{
    h2_sess_t *s = st->sess;
    if (st->prev)
        st->prev->next = st->next;
    else
        s->streams = st->next;
    if (st->next)
        st->next->prev = st->prev;
    s->nstreams--;
    if (st->run_queued)
        s->nqueued--;
    if (s->exempt == st)
        s->exempt = NULL;
    s->held -= st->held;
    pcr_exchange_free(st->ex);
    if (st->rst_timer)
        event_free(st->rst_timer);
    if (st->out)
        evbuffer_free(st->out);
    pcr_evmem_free(st);
}

/* ---- response ops -------------------------------------------------------------------- */

#define RST_DELAY_US 50000

static void on_rst_timer(evutil_socket_t fd, short what, void *arg)
{
    h2_stream_t *st = arg;
    nghttp2_submit_rst_stream(st->sess->ng, NGHTTP2_FLAG_NONE, st->id, st->rst_code);
    schedule_flush(st->sess);
}

/* Resets the stream RST_DELAY_US from now: clients (curl among them) drop the frames of a
 * response that reach them in the same read as its stream's RST_STREAM. */
static void rst_later(h2_stream_t *st, uint32_t code)
{
    if (st->rst_timer != NULL)
        return;
    st->rst_code = code;
    st->rst_timer = evtimer_new(st->sess->w->base, on_rst_timer, st);
    struct timeval tv = {0, RST_DELAY_US};
    if (st->rst_timer)
        evtimer_add(st->rst_timer, &tv);
    else
        nghttp2_submit_rst_stream(st->sess->ng, NGHTTP2_FLAG_NONE, st->id, code);
}

/* The response body is not copied into nghttp2's frame buffer: the source says how much goes
 * in the next DATA frame (NGHTTP2_DATA_FLAG_NO_COPY) and on_send_data moves those bytes from
 * st->out to the connection's output, after the frame header. */
static ssize_t on_data_source_read(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                                   uint32_t *flags, nghttp2_data_source *src, void *user)
{
    h2_stream_t *st = src->ptr;
    size_t avail = evbuffer_get_length(st->out);
    size_t n = avail < length ? avail : length;
    if (n > 0) {
        *flags |= NGHTTP2_DATA_FLAG_NO_COPY;
        st->t_progress = pcr_now_us();
    }
    if (st->eof && avail == n) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    } else if (n == 0 && st->abort) {
        /* Everything that arrived went out; the reset follows a moment later. */
        rst_later(st, NGHTTP2_INTERNAL_ERROR);
        st->deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    } else if (n == 0) {
        st->deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    }
    if (n == 0 && st->ex) /* else on_send_data tells, once the bytes left st->out */
        pcr_exchange_on_writable(st->ex);
    return (ssize_t)n;
}

static int on_send_data(nghttp2_session *ng, nghttp2_frame *frame, const uint8_t *framehd,
                        size_t length, nghttp2_data_source *src, void *user)
{
    h2_sess_t *s = user;
    h2_stream_t *st = src->ptr;
    struct evbuffer *out = pcr_sock_output(s->sock);
    size_t pad = frame->data.padlen;
    static const uint8_t zeros[256];
    evbuffer_add(out, framehd, 9);
    if (pad > 0) {
        uint8_t padlen = (uint8_t)(pad - 1);
        evbuffer_add(out, &padlen, 1);
    }
    if (evbuffer_remove_buffer(st->out, out, length) != (int)length)
        return NGHTTP2_ERR_CALLBACK_FAILURE; /* cannot happen: the source measured st->out */
    if (pad > 1)
        evbuffer_add(out, zeros, pad - 1);
    if (st->ex)
        pcr_exchange_on_writable(st->ex);
    return 0;
}

static void op_send_head(pcr_exchange_t *ex, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    h2_stream_t *st = pcr_exchange_session(ex);
    h2_sess_t *s = st->sess;
    nghttp2_nv nva[n + 2];
    char status_str[3], clen_str[20];
    size_t k = 0;
    /* HTTP/2 wants lower-case names; upstream may send any case. */
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += h[i].name_len;
    char stack_names[2048];
    char *names = total < sizeof(stack_names) ? stack_names : malloc(total + 1);
    status_str[0] = (char)('0' + status / 100 % 10); /* 100-599: ours, or checked */
    status_str[1] = (char)('0' + status / 10 % 10);
    status_str[2] = (char)('0' + status % 10);
    nva[k++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)status_str, 7, 3, NGHTTP2_NV_FLAG_NONE};
    size_t off = 0;
    for (size_t i = 0; i < n && names != NULL; i++) {
        for (size_t j = 0; j < h[i].name_len; j++) {
            unsigned char c = (unsigned char)h[i].name[j];
            names[off + j] = (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
        }
        nva[k++] = (nghttp2_nv){(uint8_t *)names + off, (uint8_t *)h[i].value, h[i].name_len,
                                h[i].value_len, NGHTTP2_NV_FLAG_NONE};
        off += h[i].name_len;
    }
    if (clen >= 0) {
        size_t l = pcr_http_put_dec(clen_str, (uint64_t)clen);
        nva[k++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)clen_str, 14, l,
                                NGHTTP2_NV_FLAG_NONE};
    }
    nghttp2_data_provider prd = {.source.ptr = st, .read_callback = on_data_source_read};
    int rc = nghttp2_submit_response(s->ng, st->id, nva, k, st->head_only ? NULL : &prd);
    st->submitted = rc == 0 && !st->head_only;
    if (names != stack_names)
        free(names);
    if (rc != 0)
        pcr_log_warn("h2 stream %d: cannot submit response: %s", st->id, nghttp2_strerror(rc));
    schedule_flush(s);
}

static void resume(h2_stream_t *st)
{
    if (st->deferred) {
        st->deferred = 0;
        nghttp2_session_resume_data(st->sess->ng, st->id);
    }
    schedule_flush(st->sess);
}

static void op_send_body(pcr_exchange_t *ex, const char *data, size_t len)
{
    h2_stream_t *st = pcr_exchange_session(ex);
    if (st->head_only)
        return;
    if (evbuffer_get_length(st->out) == 0)
        st->t_progress = pcr_now_us(); /* the write deadline counts from here */
    evbuffer_add(st->out, data, len);
    resume(st);
}

static void op_send_end(pcr_exchange_t *ex)
{
    h2_stream_t *st = pcr_exchange_session(ex);
    st->eof = 1;
    resume(st);
}

static void op_send_abort(pcr_exchange_t *ex)
{
    h2_stream_t *st = pcr_exchange_session(ex);
    if (st->submitted) {
        st->abort = 1; /* the data source sends what is queued, then resets */
        resume(st);
        return;
    }
    nghttp2_submit_rst_stream(st->sess->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
    schedule_flush(st->sess);
}

static size_t op_pending(pcr_exchange_t *ex)
{
    h2_stream_t *st = pcr_exchange_session(ex);
    return evbuffer_get_length(st->out);
}

static const pcr_exchange_ops_t h2_ops = {op_send_head, op_send_body, op_send_end, op_send_abort,
                                          op_pending};

/* ---- flow control against the body budget -------------------------------------------- */

/* The reservation the session needs with `extra` more bytes of connection window given back:
 * what it holds and what the client may still send, past the allowance. */
static size_t reserve_need(const h2_sess_t *s, size_t extra)
{
    size_t total = s->held + s->window + extra;
    return total > PCR_BODY_ALLOWANCE ? total - PCR_BODY_ALLOWANCE : 0;
}

/* Reserves what giving `extra` bytes back to the connection window needs (reserve_need).
 * `req` asks (budget.h); NULL forces it (bytes the session must give back, bounded by the
 * windows). Returns what pcr_budget_reserve does (1 when nothing more was needed). */
static int reserve_for(h2_sess_t *s, size_t extra, const void *req)
{
    size_t need = reserve_need(s, extra);
    if (need <= s->reserved)
        return 1;
    size_t n = need - s->reserved;
    int rc = 1;
    if (req == NULL)
        pcr_budget_force(s->w, n);
    else if ((rc = pcr_budget_reserve(s->w, req, n)) == 0)
        return 0;
    s->reserved += n;
    return rc;
}

/* Gives bytes back to the client's windows: `sn` to stream `id`'s, `cn` to the connection's
 * (reserved first, reserve_for). */
static void give_back(h2_sess_t *s, int32_t id, size_t sn, size_t cn)
{
    if (sn > 0)
        nghttp2_session_consume_stream(s->ng, id, sn);
    if (cn > 0) {
        nghttp2_session_consume_connection(s->ng, cn);
        s->window += cn;
    }
}

/* What the session reserved past what it needs goes back: its streams' bodies were freed. */
static void reserved_trim(h2_sess_t *s)
{
    size_t need = reserve_need(s, 0);
    if (s->reserved > need) {
        pcr_budget_release(s->w, s->reserved - need);
        s->reserved = need;
    }
}

/* Whether the stream's `n` held bytes may go back to the client's windows: the budget for them
 * was reserved. When the stream becomes the request allowed past the budget, the connection
 * window its session holds for the other streams is given back, or the client could not send
 * it a byte (those streams' own windows stay shut). */
static int stream_may_grow(h2_sess_t *s, h2_stream_t *st, size_t n)
{
    if (s->exempt != NULL && s->exempt != st) {
        /* The connection window goes back whatever the others send (below): what they may
         * send is bounded by their stream windows only, so each opening of one takes budget
         * of its own, never room the session already reserved. */
        if (pcr_budget_reserve(s->w, st->ex, n) == 0)
            return 0;
        s->reserved += n;
        return 1;
    }
    int rc = reserve_for(s, n, st->ex);
    if (rc == 0)
        return 0;
    if (rc == 2 && s->exempt != st) {
        s->exempt = st;
        for (h2_stream_t *o = s->streams; o != NULL; o = o->next) {
            if (o->conn_held == 0)
                continue;
            reserve_for(s, o->conn_held, NULL);
            give_back(s, o->id, 0, o->conn_held);
            o->conn_held = 0;
        }
    }
    return 1;
}

/* Whether a stream of the session waits for budget: a newer one asking then waits behind it. */
static int any_waiting(const h2_sess_t *s)
{
    for (const h2_stream_t *st = s->streams; st != NULL; st = st->next)
        if (st->unconsumed > 0 && !st->rejected)
            return 1;
    return 0;
}

/* Gives DATA bytes back to the client's windows, to the streams whose bodies may grow, oldest
 * first: budget goes to the bodies begun first, which then complete, rather than being spread
 * over partial bodies none of which can (the list is newest first). */
static void consume_pending(h2_sess_t *s)
{
    int wait = 0;
    h2_stream_t *last = s->streams;
    while (last != NULL && last->next != NULL)
        last = last->next;
    for (h2_stream_t *st = last; st != NULL; st = st->prev) {
        if (st->unconsumed == 0 || st->rejected)
            continue;
        /* Reserved for what the stream may send on the window given back, not only for the
         * connection's: in the session of the request past the budget, the connection
         * window was given back without reserving, and only stream windows bound it. */
        if (!stream_may_grow(s, st, st->unconsumed)) {
            wait = 1;
            continue;
        }
        give_back(s, st->id, st->unconsumed, st->conn_held);
        st->unconsumed = st->conn_held = 0;
    }
    if (wait)
        pcr_budget_wait(s->w, &s->budget);
}

static void budget_resume(pcr_budget_waiter_t *w)
{
    h2_sess_t *s = (h2_sess_t *)((char *)w - offsetof(h2_sess_t, budget));
    consume_pending(s);
    flush_now(s);
}

/* ---- nghttp2 callbacks --------------------------------------------------------------- */

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    h2_sess_t *s = user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST ||
        s->waking)
        return 0;
    h2_stream_t *st = pcr_evmem_calloc(1, sizeof(*st)); /* per request: evmem.h */
    if (st == NULL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    st->id = frame->hd.stream_id;
    st->sess = s;
    st->out = evbuffer_new();
    st->ex = pcr_exchange_new(s->w, &h2_ops, st, "HTTP/2");
    st->t_begin = st->t_recv = pcr_now_us();
    st->next = s->streams;
    if (s->streams)
        s->streams->prev = st;
    s->streams = st;
    s->nstreams++;
    if (st->out == NULL || st->ex == NULL) {
        stream_free(st);
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* nghttp2 resets the stream */
    }
    pcr_exchange_set_client(st->ex, pcr_sock_peer(s->sock), pcr_sock_admin(s->sock),
                            &s->base.load);
    nghttp2_session_set_stream_user_data(ng, st->id, st);
    s->trimmed = 0;
    if (s->sock_idle) {
        s->sock_idle = 0;
        pcr_sock_idle(s->sock, 0);
    }
    if (s->nstreams == 1) {
        pcr_session_set_waiting(&s->base, 0);
        arm_timer(s);
    }
    return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *frame, const uint8_t *name, size_t nlen,
                     const uint8_t *value, size_t vlen, uint8_t flags, void *user)
{
    h2_sess_t *s = user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (st == NULL || st->reject_status)
        return 0;
    st->header_bytes += nlen + vlen;
    if (st->header_bytes > s->w->cfg->limits.max_header_bytes) {
        st->reject_status = 431;
        return 0;
    }
    const char *n = (const char *)name, *v = (const char *)value;
    if (nlen == 7 && memcmp(n, ":method", 7) == 0) {
        if (pcr_exchange_set_method(st->ex, v, vlen) < 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        st->head_only = vlen == 4 && memcmp(v, "HEAD", 4) == 0;
    } else if (nlen == 5 && memcmp(n, ":path", 5) == 0) {
        if (pcr_exchange_set_path(st->ex, v, vlen) < 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    } else if (nlen > 0 && n[0] != ':') {
        if (nlen == 14 && memcmp(n, "content-length", 14) == 0 &&
            strtoull(v, NULL, 10) > s->w->cfg->limits.max_body_bytes)
            st->reject_status = 413;
        /* nghttp2 has already refused invalid names and values (RFC 9113, 8.2.1). */
        if (pcr_exchange_add_header(st->ex, n, nlen, v, vlen) == PCR_ERR_TOO_LARGE)
            st->reject_status = 431;
    }
    return 0;
}

static void reject(h2_stream_t *st)
{
    h2_sess_t *s = st->sess;
    st->rejected = 1;
    if (st->reject_status == 503) {
        st->shed = 1;
        pcr_exchange_overload_refused(st->ex);
    } else if (st->reject_status == 413)
        pcr_exchange_error(st->ex, 413, "invalid_request_error", "body_too_large",
                           "request body is larger than limits.max_body_bytes (%zu bytes)",
                           s->w->cfg->limits.max_body_bytes);
    else
        pcr_exchange_error(st->ex, 431, "invalid_request_error", "headers_too_large",
                           "request headers are larger than limits.max_header_bytes (%zu bytes)",
                           s->w->cfg->limits.max_header_bytes);
}

/* A stream that waits for budget while the memory account refuses requests (budget.h, `shed`)
 * gets its 503 at once (on_data_chunk) or at the worker's tick (budget_shed), its body freed
 * and the connection window it held given back (nothing is held for it any more, so that
 * needs no budget); the one allowed past the budget goes on. */
static int shed_due(const h2_sess_t *s, h2_stream_t *st)
{
    return st != s->exempt && !pcr_budget_exempt(s->w, st->ex) && pcr_exchange_overloaded(st->ex);
}

static void shed_stream(h2_sess_t *s, h2_stream_t *st)
{
    pcr_exchange_drop_body(st->ex);
    s->held -= st->held;
    st->held = 0;
    give_back(s, 0, 0, st->conn_held);
    st->conn_held = 0;
    st->reject_status = 503;
    reject(st);
}

static void budget_shed(pcr_budget_waiter_t *w)
{
    h2_sess_t *s = (h2_sess_t *)((char *)w - offsetof(h2_sess_t, budget));
    int wait = 0;
    for (h2_stream_t *st = s->streams; st != NULL; st = st->next) {
        if (st->unconsumed == 0 || st->rejected || pcr_exchange_running(st->ex))
            continue;
        if (!shed_due(s, st)) {
            wait = 1;
            continue;
        }
        shed_stream(s, st);
    }
    reserved_trim(s);
    if (wait)
        pcr_budget_wait(s->w, &s->budget);
    schedule_flush(s);
}

/* HEADERS opening a stream must carry an id above every earlier one; one below the highest,
 * for a stream never opened, is a PROTOCOL_ERROR for the connection (nghttp2 only ignores it,
 * as it cannot tell such an id from a stream it has forgotten). */
static int on_begin_frame(nghttp2_session *ng, const nghttp2_frame_hd *hd, void *user)
{
    h2_sess_t *s = user;
    int32_t id = hd->stream_id;
    if (hd->type != NGHTTP2_HEADERS || id <= 0 || (id & 1) == 0 || s->waking)
        return 0; /* even or zero ids: nghttp2's own checks */
    if (id > s->max_opened) {
        if (s->opened == NULL && (s->opened = malloc(OPENED_RING * sizeof(int32_t))) == NULL)
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        unsigned slot = s->nopened++ % OPENED_RING;
        if (s->nopened > OPENED_RING)
            s->opened_floor = s->opened[slot];
        s->opened[slot] = id;
        s->max_opened = id;
        return 0;
    }
    if (id <= s->opened_floor || nghttp2_session_find_stream(ng, id) != NULL)
        return 0;
    unsigned n = s->nopened < OPENED_RING ? s->nopened : OPENED_RING;
    for (unsigned i = 0; i < n; i++)
        if (s->opened[i] == id)
            return 0;
    pcr_log_debug("client %s: h2 HEADERS opening stream %d after stream %d", pcr_sock_peer(s->sock),
                  id, s->max_opened);
    return NGHTTP2_ERR_CALLBACK_FAILURE;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    h2_sess_t *s = user;
    if (frame->hd.type == NGHTTP2_SETTINGS && !s->waking) {
        /* What hibernation needs to know of SETTINGS that nghttp2 does not tell. */
        if (frame->hd.flags & NGHTTP2_FLAG_ACK)
            s->settings_acked = 1;
        else
            s->settings_seen = 1;
        for (size_t i = 0; !(frame->hd.flags & NGHTTP2_FLAG_ACK) && i < frame->settings.niv; i++)
            if (frame->settings.iv[i].settings_id == NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES)
                s->no_rfc7540_prio = frame->settings.iv[i].value;
        /* A client whose streams start with no window can take no answer byte until it opens
         * one: the pools rank it last and never lend it their reserve (pcr/connshare.h). */
        if (!(frame->hd.flags & NGHTTP2_FLAG_ACK))
            s->base.load.blind = nghttp2_session_get_remote_settings(
                                     ng, NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE) == 0;
    }
    if (frame->hd.type == NGHTTP2_WINDOW_UPDATE && frame->hd.stream_id != 0)
        s->base.load.blind = 0;
    if (frame->hd.type == NGHTTP2_GOAWAY)
        s->goaway = 1;
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (st == NULL)
        return 0;
    /* DATA bytes count as progress in on_data_chunk; an empty DATA frame is none (a flood of
     * them must not keep a request that sends nothing from its 408). */
    if (frame->hd.type == NGHTTP2_HEADERS) {
        st->t_recv = pcr_now_us();
        st->headers_done = 1;
        /* A new stream while memory is short: refused before its body is taken. */
        if (!st->reject_status && pcr_exchange_overloaded(st->ex))
            st->reject_status = 503;
    }
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
        st->req_done = 1;
    if (st->reject_status && !st->rejected) {
        reject(st);
        return 0;
    }
    if (st->req_done && !st->rejected && !pcr_exchange_running(st->ex) && !st->run_queued) {
        st->run_queued = 1; /* run_queued() */
        st->sess->nqueued++;
    }
    return 0;
}

/* Runs the requests completed by the read just processed. Not from on_frame_recv: a stream the
 * same read resets (rapid reset sends HEADERS, DATA and RST_STREAM together) is then closed
 * before anything was sent to a pod for it. */
static void run_queued(h2_sess_t *s)
{
    if (s->nqueued == 0)
        return;
    s->nqueued = 0;
    h2_stream_t *st = s->streams;
    while (st != NULL && st->next != NULL)
        st = st->next; /* the oldest: requests run in the order they came */
    for (; st != NULL; st = st->prev) {
        if (!st->run_queued)
            continue;
        st->run_queued = 0;
        if (!st->rejected && !pcr_exchange_running(st->ex))
            pcr_exchange_run(st->ex);
    }
}

static void hold_release(h2_hold_t *h)
{
    if (h != NULL && --h->refs == 0) {
        evbuffer_free(h->buf);
        pcr_evmem_free(h);
    }
}

static void hold_unref(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    hold_release(arg);
}

/* Adds a DATA piece to the request's body: by reference into the read chain when it is long
 * enough (see PCR_BODY_TAKE_MIN), else copied. */
static int add_data(h2_sess_t *s, h2_stream_t *st, const uint8_t *data, size_t len)
{
    int by_ref = len >= PCR_BODY_TAKE_MIN && s->seg != NULL && data >= s->seg &&
                 len <= s->seg_len && (size_t)(data - s->seg) <= s->seg_len - len &&
                 (s->hold != NULL || len >= s->seg_len / 4);
    if (!by_ref)
        return pcr_exchange_add_body(st->ex, (const char *)data, len);
    int rc = pcr_exchange_see_body(st->ex, (const char *)data, len);
    if (rc != 0)
        return rc;
    if (s->hold == NULL) {
        h2_hold_t *h = pcr_evmem_malloc(sizeof(*h));
        struct evbuffer *in = pcr_sock_input(s->sock), *buf = h != NULL ? evbuffer_new() : NULL;
        /* The chain is the input's first, whole: moving it moves a pointer, not the bytes. */
        if (buf == NULL || evbuffer_remove_buffer(in, buf, s->seg_len) != (int)s->seg_len) {
            /* A first chain is moved whole or not at all: on failure its bytes are still in
             * `in`, and this piece is copied from them. */
            if (buf != NULL)
                evbuffer_free(buf);
            pcr_evmem_free(h);
            return evbuffer_add(pcr_exchange_body(st->ex), data, len) == 0 ? 0 : PCR_ERR_NOMEM;
        }
        h->buf = buf;
        h->refs = 1; /* on_read's, until nghttp2 has read the chain */
        s->hold = h;
    }
    if (evbuffer_add_reference(pcr_exchange_body(st->ex), data, len, hold_unref, s->hold) != 0)
        return PCR_ERR_NOMEM;
    s->hold->refs++;
    return 0;
}

static int on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *user)
{
    h2_sess_t *s = user;
    h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, id);
    /* The bytes came out of the connection window (nghttp2 checked they fit it). */
    s->window = s->window > len ? s->window - len : 0;
    if (st == NULL || st->reject_status || pcr_exchange_running(st->ex)) {
        /* Dropped: the windows are given back at once, which needs no budget (nothing held). */
        give_back(s, id, len, len);
        return 0;
    }
    st->t_recv = pcr_now_us();
    /* A body not begun while memory is short (refuse_requests, pcr/overload.h) is refused as a
     * new request is, its bytes dropped rather than held: otherwise every stream admitted
     * before the account crossed brings up to its connection's allowance whatever the limit,
     * 64 KiB times the connections. A body already begun goes on. */
    if (st->held == 0 && len > 0 && pcr_exchange_overloaded(st->ex)) {
        give_back(s, id, len, len);
        st->reject_status = 503;
        reject(st);
        return 0;
    }
    int rc = add_data(s, st, data, len);
    if (rc == PCR_ERR_TOO_LARGE) {
        give_back(s, id, len, len);
        st->reject_status = 413;
        reject(st);
        return 0;
    }
    if (rc == 0) {
        st->held += len;
        s->held += len;
    }
    if (st->unconsumed == 0 && (st == s->exempt || !any_waiting(s)) &&
        stream_may_grow(s, st, len)) {
        give_back(s, id, len, len);
    } else if (shed_due(s, st)) {
        /* It would wait for budget while memory is short: refused now, as at the tick. */
        give_back(s, id, len, len);
        shed_stream(s, st);
        reserved_trim(s);
    } else {
        st->unconsumed += len;
        if (s->exempt != NULL) {
            reserve_for(s, len, NULL); /* see stream_may_grow */
            give_back(s, id, 0, len);
        } else {
            st->conn_held += len;
        }
        pcr_budget_wait(s->w, &s->budget);
    }
    return 0;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    /* The response ended while the client is still sending (an early 408 or 413): the rest of
     * its request will not be read, so the stream is reset (RFC 9113, 8.1), a moment later so
     * that the client reads the response first. */
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        return 0;
    h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (st != NULL && !st->req_done)
        rst_later(st, NGHTTP2_NO_ERROR);
    return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t error_code, void *user)
{
    h2_sess_t *s = user;
    h2_stream_t *st = nghttp2_session_get_stream_user_data(ng, id);
    if (st == NULL)
        return 0;
    nghttp2_session_set_stream_user_data(ng, id, NULL);
    /* Refused for memory (reject): once its 503 is out, GOAWAY, so that the connection ends
     * when its other streams are answered, as an HTTP/1.1 connection does after a 503, and
     * its session's memory goes with it. */
    int shed = st->shed && !s->goaway;
    /* Its bytes are freed below, more than the window given back: no budget needed. */
    give_back(s, 0, 0, st->conn_held);
    /* A reset by the client, or the natural end: either way the exchange ends here; if its
     * upstream request is still running it is closed, so the pod stops generating. */
    stream_free(st);
    reserved_trim(s);
    if (shed)
        (void)goaway(s); /* awake: it cannot fail */
    if (s->nstreams == 0) {
        pcr_session_set_waiting(&s->base, 1);
        arm_timer(s);
    }
    pcr_worker_check_drained(s->w);
    return 0;
}

/* ---- deadlines ----------------------------------------------------------------------- */

static unsigned tick_ms(const pcr_timeouts_conf_t *t)
{
    unsigned m = t->client_write_ms;
    if (t->request_header_ms < m)
        m = t->request_header_ms;
    if (t->client_idle_ms < m)
        m = t->client_idle_ms;
    m /= 4;
    return m < 50 ? 50 : m > 1000 ? 1000 : m;
}

/* With streams, the tick; without, the idle timeout, counted from the last stream's end (no
 * other frame moves it), and IDLE_TRIM_MS before it the trim or hibernation (on_timer). */
static void arm_timer(h2_sess_t *s)
{
    const pcr_timeouts_conf_t *t = &s->w->cfg->timeouts;
    unsigned ms = tick_ms(t);
    if (s->nstreams > 0) {
        s->idle_close_us = 0;
    } else {
        uint64_t now = pcr_now_us();
        if (s->idle_close_us == 0)
            s->idle_close_us = now + (uint64_t)t->client_idle_ms * 1000;
        uint64_t left = s->idle_close_us > now ? (s->idle_close_us - now + 999) / 1000 : 0;
        ms = left > UINT_MAX ? UINT_MAX : (unsigned)left;
        if (!s->trimmed && !s->lingering && ms > IDLE_TRIM_MS)
            ms = IDLE_TRIM_MS; /* on_timer trims, then waits for the rest of the idle time */
    }
    struct timeval tv = pcr_ms_to_tv(ms);
    evtimer_add(s->timer, &tv);
}

/* The body stalled for `ms`: 503 when it was the router that kept a window shut (no budget:
 * the stream's own, or the connection's while the session waits), else 408. */
static void stream_timeout(h2_stream_t *st, unsigned ms)
{
    st->rejected = 1;
    int shut = st->unconsumed > 0 || st->sess->budget.queued;
    for (const h2_stream_t *o = st->sess->streams; o != NULL && !shut; o = o->next)
        shut = o->conn_held > 0;
    if (shut) {
        st->reject_status = 503;
        pcr_exchange_budget_refused(st->ex);
        return;
    }
    st->reject_status = 408;
    PCR_INC(st->sess->w->metrics.request_timeouts);
    pcr_exchange_error(st->ex, 408, "invalid_request_error", "request_timeout",
                       "no byte of the request body arrived for %u ms (timeouts.client_idle_ms)", ms);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    h2_sess_t *s = arg;
    const pcr_timeouts_conf_t *t = &s->w->cfg->timeouts;
    if (s->nstreams == 0 && !s->lingering && !s->trimmed && s->idle_close_us > pcr_now_us()) {
        if (!hibernate(s))
            trim_idle(s);
        if (!s->sock_idle) {
            s->sock_idle = 1; /* its buffers go while nothing is read or written */
            pcr_sock_idle(s->sock, 1);
        }
        arm_timer(s); /* the rest of the idle time */
        flush_now(s);
        return;
    }
    if (s->nstreams == 0 || s->lingering) {
        h2_close(s); /* idle past client_idle_ms with no stream open, or the linger is over */
        return;
    }
    uint64_t now = pcr_now_us();
    for (h2_stream_t *st = s->streams; st != NULL; st = st->next) {
        if (!pcr_exchange_running(st->ex) && !st->rejected) {
            if (!st->headers_done && now - st->t_begin >= (uint64_t)t->request_header_ms * 1000) {
                /* A header block is contiguous on the connection (CONTINUATION frames follow
                 * their HEADERS at once), so one left unfinished stalls the whole connection:
                 * there is no stream to answer 408 on, only a connection to close. */
                PCR_INC(s->w->metrics.request_timeouts);
                pcr_log_debug("client %s: h2 header block not complete within %u ms",
                              pcr_sock_peer(s->sock), t->request_header_ms);
                h2_close(s);
                return;
            }
            if (st->headers_done && now - st->t_recv >= (uint64_t)t->client_idle_ms * 1000)
                stream_timeout(st, t->client_idle_ms);
        } else if (evbuffer_get_length(st->out) > 0 && !st->abort &&
                   now - st->t_progress >= (uint64_t)t->client_write_ms * 1000 &&
                   (nghttp2_session_get_stream_remote_window_size(s->ng, st->id) <= 0 ||
                    nghttp2_session_get_remote_window_size(s->ng) <= 0)) {
            /* A zero window: the client takes nothing. Reset the stream; closing it frees the
             * exchange and cancels the pod request, which gives its connection back. With the
             * windows open, what stalls is the socket: the connection's own write deadline
             * (on_end) closes it and counts it, once. */
            PCR_INC(s->w->metrics.write_timeouts);
            pcr_log_info("client %s, h2 stream %d: no response bytes accepted for %u ms: reset",
                         pcr_sock_peer(s->sock), st->id, t->client_write_ms);
            /* Its next streams count as a heavy client's in the pools (pcr/connshare.h). */
            s->base.load.slow_us = now;
            st->abort = 1;
            nghttp2_submit_rst_stream(s->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
        }
    }
    arm_timer(s);
    flush_now(s);
}

/* ---- the session's nghttp2, and hibernation ------------------------------------------- */

/* Makes the session's nghttp2 and queues our SETTINGS: at the start, and again at a wake
 * (`wake`: the client's preface was read long ago). Our SETTINGS carry HEADER_TABLE_SIZE 0
 * and our deflater keeps no table either: no HPACK state outlives a header block, so a
 * session freed while idle loses none (hibernate). */
static int ng_make(h2_sess_t *s, int wake)
{
    nghttp2_session_callbacks *cbs = NULL;
    nghttp2_option *opt = NULL;
    int rc = NGHTTP2_ERR_NOMEM;
    if (nghttp2_session_callbacks_new(&cbs) != 0 || nghttp2_option_new(&opt) != 0)
        goto out;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_begin_frame_callback(cbs, on_begin_frame);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_send_data_callback(cbs, on_send_data);
    /* Request bodies are buffered against a process-wide budget: windows are given back by
     * hand (consume_pending), never automatically. */
    nghttp2_option_set_no_auto_window_update(opt, 1);
    /* Closed streams are not kept for the priority tree (which the router does not use): an
     * idle connection holds no stream of its last request. */
    nghttp2_option_set_no_closed_streams(opt, 1);
    nghttp2_option_set_max_deflate_dynamic_table_size(opt, 0);
    if (wake)
        nghttp2_option_set_no_recv_client_magic(opt, 1);
    s->mem = (nghttp2_mem){s, ng_malloc, ng_free, ng_calloc, ng_realloc};
    s->creating = 1;
    rc = nghttp2_session_server_new3(&s->ng, cbs, s, opt, &s->mem);
    s->creating = 0;
    if (rc == 0) {
        nghttp2_settings_entry iv[] = {
            {NGHTTP2_SETTINGS_HEADER_TABLE_SIZE, 0},
            {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, s->max_streams},
            /* As the connection's: a stream may use the whole allowance (budget.h). */
            {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, PCR_BODY_ALLOWANCE},
            {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, s->max_header_list},
        };
        rc = nghttp2_submit_settings(s->ng, NGHTTP2_FLAG_NONE, iv, PCR_ARRAY_SIZE(iv));
    }
out:
    if (cbs)
        nghttp2_session_callbacks_del(cbs);
    if (opt)
        nghttp2_option_del(opt);
    return rc;
}

/* Moves what nghttp2 has to send to the socket's output (to `out`, or dropped when NULL). */
static int ng_send_all(nghttp2_session *ng, struct evbuffer *out)
{
    const uint8_t *data;
    ssize_t n;
    while ((n = nghttp2_session_mem_send(ng, &data)) > 0)
        if (out != NULL)
            evbuffer_add(out, data, (size_t)n);
    return n < 0 ? -1 : 0;
}

static const int32_t remote_ids[PCR_ARRAY_SIZE(((h2_sess_t *)0)->remote)] = {
    NGHTTP2_SETTINGS_HEADER_TABLE_SIZE,    NGHTTP2_SETTINGS_ENABLE_PUSH,
    NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE,
    NGHTTP2_SETTINGS_MAX_FRAME_SIZE,       NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
    NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL,
};

/* How many requests wake() replays: one on the client's highest stream id, and more below it
 * when the DATA that brings the connection window down to what it was needs more than one
 * stream window (at most WAKE_STREAMS; 0: it cannot be done). */
#define WAKE_STREAMS 16
static unsigned wake_streams(int32_t max_opened, uint32_t stream_win, size_t deficit)
{
    if (max_opened <= 0)
        return 0;
    size_t k = deficit == 0 ? 1 : stream_win == 0 ? SIZE_MAX : (deficit + stream_win - 1) / stream_win;
    size_t ids = ((size_t)max_opened + 1) / 2; /* odd ids up to max_opened */
    return k <= WAKE_STREAMS && k <= ids ? (unsigned)k : 0;
}

/* An idle session (no stream, nothing to send, every SETTINGS acknowledged, no GOAWAY) frees
 * its nghttp2 and keeps only what wake() needs to make one the client cannot tell from it:
 * the client's SETTINGS, the window we may still send on, and the highest stream id it used
 * (max_opened). Its own window is whole once what the client sent was given back, and neither
 * HPACK table holds anything (ng_make). Returns 1 when it did; nghttp2's output went to the
 * socket either way. */
static int hibernate(h2_sess_t *s)
{
    nghttp2_session *ng = s->ng;
    struct evbuffer *out = pcr_sock_output(s->sock);
    if (ng == NULL || out == NULL || s->nstreams > 0 || s->closing || s->lingering || s->goaway ||
        s->w->draining || !s->settings_acked || !s->settings_seen || s->in_left > 0 || s->in_hd > 0)
        return 0;
    /* Window the client used and we gave back, below the size nghttp2 sends an update at. */
    int32_t owed = nghttp2_session_get_effective_recv_data_length(ng);
    if (owed > 0 && nghttp2_submit_window_update(ng, NGHTTP2_FLAG_NONE, 0, owed) != 0)
        return 0;
    int rc = ng_send_all(ng, out);
    if (evbuffer_get_length(out) > 0)
        pcr_sock_flush(s->sock);
    if (rc != 0 || nghttp2_session_want_write(ng) || !nghttp2_session_want_read(ng) ||
        nghttp2_session_get_local_window_size(ng) != PCR_BODY_ALLOWANCE ||
        nghttp2_session_get_effective_local_window_size(ng) != PCR_BODY_ALLOWANCE ||
        nghttp2_session_get_hd_inflate_dynamic_table_size(ng) != 0 ||
        nghttp2_session_get_hd_deflate_dynamic_table_size(ng) != 0)
        return 0;
    /* A remote window below its initial size is made again by sending the missing bytes on
     * wake's replayed streams, within the client's stream window each (wake_streams). */
    int32_t rw = nghttp2_session_get_remote_window_size(ng);
    uint32_t stream_win = nghttp2_session_get_remote_settings(ng, NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE);
    if (rw < 0 || (rw < NGHTTP2_INITIAL_CONNECTION_WINDOW_SIZE &&
                   wake_streams(s->max_opened, stream_win,
                                (size_t)(NGHTTP2_INITIAL_CONNECTION_WINDOW_SIZE - rw)) == 0))
        return 0;
    for (size_t i = 0; i < PCR_ARRAY_SIZE(remote_ids); i++)
        s->remote[i] = nghttp2_session_get_remote_settings(ng, remote_ids[i]);
    s->remote_window = rw;
    nghttp2_session_del(ng);
    s->ng = NULL;
    free(s->opened);
    s->opened = NULL;
    s->nopened = 0;
    s->opened_floor = 0; /* after a wake, every id up to max_opened is refused (on_begin_frame) */
    s->hibernated = 1;
    s->trimmed = 1;
    PCR_INC(s->w->metrics.h2_hibernations);
    PCR_INC(s->w->metrics.h2_hibernated);
    return 1;
}

static ssize_t wake_data_read(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                              uint32_t *flags, nghttp2_data_source *src, void *user)
{
    h2_sess_t *s = user;
    size_t n = s->wake_data < length ? s->wake_data : length;
    memset(buf, 0, n);
    s->wake_data -= n;
    if (s->wake_data == 0)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static size_t put_frame_hd(uint8_t *p, size_t len, uint8_t type, uint8_t flags, int32_t id)
{
    p[0] = (uint8_t)(len >> 16);
    p[1] = (uint8_t)(len >> 8);
    p[2] = (uint8_t)len;
    p[3] = type;
    p[4] = flags;
    p[5] = (uint8_t)((uint32_t)id >> 24 & 0x7f);
    p[6] = (uint8_t)((uint32_t)id >> 16);
    p[7] = (uint8_t)((uint32_t)id >> 8);
    p[8] = (uint8_t)id;
    return 9;
}

/* Makes a hibernated session's nghttp2 again, before the client's next bytes: a new server
 * session is fed what brings it to the state hibernate() left, and what it answers is dropped
 * (the client had it long ago): the client's SETTINGS, the acknowledgement of ours, a request
 * on the highest stream id the client used (so that nghttp2 takes no lower id as new, and so
 * that its HPACK decoder, whose table is 0, expects no size update; its empty header block
 * says so), answered with as many DATA bytes as the connection window lacks, and a
 * WINDOW_UPDATE for what it has in excess. Returns 0, or -1 (the session is to close). */
static int wake(h2_sess_t *s)
{
    if (!s->hibernated)
        return 0;
    s->hibernated = 0;
    PCR_STORE(s->w->metrics.h2_hibernated, PCR_LOAD(s->w->metrics.h2_hibernated) - 1);
    if (ng_make(s, 1) != 0 || ng_send_all(s->ng, NULL) != 0)
        return -1;
    uint8_t buf[160], hd[9 + 64];
    size_t len = 0, nhd = 0;
    nghttp2_settings_entry iv[PCR_ARRAY_SIZE(remote_ids) + 1];
    size_t niv = 0;
    for (size_t i = 0; i < PCR_ARRAY_SIZE(remote_ids); i++)
        if (remote_ids[i] != NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL || s->remote[i] != 0)
            iv[niv++] = (nghttp2_settings_entry){remote_ids[i], s->remote[i]};
    if (s->no_rfc7540_prio != 0)
        iv[niv++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, s->no_rfc7540_prio};
    ssize_t n = nghttp2_pack_settings_payload(buf + 9, sizeof(buf) - 9, iv, niv);
    if (n < 0)
        return -1;
    put_frame_hd(buf, (size_t)n, NGHTTP2_SETTINGS, NGHTTP2_FLAG_NONE, 0);
    len = 9 + (size_t)n;
    len += put_frame_hd(buf + len, 0, NGHTTP2_SETTINGS, NGHTTP2_FLAG_ACK, 0);
    int32_t rw = s->remote_window;
    if (rw > NGHTTP2_INITIAL_CONNECTION_WINDOW_SIZE) {
        uint32_t inc = (uint32_t)(rw - NGHTTP2_INITIAL_CONNECTION_WINDOW_SIZE);
        len += put_frame_hd(buf + len, 4, NGHTTP2_WINDOW_UPDATE, NGHTTP2_FLAG_NONE, 0);
        buf[len++] = (uint8_t)(inc >> 24 & 0x7f);
        buf[len++] = (uint8_t)(inc >> 16);
        buf[len++] = (uint8_t)(inc >> 8);
        buf[len++] = (uint8_t)inc;
    }
    size_t deficit = rw < NGHTTP2_INITIAL_CONNECTION_WINDOW_SIZE
                         ? (size_t)(NGHTTP2_INITIAL_CONNECTION_WINDOW_SIZE - rw) : 0;
    uint32_t stream_win = s->remote[3]; /* INITIAL_WINDOW_SIZE */
    unsigned k = wake_streams(s->max_opened, stream_win, deficit);
    if (s->max_opened > 0) {
        /* The request's block, from a deflater whose table is 0 as the client's must be now:
         * it opens with the size update. */
        nghttp2_hd_deflater *d = NULL;
        const nghttp2_nv nva[] = {
            {(uint8_t *)":method", (uint8_t *)"GET", 7, 3, NGHTTP2_NV_FLAG_NONE},
            {(uint8_t *)":scheme", (uint8_t *)"https", 7, 5, NGHTTP2_NV_FLAG_NONE},
            {(uint8_t *)":path", (uint8_t *)"/", 5, 1, NGHTTP2_NV_FLAG_NONE},
            {(uint8_t *)":authority", (uint8_t *)"h", 10, 1, NGHTTP2_NV_FLAG_NONE},
        };
        ssize_t b = -1;
        if (k > 0 && nghttp2_hd_deflate_new(&d, 0) == 0)
            b = nghttp2_hd_deflate_hd(d, hd + 9, sizeof(hd) - 9, nva, PCR_ARRAY_SIZE(nva));
        nghttp2_hd_deflate_del(d);
        if (b < 0)
            return -1;
        nhd = 9 + (size_t)b;
    }
    s->waking = 1;
    int ok = nghttp2_session_mem_recv(s->ng, buf, len) == (ssize_t)len;
    /* The requests, one at a time, lowest id first, each answered with its share of the
     * DATA; the last on max_opened. */
    for (unsigned i = 0; ok && s->max_opened > 0 && i < k; i++) {
        int32_t id = s->max_opened - 2 * (int32_t)(k - 1 - i);
        put_frame_hd(hd, nhd - 9, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS | NGHTTP2_FLAG_END_STREAM, id);
        ok = nghttp2_session_mem_recv(s->ng, hd, nhd) == (ssize_t)nhd;
        s->wake_data = deficit < stream_win ? deficit : stream_win;
        deficit -= s->wake_data;
        const nghttp2_nv st[] = {{(uint8_t *)":status", (uint8_t *)"200", 7, 3, NGHTTP2_NV_FLAG_NONE}};
        nghttp2_data_provider prd = {.source.ptr = s, .read_callback = wake_data_read};
        ok = ok && nghttp2_submit_response(s->ng, id, st, 1, &prd) == 0;
        ok = ok && ng_send_all(s->ng, NULL) == 0 && s->wake_data == 0 &&
             nghttp2_session_find_stream(s->ng, id) == NULL;
    }
    ok = ok && ng_send_all(s->ng, NULL) == 0;
    s->waking = 0;
    if (!ok || deficit != 0 || nghttp2_session_want_write(s->ng) ||
        nghttp2_session_get_remote_window_size(s->ng) != rw ||
        nghttp2_session_get_local_window_size(s->ng) != PCR_BODY_ALLOWANCE) {
        pcr_log_warn("client %s: h2 session could not be rebuilt after hibernation",
                     pcr_sock_peer(s->sock));
        return -1;
    }
    return 0;
}

/* ---- connection ---------------------------------------------------------------------- */

/* The session's last bytes are with the kernel: the streams and nghttp2 go, the sending side
 * is shut down (the client reads the GOAWAY, then the end of the stream, RFC 9113 5.4.1), and
 * what the client still sends is read and thrown away until it closes or LINGER_MS pass.
 * Closing at once with unread input would make the kernel reset the connection, which can
 * destroy the GOAWAY before the client reads it; not reading at all would leave the socket
 * in CLOSE-WAIT until client_idle_ms. */
static void linger(h2_sess_t *s)
{
    if (s->w->draining) {
        h2_close(s); /* shutting down: no time to linger */
        return;
    }
    while (s->streams) {
        nghttp2_session_set_stream_user_data(s->ng, s->streams->id, NULL);
        stream_free(s->streams);
    }
    pcr_budget_unwait(s->w, &s->budget);
    nghttp2_session_del(s->ng);
    s->ng = NULL;
    s->lingering = 1;
    s->closing = 1;
    pcr_sock_shutdown_write(s->sock);
    struct evbuffer *in = pcr_sock_input(s->sock);
    if (in != NULL)
        evbuffer_drain(in, evbuffer_get_length(in));
    pcr_session_set_waiting(&s->base, 1); /* first to go when connections run short */
    struct timeval tv = pcr_ms_to_tv(LINGER_MS);
    evtimer_add(s->timer, &tv);
    pcr_sock_read_start(s->sock);
}

static void flush_now(h2_sess_t *s)
{
    if (s->in_flush || s->ng == NULL)
        return; /* hibernated: nothing to send */
    struct evbuffer *out = pcr_sock_output(s->sock);
    if (out == NULL) {
        h2_close(s); /* an idle socket's buffer could not be made again */
        return;
    }
    s->in_flush = 1;
    size_t high = pcr_write_high(s->w);
    for (;;) {
        size_t produced = 0;
        while (evbuffer_get_length(out) < high) {
            const uint8_t *data;
            ssize_t n = nghttp2_session_mem_send(s->ng, &data);
            if (n < 0) {
                pcr_log_debug("h2: send failed: %s", nghttp2_strerror((int)n));
                s->in_flush = 0;
                h2_close(s);
                return;
            }
            if (n == 0)
                break;
            evbuffer_add(out, data, (size_t)n);
            produced += (size_t)n;
        }
        pcr_sock_flush(s->sock);
        /* The kernel took it and nghttp2 may have more: go on. A full socket waits for the
         * drain notification instead. */
        if (produced == 0 || evbuffer_get_length(out) >= high ||
            !nghttp2_session_want_write(s->ng))
            break;
    }
    s->in_flush = 0;
    if (!nghttp2_session_want_read(s->ng) && !nghttp2_session_want_write(s->ng)) {
        /* The session is over (a GOAWAY went out after a connection error, or after a drain
         * with no stream left): once the kernel has every byte, the connection ends. */
        if (pcr_sock_pending(s->sock) == 0)
            linger(s);
        else
            pcr_sock_want_drain(s->sock, 0);
        return;
    }
    if (evbuffer_get_length(out) >= PCR_WRITE_LOW)
        pcr_sock_want_drain(s->sock, PCR_WRITE_LOW);
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    h2_sess_t *s = arg;
    if (s->ng == NULL && !s->lingering && !s->hibernated)
        h2_close(s); /* a wake failed (h2_drain) */
    else if (!s->lingering)
        flush_now(s);
}

/* Follows the frame boundaries in `n` bytes nghttp2 consumed: only each frame header's length
 * is read (nghttp2 parses the rest). A session rebuilt mid-frame would lose the frame's
 * beginning, so hibernate() waits for a boundary. */
static void walk_frames(h2_sess_t *s, const uint8_t *p, size_t n)
{
    while (n > 0) {
        if (s->in_left > 0) {
            size_t k = n < s->in_left ? n : s->in_left;
            s->in_left -= (uint32_t)k;
            p += k;
            n -= k;
            continue;
        }
        if (s->in_hd < 3)
            s->in_len = s->in_len << 8 | *p;
        p++;
        n--;
        if (++s->in_hd == 9) {
            s->in_left = s->in_len;
            s->in_len = 0;
            s->in_hd = 0;
        }
    }
}

static void on_read(pcr_sock_t *sock, void *arg)
{
    h2_sess_t *s = arg;
    struct evbuffer *in = pcr_sock_input(sock);
    if (s->lingering) {
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    if (wake(s) != 0) {
        h2_close(s);
        return;
    }
    while (evbuffer_get_length(in) > 0 && !s->closing) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        s->seg = v.iov_base;
        s->seg_len = v.iov_len;
        ssize_t n = nghttp2_session_mem_recv(s->ng, v.iov_base, v.iov_len);
        if (n > 0)
            walk_frames(s, v.iov_base, (size_t)n);
        /* A hold took the whole chain out of `in` already; nghttp2 reads all it is given
         * unless it fails, and then everything left is dropped below. */
        size_t moved = s->hold != NULL ? s->seg_len : 0;
        hold_release(s->hold);
        s->hold = NULL;
        s->seg = NULL;
        if (n < 0) {
            /* nghttp2 has queued a GOAWAY for protocol errors; send it, then close. */
            pcr_log_debug("h2: bad input from client: %s", nghttp2_strerror((int)n));
            PCR_INC(s->w->metrics.bad_requests);
            evbuffer_drain(in, evbuffer_get_length(in));
            pcr_sock_read_stop(sock);
            s->closing = 1;
            nghttp2_session_terminate_session(s->ng, NGHTTP2_PROTOCOL_ERROR);
            break;
        }
        if ((size_t)n > moved)
            evbuffer_drain(in, (size_t)n - moved);
    }
    if (!s->closing)
        run_queued(s);
    /* Still idle past its trim (a PING, a SETTINGS, a WINDOW_UPDATE): trimmed or hibernated
     * again IDLE_TRIM_MS from now (at most, the idle deadline stays), not at once: a client
     * cannot make the session rebuilt more than once a second. */
    if (s->trimmed && s->nstreams == 0 && !s->closing && !s->lingering) {
        s->trimmed = 0;
        arm_timer(s);
    }
    flush_now(s);
}

static void on_drain(pcr_sock_t *sock, void *arg)
{
    h2_sess_t *s = arg;
    if (!s->lingering)
        flush_now(s);
}

static void on_end(pcr_sock_t *sock, pcr_sock_end_t why, void *arg)
{
    h2_sess_t *s = arg;
    if (why == PCR_SOCK_WRITE_TIMEOUT) {
        PCR_INC(s->w->metrics.write_timeouts);
        pcr_log_info("client %s accepted no bytes for %u ms: connection closed", pcr_sock_peer(sock),
                     s->w->cfg->timeouts.client_write_ms);
    }
    h2_close(s); /* EOF, error or timeout: every stream's exchange is abandoned */
}

static void on_ready(pcr_sock_t *sock, int err, void *arg) {}

static const pcr_sock_cbs_t h2_sock_cbs = {on_read, on_drain, on_end, on_ready};

/* GOAWAY with the last stream we took: the client retries later ones elsewhere. -1 if the
 * session could not be woken to say it: the caller closes it. */
static int goaway(h2_sess_t *s)
{
    s->goaway = 1;
    if (wake(s) != 0)
        return -1;
    nghttp2_submit_goaway(s->ng, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(s->ng),
                          NGHTTP2_NO_ERROR, NULL, 0);
    schedule_flush(s);
    return 0;
}

static void h2_drain(pcr_session_t *base)
{
    h2_sess_t *s = (h2_sess_t *)base;
    if (!s->lingering && goaway(s) != 0)
        h2_close(s);
}

static void h2_force_close(pcr_session_t *base) { h2_close((h2_sess_t *)base); }

static const pcr_session_ops_t h2_session_ops = {h2_drain, h2_force_close};

static void h2_close(h2_sess_t *s)
{
    while (s->streams)
        stream_free(s->streams);
    pcr_budget_release(s->w, s->reserved);
    s->reserved = 0;
    pcr_budget_unwait(s->w, &s->budget);
    nghttp2_session_del(s->ng);
    if (s->hibernated)
        PCR_STORE(s->w->metrics.h2_hibernated, PCR_LOAD(s->w->metrics.h2_hibernated) - 1);
    free(s->opened);
    event_free(s->flush);
    event_free(s->timer);
    pcr_sock_free(s->sock);
    pcr_session_unregister(&s->base);
    free(s);
}

int pcr_h2_session_start(pcr_worker_t *w, pcr_sock_t *sock)
{
    h2_sess_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto fail;
    s->w = w;
    s->sock = sock;
    s->budget.resume = budget_resume;
    s->budget.shed = budget_shed;
    s->window = PCR_BODY_ALLOWANCE; /* the connection window a client starts with */
    s->max_streams = w->cfg->limits.max_concurrent_streams;
    s->max_header_list = (uint32_t)w->cfg->limits.max_header_bytes;
    s->in_left = NGHTTP2_CLIENT_MAGIC_LEN; /* the preface, before the first frame */
    if (ng_make(s, 0) != 0)
        goto fail;
    s->flush = event_new(w->base, -1, 0, on_flush, s);
    s->timer = evtimer_new(w->base, on_timer, s);
    if (s->flush == NULL || s->timer == NULL)
        goto fail;
    pcr_session_register(w, &s->base, &h2_session_ops,
                         pcr_sock_is_tls(sock) ? PCR_CONN_H2_TLS : PCR_CONN_H2);
    pcr_session_set_waiting(&s->base, 1);
    pcr_sock_set_cbs(sock, &h2_sock_cbs, s);
    pcr_sock_set_write_timeout(sock, w->cfg->timeouts.client_write_ms);
    pcr_sock_read_start(sock);
    arm_timer(s);
    if (evbuffer_get_length(pcr_sock_input(sock)) > 0)
        on_read(sock, s);
    else
        flush_now(s);
    return 0;
fail:
    if (s && s->flush)
        event_free(s->flush);
    if (s && s->timer)
        event_free(s->timer);
    if (s && s->ng)
        nghttp2_session_del(s->ng);
    free(s);
    return PCR_ERR_NOMEM;
}
