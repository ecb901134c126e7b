/* bench/sim/sim_engine.c: one pod's scheduler and latency model.
 *
 * Admission: requests wait in FIFO order; the head is admitted while fewer than max_num_seqs
 * run and the KV cache can pin its prompt blocks and reserve its private blocks (partial last
 * block + output), as vLLM's scheduler does. The hit (leading cached blocks) is counted at
 * admission, in tokens, as vLLM counts prefix_cache_queries/hits.
 *
 * Latency (model time, divided by time_scale for the wall clock; sim_model.c):
 *   prefill runs one request at a time on the pod's one GPU, in admission order, at
 *     prefill_us_per_token * (1 + prefill_batch_slowdown * running) per uncached token
 *     (the decode batch shares the GPU with chunked prefill, so a busy pod prefills slower);
 *   first token = end of own prefill + overhead_ms;
 *   each next token after itl_ms + itl_per_seq_us * running (a bigger batch steps slower).
 * So TTFT = waiting for a slot + queueing behind other prefills + overhead + own prefill.
 *
 * Emission: one timer per running request; when it fires, every token already due is sent in
 * one SSE event (one write), and the next firing is at least tick_us later, so a time-scaled
 * pod stays cheap however fast its virtual clock runs.
 *
 * With --rtt-ms a request reaches the engine one round trip late: its way in and its answer's
 * way out, taken together before the first byte. Every later write is then that much later
 * than from a pod in the router's zone, and the gaps between them are the same.
 *
 * Priority scheduling (--scheduling-policy priority): the waiting queue is kept in order of
 * priority (lower first), then arrival; and a request that arrives preempts every admitted
 * request of a strictly worse priority whose prefill has not ended (the one prefilling now
 * and those queued behind it, which by this rule are all worse than what goes before them):
 * they give back their slots and blocks, the full blocks their prefill had computed stay
 * cached (as in vLLM, whose prefix cache keeps a preempted request's computed blocks, so it
 * resumes where it was) while the blocks not yet computed leave the cache, and they wait again
 * in their order. The prefill queue
 * then ends where the last one kept ends, so the new request prefills next. What a request
 * already decoding holds is never taken.
 *
 * With --engine step the pod runs step_engine.c instead: one timer per pod fires at the end of
 * each engine step (its model time over time_scale after the step before ended, so a late
 * timer is caught up), every sequence that sampled a token writes it (one SSE event per token
 * and step), and the next step is composed at once; an idle pod's first request starts one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "sim.h"
#include "sim_kvev.h"

static uint64_t rng_state = 1;

void sim_rand_seed(uint64_t seed) { rng_state = seed ? seed : 1; }

double sim_rand(void)
{
    /* xorshift64*: enough for fault injection, reproducible from --seed. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

double sim_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void list_push(sim_list_t *l, sim_req_t *r)
{
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail) l->tail->next = r; else l->head = r;
    l->tail = r;
    l->n++;
}

/* Priority scheduling: r goes after every waiting request of the same or a better priority. */
static void list_insert_ordered(sim_list_t *l, sim_req_t *r)
{
    sim_req_t *at = l->tail;
    while (at && (r->priority != at->priority ? r->priority < at->priority : r->seq < at->seq))
        at = at->prev;
    r->prev = at;
    r->next = at ? at->next : l->head;
    if (r->next) r->next->prev = r; else l->tail = r;
    if (at) at->next = r; else l->head = r;
    l->n++;
}

static void list_remove(sim_list_t *l, sim_req_t *r)
{
    if (r->prev) r->prev->next = r->next; else l->head = r->next;
    if (r->next) r->next->prev = r->prev; else l->tail = r->prev;
    r->prev = r->next = NULL;
    l->n--;
}

static void on_token_timer(evutil_socket_t fd, short what, void *arg);
static void capacity_go(void);
static sim_pod_t *cap_pods;   /* --capacity-schedule: pods waiting for the first request */

static void arm(sim_req_t *r, double at_us, double now_us)
{
    double min_at = now_us + r->pod->conf->tick_us;
    if (at_us < min_at && r->sent > 0)
        at_us = min_at;
    double d = at_us - now_us;
    if (d < 0)
        d = 0;
    struct timeval tv = { (time_t)(d / 1e6), (suseconds_t)fmod(d, 1e6) };
    evtimer_add(r->timer, &tv);
}

static double itl_us(const sim_pod_t *pod)
{
    return sim_model_itl_us(&pod->conf->m, pod->running.n, pod->conf->time_scale);
}

static void record_ttft(sim_pod_t *pod, double seconds)
{
    int i = 0;
    while (i < SIM_TTFT_BUCKETS && seconds > sim_ttft_bounds[i])
        i++;
    pod->ttft_buckets[i]++;
    pod->ttft_sum += seconds;
    pod->ttft_count++;
}

static void schedule(sim_pod_t *pod)
{
    const sim_conf_t *c = pod->conf;
    while (pod->waiting.head && pod->running.n < c->m.max_num_seqs) {
        sim_req_t *r = pod->waiting.head;
        sim_admit_t a;
        double now = sim_now_us();
        double start = pod->prefill_busy_until_us > now ? pod->prefill_busy_until_us : now;
        if (sim_model_admit(&c->m, pod->kv, r->hashes, r->nblocks, r->private_blocks,
                            r->prompt_tokens, pod->running.n, now, c->time_scale,
                            &pod->prefill_busy_until_us, &a) != 0)
            break;   /* FIFO: the head waits for finished requests to free blocks */
        list_remove(&pod->waiting, r);
        r->hit_blocks = a.hit_tokens / PCR_KV_BLOCK_TOKENS;
        r->prefill_start_us = start;
        r->prefill_end_us = pod->prefill_busy_until_us;
        if (!r->admitted) {   /* as vLLM, a request's hit is the one of its first admission */
            r->admitted = 1;
            r->hit_tokens = a.hit_tokens;
            pod->prefix_queries += r->prompt_tokens;
            pod->prefix_hits += r->hit_tokens;
            pod->prompt_tokens += r->prompt_tokens;
        }
        r->first_token_us = a.first_token_us;
        r->next_token_us = r->first_token_us;
        r->state = SIM_REQ_RUNNING;
        list_push(&pod->running, r);
        arm(r, r->next_token_us, now);
    }
}

/* --engine step: composes the pod's next step, ending `from_us` plus its time; nothing when
 * a step is under way or nothing can run. */
static void step_next(sim_pod_t *pod, double from_us)
{
    if (pod->eng.in_step)
        return;
    double d = sim_step_begin(&pod->eng);
    if (d <= 0)
        return;
    double now = sim_now_us();
    pod->step_due_us = from_us + d / pod->conf->time_scale;
    double wait = pod->step_due_us - now;
    if (wait < 0)
        wait = 0;
    struct timeval tv = { (time_t)(wait / 1e6), (suseconds_t)fmod(wait, 1e6) };
    evtimer_add(pod->step_timer, &tv);
}

static void step_kick(sim_pod_t *pod)
{
    step_next(pod, sim_now_us());
}

/* Priority scheduling: r arrives; admitted requests of a worse priority whose prefill has not
 * ended go back to waiting, keeping the full blocks they computed (the header says why this is
 * the whole rule). */
static void preempt_worse(sim_pod_t *pod, const sim_req_t *r)
{
    double now = sim_now_us(), busy = now;
    for (sim_req_t *q = pod->running.head, *next; q; q = next) {
        next = q->next;
        if (q->prefill_end_us <= now)
            continue;
        if (q->priority <= r->priority) {
            if (q->prefill_end_us > busy)
                busy = q->prefill_end_us;
            continue;
        }
        evtimer_del(q->timer);
        list_remove(&pod->running, q);
        /* The full blocks its prefill computed so far stay cached (its progress is kept, as
         * vLLM keeps a preempted request's computed blocks in its prefix cache); the rest
         * leave. Prefill runs at an even rate from its start to its end. */
        size_t done = q->hit_blocks;
        if (now > q->prefill_start_us && q->prefill_end_us > q->prefill_start_us) {
            double f = (now - q->prefill_start_us) / (q->prefill_end_us - q->prefill_start_us);
            size_t hit = q->hit_blocks * PCR_KV_BLOCK_TOKENS;
            size_t tokens = hit + (size_t)(f * (double)(q->prompt_tokens - hit));
            done = tokens / PCR_KV_BLOCK_TOKENS;
            if (done > q->nblocks)
                done = q->nblocks;
        }
        pcr_kvcache_release_uncomputed(pod->kv, q->hashes, q->nblocks, done, q->private_blocks);
        q->state = SIM_REQ_WAITING;
        list_insert_ordered(&pod->waiting, q);
        pod->preemptions++;
    }
    pod->prefill_busy_until_us = busy;
}

static void on_rtt(evutil_socket_t fd, short what, void *arg)
{
    sim_engine_submit(arg);   /* rtt_timer is set: this time it goes in */
}

void sim_engine_submit(sim_req_t *r)
{
    sim_pod_t *pod = r->pod;
    if (cap_pods)
        capacity_go();
    /* A round trip to another zone, and a decode leg's transfer of the blocks it pulls. */
    if (pod->conf->rtt_us + r->pull_us > 0 && !r->rtt_timer) {
        r->rtt_timer = evtimer_new(pod->base, on_rtt, r);
        if (r->rtt_timer) {
            double d = (pod->conf->rtt_us + r->pull_us) / pod->conf->time_scale;
            struct timeval tv = { (time_t)(d / 1e6), (suseconds_t)fmod(d, 1e6) };
            r->state = SIM_REQ_IN_FLIGHT;
            evtimer_add(r->rtt_timer, &tv);
            return;
        }   /* out of memory: no delay rather than no answer */
    }
    sim_pd_pulled(r);
    r->arrival_us = sim_now_us();
    r->timer = pod->conf->step ? NULL : evtimer_new(pod->base, on_token_timer, r);
    if (!r->timer && !pod->conf->step) {
        sim_conn_t *c = r->conn;
        c->req = NULL;
        sim_req_free(r);
        sim_conn_error(c, 500, "InternalServerError", "out of memory");
        return;
    }
    if (pod->conf->drop_rate > 0 && sim_rand() < pod->conf->drop_rate)
        r->drop_at = 1 + (size_t)(sim_rand() * (double)r->max_tokens);
    if (r->stream)
        sim_conn_start_stream(r->conn);
    r->state = SIM_REQ_WAITING;
    if (pod->conf->step) {
        r->step = (sim_step_seq_t){.hashes = r->hashes, .nblocks = r->nblocks,
                                  .prompt_tokens = r->prompt_tokens,
                                  .max_tokens = r->max_tokens, .priority = r->priority,
                                  .owner = r};
        sim_step_add(&pod->eng, &r->step);
        step_kick(pod);
        return;
    }
    if (pod->conf->sc.priority) {
        preempt_worse(pod, r);
        list_insert_ordered(&pod->waiting, r);
    } else {
        list_push(&pod->waiting, r);
    }
    schedule(pod);
}

/* Takes r off its list, gives back its blocks and frees it; then admits whoever can go. */
static void retire(sim_req_t *r)
{
    sim_pod_t *pod = r->pod;
    if (pod->conf->step) {
        sim_step_abort(&pod->eng, &r->step);   /* a finished sequence is already out */
        sim_req_free(r);
        step_kick(pod);
        return;
    }
    if (r->state == SIM_REQ_RUNNING) {
        list_remove(&pod->running, r);
        pcr_kvcache_release(pod->kv, r->hashes, r->nblocks, r->private_blocks);
    } else {
        list_remove(&pod->waiting, r);
    }
    sim_req_free(r);
    schedule(pod);
}

void sim_engine_cancel(sim_req_t *r)
{
    r->pod->cancelled++;
    if (r->state == SIM_REQ_IN_FLIGHT) {   /* not in the engine yet */
        sim_req_free(r);
        return;
    }
    retire(r);
}

static int deliver(sim_req_t *r, size_t first, int done);

static void on_token_timer(evutil_socket_t fd, short what, void *arg)
{
    sim_req_t *r = arg;
    sim_pod_t *pod = r->pod;
    double now = sim_now_us();
    size_t first = r->sent;
    while (r->sent < r->max_tokens && r->next_token_us <= now) {
        if (r->sent == 0)
            record_ttft(pod, (r->first_token_us - r->arrival_us) * pod->conf->time_scale / 1e6);
        r->sent++;
        r->next_token_us += itl_us(pod);
    }
    if (deliver(r, first, r->sent == r->max_tokens))
        arm(r, r->next_token_us, now);
}

/* Sends r's tokens from `first` to r->sent: one SSE event, or the whole answer's text; closes
 * the connection mid-stream where --drop-rate says so; answers and frees r when `done`.
 * Returns whether r goes on (not done, not dropped). */
static int deliver(sim_req_t *r, size_t first, int done)
{
    sim_pod_t *pod = r->pod;
    sim_conn_t *c = r->conn;
    size_t n = r->sent - first;
    pod->generation_tokens += n;
    if (r->drop_at && r->sent >= r->drop_at && !done) {
        /* Close mid-stream: detach first so the close path does not free r under us. */
        pod->dropped++;
        c->req = NULL;
        r->conn = NULL;
        retire(r);
        sim_conn_close(c);
        return 0;
    }
    if (r->stream) {
        if (n > 0) {
            struct evbuffer *ev = evbuffer_new();
            if (ev) {
                sim_api_stream_event(r, first, n, done, ev);
                sim_conn_chunk(c, ev);
                evbuffer_free(ev);
            }
        }
    } else {
        for (size_t i = first; i < r->sent; i++)
            sim_api_token_text(i, r->text);
    }
    if (!done)
        return 1;
    pod->success++;
    c->req = NULL;
    r->conn = NULL;
    if (r->stream) {
        retire(r);
        sim_conn_end(c);
    } else {
        struct evbuffer *body = evbuffer_new();
        sim_api_full_response(r, body);
        size_t len = evbuffer_get_length(body);
        retire(r);
        sim_conn_respond(c, 200, "application/json", (char *)evbuffer_pullup(body, -1), len);
        evbuffer_free(body);
    }
    return 0;
}

/* --engine step: sequence q sampled a token at the end of its pod's step; it goes out now. */
static void on_step_token(void *arg, sim_step_seq_t *q)
{
    sim_req_t *r = q->owner;
    sim_pod_t *pod = r->pod;
    size_t first = r->sent;
    if (first == 0) {   /* its hit is known from its admission, counted as vLLM counts it */
        r->hit_tokens = q->hit_tokens;
        pod->prefix_queries += r->prompt_tokens;
        pod->prefix_hits += r->hit_tokens;
        pod->prompt_tokens += r->prompt_tokens;
        record_ttft(pod, (sim_now_us() - r->arrival_us) * pod->conf->time_scale / 1e6);
    }
    r->sent = q->generated;
    deliver(r, first, q->state == SIM_SEQ_FINISHED);
}

void sim_engine_on_step(evutil_socket_t fd, short what, void *arg)
{
    sim_pod_t *pod = arg;
    sim_step_end(&pod->eng, on_step_token, pod);
    double now = sim_now_us();
    /* More than 100 ms of wall clock late (a stall of this machine): the next step starts
     * now, rather than steps running back to back to catch up. */
    double from = pod->step_due_us;
    if (now - from > 1e5)
        from = now;
    step_next(pod, from);
}

const unsigned char *sim_engine_block_bytes(const sim_pod_t *pod, const uint64_t *hashes)
{
    if (pod->foreign_hashes && hashes == pod->foreign_hashes)
        return pod->foreign_bytes;
    /* Both engines admit the head of their waiting queue, and take it off after the cache
     * has pinned its blocks. */
    const sim_req_t *r = pod->conf->step
                             ? (pod->eng.waiting.head ? pod->eng.waiting.head->owner : NULL)
                             : pod->waiting.head;
    return r && r->hashes == hashes ? r->prompt : NULL;
}

/* --foreign-load: requests the router never sent (another router's, a batch job's), with
 * prompts of random letters. Each one goes through the cache as an instant request: its
 * blocks are named and pinned (evicting what the LRU order says), then released, so they sit
 * in the cache as the most recent. They take no GPU time and no slot: they only move the
 * pod's cache where the router cannot see it. One that does not fit is refused and counted. */
static uint64_t foreign_next(sim_pod_t *pod)
{
    uint64_t x = pod->foreign_rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    pod->foreign_rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static void foreign_one(sim_pod_t *pod)
{
    size_t len = pod->conf->foreign_tokens * PCR_KV_TOKEN_BYTES;
    for (size_t i = 0; i < len; i += 8) {
        uint64_t x = foreign_next(pod);
        for (size_t j = 0; j < 8 && i + j < len; j++, x >>= 8)
            pod->foreign_bytes[i + j] = (unsigned char)('a' + (x & 0xff) % 26);
    }
    size_t n = len / PCR_KV_BLOCK_BYTES, hit;
    pcr_kvcache_hash_prompt(pod->foreign_bytes, len, 0, pod->foreign_buf, n);
    pod->foreign_hashes = pod->foreign_buf;
    if (pcr_kvcache_acquire(pod->kv, pod->foreign_buf, n, 0, &hit) == 0)
        pcr_kvcache_release(pod->kv, pod->foreign_buf, n, 0);
    else
        pod->foreign_refused++;
    pod->foreign_hashes = NULL;
    pod->foreign++;
}

static void on_foreign(evutil_socket_t fd, short what, void *arg)
{
    sim_pod_t *pod = arg;
    const sim_conf_t *c = pod->conf;
    double now = sim_now_us();
    /* Poisson arrivals at foreign_rate per second of model time; a few hundred at most per
     * turn, and a machine stalled for over a second skips what it missed. */
    for (int k = 0; k < 256 && pod->foreign_due_us <= now; k++) {
        foreign_one(pod);
        double u = (double)(foreign_next(pod) >> 11) / 9007199254740992.0;
        pod->foreign_due_us += -log(1 - u) / (c->foreign_rate * c->time_scale) * 1e6;
    }
    if (pod->foreign_due_us < now - 1e6)
        pod->foreign_due_us = now;
    double d = pod->foreign_due_us > now ? pod->foreign_due_us - now : 0;
    struct timeval tv = { (time_t)(d / 1e6), (suseconds_t)fmod(d, 1e6) };
    evtimer_add(pod->foreign_timer, &tv);
}

int sim_engine_foreign_start(sim_pod_t *pod, uint64_t seed)
{
    size_t len = pod->conf->foreign_tokens * PCR_KV_TOKEN_BYTES;
    pod->foreign_rng = seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    pod->foreign_bytes = malloc(len);
    pod->foreign_buf = malloc((len / PCR_KV_BLOCK_BYTES + 1) * sizeof(uint64_t));
    pod->foreign_timer = evtimer_new(pod->base, on_foreign, pod);
    if (!pod->foreign_bytes || !pod->foreign_buf || !pod->foreign_timer)
        return -1;
    pod->foreign_due_us = sim_now_us();
    struct timeval tv = {0, 0};
    evtimer_add(pod->foreign_timer, &tv);
    return 0;
}

void sim_engine_foreign_stop(sim_pod_t *pod)
{
    if (pod->foreign_timer)
        event_free(pod->foreign_timer);
    pod->foreign_timer = NULL;
    free(pod->foreign_bytes);
    free(pod->foreign_buf);
    pod->foreign_bytes = NULL;
    pod->foreign_buf = NULL;
}

void sim_engine_restart(sim_pod_t *pod, sim_conn_t *keep)
{
    for (sim_conn_t *c = pod->conns, *next; c; c = next) {
        next = c->next;
        if (c != keep)
            sim_conn_close(c);   /* its request dies with the pod, its blocks unpinned */
    }
    sim_tok_cut(pod);
    pcr_kvcache_clear(pod->kv);
    pod->prefill_busy_until_us = 0;
    /* A new process: its counters start from zero, its start time is now. */
    pod->prefix_queries = pod->prefix_hits = pod->prompt_tokens = pod->generation_tokens = 0;
    pod->success = pod->failed_injected = pod->dropped = pod->stalled = 0;
    pod->cancelled = pod->rejected = pod->preemptions = 0;
    memset(pod->ttft_buckets, 0, sizeof pod->ttft_buckets);
    pod->ttft_sum = 0;
    pod->ttft_count = 0;
    pod->foreign = pod->foreign_refused = 0;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    pod->start_time = (double)tv.tv_sec + tv.tv_usec / 1e6;
    if (pod->kvev)
        sim_kvev_restart(pod->kvev);
}

/* --capacity-schedule: the pod's usable cache follows a cycle of phases (S seconds of model
 * time at fraction F of --capacity-tokens). Every pod's cycle starts with the first request
 * any pod of the process is sent, so a replay's ceiling (replay --capacity-schedule) can
 * follow the same phases from its first request. What is taken away is held as a reservation in
 * the cache, so taking it evicts unpinned blocks in LRU order (BlockRemoved, as any eviction)
 * and giving it back lets waiting requests in. Blocks pinned by running requests cannot be
 * taken: the pod takes what it can and tries again every 10 ms of wall clock until it holds
 * its target. Withheld blocks count as used in vllm:kv_cache_usage_perc, as memory something
 * else took would. */
static size_t cap_target(const sim_pod_t *pod)   /* blocks to withhold in this phase */
{
    size_t cap = pcr_kvcache_capacity(pod->kv);
    size_t keep = (size_t)(pod->conf->cap_sched[pod->cap_phase].fraction * (double)cap + 0.5);
    return cap - (keep < 1 ? 1 : keep);
}

static void cap_adjust(sim_pod_t *pod)
{
    const sim_conf_t *c = pod->conf;
    size_t cap = pcr_kvcache_capacity(pod->kv);
    size_t target = cap_target(pod);
    if (pod->withheld > target) {
        pcr_kvcache_release(pod->kv, NULL, 0, pod->withheld - target);
        pod->withheld = target;
        if (c->step) step_kick(pod); else schedule(pod);
    } else if (pod->withheld < target) {
        size_t used = pcr_kvcache_pinned(pod->kv) + pcr_kvcache_reserved(pod->kv);
        size_t room = cap > used ? cap - used : 0;
        size_t k = target - pod->withheld < room ? target - pod->withheld : room, hit;
        if (k > 0 && pcr_kvcache_acquire(pod->kv, NULL, 0, k, &hit) == 0)
            pod->withheld += k;
    }
}

static void on_capacity(evutil_socket_t fd, short what, void *arg)
{
    sim_pod_t *pod = arg;
    const sim_conf_t *c = pod->conf;
    double now = sim_now_us();
    for (int k = 0; now >= pod->cap_phase_end_us; k++) {
        if (k == 1000) {   /* far behind (a stalled machine): start the phase now */
            pod->cap_phase_end_us = now;
            k = 0;
        }
        pod->cap_phase = (pod->cap_phase + 1) % c->ncap_sched;
        pod->cap_phase_end_us += c->cap_sched[pod->cap_phase].seconds * 1e6 / c->time_scale;
    }
    cap_adjust(pod);
    double d = pod->cap_phase_end_us - now;
    if (pod->withheld != cap_target(pod) && d > 1e4)
        d = 1e4;   /* pinned blocks kept the target out of reach: try again soon */
    struct timeval tv = { (time_t)(d / 1e6), (suseconds_t)fmod(d, 1e6) };
    evtimer_add(pod->cap_timer, &tv);
}

int sim_engine_capacity_start(sim_pod_t *pod)
{
    pod->cap_timer = evtimer_new(pod->base, on_capacity, pod);
    if (!pod->cap_timer)
        return -1;
    pod->cap_next = cap_pods;
    cap_pods = pod;
    return 0;
}

/* The first request: phase 0 starts now on every pod (the first firing ends the phase
 * before it, which is the last). */
static void capacity_go(void)
{
    double now = sim_now_us();
    for (sim_pod_t *pod = cap_pods; pod; pod = pod->cap_next) {
        pod->cap_phase = pod->conf->ncap_sched - 1;
        pod->cap_phase_end_us = now;
        struct timeval tv = {0, 0};
        evtimer_add(pod->cap_timer, &tv);
    }
    cap_pods = NULL;
}

void sim_engine_capacity_stop(sim_pod_t *pod)
{
    for (sim_pod_t **pp = &cap_pods; *pp; pp = &(*pp)->cap_next)
        if (*pp == pod) {
            *pp = pod->cap_next;
            break;
        }
    if (pod->cap_timer)
        event_free(pod->cap_timer);
    pod->cap_timer = NULL;
}
