/* router/http/pd_proxy.c: owns the prefill leg of a disaggregated request, vLLM's
 * NixlConnector "pull" protocol as its proxies speak it:
 *
 *   leg 1, to the prefill pod (same path): the client's body with max_tokens 1 (and
 *     max_completion_tokens 1 when present), stream false, stream_options, min_tokens and
 *     min_completion_tokens removed, and kv_transfer_params {do_remote_decode: true,
 *     do_remote_prefill: false, remote_engine_id, remote_block_ids, remote_host, remote_port:
 *     null}; its answer (bounded, PD_MAX_ANSWER) carries kv_transfer_params at its top level
 *     when the pod kept the prompt's blocks for a decode pod to pull.
 *   leg 2, to the decode pod: the client's body as it came plus those kv_transfer_params,
 *     remote_host replaced by the address pcrouter reached the prefill pod at (a pod may
 *     advertise one nobody can reach); streamed to the client as asked, with the usage's
 *     cached tokens those the prefill pod reported (proxy.c, usage.h's rewrite).
 *   Both legs carry the same X-Request-Id: the client's, or one pcrouter makes.
 *
 * Where each goes is the policy's (pcr_pd_decide, in proxy.c's dispatch); this file moves the
 * bytes. A prefill leg that fails before the decode leg starts is tried on another prefill pod
 * (upstream.retries), then the request goes to its decode pod without parameters, which
 * prefills it itself; so does one whose answer has none. A client that leaves cancels the
 * leg (pcr_exchange_free cancels ex->up, which is the leg's while it runs). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <openssl/rand.h>

#include "bus.h"
#include "exchange_int.h"
#include "log.h"
#include "pools.h"

/* A one-token completion with its parameters is a few KiB; past this it is no such answer. */
#define PD_MAX_ANSWER (1024 * 1024)

static const pcr_upstream_cbs_t pd_cbs;

int pcr_pd_roles(pcr_exchange_t *ex, unsigned char *roles, size_t n)
{
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        pcr_backend_t *be = pcr_backend_at(ex->w->srv, i);
        roles[i] = be != NULL ? (unsigned char)PCR_LOAD(be->conf.role) : PCR_ROLE_BOTH;
        any |= roles[i] != PCR_ROLE_BOTH;
    }
    return any;
}

/* The client's X-Request-Id, or else one of pcrouter's (ex->pd_reqid, which every leg's
 * request then carries: proxy.c). */
static void request_id(pcr_exchange_t *ex)
{
    for (size_t i = 0; i + 1 < ex->nh; i += 2)
        if (ex->hf[i].len == 12 && strncasecmp(ex->hbuf + ex->hf[i].off, "x-request-id", 12) == 0)
            return;
    unsigned char r[16];
    if (RAND_bytes(r, sizeof r) != 1)
        memset(r, 0, sizeof r); /* still one id for both legs; only unique ids are lost */
    r[6] = (unsigned char)((r[6] & 0x0f) | 0x40); /* a version 4 UUID, as vLLM's proxies send */
    r[8] = (unsigned char)((r[8] & 0x3f) | 0x80);
    char *p = ex->pd_reqid;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *p++ = '-';
        p += sprintf(p, "%02x", r[i]);
    }
}

/* The client's body as a JSON object (the body reader already checked it is one). */
static json_t *client_body(pcr_exchange_t *ex)
{
    size_t len = evbuffer_get_length(ex->body);
    const char *raw = len ? (const char *)evbuffer_pullup(ex->body, -1) : "";
    json_t *o = json_loadb(raw, len, 0, NULL);
    if (o != NULL && !json_is_object(o)) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

static struct evbuffer *dump(json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    struct evbuffer *b = s != NULL ? evbuffer_new() : NULL;
    if (b != NULL && evbuffer_add(b, s, strlen(s)) != 0) {
        evbuffer_free(b);
        b = NULL;
    }
    free(s);
    return b;
}

/* Leg 1's body (protocol above). */
static struct evbuffer *prefill_body(pcr_exchange_t *ex)
{
    json_t *o = client_body(ex);
    if (o == NULL)
        return NULL;
    json_object_set_new(o, "max_tokens", json_integer(1));
    if (json_object_get(o, "max_completion_tokens") != NULL)
        json_object_set_new(o, "max_completion_tokens", json_integer(1));
    json_object_set_new(o, "stream", json_false());
    json_object_del(o, "stream_options");
    json_object_del(o, "min_tokens");
    json_object_del(o, "min_completion_tokens");
    json_t *kv = json_pack("{s:b, s:b, s:n, s:n, s:n, s:n}", "do_remote_decode", 1,
                           "do_remote_prefill", 0, "remote_engine_id", "remote_block_ids",
                           "remote_host", "remote_port");
    if (kv == NULL || json_object_set_new(o, "kv_transfer_params", kv) != 0) {
        json_decref(o);
        return NULL;
    }
    struct evbuffer *b = dump(o);
    json_decref(o);
    return b;
}

/* The numeric address pcrouter connects to `be` at. */
static void be_address(const pcr_backend_t *be, char *out, size_t cap)
{
    const struct sockaddr_storage *a = &be->addr;
    const void *src = a->ss_family == AF_INET6
                          ? (const void *)&((const struct sockaddr_in6 *)a)->sin6_addr
                          : (const void *)&((const struct sockaddr_in *)a)->sin_addr;
    if (be->addrlen == 0 || inet_ntop(a->ss_family, src, out, (socklen_t)cap) == NULL)
        snprintf(out, cap, "%s", be->conf.host);
}

/* Goes on to the decode pod, with (state PD_DECODE) or without (PD_LOCAL) parameters. */
static void to_decode(pcr_exchange_t *ex, int state)
{
    pcr_exchange_to(ex, EX_ROUTING);
    ex->pd_state = state;
    pcr_proxy_dispatch(ex);
}

/* The prefill leg failed: another prefill pod while upstream.retries allows, else the decode
 * pod prefills itself. */
static void leg_failed(pcr_exchange_t *ex, pcr_pd_fail_t why)
{
    pcr_worker_t *w = ex->w;
    pcr_backend_t *be = ex->be;
    PCR_INC(w->metrics.pd_leg_failures[why]);
    if (ex->pd_committed) {
        pcr_policy_forget(w->policy, be->id, &ex->key, ex->pd_added_from);
        pcr_bus_forget(w->srv->bus, (int)w->id, be->id, &ex->key, ex->pd_added_from);
        ex->pd_committed = 0;
    }
    ex->tried[(size_t)be->id / 64] |= 1ull << ((size_t)be->id % 64);
    ex->pd_state = PD_NONE;
    if (ex->pd_body != NULL) { /* the leg's own body: the decode pod gets the client's */
        evbuffer_free(ex->pd_body);
        ex->pd_body = NULL;
    }
    if (why == PCR_PD_FAIL_ERROR && ex->pd_attempts <= w->cfg->upstream.retries &&
        !w->draining) {
        pcr_log_info("prefill pod %s failed; trying the prefill again", be->conf.name);
        pcr_exchange_to(ex, EX_ROUTING);
        pcr_proxy_dispatch(ex); /* pd_state is still PD_NONE: decides again, without it */
        return;
    }
    pcr_log_info("prefill pod %s gave nothing to pull (%s); the decode pod prefills",
                 be->conf.name, why == PCR_PD_FAIL_ERROR ? "failed" : "no parameters");
    to_decode(ex, PD_LOCAL);
}

void pcr_pd_prefill(pcr_exchange_t *ex, const pcr_pd_decision_t *pdd, uint64_t now)
{
    pcr_worker_t *w = ex->w;
    pcr_backend_t *be = pcr_backend_at(w->srv, (size_t)pdd->prefill.backend);
    struct evbuffer *body = NULL, *req = NULL, *ref = NULL;
    pcr_pool_t *pool = NULL;
    if (be == NULL)
        goto local;
    if (ex->pd_reqid[0] == '\0' && ex->pd_attempts == 0)
        request_id(ex);
    if ((body = prefill_body(ex)) == NULL ||
        (req = pcr_proxy_request(ex, be, body, 0, &ref)) == NULL ||
        (pool = pcr_pools_get(w, be)) == NULL)
        goto local;
    ex->pd_attempts++;
    ex->pd_decision = pdd->prefill;
    if (pcr_policy_commit(w->policy, be->id, &ex->key, now, &ex->pd_added_from) == 0) {
        ex->pd_committed = 1;
        ex->pd_settled_before = pcr_backend_settled_before(be);
        pcr_bus_commit(w->srv->bus, (int)w->id, be->id, &ex->key, now);
    }
    /* The leg is the exchange's attempt meanwhile: the prefill pod's in-flight count and
     * queued prefill carry it (pcr_exchange_to), so the next decisions see its queue. */
    pcr_backend_ref(be);
    if (ex->be != NULL)
        pcr_backend_unref(ex->be);
    ex->be = be;
    ex->prefill = pdd->prefill.uncached_prefill;
    ex->pd_state = PD_PREFILL;
    if (ex->pd_resp == NULL)
        ex->pd_resp = evbuffer_new();
    else
        evbuffer_drain(ex->pd_resp, evbuffer_get_length(ex->pd_resp));
    ex->pd_status = 0;
    pcr_exchange_to(ex, EX_UP_WAIT);
    /* The body buffer goes with the request: the exchange keeps it in pd_body until the leg
     * ends (sent by reference), then the decode leg's replaces it. */
    if (ex->pd_body != NULL)
        evbuffer_free(ex->pd_body);
    ex->pd_body = body;
    /* Held and counted in the pod's prefill queue as an unstreamed completion is: its
     * answer comes at its first token. */
    pcr_up_prefix_t prefix = {
        .blocks = ex->key.blocks,
        .nblocks = (uint32_t)ex->key.nblocks,
        .matched = pdd->prefill.matched_blocks,
        .added_from = ex->pd_committed ? ex->pd_added_from : (uint32_t)ex->key.nblocks,
    };
    pcr_up_send_t send = {.head = req, .body = ref, .kind = PCR_UP_UNSTREAMED,
                          .prefill = ex->prefill, .prefix = &prefix,
                          .priority = ex->priority, .pclass = ex->pod_pslot,
                          .passes = pcr_tenancy_passes(ex),
                          .conn_wait_us = &ex->conn_wait_us};
    ex->up = pcr_upstream_send(pool, &send, &pd_cbs, ex);
    if (ex->up == NULL || ex->pd_resp == NULL) {
        if (ex->up != NULL)
            pcr_upstream_cancel(ex->up);
        ex->up = NULL;
        leg_failed(ex, PCR_PD_FAIL_ERROR);
    }
    return;
local:
    if (body != NULL)
        evbuffer_free(body);
    if (req != NULL)
        evbuffer_free(req);
    to_decode(ex, PD_LOCAL);
}

static void on_leg_head(void *ctx, int status, const pcr_hdr_t *hdrs, size_t n, int64_t clen)
{
    pcr_exchange_t *ex = ctx;
    (void)hdrs;
    (void)n;
    (void)clen;
    ex->pd_status = status;
    uint64_t now = pcr_now_us();
    ex->pd_t_answer = now;
    pcr_backend_report(ex->be, &ex->w->cfg->outlier,
                       status >= 500 ? PCR_OUTCOME_5XX : PCR_OUTCOME_OK, now);
    if (pcr_upstream_prefill_done(ex->up)) /* held: others may have gone ahead of it */
        ex->held = 1;
    /* A one-token answer comes at its first token: its time teaches the prefill pod's rate,
     * as a stream's first event does (proxy.c), on the first leg only and without Redis. */
    pcr_worker_t *w = ex->w;
    uint64_t sent = pcr_upstream_sent_us(ex->up);
    if (status == 200 && ex->pd_attempts == 1 && !w->cfg->redis.enabled && sent != 0 &&
        now > sent) {
        uint64_t ahead = pcr_upstream_sent_ahead(ex->up);
        pcr_policy_observe(w->policy, ex->be->id, ex->pd_decision.uncached_prefill, ahead,
                           now - sent);
        pcr_bus_observe(w->srv->bus, (int)w->id, ex->be->id, ex->pd_decision.uncached_prefill,
                        ahead, now - sent);
    }
}

static void on_leg_body(void *ctx, const char *data, size_t len)
{
    pcr_exchange_t *ex = ctx;
    if (evbuffer_get_length(ex->pd_resp) + len > PD_MAX_ANSWER) {
        pcr_upstream_cancel(ex->up);
        ex->up = NULL;
        pcr_log_warn("prefill pod %s: answer past %d bytes", ex->be->conf.name, PD_MAX_ANSWER);
        leg_failed(ex, PCR_PD_FAIL_TOO_LARGE);
        return;
    }
    evbuffer_add(ex->pd_resp, data, len);
}

/* The prefill pod's cached tokens, counted against what its decision predicted and fed
 * back to the policy as a request's own pod's are (proxy.c's observe_delivered). */
static void prefill_delivered(pcr_exchange_t *ex, json_t *answer)
{
    json_t *usage = json_object_get(answer, "usage");
    json_t *cached = json_object_get(json_object_get(usage, "prompt_tokens_details"),
                                     "cached_tokens");
    if (!json_is_integer(cached) || json_integer_value(cached) < 0)
        return;
    pcr_worker_t *w = ex->w;
    pcr_backend_t *be = ex->be;
    uint64_t delivered = (uint64_t)json_integer_value(cached);
    json_t *pt = json_object_get(usage, "prompt_tokens");
    uint64_t prompt = json_is_integer(pt) && json_integer_value(pt) > 0
                          ? (uint64_t)json_integer_value(pt) : 0;
    uint64_t predicted = (uint64_t)ex->pd_decision.matched_blocks * w->cfg->routing.block_bytes /
                         PCR_BYTES_PER_TOKEN;
    if (predicted > ex->key.prompt_tokens)
        predicted = ex->key.prompt_tokens;
    if (prompt > 0 && predicted > prompt)
        predicted = prompt;
    ex->pd_cached = delivered;
    ex->pd_has_cached = 1;
    PCR_ADD(be->cached_predicted, predicted);
    PCR_ADD(be->cached_delivered, delivered);
    PCR_ADD(be->prompt_tokens, prompt);
    pcr_hist_observe(&w->metrics.cached_error, &pcr_hist_tokens_error,
                     (int64_t)predicted - (int64_t)delivered);
    if (ex->pd_committed && !ex->held && w->cfg->routing.feedback) {
        pcr_policy_feedback(w->policy, &ex->key, &ex->pd_decision, delivered,
                            ex->pd_settled_before);
        pcr_bus_feedback(w->srv->bus, (int)w->id, &ex->key, &ex->pd_decision, delivered,
                         ex->pd_settled_before);
    }
}

static void on_leg_done(void *ctx)
{
    pcr_exchange_t *ex = ctx;
    ex->up = NULL;
    if (ex->pd_status != 200) {
        leg_failed(ex, PCR_PD_FAIL_STATUS);
        return;
    }
    size_t len = evbuffer_get_length(ex->pd_resp);
    json_t *answer = json_loadb((const char *)evbuffer_pullup(ex->pd_resp, -1), len, 0, NULL);
    json_t *kv = json_object_get(answer, "kv_transfer_params");
    json_t *decode = NULL;
    struct evbuffer *b = NULL;
    if (json_is_object(answer))
        prefill_delivered(ex, answer);
    if (json_is_object(kv) && (decode = client_body(ex)) != NULL) {
        char host[64];
        be_address(ex->be, host, sizeof host);
        json_t *copy = json_deep_copy(kv);
        if (copy != NULL && json_object_get(copy, "remote_host") != NULL)
            json_object_set_new(copy, "remote_host", json_string(host));
        if (copy != NULL && json_object_set_new(decode, "kv_transfer_params", copy) == 0)
            b = dump(decode);
    }
    json_decref(decode);
    json_decref(answer);
    if (b == NULL) {
        leg_failed(ex, PCR_PD_FAIL_NO_PARAMS);
        return;
    }
    if (ex->pd_body != NULL)
        evbuffer_free(ex->pd_body);
    ex->pd_body = b;
    ex->pd_prefill_slot = (int)ex->be->id;
    to_decode(ex, PD_DECODE);
}

static void on_leg_error(void *ctx, pcr_up_error_t err, int got_head)
{
    pcr_exchange_t *ex = ctx;
    (void)got_head;
    ex->up = NULL;
    if (err != PCR_UP_POOL_FULL && err != PCR_UP_HELD && err != PCR_UP_HELD_OUT)
        pcr_backend_report(ex->be, &ex->w->cfg->outlier,
                           err == PCR_UP_CONNECT ? PCR_OUTCOME_CONNECT : PCR_OUTCOME_ERROR,
                           pcr_now_us());
    leg_failed(ex, PCR_PD_FAIL_ERROR);
}

/* The leg is held and timed as the exchange's own unstreamed completions are (proxy.c). */
static const pcr_upstream_cbs_t pd_cbs = {on_leg_head,  on_leg_body,         on_leg_done,
                                          on_leg_error, pcr_proxy_up_owner,  pcr_proxy_up_prefill_us,
                                          pcr_proxy_up_prefill_due, pcr_proxy_up_fair};
