/* router/http/sessions.c: owns a worker's lists of client sessions (session.h): every open one,
 * so a drain reaches each, and those waiting for their client, oldest first, so the connection
 * limit closes the one that has waited longest (conn.c). A session joins when it is accepted
 * and leaves when it closes, whichever protocol it speaks. */
#include "session.h"

void pcr_session_register(pcr_worker_t *w, pcr_session_t *s, const pcr_session_ops_t *ops,
                          pcr_conn_kind_t kind)
{
    s->w = w;
    s->ops = ops;
    s->waiting = 0;
    s->kind = kind;
    PCR_STORE(w->nconns[kind], w->nconns[kind] + 1);
    LIST_INSERT_HEAD(&w->sessions, s, link);
    PCR_STORE(w->nsessions, w->nsessions + 1);
}

void pcr_session_set_waiting(pcr_session_t *s, int waiting)
{
    if (s->waiting == waiting)
        return;
    if (waiting)
        TAILQ_INSERT_TAIL(&s->w->waiting, s, wait_link);
    else
        TAILQ_REMOVE(&s->w->waiting, s, wait_link);
    s->waiting = waiting;
}

void pcr_session_unregister(pcr_session_t *s)
{
    pcr_session_set_waiting(s, 0);
    LIST_REMOVE(s, link);
    PCR_STORE(s->w->nconns[s->kind], s->w->nconns[s->kind] - 1);
    PCR_STORE(s->w->nsessions, s->w->nsessions - 1);
    pcr_worker_check_drained(s->w);
}
