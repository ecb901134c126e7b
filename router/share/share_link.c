/* router/share/share_link.c: two hiredis async connections to Redis with timeouts and back-off
 * (share_link.h).
 *
 * Who frees a hiredis context: hiredis itself when a connect fails (after on_connect reports
 * it) or a connection breaks (after on_disconnect); this file otherwise, with redisAsyncFree,
 * and never from inside a hiredis callback (hiredis 0.14 would go on using the context): a
 * failure noticed in a callback only bumps the generation and wakes `fail_ev`, which tears
 * down later. A command's reply callback checks the generation, so a reply that arrives for a
 * connection already given up is handed on as NULL (lost), never as a live answer. */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/util.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>

#include "atomic.h"
#include "dns.h"
#include "log.h"
#include "pcr/common.h"
#include "clock.h"
#include "share_link.h"

#define TICK_MS 50

typedef enum { L_IDLE, L_WAIT, L_RESOLVING, L_CONNECTING, L_UP } lstate_t;

typedef struct {
    pcr_share_link_t *l;
    redisAsyncContext *ac;      /* NULL once closed */
    int ready;                  /* answered PING */
    unsigned npending;          /* commands sent, not answered */
    uint64_t since_us;          /* the last reply, or the send that made npending 1 */
    uint64_t allow_us;          /* how long the pending commands may take */
    size_t max_reply;           /* bytes one reply may take (strings), see bounded_read */
    size_t reply_bytes;         /* of the reply being read */
    int oversize;               /* the reply being read passed max_reply */
} conn_t;

struct pcr_share_link {
    struct event_base *base;
    const pcr_redis_conf_t *rc;
    pcr_share_link_cbs_t cbs;
    void *arg;
    lstate_t state;
    unsigned gen;               /* bumped when connections are given up */
    conn_t conn[2];
    pcr_dns_t *dns;             /* borrowed; NULL when the host is an address */
    pcr_dns_query_t *dns_req;
    struct event *tick, *retry, *fail_ev;
    uint64_t attempt_us;        /* start of the current attempt */
    unsigned backoff_ms;
    int failing, closing;
    int was_up;                 /* this attempt reached up: its end is reported by on_down */
    uint64_t up_us;             /* when it did */
    int quiet;                  /* the outage is logged already */
    unsigned short rng[3];      /* back-off jitter */
    uint64_t oversize;          /* replies refused for their size (atomic) */
    char why[200];
    char addr[INET6_ADDRSTRLEN];
};

typedef struct {
    pcr_share_link_t *l;
    unsigned gen;
    pcr_link_conn_t which;
    pcr_link_reply_fn fn;
    void *arg;
} cmd_t;

static void link_failf(pcr_share_link_t *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- commands ------------------------------------------------------------------------ */

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    cmd_t *cmd = priv;
    pcr_share_link_t *l = cmd->l;
    int current = cmd->gen == l->gen && !l->closing;
    if (current) {
        conn_t *c = &l->conn[cmd->which];
        c->reply_bytes = 0; /* the next reply starts */
        if (c->npending > 0 && --c->npending == 0)
            c->allow_us = 0;
        c->since_us = pcr_now_us();
        if (reply == NULL)
            link_failf(l, "connection lost");
    }
    cmd->fn(cmd->arg, current ? reply : NULL);
    free(cmd);
}

static int send_cmd(pcr_share_link_t *l, pcr_link_conn_t which, unsigned extra_ms,
                    pcr_link_reply_fn fn, void *arg, int argc, const char **argv,
                    const size_t *lens)
{
    conn_t *c = &l->conn[which];
    if (c->ac == NULL || l->failing || l->closing)
        return PCR_ERR_UNAVAIL;
    cmd_t *cmd = malloc(sizeof(*cmd));
    if (cmd == NULL)
        return PCR_ERR_NOMEM;
    *cmd = (cmd_t){l, l->gen, which, fn, arg};
    if (redisAsyncCommandArgv(c->ac, on_reply, cmd, argc, argv, lens) != REDIS_OK) {
        free(cmd);
        link_failf(l, "cannot send a command: %s", c->ac->errstr[0] ? c->ac->errstr : "closing");
        return PCR_ERR_UNAVAIL;
    }
    if (c->npending++ == 0)
        c->since_us = pcr_now_us();
    uint64_t allow = ((uint64_t)l->rc->timeout_ms + extra_ms) * 1000;
    if (allow > c->allow_us)
        c->allow_us = allow;
    return 0;
}

int pcr_share_link_cmd(pcr_share_link_t *l, pcr_link_conn_t which, unsigned extra_ms,
                       pcr_link_reply_fn fn, void *arg, int argc, const char **argv,
                       const size_t *lens)
{
    if (l->state != L_UP)
        return PCR_ERR_UNAVAIL;
    return send_cmd(l, which, extra_ms, fn, arg, argc, argv, lens);
}

int pcr_share_link_up(const pcr_share_link_t *l) { return l->state == L_UP && !l->failing; }

/* ---- connecting ---------------------------------------------------------------------- */

static void hello_reply(pcr_share_link_t *l, conn_t *c, redisReply *r, const char *what)
{
    if (r == NULL)
        return;   /* lost: the failure is handled already */
    if (r->type == REDIS_REPLY_ERROR) {
        link_failf(l, "%s refused: %.120s", what, r->str);
        return;
    }
    if (strcmp(what, "PING") != 0)
        return;
    c->ready = 1;
    if (!l->conn[0].ready || !l->conn[1].ready)
        return;
    l->state = L_UP;
    l->was_up = 1;
    l->up_us = pcr_now_us();
    l->quiet = 0;
    pcr_log_info("share: connected to redis %s:%u", l->addr, (unsigned)l->rc->port);
    if (l->cbs.on_up)
        l->cbs.on_up(l->arg);
}

static void on_auth(void *arg, redisReply *r)
{
    conn_t *c = arg;
    hello_reply(c->l, c, r, "AUTH");
}

static void on_select(void *arg, redisReply *r)
{
    conn_t *c = arg;
    hello_reply(c->l, c, r, "SELECT");
}

static void on_ping(void *arg, redisReply *r)
{
    conn_t *c = arg;
    hello_reply(c->l, c, r, "PING");
}

/* AUTH and SELECT as the url asks, then PING: queued at once, sent once connected. */
static void send_hello(pcr_share_link_t *l, pcr_link_conn_t which)
{
    const pcr_redis_conf_t *rc = l->rc;
    conn_t *c = &l->conn[which];
    if (rc->password != NULL) {
        const char *argv[3] = {"AUTH", rc->user ? rc->user : rc->password, rc->password};
        send_cmd(l, which, 0, on_auth, c, rc->user ? 3 : 2, argv, NULL);
    }
    if (rc->db != 0) {
        char db[16];
        snprintf(db, sizeof db, "%u", rc->db);
        const char *argv[2] = {"SELECT", db};
        send_cmd(l, which, 0, on_select, c, 2, argv, NULL);
    }
    const char *argv[1] = {"PING"};
    send_cmd(l, which, 0, on_ping, c, 1, argv, NULL);
}

/* hiredis says a connect ended; on failure it frees the context after this returns. */
static void on_connect(const redisAsyncContext *ac, int status)
{
    conn_t *c = ac->data;
    if (c == NULL || c->ac != ac || status == REDIS_OK)
        return;
    c->ac = NULL;
    link_failf(c->l, "cannot connect: %.120s", ac->errstr);
}

/* hiredis closed a connection (an error, or our redisAsyncFree) and frees it after this. */
static void on_disconnect(const redisAsyncContext *ac, int status)
{
    conn_t *c = ac->data;
    if (c == NULL || c->ac != ac)
        return;   /* ours: closed on purpose */
    c->ac = NULL;
    if (c->oversize)
        link_failf(c->l, "a reply over %zu bytes", c->max_reply);
    else
        link_failf(c->l, "connection closed%s%.120s", status == REDIS_OK ? "" : ": ",
                   status == REDIS_OK ? "" : ac->errstr);
}

/* ---- bounded replies ------------------------------------------------------------------ */

/* hiredis 0.14 has no bound on a reply (no maxelements; maxbuf only trims an idle buffer):
 * a 200 MB stream entry would be buffered whole, then read again at every reconnect. So the
 * reads are watched: before each read, the bytes buffered and not yet parsed (a bulk string
 * still arriving), and while parsing, the strings and arrays a reply is made of. The reader
 * being fed is known by this thread's `reading`, set around redisAsyncHandleRead. */
#define MAX_ELEMENTS (1 << 20)

static __thread conn_t *reading;
static redisReplyObjectFunctions *orig_fn;
static redisReplyObjectFunctions bounded_fn;

static void oversize(conn_t *c)
{
    if (!c->oversize) {
        c->oversize = 1;
        PCR_INC(c->l->oversize);
    }
}

static void *bounded_string(const redisReadTask *t, char *str, size_t len)
{
    conn_t *c = reading;
    if (c != NULL) {
        c->reply_bytes += len;
        if (c->reply_bytes > c->max_reply) {
            oversize(c);
            return NULL; /* the reader fails ("out of memory"): the connection closes */
        }
    }
    return orig_fn->createString(t, str, len);
}

static void *bounded_array(const redisReadTask *t, int elements)
{
    if (elements > MAX_ELEMENTS) {
        if (reading != NULL)
            oversize(reading);
        return NULL;
    }
    return orig_fn->createArray(t, elements);
}

static void bounded_read(int fd, short what, void *arg)
{
    redisLibeventEvents *e = arg;
    redisAsyncContext *ac = e->context;
    conn_t *c = ac->data;
    redisReader *r = ac->c.reader;
    if (c != NULL && c->ac == ac && r != NULL && r->len - r->pos > c->max_reply) {
        event_del(e->rev);
        oversize(c);
        link_failf(c->l, "a reply over %zu bytes", c->max_reply);
        return;
    }
    reading = c != NULL && c->ac == ac ? c : NULL;
    redisAsyncHandleRead(ac); /* may free ac and e */
    reading = NULL;
}

/* The libevent adapter, with its read event replaced by bounded_read and the reader's
 * reply makers by the bounded ones. */
static int attach_bounded(redisAsyncContext *ac, struct event_base *base)
{
    if (redisLibeventAttach(ac, base) != REDIS_OK)
        return -1;
    redisLibeventEvents *e = ac->ev.data;
    struct event *rev = event_new(base, ac->c.fd, EV_READ, bounded_read, e);
    if (rev == NULL)
        return -1;
    event_free(e->rev);
    e->rev = rev;
    event_add(e->rev, NULL);
    if (orig_fn == NULL) {
        orig_fn = ac->c.reader->fn;
        bounded_fn = *orig_fn;
        bounded_fn.createString = bounded_string;
        bounded_fn.createArray = bounded_array;
    }
    ac->c.reader->fn = &bounded_fn;
    return 0;
}

unsigned pcr_share_read_count(const pcr_redis_conf_t *rc)
{
    size_t n = ((size_t)64 << 20) / (rc->batch_max_bytes ? rc->batch_max_bytes : 1);
    return n < 1 ? 1 : n > 256 ? 256 : (unsigned)n;
}

uint64_t pcr_share_link_oversize(const pcr_share_link_t *l) { return PCR_LOAD(l->oversize); }

static void connect_both(pcr_share_link_t *l)
{
    l->state = L_CONNECTING;
    for (int i = 0; i < 2; i++) {
        conn_t *c = &l->conn[i];
        redisAsyncContext *ac = redisAsyncConnect(l->addr, l->rc->port);
        if (ac == NULL) {
            link_failf(l, "cannot connect: out of memory");
            return;
        }
        if (ac->err) {
            link_failf(l, "cannot connect: %.120s", ac->errstr);
            redisAsyncFree(ac);
            return;
        }
        /* Replies: a snapshot on the command connection, a read's batches on the other; with
         * room for the protocol's own bytes. */
        size_t max = i == PCR_LINK_CMD
                         ? l->rc->snapshot_max_bytes
                         : (size_t)pcr_share_read_count(l->rc) * (l->rc->batch_max_bytes + 4096);
        *c = (conn_t){.l = l, .ac = ac, .max_reply = max + 65536};
        ac->data = c;
        if (attach_bounded(ac, l->base) != 0) {
            c->ac = NULL;
            redisAsyncFree(ac);
            link_failf(l, "cannot watch the connection");
            return;
        }
        redisAsyncSetConnectCallback(ac, on_connect);
        redisAsyncSetDisconnectCallback(ac, on_disconnect);
        send_hello(l, (pcr_link_conn_t)i);
    }
}

static void on_resolved(const pcr_dns_addr_t *addrs, size_t n, int err, const char *errmsg,
                        void *arg)
{
    pcr_share_link_t *l = arg;
    l->dns_req = NULL;
    if (l->closing || l->state != L_RESOLVING)
        return;
    if (err != 0 || n == 0) {
        link_failf(l, "cannot resolve %s: %s", l->rc->host, err != 0 ? errmsg : "no address");
        return;
    }
    /* IPv4 first, as hiredis itself tries it first: "localhost" is often ::1 too, where a
     * Redis bound to 127.0.0.1 is not. */
    const pcr_dns_addr_t *a = &addrs[0];
    for (size_t i = 0; i < n; i++)
        if (addrs[i].addr.ss_family == AF_INET) {
            a = &addrs[i];
            break;
        }
    const void *ip = a->addr.ss_family == AF_INET6
                         ? (const void *)&((const struct sockaddr_in6 *)&a->addr)->sin6_addr
                         : (const void *)&((const struct sockaddr_in *)&a->addr)->sin_addr;
    if ((a->addr.ss_family != AF_INET && a->addr.ss_family != AF_INET6) ||
        inet_ntop(a->addr.ss_family, ip, l->addr, sizeof l->addr) == NULL) {
        link_failf(l, "cannot resolve %s: no usable address", l->rc->host);
        return;
    }
    connect_both(l);
}

/* One attempt: a numeric host is connected to at once, a name resolved first (dns.c: the
 * answer always comes from the loop, never inside pcr_dns_resolve). */
static void attempt(pcr_share_link_t *l)
{
    const char *host = l->rc->host;
    l->attempt_us = pcr_now_us();
    l->was_up = 0;
    snprintf(l->addr, sizeof l->addr, "%s", host);
    if (l->dns == NULL) {
        connect_both(l);
        return;
    }
    l->state = L_RESOLVING;
    l->dns_req = pcr_dns_resolve(l->dns, host, l->rc->port, on_resolved, l);
    if (l->dns_req == NULL)
        link_failf(l, "cannot resolve %s: out of memory", host);
}

/* ---- failure, back-off, watchdog ----------------------------------------------------- */

static void link_failf(pcr_share_link_t *l, const char *fmt, ...)
{
    if (l->failing || l->closing || l->state == L_WAIT || l->state == L_IDLE)
        return;
    l->failing = 1;
    l->gen++;   /* from now on every reply of these connections is handed on as lost */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->why, sizeof l->why, fmt, ap);
    va_end(ap);
    event_active(l->fail_ev, 0, 0);
}

void pcr_share_link_fail(pcr_share_link_t *l, const char *why) { link_failf(l, "%s", why); }

static void close_conns(pcr_share_link_t *l)
{
    pcr_dns_cancel(l->dns_req);   /* no callback follows */
    l->dns_req = NULL;
    for (int i = 0; i < 2; i++) {
        conn_t *c = &l->conn[i];
        redisAsyncContext *ac = c->ac;
        c->ac = NULL;   /* first: on_disconnect must see it as closed on purpose */
        c->npending = 0;
        c->ready = 0;
        if (ac != NULL)
            redisAsyncFree(ac);   /* pending commands are answered NULL */
    }
}

static void on_fail(evutil_socket_t fd, short what, void *arg)
{
    pcr_share_link_t *l = arg;
    int was_up = l->was_up;
    /* The back-off starts over only after a link that stayed up longer than its longest
     * wait: one that connects and then fails at once (a key of the wrong type, a reply
     * refused) backs off like one that cannot connect, not ten times a second. */
    if (was_up && pcr_now_us() - l->up_us >= (uint64_t)l->rc->reconnect_max_ms * 1000)
        l->backoff_ms = l->rc->reconnect_min_ms;
    close_conns(l);
    l->state = L_WAIT;
    l->failing = 0;
    l->was_up = 0;
    if (was_up)
        pcr_log_warn("share: lost redis %s:%u (%s); routing goes on from the local index, "
                     "reconnecting", l->addr, (unsigned)l->rc->port, l->why);
    else if (!l->quiet)
        pcr_log_warn("share: cannot reach redis %s:%u (%s); routing goes on from the local "
                     "index, retrying with back-off up to %u ms", l->addr,
                     (unsigned)l->rc->port, l->why, l->rc->reconnect_max_ms);
    else
        pcr_log_debug("share: redis %s:%u still unreachable (%s)", l->addr,
                      (unsigned)l->rc->port, l->why);
    l->quiet = 1;
    /* Jitter of +-25% keeps replicas that lost Redis together from coming back in step. */
    double jitter = 0.75 + 0.5 * erand48(l->rng);
    unsigned ms = (unsigned)(l->backoff_ms * jitter);
    l->backoff_ms = l->backoff_ms * 2 > l->rc->reconnect_max_ms ? l->rc->reconnect_max_ms
                                                                : l->backoff_ms * 2;
    struct timeval tv = pcr_ms_to_tv(ms);
    evtimer_add(l->retry, &tv);
    if (was_up && l->cbs.on_down)
        l->cbs.on_down(l->arg, l->why);
}

static void on_retry(evutil_socket_t fd, short what, void *arg) { attempt(arg); }

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    pcr_share_link_t *l = arg;
    uint64_t now = pcr_now_us(), timeout = (uint64_t)l->rc->timeout_ms * 1000;
    if (l->failing)
        return;
    if ((l->state == L_RESOLVING || l->state == L_CONNECTING) && now - l->attempt_us > timeout) {
        link_failf(l, "no answer within %u ms", l->rc->timeout_ms);
        return;
    }
    for (int i = 0; l->state >= L_CONNECTING && i < 2; i++) {
        const conn_t *c = &l->conn[i];
        if (c->npending > 0 && now - c->since_us > c->allow_us) {
            link_failf(l, "no reply within %llu ms",
                       (unsigned long long)(c->allow_us / 1000));
            return;
        }
    }
}

/* ---- life ---------------------------------------------------------------------------- */

pcr_share_link_t *pcr_share_link_new(struct event_base *base, const pcr_redis_conf_t *rc,
                                     pcr_dns_t *dns, const pcr_share_link_cbs_t *cbs, void *arg)
{
    pcr_share_link_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->base = base;
    l->rc = rc;
    l->dns = dns;
    l->cbs = *cbs;
    l->arg = arg;
    l->backoff_ms = rc->reconnect_min_ms;
    uint64_t seed = pcr_now_us() ^ ((uint64_t)getpid() << 32);
    memcpy(l->rng, &seed, sizeof l->rng);
    l->tick = event_new(base, -1, EV_PERSIST, on_tick, l);
    l->retry = evtimer_new(base, on_retry, l);
    l->fail_ev = event_new(base, -1, 0, on_fail, l);
    if (l->tick == NULL || l->retry == NULL || l->fail_ev == NULL) {
        pcr_share_link_free(l);
        return NULL;
    }
    return l;
}

void pcr_share_link_start(pcr_share_link_t *l)
{
    struct timeval tv = {0, TICK_MS * 1000};
    event_add(l->tick, &tv);
    attempt(l);
}

void pcr_share_link_free(pcr_share_link_t *l)
{
    if (l == NULL)
        return;
    l->closing = 1;
    l->gen++;
    close_conns(l);
    if (l->tick)
        event_free(l->tick);
    if (l->retry)
        event_free(l->retry);
    if (l->fail_ev)
        event_free(l->fail_ev);
    free(l);
}
