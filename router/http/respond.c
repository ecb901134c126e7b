/* router/http/respond.c: owns the way of an answer's bytes to the client: straight to the
 * session's output while the client keeps up, else into the exchange's own buffer, so that a
 * pod is read at its own pace and its connection goes back to the pool when its answer ends,
 * whatever the client does (nginx's proxy_buffering).
 *
 *   body bytes --> session output        while it holds at most PCR_WRITE_HIGH unwritten
 *              \-> ex->kept              past it: up to limits.max_response_buffer_bytes a
 *                                        request, limits.max_buffered_response_bytes all
 *                                        together (srv->resp_buffered)
 *   the session drained (pcr_exchange_on_writable) --> kept bytes to the output, in order,
 *                                                      then the end that waited for them
 *
 * Once `kept` holds a byte, every later byte goes behind it, so the client gets the answer in
 * order. Past the bound or the budget, proxy.c pauses the pod's reading
 * (pcr_exchange_out_full), as before buffering: the client's backpressure reaches the pod
 * again, and the pod's connection waits. While the memory account shrinks windows
 * (pcr/overload.h), nothing more is kept and an answer may queue only PCR_WRITE_LOW for
 * writing: an answer nobody reads then holds that and one read of the pod's, not
 * PCR_WRITE_HIGH, and the pods' connections bound how many answers grow at once. A client
 * that never reads is still cut by its session at timeouts.client_write_ms, which frees the
 * exchange and its buffer (its output never drains below the watermark, so the write
 * deadline keeps running).
 *
 * The end (or abort) of an answer waits for `kept` to empty; the request's state (DONE,
 * ABORTED, exchange.c) changes at the pod's end all the same: the backend's in-flight count,
 * the status and the access log's duration are the pod's, not the client's last byte. */
#include <stddef.h>

#include <event2/buffer.h>

#include "exchange_int.h"

static size_t kept_len(const pcr_exchange_t *ex)
{
    return ex->kept != NULL ? evbuffer_get_length(ex->kept) : 0;
}

/* Whether memory is short: the account past shrink_windows' threshold. */
static int pressed(const pcr_worker_t *w)
{
    return pcr_mem_action(w->srv, PCR_OVERLOAD_SHRINK_WINDOWS);
}

/* Whether the buffer may take more: under the request's bound and the process's budget, and
 * memory not short. */
static int may_keep(const pcr_exchange_t *ex)
{
    const pcr_limits_conf_t *l = &ex->w->cfg->limits;
    return kept_len(ex) < l->max_response_buffer_bytes &&
           PCR_LOAD(ex->w->srv->resp_buffered) < l->max_buffered_response_bytes &&
           !pressed(ex->w);
}

/* How much of an answer may wait in the session's output: down to the low mark, at which the
 * session says it drained, while memory is short. */
size_t pcr_write_high(const pcr_worker_t *w)
{
    return pressed(w) ? PCR_WRITE_LOW : PCR_WRITE_HIGH;
}

void pcr_exchange_respond_body(pcr_exchange_t *ex, const char *data, size_t len)
{
    ex->resp_bytes += len;
    if (kept_len(ex) == 0 && (ex->ops->pending(ex) <= pcr_write_high(ex->w) || !may_keep(ex))) {
        ex->ops->send_body(ex, data, len);
        return;
    }
    if (ex->kept == NULL && (ex->kept = evbuffer_new()) == NULL) {
        ex->ops->send_body(ex, data, len); /* nothing kept yet: the order holds */
        return;
    }
    /* Out of memory: lost, as a session's own output would lose them. */
    if (evbuffer_add(ex->kept, data, len) == 0)
        PCR_ADD(ex->w->srv->resp_buffered, len);
}

/* Kept bytes go to the session's output while it holds less than PCR_WRITE_HIGH, a read
 * chain at a time; then the end that waited for them. */
static void pump(pcr_exchange_t *ex)
{
    size_t n;
    while ((n = kept_len(ex)) > 0) {
        size_t pending = ex->ops->pending(ex);
        struct evbuffer_iovec v;
        if (pending >= PCR_WRITE_HIGH || evbuffer_peek(ex->kept, -1, NULL, &v, 1) < 1)
            break;
        size_t take = v.iov_len < PCR_WRITE_HIGH - pending ? v.iov_len : PCR_WRITE_HIGH - pending;
        ex->ops->send_body(ex, v.iov_base, take);
        evbuffer_drain(ex->kept, take);
        PCR_SUB(ex->w->srv->resp_buffered, take);
    }
    if (kept_len(ex) == 0 && ex->end_waits != 0)
        pcr_exchange_respond_end(ex, ex->end_waits);
}

void pcr_exchange_respond_end(pcr_exchange_t *ex, int how)
{
    if (kept_len(ex) > 0) {
        if (ex->end_waits == 0)
            PCR_INC(ex->w->metrics.responses_buffered);
        ex->end_waits = how;
        return;
    }
    ex->end_waits = 0;
    if (how == RESPOND_ABORT)
        ex->ops->send_abort(ex);
    else
        ex->ops->send_end(ex);
}

int pcr_exchange_out_full(pcr_exchange_t *ex)
{
    return (kept_len(ex) > 0 || ex->ops->pending(ex) > pcr_write_high(ex->w)) && !may_keep(ex);
}

void pcr_exchange_on_writable(pcr_exchange_t *ex)
{
    pump(ex);
    if (!ex->paused)
        return;
    /* With bytes kept, the pod is read again once half the bound is free (and the budget
     * has room, and memory is not short); without, once the session's output is down to its
     * low mark. */
    size_t k = kept_len(ex);
    const pcr_limits_conf_t *l = &ex->w->cfg->limits;
    if (k > 0 ? k <= l->max_response_buffer_bytes / 2 && may_keep(ex)
              : ex->ops->pending(ex) <= PCR_WRITE_LOW) {
        ex->paused = 0;
        pcr_upstream_resume(ex->up);
    }
}

size_t pcr_exchange_unsent(pcr_exchange_t *ex)
{
    return kept_len(ex) + ex->ops->pending(ex);
}

void pcr_exchange_kept_release(pcr_exchange_t *ex)
{
    size_t n = kept_len(ex);
    if (n == 0)
        return;
    evbuffer_drain(ex->kept, n);
    PCR_SUB(ex->w->srv->resp_buffered, n);
}
