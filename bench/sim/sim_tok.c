/* bench/sim/sim_tok.c: the toy tokenizer's threads (/tokenize and the two render endpoints).
 *
 * Every pod's streams run on the main loop, which under load is late by tens of milliseconds;
 * a router waits for tokens before it routes (precise mode), so the tokenizer gets loops of
 * its own, --tokenize-threads of them, each on a thread: pod i's on loop i modulo their
 * number, as each vLLM API server tokenizes on its own, so one long prompt holds back only
 * the pods that share its thread. The pods' listeners are on their tokenizer's loop too, so a
 * new connection never waits for the main loop: it is accepted and read there, and its first
 * request for another path moves it to the main loop (its socket, its unread input, its
 * unsent output and the request just read go along); a tokenizer path moves it back. A router
 * keeps connections for tokenizing apart from its request pool, so in practice a connection
 * moves once at most.
 *
 * The loops pass connections through an inbox each (a list under a mutex) and a pipe that
 * wakes the loop; none touches another's event base. A tokenizer reads only what never
 * changes after start (the configuration, the pod's name), its pods' connections and a
 * counter it increments atomically. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

enum { MSG_CONN, MSG_CUT, MSG_STOP };

typedef struct sim_msg {
    struct sim_msg *next;
    int kind;
    sim_pod_t *pod;
    evutil_socket_t fd;                 /* MSG_CONN: the connection's socket (a dup) */
    sim_conn_state_t st;                /* MSG_CONN: the rest of it */
} sim_msg_t;

typedef struct {
    struct event_base *base;
    struct event *ev;                   /* wake[0] readable */
    int wake[2];
    pthread_mutex_t mu;
    sim_msg_t *head, **tail;
    int tok;                            /* a tokenizer's loop */
    sim_msg_t stop;                     /* its MSG_STOP */
    pthread_t thread;
    int started;                        /* its thread runs it */
} sim_loop_t;

static sim_loop_t loops[1 + SIM_TOK_THREADS_MAX];   /* the main loop, then the tokenizers' */
static int nloops;                      /* tokenizers' loops made */
static int running;                     /* they all exist */

/* The tokenizer's loop of a pod. */
static sim_loop_t *loop_of(const sim_pod_t *pod)
{
    return &loops[1 + (unsigned)pod->index % (unsigned)nloops];
}

static void msg_free(sim_msg_t *m)
{
    if (m->kind == MSG_CONN) {
        evutil_closesocket(m->fd);
        sim_conn_state_dispose(&m->st);
    }
    free(m);
}

static void post(sim_loop_t *l, sim_msg_t *m)
{
    m->next = NULL;
    pthread_mutex_lock(&l->mu);
    *l->tail = m;
    l->tail = &m->next;
    pthread_mutex_unlock(&l->mu);
    /* A full pipe already holds a wake-up. */
    ssize_t n = write(l->wake[1], "", 1);
    (void)n;
}

static void close_tok_conns(sim_pod_t *pod)
{
    while (pod->tok_conns)
        sim_conn_close(pod->tok_conns);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    sim_loop_t *l = arg;
    char buf[256];
    while (read(fd, buf, sizeof buf) > 0)
        ;
    pthread_mutex_lock(&l->mu);
    sim_msg_t *m = l->head;
    l->head = NULL;
    l->tail = &l->head;
    pthread_mutex_unlock(&l->mu);
    while (m) {
        sim_msg_t *next = m->next;
        if (m->kind == MSG_CONN) {
            sim_http_adopt(m->pod, l->base, l->tok, m->fd, &m->st);   /* takes fd and st */
            free(m);
        } else if (m->kind == MSG_CUT) {
            close_tok_conns(m->pod);
            free(m);
        } else {
            event_base_loopbreak(l->base);   /* l->stop: not freed */
        }
        m = next;
    }
}

static int loop_init(sim_loop_t *l, struct event_base *base, int tok)
{
    l->base = base;
    l->tok = tok;
    l->head = NULL;
    l->tail = &l->head;
    l->wake[0] = l->wake[1] = -1;
    l->stop.kind = MSG_STOP;
    if (pthread_mutex_init(&l->mu, NULL) != 0)
        return -1;
    if (!base || pipe2(l->wake, O_NONBLOCK | O_CLOEXEC) != 0)
        return -1;
    l->ev = event_new(base, l->wake[0], EV_READ | EV_PERSIST, on_wake, l);
    return l->ev && event_add(l->ev, NULL) == 0 ? 0 : -1;
}

static void loop_dispose(sim_loop_t *l)
{
    while (l->head) {
        sim_msg_t *m = l->head;
        l->head = m->next;
        if (m != &l->stop)
            msg_free(m);
    }
    if (l->ev)
        event_free(l->ev);
    if (l->wake[0] >= 0)
        close(l->wake[0]);
    if (l->wake[1] >= 0)
        close(l->wake[1]);
    pthread_mutex_destroy(&l->mu);
    memset(l, 0, sizeof(*l));
}

static void *run(void *arg)
{
    sim_loop_t *l = arg;
    event_base_dispatch(l->base);
    return NULL;
}

static void dispose_all(void)
{
    for (int i = 0; i <= nloops; i++) {
        struct event_base *b = i ? loops[i].base : NULL;
        loop_dispose(&loops[i]);
        if (b)
            event_base_free(b);
    }
    nloops = 0;
}

int sim_tok_init(struct event_base *main_base, int nthreads)
{
    if (nthreads < 1 || nthreads > SIM_TOK_THREADS_MAX)
        return -1;
    /* Each answer's buffers (tens of KB) are freed once it is sent. With glibc's default trim
     * threshold a thread's arena hands those pages back to the kernel after every answer and
     * faults them in again for the next, which costs more than the tokenizing itself; a
     * higher threshold keeps them. */
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    if (loop_init(&loops[0], main_base, 0) != 0) {
        dispose_all();
        return -1;
    }
    for (int i = 1; i <= nthreads; i++) {
        nloops = i;
        if (loop_init(&loops[i], event_base_new(), 1) != 0) {
            dispose_all();
            return -1;
        }
    }
    running = 1;
    return 0;
}

struct event_base *sim_tok_base(const sim_pod_t *pod)
{
    return running ? loop_of(pod)->base : NULL;
}

int sim_tok_run(void)
{
    if (!running)
        return -1;
    for (int i = 1; i <= nloops; i++) {
        if (pthread_create(&loops[i].thread, NULL, run, &loops[i]) != 0)
            return -1;   /* sim_tok_stop joins those that started */
        loops[i].started = 1;
    }
    return 0;
}

void sim_tok_stop(sim_pod_t *pods, int npods)
{
    if (!running)
        return;
    for (int i = 1; i <= nloops; i++)
        if (loops[i].started)
            post(&loops[i], &loops[i].stop);
    for (int i = 1; i <= nloops; i++) {
        if (loops[i].started)
            pthread_join(loops[i].thread, NULL);
        loops[i].started = 0;
    }
    running = 0;
    /* The threads are gone: their connections and listeners are closed from here. */
    for (int i = 0; i < npods; i++) {
        close_tok_conns(&pods[i]);
        if (pods[i].listener) {
            evconnlistener_free(pods[i].listener);
            pods[i].listener = NULL;
        }
    }
    dispose_all();
}

void sim_tok_cut(sim_pod_t *pod)
{
    sim_msg_t *m = running ? calloc(1, sizeof(*m)) : NULL;
    if (!m)
        return;
    m->kind = MSG_CUT;
    m->pod = pod;
    post(loop_of(pod), m);
}

int sim_tok_move(sim_conn_t *c, int to_tok, sim_conn_state_t *st)
{
    if (!running)
        return -1;
    sim_msg_t *m = calloc(1, sizeof(*m));
    evutil_socket_t fd = m ? dup(bufferevent_getfd(c->bev)) : -1;
    if (fd < 0) {
        free(m);
        return -1;
    }
    m->kind = MSG_CONN;
    m->pod = c->pod;
    m->fd = fd;
    m->st = *st;
    post(to_tok ? loop_of(c->pod) : &loops[0], m);
    return 0;
}

int sim_tok_running(void) { return running; }
