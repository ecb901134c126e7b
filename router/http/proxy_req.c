/* router/http/proxy_req.c: the request as a pod gets it (pcr_proxy_request, exchange_int.h):
 * the client's method, path and fields less the hop-by-hop ones (and the API key, which only
 * pcrouter checks), the pod's Host, a disaggregated request's X-Request-Id, its length, and its
 * body, with stream_options added where pcrouter asks the pod for usage, and with the priority
 * the config gives the pods for the request's tenant. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "exchange_int.h"
#include "http1.h"

int pcr_proxy_pod_body(pcr_exchange_t *ex)
{
    const pcr_config_t *cfg = ex->w->cfg;
    if (ex->pod_body_done || !cfg->pod_priorities)
        return 0;
    ex->pod_body_done = 1;
    /* Its prefill is counted by the entry that gives its pod priority: flow control leaves out
     * what the pods would preempt for a better request (tenancy.c). */
    ex->pod_pslot = ex->qslot + 1;
    /* A prompt's body was read as it came: nothing to do for a tenant without pod_priority
     * whose client sent none. Another endpoint's body was not read: look. */
    if (!ex->has_pod_priority && ex->has_key && !ex->req.has_priority)
        return 0;
    size_t len = evbuffer_get_length(ex->body);
    const char *raw = len ? (const char *)evbuffer_pullup(ex->body, -1) : "";
    json_error_t err;
    json_t *o = json_loadb(raw, len, 0, &err);
    char *s = NULL;
    int rc = -1;
    if (!json_is_object(o)) {
        if (!ex->has_key) { /* not JSON at all: the pod answers it as it would */
            rc = 0;
            goto done;
        }
        pcr_exchange_error(ex, 400, "invalid_request_error", "invalid_json",
                           "request body cannot be re-encoded to set its priority (%s)",
                           o == NULL ? err.text : "not an object");
        goto done;
    }
    if (!ex->has_pod_priority && json_object_get(o, "priority") == NULL) {
        rc = 0;
        goto done;
    }
    if (ex->has_pod_priority
            ? json_object_set_new(o, "priority", json_integer(ex->pod_priority)) != 0
            : json_object_del(o, "priority") != 0)
        goto oom;
    if ((s = json_dumps(o, JSON_COMPACT)) == NULL)
        goto oom;
    evbuffer_drain(ex->body, len);
    if (evbuffer_add(ex->body, s, strlen(s)) != 0)
        goto oom;
    rc = 0;
    goto done;
oom:
    pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
done:
    free(s);
    json_decref(o);
    return rc;
}

/* The values of every Connection field of the request, joined by commas (NULL when none). */
static char *request_connection(const pcr_exchange_t *ex)
{
    struct evbuffer *b = NULL;
    for (size_t i = 0; i + 1 < ex->nh; i += 2) {
        if (ex->hf[i].len == 10 && strncasecmp(ex->hbuf + ex->hf[i].off, "connection", 10) == 0) {
            if (b == NULL && (b = evbuffer_new()) == NULL)
                return NULL;
            evbuffer_add(b, ",", 1);
            evbuffer_add(b, ex->hbuf + ex->hf[i + 1].off, ex->hf[i + 1].len);
        }
    }
    if (b == NULL)
        return NULL;
    size_t len = evbuffer_get_length(b);
    char *s = malloc(len + 1);
    if (s != NULL) {
        evbuffer_remove(b, s, len);
        s[len] = '\0';
    }
    evbuffer_free(b);
    return s;
}

/* With auth, pcrouter is the one that checks keys: the pods never see them. */
static int is_api_key_field(const char *name, size_t n)
{
    return (n == 13 && strncasecmp(name, "authorization", 13) == 0) ||
           (n == 9 && strncasecmp(name, "x-api-key", 9) == 0);
}

static char *put(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

/* The request for the pod: its head in a new buffer, written once into space of its exact
 * size (no printf: formatting cost more than the rest of the head), and its body, which is
 * `ex->body` itself (*body, sent by reference, never copied) unless stream_options is added to
 * it: then the body follows the head in the new buffer and *body is NULL. */
struct evbuffer *pcr_proxy_request(pcr_exchange_t *ex, pcr_backend_t *be, struct evbuffer *src,
                                   int usage, struct evbuffer **body)
{
    char *conn = request_connection(ex);
    size_t blen = evbuffer_get_length(src);
    /* upstream.request_usage: "stream_options" goes before the object's closing brace. */
    static const char opt[] = "\"stream_options\":{\"include_usage\":true}";
    const char *raw = NULL;
    int empty = 0;
    long at = -1;
    if (usage) {
        raw = blen ? (const char *)evbuffer_pullup(src, -1) : "";
        at = pcr_usage_insert_at(raw, blen, &empty);
    }
    size_t extra = at >= 0 ? sizeof(opt) - 1 + !empty : 0;
    int clen = blen > 0 || strcmp(ex->method, "POST") == 0;

    /* "<method> <path> HTTP/1.1\r\nHost: <host>\r\n", the fields kept, Content-Length, CRLF. */
    unsigned char keep[PCR_MAX_REQ_HEADERS];
    size_t mlen = strlen(ex->method), plen = strlen(ex->path), hlen = strlen(be->host_header);
    size_t rlen = strlen(ex->pd_reqid);
    size_t need = mlen + 1 + plen + 17 + hlen + 2 + 2 + (clen ? 16 + 20 + 2 : 0) +
                  (rlen ? 14 + rlen + 2 : 0);
    int strip_keys = ex->w->cfg->auth.enabled;
    for (size_t i = 0; i + 1 < ex->nh; i += 2) {
        keep[i / 2] = !pcr_http_hop_by_hop(ex->hbuf + ex->hf[i].off, ex->hf[i].len, conn) &&
                      !(strip_keys && is_api_key_field(ex->hbuf + ex->hf[i].off, ex->hf[i].len));
        if (keep[i / 2])
            need += ex->hf[i].len + 2 + ex->hf[i + 1].len + 2;
    }
    free(conn);
    struct evbuffer *b = evbuffer_new();
    struct evbuffer_iovec v;
    if (b == NULL || evbuffer_reserve_space(b, (ev_ssize_t)need, &v, 1) != 1) {
        if (b != NULL)
            evbuffer_free(b);
        return NULL;
    }
    char *p = v.iov_base;
    p = put(p, ex->method, mlen);
    *p++ = ' ';
    p = put(p, ex->path, plen);
    p = put(p, " HTTP/1.1\r\nHost: ", 17);
    p = put(p, be->host_header, hlen);
    p = put(p, "\r\n", 2);
    for (size_t i = 0; i + 1 < ex->nh; i += 2) {
        if (!keep[i / 2])
            continue;
        p = put(p, ex->hbuf + ex->hf[i].off, ex->hf[i].len);
        p = put(p, ": ", 2);
        p = put(p, ex->hbuf + ex->hf[i + 1].off, ex->hf[i + 1].len);
        p = put(p, "\r\n", 2);
    }
    if (rlen) { /* a disaggregated request's id, the same on both legs (pd_proxy.c) */
        p = put(p, "X-Request-Id: ", 14);
        p = put(p, ex->pd_reqid, rlen);
        p = put(p, "\r\n", 2);
    }
    if (clen) {
        p = put(p, "Content-Length: ", 16);
        p += pcr_http_put_dec(p, blen + extra);
        p = put(p, "\r\n", 2);
    }
    p = put(p, "\r\n", 2);
    v.iov_len = (size_t)(p - (char *)v.iov_base);
    evbuffer_commit_space(b, &v, 1);

    *body = NULL;
    if (at >= 0) {
        evbuffer_add(b, raw, (size_t)at);
        if (!empty)
            evbuffer_add(b, ",", 1);
        evbuffer_add(b, opt, sizeof(opt) - 1);
        evbuffer_add(b, raw + at, blen - (size_t)at);
    } else if (blen > 0) {
        *body = src;
    }
    return b;
}
