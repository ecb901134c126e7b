/* bench/sim/sim_tok.c: the toy tokenizer's thread (/tokenize and the two render endpoints).
 *
 * Every pod's streams run on the main loop, which under load is late by tens of milliseconds;
 * a router waits for tokens before it routes (precise mode), so the tokenizer gets a loop of
 * its own. The pods' listeners are on the tokenizer's loop too, so a new connection never
 * waits for the main loop: it is accepted and read there, and its first request for another
 * path moves it to the main loop (its socket, its unread input, its unsent output and the
 * request just read go along); a tokenizer path moves it back. A router keeps connections for
 * tokenizing apart from its request pool, so in practice a connection moves once at most.
 *
 * The two loops pass connections through an inbox each (a list under a mutex) and a pipe that
 * wakes the loop; neither touches the other's event base. The tokenizer reads only what never
 * changes after start (the configuration, the pod's name) and a counter of its own. */
#include <errno.h>
#include <fcntl.h>
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
    int tok;                            /* the tokenizer's loop */
} sim_loop_t;

static sim_loop_t loops[2];             /* the main loop, the tokenizer's */
static pthread_t thread;
static int running;                     /* the tokenizer's loop exists */
static int started;                     /* its thread runs it */
static sim_msg_t stop_msg = {.kind = MSG_STOP};

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
            event_base_loopbreak(l->base);   /* stop_msg: static */
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
        if (m != &stop_msg)
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
    (void)arg;
    event_base_dispatch(loops[1].base);
    return NULL;
}

int sim_tok_init(struct event_base *main_base)
{
    if (loop_init(&loops[0], main_base, 0) != 0 || loop_init(&loops[1], event_base_new(), 1) != 0) {
        struct event_base *b = loops[1].base;
        loop_dispose(&loops[0]);
        loop_dispose(&loops[1]);
        if (b)
            event_base_free(b);
        return -1;
    }
    running = 1;
    return 0;
}

struct event_base *sim_tok_base(void) { return running ? loops[1].base : NULL; }

int sim_tok_run(void)
{
    if (!running || pthread_create(&thread, NULL, run, NULL) != 0)
        return -1;
    started = 1;
    return 0;
}

void sim_tok_stop(sim_pod_t *pods, int npods)
{
    if (!running)
        return;
    if (started) {
        post(&loops[1], &stop_msg);
        pthread_join(thread, NULL);
        started = 0;
    }
    running = 0;
    /* The thread is gone: its connections and listeners are closed from here. */
    for (int i = 0; i < npods; i++) {
        close_tok_conns(&pods[i]);
        if (pods[i].listener) {
            evconnlistener_free(pods[i].listener);
            pods[i].listener = NULL;
        }
    }
    struct event_base *b = loops[1].base;
    loop_dispose(&loops[1]);
    event_base_free(b);
    loop_dispose(&loops[0]);
}

void sim_tok_cut(sim_pod_t *pod)
{
    sim_msg_t *m = running ? calloc(1, sizeof(*m)) : NULL;
    if (!m)
        return;
    m->kind = MSG_CUT;
    m->pod = pod;
    post(&loops[1], m);
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
    post(&loops[to_tok ? 1 : 0], m);
    return 0;
}

int sim_tok_running(void) { return running; }
