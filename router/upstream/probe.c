/* router/upstream/probe.c: owns the GET with a deadline that the control thread sends a pod
 * (probe.h): the request's bytes, its deadline timer, and the one end it reports. */
#include <stdlib.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "backend.h"
#include "clock.h"
#include "log.h"
#include "probe.h"
#include "upstream.h"

struct pcr_probe {
    pcr_backend_t *be;
    pcr_upreq_t *req;
    size_t bytes, max_bytes;
    struct event *deadline;
    const pcr_probe_cbs_t *cbs;
    void *ctx;
};

static void probe_free(pcr_probe_t *p)
{
    event_free(p->deadline);
    free(p);
}

/* Frees the probe first, so the callback may start the next one. */
static void probe_end(pcr_probe_t *p, int complete)
{
    const pcr_probe_cbs_t *cbs = p->cbs;
    void *ctx = p->ctx;
    probe_free(p);
    cbs->on_end(ctx, complete);
}

static void on_head(void *ctx, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    pcr_probe_t *p = ctx;
    p->cbs->on_head(p->ctx, status);
}

static void on_body(void *ctx, const char *data, size_t len)
{
    pcr_probe_t *p = ctx;
    if (len > p->max_bytes - p->bytes) {
        /* An endless page must not hold the control thread until the deadline: the read
         * stops here. */
        PCR_INC(p->be->probes_too_large);
        pcr_log_debug("backend %s: a check's answer passed %zu bytes: cut", p->be->conf.name,
                      p->max_bytes);
        pcr_upstream_cancel(p->req);
        probe_end(p, 0);
        return;
    }
    p->bytes += len;
    if (p->cbs->on_body != NULL)
        p->cbs->on_body(p->ctx, data, len);
}

static void on_done(void *ctx) { probe_end(ctx, 1); }

static void on_error(void *ctx, pcr_up_error_t err, int got_head) { probe_end(ctx, 0); }

static const pcr_upstream_cbs_t probe_cbs = {on_head, on_body, on_done, on_error, NULL, NULL, NULL, NULL};

/* Not answered in time: the check connection is free for the next probe. */
static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    pcr_probe_t *p = arg;
    pcr_upstream_cancel(p->req);
    probe_end(p, 0);
}

pcr_probe_t *pcr_probe_get(pcr_backend_t *be, const char *path, const char *agent,
                           const char *accept, unsigned timeout_ms, size_t max_bytes,
                           const pcr_probe_cbs_t *cbs, void *ctx)
{
    pcr_probe_t *p = calloc(1, sizeof(*p));
    struct evbuffer *req = evbuffer_new();
    if (p == NULL || req == NULL ||
        (p->deadline = evtimer_new(be->srv->base, on_deadline, p)) == NULL)
        goto fail;
    p->be = be;
    p->max_bytes = max_bytes;
    p->cbs = cbs;
    p->ctx = ctx;
    evbuffer_add_printf(req, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: %s\r\n", path,
                        be->host_header, agent);
    if (accept != NULL)
        evbuffer_add_printf(req, "Accept: %s\r\n", accept);
    evbuffer_add(req, "\r\n", 2);
    p->req = pcr_upstream_send(be->check_pool, &(pcr_up_send_t){.head = req}, &probe_cbs, p);
    req = NULL; /* taken */
    if (p->req == NULL)
        goto fail;
    struct timeval tv = pcr_ms_to_tv(timeout_ms);
    evtimer_add(p->deadline, &tv);
    return p;
fail:
    if (req != NULL)
        evbuffer_free(req);
    if (p != NULL && p->deadline != NULL)
        event_free(p->deadline);
    free(p);
    return NULL;
}

void pcr_probe_cancel(pcr_probe_t *p)
{
    if (p == NULL)
        return;
    pcr_upstream_cancel(p->req);
    probe_free(p);
}
