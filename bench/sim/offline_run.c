/* bench/sim/offline_run.c: one simulated run of routing_offline (see offline.h).
 *
 * Events, in virtual microseconds, ordered by (time, sequence) so that ties resolve the same
 * way every run:
 *   ARRIVE  the router decides, commits, charges the backend, and the pod queues the request,
 *           unless the pod already has hold_tokens of uncached prefill sent and not yet at its
 *           first token: then the router holds it (pcr/hold.h), as router/upstream/upstream.c does,
 *           but for a stream of small own prefill that counts on none held (pcr_hold_small)
 *   FIRST   the first token, which the router sees at once, or with --jitter-ms up to that
 *           much later (SEEN)
 *   SEEN    the router releases the request's queued prefill, and sends its pod's held
 *           requests, highest pcr_hold_rank first (but a held request whose blocks the first
 *           counts on goes before it: pcr_hold_depends), while the pod is under the budget; the
 *           time teaches the policy the pod's rate (a held request's from its send)
 *   TOKENS  decoding goes on in chunks of CHUNK tokens at the pod's current inter-token time;
 *           after the last one the pod releases the cache blocks and admits who can go
 *   SCRAPE  the router reads every pod's waiting queue, as its health scrape does
 *   REACH   with --zones, a request sent to a pod in the other zone reaches it, the round
 *           trip after its send (vllm_sim --rtt-ms: the way in and the way out at once), so
 *           its first token, and every token after it, come that much later
 *   DUE     an unstreamed completion (--unstreamed) shows no first token: its prefill leaves
 *           the queue and the budget at the policy's expected first token from its send
 *           (pcr_policy_estimate_ttft, behind what the pod had been sent), as pcrouter's
 *           prefill timer does, or at its last token if that comes first; it teaches no rate
 *           and has no TTFT
 * A pod admits in FIFO order exactly as vllm_sim does (sim_model_admit).
 *
 * With --engine step the pods run step_engine.c instead, as vllm_sim --engine step does: one
 *   STEP   event per busy pod; at its time the pod's step ends, its tokens go out (a first
 *          token does what FIRST does, the last what the last TOKENS does), and the next step
 *          is composed. The gaps between a stream's tokens are its inter-token latencies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "offline.h"
#include "pcr/hold.h"
#include "pcr/ring.h"
#include "replay_trace.h"

#define CHUNK 8         /* tokens per TOKENS event: the batch changes little within 8 steps */
#define NIL UINT32_MAX

enum { EV_ARRIVE, EV_FIRST, EV_SEEN, EV_TOKENS, EV_SCRAPE, EV_DUE, EV_STEP, EV_REACH };

typedef struct {
    double t;
    uint64_t seq;
    uint32_t req;
    uint32_t type;
} ev_t;

typedef struct {
    ev_t *v;
    size_t n, cap;
    uint64_t seq;
} heap_t;

typedef struct {
    int pod;
    uint32_t next;             /* the pod's waiting list */
    size_t hit_tokens, sent;
    double first_us;
    uint64_t charged;          /* uncached prefill still counted in the backend's queue */
    uint32_t added_from;
    uint32_t hnext;            /* the pod's held requests */
    int held;                  /* was held: no feedback (see on_tokens) */
    int settled;               /* reached its first token (unstreamed: its expected one) */
    int unstreamed;            /* asks for a whole answer (rt_unstreamed) */
    uint32_t pnext;            /* its pod's requests in commit order (pending) */
    uint64_t settled_before;   /* pcr_policy_feedback's, as the router reads it at the send */
    pcr_decision_t d;
    double sent_us;            /* when it went to its pod */
    uint64_t ahead_at_send;    /* the pod's sent_prefill then (pcr_upstream_sent_ahead) */
    double late;               /* how late the router sees its first byte (--jitter-ms) */
    double due_us;             /* unstreamed: when the router expects its first token, or 0 */
    sim_step_seq_t seq;        /* --engine step: its sequence on its pod */
    double last_tok_us;        /* --engine step: when its last token came */
} rstate_t;

typedef struct {
    sim_model_t m;             /* this pod's latency model */
    pcr_kvcache_t *kv;
    uint32_t wait_head, wait_tail;
    unsigned nwait, running;
    double busy_until;
    uint64_t success;
    double prefilled;          /* prompt tokens it prefilled (not cached) */
    uint64_t sent_prefill;     /* uncached prefill sent, not yet at its first token */
    uint32_t hold_head;        /* held at the router, in arrival order */
    uint32_t pend_head, pend_tail; /* routed here, in commit order; settled ones leave the head */
    sim_step_t eng;            /* --engine step: the pod's engine */
    int eng_ready;             /* eng was initialised (teardown disposes it) */
} opod_t;

typedef struct {
    const off_work_t *w;
    const off_setup_t *s;
    const off_variant_t *v;
    pcr_policy_t *policy;
    pcr_ring_t *ring;          /* HAProxy's */
    uint64_t *ring_load;
    opod_t *pods;
    pcr_backend_load_t *loads;
    rstate_t *st;
    heap_t h;
    double *ttft;
    size_t nttft, finished;
    uint64_t rng;              /* the jitter's, seeded: same run, same draws */
    off_result_t *out;
    /* --engine step: the figures a load generator reports, and the step being ended. */
    double *itl, *tpot, *e2e, *outtok;
    size_t nitl, citl, ntpot, ndone;
    double step_now;
    int step_err;
} sim_t;

static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int before(const ev_t *a, const ev_t *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int push(heap_t *h, double t, uint32_t type, uint32_t req)
{
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 1024;
        ev_t *nv = realloc(h->v, nc * sizeof(*nv));
        if (!nv)
            return -1;
        h->v = nv;
        h->cap = nc;
    }
    ev_t e = {t, h->seq++, req, type};
    size_t i = h->n++;
    while (i > 0 && before(&e, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = e;
    return 0;
}

static ev_t pop(heap_t *h)
{
    ev_t top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && before(&h->v[c + 1], &h->v[c]))
            c++;
        if (!before(&h->v[c], &last))
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0)
        h->v[i] = last;
    return top;
}

/* ---- the pods ---------------------------------------------------------------------------- */

/* --engine step: pod b composes its next step unless one is under way. */
static int kick(sim_t *S, size_t b, double now)
{
    opod_t *pod = &S->pods[b];
    if (pod->eng.in_step)
        return 0;
    double d = sim_step_begin(&pod->eng);
    return d > 0 ? push(&S->h, now + d, EV_STEP, (uint32_t)b) : 0;
}

static int admit_waiting(sim_t *S, size_t b, double now)
{
    opod_t *pod = &S->pods[b];
    if (S->s->step)
        return kick(S, b, now);
    while (pod->wait_head != NIL && pod->running < pod->m.max_num_seqs) {
        uint32_t i = pod->wait_head;
        const off_req_t *r = &S->w->reqs[i];
        sim_admit_t a;
        if (sim_model_admit(&pod->m, pod->kv, r->kv, r->nkv, r->private_blocks,
                            r->prompt_tokens, pod->running, now, 1.0, &pod->busy_until,
                            &a) != 0)
            break;
        pod->wait_head = S->st[i].next;
        if (pod->wait_head == NIL)
            pod->wait_tail = NIL;
        pod->nwait--;
        pod->running++;
        S->st[i].hit_tokens = a.hit_tokens;
        S->out->delivered_tokens += (double)a.hit_tokens;
        S->out->prompt_tokens += (double)r->prompt_tokens;
        if (r->prompt_tokens > a.hit_tokens)
            pod->prefilled += (double)(r->prompt_tokens - a.hit_tokens);
        if (push(&S->h, a.first_token_us, EV_FIRST, i) != 0)
            return -1;
    }
    return 0;
}

static void enqueue(sim_t *S, size_t b, uint32_t i)
{
    opod_t *pod = &S->pods[b];
    if (S->s->step) {
        const off_req_t *r = &S->w->reqs[i];
        sim_step_seq_t *q = &S->st[i].seq;
        *q = (sim_step_seq_t){.hashes = r->kv, .nblocks = r->nkv,
                              .prompt_tokens = r->prompt_tokens, .max_tokens = r->max_tokens,
                              .owner = &S->st[i]};
        sim_step_add(&pod->eng, q);
        return;
    }
    S->st[i].next = NIL;
    if (pod->wait_tail != NIL)
        S->st[pod->wait_tail].next = i;
    else
        pod->wait_head = i;
    pod->wait_tail = i;
    pod->nwait++;
}

/* ---- the router -------------------------------------------------------------------------- */

static uint64_t hold_budget(const sim_t *S)
{
    return S->v->haproxy ? 0 : (uint64_t)S->v->hold_tokens;
}

/* The link to a request held at pod b that request i counts on (pcr_hold_depends), or NULL. */
static uint32_t *held_bringer(sim_t *S, size_t b, uint32_t i)
{
    if (!S->v->hold_deps)
        return NULL;
    const pcr_key_t *k2 = &S->w->reqs[i].key;
    for (uint32_t *p = &S->pods[b].hold_head; *p != NIL; p = &S->st[*p].hnext) {
        const pcr_key_t *k1 = &S->w->reqs[*p].key;
        if (*p != i && pcr_hold_depends(k2->blocks, (uint32_t)k2->nblocks,
                                        S->st[i].d.matched_blocks, k1->blocks,
                                        (uint32_t)k1->nblocks, S->st[*p].added_from))
            return p;
    }
    return NULL;
}

/* --zones: pod b is in zone b, away from the router. */
static int far_pod(const sim_t *S, size_t b)
{
    return S->s->far_pods > 0 && b >= S->s->npods - S->s->far_pods;
}

/* Request i goes to pod b now: its send time and what the pod had been sent then are what its
 * first token teaches the policy (on_seen), held or not. A pod of the other zone has it a
 * round trip later (EV_REACH). */
static int send_to_pod(sim_t *S, size_t b, uint32_t i, double now)
{
    opod_t *pod = &S->pods[b];
    S->st[i].sent_us = now;
    S->st[i].ahead_at_send = pod->sent_prefill;
    pod->sent_prefill += S->st[i].charged;
    if (far_pod(S, b) && S->s->rtt_us > 0) {
        if (push(&S->h, now + S->s->rtt_us, EV_REACH, i) != 0)
            return -1;
    } else {
        enqueue(S, b, i);
    }
    if (S->st[i].unstreamed && S->policy != NULL) {
        double us = pcr_policy_estimate_ttft(S->policy, (int)b,
                                             S->st[i].ahead_at_send + S->st[i].charged);
        S->st[i].due_us = now + (us > 0 ? us : 0);
        return push(&S->h, S->st[i].due_us, EV_DUE, i);
    }
    return 0;
}

/* Sends pod b's held requests, highest rank first (or what the first counts on, first), while
 * it is under the budget; then the pod admits who can go. */
static int release(sim_t *S, size_t b, double now)
{
    opod_t *pod = &S->pods[b];
    while (pod->hold_head != NIL && pcr_hold_open(pod->sent_prefill, hold_budget(S))) {
        uint32_t *best = NULL;
        double rank = 0;
        for (uint32_t *p = &pod->hold_head; *p != NIL; p = &S->st[*p].hnext) {
            double k = pcr_hold_rank((uint64_t)(now - S->w->reqs[*p].arrival_us),
                                     S->st[*p].charged);
            if (best == NULL || k > rank) {   /* ties: the earlier arrival, first in the list */
                best = p;
                rank = k;
            }
        }
        for (int depth = 0; depth < 8; depth++) {
            uint32_t *q = held_bringer(S, b, *best);
            if (q == NULL)
                break;
            best = q;
        }
        uint32_t i = *best;
        *best = S->st[i].hnext;
        if (send_to_pod(S, b, i, now) != 0)
            return -1;
    }
    return admit_waiting(S, b, now);
}

/* The request goes to its pod now, or waits at the router behind what the pod has. */
static int send_or_hold(sim_t *S, size_t b, uint32_t i, double now)
{
    opod_t *pod = &S->pods[b];
    if ((S->st[i].unstreamed && !S->v->hold_unstreamed) ||
        (pod->hold_head == NIL && pcr_hold_open(pod->sent_prefill, hold_budget(S))) ||
        (pcr_hold_small(S->st[i].charged) && held_bringer(S, b, i) == NULL)) {
        if (send_to_pod(S, b, i, now) != 0)
            return -1;
        return admit_waiting(S, b, now);
    }
    uint32_t *p = &pod->hold_head;   /* at the tail: arrival order breaks ties */
    while (*p != NIL)
        p = &S->st[*p].hnext;
    S->st[i].hnext = NIL;
    S->st[i].held = 1;
    *p = i;
    return 0;
}

static int decide(sim_t *S, uint32_t i, double now, pcr_decision_t *d)
{
    const off_req_t *r = &S->w->reqs[i];
    if (S->v->haproxy) {
        for (size_t b = 0; b < S->s->npods; b++)
            S->ring_load[b] = S->loads[b].inflight;
        memset(d, 0, sizeof(*d));
        d->backend = pcr_ring_lookup(S->ring, r->head_hash, S->ring_load, NULL, 1.25);
        d->reason = PCR_REASON_HASH;
        d->uncached_prefill = r->key.prompt_tokens;
        return d->backend >= 0 ? 0 : -1;
    }
    return pcr_policy_decide(S->policy, &r->key, S->loads, (uint64_t)now, d);
}

static int on_arrive(sim_t *S, uint32_t i, double now)
{
    const off_req_t *r = &S->w->reqs[i];
    rstate_t *st = &S->st[i];
    if (r->bad) {
        S->out->errors++;
        S->finished++;
        return 0;
    }
    if (decide(S, i, now, &st->d) != 0 || st->d.backend < 0) {
        S->out->errors++;
        S->finished++;
        return 0;
    }
    size_t b = (size_t)st->d.backend;
    S->out->reasons[st->d.reason]++;
    /* The oldest request committed here that has not reached its first token (the router's
     * pcr_backend_settled_before), read before this one joins them. */
    opod_t *pod = &S->pods[b];
    while (pod->pend_head != NIL && S->st[pod->pend_head].settled)
        pod->pend_head = S->st[pod->pend_head].pnext;
    if (pod->pend_head == NIL)
        pod->pend_tail = NIL;
    st->settled_before = pod->pend_head != NIL
                             ? (uint64_t)S->w->reqs[pod->pend_head].arrival_us : UINT64_MAX;
    st->pnext = NIL;
    if (pod->pend_tail != NIL)
        S->st[pod->pend_tail].pnext = i;
    else
        pod->pend_head = i;
    pod->pend_tail = i;
    if (!S->v->haproxy)
        pcr_policy_commit(S->policy, st->d.backend, &r->key, (uint64_t)now, &st->added_from);
    double pred =
        (double)st->d.matched_blocks * (double)S->v->opts.block_bytes / PCR_BYTES_PER_TOKEN;
    if (pred > (double)r->prompt_tokens)
        pred = (double)r->prompt_tokens;
    S->out->predicted_tokens += pred;
    st->pod = (int)b;
    st->charged = st->d.uncached_prefill;
    S->loads[b].inflight++;
    S->loads[b].queued_prefill += st->charged;
    return send_or_hold(S, b, i, now);
}

static int next_tokens(sim_t *S, uint32_t i, double now)
{
    const off_req_t *r = &S->w->reqs[i];
    rstate_t *st = &S->st[i];
    opod_t *pod = &S->pods[st->pod];
    size_t k = r->max_tokens - st->sent < CHUNK ? r->max_tokens - st->sent : CHUNK;
    st->sent += k;
    return push(&S->h, now + (double)k * sim_model_itl_us(&pod->m, pod->running, 1.0),
                EV_TOKENS, i);
}

/* Request i's prefill leaves its pod's queue and budget, and held requests may go. */
static int settle(sim_t *S, uint32_t i, double now)
{
    rstate_t *st = &S->st[i];
    size_t b = (size_t)st->pod;
    st->settled = 1;
    S->loads[b].queued_prefill -= st->charged;
    S->pods[b].sent_prefill -= st->charged;
    st->charged = 0;
    return release(S, b, now);
}

/* The router sees request i's first token (its first byte, `late` after the pod sent it): it
 * settles, and the time teaches the policy the pod's rate. */
static int on_seen(sim_t *S, uint32_t i, double now)
{
    rstate_t *st = &S->st[i];
    if (settle(S, i, now) != 0)
        return -1;
    if (S->v->observe && S->policy) {
        /* As router/http/exchange.c: a request's time counts from its send, behind what the pod
         * had been sent then; the time it waited at the router is not the pod's. */
        pcr_policy_observe(S->policy, st->d.backend, st->d.uncached_prefill, st->ahead_at_send,
                           (uint64_t)(now - st->sent_us));
    }
    return 0;
}

/* Request i's first token, at `now`: its TTFT, and what the router sees of it. */
static int first_token(sim_t *S, uint32_t i, double now)
{
    rstate_t *st = &S->st[i];
    const off_req_t *r = &S->w->reqs[i];
    st->first_us = now;
    if (st->unstreamed) {
        /* Nothing reaches the router before the whole answer; how good its estimate was. */
        if (st->due_us > 0) {
            S->out->due_n++;
            S->out->due_err_us += st->due_us - now;
            S->out->due_abs_err_us += fabs(st->due_us - now);
        }
    } else {
        S->ttft[S->nttft++] = (now - r->arrival_us) / 1000.0;
        /* How late the router sees it: its release of held requests waits as long as that. */
        st->late = S->s->jitter_us > 0 ? S->s->jitter_us * (double)(next_random(&S->rng) >> 11) /
                                             9007199254740992.0
                                       : 0;
        if (st->late > 0) {
            if (push(&S->h, now + st->late, EV_SEEN, i) != 0)
                return -1;
        } else if (on_seen(S, i, now) != 0) {
            return -1;
        }
    }
    return 0;
}

static int on_first(sim_t *S, uint32_t i, double now)
{
    rstate_t *st = &S->st[i];
    const off_req_t *r = &S->w->reqs[i];
    st->sent = 1;
    if (first_token(S, i, now) != 0)
        return -1;
    if (st->sent >= r->max_tokens)
        return push(&S->h, now, EV_TOKENS, i);
    return next_tokens(S, i, now);
}

/* One line of --requests for request i, finished at `now`, as pcrouter's access log has it.
 * -1 when out of memory. */
static int write_request(sim_t *S, uint32_t i, double now)
{
    const off_req_t *r = &S->w->reqs[i];
    const rstate_t *st = &S->st[i];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "label", S->v->label);
    cJSON_AddNumberToObject(j, "row", i);
    cJSON_AddNumberToObject(j, "pod", st->pod);
    cJSON_AddStringToObject(j, "route", pcr_reason_name(st->d.reason));
    cJSON_AddNumberToObject(j, "matched_blocks", st->d.matched_blocks);
    cJSON_AddNumberToObject(j, "total_blocks", (double)r->key.nblocks);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)r->prompt_tokens);
    cJSON_AddNumberToObject(j, "uncached_prefill", (double)st->d.uncached_prefill);
    cJSON_AddNumberToObject(j, "cached_tokens", (double)st->hit_tokens);
    cJSON_AddNumberToObject(j, "held_ms", (st->sent_us - r->arrival_us) / 1000.0);
    cJSON_AddNumberToObject(j, "prefill_ahead_tokens", (double)st->ahead_at_send);
    cJSON_AddNumberToObject(j, "ttft_ms", (st->first_us - r->arrival_us) / 1000.0);
    cJSON_AddNumberToObject(j, "e2e_ms", (now - r->arrival_us) / 1000.0);
    cJSON_AddBoolToObject(j, "stream", !st->unstreamed);
    char *line = cJSON_PrintUnformatted(j);
    if (line != NULL)   /* a failed write shows at the file's close (ferror) */
        fprintf(S->s->requests, "%s\n", line);
    int rc = line != NULL ? 0 : -1;
    cJSON_free(line);
    cJSON_Delete(j);
    return rc;
}

/* Request i's last token, at `now`: the router's account of it, its feedback, its figures. */
static int finish(sim_t *S, uint32_t i, double now)
{
    const off_req_t *r = &S->w->reqs[i];
    rstate_t *st = &S->st[i];
    size_t b = (size_t)st->pod;
    opod_t *pod = &S->pods[b];
    pod->success++;
    S->loads[b].inflight--;
    S->out->completed++;
    S->out->completed_streams += !st->unstreamed;
    S->finished++;
    /* A whole answer before its expected first token: the router settles it now. */
    if (st->unstreamed && !st->settled && settle(S, i, now) != 0)
        return -1;
    double pred =
        (double)st->d.matched_blocks * (double)S->v->opts.block_bytes / PCR_BYTES_PER_TOKEN;
    if (pred > (double)r->prompt_tokens)
        pred = (double)r->prompt_tokens;
    /* The index sees only the first max_prefix_bytes of a prompt: compare within them. */
    double seen =
        (double)r->key.nblocks * (double)S->v->opts.block_bytes / PCR_BYTES_PER_TOKEN;
    seen = (double)st->hit_tokens < seen ? (double)st->hit_tokens : seen;
    S->out->seen_delivered_tokens += seen;
    S->out->abs_error_tokens += fabs(pred - seen);
    /* A held request may have gone ahead of the one that was to bring its prefix to the pod:
     * the pod's account of it says nothing of what the pod evicted. */
    if (S->v->feedback && S->policy && !st->held)
        pcr_policy_feedback(S->policy, &r->key, &st->d, st->hit_tokens, st->settled_before);
    if (S->s->requests != NULL && write_request(S, i, now) != 0)
        return -1;
    if (S->s->far_pods > 0) {
        double bytes = 4.0 * (double)r->prompt_tokens + SSE_EVENT_BYTES * (double)r->max_tokens;
        S->out->bytes_all += bytes;
        if (far_pod(S, b)) {
            S->out->cross_zone_requests++;
            S->out->bytes_cross += bytes;
        }
    }
    if (now / 1e6 > S->out->makespan_s)
        S->out->makespan_s = now / 1e6;
    if (S->s->step) {
        S->e2e[S->ndone] = (now - r->arrival_us) / 1000.0;
        S->outtok[S->ndone++] = (double)r->max_tokens;
        if (!st->unstreamed && r->max_tokens > 1)
            S->tpot[S->ntpot++] = (now - st->first_us) / 1000.0 / (double)(r->max_tokens - 1);
    }
    return 0;
}

static int on_tokens(sim_t *S, uint32_t i, double now)
{
    const off_req_t *r = &S->w->reqs[i];
    rstate_t *st = &S->st[i];
    if (st->sent < r->max_tokens)
        return next_tokens(S, i, now);
    size_t b = (size_t)st->pod;
    opod_t *pod = &S->pods[b];
    pcr_kvcache_release(pod->kv, r->kv, r->nkv, r->private_blocks);
    pod->running--;
    if (finish(S, i, now) != 0)
        return -1;
    return admit_waiting(S, b, now);
}

/* --engine step: a token of request i, at the end of its pod's step. */
static void on_emit(void *arg, sim_step_seq_t *q)
{
    sim_t *S = arg;
    uint32_t i = (uint32_t)((rstate_t *)q->owner - S->st);
    const off_req_t *r = &S->w->reqs[i];
    rstate_t *st = &S->st[i];
    double now = S->step_now;
    if (S->step_err)
        return;
    if (q->generated == 1) {
        opod_t *pod = &S->pods[st->pod];
        st->hit_tokens = q->hit_tokens;
        S->out->delivered_tokens += (double)q->hit_tokens;
        S->out->prompt_tokens += (double)r->prompt_tokens;
        if (r->prompt_tokens > q->hit_tokens)
            pod->prefilled += (double)(r->prompt_tokens - q->hit_tokens);
        if (first_token(S, i, now) != 0)
            S->step_err = 1;
    } else if (!st->unstreamed) {
        if (S->nitl == S->citl) {
            size_t nc = S->citl ? S->citl * 2 : 65536;
            double *nv = realloc(S->itl, nc * sizeof(*nv));
            if (!nv) {
                S->step_err = 1;
                return;
            }
            S->itl = nv;
            S->citl = nc;
        }
        S->itl[S->nitl++] = (now - st->last_tok_us) / 1000.0;
    }
    st->last_tok_us = now;
    if (q->state == SIM_SEQ_FINISHED && !S->step_err && finish(S, i, now) != 0)
        S->step_err = 1;
}

/* --engine step: pod b's step ends at `now`; its tokens go out, the next step is composed. */
static int on_step(sim_t *S, size_t b, double now)
{
    S->step_now = now;
    sim_step_end(&S->pods[b].eng, on_emit, S);
    if (S->step_err)
        return -1;
    return kick(S, b, now);
}

/* --zones: request i reaches its pod in the other zone. */
static int on_reach(sim_t *S, uint32_t i, double now)
{
    size_t b = (size_t)S->st[i].pod;
    enqueue(S, b, i);
    return admit_waiting(S, b, now);
}

static int on_scrape(sim_t *S, double now)
{
    for (size_t b = 0; b < S->s->npods; b++)
        S->loads[b].pod_waiting = S->s->step ? S->pods[b].eng.waiting.n : S->pods[b].nwait;
    if (S->finished < S->w->n)
        return push(&S->h, now + S->s->scrape_us, EV_SCRAPE, 0);
    return 0;
}

/* p50, p90, p99 and mean of v[0..n) (sorted here), NAN when empty. */
static void stats(double *v, size_t n, double out[4])
{
    double sum = 0;
    rt_sort(v, n);
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    out[0] = rt_percentile(v, n, 50);
    out[1] = rt_percentile(v, n, 90);
    out[2] = rt_percentile(v, n, 99);
    out[3] = n ? sum / (double)n : NAN;
}

/* ---- one run ----------------------------------------------------------------------------- */

static int setup(sim_t *S)
{
    size_t n = S->s->npods;
    char names[n][80];
    const char *np[n];
    pcr_backend_desc_t descs[n];
    for (size_t b = 0; b < n; b++) {
        snprintf(names[b], sizeof names[b], "%s%zu", S->s->names, b);
        np[b] = names[b];
        /* As the router converts capacity_tokens (router/upstream/backend.c). */
        double tokens = (double)S->s->capacity_tokens * S->v->index_capacity;
        uint64_t blocks = (uint64_t)(tokens * PCR_BYTES_PER_TOKEN / (double)S->v->opts.block_bytes);
        const char *zone = S->s->far_pods == 0 ? "" : far_pod(S, b) ? "b" : "a";
        descs[b] = (pcr_backend_desc_t){names[b], zone, 1, blocks ? blocks : 1};
    }
    S->pods = calloc(n, sizeof(*S->pods));
    S->loads = calloc(n, sizeof(*S->loads));
    S->ring_load = calloc(n, sizeof(*S->ring_load));
    S->st = calloc(S->w->n ? S->w->n : 1, sizeof(*S->st));
    S->ttft = malloc((S->w->n ? S->w->n : 1) * sizeof(*S->ttft));
    if (!S->pods || !S->loads || !S->ring_load || !S->st || !S->ttft)
        return -1;
    if (S->s->step) {
        size_t m = S->w->n ? S->w->n : 1;
        S->tpot = malloc(m * sizeof(double));
        S->e2e = malloc(m * sizeof(double));
        S->outtok = malloc(m * sizeof(double));
        if (!S->tpot || !S->e2e || !S->outtok)
            return -1;
    }
    for (size_t b = 0; b < n; b++) {
        S->pods[b].kv = pcr_kvcache_new((size_t)(S->s->capacity_tokens / PCR_KV_BLOCK_TOKENS));
        if (!S->pods[b].kv)
            return -1;
        S->pods[b].wait_head = S->pods[b].wait_tail = NIL;
        S->pods[b].hold_head = NIL;
        S->pods[b].pend_head = S->pods[b].pend_tail = NIL;
        S->pods[b].m = S->s->m;
        if (S->s->slowdown) {
            double f = S->s->slowdown[b];
            S->pods[b].m.prefill_us_per_token *= f;
            S->pods[b].m.itl_ms *= f;
            S->pods[b].m.itl_per_seq_us *= f;
        }
        if (S->s->step) {
            sim_step_conf_t c = S->s->sc;
            double f = S->s->slowdown ? S->s->slowdown[b] : 1;
            c.base_us *= f;
            c.prefill_us_per_token *= f;
            c.decode_us_per_seq *= f;
            c.ctx_us_per_token *= f;
            if (sim_step_init(&S->pods[b].eng, &c, S->pods[b].kv) != 0)
                return -1;
            S->pods[b].eng_ready = 1;
        }
        S->loads[b].usable = 1;
    }
    if (S->v->haproxy) {
        S->ring = pcr_ring_new(np, NULL, n, 160);
        return S->ring ? 0 : -1;
    }
    pcr_policy_opts_t opts = S->v->opts;
    if (S->s->far_pods > 0 && S->v->zone_aware)
        opts.zone = "a";   /* the router's own */
    S->policy = pcr_policy_new(&opts, descs, n);
    if (!S->policy) {
        fprintf(stderr, "routing_offline: %s: invalid routing options\n", S->v->label);
        return -1;
    }
    return 0;
}

static void teardown(sim_t *S)
{
    for (size_t b = 0; S->pods && b < S->s->npods; b++) {
        if (S->pods[b].eng_ready)
            sim_step_dispose(&S->pods[b].eng);
        pcr_kvcache_free(S->pods[b].kv);
    }
    free(S->itl);
    free(S->tpot);
    free(S->e2e);
    free(S->outtok);
    free(S->pods);
    free(S->loads);
    free(S->ring_load);
    free(S->st);
    free(S->ttft);
    free(S->h.v);
    pcr_ring_free(S->ring);
    pcr_policy_free(S->policy);
}

int off_run(const off_work_t *w, const off_setup_t *s, const off_variant_t *v,
            off_result_t *out)
{
    sim_t S = {.w = w, .s = s, .v = v, .out = out, .rng = 1};
    int rc = -1;
    memset(out, 0, sizeof(*out));
    if (setup(&S) != 0)
        goto done;
    for (uint32_t i = 0; i < w->n; i++) {
        S.st[i].unstreamed = rt_unstreamed(i, s->unstreamed);
        if (push(&S.h, w->reqs[i].arrival_us, EV_ARRIVE, i) != 0)
            goto done;
    }
    if (w->n && push(&S.h, w->reqs[0].arrival_us, EV_SCRAPE, 0) != 0)
        goto done;
    while (S.h.n > 0) {
        ev_t e = pop(&S.h);
        int r = 0;
        switch (e.type) {
        case EV_ARRIVE: r = on_arrive(&S, e.req, e.t); break;
        case EV_FIRST: r = on_first(&S, e.req, e.t); break;
        case EV_SEEN: r = on_seen(&S, e.req, e.t); break;
        case EV_TOKENS: r = on_tokens(&S, e.req, e.t); break;
        case EV_SCRAPE: r = on_scrape(&S, e.t); break;
        case EV_DUE: r = S.st[e.req].settled ? 0 : settle(&S, e.req, e.t); break;
        case EV_STEP: r = on_step(&S, e.req, e.t); break;
        case EV_REACH: r = on_reach(&S, e.req, e.t); break;
        }
        if (r != 0)
            goto done;
    }
    rt_sort(S.ttft, S.nttft);
    double sum = 0, smax = 0, ssum = 0, wmax = 0, wsum = 0;
    for (size_t i = 0; i < S.nttft; i++)
        sum += S.ttft[i];
    out->ttft_p50_ms = rt_percentile(S.ttft, S.nttft, 50);
    out->ttft_p90_ms = rt_percentile(S.ttft, S.nttft, 90);
    out->ttft_p99_ms = rt_percentile(S.ttft, S.nttft, 99);
    out->ttft_mean_ms = S.nttft ? sum / (double)S.nttft : NAN;
    for (size_t b = 0; b < s->npods; b++) {
        ssum += (double)S.pods[b].success;
        if ((double)S.pods[b].success > smax)
            smax = (double)S.pods[b].success;
        wsum += S.pods[b].prefilled;
        if (S.pods[b].prefilled > wmax)
            wmax = S.pods[b].prefilled;
    }
    out->share = ssum > 0 ? smax / (ssum / (double)s->npods) : NAN;
    out->work_share = wsum > 0 ? wmax / (wsum / (double)s->npods) : NAN;
    out->hit_rate = out->prompt_tokens > 0 ? out->delivered_tokens / out->prompt_tokens : NAN;
    if (s->step) {
        stats(S.itl, S.nitl, out->itl_ms);
        stats(S.tpot, S.ntpot, out->tpot_ms);
        stats(S.e2e, S.ndone, out->e2e_ms);
        for (size_t i = 0; i < S.ndone; i++)
            out->output_tokens_total += S.outtok[i];
        stats(S.outtok, S.ndone, out->output_tokens);
        double span = out->makespan_s;
        out->output_tokens_per_s = span > 0 ? out->output_tokens_total / span : NAN;
        out->requests_per_s = span > 0 ? (double)out->completed / span : NAN;
        for (size_t b = 0; b < s->npods; b++) {
            out->steps += S.pods[b].eng.steps;
            out->preemptions += S.pods[b].eng.preemptions;
        }
    }
    rc = 0;
done:
    if (rc != 0)
        fprintf(stderr, "routing_offline: %s: out of memory\n", v->label);
    teardown(&S);
    return rc;
}
