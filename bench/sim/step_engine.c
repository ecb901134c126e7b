/* bench/sim/step_engine.c: the step engine of step_engine.h.
 *
 * The scheduling follows vLLM v1's Scheduler.schedule() with chunked prefill (and its
 * long_prefill_token_threshold, which caps what one sequence takes of a step's budget):
 * running sequences first, in the order they were admitted,
 * then the waiting queue (FCFS, or by priority) while the budget, max_num_seqs and the cache
 * allow; with priority scheduling, a waiting sequence may preempt worse running ones (the
 * header says how far this goes beyond vLLM v1). */
#include <limits.h>
#include <stdlib.h>

#include "step_engine.h"

static void list_push_tail(sim_step_list_t *l, sim_step_seq_t *s)
{
    s->next = NULL;
    s->prev = l->tail;
    if (l->tail) l->tail->next = s; else l->head = s;
    l->tail = s;
    l->n++;
}

static void list_push_head(sim_step_list_t *l, sim_step_seq_t *s)
{
    s->prev = NULL;
    s->next = l->head;
    if (l->head) l->head->prev = s; else l->tail = s;
    l->head = s;
    l->n++;
}

/* Does a go before b: a better priority, or the same and an earlier arrival? */
static int before(const sim_step_seq_t *a, const sim_step_seq_t *b)
{
    return a->priority != b->priority ? a->priority < b->priority : a->arrival < b->arrival;
}

/* Priority scheduling: s goes after every waiting sequence that goes before it. */
static void list_insert_ordered(sim_step_list_t *l, sim_step_seq_t *s)
{
    sim_step_seq_t *at = l->tail;
    while (at && before(s, at))
        at = at->prev;
    if (!at) {
        list_push_head(l, s);
        return;
    }
    s->prev = at;
    s->next = at->next;
    if (at->next) at->next->prev = s; else l->tail = s;
    at->next = s;
    l->n++;
}

static void list_remove(sim_step_list_t *l, sim_step_seq_t *s)
{
    if (s->prev) s->prev->next = s->next; else l->head = s->next;
    if (s->next) s->next->prev = s->prev; else l->tail = s->prev;
    s->prev = s->next = NULL;
    l->n--;
}

int sim_step_init(sim_step_t *e, const sim_step_conf_t *c, pcr_kvcache_t *kv)
{
    *e = (sim_step_t){.c = *c, .kv = kv};
    e->batch = calloc(c->max_num_seqs ? c->max_num_seqs : 1, sizeof(*e->batch));
    return e->batch ? 0 : -1;
}

void sim_step_dispose(sim_step_t *e)
{
    free(e->batch);
    e->batch = NULL;
}

/* Private blocks that hold a sequence's first `tokens` tokens beyond its named blocks. */
static size_t private_for(const sim_step_seq_t *s, size_t tokens)
{
    size_t named = s->nblocks * PCR_KV_BLOCK_TOKENS;
    return tokens > named ? (tokens - named + PCR_KV_BLOCK_TOKENS - 1) / PCR_KV_BLOCK_TOKENS : 0;
}

int sim_step_fits(const sim_step_t *e, size_t nblocks, size_t prompt_tokens, size_t max_tokens)
{
    sim_step_seq_t s = {.nblocks = nblocks};
    return nblocks + private_for(&s, prompt_tokens + max_tokens) <= pcr_kvcache_capacity(e->kv);
}

void sim_step_add(sim_step_t *e, sim_step_seq_t *s)
{
    s->state = SIM_SEQ_WAITING;
    s->computed = s->generated = s->hit_tokens = s->private_blocks = s->scheduled = 0;
    s->preemptions = 0;
    s->admitted = 0;
    s->arrival = e->next_arrival++;
    if (e->c.priority)
        list_insert_ordered(&e->waiting, s);
    else
        list_push_tail(&e->waiting, s);
}

/* Gives back every block s holds. */
static void release(sim_step_t *e, sim_step_seq_t *s)
{
    pcr_kvcache_release(e->kv, s->hashes, s->nblocks, s->private_blocks);
    s->private_blocks = 0;
}

void sim_step_abort(sim_step_t *e, sim_step_seq_t *s)
{
    for (unsigned k = 0; k < e->nbatch; k++)
        if (e->batch[k] == s)
            e->batch[k] = NULL;
    if (s->state == SIM_SEQ_RUNNING) {
        list_remove(&e->running, s);
        release(e, s);
    } else if (s->state == SIM_SEQ_WAITING) {
        list_remove(&e->waiting, s);
    }
    s->state = SIM_SEQ_FINISHED;
}

/* What the step being composed holds so far: its budget left and the context it reads. */
typedef struct {
    size_t budget;
    double ctx;
} compose_t;

/* Takes s out of the step being composed, giving back what schedule() counted for it. */
static void unschedule(sim_step_t *e, sim_step_seq_t *s, compose_t *k)
{
    for (unsigned i = 0; i < e->nbatch; i++) {
        if (e->batch[i] != s)
            continue;
        size_t total = s->prompt_tokens + s->generated;
        if (s->generated > 0 && s->computed + 1 == total)
            e->step_decodes--;
        else
            e->step_prefill_tokens -= s->scheduled;
        k->ctx -= (double)(s->computed + s->scheduled);
        k->budget += s->scheduled;
        s->scheduled = 0;
        e->batch[i] = e->batch[--e->nbatch];
        return;
    }
}

/* The running sequence a preemption takes: the newest (FCFS), or the one of the worst
 * priority, latest arrival (priority scheduling, as vLLM's max over (priority, arrival)). */
static sim_step_seq_t *victim(const sim_step_t *e)
{
    sim_step_seq_t *v = e->running.tail;
    if (e->c.priority)
        for (sim_step_seq_t *s = e->running.head; s; s = s->next)
            if (before(v, s))
                v = s;
    return v;
}

/* v goes back to waiting with nothing computed (to the head under FCFS, in its order under
 * priority scheduling); the full prompt blocks it had computed stay cached, as in vLLM, the
 * others go. */
static void preempt(sim_step_t *e, sim_step_seq_t *v, compose_t *k)
{
    unschedule(e, v, k);
    list_remove(&e->running, v);
    size_t done = v->computed / PCR_KV_BLOCK_TOKENS;
    pcr_kvcache_release_uncomputed(e->kv, v->hashes, v->nblocks,
                                   done < v->nblocks ? done : v->nblocks, v->private_blocks);
    v->private_blocks = 0;
    v->computed = 0;
    v->scheduled = 0;
    v->state = SIM_SEQ_WAITING;
    v->preemptions++;
    e->preemptions++;
    if (e->c.priority)
        list_insert_ordered(&e->waiting, v);
    else
        list_push_head(&e->waiting, v);
}

/* Priority scheduling: the running sequence a waiting one of priority p may displace, the
 * worst of those strictly worse than p, or NULL. */
static sim_step_seq_t *worse_than(const sim_step_t *e, int p)
{
    sim_step_seq_t *v = victim(e);
    return v && v->priority > p ? v : NULL;
}

/* Makes room for s to compute n more tokens: 0, or nonzero when the cache is full. */
static int grow(sim_step_t *e, sim_step_seq_t *s, size_t n)
{
    size_t want = private_for(s, s->computed + n);
    if (want <= s->private_blocks)
        return 0;
    size_t hit;
    if (pcr_kvcache_acquire(e->kv, NULL, 0, want - s->private_blocks, &hit) != 0)
        return -1;
    s->private_blocks = want;
    return 0;
}

/* Puts s in the step with n tokens, and adds what it costs. */
static void schedule(sim_step_t *e, sim_step_seq_t *s, size_t n, compose_t *k)
{
    size_t total = s->prompt_tokens + s->generated;
    s->scheduled = n;
    if (s->generated > 0 && s->computed + 1 == total)
        e->step_decodes++;
    else
        e->step_prefill_tokens += n;
    k->ctx += (double)(s->computed + n);
    k->budget -= n;
    e->batch[e->nbatch++] = s;
}

/* The tokens s would compute next: what it has left, at most long_prefill (when set). */
static size_t wants(const sim_step_t *e, const sim_step_seq_t *s, size_t computed)
{
    size_t left = s->prompt_tokens + s->generated - computed;
    return e->c.long_prefill > 0 && left > e->c.long_prefill ? e->c.long_prefill : left;
}

/* Would the waiting s get less of this step than its next chunk (what it has left past its
 * cached prefix, at most long_prefill and the whole budget)? */
static int short_of_budget(const sim_step_t *e, const sim_step_seq_t *s, const compose_t *k)
{
    size_t hit = pcr_kvcache_hit_tokens(pcr_kvcache_match(e->kv, s->hashes, s->nblocks),
                                        s->prompt_tokens);
    size_t want = wants(e, s, hit);
    if (want > e->c.max_batched_tokens)
        want = e->c.max_batched_tokens;
    return k->budget < want;
}

/* Admits the waiting head s with as many tokens as the budget allows: 0, or nonzero when the
 * budget, max_num_seqs or the cache keep it out. */
static int admit(sim_step_t *e, sim_step_seq_t *s, compose_t *k)
{
    if (k->budget == 0 || e->running.n >= e->c.max_num_seqs)
        return -1;
    size_t hit = pcr_kvcache_hit_tokens(pcr_kvcache_match(e->kv, s->hashes, s->nblocks),
                                        s->prompt_tokens);
    size_t want = wants(e, s, hit);
    size_t n = want < k->budget ? want : k->budget;
    size_t priv = private_for(s, hit + n), hit_blocks;
    if (pcr_kvcache_acquire(e->kv, s->hashes, s->nblocks, priv, &hit_blocks) != 0)
        return -1;
    list_remove(&e->waiting, s);
    s->computed = hit;
    s->private_blocks = priv;
    if (!s->admitted) {
        s->admitted = 1;
        s->hit_tokens = hit;
        e->prefix_queries += s->prompt_tokens;
        e->prefix_hits += hit;
    }
    s->state = SIM_SEQ_RUNNING;
    list_push_tail(&e->running, s);
    schedule(e, s, n, k);
    return 0;
}

double sim_step_begin(sim_step_t *e)
{
    compose_t k = {.budget = e->c.max_batched_tokens, .ctx = 0};
    int preempted = 0;
    e->nbatch = 0;
    e->step_prefill_tokens = 0;
    e->step_decodes = 0;
    for (sim_step_seq_t *s = e->running.head, *next; s && k.budget > 0; s = next) {
        size_t left = wants(e, s, s->computed);
        size_t n = left < k.budget ? left : k.budget;
        int lost = 0;
        while (grow(e, s, n) != 0) {
            sim_step_seq_t *v = victim(e);
            preempted = 1;
            preempt(e, v, &k);   /* one scheduled already gives its tokens back */
            if (v == s) {
                lost = 1;
                break;
            }
            n = left < k.budget ? left : k.budget;
        }
        if (lost)
            break;
        next = s->next;
        schedule(e, s, n, &k);
    }
    /* Priority scheduling: a waiting sequence that cannot go in whole (its next chunk short
     * of the budget left, or no slot, or no room in the cache) displaces worse running ones
     * until it can, as vLLM v0's _schedule_priority_preemption does; after that, only
     * sequences better than every one displaced are admitted. */
    int cut = INT_MAX;
    while (!preempted && e->waiting.head) {
        sim_step_seq_t *s = e->waiting.head, *v;
        if (e->c.priority && s->priority >= cut)
            break;
        if (e->c.priority && short_of_budget(e, s, &k) &&
            (v = worse_than(e, s->priority)) != NULL) {
            preempt(e, v, &k);
            e->priority_preemptions++;
            if (v->priority < cut)
                cut = v->priority;
            continue;
        }
        if (admit(e, s, &k) == 0)
            continue;
        if (!e->c.priority || (v = worse_than(e, s->priority)) == NULL)
            break;   /* FIFO: the head waits for blocks to be given back */
        preempt(e, v, &k);
        e->priority_preemptions++;
        if (v->priority < cut)
            cut = v->priority;
    }
    if (e->nbatch == 0)
        return 0;
    e->in_step = 1;
    e->steps++;
    double t = e->c.base_us + (double)e->step_prefill_tokens * e->c.prefill_us_per_token +
               (double)e->step_decodes * e->c.decode_us_per_seq + k.ctx * e->c.ctx_us_per_token;
    return t > 0 ? t : 1e-3;   /* a step always takes some time: 0 means idle */
}

void sim_step_end(sim_step_t *e, void (*emit)(void *arg, sim_step_seq_t *s), void *arg)
{
    unsigned n = e->nbatch;
    for (unsigned k = 0; k < n; k++) {
        sim_step_seq_t *s = e->batch[k];
        if (!s)
            continue;   /* aborted during the step */
        s->computed += s->scheduled;
        s->scheduled = 0;
        if (s->computed < s->prompt_tokens + s->generated) {
            e->batch[k] = NULL;   /* a prefill chunk that is not the last samples nothing */
            continue;
        }
        s->generated++;
        if (s->generated >= s->max_tokens) {
            list_remove(&e->running, s);
            release(e, s);
            s->state = SIM_SEQ_FINISHED;
        }
    }
    /* Still in the step while the tokens go out, so that a sequence added by emit waits for
     * the caller's next sim_step_begin. */
    for (unsigned k = 0; k < n; k++) {
        sim_step_seq_t *s = e->batch[k];
        if (!s)
            continue;
        e->batch[k] = NULL;
        emit(arg, s);
    }
    e->nbatch = 0;
    e->in_step = 0;
}
