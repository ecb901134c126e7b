/* test/fuzz/fuzz_h1_request.c: HTTP/1.1 requests from a client, as pcrouter reads and answers
 * them: router/http/h1_server.c (http-parser and its callbacks, the RFC 9112 framing checks of
 * router/core/http1.c, pipelining, deadlines, lingering close), the request state machine of
 * router/http/exchange.c behind it, the local endpoints, and the pod it proxies to.
 *
 * Each input runs on a real server in process: the config (from JSON text, through the
 * loader), the backends, one worker (pcr_worker_init: event base, policy replica, tick,
 * pools), built once per config variant and kept for every later input of that variant
 * (fuzz_router.h), and a new client connection, a socketpair whose router end is a plain
 * transport with an HTTP/1.1 session on it. The harness is the client on the other end and the pod too: a loopback
 * listener that the backend's URL names, answering every request the router sends it with one
 * of sixteen canned answers (good, streamed, cut, malformed, silent, ...). Time is virtual
 * (fuzz_net.h): deadlines fire when the harness lets time pass, never on the wall clock.
 *
 * Input: four control bytes, then the bytes the client sends.
 *   byte 0  bits 0-1  config: 0 defaults (short timeouts), 1 small limits (1 KiB bodies and
 *                     heads), 2 an admin listener, upstream.request_usage, a JSON access log,
 *                     3 a text access log, no retries, one pod connection
 *           bits 2-3  the client's end: 0 half-close once the router went quiet, 1 half-close
 *                     right after the last write, 2 never (the router's deadlines end it),
 *                     3 close right after the last write
 *           bit 4     the connection came through the admin listener
 *           bits 5-7  virtual time between two writes: 0, 0, 0, 0, 0.1, 1, 2.1 or 4.1 s
 *                     (request_header_ms is 2 s, client_idle_ms 4 s)
 *   byte 1  the cut into writes: 0 one write, else the seed of the cutter
 *   byte 2  the pod's answers: the k-th request it gets is answered with kind
 *           (low nibble + k * high nibble) % 16 (see `answers`)
 *   byte 3  bits 0-3  longest write is 2^n bytes
 *           bit 4     the pod answers every request with the input's own bytes: those after
 *                     the first "@@pod@@" (the client sends those before it); it closes after
 *                     each when byte 2's bit 0 is set
 *
 * Invariants, beyond "no crash, no leak, no undefined behaviour, no hang":
 *   1. Everything the router writes parses back (http-parser, as a response to what the client
 *      sent: a HEAD gets no body, but for a refusal of one cut short before its head ended)
 *      into responses with a status within 100..599; one left incomplete only when the pod's
 *      answer broke or the client left.
 *   2. The router's own error answers carry an OpenAI-style JSON body {"error": {"message",
 *      "type", "code"}}; a 400, 408, 413 or 431 of its own is the last response and says
 *      "Connection: close", and nothing follows a "Connection: close" response.
 *   3. No more final responses than requests http-parser saw begin, plus one refusal of bytes
 *      it could not even begin (a 400).
 *   4. What reaches the pod parses as one HTTP/1.1 request with one Host (the backend's), no
 *      Transfer-Encoding nor any hop-by-hop field (nor one the client's Connection named), and
 *      a Content-Length that frames its body; that body is one a client request carried.
 *   5. Proxied responses carry none of the pod's hop-by-hop fields, nor any field the
 *      Connection of the pod's answer named.
 *   6. Once the client is done and time has passed, the router closes the connection, and its
 *      accounting is back to zero: no request in flight, no body bytes held against the budget,
 *      no backend load or queued prefill, no session, no pod connection. The server is kept:
 *      what one input leaves behind, the next finds.
 *   7. Where the stream is cut changes nothing: without time passing between the writes, the
 *      client gets the same responses as when it sends everything in one write (the same
 *      statuses, bodies and closes; only which refusal ends the stream may differ, and the
 *      body of /metrics, whose counts the first run added to). A difference counts when a
 *      second pair of runs gives it again (loopback's timing on a loaded machine, below).
 *
 * Not reached: the body budget's pause (budget.h). A connection's first PCR_BODY_ALLOWANCE
 * bytes of body need no budget, and one request at a time may grow past it, so a pause needs
 * two connections with bodies past the allowance; an input here is at most MAX_INPUT_BYTES
 * bytes on one connection. The accounting the budget rests on is checked (6). */
#include <arpa/inet.h>
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

#include "accesslog.h"
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
#define POD_MARK "@@pod@@"       /* byte 3, bit 4: client bytes, the mark, the pod's answer */
#define MAX_INPUT_BYTES (64 * 1024)
#define MAX_MSGS 4096            /* client requests the mirror keeps */
#define TURNS (200 * 1000)       /* event-loop turns in one input, all phases */
#define FINAL_STEP_MS 500        /* virtual time let pass at once at the end */
#define FINAL_STEPS 600          /* 300 s: every deadline of the config below, many times */

/* Short deadlines, so that letting them pass costs few steps. */
static const char config_fmt[] =
    "{\"listen\": [{\"address\": \"127.0.0.1:1\"}],\n"
    " \"backends\": [{\"name\": \"pod\", \"url\": \"http://127.0.0.1:%u\", \"max_connections\": %u}],\n"
    " \"workers\": 1,\n"
    " \"limits\": {\"max_body_bytes\": %u, \"max_header_bytes\": %u},\n"
    " \"timeouts\": {\"connect_ms\": 1000, \"response_ms\": 3000, \"stream_idle_ms\": 3000,\n"
    "   \"upstream_keepalive_ms\": 6000, \"client_idle_ms\": 4000, \"request_header_ms\": 2000,\n"
    "   \"client_write_ms\": 5000, \"drain_ms\": 0},\n"
    " \"upstream\": {\"retries\": %u, \"request_usage\": %s},\n"
    " \"health\": {\"interval_ms\": 0},\n"
    " \"scrape\": {\"interval_ms\": 0, \"models_interval_ms\": 0},\n"
    " \"log\": {\"level\": \"error\", \"access_log\": %s, \"access_log_path\": \"/dev/null\",\n"
    "   \"access_log_format\": \"%s\"}%s}\n";

/* The pod's answers. `close`: the pod closes once it is written; `silent`: then says nothing
 * more; `broken`: the response the client gets may end early. */
typedef struct {
    const char *bytes;
    int close, silent, broken;
} answer_t;

#define JSON_OK "{\"id\":\"c\",\"choices\":[{\"text\":\"ok\"}],\"usage\":{\"prompt_tokens\":9," \
                "\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":4}}}"
#define SSE_1 "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
#define SSE_2 "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1," \
              "\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"
#define SSE_3 "data: [DONE]\n\n"

static const answer_t answers[16] = {
    /* 0: JSON with a length */
    {"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 130\r\n\r\n" JSON_OK, 0, 0, 0},
    /* 1: an SSE stream, chunked */
    {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
     "22\r\n" SSE_1 "\r\n74\r\n" SSE_2 "\r\ne\r\n" SSE_3 "\r\n0\r\n\r\n", 0, 0, 0},
    /* 2 */
    {"HTTP/1.1 204 No Content\r\n\r\n", 0, 0, 0},
    /* 3: the pod's own error */
    {"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: 61\r\n\r\n"
     "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":\"x\"}}", 0, 0, 0},
    /* 4: a body ended by the close */
    {"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" JSON_OK, 1, 0, 0},
    /* 5: interim responses first */
    {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", 0, 0, 0},
    /* 6: a status outside 100-599 */
    {"HTTP/1.1 600 Weird\r\nContent-Length: 2\r\n\r\n{}", 0, 0, 0},
    /* 7: a stream cut after its first event */
    {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
     "22\r\n" SSE_1 "\r\n", 1, 0, 1},
    /* 8: no answer at all (the router's response deadline) */
    {"", 0, 1, 0},
    /* 9: a close instead of an answer */
    {"", 1, 0, 0},
    /* 10: hop-by-hop fields of the pod's own, and trailers */
    {"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\nKeep-Alive: timeout=5\r\n"
     "Proxy-Connection: keep-alive\r\nTrailer: X-T\r\nUpgrade: h2c\r\nTE: trailers\r\n"
     "Transfer-Encoding: chunked\r\nX-Kept: 1\r\n\r\n2\r\n{}\r\n0\r\nX-T: 1\r\n\r\n", 0, 0, 0},
    /* 11: no body, whatever the length says */
    {"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", 0, 0, 0},
    /* 12: part of the body, then silence (the router's stream deadline) */
    {"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n{\"", 0, 1, 1},
    /* 13: a chunk size that is not one */
    {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 0, 1, 1},
    /* 14: HTTP/1.0, ended by the close */
    {"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{}", 1, 0, 0},
    /* 15: bytes after the response */
    {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\n\r\n", 0, 0, 0},
};

/* The answers that are meant to be whole parse whole (a wrong length above would make them
 * malformed, and the cases they stand for would go untested). */
static int ans_complete(http_parser *p)
{
    if (p->status_code >= 200)
        *(int *)p->data = 1;
    return 0;
}

/* RFC 9110: a 204 or 304 has no body, whatever its Content-Length says. */
static int no_body_status(int status) { return status == 204 || status == 304; }

static int ans_headers_complete(http_parser *p) { return no_body_status(p->status_code); }

static void check_answers(void)
{
    static const http_parser_settings s = {.on_headers_complete = ans_headers_complete,
                                           .on_message_complete = ans_complete};
    for (size_t i = 0; i < sizeof(answers) / sizeof(answers[0]); i++) {
        const answer_t *a = &answers[i];
        if (a->broken || a->bytes[0] == '\0')
            continue;
        int done = 0;
        http_parser p;
        http_parser_init(&p, HTTP_RESPONSE);
        p.data = &done;
        size_t len = strlen(a->bytes);
        size_t n = http_parser_execute(&p, &s, a->bytes, len);
        if (a->close)
            http_parser_execute(&p, &s, NULL, 0);
        FUZZ_CHECKF(done && (n == len || i == 15), "answer %zu does not parse whole", i);
    }
}

/* ---- the mirror: the client's bytes as http-parser reads them -------------------------- */

typedef struct {
    char method[16];
    fuzz_buf_t url;
    fuzz_buf_t body;
    fuzz_buf_t conn;        /* the values of its Connection fields, each after a comma */
    int complete;
} msg_t;

typedef struct {
    msg_t *msgs;
    size_t n, cap;          /* begun */
    fuzz_buf_t name;        /* the field being read */
    int in_value, is_conn;
} mirror_t;

static msg_t *cur_msg(http_parser *p)
{
    mirror_t *m = p->data;
    return m->n > 0 && m->n <= MAX_MSGS ? &m->msgs[m->n - 1] : NULL;
}

static int mi_begin(http_parser *p)
{
    mirror_t *m = p->data;
    m->n++;
    if (m->n > MAX_MSGS)
        return 0;
    if (m->n > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        msg_t *nm = realloc(m->msgs, cap * sizeof(*nm));
        FUZZ_CHECK(nm != NULL);
        m->msgs = nm;
        m->cap = cap;
    }
    memset(&m->msgs[m->n - 1], 0, sizeof(msg_t));
    m->name.len = 0;
    m->in_value = 0;
    return 0;
}

static int mi_url(http_parser *p, const char *at, size_t n)
{
    msg_t *msg = cur_msg(p);
    if (msg) {
        /* The method is known once the target begins: a refusal of the rest of a HEAD
         * request is a response to HEAD too. */
        snprintf(msg->method, sizeof(msg->method), "%s", http_method_str((enum http_method)p->method));
        fuzz_buf_add(&msg->url, at, n);
    }
    return 0;
}

static int mi_field(http_parser *p, const char *at, size_t n)
{
    mirror_t *m = p->data;
    if (m->in_value)
        m->name.len = 0;
    m->in_value = 0;
    fuzz_buf_add(&m->name, at, n);
    return 0;
}

static int mi_value(http_parser *p, const char *at, size_t n)
{
    mirror_t *m = p->data;
    msg_t *msg = cur_msg(p);
    if (!m->in_value) {
        m->in_value = 1;
        m->is_conn = m->name.len == 10 && strncasecmp((char *)m->name.p, "connection", 10) == 0;
        if (m->is_conn && msg)
            fuzz_buf_add(&msg->conn, ",", 1);
    }
    if (m->is_conn && msg)
        fuzz_buf_add(&msg->conn, at, n);
    return 0;
}

static int mi_body(http_parser *p, const char *at, size_t n)
{
    msg_t *msg = cur_msg(p);
    if (msg)
        fuzz_buf_add(&msg->body, at, n);
    return 0;
}

static int mi_complete(http_parser *p)
{
    msg_t *msg = cur_msg(p);
    if (msg)
        msg->complete = 1;
    http_parser_pause(p, 1); /* as the router does: one message at a time */
    return 0;
}

static const http_parser_settings mirror_settings = {
    .on_message_begin = mi_begin, .on_url = mi_url, .on_header_field = mi_field,
    .on_header_value = mi_value, .on_body = mi_body, .on_message_complete = mi_complete,
};

static void mirror_run(mirror_t *m, const uint8_t *data, size_t len)
{
    http_parser p;
    http_parser_init(&p, HTTP_REQUEST);
    p.data = m;
    size_t off = 0;
    while (off < len) {
        size_t n = http_parser_execute(&p, &mirror_settings, (const char *)data + off, len - off);
        off += n;
        if (HTTP_PARSER_ERRNO(&p) == HPE_PAUSED)
            http_parser_pause(&p, 0);
        else if (HTTP_PARSER_ERRNO(&p) != HPE_OK || n == 0)
            break;
    }
}

static void mirror_free(mirror_t *m)
{
    for (size_t i = 0; i < m->n && i < MAX_MSGS; i++) {
        fuzz_buf_free(&m->msgs[i].url);
        fuzz_buf_free(&m->msgs[i].body);
        fuzz_buf_free(&m->msgs[i].conn);
    }
    free(m->msgs);
    fuzz_buf_free(&m->name);
}

/* The path the router makes of a request target (h1_server.c): origin-form as is, an absolute
 * URL's path, "/" when it has none. 0 when it is neither. */
static int target_path(const msg_t *msg, const char **path, size_t *len)
{
    const char *u = (const char *)msg->url.p;
    size_t n = msg->url.len;
    if (n > 0 && (u[0] == '/' || (n == 1 && u[0] == '*'))) {
        *path = u;
        *len = n;
        return 1;
    }
    struct http_parser_url pu;
    http_parser_url_init(&pu);
    if (n == 0 || http_parser_parse_url(u, n, 0, &pu) != 0 || !(pu.field_set & (1 << UF_SCHEMA)) ||
        !(pu.field_set & (1 << UF_HOST)))
        return 0;
    if (!(pu.field_set & (1 << UF_PATH))) {
        *path = "/";
        *len = 1;
    } else {
        *path = u + pu.field_data[UF_PATH].off;
        *len = n - pu.field_data[UF_PATH].off;
    }
    return 1;
}

/* ---- the pod ----------------------------------------------------------------------------- */

typedef struct h1r h1r_t;

struct h1r {
    const uint8_t *ctl;
    const uint8_t *req;
    size_t req_len;
    int variant, client_end, admin;
    char host[32];               /* the backend's Host header */
    /* The server under test. */
    fuzz_router_t *rt;           /* kept across inputs (fuzz_router.h) */
    int sock_fd;                 /* the client's end */
    int client_eof, client_closed, client_shut;
    fuzz_buf_t out;              /* what the router wrote to the client */
    fuzz_buf_t transcript;       /* the responses in it, in short (check_final) */
    mirror_t mirror;
    /* The pod. */
    int lfd;
    fuzz_pods_t pods;
    unsigned pod_requests;       /* requests the pod has answered or ignored */
    int broken;                  /* a pod answer broke a response */
    const uint8_t *pod_raw;      /* the input's own answer (byte 3, bit 4), or NULL */
    size_t pod_raw_len;
    fuzz_buf_t pod_conn;         /* the Connection values of the answers the pod gave */
    unsigned turns;
};

/* Whether `list` (Connection values, each after a comma) names the field `name`. The harness's
 * own reading, not the router's pcr_http_list_has(): a check cannot borrow what it checks. */
static int conn_lists(const fuzz_buf_t *list, const char *name, size_t len)
{
    if (list->len == 0)
        return 0;
    const char *p = (const char *)list->p, *end = p + list->len;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
            p++;
        const char *e = p;
        while (e < end && *e != ',' && *e != ' ' && *e != '\t')
            e++;
        if ((size_t)(e - p) == len && len > 0 && strncasecmp(p, name, len) == 0)
            return 1;
        p = e;
    }
    return 0;
}

/* A whole request reached the pod: is it one a client sent, framed as it should be? */
static void pod_check(fuzz_pod_t *c)
{
    h1r_t *t = c->owner;
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
    /* The client requests it may come from: the same method and path, complete. */
    size_t candidates = 0, same_body = 0;
    const char *names = c->hnames.len ? (const char *)c->hnames.p : "";
    const char *names_end = names + c->hnames.len;
    int *listed_by_all = NULL;
    size_t nnames = 0;
    for (const char *q = names; q < names_end; q += strlen(q) + 1)
        nnames++;
    listed_by_all = calloc(nnames ? nnames : 1, sizeof(int));
    FUZZ_CHECK(listed_by_all != NULL);
    for (size_t k = 0; k < nnames; k++)
        listed_by_all[k] = 1;
    for (size_t i = 0; i < t->mirror.n && i < MAX_MSGS; i++) {
        const msg_t *m = &t->mirror.msgs[i];
        const char *path;
        size_t plen;
        if (!m->complete || strcmp(m->method, method) != 0 || !target_path(m, &path, &plen) ||
            plen != c->url.len || !fuzz_mem_eq(path, c->url.p, plen))
            continue;
        candidates++;
        if (m->body.len == c->body.len && fuzz_mem_eq(m->body.p, c->body.p, c->body.len))
            same_body++;
        size_t k = 0;
        for (const char *q = names; q < names_end; q += strlen(q) + 1, k++)
            listed_by_all[k] &= conn_lists(&m->conn, q, strlen(q));
    }
    /* GET /v1/models is the router's own (its endpoint asks every pod), never a client's
     * request passed on: whatever the client's carried, this one has no body. */
    int fanout = strcmp(method, "GET") == 0 && c->url.len == 10 &&
                 fuzz_mem_eq(c->url.p, "/v1/models", 10);
    FUZZ_CHECKF(candidates > 0 || fanout, "the pod got %s %.*s, which no client sent", method,
                (int)c->url.len, (char *)c->url.p);
    if (candidates > 0 && !fanout) {
        /* upstream.request_usage may add stream_options to the body. */
        int usage = t->variant == 2 && c->body.len > 14 &&
                    memmem(c->body.p, c->body.len, "\"stream_options\"", 16) != NULL;
        FUZZ_CHECKF(same_body > 0 || usage, "the pod got a %zu-byte body no client sent",
                    c->body.len);
        /* Host and Content-Length are the router's own (the pod's authority, the body it
         * sends): the client's are never passed on, whatever its Connection names. */
        size_t k = 0;
        for (const char *q = names; q < names_end; q += strlen(q) + 1, k++)
            FUZZ_CHECKF(!listed_by_all[k] || strcasecmp(q, "host") == 0 ||
                            strcasecmp(q, "content-length") == 0,
                        "%s reached the pod though the client's Connection named it", q);
    }
    free(listed_by_all);
}

/* The Connection values of an answer's first final response: the fields they name must not
 * reach the client. */
typedef struct {
    fuzz_buf_t *out, name;
    size_t mark;             /* out's length before the message being read */
    int in_value, is_conn, done;
} conn_scan_t;

static int cs_field(http_parser *p, const char *at, size_t n)
{
    conn_scan_t *cs = p->data;
    if (cs->in_value)
        cs->name.len = 0;
    cs->in_value = 0;
    fuzz_buf_add(&cs->name, at, n);
    return 0;
}

static int cs_value(http_parser *p, const char *at, size_t n)
{
    conn_scan_t *cs = p->data;
    if (!cs->in_value) {
        cs->in_value = 1;
        cs->is_conn = cs->name.len == 10 && strncasecmp((char *)cs->name.p, "connection", 10) == 0;
        if (cs->is_conn && !cs->done)
            fuzz_buf_add(cs->out, ",", 1);
    }
    if (cs->is_conn && !cs->done)
        fuzz_buf_add(cs->out, at, n);
    return 0;
}

static int cs_headers_complete(http_parser *p)
{
    conn_scan_t *cs = p->data;
    cs->name.len = 0;
    cs->in_value = 0;
    if (!cs->done && p->status_code < 200)
        cs->out->len = cs->mark; /* a 1xx's fields are dropped with it */
    cs->done |= p->status_code >= 200;
    return 1;
}

static void scan_connection(fuzz_buf_t *out, const char *answer, size_t len)
{
    static const http_parser_settings s = {.on_header_field = cs_field,
                                           .on_header_value = cs_value,
                                           .on_headers_complete = cs_headers_complete};
    size_t mark = out->len;
    conn_scan_t cs = {.out = out, .mark = mark};
    http_parser p;
    http_parser_init(&p, HTTP_RESPONSE);
    p.data = &cs;
    http_parser_execute(&p, &s, answer, len);
    if (!cs.done)
        out->len = mark; /* not a head the router would forward */
    fuzz_buf_free(&cs.name);
}

static void pod_answer(fuzz_pod_t *c)
{
    h1r_t *t = c->owner;
    t->pod_requests++;
    if (t->pod_raw != NULL) {
        /* The input's own answer, to every request: anything may break. */
        fuzz_buf_add(&c->outq, t->pod_raw, t->pod_raw_len);
        scan_connection(&t->pod_conn, (const char *)t->pod_raw, t->pod_raw_len);
        t->broken = 1;
        c->close_when_sent = t->ctl[2] & 1;
        return;
    }
    unsigned base = t->ctl[2] & 15, stride = t->ctl[2] >> 4;
    const answer_t *a = &answers[(base + (t->pod_requests - 1) * stride) % 16];
    fuzz_buf_add(&c->outq, a->bytes, strlen(a->bytes));
    scan_connection(&t->pod_conn, a->bytes, strlen(a->bytes));
    t->broken |= a->broken;
    c->close_when_sent = a->close;
    c->silent = a->silent;
}

static const fuzz_pod_ops_t pod_ops = {pod_check, pod_answer};

/* ---- the harness's turn ------------------------------------------------------------------ */

static int step(void *arg)
{
    h1r_t *t = arg;
    return fuzz_pods_turn(&t->pods, t->lfd, &pod_ops, t, t->host,
                          t->client_closed || t->client_eof ? -1 : t->sock_fd, &t->out,
                          &t->client_eof);
}

static void run(h1r_t *t)
{
    FUZZ_CHECKF(fuzz_run(t->rt->w.base, step, t, &t->turns) == 0,
                "the router did not go quiet within %u event-loop turns", TURNS);
}

static void run_any(void *t) { run(t); }

/* ---- the responses, parsed back -------------------------------------------------------- */

typedef struct {
    h1r_t *t;
    size_t start;            /* where the response being parsed begins in t->out */
    size_t finals;           /* final responses so far */
    int status, head, proxied, conn_close, ctype_json, in_message;
    unsigned n_conn, n_te, n_cl;
    fuzz_buf_t name, value, body;
    fuzz_buf_t hnames;       /* its field names, each followed by '\0' */
    int in_value;
} resp_t;

static void resp_flush_header(resp_t *r)
{
    if (!r->in_value)
        return;
    const char *n = (const char *)r->name.p, *v = (const char *)r->value.p;
    size_t len = r->name.len, vlen = r->value.len;
#define IS(s) (len == strlen(s) && strncasecmp(n, s, len) == 0)
    if (IS("x-pcrouter-backend"))
        r->proxied = 1;
    if (IS("connection")) {
        r->n_conn++;
        r->conn_close = vlen == 5 && strncasecmp(v, "close", 5) == 0;
    }
    if (IS("content-type"))
        r->ctype_json = vlen == 16 && strncasecmp(v, "application/json", 16) == 0;
    r->n_te += IS("transfer-encoding");
    r->n_cl += IS("content-length");
    FUZZ_CHECKF(!(IS("keep-alive") || IS("proxy-connection") || IS("upgrade") || IS("trailer") ||
                  IS("te")),
                "a hop-by-hop field reached the client: %.*s", (int)len, n);
    /* The fields the router writes itself, whatever the pod's Connection named. */
    if (!(IS("connection") || IS("content-length") || IS("transfer-encoding") ||
          IS("x-pcrouter-backend") || IS("x-pcrouter-route"))) {
        fuzz_buf_add(&r->hnames, n, len);
        fuzz_buf_add(&r->hnames, "", 1);
    }
#undef IS
    r->name.len = r->value.len = 0;
    r->in_value = 0;
}

static int re_begin(http_parser *p)
{
    resp_t *r = p->data;
    r->status = r->head = r->proxied = r->conn_close = r->ctype_json = 0;
    r->n_conn = r->n_te = r->n_cl = 0;
    r->name.len = r->value.len = r->body.len = r->hnames.len = 0;
    r->in_value = 0;
    r->in_message = 1;
    return 0;
}

static int re_field(http_parser *p, const char *at, size_t n)
{
    resp_t *r = p->data;
    resp_flush_header(r);
    fuzz_buf_add(&r->name, at, n);
    return 0;
}

static int re_value(http_parser *p, const char *at, size_t n)
{
    resp_t *r = p->data;
    r->in_value = 1;
    fuzz_buf_add(&r->value, at, n);
    return 0;
}

/* The request the response answers: the k-th final response answers the k-th request. */
static const msg_t *answered(resp_t *r)
{
    const mirror_t *m = &r->t->mirror;
    return r->finals < m->n && r->finals < MAX_MSGS ? &m->msgs[r->finals] : NULL;
}

static int re_headers_complete(http_parser *p)
{
    resp_t *r = p->data;
    resp_flush_header(r);
    r->status = p->status_code;
    FUZZ_CHECKF(r->status >= 100 && r->status <= 599, "the client got status %d", r->status);
    FUZZ_CHECKF(r->n_conn <= 1 && r->n_te <= 1 && r->n_cl <= 1 && !(r->n_te && r->n_cl),
                "response framing: %u Connection, %u Transfer-Encoding, %u Content-Length",
                r->n_conn, r->n_te, r->n_cl);
    if (r->status < 200)
        return 0;
    /* A field the pod's Connection named is the pod's hop-by-hop field. */
    const char *names = r->hnames.len ? (const char *)r->hnames.p : "";
    for (const char *q = names; r->proxied && q < names + r->hnames.len; q += strlen(q) + 1)
        FUZZ_CHECKF(!conn_lists(&r->t->pod_conn, q, strlen(q)),
                    "%s reached the client though the pod's Connection named it", q);
    const msg_t *m = answered(r);
    r->head = m != NULL && strcmp(m->method, "HEAD") == 0;
    /* The router takes a request for a HEAD once its head is read whole: the refusal of one
     * cut short may carry a body. Nothing follows a refusal, so what follows its head says. */
    if (r->head && !r->proxied && (r->status == 400 || r->status == 408 || r->status == 413 ||
                                   r->status == 431)) {
        const uint8_t *out = r->t->out.p + r->start, *end = r->t->out.p + r->t->out.len;
        const uint8_t *blank = memmem(out, (size_t)(end - out), "\r\n\r\n", 4);
        r->head = blank == NULL || blank + 4 == end;
    }
    return r->head || no_body_status(r->status); /* no body, whatever the length says */
}

static int re_body(http_parser *p, const char *at, size_t n)
{
    fuzz_buf_add(&((resp_t *)p->data)->body, at, n);
    return 0;
}

static int re_complete(http_parser *p)
{
    ((resp_t *)p->data)->in_message = 0;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings resp_settings = {
    .on_message_begin = re_begin, .on_header_field = re_field, .on_header_value = re_value,
    .on_headers_complete = re_headers_complete, .on_body = re_body,
    .on_message_complete = re_complete,
};

/* The router's own error: an OpenAI-style body. Whether it is a refusal of the request's
 * framing (after which the connection cannot go on), from its code. */
static int check_error_body(resp_t *r)
{
    FUZZ_CHECKF(r->ctype_json, "an error %d without a JSON body", r->status);
    cJSON *root = cJSON_ParseWithLength((const char *)r->body.p, r->body.len);
    cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    cJSON *code = cJSON_GetObjectItemCaseSensitive(err, "code");
    FUZZ_CHECKF(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err, "message")) &&
                    cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err, "type")) &&
                    cJSON_IsString(code),
                "error %d body: %.*s", r->status, (int)r->body.len, (char *)r->body.p);
    int refusal = strcmp(code->valuestring, "bad_request") == 0;
    cJSON_Delete(root);
    return refusal;
}

/* One final response parsed whole; `rest`: output bytes after it. */
static void check_final(resp_t *r, size_t rest)
{
    const msg_t *m = answered(r);
    const char *path = NULL;
    size_t plen = 0;
    /* /health's own 503 (no backend up) is its status document, not an error. */
    int health = r->status == 503 && m != NULL && target_path(m, &path, &plen) && plen >= 7 &&
                 strncmp(path, "/health", 7) == 0;
    /* A 400 is a refusal when the framing was at fault (code "bad_request"), not the body
     * (invalid_json, missing_prompt); 408, 413 and 431 always are. */
    int refusal = !r->proxied && (r->status == 408 || r->status == 413 || r->status == 431);
    if (!r->proxied && r->status >= 400 && !r->head && !health)
        refusal |= check_error_body(r) && r->status == 400;
    if (refusal)
        FUZZ_CHECKF(r->conn_close && rest == 0, "a %d with %s and %zu bytes after it", r->status,
                    r->conn_close ? "Connection: close" : "no Connection: close", rest);
    FUZZ_CHECKF(!r->conn_close || rest == 0, "%zu bytes after a Connection: close response", rest);
    /* Which refusal ends a stream can depend on where it is cut (http-parser's error in the
     * middle of a buffer comes before the callbacks that would have delivered its start to the
     * router's own checks): a refusal is one entry, whatever its status and message. */
    /* /metrics reports counts every input adds to (the server is kept, fuzz_router.h): of
     * its answer, the status and the close are compared, not the body. */
    int metrics = !r->proxied && m != NULL && target_path(m, &path, &plen) && plen >= 8 &&
                  strncmp(path, "/metrics", 8) == 0;
    char line[64];
    if (refusal)
        snprintf(line, sizeof(line), "refused\n");
    else if (metrics)
        snprintf(line, sizeof(line), "%d metrics%s\n", r->status, r->conn_close ? " close" : "");
    else
        snprintf(line, sizeof(line), "%d%s%s %zu\n", r->status, r->proxied ? " proxied" : "",
                 r->conn_close ? " close" : "", r->body.len);
    fuzz_buf_add(&r->t->transcript, line, strlen(line));
    if (!refusal && !metrics)
        fuzz_buf_add(&r->t->transcript, r->body.p, r->body.len);
    r->finals++;
    /* A refusal of bytes http-parser could not begin as a request is the one response
     * without a request of its own. */
    size_t begun = r->t->mirror.n;
    FUZZ_CHECKF(r->finals <= begun || (r->finals == begun + 1 && r->status == 400 && !r->proxied),
                "%zu final responses to %zu requests", r->finals, begun);
}

/* FUZZ_TRACE=1: what the client got, printed before it is checked. */
static void trace_output(const h1r_t *t)
{
    static int on = -1;
    if (on < 0)
        on = getenv("FUZZ_TRACE") != NULL;
    if (!on)
        return;
    fprintf(stderr, "--- %zu bytes to the client (pod: %u requests)\n", t->out.len,
            t->pod_requests);
    for (size_t i = 0; i < t->out.len; i++) {
        uint8_t c = t->out.p[i];
        if (c == '\n' || (c >= 0x20 && c < 0x7f))
            fputc(c, stderr);
        else if (c != '\r')
            fprintf(stderr, "\\x%02x", c);
    }
    fprintf(stderr, "\n---\n");
}

static void check_output(h1r_t *t)
{
    trace_output(t);
    resp_t r = {.t = t};
    http_parser p;
    http_parser_init(&p, HTTP_RESPONSE);
    p.data = &r;
    size_t off = 0, len = t->out.len;
    const char *out = (const char *)t->out.p;
    while (off < len) {
        r.start = off; /* the parser stops at each response's end: the next begins here */
        size_t n = http_parser_execute(&p, &resp_settings, out + off, len - off);
        off += n;
        enum http_errno e = HTTP_PARSER_ERRNO(&p);
        FUZZ_CHECKF(e == HPE_OK || e == HPE_PAUSED, "the client cannot parse the router's output "
                    "at byte %zu: %s", off, http_errno_description(e));
        if (e != HPE_PAUSED)
            break;
        http_parser_pause(&p, 0);
        if (r.status >= 200)
            check_final(&r, len - off);
    }
    /* A body the close ends (HTTP/1.0 clients), once the router closed. */
    if (r.in_message && t->client_eof) {
        http_parser_execute(&p, &resp_settings, NULL, 0);
        if (HTTP_PARSER_ERRNO(&p) == HPE_PAUSED && r.status >= 200)
            check_final(&r, 0);
    }
    FUZZ_CHECKF(!r.in_message || (r.proxied && t->broken) || t->client_end == 1 ||
                    t->client_end == 3,
                "a response left incomplete (status %d, %s)", r.status,
                r.proxied ? "proxied" : "the router's own");
    fuzz_buf_free(&r.name);
    fuzz_buf_free(&r.value);
    fuzz_buf_free(&r.body);
    fuzz_buf_free(&r.hnames);
}

/* ---- the server under test --------------------------------------------------------------- */

static void setup(h1r_t *t)
{
    static const unsigned body[4] = {33554432, 1024, 33554432, 33554432};
    static const unsigned head[4] = {16384, 1024, 16384, 16384};
    uint16_t port;
    t->lfd = fuzz_pods_listener(&port);
    snprintf(t->host, sizeof(t->host), "127.0.0.1:%u", port);
    char text[2048];
    snprintf(text, sizeof(text), config_fmt, port, t->variant == 3 ? 1 : 2, body[t->variant],
             head[t->variant], t->variant == 3 ? 0 : 1, t->variant == 2 ? "true" : "false",
             t->variant >= 2 ? "true" : "false", t->variant == 2 ? "json" : "text",
             t->variant == 2 ? ",\n \"admin\": {\"address\": \"127.0.0.1:2\"}" : "");
    t->rt = fuzz_router_get((unsigned)t->variant, text);
    fuzz_router_reset(t->rt);
    pcr_sock_t *sock = fuzz_router_connect(t->rt, &t->sock_fd);
    if (t->admin)
        pcr_sock_set_admin(sock);
    FUZZ_CHECK(pcr_h1_session_start(&t->rt->w, sock) == 0);
}

/* What the input made is freed; the server and the pod's listener stay for the next. */
static void teardown(h1r_t *t)
{
    fuzz_pods_free(&t->pods);
    int fd;
    while ((fd = fuzz_accept(t->lfd)) >= 0)
        close(fd);
    if (!t->client_closed)
        close(t->sock_fd);
    fuzz_buf_free(&t->out);
    fuzz_buf_free(&t->transcript);
    fuzz_buf_free(&t->pod_conn);
    mirror_free(&t->mirror);
}

static void finish_client(h1r_t *t, int end)
{
    if (end == 3 && !t->client_closed) {
        close(t->sock_fd);
        t->client_closed = 1;
    } else if (end != 2 && !t->client_shut) {
        shutdown(t->sock_fd, SHUT_WR);
        t->client_shut = 1;
    }
}

/* One run of the input, its bytes cut into writes by `seed`; the responses the client got, in
 * short (check_final), are added to `out` when not NULL. */
static void run_case(const uint8_t *data, size_t size, uint32_t seed, fuzz_buf_t *out)
{
    static const unsigned gaps[8] = {0, 0, 0, 0, 100, 1000, 2100, 4100};
    h1r_t *t = calloc(1, sizeof(*t));
    FUZZ_CHECK(t != NULL);
    t->ctl = data;
    t->req = data + CTRL;
    t->req_len = size - CTRL;
    t->variant = data[0] & 3;
    t->client_end = (data[0] >> 2) & 3;
    t->admin = (data[0] >> 4) & 1;
    t->turns = TURNS;
    unsigned gap = gaps[data[0] >> 5];
    if (data[3] & 0x10) {
        /* The pod answers with the bytes after the marker; the client sends those before. */
        const uint8_t *mark = memmem(t->req, t->req_len, POD_MARK, sizeof(POD_MARK) - 1);
        size_t at = mark != NULL ? (size_t)(mark - t->req) : t->req_len;
        t->pod_raw = t->req + at + (mark != NULL ? sizeof(POD_MARK) - 1 : 0);
        t->pod_raw_len = t->req_len - (size_t)(t->pod_raw - t->req);
        t->req_len = at;
    }
    mirror_run(&t->mirror, t->req, t->req_len);

    fuzz_clock_start();
    setup(t);
    run(t);
    fuzz_split_t cut;
    fuzz_split_init(&cut, seed, (size_t)1 << (data[3] & 15));
    size_t off = 0;
    int stuck = 0;
    while (off < t->req_len && !t->client_eof && !stuck) {
        size_t n = fuzz_split_next(&cut, t->req_len - off);
        for (size_t done = 0; done < n && !t->client_eof && !stuck;) {
            size_t w = fuzz_write(t->sock_fd, t->req + off + done, n - done);
            done += w;
            run(t);
            stuck = w == 0; /* the router reads no more (it went quiet with the buffer full) */
        }
        off += n;
        if (gap > 0 && off < t->req_len) {
            fuzz_clock_advance(gap);
            run(t);
        }
    }
    if (t->client_end != 0)
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
    if (out != NULL)
        fuzz_buf_add(out, t->transcript.p, t->transcript.len);
    teardown(t);
    fuzz_clock_stop();
    free(t);
}

/* Where two transcripts first differ, SIZE_MAX when they are the same. */
static size_t differ_at(const fuzz_buf_t *a, const fuzz_buf_t *b)
{
    size_t i = 0;
    while (i < a->len && i < b->len && a->p[i] == b->p[i])
        i++;
    return a->len == b->len && i == a->len ? SIZE_MAX : i;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int once;
    if (!once) {
        signal(SIGPIPE, SIG_IGN);
        pcr_log_set_level(PCR_LOG_ERROR);
        check_answers();
        once = 1;
    }
    if (size < CTRL || size > MAX_INPUT_BYTES)
        return 0;
    /* Without time passing between the writes, where the stream is cut changes nothing. */
    int compare = data[1] != 0 && (data[0] >> 5) < 4;
    fuzz_buf_t cut = {0}, whole = {0};
    run_case(data, size, data[1], compare ? &cut : NULL);
    if (compare) {
        run_case(data, size, 0, &whole);
        size_t i = differ_at(&cut, &whole);
        /* On a loaded machine loopback may hand a pod's bytes or close over after the turn that
         * should have seen them (test/fuzz/README.md), and the router then hears the client and
         * the pod in another order in one of the two runs. A cut that changes the responses
         * does so in every run (time is virtual, the bytes the same), so a difference counts
         * when a second pair of runs gives it again. */
        if (i != SIZE_MAX) {
            fuzz_buf_t cut2 = {0}, whole2 = {0};
            run_case(data, size, data[1], &cut2);
            run_case(data, size, 0, &whole2);
            FUZZ_CHECKF(differ_at(&cut2, &whole2) == SIZE_MAX,
                        "cut into writes, the client got:\n%.*s\nin one write:\n%.*s\n(they "
                        "differ from byte %zu; so did a second pair of runs)", (int)cut.len,
                        (char *)cut.p, (int)whole.len, (char *)whole.p, i);
            fuzz_buf_free(&cut2);
            fuzz_buf_free(&whole2);
        }
    }
    fuzz_buf_free(&cut);
    fuzz_buf_free(&whole);
    return 0;
}
