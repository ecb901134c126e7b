/* test/unit/bench/test_step_engine.c: the simulator's step engine (bench/sim/step_engine.c):
 * a step's make-up under the token budget, chunked prefill, the max_num_seqs bound, the step
 * time, preemption of the newest running sequence when the cache runs out, blocks given back
 * at the end, aborts, and the same inputs giving the same steps; with priority scheduling,
 * the waiting order, a better waiting sequence displacing worse running ones, and the victim
 * of a full cache, and a better sequence short of the budget displacing; and long_prefill
 * capping what one sequence takes of a step. */
#include <stdlib.h>

#include "pcr_test.h"
#include "step_engine.h"

#define MAXSEQ 8

/* Sequences whose prompt blocks are named apart: seq k's block i is 1000 * (k + 1) + i. */
typedef struct {
    sim_step_seq_t s[MAXSEQ];
    uint64_t h[MAXSEQ][512];
    unsigned emitted[MAXSEQ];
    unsigned first_step[MAXSEQ];   /* step of the first token, 0: none yet */
    unsigned step;
} fixture_t;

static void make(fixture_t *f, unsigned k, size_t prompt, size_t max_tokens)
{
    size_t nb = prompt / PCR_KV_BLOCK_TOKENS;
    for (size_t i = 0; i < nb && i < 512; i++)
        f->h[k][i] = 1000u * (k + 1) + i;
    f->s[k] = (sim_step_seq_t){.hashes = f->h[k], .nblocks = nb, .prompt_tokens = prompt,
                               .max_tokens = max_tokens, .owner = f};
}

static void on_emit(void *arg, sim_step_seq_t *s)
{
    fixture_t *f = arg;
    unsigned k = (unsigned)(s - f->s);
    f->emitted[k]++;
    if (s->generated == 1)
        f->first_step[k] = f->step;
}

static double run_step(sim_step_t *e, fixture_t *f)
{
    double t = sim_step_begin(e);
    f->step++;
    if (t > 0)
        sim_step_end(e, on_emit, f);
    return t;
}

static sim_step_conf_t conf(unsigned seqs, unsigned budget)
{
    sim_step_conf_t c = {seqs, budget, 1000.0, 10.0, 100.0, 1.0, 0, 0};
    return c;
}

static void test_prefill_is_chunked_under_the_budget(void)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(10000);
    sim_step_conf_t c = conf(16, 8192);
    sim_step_t e;
    PCR_CHECK_EQ_INT(sim_step_init(&e, &c, kv), 0);
    for (unsigned k = 0; k < 3; k++) {
        make(&f, k, k < 2 ? 5000 : 7000, 4);
        sim_step_add(&e, &f.s[k]);
    }
    /* Step 1: all of seq 0's prompt, the first 3192 of seq 1's; seq 2 is not admitted. */
    PCR_CHECK(sim_step_begin(&e) > 0);
    PCR_CHECK_EQ_INT(e.step_prefill_tokens, 8192);
    PCR_CHECK_EQ_INT(e.step_decodes, 0);
    PCR_CHECK_EQ_INT(e.running.n, 2);
    PCR_CHECK_EQ_INT(e.waiting.n, 1);
    f.step = 1;
    sim_step_end(&e, on_emit, &f);
    PCR_CHECK_EQ_INT(f.emitted[0], 1);   /* its prefill done: its first token */
    PCR_CHECK_EQ_INT(f.emitted[1], 0);   /* a chunk that is not the last samples nothing */
    PCR_CHECK_EQ_INT(f.s[1].computed, 3192);
    /* Step 2: seq 0 decodes, seq 1 finishes its prefill, seq 2 takes what is left of the budget. */
    double t = sim_step_begin(&e);
    PCR_CHECK_EQ_INT(e.step_decodes, 1);
    PCR_CHECK_EQ_INT(e.step_prefill_tokens, 1808 + 6383);
    PCR_CHECK_EQ_INT(e.running.n, 3);
    /* base + prefill + one decode + context read (5001 + 5000 + 6383 tokens) */
    double want = 1000.0 + (1808 + 6383) * 10.0 + 100.0 + (5001 + 5000 + 6383) * 1.0;
    PCR_CHECK(t > want - 1e-6 && t < want + 1e-6);
    f.step = 2;
    sim_step_end(&e, on_emit, &f);
    PCR_CHECK_EQ_INT(f.emitted[0], 2);
    PCR_CHECK_EQ_INT(f.emitted[1], 1);
    PCR_CHECK_EQ_INT(f.emitted[2], 0);
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

static void test_max_num_seqs_bounds_the_running(void)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(10000);
    sim_step_conf_t c = conf(2, 8192);
    sim_step_t e;
    sim_step_init(&e, &c, kv);
    for (unsigned k = 0; k < 3; k++) {
        make(&f, k, 64, 3);
        sim_step_add(&e, &f.s[k]);
    }
    run_step(&e, &f);
    PCR_CHECK_EQ_INT(e.running.n, 2);
    PCR_CHECK_EQ_INT(e.waiting.n, 1);
    for (int i = 0; i < 20 && run_step(&e, &f) > 0; i++)
        PCR_CHECK(e.running.n <= 2);
    /* Seq 2 starts when the first two have finished (3 tokens: 3 steps), FIFO. */
    PCR_CHECK_EQ_INT(f.first_step[0], 1);
    PCR_CHECK_EQ_INT(f.first_step[1], 1);
    PCR_CHECK_EQ_INT(f.first_step[2], 4);
    for (unsigned k = 0; k < 3; k++)
        PCR_CHECK_EQ_INT(f.emitted[k], 3);
    /* Everything given back: cached, none pinned or reserved. */
    PCR_CHECK_EQ_INT(pcr_kvcache_pinned(kv), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_reserved(kv), 0);
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

static void test_decode_time_grows_with_batch_and_context(void)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(10000);
    sim_step_conf_t c = conf(16, 8192);
    sim_step_t e;
    sim_step_init(&e, &c, kv);
    make(&f, 0, 160, 10);
    sim_step_add(&e, &f.s[0]);
    run_step(&e, &f);
    double one = sim_step_begin(&e);   /* one decode, context 161 */
    PCR_CHECK(one > 1000.0 + 100.0 + 161 - 1e-6 && one < 1000.0 + 100.0 + 161 + 1e-6);
    sim_step_end(&e, on_emit, &f);
    make(&f, 1, 1600, 10);
    sim_step_add(&e, &f.s[1]);
    run_step(&e, &f);                  /* seq 1's prefill beside seq 0's decode */
    double two = sim_step_begin(&e);   /* two decodes, contexts 163 and 1601 */
    PCR_CHECK_EQ_INT(e.step_decodes, 2);
    PCR_CHECK(two > 1000.0 + 200.0 + 163 + 1601 - 1e-6 && two < 1000.0 + 200.0 + 1764 + 1e-6);
    sim_step_end(&e, on_emit, &f);
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

/* Two sequences of 3 named blocks on a cache of 8: each takes a private block at its first
 * decode, and the next block at its 17th; the cache is full then, so the newer is preempted:
 * back to the waiting head, its blocks given back, nobody admitted that step. */
static void preemption_scenario(double *times, unsigned *ntimes, int check)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(8);
    sim_step_conf_t c = conf(16, 8192);
    sim_step_t e;
    sim_step_init(&e, &c, kv);
    make(&f, 0, 48, 40);
    make(&f, 1, 48, 40);
    sim_step_add(&e, &f.s[0]);
    sim_step_add(&e, &f.s[1]);
    unsigned n = 0;
    double t;
    while ((t = run_step(&e, &f)) > 0 && n < 200) {
        times[n++] = t;
        if (check && e.preemptions == 1 && f.s[1].state == SIM_SEQ_WAITING && n < 40) {
            PCR_CHECK_EQ_INT(f.s[1].preemptions, 1);
            PCR_CHECK_EQ_INT(f.s[1].computed, 0);
            PCR_CHECK_EQ_INT(f.s[0].state, SIM_SEQ_RUNNING);
            PCR_CHECK_EQ_INT(f.s[0].preemptions, 0);
            PCR_CHECK_EQ_INT(e.waiting.head == &f.s[1], 1);
        }
    }
    *ntimes = n;
    if (check) {
        PCR_CHECK_EQ_INT(e.preemptions >= 1, 1);
        PCR_CHECK_EQ_INT(f.s[0].preemptions, 0);     /* the older one is never the victim */
        PCR_CHECK(f.s[1].preemptions >= 1);
        PCR_CHECK_EQ_INT(f.emitted[0], 40);           /* both finish, the newer after */
        PCR_CHECK_EQ_INT(f.emitted[1], 40);
        PCR_CHECK_EQ_INT(f.s[1].hit_tokens, 0);       /* the hit counts at the first admission */
        PCR_CHECK_EQ_INT(pcr_kvcache_pinned(kv), 0);
        PCR_CHECK_EQ_INT(pcr_kvcache_reserved(kv), 0);
    }
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

static void test_preempts_the_newest_when_the_cache_runs_out(void)
{
    double a[200], b[200];
    unsigned na, nb;
    preemption_scenario(a, &na, 1);
    preemption_scenario(b, &nb, 0);
    PCR_CHECK_EQ_INT(na, nb);                         /* deterministic */
    PCR_CHECK(na > 0 && memcmp(a, b, na * sizeof a[0]) == 0);
}

static void test_abort_gives_back_its_blocks(void)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(100);
    sim_step_conf_t c = conf(16, 8192);
    sim_step_t e;
    sim_step_init(&e, &c, kv);
    make(&f, 0, 100, 50);
    make(&f, 1, 100, 50);
    sim_step_add(&e, &f.s[0]);
    sim_step_add(&e, &f.s[1]);
    PCR_CHECK(sim_step_begin(&e) > 0);
    sim_step_abort(&e, &f.s[0]);          /* mid-step: it samples nothing */
    f.step = 1;
    sim_step_end(&e, on_emit, &f);
    PCR_CHECK_EQ_INT(f.emitted[0], 0);
    PCR_CHECK_EQ_INT(f.emitted[1], 1);
    sim_step_abort(&e, &f.s[1]);
    PCR_CHECK_EQ_INT(e.running.n, 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_pinned(kv), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_reserved(kv), 0);
    PCR_CHECK(sim_step_begin(&e) == 0);   /* idle */
    PCR_CHECK(sim_step_fits(&e, 6, 100, 1500));
    PCR_CHECK(!sim_step_fits(&e, 6, 100, 1600));
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

/* Three sequences queued at once on one slot: FCFS serves them in arrival order, priority
 * scheduling the better one first, ties by arrival. */
static void serve_order(int priority, unsigned order[3])
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(1000);
    sim_step_conf_t c = conf(1, 8192);
    c.priority = priority;
    sim_step_t e;
    sim_step_init(&e, &c, kv);
    int prio[3] = {5, 5, 1};
    for (unsigned k = 0; k < 3; k++) {
        make(&f, k, 64, 2);
        f.s[k].priority = prio[k];
        sim_step_add(&e, &f.s[k]);
    }
    for (unsigned n = 0; n < 100 && run_step(&e, &f) > 0; n++)
        ;
    for (unsigned k = 0; k < 3; k++) {
        PCR_CHECK_EQ_INT(f.emitted[k], 2);
        PCR_CHECK_EQ_INT(f.s[k].preemptions, 0);   /* nobody runs when the better one comes */
        order[k] = f.first_step[k];
    }
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

static void test_priority_orders_the_waiting_queue(void)
{
    unsigned fcfs[3], prio[3];
    serve_order(0, fcfs);
    serve_order(1, prio);
    PCR_CHECK(fcfs[0] < fcfs[1] && fcfs[1] < fcfs[2]);
    PCR_CHECK(prio[2] < prio[0] && prio[0] < prio[1]);
}

/* A long prompt of priority 5 in chunked prefill takes the whole budget; a short one of
 * priority 0 arrives. FCFS: it waits for a share of the budget. Priority: it displaces the
 * long one at once (which gives back its step's tokens, its blocks past what it computed, and
 * is not admitted again in that step), and the long one runs again after. */
static void displaced(int priority)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(1000);
    sim_step_conf_t c = conf(16, 64);
    c.priority = priority;
    sim_step_t e;
    sim_step_init(&e, &c, kv);
    make(&f, 0, 640, 3);
    f.s[0].priority = 5;
    make(&f, 1, 32, 3);
    f.s[1].priority = 0;
    sim_step_add(&e, &f.s[0]);
    run_step(&e, &f);
    run_step(&e, &f);                  /* 128 of its 640 tokens computed */
    PCR_CHECK_EQ_INT(f.s[0].computed, 128);
    sim_step_add(&e, &f.s[1]);
    PCR_CHECK(sim_step_begin(&e) > 0);
    if (!priority) {
        PCR_CHECK_EQ_INT(f.s[0].state, SIM_SEQ_RUNNING);
        PCR_CHECK_EQ_INT(f.s[1].state, SIM_SEQ_WAITING);
        PCR_CHECK_EQ_INT(e.step_prefill_tokens, 64);
    } else {
        PCR_CHECK_EQ_INT(f.s[0].state, SIM_SEQ_WAITING);
        PCR_CHECK_EQ_INT(f.s[0].computed, 0);
        PCR_CHECK_EQ_INT(f.s[0].preemptions, 1);
        PCR_CHECK_EQ_INT(e.priority_preemptions, 1);
        PCR_CHECK_EQ_INT(f.s[1].state, SIM_SEQ_RUNNING);
        PCR_CHECK_EQ_INT(e.step_prefill_tokens, 32);   /* its own tokens only */
        PCR_CHECK_EQ_INT(e.nbatch, 1);
        /* The 8 blocks it computed stay cached, the 32 it never computed are gone. */
        PCR_CHECK_EQ_INT(pcr_kvcache_match(kv, f.h[0], 40), 8);
    }
    sim_step_end(&e, on_emit, &f);
    for (unsigned n = 0; n < 100 && run_step(&e, &f) > 0; n++)
        ;
    PCR_CHECK_EQ_INT(f.emitted[0], 3);
    PCR_CHECK_EQ_INT(f.emitted[1], 3);
    if (priority)
        PCR_CHECK(f.first_step[1] < f.first_step[0]);
    else
        PCR_CHECK(f.first_step[0] < f.first_step[1]);
    PCR_CHECK_EQ_INT(pcr_kvcache_pinned(kv), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_reserved(kv), 0);
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

static void test_a_better_waiting_sequence_displaces_a_worse_running_one(void)
{
    displaced(0);
    displaced(1);
}

/* One slot, a decode of priority 5 running; a sequence of the same priority waits for it, one
 * of priority 0 displaces it. */
static void test_only_a_strictly_better_priority_displaces(void)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(1000);
    sim_step_conf_t c = conf(1, 8192);
    c.priority = 1;
    sim_step_t e;
    sim_step_init(&e, &c, kv);
    make(&f, 0, 64, 10);
    f.s[0].priority = 5;
    make(&f, 1, 64, 2);
    f.s[1].priority = 5;
    make(&f, 2, 64, 2);
    f.s[2].priority = 0;
    sim_step_add(&e, &f.s[0]);
    run_step(&e, &f);
    sim_step_add(&e, &f.s[1]);
    run_step(&e, &f);
    PCR_CHECK_EQ_INT(f.s[1].state, SIM_SEQ_WAITING);
    PCR_CHECK_EQ_INT(e.preemptions, 0);
    sim_step_add(&e, &f.s[2]);
    run_step(&e, &f);
    PCR_CHECK_EQ_INT(f.s[0].state, SIM_SEQ_WAITING);
    PCR_CHECK_EQ_INT(f.s[2].state, SIM_SEQ_RUNNING);
    PCR_CHECK_EQ_INT(e.priority_preemptions, 1);
    /* Back in its order: before the one of its priority that arrived after it. */
    PCR_CHECK_EQ_INT(e.waiting.head == &f.s[0] && f.s[0].next == &f.s[1], 1);
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

/* The cache scenario above with the older sequence of the worse priority: priority scheduling
 * preempts it (vLLM's max over priority, arrival), not the newest. */
static void test_a_full_cache_preempts_the_worst_priority(void)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(8);
    sim_step_conf_t c = conf(16, 8192);
    c.priority = 1;
    sim_step_t e;
    sim_step_init(&e, &c, kv);
    make(&f, 0, 48, 40);
    f.s[0].priority = 5;
    make(&f, 1, 48, 40);
    f.s[1].priority = 0;
    sim_step_add(&e, &f.s[0]);
    sim_step_add(&e, &f.s[1]);
    for (unsigned n = 0; n < 400 && run_step(&e, &f) > 0; n++)
        ;
    PCR_CHECK(f.s[0].preemptions >= 1);
    PCR_CHECK_EQ_INT(f.s[1].preemptions, 0);
    PCR_CHECK_EQ_INT(f.emitted[0], 40);
    PCR_CHECK_EQ_INT(f.emitted[1], 40);
    PCR_CHECK_EQ_INT(pcr_kvcache_pinned(kv), 0);
    PCR_CHECK_EQ_INT(pcr_kvcache_reserved(kv), 0);
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

/* long_prefill (vLLM's long_prefill_token_threshold): a 4000-token prompt takes at most 1000
 * tokens a step, running or newly admitted, so a prompt arriving behind it is admitted in the
 * next step with the budget left, and the long one needs four steps. */
static void test_long_prefill_caps_a_sequence_per_step(void)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(10000);
    sim_step_conf_t c = conf(16, 8192);
    c.long_prefill = 1000;
    sim_step_t e;
    sim_step_init(&e, &c, kv);
    make(&f, 0, 4000, 2);
    make(&f, 1, 800, 2);
    sim_step_add(&e, &f.s[0]);
    PCR_CHECK(sim_step_begin(&e) > 0);
    PCR_CHECK_EQ_INT(e.step_prefill_tokens, 1000);
    f.step = 1;
    sim_step_end(&e, on_emit, &f);
    sim_step_add(&e, &f.s[1]);
    PCR_CHECK(sim_step_begin(&e) > 0);
    PCR_CHECK_EQ_INT(e.step_prefill_tokens, 1800);   /* 1000 of seq 0, all 800 of seq 1 */
    f.step = 2;
    sim_step_end(&e, on_emit, &f);
    PCR_CHECK_EQ_INT(f.first_step[1], 2);
    while (f.emitted[0] == 0 && run_step(&e, &f) > 0)
        ;
    PCR_CHECK_EQ_INT(f.first_step[0], 4);
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

/* Priority scheduling, a budget of 1024: a worse sequence's last chunk (928 tokens) leaves
 * 96; a better one that wants 1000 does not take those 96 and wait behind the worse one's
 * chunks, it displaces the worse one (vLLM v0's _schedule_priority_preemption: until the
 * waiting one's tokens fit the budget) and prefills whole in this step. */
static void test_a_better_sequence_short_of_budget_displaces(void)
{
    static fixture_t f;
    memset(&f, 0, sizeof f);
    pcr_kvcache_t *kv = pcr_kvcache_new(10000);
    sim_step_conf_t c = conf(16, 1024);
    c.priority = 1;
    sim_step_t e;
    sim_step_init(&e, &c, kv);
    make(&f, 0, 4000, 2);
    f.s[0].priority = 10;
    make(&f, 1, 1000, 2);
    f.s[1].priority = 0;
    sim_step_add(&e, &f.s[0]);
    for (unsigned n = 0; n < 3; n++)
        run_step(&e, &f);
    PCR_CHECK_EQ_INT(f.s[0].computed, 3072);
    sim_step_add(&e, &f.s[1]);
    PCR_CHECK(sim_step_begin(&e) > 0);
    PCR_CHECK_EQ_INT(e.priority_preemptions, 1);
    PCR_CHECK_EQ_INT(f.s[0].state, SIM_SEQ_WAITING);
    PCR_CHECK_EQ_INT(e.step_prefill_tokens, 1000);
    f.step = 4;
    sim_step_end(&e, on_emit, &f);
    PCR_CHECK_EQ_INT(f.first_step[1], 4);
    /* The worse one resumes from its 192 computed blocks. */
    for (unsigned n = 0; n < 100 && run_step(&e, &f) > 0; n++)
        ;
    PCR_CHECK_EQ_INT(f.emitted[0], 2);
    PCR_CHECK_EQ_INT(f.emitted[1], 2);
    sim_step_dispose(&e);
    pcr_kvcache_free(kv);
}

int main(void)
{
    PCR_RUN(test_prefill_is_chunked_under_the_budget);
    PCR_RUN(test_max_num_seqs_bounds_the_running);
    PCR_RUN(test_decode_time_grows_with_batch_and_context);
    PCR_RUN(test_preempts_the_newest_when_the_cache_runs_out);
    PCR_RUN(test_abort_gives_back_its_blocks);
    PCR_RUN(test_priority_orders_the_waiting_queue);
    PCR_RUN(test_a_better_waiting_sequence_displaces_a_worse_running_one);
    PCR_RUN(test_only_a_strictly_better_priority_displaces);
    PCR_RUN(test_long_prefill_caps_a_sequence_per_step);
    PCR_RUN(test_a_better_sequence_short_of_budget_displaces);
    PCR_RUN(test_a_full_cache_preempts_the_worst_priority);
    return pcr_test_done();
}
