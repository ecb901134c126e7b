/* router/http/proxy.c: owns the way of a request to a pod: its prefix key once its body is in,
 * the live load of every backend, the policy's decision and its commit, the request written for
 * the pod and sent through the worker's pool, the answer streamed back (kept for a slow client
 * up to a bound, respond.c, and the pod's reading paused past it), what the pod reported of
 * its cache, and the retry on another pod when one failed before anything reached the client.
 * The states it moves the exchange through are exchange.c's (pcr_exchange_to).
 *
 * The request's bytes for the pod are written by proxy_req.c.
 *
 *   routed: body reader's last step -> key -> policy decision -> commit -> upstream
 *   upstream head/body/end -> session ops (streamed as they come)
 *   upstream failure before anything reached the client -> forget the speculative index
 *   entry, try another backend (upstream.retries times), else 502/503/504 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bus.h"
#include "exchange_int.h"
#include "http1.h"
#include "log.h"
#include "pools.h"
#include "tokenize.h"

static const pcr_upstream_cbs_t proxy_cbs;

static void fail_unrouted(pcr_exchange_t *ex)
{
    switch (ex->last_error) {
    case PCR_UP_TIMEOUT:
        pcr_exchange_error(ex, 504, "timeout", "upstream_timeout",
                           "backend %s did not answer within %u ms", ex->be ? ex->be->conf.name : "?",
                           ex->w->cfg->timeouts.response_ms);
        break;
    case PCR_UP_POOL_FULL:
        pcr_exchange_error(ex, 503, "service_unavailable", "no_backend",
                           "every backend connection stayed busy for %u ms",
                           ex->w->cfg->timeouts.response_ms);
        break;
    case PCR_UP_HELD_OUT:
        pcr_exchange_error(ex, 503, "service_unavailable", "no_backend",
                           "backend %s went out of rotation while the request waited for it, "
                           "and no other could take it", ex->be ? ex->be->conf.name : "?");
        break;
    case PCR_UP_HELD:
        pcr_exchange_error(ex, 503, "service_unavailable", "backend_busy",
                           "backend %s kept more than routing.hold_tokens (%llu) of prefill "
                           "queued for %u ms", ex->be ? ex->be->conf.name : "?",
                           (unsigned long long)ex->w->cfg->routing.hold_tokens,
                           ex->w->cfg->timeouts.response_ms);
        break;
    default:
        pcr_exchange_error(ex, 502, "upstream_error", "bad_gateway",
                           "%u backend(s) failed before answering (last: %s, %s)", ex->attempts,
                           ex->be ? ex->be->conf.name : "?",
                           ex->last_error == PCR_UP_CONNECT  ? "connection refused or timed out"
                           : ex->last_error == PCR_UP_PROTOCOL ? "malformed HTTP response"
                                                               : "connection closed");
        break;
    }
}

static int tried(const pcr_exchange_t *ex, size_t i)
{
    return (ex->tried[i / 64] >> (i % 64)) & 1;
}

/* Fills loads[0..n) for the policy: usable = in a slot, up, not ejected, not yet tried, serving
 * the model. Returns how many are usable. A prefill pod decodes nothing: outside
 * pcr_pd_decide, which sees every role, it is never usable (fill_loads). */
size_t pcr_proxy_fill_loads(pcr_exchange_t *ex, pcr_backend_load_t *loads, size_t n, uint64_t now)
{
    pcr_server_t *srv = ex->w->srv;
    const char *model = ex->req.model ? ex->req.model : "";
    size_t usable = 0, candidates = 0;
    memset(loads, 0, n * sizeof(*loads));
    for (size_t i = 0; i < n; i++) {
        pcr_backend_t *be = pcr_backend_at(srv, i);
        if (be == NULL)
            continue;
        int serves = !tried(ex, i) && PCR_LOAD(be->up) &&
                     pcr_backend_serves(be, model, ex->model_hash);
        loads[i].usable = serves && !pcr_backend_ejected(be, now);
        loads[i].inflight = PCR_LOAD(be->inflight);
        loads[i].queued_prefill = PCR_LOAD(be->queued_prefill);
        loads[i].sent_prefill = PCR_LOAD(be->sent_prefill);
        loads[i].pod_waiting = PCR_LOAD(be->pod_waiting);
        loads[i].pod_running = PCR_LOAD(be->pod_running);
        loads[i].usable |= serves ? 2 : 0; /* a candidate, for panic below */
        usable += (loads[i].usable & 1) != 0;
        candidates += serves;
    }
    /* Panic (Envoy's name): every backend that passes its health checks and could take the
     * request is ejected. Trying them anyway beats answering 503 to everything; one that
     * answers comes back through its probe. (Backends that fail their active checks stay out:
     * a 503 that says so is clearer than errors from a dead engine.) */
    int panic = usable == 0 && candidates > 0;
    for (size_t i = 0; i < n; i++)
        loads[i].usable = panic ? (loads[i].usable & 2) != 0 : (loads[i].usable & 1);
    if (panic) {
        ex->panic = 1;
        usable = candidates;
    }
    return usable;
}

static size_t fill_loads(pcr_exchange_t *ex, pcr_backend_load_t *loads, size_t n, uint64_t now,
                         const unsigned char *roles)
{
    size_t usable = pcr_proxy_fill_loads(ex, loads, n, now);
    for (size_t i = 0; roles != NULL && i < n; i++) {
        if (roles[i] == PCR_ROLE_PREFILL && loads[i].usable) {
            loads[i].usable = 0;
            usable--;
        }
    }
    return usable;
}

/* The decision's phases (a routed request's first attempt), in the worker's histograms. */
static void observe_decision(pcr_exchange_t *ex, uint64_t match_ns, uint64_t cost_ns,
                             uint64_t t_end)
{
    pcr_hist_t *h = ex->w->metrics.decision;
    pcr_hist_observe(&h[PCR_PHASE_PARSE], &pcr_hist_decision_ns, (int64_t)ex->ns_parse);
    pcr_hist_observe(&h[PCR_PHASE_HASH], &pcr_hist_decision_ns, (int64_t)ex->ns_hash);
    pcr_hist_observe(&h[PCR_PHASE_MATCH], &pcr_hist_decision_ns, (int64_t)match_ns);
    pcr_hist_observe(&h[PCR_PHASE_COST], &pcr_hist_decision_ns, (int64_t)cost_ns);
    if (ex->tokenized)
        pcr_hist_observe(&h[PCR_PHASE_TOKENIZE], &pcr_hist_decision_ns, (int64_t)ex->ns_tokenize);
    pcr_hist_observe(&h[PCR_PHASE_TOTAL], &pcr_hist_decision_ns, (int64_t)(t_end - ex->t_parse_ns));
}

/* The cached tokens the decision predicts: the chosen backend's matched blocks, a token being
 * PCR_BYTES_PER_TOKEN bytes of canonical prompt, at most the prompt's own tokens. */
static uint64_t predicted_tokens(const pcr_exchange_t *ex)
{
    if (!ex->has_key)
        return 0;
    /* A precise decision counts the pods' token blocks, the others blocks of text. */
    uint64_t t = ex->decision.precise
                     ? (uint64_t)ex->decision.matched_blocks * ex->w->cfg->routing.kv_block_tokens
                     : (uint64_t)ex->decision.matched_blocks * ex->w->cfg->routing.block_bytes /
                           PCR_BYTES_PER_TOKEN;
    return t < ex->key.prompt_tokens ? t : ex->key.prompt_tokens;
}

/* Chooses a backend (skipping those already tried) and sends the request there. */
int pcr_proxy_dispatch(pcr_exchange_t *ex)
{
    pcr_worker_t *w = ex->w;
    pcr_server_t *srv = w->srv;
    const char *model = ex->req.model ? ex->req.model : "";
    if (pcr_proxy_pod_body(ex) < 0)
        return 0;
    pcr_worker_sync(w); /* what the other workers (and the control thread) published meanwhile */
    size_t n = pcr_backend_slots(srv);
    pcr_backend_load_t loads[n ? n : 1];
    pcr_decision_t d;
    pcr_backend_t *be = NULL;
    /* The clock read that ended the reader's last step, when the decision follows it at once
     * (proxy_routed); a retry reads it anew. */
    uint64_t now = (ex->t_hashed_ns != 0 ? ex->t_hashed_ns : pcr_now_ns()) / 1000u;
    ex->t_hashed_ns = 0;
    uint64_t match_ns = 0, cost_ns = 0, t_end = 0;
    /* A disaggregated fleet: a prompt's first pass decides where it is prefilled too
     * (pcr_pd_decide); after a prefill leg, or a failed attempt, only the decode pod is
     * chosen again. */
    unsigned char roles[n ? n : 1];
    int pd = pcr_pd_roles(ex, roles, n);
    pcr_pd_decision_t pdd = {.outcome = PCR_PD_LOCAL_MODE};
    for (;;) {
        int rc;
        if (pd && ex->has_key) {
            pcr_backend_load_t scratch[n ? n : 1];
            pcr_pd_opts_t o = w->cfg->pd;
            if (ex->pd_state != PD_NONE || ex->attempts > 0)
                o.mode = PCR_PD_NEVER;
            pcr_proxy_fill_loads(ex, loads, n, now);
            rc = pcr_pd_decide(w->policy, &o, &ex->key, loads, roles, scratch, n, now, &pdd);
            d = pdd.decode;
            if (rc == 0 && pdd.outcome == PCR_PD_REMOTE) {
                match_ns += pdd.prefill.match_ns;
                cost_ns += pdd.prefill.cost_ns;
            }
        } else {
            fill_loads(ex, loads, n, now, pd ? roles : NULL);
            /* A session stays on its pod while that pod is within its bounds: the decision
             * is then among that pod alone (its cached blocks and costs as usual). */
            int sp = ex->attempts == 0 ? pcr_tenancy_session_pod(ex, loads, n) : -1;
            for (size_t i = 0; sp >= 0 && i < n; i++)
                if ((int)i != sp)
                    loads[i].usable = 0;
            rc = pcr_policy_decide(w->policy, ex->has_key ? &ex->key : NULL, loads, now, &d);
        }
        match_ns += d.match_ns;
        cost_ns += d.cost_ns;
        t_end = d.done_ns; /* the policy's clock is pcr_now_ns (worker.c) */
        if (rc < 0 || d.backend < 0 || (size_t)d.backend >= n)
            break;
        if ((be = pcr_backend_at(srv, (size_t)d.backend)) != NULL)
            break;
        /* It left between the two reads: never again for this request. */
        ex->tried[(size_t)d.backend / 64] |= 1ull << ((size_t)d.backend % 64);
    }
    /* No pod, with the control thread's news of a reload (pods that joined, the rest of its
     * slots) published after this worker's sync: once more with them. */
    if (be == NULL && !ex->resynced && pcr_bus_drain(srv->bus, w->id, &w->policy) > 0) {
        ex->resynced = 1;
        return pcr_proxy_dispatch(ex);
    }
    if (ex->attempts == 0 && ex->has_key && ex->pd_state == PD_NONE && ex->pd_attempts == 0)
        observe_decision(ex, match_ns, cost_ns, t_end != 0 ? t_end : pcr_now_ns());
    if (be != NULL && pd && ex->has_key && ex->pd_state == PD_NONE && ex->attempts == 0) {
        if (ex->pd_attempts == 0) {
            ex->pd_outcome = pdd.outcome;
            PCR_INC(w->metrics.pd_decisions[pdd.outcome < PCR_PD__COUNT ? pdd.outcome
                                                                         : PCR_PD_FALLBACK]);
        }
        if (pdd.outcome == PCR_PD_REMOTE) {
            pcr_pd_prefill(ex, &pdd, now);
            return 0;
        }
        ex->pd_state = PD_LOCAL;
    }
    if (be == NULL) {
        if (ex->attempts > 0) {
            fail_unrouted(ex);
        } else if (model[0] != '\0' && pcr_backends_up(srv) > 0) {
            pcr_exchange_error(ex, 404, "invalid_request_error", "model_not_found",
                               "no backend serves the model '%s'", model);
        } else {
            pcr_exchange_error(ex, 503, "service_unavailable", "no_backend",
                               "no backend is available (%zu up)", pcr_backends_up(srv));
        }
        return 0;
    }
    if (ex->panic)
        PCR_INC(w->metrics.panic_routes);
    if (ex->attempts == 0) {
        PCR_INC(w->metrics.decisions[d.reason < PCR_REASON__COUNT ? d.reason : PCR_REASON_NO_BACKEND]);
        if (d.precise)
            PCR_INC(w->metrics.precise_decisions);
        if (ex->has_key) {
            PCR_BUMP(w->metrics.prefix_blocks, d.total_blocks);
            PCR_BUMP(w->metrics.prefix_blocks_matched, d.matched_blocks);
        }
    } else {
        PCR_INC(w->metrics.retries);
    }
    ex->decision = d;
    pcr_tenancy_session_went(ex, d.backend);
    ex->predicted = predicted_tokens(ex);
    ex->attempts++;
    ex->tried[(size_t)d.backend / 64] |= 1ull << ((size_t)d.backend % 64);
    if (ex->has_key && pcr_policy_commit(w->policy, d.backend, &ex->key, now, &ex->added_from) == 0) {
        ex->committed = 1;
        ex->t_commit = now;
        /* Read before this request joins the pending ones (pcr_exchange_to below). */
        ex->settled_before = pcr_backend_settled_before(be);
        pcr_bus_commit(srv->bus, (int)w->id, d.backend, &ex->key, now);
    }
    struct evbuffer *body;
    struct evbuffer *req = pcr_proxy_request(ex, be, ex->pd_body ? ex->pd_body : ex->body,
                                             ex->inject_usage, &body);
    if (req == NULL) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return 0;
    }
    pcr_pool_t *pool = pcr_pools_get(w, be);
    if (pool == NULL) {
        evbuffer_free(req);
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return 0;
    }
    /* The exchange holds the backend until it is freed: a backend that leaves the config is
     * not freed under a request it is answering. */
    pcr_backend_ref(be);
    if (ex->be != NULL)
        pcr_backend_unref(ex->be);
    ex->be = be;
    ex->prefill = d.uncached_prefill;
    /* A decode leg with parameters pulls the prompt's blocks: its pod prefills none of it.
     * Counted, it would stand in the pod's queue for the decisions beside it, be held behind
     * the pod's prefill budget (routing.hold_tokens) for nothing, and count as queued ahead
     * of the local prefills that teach the pod's rate. */
    if (ex->pd_state == PD_DECODE)
        ex->prefill = 0;
    pcr_exchange_to(ex, EX_UP_WAIT);
    /* A stream's first event tells when its prefill is done, so the pool can hold completions
     * while the pod's prefill queue is full (routing.hold_tokens). One that is not streamed
     * shows nothing before its answer, which vLLM sends whole once generated: its prefill
     * counts in the pod's queue until the time the policy expects its first token, not for
     * the whole generation. */
    pcr_up_send_t send = {.head = req, .body = body};
    pcr_up_prefix_t prefix;
    if (ex->has_key) {
        /* The key lives as long as the exchange, the upstream request no longer. */
        prefix = (pcr_up_prefix_t){
            .blocks = ex->key.blocks,
            .nblocks = (uint32_t)ex->key.nblocks,
            .matched = d.matched_blocks,
            .added_from = ex->committed ? (uint32_t)ex->added_from : (uint32_t)ex->key.nblocks,
        };
        send.kind = ex->req.stream ? PCR_UP_STREAM : PCR_UP_UNSTREAMED;
        send.prefill = ex->prefill;
        send.prefix = &prefix;
    }
    /* Held, it waits in its band and its tenant's turn, and not behind the prefill the pod
     * preempts for it. */
    send.priority = ex->priority;
    send.pclass = ex->pod_pslot;
    send.passes = pcr_tenancy_passes(ex);
    send.conn_wait_us = &ex->conn_wait_us;
    ex->up = pcr_upstream_send(pool, &send, &proxy_cbs, ex);
    if (ex->up == NULL) {
        pcr_exchange_to(ex, EX_ROUTING);
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
    }
    return 0;
}

/* ---- per-request truth: the pod's usage ------------------------------------------------ */

/* The answer's usage is read as it is forwarded (usage.h), for routed requests. */
static void usage_start(pcr_exchange_t *ex, int status, const pcr_hdr_t *hdrs, size_t n)
{
    const pcr_hdr_t *ct = NULL, *ce = NULL;
    for (size_t i = 0; i < n; i++) {
        if (hdrs[i].name_len == 12 && strncasecmp(hdrs[i].name, "content-type", 12) == 0)
            ct = &hdrs[i];
        else if (hdrs[i].name_len == 16 && strncasecmp(hdrs[i].name, "content-encoding", 16) == 0)
            ce = &hdrs[i];
    }
    pcr_usage_mode_t mode = pcr_usage_mode(status, ct ? ct->value : NULL, ct ? ct->value_len : 0,
                                           ce ? ce->value : NULL, ce ? ce->value_len : 0);
    pcr_usage_init(&ex->usage, mode, ex->inject_usage);
}

/* The one place a request's delivered cached tokens arrive, once per request, before its
 * outcome is recorded: the backend that answered (ex->be, slot ex->be->id), the decision that
 * chose it (ex->decision: matched and total blocks; ex->predicted in tokens), the prefix key
 * (ex->key), what the pod says it reused (`delivered`, and `prompt` tokens, in the pod's own
 * count), and which of the prefixes committed to the backend before it the pod had computed
 * when it was sent (ex->settled_before).
 *
 * It goes on to the routing library, pcr_policy_feedback(), in this worker's replica and, through
 * the bus, in every other: when the pod delivered less than predicted it no longer holds the
 * rest of that prefix, and the index forgets it for this backend; when it delivered more, the
 * index learns it. The policy is the library's; the router only passes the observation on
 * (routing.feedback false: counted, not passed on). */
static void observe_delivered(pcr_exchange_t *ex, uint64_t delivered, uint64_t prompt)
{
    pcr_backend_t *be = ex->be;
    uint64_t predicted = ex->predicted;
    if (ex->pd_state == PD_DECODE) {
        /* The decode pod counts the prompt it pulled as cached: the prefill pod delivered
         * this request's cache (pd_proxy.c counted it), and the decode pod's count says
         * nothing of what it held before. */
        ex->delivered = ex->pd_has_cached ? (int64_t)ex->pd_cached : (int64_t)delivered;
        return;
    }
    if (prompt > 0 && predicted > prompt)
        predicted = prompt; /* the pod's tokens are the truth; ours are estimates */
    /* ... but not beyond sense: a pod cannot have reused more of a prompt than the prompt
     * (nor, when it gives no prompt size, more tokens than the request had bytes). Every
     * figure below, metrics included, sees the bounded value. */
    uint64_t bound = prompt > 0 ? prompt : (uint64_t)pcr_exchange_body_bytes(ex);
    if (delivered > bound)
        delivered = bound;
    ex->predicted = predicted;
    ex->delivered = (int64_t)delivered;
    PCR_ADD(be->cached_predicted, predicted);
    PCR_ADD(be->cached_delivered, delivered);
    PCR_ADD(be->prompt_tokens, prompt);
    pcr_hist_observe(&ex->w->metrics.cached_error, &pcr_hist_tokens_error,
                     (int64_t)predicted - (int64_t)delivered);
    pcr_worker_t *w = ex->w;
    /* A held request may have gone ahead of the one that was to bring its prefix to the pod:
     * then what the pod reused says nothing of what it evicted. */
    if (ex->has_key && ex->committed && !ex->held && w->cfg->routing.feedback) {
        pcr_policy_feedback(w->policy, &ex->key, &ex->decision, delivered, ex->settled_before);
        pcr_bus_feedback(w->srv->bus, (int)w->id, &ex->key, &ex->decision, delivered,
                         ex->settled_before);
    }
}

/* Whether field `f` of the pod's response is not to be forwarded: hop-by-hop (one of the
 * fixed list, or named by any of its Connection fields, however long they are), or one of
 * pcrouter's own (X-Pcrouter-*), which only pcrouter sets: a pod's would go out beside them
 * and could pass for them. */
static int pod_hop_by_hop(const pcr_hdr_t *hdrs, size_t n, const pcr_hdr_t *f)
{
    if (pcr_http_hop_by_hop(f->name, f->name_len, NULL))
        return 1;
    if (f->name_len >= 11 && strncasecmp(f->name, "x-pcrouter-", 11) == 0)
        return 1;
    for (size_t j = 0; j < n; j++)
        if (hdrs[j].name_len == 10 && strncasecmp(hdrs[j].name, "connection", 10) == 0 &&
            pcr_http_list_has(hdrs[j].value, hdrs[j].value_len, f->name, f->name_len))
            return 1;
    return 0;
}

static void on_up_head(void *ctx, int status, const pcr_hdr_t *hdrs, size_t n, int64_t clen)
{
    pcr_exchange_t *ex = ctx;
    pcr_hdr_t out[PCR_MAX_REQ_HEADERS];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 3 < PCR_ARRAY_SIZE(out); i++)
        if (!pod_hop_by_hop(hdrs, n, &hdrs[i]))
            out[k++] = hdrs[i];
    const char *bname = ex->be->conf.name;
    const char *reason = pcr_reason_name(ex->decision.reason);
    out[k++] = (pcr_hdr_t){"x-pcrouter-backend", 18, bname, strlen(bname)};
    out[k++] = (pcr_hdr_t){"x-pcrouter-route", 16, reason, strlen(reason)};
    pcr_backend_t *pf = ex->pd_state == PD_DECODE
                            ? pcr_backend_at(ex->w->srv, (size_t)ex->pd_prefill_slot) : NULL;
    if (pf != NULL) /* the pod whose KV blocks the decode pod pulled */
        out[k++] = (pcr_hdr_t){"x-pcrouter-prefill", 18, pf->conf.name, strlen(pf->conf.name)};
    /* A 4xx is the client's fault: for outlier detection it is a pod that works. */
    pcr_backend_report(ex->be, &ex->w->cfg->outlier, status >= 500 ? PCR_OUTCOME_5XX : PCR_OUTCOME_OK,
                       pcr_now_us());
    if (ex->has_key) {
        usage_start(ex, status, hdrs, n);
        if (ex->pd_state == PD_DECODE && ex->pd_has_cached)
            pcr_usage_rewrite(&ex->usage, ex->pd_cached);
        if (ex->usage.strip || ex->usage.rewrite)
            clen = -1; /* an event may be dropped or rewritten: the length is no longer known */
    }
    pcr_exchange_to(ex, EX_UP_HEAD);
    pcr_exchange_respond_head(ex, status, out, k, clen);
}

static void emit_body(void *ctx, const char *data, size_t len)
{
    if (len > 0)
        pcr_exchange_respond_body(ctx, data, len);
}

static void on_up_body(void *ctx, const char *data, size_t len)
{
    pcr_exchange_t *ex = ctx;
    /* A stream's first event is its first token: the time to it teaches the policy the pod's
     * prefill rate (every worker's replica, through the bus). Not at the response head, which
     * vLLM sends before prefilling a stream and after generating a whole non-streamed answer;
     * not after a retry, whose time includes the failed attempt. Not with replicas sharing
     * through Redis either: each sees only its own part of a pod's queue, so the time it
     * measures holds the other replicas' work, which it would take for the pod's slowness
     * (4 replicas fell from 1.03x to 0.81x of one replica's hit rate so); they route on the
     * configured rate. Every stream's time counts from its send, behind the prefill its pod had
     * been sent then and not finished: a wait in pcrouter (held, or for a connection slot) is
     * not the pod's, and neither are the held streams of the queue the decision saw. Counted
     * from the decision, a stream that went while others were held (another worker's, whose
     * wake-up was still on its way) was charged their prefill too, and its pod looked up to
     * three times faster than it was: the cost then sent it every long prompt (Mooncake past
     * its knee, two workers). The same first event is the stream's time to first token
     * (metrics, access log). */
    if (ex->state != EX_UP_BODY && ex->req.stream && ex->t_first == 0) {
        ex->t_first = pcr_now_us();
        ex->prefill_ahead = pcr_upstream_sent_ahead(ex->up);
        ex->has_prefill_ahead = 1;
    }
    /* Not a decode leg's either: what the decode pod pulled is no prefill of its own, and
     * counted as one it would make the pod look many times faster than it is. */
    if (ex->state != EX_UP_BODY && ex->req.stream && ex->attempts == 1 &&
        !ex->w->cfg->redis.enabled && ex->pd_state != PD_DECODE) {
        pcr_worker_t *w = ex->w;
        uint64_t sent = pcr_upstream_sent_us(ex->up);
        uint64_t from = sent > ex->t_start ? sent : ex->t_start;
        uint64_t ttfb = ex->t_first > from ? ex->t_first - from : 0;
        uint64_t ahead = ex->prefill_ahead;
        pcr_policy_observe(w->policy, ex->be->id, ex->decision.uncached_prefill, ahead, ttfb);
        pcr_bus_observe(w->srv->bus, (int)w->id, ex->be->id, ex->decision.uncached_prefill,
                        ahead, ttfb);
    }
    if (ex->state != EX_UP_BODY && pcr_upstream_prefill_done(ex->up)) {
        ex->held = 1;
        ex->held_us += pcr_upstream_held_us(ex->up);
    }
    pcr_exchange_to(ex, EX_UP_BODY); /* the pod has started answering: its prefill is done */
    pcr_usage_feed(&ex->usage, data, len, emit_body, ex);
    /* A client slower than its pod: the answer is kept for it (respond.c) up to its bound and
     * the budget, and only past them does the pod's reading pause. */
    if (!ex->paused && pcr_exchange_out_full(ex)) {
        ex->paused = 1;
        PCR_INC(ex->w->metrics.response_backpressure);
        pcr_upstream_pause(ex->up);
    }
}

static void on_up_done(void *ctx)
{
    pcr_exchange_t *ex = ctx;
    ex->up = NULL;
    if (pcr_usage_finish(&ex->usage, emit_body, ex))
        observe_delivered(ex, ex->usage.cached_tokens, ex->usage.prompt_tokens);
    pcr_tenancy_served(ex, ex->usage.completion_tokens);
    pcr_usage_dispose(&ex->usage);
    pcr_exchange_to(ex, EX_DONE);
    pcr_exchange_respond_end(ex, RESPOND_END); /* after what is kept for a slow client */
}

/* Another backend that could take the request, without choosing it yet. */
static int can_retry(pcr_exchange_t *ex)
{
    size_t n = pcr_backend_slots(ex->w->srv);
    pcr_backend_load_t loads[n ? n : 1];
    unsigned char roles[n ? n : 1];
    int pd = pcr_pd_roles(ex, roles, n);
    return ex->attempts <= ex->w->cfg->upstream.retries && !ex->w->draining &&
           fill_loads(ex, loads, n, pcr_now_us(), pd ? roles : NULL) > 0;
}

static void on_up_error(void *ctx, pcr_up_error_t err, int got_head)
{
    pcr_exchange_t *ex = ctx;
    pcr_backend_t *be = ex->be;
    ex->up = NULL;
    ex->last_error = err;
    if (err == PCR_UP_HELD) { /* held until its deadline, and the request with it */
        ex->held = 1;
        ex->held_us += (uint64_t)ex->w->cfg->timeouts.response_ms * 1000u;
    }
    /* A full pool or a held request: the pool is ours; the pod did nothing wrong. */
    if (err != PCR_UP_POOL_FULL && err != PCR_UP_HELD && err != PCR_UP_HELD_OUT)
        pcr_backend_report(be, &ex->w->cfg->outlier,
                           err == PCR_UP_CONNECT ? PCR_OUTCOME_CONNECT : PCR_OUTCOME_ERROR,
                           pcr_now_us());
    if (got_head) {
        /* Part of the response reached the client: it cannot be retried, only cut. */
        pcr_log_warn("backend %s: response cut short (%s) after %llu bytes", be->conf.name,
                     err == PCR_UP_TIMEOUT    ? "stream idle timeout"
                     : err == PCR_UP_PROTOCOL ? "malformed response"
                                              : "connection lost",
                     (unsigned long long)ex->resp_bytes);
        pcr_exchange_to(ex, EX_ABORTED);
        pcr_exchange_respond_end(ex, RESPOND_ABORT);
        return;
    }
    pcr_exchange_to(ex, EX_ROUTING);
    if (ex->committed) {
        pcr_policy_forget(ex->w->policy, be->id, &ex->key, ex->added_from);
        pcr_bus_forget(ex->w->srv->bus, (int)ex->w->id, be->id, &ex->key, ex->added_from);
        ex->committed = 0;
    }
    int retryable = err == PCR_UP_CONNECT || err == PCR_UP_RESET || err == PCR_UP_PROTOCOL ||
                    err == PCR_UP_HELD_OUT;
    if (retryable && can_retry(ex)) {
        if (ex->pd_state == PD_DECODE && ex->pd_body != NULL) {
            /* The prefill pod's parameters were for one pull: the next pod prefills itself. */
            evbuffer_free(ex->pd_body);
            ex->pd_body = NULL;
            ex->pd_state = PD_LOCAL;
            ex->pd_has_cached = 0;
        }
        pcr_log_info(err == PCR_UP_HELD_OUT
                         ? "backend %s went out of rotation while a request waited for it; "
                           "routing it again"
                         : "backend %s failed before answering; retrying on another backend",
                     be->conf.name);
        pcr_proxy_dispatch(ex);
        return;
    }
    fail_unrouted(ex);
}

pcr_light_client_t *pcr_proxy_up_owner(void *arg) { return ((pcr_exchange_t *)arg)->client_load; }

/* An unstreamed completion's first token, as the policy expects it of its pod behind `tokens`
 * of prefill (what was sent before it, and its own): at the rate learned from streams, or the
 * policy's starting one. */
uint64_t pcr_proxy_up_prefill_us(void *arg, uint64_t tokens)
{
    pcr_exchange_t *ex = arg;
    double us = pcr_policy_estimate_ttft(ex->w->policy, ex->be->id, tokens);
    return us > 0 ? (uint64_t)us : 0;
}

/* ... has come: its prefill leaves the pod's queue (pcr_exchange_prefill_due). */
void pcr_proxy_up_prefill_due(void *arg) { pcr_exchange_prefill_due(arg); }

/* Its tenant's fairness counter, for its turn among held completions of its band. */
double pcr_proxy_up_fair(void *arg) { return pcr_tenancy_fair(arg); }

static const pcr_upstream_cbs_t proxy_cbs = {on_up_head,  on_up_body,         on_up_done,
                                             on_up_error, pcr_proxy_up_owner, pcr_proxy_up_prefill_us,
                                             pcr_proxy_up_prefill_due, pcr_proxy_up_fair};

/* Once admitted: in precise mode the prompt's tokens first (at once from the cache, or later
 * from a pod, which then dispatches), then the decision. */
static int tokenize_then_dispatch(pcr_exchange_t *ex)
{
    if (pcr_tokenize_start(ex))
        pcr_proxy_dispatch(ex);
    return 0;
}

/* POST /v1/completions and /v1/chat/completions: the prompt picks the backend. The body was
 * parsed and its prompt hashed while it arrived (pcr_exchange_add_body): what is left is the
 * reader's last step and the decision. */
int pcr_proxy_routed(pcr_exchange_t *ex)
{
    /* The body was read and its prefix hashed as it came (ns_parse); from here on is the time
     * after its last byte: the reader's last step (ns_hash), then the decision. */
    if (pcr_tenancy_identify(ex) < 0)
        return 0;
    ex->t_parse_ns = pcr_now_ns();
    if (ex->reader == NULL && pcr_exchange_reader_start(ex) < 0) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "out of memory");
        return 0;
    }
    int rc = pcr_body_reader_finish(ex->reader, &ex->req);
    const char *why = pcr_body_reader_error(ex->reader);
    ex->t_hashed_ns = pcr_now_ns();
    ex->ns_hash = ex->t_hashed_ns - ex->t_parse_ns;
    if (rc == PCR_ERR_PARSE) {
        pcr_exchange_error(ex, 400, "invalid_request_error", "invalid_json", "%s", why);
        return 0;
    }
    if (rc == PCR_ERR_INVAL) {
        pcr_exchange_error(ex, 400, "invalid_request_error", "missing_prompt", "%s", why);
        return 0;
    }
    if (rc < 0) {
        pcr_exchange_error(ex, 500, "server_error", "internal", "%s", pcr_strerror(rc));
        return 0;
    }
    pcr_exchange_reader_release(ex);
    ex->key = pcr_body_key(&ex->req);
    ex->model_hash = pcr_model_hash(ex->req.model, ex->req.model_len);
    ex->has_key = 1;
    /* A stream whose client asked nothing of its options: pcrouter may ask for usage (where,
     * build_upstream_request finds). */
    ex->inject_usage = ex->w->cfg->upstream.request_usage && ex->req.stream &&
                       !ex->req.stream_options;
    if (pcr_tenancy_admit(ex, tokenize_then_dispatch) == 0)
        tokenize_then_dispatch(ex);
    return 0;
}

/* Other POST /v1/...: no prompt to route on, the caller's key and limits all the same. */
int pcr_proxy_plain(pcr_exchange_t *ex)
{
    /* The same release path as a prompt's: a worker's flow queue sends everything it released
     * on one way (tokenizing is skipped without a prompt). */
    if (pcr_tenancy_identify(ex) == 0 && pcr_tenancy_admit(ex, tokenize_then_dispatch) == 0)
        tokenize_then_dispatch(ex);
    return 0;
}
