/* router/kv/kv_sub.c: the KV-event subscriber (kv_sub.h): one thread, one zmq_poll over every
 * pod's SUB socket, the replay sockets of the pods being replayed, and an eventfd that wakes
 * it for a new list of pods or a stop. Everything of a pod is the thread's alone; the list
 * handed over by pcr_kv_sub_set_pods() is the only thing shared, under a mutex. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <zmq.h>

#include "clock.h"
#include "kv_sub.h"
#include "log.h"
#include "pcr/common.h"

#define READS_PER_TURN 64      /* messages read from one socket before the others get a turn */
#define RCV_HWM 16             /* ZMQ's queue per socket, in messages */
#define MAX_FRAMES 4           /* a replay answer: delimiter, topic, sequence, payload */

typedef struct {
    int64_t seq;
    void *buf;
    size_t len;
} held_t;

typedef struct {
    pcr_kv_pod_t conf;         /* strings owned */
    void *sub, *rep;
    int64_t last;              /* the last sequence delivered; -1 before the first */
    int replaying;
    int joining;               /* the replay asked at the first message: a later start is fine */
    int64_t expect;            /* the next sequence the replay must give */
    uint64_t deadline_ms;
    held_t *held;
    size_t nheld;
} pod_t;

struct pcr_kv_sub {
    pcr_kv_sub_opts_t o;
    pcr_kv_sub_cbs_t cbs;
    void *ctx;
    pthread_t thread;
    int started;
    int wake_fd;
    pthread_mutex_t mu;        /* guards what follows, up to the thread's own */
    pcr_kv_pod_t *next;
    size_t nnext;
    int has_next, stop;
    pod_t *pods;               /* the thread's own */
    size_t npods;
    pcr_kv_decoder_t *dec;
    pcr_kv_sub_stats_t st;     /* bumped by the thread, read anywhere (relaxed) */
};

#define BUMP(s, field, n) __atomic_fetch_add(&(s)->st.field, (n), __ATOMIC_RELAXED)

static uint64_t now_ms(void) { return pcr_now_us() / 1000u; } /* the router's one clock */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static void conf_dispose(pcr_kv_pod_t *c)
{
    free((char *)c->name);
    free((char *)c->endpoint);
    free((char *)c->replay);
}

static int conf_copy(pcr_kv_pod_t *dst, const pcr_kv_pod_t *src)
{
    dst->backend = src->backend;
    dst->name = dup_or_null(src->name ? src->name : "");
    dst->endpoint = dup_or_null(src->endpoint);
    dst->replay = dup_or_null(src->replay);
    if (dst->name == NULL || dst->endpoint == NULL || (src->replay && dst->replay == NULL)) {
        conf_dispose(dst);
        return PCR_ERR_NOMEM;
    }
    return 0;
}

static int same_conf(const pcr_kv_pod_t *a, const pcr_kv_pod_t *b)
{
    return a->backend == b->backend && strcmp(a->endpoint, b->endpoint) == 0 &&
           (a->replay == NULL) == (b->replay == NULL) &&
           (a->replay == NULL || strcmp(a->replay, b->replay) == 0);
}

/* ---- one pod ---------------------------------------------------------------------------- */

static void drop_held(pod_t *p)
{
    for (size_t i = 0; i < p->nheld; i++)
        free(p->held[i].buf);
    free(p->held);
    p->held = NULL;
    p->nheld = 0;
}

static void clear(pcr_kv_sub_t *s, pod_t *p, pcr_kv_clear_t why)
{
    BUMP(s, cleared, 1);
    s->cbs.on_clear(s->cbs.arg, p->conf.backend, why);
}

/* Decodes and hands over one batch; a batch that does not decode clears the pod. */
static void deliver(pcr_kv_sub_t *s, pod_t *p, int64_t seq, const void *buf, size_t len)
{
    pcr_kv_batch_t b;
    char err[160];
    p->last = seq;
    if (pcr_kv_decode(s->dec, buf, len, &b, err, sizeof(err)) != 0) {
        BUMP(s, decode_errors, 1);
        pcr_log_warn("kv events from %s: batch %lld refused (%s); its entries are dropped and "
                     "rebuilt from what follows", p->conf.name, (long long)seq, err);
        clear(s, p, PCR_KV_CLEAR_DECODE);
        return;
    }
    BUMP(s, batches, 1);
    BUMP(s, events, b.nevents);
    BUMP(s, unknown_events, b.unknown);
    s->cbs.on_batch(s->cbs.arg, p->conf.backend, s->dec, &b);
}

static void *make_socket(pcr_kv_sub_t *s, int type, const char *endpoint)
{
    void *z = zmq_socket(s->ctx, type);
    if (z == NULL)
        return NULL;
    int zero = 0, one = 1, hwm = RCV_HWM, ivl = 100, ivl_max = 5000, idle = 10, intvl = 5,
        cnt = 3;
    int64_t max = (int64_t)s->o.max_msg_bytes;
    zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(z, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(z, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    zmq_setsockopt(z, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl));
    zmq_setsockopt(z, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof(ivl_max));
    /* A publisher that vanished without a FIN is noticed by TCP keepalive (about 25 s) and
     * reconnected. Not by ZMTP heartbeats: libzmq 4.3 aborts (assertion _input_stopped) when a
     * heartbeat times out on a connection whose reading stopped at the RCVHWM and it
     * reconnects, which a busy subscriber meets (a libzmq bug still open in 4.3.4). */
    zmq_setsockopt(z, ZMQ_TCP_KEEPALIVE, &one, sizeof(one));
    zmq_setsockopt(z, ZMQ_TCP_KEEPALIVE_IDLE, &idle, sizeof(idle));
    zmq_setsockopt(z, ZMQ_TCP_KEEPALIVE_INTVL, &intvl, sizeof(intvl));
    zmq_setsockopt(z, ZMQ_TCP_KEEPALIVE_CNT, &cnt, sizeof(cnt));
    if (type == ZMQ_SUB)
        zmq_setsockopt(z, ZMQ_SUBSCRIBE, "", 0);
    if (zmq_connect(z, endpoint) != 0) {
        pcr_log_warn("kv events: cannot connect to %s (%s)", endpoint, zmq_strerror(errno));
        zmq_close(z);
        return NULL;
    }
    return z;
}

static void start_replay(pcr_kv_sub_t *s, pod_t *p, int64_t from, int joining)
{
    if (p->rep == NULL)
        p->rep = make_socket(s, ZMQ_DEALER, p->conf.replay);
    unsigned char seq[8];
    for (int i = 0; i < 8; i++)
        seq[i] = (unsigned char)((uint64_t)from >> (56 - 8 * i));
    /* The empty frame is the envelope the pod's ROUTER expects from a REQ-like peer. */
    if (p->rep == NULL || zmq_send(p->rep, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) != 0 ||
        zmq_send(p->rep, seq, 8, ZMQ_DONTWAIT) != 8) {
        BUMP(s, replays_failed, 1);
        if (!joining)
            clear(s, p, PCR_KV_CLEAR_GAP);
        return;
    }
    BUMP(s, replays, 1);
    p->replaying = 1;
    p->joining = joining;
    p->expect = from;
    p->deadline_ms = now_ms() + s->o.replay_timeout_ms;
}

static void on_live(pcr_kv_sub_t *s, pod_t *p, int64_t seq, const void *buf, size_t len);

/* The replay is over (its end marker, or given up): the batches held meanwhile, in order.
 * Filled, they follow on. Not (the pod's buffer had moved on, a hole, its deadline), what was
 * missed is lost: the pod's entries are cleared (unless this was the replay asked at the
 * first batch, when there were none yet) and the held batches start afresh, with no second
 * replay for the same gap. */
static void end_replay(pcr_kv_sub_t *s, pod_t *p, int failed)
{
    p->replaying = 0;
    if (failed || (p->nheld > 0 && p->held[0].seq > p->last + 1)) {
        BUMP(s, replays_failed, 1);
        if (!p->joining)
            clear(s, p, PCR_KV_CLEAR_GAP);
        p->last = -2;
    }
    held_t *held = p->held;
    size_t n = p->nheld;
    p->held = NULL;
    p->nheld = 0;
    for (size_t i = 0; i < n; i++) {
        if (p->last == -2 || held[i].seq > p->last)
            on_live(s, p, held[i].seq, held[i].buf, held[i].len);
        free(held[i].buf);
    }
    free(held);
}

static void on_live(pcr_kv_sub_t *s, pod_t *p, int64_t seq, const void *buf, size_t len)
{
    if (p->replaying) {
        if (p->nheld >= s->o.max_held) {
            end_replay(s, p, 1); /* too long: what it has not given is lost */
        } else {
            void *copy = malloc(len ? len : 1);
            held_t *h = realloc(p->held, (p->nheld + 1) * sizeof(*h));
            if (copy == NULL || h == NULL) {
                free(copy);
                if (h != NULL)
                    p->held = h;
                end_replay(s, p, 1);
            } else {
                memcpy(copy, buf, len);
                p->held = h;
                p->held[p->nheld++] = (held_t){seq, copy, len};
                return;
            }
        }
    }
    if (p->last == -2) { /* after a clear: whatever comes is the new start */
        deliver(s, p, seq, buf, len);
        return;
    }
    if (p->last < 0) {
        /* The first batch from this pod: what it stored before is in its replay buffer. */
        if (seq > 0 && p->conf.replay != NULL) {
            start_replay(s, p, 0, 1);
            if (p->replaying) {
                on_live(s, p, seq, buf, len); /* held until the replay ends */
                return;
            }
        }
        deliver(s, p, seq, buf, len);
        return;
    }
    if (seq == p->last + 1) {
        deliver(s, p, seq, buf, len);
        return;
    }
    if (seq <= p->last) {
        /* A publisher's sequence only goes up: going back is a new life of the pod. */
        BUMP(s, restarts, 1);
        pcr_log_info("kv events from %s: sequence went back from %lld to %lld: the pod "
                     "restarted; its entries are dropped", p->conf.name, (long long)p->last,
                     (long long)seq);
        clear(s, p, PCR_KV_CLEAR_RESTART);
        p->last = -1;
        on_live(s, p, seq, buf, len);
        return;
    }
    BUMP(s, gaps, 1);
    if (p->conf.replay != NULL) {
        start_replay(s, p, p->last + 1, 0);
        if (p->replaying) {
            on_live(s, p, seq, buf, len);
            return;
        }
    } else {
        clear(s, p, PCR_KV_CLEAR_GAP);
    }
    deliver(s, p, seq, buf, len);
}

/* One whole multipart message, its first MAX_FRAMES parts kept. 1 read, 0 nothing there. */
static int recv_msg(void *z, zmq_msg_t *f, int *n)
{
    int count = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, z, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break; /* nothing (EAGAIN), or the rest of a message that cannot come */
        }
        more = zmq_msg_more(&m);
        if (count < MAX_FRAMES)
            f[count] = m;
        else
            zmq_msg_close(&m);
        count++;
    }
    *n = count < MAX_FRAMES ? count : MAX_FRAMES;
    return count > 0 ? (count <= MAX_FRAMES ? 1 : -1) : 0;
}

static void close_frames(zmq_msg_t *f, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

static void read_sub(pcr_kv_sub_t *s, pod_t *p)
{
    for (int k = 0; k < READS_PER_TURN && p->sub != NULL; k++) {
        zmq_msg_t f[MAX_FRAMES];
        int n, rc = recv_msg(p->sub, f, &n);
        if (rc == 0)
            return;
        int64_t seq;
        if (rc < 0 || n != 3 || pcr_kv_seq(zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), &seq) != 0 ||
            seq < 0) {
            BUMP(s, bad_messages, 1); /* not [topic, sequence, payload] */
        } else {
            on_live(s, p, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
        }
        close_frames(f, n);
    }
}

static void read_rep(pcr_kv_sub_t *s, pod_t *p)
{
    for (int k = 0; k < READS_PER_TURN && p->replaying; k++) {
        zmq_msg_t f[MAX_FRAMES];
        int n, rc = recv_msg(p->rep, f, &n);
        if (rc == 0)
            return;
        /* [""], then [seq, payload] (vLLM before 0.26) or [topic, seq, payload]. */
        int at = n > 0 && zmq_msg_size(&f[0]) == 0 ? 1 : 0, parts = n - at;
        int seq_at = at + (parts == 3 ? 1 : 0);
        int64_t seq;
        if (rc < 0 || (parts != 2 && parts != 3) ||
            pcr_kv_seq(zmq_msg_data(&f[seq_at]), zmq_msg_size(&f[seq_at]), &seq) != 0) {
            BUMP(s, bad_messages, 1);
            close_frames(f, n);
            end_replay(s, p, 1);
            return;
        }
        if (seq == -1) {
            close_frames(f, n);
            end_replay(s, p, 0); /* it says whether the gap was filled */
            return;
        }
        if (seq < p->expect) {
            close_frames(f, n); /* older than asked for */
            continue;
        }
        if (seq > p->expect && !(p->joining && p->last < 0)) {
            close_frames(f, n); /* a hole in what it replays */
            end_replay(s, p, 1);
            return;
        }
        deliver(s, p, seq, zmq_msg_data(&f[seq_at + 1]), zmq_msg_size(&f[seq_at + 1]));
        p->expect = seq + 1;
        close_frames(f, n);
    }
}

static void pod_close(pcr_kv_sub_t *s, pod_t *p, int cleared)
{
    if (p->sub)
        zmq_close(p->sub);
    if (p->rep)
        zmq_close(p->rep);
    drop_held(p);
    if (cleared)
        clear(s, p, PCR_KV_CLEAR_LEFT);
    conf_dispose(&p->conf);
}

/* The new list: pods that stay keep their sockets and sequence; the others go or come. */
static void apply_pods(pcr_kv_sub_t *s, pcr_kv_pod_t *next, size_t n)
{
    pod_t *pods = calloc(n ? n : 1, sizeof(*pods));
    if (pods == NULL) {
        for (size_t i = 0; i < n; i++)
            conf_dispose(&next[i]);
        free(next);
        return; /* out of memory: the old list stays */
    }
    for (size_t i = 0; i < n; i++) {
        pod_t *keep = NULL;
        for (size_t j = 0; j < s->npods && keep == NULL; j++)
            if (s->pods[j].conf.endpoint != NULL && same_conf(&s->pods[j].conf, &next[i]))
                keep = &s->pods[j];
        if (keep != NULL) {
            pods[i] = *keep;
            keep->conf.endpoint = NULL; /* moved */
            conf_dispose(&next[i]);
            continue;
        }
        pods[i].conf = next[i];
        pods[i].last = -1;
        pods[i].sub = make_socket(s, ZMQ_SUB, next[i].endpoint);
    }
    for (size_t j = 0; j < s->npods; j++)
        if (s->pods[j].conf.endpoint != NULL)
            pod_close(s, &s->pods[j], 1);
    free(s->pods);
    free(next);
    s->pods = pods;
    s->npods = n;
}

static void *run(void *arg)
{
    pcr_kv_sub_t *s = arg;
    zmq_pollitem_t *items = NULL;
    size_t cap = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stop = s->stop, has = s->has_next;
        pcr_kv_pod_t *next = s->next;
        size_t nnext = s->nnext;
        s->has_next = 0;
        s->next = NULL;
        pthread_mutex_unlock(&s->mu);
        if (has)
            apply_pods(s, next, nnext);
        if (stop)
            break;
        if (cap < 1 + 2 * s->npods) {
            zmq_pollitem_t *it = realloc(items, (1 + 2 * s->npods) * sizeof(*it));
            if (it == NULL)
                break; /* cannot poll: stop following events (counted nowhere better) */
            items = it;
            cap = 1 + 2 * s->npods;
        }
        size_t n = 0;
        items[n++] = (zmq_pollitem_t){NULL, s->wake_fd, ZMQ_POLLIN, 0};
        uint64_t now = now_ms(), next_deadline = now + 1000;
        for (size_t i = 0; i < s->npods; i++) {
            pod_t *p = &s->pods[i];
            if (p->sub)
                items[n++] = (zmq_pollitem_t){p->sub, 0, ZMQ_POLLIN, 0};
            if (p->replaying) {
                items[n++] = (zmq_pollitem_t){p->rep, 0, ZMQ_POLLIN, 0};
                if (p->deadline_ms < next_deadline)
                    next_deadline = p->deadline_ms;
            }
        }
        long timeout = next_deadline > now ? (long)(next_deadline - now) : 0;
        if (zmq_poll(items, (int)n, timeout) < 0 && errno != EINTR)
            break;
        if (items[0].revents & ZMQ_POLLIN) {
            uint64_t v;
            if (read(s->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                break;
        }
        /* Every socket is read, polled ready or not: the list may have moved under the items. */
        now = now_ms();
        for (size_t i = 0; i < s->npods; i++) {
            pod_t *p = &s->pods[i];
            read_sub(s, p);
            if (p->replaying)
                read_rep(s, p);
            if (p->replaying && now >= p->deadline_ms)
                end_replay(s, p, 1);
        }
    }
    free(items);
    for (size_t j = 0; j < s->npods; j++)
        pod_close(s, &s->pods[j], 0);
    free(s->pods);
    s->pods = NULL;
    s->npods = 0;
    return NULL;
}

pcr_kv_sub_t *pcr_kv_sub_new(const pcr_kv_sub_opts_t *o, const pcr_kv_sub_cbs_t *cbs,
                             char *err, size_t errlen)
{
    pcr_kv_sub_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->o = *o;
    s->cbs = *cbs;
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->dec = pcr_kv_decoder_new();
    s->ctx = zmq_ctx_new();
    pthread_mutex_init(&s->mu, NULL);
    if (s->wake_fd < 0 || s->dec == NULL || s->ctx == NULL) {
        snprintf(err, errlen, "cannot set up the kv-events subscriber: %s", strerror(errno));
        pcr_kv_sub_free(s);
        return NULL;
    }
    int rc = pthread_create(&s->thread, NULL, run, s);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the kv-events thread: %s", strerror(rc));
        pcr_kv_sub_free(s);
        return NULL;
    }
    s->started = 1;
    return s;
}

static void wake(pcr_kv_sub_t *s)
{
    uint64_t one = 1;
    ssize_t w = write(s->wake_fd, &one, sizeof(one));
    (void)w; /* a full counter still wakes it */
}

int pcr_kv_sub_set_pods(pcr_kv_sub_t *s, const pcr_kv_pod_t *pods, size_t n)
{
    pcr_kv_pod_t *copy = calloc(n ? n : 1, sizeof(*copy));
    if (copy == NULL)
        return PCR_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        if (conf_copy(&copy[i], &pods[i]) != 0) {
            for (size_t j = 0; j < i; j++)
                conf_dispose(&copy[j]);
            free(copy);
            return PCR_ERR_NOMEM;
        }
    }
    pthread_mutex_lock(&s->mu);
    if (s->has_next) {
        for (size_t j = 0; j < s->nnext; j++)
            conf_dispose(&s->next[j]);
        free(s->next);
    }
    s->next = copy;
    s->nnext = n;
    s->has_next = 1;
    pthread_mutex_unlock(&s->mu);
    wake(s);
    return 0;
}

void pcr_kv_sub_stats(const pcr_kv_sub_t *s, pcr_kv_sub_stats_t *out)
{
    const uint64_t *in = (const uint64_t *)&s->st;
    uint64_t *o = (uint64_t *)out;
    for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
        o[i] = __atomic_load_n(&in[i], __ATOMIC_RELAXED);
}

void pcr_kv_sub_free(pcr_kv_sub_t *s)
{
    if (s == NULL)
        return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_mutex_unlock(&s->mu);
        wake(s);
        pthread_join(s->thread, NULL);
    }
    if (s->has_next) {
        for (size_t j = 0; j < s->nnext; j++)
            conf_dispose(&s->next[j]);
        free(s->next);
    }
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    pcr_kv_decoder_free(s->dec);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
