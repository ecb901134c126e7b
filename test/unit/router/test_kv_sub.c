/* test_kv_sub.c: router/kv/kv_sub.c against a pod the test plays in process: an XPUB socket
 * (so the test knows when the subscription has arrived and publishes nothing before it) and a
 * ROUTER socket for replays, both bound to loopback ports the OS picks. Every wait has a
 * deadline and is on a condition (a callback seen, a socket readable), never a sleep. */
#include <msgpack.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <zmq.h>

#include "kv/kv_sub.h"
#include "pcr_test.h"

#define DEADLINE_MS 5000

/* ---- what the subscriber hands over ------------------------------------------------------ */

typedef struct {
    int clear;                 /* 0: a batch, else 1 + pcr_kv_clear_t */
    int64_t first;             /* a batch: its first event's first hash */
} seen_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static seen_t seen[256];
static size_t nseen;

static void on_batch(void *arg, unsigned backend, const pcr_kv_decoder_t *d,
                     const pcr_kv_batch_t *b)
{
    const pcr_kv_event_t *e = pcr_kv_decoded_event(d, 0);
    pthread_mutex_lock(&mu);
    if (nseen < 256)
        seen[nseen++] = (seen_t){0, e && e->nhashes ? (int64_t)e->hashes[0] : -1};
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void on_clear(void *arg, unsigned backend, pcr_kv_clear_t why)
{
    pthread_mutex_lock(&mu);
    if (nseen < 256)
        seen[nseen++] = (seen_t){1 + (int)why, 0};
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Waits until `n` things were handed over; 0 when the deadline passed first. */
static int wait_seen(size_t n)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += DEADLINE_MS / 1000;
    pthread_mutex_lock(&mu);
    int rc = 0;
    while (nseen < n && rc == 0)
        rc = pthread_cond_timedwait(&cv, &mu, &until);
    int ok = nseen >= n;
    pthread_mutex_unlock(&mu);
    return ok;
}

/* What was handed over, as text: "b0 b1 gap b4" (batches by first hash, clears by name). */
static const char *log_text(void)
{
    static char buf[2048];
    static const char *why[] = {"gap", "restart", "decode", "left"};
    size_t len = 0;
    buf[0] = '\0';
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nseen && len < sizeof(buf) - 32; i++) {
        if (seen[i].clear)
            len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s%s", i ? " " : "",
                                    why[seen[i].clear - 1]);
        else
            len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%sb%lld", i ? " " : "",
                                    (long long)seen[i].first);
    }
    pthread_mutex_unlock(&mu);
    return buf;
}

/* ---- the pod ------------------------------------------------------------------------------ */

static void *zctx;

typedef struct {
    void *pub, *rep;
    char pub_ep[128], rep_ep[128];
} pod_t;

static void bind_any(void *z, char *ep, size_t len)
{
    int zero = 0;
    zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof(zero));
    PCR_CHECK_EQ_INT(zmq_bind(z, "tcp://127.0.0.1:*"), 0);
    zmq_getsockopt(z, ZMQ_LAST_ENDPOINT, ep, &len);
}

static void pod_open(pod_t *p)
{
    p->pub = zmq_socket(zctx, ZMQ_XPUB);
    p->rep = zmq_socket(zctx, ZMQ_ROUTER);
    bind_any(p->pub, p->pub_ep, sizeof(p->pub_ep));
    bind_any(p->rep, p->rep_ep, sizeof(p->rep_ep));
}

static void pod_close(pod_t *p)
{
    zmq_close(p->pub);
    zmq_close(p->rep);
}

/* A batch of one event, BlockRemoved of hash `h`. */
static void payload(msgpack_sbuffer *sb, uint64_t h)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1.0);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_str_with_body(&pk, "BlockRemoved", 12);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint64(&pk, h);
    msgpack_pack_nil(&pk);
}

static void seq_bytes(unsigned char *b, int64_t seq)
{
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)seq >> (56 - 8 * i));
}

/* Publishes batch `seq` (its event names hash `seq`), or `raw` bytes as its payload. */
static void publish(pod_t *p, int64_t seq, const char *raw)
{
    unsigned char sb8[8];
    seq_bytes(sb8, seq);
    msgpack_sbuffer sb;
    payload(&sb, (uint64_t)seq);
    zmq_send(p->pub, "kv@pod", 6, ZMQ_SNDMORE);
    zmq_send(p->pub, sb8, 8, ZMQ_SNDMORE);
    if (raw)
        zmq_send(p->pub, raw, strlen(raw), 0);
    else
        zmq_send(p->pub, sb.data, sb.size, 0);
    msgpack_sbuffer_destroy(&sb);
}

/* Waits for the subscription to reach the pod (XPUB hands it over as a message). */
static void await_subscriber(pod_t *p)
{
    zmq_pollitem_t it = {p->pub, 0, ZMQ_POLLIN, 0};
    PCR_CHECK_EQ_INT(zmq_poll(&it, 1, DEADLINE_MS), 1);
    char buf[64];
    PCR_CHECK(zmq_recv(p->pub, buf, sizeof(buf), 0) >= 1 && buf[0] == 1);
}

/* Answers one replay request from the pod's buffer [lo, hi] (three frames per batch when
 * `topic`, as vLLM 0.26; two before), then the end marker. Returns the start asked for, or -2
 * when no request came before the deadline. `answer` 0 takes the request and says nothing. */
static int64_t serve_replay(pod_t *p, int64_t lo, int64_t hi, int topic, int answer)
{
    zmq_pollitem_t it = {p->rep, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, DEADLINE_MS) != 1)
        return -2;
    zmq_msg_t id, delim, start;
    zmq_msg_init(&id);
    zmq_msg_init(&delim);
    zmq_msg_init(&start);
    zmq_msg_recv(&id, p->rep, 0);
    zmq_msg_recv(&delim, p->rep, 0);
    zmq_msg_recv(&start, p->rep, 0);
    int64_t from = -3;
    if (zmq_msg_size(&delim) == 0 && zmq_msg_size(&start) == 8) {
        const unsigned char *b = zmq_msg_data(&start);
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
            v = v << 8 | b[i];
        from = (int64_t)v;
    }
    for (int64_t s = from > lo ? from : lo; answer && s <= hi; s++) {
        unsigned char sb8[8];
        seq_bytes(sb8, s);
        msgpack_sbuffer sb;
        payload(&sb, (uint64_t)s);
        zmq_send(p->rep, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
        zmq_send(p->rep, "", 0, ZMQ_SNDMORE);
        if (topic)
            zmq_send(p->rep, "kv@pod", 6, ZMQ_SNDMORE);
        zmq_send(p->rep, sb8, 8, ZMQ_SNDMORE);
        zmq_send(p->rep, sb.data, sb.size, 0);
        msgpack_sbuffer_destroy(&sb);
    }
    if (answer) {
        unsigned char end[8];
        seq_bytes(end, -1);
        zmq_send(p->rep, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
        zmq_send(p->rep, "", 0, ZMQ_SNDMORE);
        if (topic)
            zmq_send(p->rep, "kv@pod", 6, ZMQ_SNDMORE);
        zmq_send(p->rep, end, 8, ZMQ_SNDMORE);
        zmq_send(p->rep, "", 0, 0);
    }
    zmq_msg_close(&id);
    zmq_msg_close(&delim);
    zmq_msg_close(&start);
    return from;
}

/* ---- the cases ----------------------------------------------------------------------------- */

static pcr_kv_sub_t *sub;
static pod_t pod;

static void setup(int with_replay, unsigned replay_timeout_ms)
{
    pthread_mutex_lock(&mu);
    nseen = 0;
    pthread_mutex_unlock(&mu);
    pod_open(&pod);
    pcr_kv_sub_opts_t o = {1 << 20, replay_timeout_ms, 64};
    pcr_kv_sub_cbs_t cbs = {on_batch, on_clear, NULL};
    char err[128];
    sub = pcr_kv_sub_new(&o, &cbs, err, sizeof(err));
    PCR_CHECK(sub != NULL);
    pcr_kv_pod_t pods[1] = {{3, "pod-3", pod.pub_ep, with_replay ? pod.rep_ep : NULL}};
    PCR_CHECK_EQ_INT(pcr_kv_sub_set_pods(sub, pods, 1), 0);
    await_subscriber(&pod);
}

static pcr_kv_sub_stats_t teardown(void)
{
    pcr_kv_sub_stats_t st;
    pcr_kv_sub_stats(sub, &st);
    pcr_kv_sub_free(sub);
    pod_close(&pod);
    return st;
}

static void test_in_order(void)
{
    setup(1, 1000);
    for (int64_t s = 0; s < 3; s++)
        publish(&pod, s, NULL);
    PCR_CHECK(wait_seen(3));
    PCR_CHECK_STR(log_text(), "b0 b1 b2");
    pcr_kv_sub_stats_t st = teardown();
    PCR_CHECK(st.batches == 3 && st.events == 3 && st.gaps == 0 && st.replays == 0);
}

/* Batches 2 and 3 never reach the subscriber: it asks the replay endpoint from 2 and hands
 * over 0..4 in order, nothing cleared. vLLM before 0.26 (two frames per replayed batch). */
static void test_gap_filled_by_replay(void)
{
    setup(1, 2000);
    publish(&pod, 0, NULL);
    publish(&pod, 1, NULL);
    PCR_CHECK(wait_seen(2));
    publish(&pod, 4, NULL);
    PCR_CHECK_EQ_INT(serve_replay(&pod, 0, 4, 0, 1), 2);
    PCR_CHECK(wait_seen(5));
    publish(&pod, 5, NULL);
    PCR_CHECK(wait_seen(6));
    PCR_CHECK_STR(log_text(), "b0 b1 b2 b3 b4 b5");
    pcr_kv_sub_stats_t st = teardown();
    PCR_CHECK(st.gaps == 1 && st.replays == 1 && st.replays_failed == 0 && st.cleared == 0);
}

/* The same, vLLM 0.26's three frames per replayed batch. */
static void test_gap_filled_by_replay_with_topics(void)
{
    setup(1, 2000);
    publish(&pod, 0, NULL);
    PCR_CHECK(wait_seen(1));
    publish(&pod, 3, NULL);
    PCR_CHECK_EQ_INT(serve_replay(&pod, 0, 3, 1, 1), 1);
    PCR_CHECK(wait_seen(4));
    PCR_CHECK_STR(log_text(), "b0 b1 b2 b3");
    teardown();
}

static void test_gap_without_replay(void)
{
    setup(0, 1000);
    publish(&pod, 0, NULL);
    publish(&pod, 2, NULL);
    PCR_CHECK(wait_seen(3));
    PCR_CHECK_STR(log_text(), "b0 gap b2");
    pcr_kv_sub_stats_t st = teardown();
    PCR_CHECK(st.gaps == 1 && st.replays == 0 && st.cleared == 1);
}

/* The pod's buffer has moved on past the gap: what was missed is lost, the entries are
 * cleared and rebuilt from the batches held meanwhile. */
static void test_replay_that_cannot_fill(void)
{
    setup(1, 2000);
    publish(&pod, 0, NULL);
    PCR_CHECK(wait_seen(1));
    publish(&pod, 5, NULL);
    PCR_CHECK_EQ_INT(serve_replay(&pod, 4, 5, 0, 1), 1); /* it has 4 and 5 only */
    PCR_CHECK(wait_seen(3));
    PCR_CHECK_STR(log_text(), "b0 gap b5");
    pcr_kv_sub_stats_t st = teardown();
    PCR_CHECK(st.replays == 1 && st.replays_failed == 1);
}

/* A replay endpoint that takes the request and never answers: given up at its deadline. */
static void test_replay_deadline(void)
{
    setup(1, 200);
    publish(&pod, 0, NULL);
    PCR_CHECK(wait_seen(1));
    publish(&pod, 2, NULL);
    PCR_CHECK_EQ_INT(serve_replay(&pod, 0, 0, 0, 0), 1);
    PCR_CHECK(wait_seen(3));
    PCR_CHECK_STR(log_text(), "b0 gap b2");
    teardown();
}

/* A router that starts after the pod: the first batch it sees is 7, so it asks for the pod's
 * whole buffer (from 0) and gets 5 and 6 first; nothing to clear. */
static void test_late_join_asks_the_buffer(void)
{
    setup(1, 2000);
    publish(&pod, 7, NULL);
    PCR_CHECK_EQ_INT(serve_replay(&pod, 5, 7, 0, 1), 0);
    PCR_CHECK(wait_seen(3));
    PCR_CHECK_STR(log_text(), "b5 b6 b7");
    pcr_kv_sub_stats_t st = teardown();
    PCR_CHECK(st.cleared == 0 && st.replays_failed == 0);
}

static void test_restart(void)
{
    setup(0, 1000);
    for (int64_t s = 0; s < 3; s++)
        publish(&pod, s, NULL);
    publish(&pod, 0, NULL);
    publish(&pod, 1, NULL);
    PCR_CHECK(wait_seen(6));
    PCR_CHECK_STR(log_text(), "b0 b1 b2 restart b0 b1");
    pcr_kv_sub_stats_t st = teardown();
    PCR_CHECK(st.restarts == 1);
}

/* A batch that does not decode clears the pod; the next one goes on. A message that is not
 * three frames is counted and dropped. */
static void test_garbage(void)
{
    setup(0, 1000);
    publish(&pod, 0, NULL);
    publish(&pod, 1, "not msgpack at all");
    zmq_send(pod.pub, "kv@pod", 6, ZMQ_SNDMORE);
    zmq_send(pod.pub, "12345678", 8, 0); /* two frames */
    publish(&pod, 2, NULL);
    PCR_CHECK(wait_seen(3));
    PCR_CHECK_STR(log_text(), "b0 decode b2");
    pcr_kv_sub_stats_t st = teardown();
    PCR_CHECK(st.decode_errors == 1 && st.bad_messages == 1 && st.batches == 2);
}

/* A pod that leaves the list is unsubscribed and its entries cleared. */
static void test_pod_leaves(void)
{
    setup(0, 1000);
    publish(&pod, 0, NULL);
    PCR_CHECK(wait_seen(1));
    PCR_CHECK_EQ_INT(pcr_kv_sub_set_pods(sub, NULL, 0), 0);
    PCR_CHECK(wait_seen(2));
    PCR_CHECK_STR(log_text(), "b0 left");
    teardown();
}

int main(void)
{
    zctx = zmq_ctx_new();
    uint64_t t0 = now_ms();
    PCR_RUN(test_in_order);
    PCR_RUN(test_gap_filled_by_replay);
    PCR_RUN(test_gap_filled_by_replay_with_topics);
    PCR_RUN(test_gap_without_replay);
    PCR_RUN(test_replay_that_cannot_fill);
    PCR_RUN(test_replay_deadline);
    PCR_RUN(test_late_join_asks_the_buffer);
    PCR_RUN(test_restart);
    PCR_RUN(test_garbage);
    PCR_RUN(test_pod_leaves);
    printf("# %llu ms\n", (unsigned long long)(now_ms() - t0));
    zmq_ctx_term(zctx);
    return pcr_test_done();
}
