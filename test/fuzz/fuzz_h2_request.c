/* test/fuzz/fuzz_h2_request.c: HTTP/2 requests from a client, as pcrouter reads and answers
 * them: router/http/h2_server.c (nghttp2's server session and its callbacks, the flow control
 * taken by hand, the stream deadlines, the linger after a GOAWAY), the request state machine of
 * router/http/exchange.c behind it, the local endpoints, and the pod it proxies to.
 *
 * Each input runs on a real server in process, as fuzz_h1_request.c does: the config (from
 * JSON text, through the loader), the backends, one worker (pcr_worker_init), built once per
 * config variant (byte 1's bit 6) and kept for every later input of it (fuzz_router.h), and a
 * new client connection, a socketpair whose router end is a plain transport with an HTTP/2 session on it
 * (h2c with prior knowledge: the connection preface is the client's first bytes). The harness
 * is the client on the other end and the pod too: a loopback listener that the backend's URL
 * names, answering every request the router sends it with one of eight canned answers. Time
 * is virtual (fuzz_net.h).
 *
 * Input: four control bytes, then the bytes the client sends.
 *   byte 0  the pod's answers: the k-th request it gets is answered with kind
 *           (low nibble + k * high nibble) % 8 (see `answers`)
 *   byte 1  bits 0-1  the client's end: 0 half-close once the router went quiet, 1 never (the
 *                     router's deadlines end it), 2 close right after the last write,
 *                     3 half-close right after the last write
 *           bits 2-4  virtual time between two writes: 0, 0, 0, 0, 0.1, 1, 2.1 or 4.1 s
 *                     (request_header_ms is 2 s, client_idle_ms 4 s)
 *           bit 5     the input carries its own connection preface; else the harness sends
 *                     "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" before it, so the input is frames
 *           bit 6     small limits: 1 KiB bodies and header lists, 4 concurrent streams
 *   byte 2  the cut into writes: 0 one write, else the seed of the cutter
 *   byte 3  bits 0-3  longest write is 2^n bytes
 *
 * Invariants, beyond "no crash, no leak, no undefined behaviour, no hang":
 *   1. Everything the router writes is HTTP/2 framing: its first frame is a SETTINGS; every
 *      frame has a known type the server may send (no PUSH_PROMISE, PRIORITY or extension),
 *      the reserved bit clear, a length within the largest SETTINGS_MAX_FRAME_SIZE the client
 *      offered, and the layout of its type; a header block is a HEADERS and its CONTINUATIONs,
 *      nothing interleaved, and decodes with nghttp2's own HPACK inflater (padding and priority
 *      stripped). A response is on a stream the client opened with HEADERS (odd): 1xx heads
 *      without END_STREAM, one final head whose first field is :status (three digits within
 *      100..599, not 101) and no pseudo-header after a regular field, lower-case names, none
 *      of HTTP/1.1's connection-specific fields; DATA only after the final head and before the
 *      stream's end (END_STREAM or the router's RST_STREAM), none for HEAD, 204 or 304; a body
 *      that ends with END_STREAM has the length its content-length says. A SETTINGS ACK or a
 *      PING ACK answers one the client sent. After the router's GOAWAY, no HEADERS on a stream
 *      above its last-stream-id, and a later GOAWAY never raises it. Once the router closed
 *      the connection, its output ends on a frame boundary, outside a header block.
 *   2. The router's own error with a body (a :status >= 400 without x-pcrouter-backend, DATA,
 *      then END_STREAM) is an OpenAI-style JSON {"error": {"message", "type", "code"}} of
 *      type application/json (but /health's own 503, its status document).
 *   3. What reaches the pod parses as one HTTP/1.1 request with one Host (the backend's), no
 *      Transfer-Encoding nor hop-by-hop field nor pseudo-header, a Content-Length framing its
 *      body, and the method, path and body of a stream the client sent (but the router's own
 *      GET /v1/models to every pod).
 *   4. Once the client is done and time has passed every deadline, the router has closed the
 *      connection and its accounting is back to zero: no session, no request in flight, no
 *      body bytes held against the budget, no backend load or queued prefill, no pod
 *      connection. The server is kept: what one input leaves behind, the next finds.
 *
 * Not reached, as for HTTP/1.1: the body budget's pause (two connections with more than a MiB
 * of body each); the flow control against it is read, the accounting checked (4). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <http_parser.h>
#include <nghttp2/nghttp2.h>

#include "backend.h"
#include "bus.h"
#include "config.h"
#include "control.h"
#include "fuzz.h"
#include "fuzz_net.h"
#include "fuzz_pod.h"
#include "fuzz_router.h"
#include "log.h"
#include "session.h"
#include "sock.h"
#include "upstream.h"
#include "worker.h"

#define CTRL 4
#define MAX_INPUT_BYTES (64 * 1024)
#define TURNS (200 * 1000)       /* event-loop turns in one input, all phases */
#define FINAL_STEP_MS 500        /* virtual time let pass at once at the end */
#define FINAL_STEPS 600          /* 300 s: every deadline of the config below, many times */
#define MAX_BODY_KEPT (1 << 20)  /* bytes of a router error's body kept to read */
#define MAX_MATCHED_STREAMS 1024 /* the pod's requests are matched to streams below this count */

#define H2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define H2_PREFACE_LEN 24
#define H2_FRAME_MIN 16384       /* SETTINGS_MAX_FRAME_SIZE's initial value and floor */
#define H2_FRAME_MAX 16777215

enum { F_DATA, F_HEADERS, F_PRIORITY, F_RST_STREAM, F_SETTINGS, F_PUSH_PROMISE, F_PING, F_GOAWAY,
       F_WINDOW_UPDATE, F_CONTINUATION };
#define FL_END_STREAM 0x1
#define FL_ACK 0x1
#define FL_END_HEADERS 0x4
#define FL_PADDED 0x8
#define FL_PRIORITY 0x20

/* Short deadlines, so that letting them pass costs few steps. */
static const char config_fmt[] =
    "{\"listen\": [{\"address\": \"127.0.0.1:1\"}],\n"
    " \"backends\": [{\"name\": \"pod\", \"url\": \"http://127.0.0.1:%u\", \"max_connections\": 2}],\n"
    " \"workers\": 1,\n"
    " \"limits\": {\"max_body_bytes\": %u, \"max_header_bytes\": %u, \"max_concurrent_streams\": %u},\n"
    " \"timeouts\": {\"connect_ms\": 1000, \"response_ms\": 3000, \"stream_idle_ms\": 3000,\n"
    "   \"upstream_keepalive_ms\": 6000, \"client_idle_ms\": 4000, \"request_header_ms\": 2000,\n"
    "   \"client_write_ms\": 5000, \"drain_ms\": 0},\n"
    " \"upstream\": {\"retries\": 1},\n"
    " \"health\": {\"interval_ms\": 0},\n"
    " \"scrape\": {\"interval_ms\": 0, \"models_interval_ms\": 0},\n"
    " \"log\": {\"level\": \"error\", \"access_log\": false}}\n";

/* ---- the pod's answers -------------------------------------------------------------------- */

/* `close`: the pod closes once it is written; `silent`: then says nothing more. */
typedef struct {
    const char *bytes;
    size_t len;
    int close, silent;
} answer_t;

#define JSON_OK "{\"id\":\"c\",\"choices\":[{\"text\":\"ok\"}],\"usage\":{\"prompt_tokens\":9," \
                "\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":4}}}"
#define SSE_1 "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
#define SSE_2 "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1," \
              "\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"
#define SSE_3 "data: [DONE]\n\n"
#define NANSWERS 8
#define BIG_BODY 20000           /* more than a DATA frame, less than the initial window */

static char big_answer[BIG_BODY + 128];

static answer_t answers[NANSWERS] = {
    /* 0: a completion */
    {"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 130\r\n\r\n" JSON_OK, 0, 0, 0},
    /* 1: an SSE stream, chunked */
    {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
     "22\r\n" SSE_1 "\r\n74\r\n" SSE_2 "\r\ne\r\n" SSE_3 "\r\n0\r\n\r\n", 0, 0, 0},
    /* 2: the pod's own error */
    {"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: 61\r\n\r\n"
     "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":\"x\"}}", 0, 0, 0},
    /* 3: a close instead of an answer (a retry, then the router's 502) */
    {"", 0, 1, 0},
    /* 4: no answer at all (the router's response deadline: 504) */
    {"", 0, 0, 1},
    /* 5: a body longer than a DATA frame (built by init_answers) */
    {big_answer, 0, 0, 0},
    /* 6: a stream cut after its first event (the router resets the stream) */
    {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
     "22\r\n" SSE_1 "\r\n", 0, 1, 0},
    /* 7: no body, and hop-by-hop fields that must not reach an HTTP/2 client */
    {"HTTP/1.1 204 No Content\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n"
     "Upgrade: h2c\r\nX-Kept: 1\r\n\r\n", 0, 0, 0},
};

static int ans_complete(http_parser *p)
{
    *(int *)p->data = 1;
    return 0;
}

static void init_answers(void)
{
    int n = snprintf(big_answer, sizeof(big_answer),
                     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %u\r\n\r\n"
                     "{\"id\":\"c\",\"pad\":\"", BIG_BODY);
    size_t head = (size_t)n, body_start = strstr(big_answer, "\r\n\r\n") + 4 - big_answer;
    size_t end = body_start + BIG_BODY;
    memset(big_answer + head, 'x', end - 2 - head);
    memcpy(big_answer + end - 2, "\"}", 2);
    big_answer[end] = '\0';
    /* The answers meant to be whole parse whole (a wrong length would make them malformed,
     * and the cases they stand for would go untested). */
    static const http_parser_settings s = {.on_message_complete = ans_complete};
    for (size_t i = 0; i < NANSWERS; i++) {
        answer_t *a = &answers[i];
        a->len = strlen(a->bytes);
        if (i == 6 || a->len == 0)
            continue;
        int done = 0;
        http_parser p;
        http_parser_init(&p, HTTP_RESPONSE);
        p.data = &done;
        size_t got = http_parser_execute(&p, &s, a->bytes, a->len);
        FUZZ_CHECKF(done && got == a->len, "answer %zu does not parse whole", i);
    }
}

/* ---- streams: what the client sent on each, what the router answered ------------------- */

typedef struct {
    int32_t id;                  /* 0: a free slot */
    /* The client's side (client_walk). */
    int opened;                  /* the client sent HEADERS on it */
    int req_known, req_ended;    /* :method and :path read; END_STREAM seen */
    char method[16];
    fuzz_buf_t path, body;
    /* The router's side (check_output). */
    int heads;                   /* header blocks the router sent on it */
    int status;                  /* the final :status, 0 before */
    int proxied, ctype_json, ended, reset;
    int64_t clen;                /* the final head's content-length, -1 when none */
    size_t data_len;
    fuzz_buf_t resp;             /* the body of the router's own error, to read */
} stream_t;

typedef struct {
    stream_t *s;
    size_t cap, n;               /* cap: a power of two */
} streams_t;

static stream_t *streams_find(streams_t *m, int32_t id)
{
    if (m->cap == 0)
        return NULL;
    for (size_t i = ((uint32_t)id * 2654435761u) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->s[i].id == id)
            return &m->s[i];
        if (m->s[i].id == 0)
            return NULL;
    }
}

static stream_t *streams_get(streams_t *m, int32_t id)
{
    stream_t *st = streams_find(m, id);
    if (st != NULL)
        return st;
    if ((m->n + 1) * 2 > m->cap) {
        streams_t g = {calloc(m->cap ? m->cap * 2 : 64, sizeof(stream_t)), m->cap ? m->cap * 2 : 64, 0};
        FUZZ_CHECK(g.s != NULL);
        for (size_t i = 0; i < m->cap; i++) {
            if (m->s[i].id == 0)
                continue;
            size_t j = ((uint32_t)m->s[i].id * 2654435761u) & (g.cap - 1);
            while (g.s[j].id != 0)
                j = (j + 1) & (g.cap - 1);
            g.s[j] = m->s[i];
            g.n++;
        }
        free(m->s);
        *m = g;
    }
    size_t j = ((uint32_t)id * 2654435761u) & (m->cap - 1);
    while (m->s[j].id != 0)
        j = (j + 1) & (m->cap - 1);
    m->s[j].id = id;
    m->s[j].clen = -1;
    m->n++;
    return &m->s[j];
}

static void streams_free(streams_t *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        fuzz_buf_free(&m->s[i].path);
        fuzz_buf_free(&m->s[i].body);
        fuzz_buf_free(&m->s[i].resp);
    }
    free(m->s);
    memset(m, 0, sizeof(*m));
}

/* ---- frames ------------------------------------------------------------------------------ */

typedef struct {
    uint32_t len;
    uint8_t type, flags;
    int32_t id;                  /* the reserved bit masked off */
    int reserved;                /* the reserved bit */
    const uint8_t *payload;
} frame_t;

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The frame at `p` when all of it is within `left` bytes: 1, else 0. */
static int frame_at(const uint8_t *p, size_t left, frame_t *f)
{
    if (left < 9)
        return 0;
    f->len = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
    f->type = p[3];
    f->flags = p[4];
    f->reserved = p[5] >> 7;
    f->id = (int32_t)(get32(p + 5) & 0x7fffffffu);
    f->payload = p + 9;
    return left - 9 >= f->len;
}

/* A DATA or HEADERS frame's content, its padding (and a HEADERS's priority) stripped: 0 when
 * the padding does not fit (a connection error). */
static int frame_content(const frame_t *f, const uint8_t **p, size_t *len)
{
    size_t off = 0, pad = 0;
    if (f->flags & FL_PADDED) {
        if (f->len < 1)
            return 0;
        pad = f->payload[0];
        off = 1;
    }
    if (f->type == F_HEADERS && (f->flags & FL_PRIORITY))
        off += 5;
    if (off + pad > f->len)
        return 0;
    *p = f->payload + off;
    *len = f->len - off - pad;
    return 1;
}

/* A header block, gathered from a HEADERS and its CONTINUATIONs. */
typedef struct {
    int open;
    int32_t id;
    uint8_t flags;               /* the HEADERS frame's */
    fuzz_buf_t buf;
} block_t;

/* Decodes a whole header block with nghttp2's inflater, calling `field` for each field; -1
 * when the block does not decode. */
typedef void (*field_fn)(void *arg, const nghttp2_nv *nv);

static int inflate_block(nghttp2_hd_inflater *inf, const uint8_t *in, size_t len, field_fn field,
                         void *arg)
{
    static const uint8_t none[1];
    if (len == 0)
        in = none;
    for (;;) {
        nghttp2_nv nv;
        int flags = 0;
        ssize_t n = nghttp2_hd_inflate_hd2(inf, &nv, &flags, in, len, 1);
        if (n < 0)
            return -1;
        in += n;
        len -= (size_t)n;
        if (flags & NGHTTP2_HD_INFLATE_EMIT)
            field(arg, &nv);
        if (flags & NGHTTP2_HD_INFLATE_FINAL) {
            nghttp2_hd_inflate_end_headers(inf);
            return 0;
        }
        if (len == 0 && !(flags & NGHTTP2_HD_INFLATE_EMIT))
            return -1; /* cannot happen with in_final set */
    }
}

/* ---- the client's side: what it sent, as nghttp2 reads it ------------------------------- */

typedef struct h2r h2r_t;

typedef struct {
    unsigned settings, pings;    /* SETTINGS and PING frames without ACK */
    uint32_t max_frame;          /* the largest frame the router may send */
    size_t nopened;              /* streams opened by HEADERS */
} client_seen_t;

typedef struct {
    stream_t *st;
    int first;                   /* the stream's first header block */
} req_fields_t;

static void req_field(void *arg, const nghttp2_nv *nv)
{
    req_fields_t *r = arg;
    if (!r->first)
        return;
    stream_t *st = r->st;
    if (nv->namelen == 7 && memcmp(nv->name, ":method", 7) == 0 && st->method[0] == '\0' &&
        nv->valuelen < sizeof(st->method)) {
        memcpy(st->method, nv->value, nv->valuelen);
        st->method[nv->valuelen] = '\0';
    } else if (nv->namelen == 5 && memcmp(nv->name, ":path", 5) == 0 && st->path.len == 0) {
        fuzz_buf_add(&st->path, nv->value, nv->valuelen);
    }
}

/* Reads the client's frames as nghttp2 would, up to where it would surely stop (the stream
 * cut short, or a header block it cannot decode): the streams opened, their method, path and
 * body, the SETTINGS and PINGs to acknowledge, the largest frame size offered. What is read
 * past a point the router stops at only adds possibilities: every check that uses it is a
 * bound, never a demand. */
static void client_walk(streams_t *m, client_seen_t *cs, const uint8_t *p, size_t len)
{
    cs->max_frame = H2_FRAME_MIN;
    if (len < H2_PREFACE_LEN || memcmp(p, H2_PREFACE, H2_PREFACE_LEN) != 0)
        return;
    nghttp2_hd_inflater *inf;
    FUZZ_CHECK(nghttp2_hd_inflate_new(&inf) == 0);
    block_t b = {0};
    frame_t f;
    for (size_t off = H2_PREFACE_LEN; frame_at(p + off, len - off, &f); off += 9 + f.len) {
        if (b.open && (f.type != F_CONTINUATION || f.id != b.id))
            break; /* a connection error */
        const uint8_t *c;
        size_t clen;
        switch (f.type) {
        case F_DATA: {
            stream_t *st = streams_find(m, f.id);
            if (st != NULL && frame_content(&f, &c, &clen) && !st->req_ended) {
                fuzz_buf_add(&st->body, c, clen);
                st->req_ended = f.flags & FL_END_STREAM;
            }
            break;
        }
        case F_HEADERS:
            if (f.id == 0 || !frame_content(&f, &c, &clen))
                goto out;
            b.open = 1;
            b.id = f.id;
            b.flags = f.flags;
            b.buf.len = 0;
            fuzz_buf_add(&b.buf, c, clen);
            break;
        case F_CONTINUATION:
            if (!b.open)
                goto out;
            fuzz_buf_add(&b.buf, f.payload, f.len);
            break;
        case F_SETTINGS:
            if (f.flags & FL_ACK)
                break;
            cs->settings++;
            for (uint32_t i = 0; i + 6 <= f.len; i += 6) {
                uint32_t v = get32(f.payload + i + 2);
                if (f.payload[i] == 0 && f.payload[i + 1] == 5 && v > cs->max_frame &&
                    v <= H2_FRAME_MAX)
                    cs->max_frame = v;
            }
            break;
        case F_PING:
            cs->pings += !(f.flags & FL_ACK);
            break;
        }
        if (b.open && (f.flags & FL_END_HEADERS)) {
            b.open = 0;
            stream_t *st = streams_get(m, b.id);
            req_fields_t r = {st, !st->opened};
            cs->nopened += !st->opened;
            st->opened = 1;
            if (inflate_block(inf, b.buf.p, b.buf.len, req_field, &r) < 0)
                break;
            if (r.first)
                st->req_known = st->method[0] != '\0' && st->path.len > 0;
            if (b.flags & FL_END_STREAM)
                st->req_ended = 1;
        }
    }
out:
    fuzz_buf_free(&b.buf);
    nghttp2_hd_inflate_del(inf);
}

/* ---- the pod ----------------------------------------------------------------------------- */

struct h2r {
    const uint8_t *ctl;
    fuzz_buf_t req;              /* the client's bytes: the preface (unless its own), the input */
    int client_end, small;
    char host[32];               /* the backend's Host header */
    streams_t streams;
    client_seen_t seen;
    /* The server under test. */
    fuzz_router_t *rt;           /* kept across inputs (fuzz_router.h) */
    int sock_fd;                 /* the client's end */
    int client_eof, client_closed, client_shut;
    fuzz_buf_t out;              /* what the router wrote to the client */
    /* The pod. */
    int lfd;
    fuzz_pods_t pods;
    unsigned pod_requests;       /* requests the pod has answered or ignored */
    unsigned turns;
};

/* A whole request reached the pod: framed as it should be, and one a client stream carried. */
static void pod_check(fuzz_pod_t *c)
{
    h2r_t *t = c->owner;
    http_parser *p = &c->p;
    FUZZ_CHECKF(p->http_major == 1 && p->http_minor == 1, "the pod got HTTP/%d.%d", p->http_major,
                p->http_minor);
    FUZZ_CHECKF(c->n_host == 1, "the pod got %u Host fields", c->n_host);
    FUZZ_CHECKF(c->n_te == 0, "a Transfer-Encoding reached the pod");
    FUZZ_CHECKF(c->n_cl <= 1, "%u Content-Length fields reached the pod", c->n_cl);
    const char *method = http_method_str((enum http_method)p->method);
    if (c->body.len > 0 || strcmp(method, "POST") == 0) {
        char want[32];
        snprintf(want, sizeof(want), "%zu", c->body.len);
        FUZZ_CHECKF(c->n_cl == 1 && strcmp(c->cl, want) == 0,
                    "a body of %zu bytes reached the pod with Content-Length \"%s\"", c->body.len,
                    c->cl);
    }
    /* GET /v1/models is the router's own (its endpoint asks every pod). */
    if ((strcmp(method, "GET") == 0 && c->url.len == 10 && fuzz_mem_eq(c->url.p, "/v1/models", 10)) ||
        t->seen.nopened > MAX_MATCHED_STREAMS)
        return;
    for (size_t i = 0; i < t->streams.cap; i++) {
        const stream_t *st = &t->streams.s[i];
        if (st->id != 0 && st->req_known && st->req_ended && strcmp(st->method, method) == 0 &&
            st->path.len == c->url.len && fuzz_mem_eq(st->path.p, c->url.p, c->url.len) &&
            st->body.len == c->body.len && fuzz_mem_eq(st->body.p, c->body.p, c->body.len))
            return;
    }
    FUZZ_CHECKF(0, "the pod got %s %.*s with a %zu-byte body, which no client stream sent",
                method, (int)c->url.len, (char *)c->url.p, c->body.len);
}

static void pod_answer(fuzz_pod_t *c)
{
    h2r_t *t = c->owner;
    t->pod_requests++;
    unsigned base = t->ctl[0] & 15, stride = t->ctl[0] >> 4;
    const answer_t *a = &answers[(base + (t->pod_requests - 1) * stride) % NANSWERS];
    fuzz_buf_add(&c->outq, a->bytes, a->len);
    c->close_when_sent = a->close;
    c->silent = a->silent;
}

static const fuzz_pod_ops_t pod_ops = {pod_check, pod_answer};

/* ---- the harness's turn ------------------------------------------------------------------ */

static int step(void *arg)
{
    h2r_t *t = arg;
    return fuzz_pods_turn(&t->pods, t->lfd, &pod_ops, t, t->host,
                          t->client_closed || t->client_eof ? -1 : t->sock_fd, &t->out,
                          &t->client_eof);
}

static void run(h2r_t *t)
{
    FUZZ_CHECKF(fuzz_run(t->rt->w.base, step, t, &t->turns) == 0,
                "the router did not go quiet within %u event-loop turns", TURNS);
}

static void run_any(void *t) { run(t); }

/* ---- the router's output, read back ------------------------------------------------------ */

static int trace_on(void)
{
    static int on = -1;
    if (on < 0)
        on = getenv("FUZZ_TRACE") != NULL;
    return on;
}

/* One response header block, as read. */
typedef struct {
    int nfields, regular;        /* fields so far; a regular field seen */
    int status;                  /* its :status, 0 when none */
    int proxied, ctype_json;
    int64_t clen;
} head_t;

static void resp_field(void *arg, const nghttp2_nv *nv)
{
    head_t *h = arg;
    const char *n = (const char *)nv->name, *v = (const char *)nv->value;
    size_t len = nv->namelen, vlen = nv->valuelen;
    if (trace_on())
        fprintf(stderr, "    %.*s: %.*s\n", (int)len, n, (int)vlen, v);
    h->nfields++;
    if (len > 0 && n[0] == ':') {
        FUZZ_CHECKF(!h->regular, "pseudo-header %.*s after a regular field", (int)len, n);
        FUZZ_CHECKF(len == 7 && memcmp(n, ":status", 7) == 0 && h->nfields == 1,
                    "response pseudo-header %.*s (field %d)", (int)len, n, h->nfields);
        FUZZ_CHECKF(vlen == 3 && v[0] >= '1' && v[0] <= '5' && v[1] >= '0' && v[1] <= '9' &&
                        v[2] >= '0' && v[2] <= '9',
                    ":status \"%.*s\"", (int)vlen, v);
        h->status = (v[0] - '0') * 100 + (v[1] - '0') * 10 + (v[2] - '0');
        FUZZ_CHECKF(h->status != 101, "a 101 over HTTP/2");
        return;
    }
    h->regular = 1;
    for (size_t i = 0; i < len; i++)
        FUZZ_CHECKF(!(n[i] >= 'A' && n[i] <= 'Z'), "field name %.*s is not lower case",
                    (int)len, n);
#define IS(s) (len == strlen(s) && memcmp(n, s, len) == 0)
    /* RFC 9113, 8.2.2: HTTP/1.1's connection-specific fields are malformed in HTTP/2. */
    FUZZ_CHECKF(!(IS("connection") || IS("keep-alive") || IS("proxy-connection") ||
                  IS("transfer-encoding") || IS("upgrade")),
                "a connection-specific field reached the HTTP/2 client: %.*s", (int)len, n);
    if (IS("x-pcrouter-backend"))
        h->proxied = 1;
    if (IS("content-type"))
        h->ctype_json = vlen == 16 && strncasecmp(v, "application/json", 16) == 0;
    if (IS("content-length")) {
        FUZZ_CHECKF(h->clen < 0 && vlen > 0 && vlen < 19, "content-length \"%.*s\"", (int)vlen, v);
        h->clen = 0;
        for (size_t i = 0; i < vlen; i++) {
            FUZZ_CHECKF(v[i] >= '0' && v[i] <= '9', "content-length \"%.*s\"", (int)vlen, v);
            h->clen = h->clen * 10 + (v[i] - '0');
        }
    }
#undef IS
}

static int no_body_status(int status) { return status == 204 || status == 304; }

/* The router's own error: an OpenAI-style body. */
static void check_error_body(const stream_t *st)
{
    FUZZ_CHECKF(st->ctype_json, "stream %d: an error %d without a JSON body", st->id, st->status);
    cJSON *root = cJSON_ParseWithLength((const char *)st->resp.p, st->resp.len);
    cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    FUZZ_CHECKF(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err, "message")) &&
                    cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err, "type")) &&
                    cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err, "code")),
                "stream %d: error %d body: %.*s", st->id, st->status, (int)st->resp.len,
                (char *)st->resp.p);
    cJSON_Delete(root);
}

static int is_head(const stream_t *st) { return st->req_known && strcmp(st->method, "HEAD") == 0; }

/* The router ended the stream's response with END_STREAM. */
static void stream_end(stream_t *st)
{
    st->ended = 1;
    if (st->clen >= 0 && !is_head(st) && !no_body_status(st->status))
        FUZZ_CHECKF((int64_t)st->data_len == st->clen,
                    "stream %d: %zu bytes of DATA, content-length %lld", st->id, st->data_len,
                    (long long)st->clen);
    /* /health's own 503 (no backend up) is its status document, not an error. */
    int health = st->status == 503 && (!st->req_known || (st->path.len >= 7 &&
                                                          memcmp(st->path.p, "/health", 7) == 0));
    if (st->status >= 400 && !st->proxied && st->data_len > 0 && !health &&
        st->data_len <= MAX_BODY_KEPT)
        check_error_body(st);
}

/* A whole header block the router sent on stream `id`. */
static void resp_block(h2r_t *t, nghttp2_hd_inflater *inf, block_t *b)
{
    head_t h = {.clen = -1};
    FUZZ_CHECKF(inflate_block(inf, b->buf.p, b->buf.len, resp_field, &h) == 0,
                "stream %d: the router's header block does not decode", b->id);
    stream_t *st = streams_find(&t->streams, b->id);
    FUZZ_CHECK(st != NULL); /* HEADERS only on streams the client opened */
    st->heads++;
    int end = b->flags & FL_END_STREAM;
    if (h.status == 0) {
        /* Trailers: after the final head, ending the stream. */
        FUZZ_CHECKF(st->status != 0 && end, "stream %d: a header block without :status", b->id);
        stream_end(st);
        return;
    }
    FUZZ_CHECKF(st->status == 0, "stream %d: a second head (%d after %d)", b->id, h.status,
                st->status);
    if (h.status < 200) {
        FUZZ_CHECKF(!end, "stream %d: a %d ends the stream", b->id, h.status);
        return;
    }
    st->status = h.status;
    st->proxied = h.proxied;
    st->ctype_json = h.ctype_json;
    st->clen = h.clen;
    if (end)
        stream_end(st);
}

static void trace_frame(const frame_t *f)
{
    static const char *const names[] = {"DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS",
                                        "PUSH_PROMISE", "PING", "GOAWAY", "WINDOW_UPDATE",
                                        "CONTINUATION"};
    fprintf(stderr, "%s stream %d, %u bytes, flags 0x%02x", f->type < 10 ? names[f->type] : "?",
            f->id, f->len, f->flags);
    if ((f->type == F_RST_STREAM || f->type == F_WINDOW_UPDATE) && f->len == 4)
        fprintf(stderr, ": %u", get32(f->payload));
    if (f->type == F_GOAWAY && f->len >= 8)
        fprintf(stderr, ": last stream %u, error %u", get32(f->payload) & 0x7fffffffu,
                get32(f->payload + 4));
    if (f->type == F_DATA && f->len > 0)
        fprintf(stderr, ": %.*s", (int)(f->len < 200 ? f->len : 200), (const char *)f->payload);
    fputc('\n', stderr);
}

static void check_output(h2r_t *t)
{
    if (trace_on())
        fprintf(stderr, "--- %zu bytes to the client (pod: %u requests)\n", t->out.len,
                t->pod_requests);
    nghttp2_hd_inflater *inf;
    FUZZ_CHECK(nghttp2_hd_inflate_new(&inf) == 0);
    block_t b = {0};
    unsigned acks = 0, pongs = 0;
    int64_t goaway_last = -1;
    size_t off = 0;
    frame_t f;
    for (; off < t->out.len && frame_at(t->out.p + off, t->out.len - off, &f); off += 9 + f.len) {
        if (trace_on())
            trace_frame(&f);
        FUZZ_CHECKF(!f.reserved, "frame type %u: the reserved bit is set", f.type);
        FUZZ_CHECKF(f.len <= t->seen.max_frame, "a frame of %u bytes, past %u", f.len,
                    t->seen.max_frame);
        if (off == 0)
            FUZZ_CHECKF(f.type == F_SETTINGS && !(f.flags & FL_ACK) && f.id == 0,
                        "the router's first frame is of type %u, flags 0x%x", f.type, f.flags);
        if (b.open)
            FUZZ_CHECKF(f.type == F_CONTINUATION && f.id == b.id,
                        "a frame of type %u on stream %d inside stream %d's header block",
                        f.type, f.id, b.id);
        const uint8_t *c;
        size_t clen;
        stream_t *st = f.id != 0 ? streams_find(&t->streams, f.id) : NULL;
        switch (f.type) {
        case F_DATA:
            FUZZ_CHECKF(st != NULL && st->status >= 200 && !st->ended && !st->reset,
                        "DATA on stream %d, %s", f.id, st == NULL ? "never opened"
                        : st->status < 200 ? "before its head" : "after its end");
            FUZZ_CHECK(frame_content(&f, &c, &clen));
            FUZZ_CHECKF(clen == 0 || (!is_head(st) && !no_body_status(st->status)),
                        "stream %d: DATA in the response to a HEAD or a %d", f.id, st->status);
            st->data_len += clen;
            if (st->status >= 400 && !st->proxied && st->resp.len + clen <= MAX_BODY_KEPT)
                fuzz_buf_add(&st->resp, c, clen);
            if (f.flags & FL_END_STREAM)
                stream_end(st);
            break;
        case F_HEADERS:
            FUZZ_CHECKF((f.id & 1) && st != NULL && st->opened,
                        "HEADERS on stream %d, which the client did not open", f.id);
            FUZZ_CHECKF(!st->ended && !st->reset, "HEADERS on stream %d after its end", f.id);
            FUZZ_CHECKF(goaway_last < 0 || f.id <= goaway_last,
                        "HEADERS on stream %d after a GOAWAY with last stream %lld", f.id,
                        (long long)goaway_last);
            FUZZ_CHECKF(frame_content(&f, &c, &clen), "HEADERS with padding past its end");
            b.open = 1;
            b.id = f.id;
            b.flags = f.flags;
            b.buf.len = 0;
            fuzz_buf_add(&b.buf, c, clen);
            break;
        case F_CONTINUATION:
            FUZZ_CHECKF(b.open, "a CONTINUATION on stream %d outside a header block", f.id);
            fuzz_buf_add(&b.buf, f.payload, f.len);
            break;
        case F_RST_STREAM:
            FUZZ_CHECKF(f.len == 4 && f.id != 0, "RST_STREAM of %u bytes on stream %d", f.len,
                        f.id);
            if (st != NULL)
                st->reset = 1;
            break;
        case F_SETTINGS:
            FUZZ_CHECKF(f.id == 0, "SETTINGS on stream %d", f.id);
            if (f.flags & FL_ACK) {
                FUZZ_CHECKF(f.len == 0, "a SETTINGS ACK of %u bytes", f.len);
                FUZZ_CHECKF(++acks <= t->seen.settings, "%u SETTINGS ACKs for %u SETTINGS", acks,
                            t->seen.settings);
            } else {
                FUZZ_CHECKF(f.len % 6 == 0, "SETTINGS of %u bytes", f.len);
            }
            break;
        case F_PING:
            FUZZ_CHECKF(f.id == 0 && f.len == 8 && (f.flags & FL_ACK),
                        "PING on stream %d, %u bytes, flags 0x%x", f.id, f.len, f.flags);
            FUZZ_CHECKF(++pongs <= t->seen.pings, "%u PING ACKs for %u PINGs", pongs,
                        t->seen.pings);
            break;
        case F_GOAWAY: {
            FUZZ_CHECKF(f.id == 0 && f.len >= 8, "GOAWAY on stream %d, %u bytes", f.id, f.len);
            FUZZ_CHECKF(!(f.payload[0] & 0x80), "GOAWAY's reserved bit is set");
            int64_t last = get32(f.payload) & 0x7fffffffu;
            FUZZ_CHECKF(goaway_last < 0 || last <= goaway_last,
                        "a GOAWAY raises the last stream from %lld to %lld",
                        (long long)goaway_last, (long long)last);
            goaway_last = last;
            break;
        }
        case F_WINDOW_UPDATE:
            FUZZ_CHECKF(f.len == 4 && !(f.payload[0] & 0x80) && (get32(f.payload) & 0x7fffffffu) > 0,
                        "WINDOW_UPDATE of %u bytes on stream %d", f.len, f.id);
            break;
        default:
            FUZZ_CHECKF(0, "the router sent a frame of type %u", f.type);
        }
        if (b.open && (f.flags & FL_END_HEADERS)) {
            b.open = 0;
            resp_block(t, inf, &b);
        }
    }
    if (t->client_eof)
        FUZZ_CHECKF(off == t->out.len && !b.open, "the router closed the connection %s",
                    b.open ? "inside a header block" : "in the middle of a frame");
    fuzz_buf_free(&b.buf);
    nghttp2_hd_inflate_del(inf);
}

/* ---- the server under test --------------------------------------------------------------- */

static void setup(h2r_t *t)
{
    uint16_t port;
    t->lfd = fuzz_pods_listener(&port);
    snprintf(t->host, sizeof(t->host), "127.0.0.1:%u", port);
    char text[2048];
    snprintf(text, sizeof(text), config_fmt, port, t->small ? 1024 : 33554432,
             t->small ? 1024 : 16384, t->small ? 4 : 256);
    t->rt = fuzz_router_get((unsigned)t->small, text);
    fuzz_router_reset(t->rt);
    pcr_sock_t *sock = fuzz_router_connect(t->rt, &t->sock_fd);
    FUZZ_CHECK(pcr_h2_session_start(&t->rt->w, sock) == 0);
}

/* What the input made is freed; the server and the pod's listener stay for the next. */
static void teardown(h2r_t *t)
{
    fuzz_pods_free(&t->pods);
    int fd;
    while ((fd = fuzz_accept(t->lfd)) >= 0)
        close(fd);
    if (!t->client_closed)
        close(t->sock_fd);
    fuzz_buf_free(&t->out);
    fuzz_buf_free(&t->req);
    streams_free(&t->streams);
}

static void finish_client(h2r_t *t, int end)
{
    if (end == 2 && !t->client_closed) {
        close(t->sock_fd);
        t->client_closed = 1;
    } else if (end != 1 && !t->client_shut) {
        shutdown(t->sock_fd, SHUT_WR);
        t->client_shut = 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const unsigned gaps[8] = {0, 0, 0, 0, 100, 1000, 2100, 4100};
    static int once;
    if (!once) {
        signal(SIGPIPE, SIG_IGN);
        pcr_log_set_level(PCR_LOG_ERROR);
        init_answers();
        once = 1;
    }
    if (size < CTRL || size > MAX_INPUT_BYTES)
        return 0;
    h2r_t *t = calloc(1, sizeof(*t));
    FUZZ_CHECK(t != NULL);
    t->ctl = data;
    t->client_end = data[1] & 3;
    unsigned gap = gaps[(data[1] >> 2) & 7];
    t->small = (data[1] >> 6) & 1;
    t->turns = TURNS;
    if (!(data[1] & 0x20))
        fuzz_buf_add(&t->req, H2_PREFACE, H2_PREFACE_LEN);
    fuzz_buf_add(&t->req, data + CTRL, size - CTRL);
    client_walk(&t->streams, &t->seen, t->req.p, t->req.len);

    fuzz_clock_start();
    setup(t);
    run(t);
    fuzz_split_t cut;
    fuzz_split_init(&cut, data[2], (size_t)1 << (data[3] & 15));
    size_t off = 0;
    int stuck = 0;
    while (off < t->req.len && !t->client_eof && !stuck) {
        size_t n = fuzz_split_next(&cut, t->req.len - off);
        for (size_t done = 0; done < n && !t->client_eof && !stuck;) {
            size_t w = fuzz_write(t->sock_fd, t->req.p + off + done, n - done);
            done += w;
            run(t);
            stuck = w == 0; /* the router reads no more (it went quiet with the buffer full) */
        }
        off += n;
        if (gap > 0 && off < t->req.len) {
            fuzz_clock_advance(gap);
            run(t);
        }
    }
    if (t->client_end >= 2)
        finish_client(t, t->client_end);
    run(t);
    finish_client(t, t->client_end);
    /* Let time pass until the router closed the connection and every deadline fired. */
    for (int i = 0; i < FINAL_STEPS && (t->rt->w.nsessions > 0 || !(t->client_eof || t->client_closed)); i++) {
        fuzz_clock_advance(FINAL_STEP_MS);
        run(t);
    }
    FUZZ_CHECKF(t->rt->w.nsessions == 0 && (t->client_eof || t->client_closed),
                "the client connection was still open after %u s", FINAL_STEPS * FINAL_STEP_MS / 1000);
    fuzz_router_end_input(t->rt, &t->pods, run_any, t);
    check_output(t);
    teardown(t);
    fuzz_clock_stop();
    free(t);
    return 0;
}
