/* test/unit/router/core/test_bus.c: tests router/core/bus.c, the index updates between the workers'
 * policy replicas: who receives what, that a replica fed the updates routes like the one that
 * learned them, the tap, and the bound on an inbox nobody drains. */
#include <stdlib.h>
#include <string.h>

#include "bus.h"
#include "pcr_test.h"
#include "pcr/policy.h"

static pcr_policy_t *replica(void)
{
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    pcr_backend_desc_t d[3] = {{"a", "", 1, 0}, {"b", "", 1, 0}, {"c", "", 1, 0}};
    return pcr_policy_new(&o, d, 3);
}

static void make_key(pcr_policy_t *p, const char *text, pcr_key_t *key, uint64_t *blocks)
{
    key->blocks = blocks;
    pcr_policy_key(p, "m", 1, text, strlen(text), key);
}

static uint32_t matched(pcr_policy_t *p, const pcr_key_t *key, int backend)
{
    pcr_backend_load_t loads[3];
    memset(loads, 0, sizeof(loads));
    for (int i = 0; i < 3; i++)
        loads[i].usable = i == backend;
    pcr_decision_t d;
    pcr_policy_decide(p, key, loads, 1, &d);
    return d.matched_blocks;
}

static char prompt[4096];

static void test_commit_reaches_the_others_not_the_sender(void)
{
    pcr_bus_t *bus = pcr_bus_new(3);
    pcr_policy_t *w0 = replica(), *w1 = replica(), *w2 = replica();
    uint64_t blocks[1024];
    pcr_key_t key;
    memset(prompt, 'p', sizeof(prompt) - 1);
    make_key(w0, prompt, &key, blocks);
    uint32_t from;
    pcr_policy_commit(w0, 1, &key, 5, &from);
    pcr_bus_commit(bus, 0, 1, &key, 5);
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 0, &w0), 0);  /* the sender applied it itself */
    PCR_CHECK_EQ_INT(matched(w1, &key, 1), 0);       /* not before its next drain */
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 1, &w1), 1);
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 2, &w2), 1);
    PCR_CHECK_EQ_INT(matched(w1, &key, 1), key.nblocks);
    PCR_CHECK_EQ_INT(matched(w2, &key, 1), matched(w0, &key, 1));
    /* The failure that undoes it travels the same way. */
    pcr_policy_forget(w0, 1, &key, 0);
    pcr_bus_forget(bus, 0, 1, &key, 0);
    pcr_bus_drain(bus, 1, &w1);
    PCR_CHECK_EQ_INT(matched(w1, &key, 1), 0);
    pcr_policy_free(w0);
    pcr_policy_free(w1);
    pcr_policy_free(w2);
    pcr_bus_free(bus);
}

/* What a worker learns from a pod's answer, its speed and what it delivered, reaches the
 * others: a replica fed the updates prices and forgets like the one that learned them. */
static void test_observe_and_feedback_reach_the_others(void)
{
    pcr_bus_t *bus = pcr_bus_new(2);
    pcr_policy_t *w0 = replica(), *w1 = replica();
    uint64_t old_blocks[1024], new_blocks[1024];
    pcr_key_t older, newer;
    static char a[4096], b[4096];
    memset(a, 'a', sizeof(a) - 1);
    memset(b, 'b', sizeof(b) - 1);
    make_key(w0, a, &older, old_blocks);
    make_key(w0, b, &newer, new_blocks);
    uint32_t from;
    for (pcr_policy_t **pp = (pcr_policy_t *[]){w0, w1, NULL}; *pp; pp++) {
        pcr_policy_commit(*pp, 0, &older, 10, &from);
        pcr_policy_commit(*pp, 0, &newer, 20, &from);
    }
    /* A pod ten times slower than the prior says, observed by worker 0. */
    double before = pcr_policy_estimate_ttft(w1, 0, 10000);
    for (int i = 0; i < 64; i++) {
        pcr_policy_observe(w0, 0, 10000, 0, 7000000);
        pcr_bus_observe(bus, 0, 0, 10000, 0, 7000000);
    }
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 1, &w1), 64);
    PCR_CHECK(pcr_policy_estimate_ttft(w1, 0, 10000) > 2 * before);
    PCR_CHECK(pcr_policy_estimate_ttft(w1, 0, 10000) == pcr_policy_estimate_ttft(w0, 0, 10000));
    /* Worker 0 learns the pod delivered nothing of the newer prompt: it evicted it, and the
     * older one with it. */
    pcr_backend_load_t loads[3];
    memset(loads, 0, sizeof(loads));
    loads[0].usable = 1;
    pcr_decision_t d;
    pcr_policy_decide(w0, &newer, loads, 30, &d);
    PCR_CHECK_EQ_INT(d.matched_blocks, newer.nblocks);
    /* Sent while the request that brought it (committed at 20) had not reached its first
     * token: no evidence, on either replica. */
    pcr_policy_feedback(w0, &newer, &d, 0, 20);
    pcr_bus_feedback(bus, 0, &newer, &d, 0, 20);
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 1, &w1), 1);
    PCR_CHECK_EQ_INT(matched(w0, &older, 0), older.nblocks);
    PCR_CHECK_EQ_INT(matched(w1, &older, 0), older.nblocks);
    /* Sent after it had. */
    pcr_policy_feedback(w0, &newer, &d, 0, 30);
    pcr_bus_feedback(bus, 0, &newer, &d, 0, 30);
    PCR_CHECK_EQ_INT(matched(w1, &older, 0), older.nblocks);  /* not before its next drain */
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 1, &w1), 1);
    PCR_CHECK_EQ_INT(matched(w0, &older, 0), 0);
    PCR_CHECK_EQ_INT(matched(w1, &older, 0), 0);
    PCR_CHECK_EQ_INT(matched(w1, &newer, 0), matched(w0, &newer, 0));
    PCR_CHECK_EQ_U64(pcr_policy_backend_capacity(w1, 0), pcr_policy_backend_capacity(w0, 0));
    pcr_policy_free(w0);
    pcr_policy_free(w1);
    pcr_bus_free(bus);
}

static void test_control_reaches_every_worker(void)
{
    pcr_bus_t *bus = pcr_bus_new(2);
    pcr_policy_t *w0 = replica(), *w1 = replica();
    uint64_t blocks[1024];
    pcr_key_t key;
    memset(prompt, 'q', sizeof(prompt) - 1);
    make_key(w0, prompt, &key, blocks);
    uint32_t from;
    pcr_policy_commit(w0, 2, &key, 1, &from);
    pcr_policy_commit(w1, 2, &key, 1, &from);
    pcr_bus_state(bus, 2, PCR_BACKEND_RESTARTED, 1);  /* the scrape saw its pod restart */
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 0, &w0), 1);
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 1, &w1), 1);
    PCR_CHECK_EQ_INT(matched(w0, &key, 2), 0);
    PCR_CHECK_EQ_INT(matched(w1, &key, 2), 0);
    pcr_bus_capacity(bus, PCR_BUS_CONTROL, 0, 2);
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 0, &w0), 1);
    pcr_policy_commit(w0, 0, &key, 2, &from);
    PCR_CHECK(pcr_policy_backend_blocks(w0, 0) <= 2);
    pcr_policy_free(w0);
    pcr_policy_free(w1);
    pcr_bus_free(bus);
}

/* The busiest of the three pods' count when one hot prompt is routed 1000 times; with `tails`,
 * 1000 prompts that share its first 2 KiB and each end their own way. */
static int busiest_of_1000(pcr_policy_t *p, int tails)
{
    pcr_backend_load_t loads[3];
    memset(loads, 0, sizeof(loads));
    for (int i = 0; i < 3; i++)
        loads[i].usable = 1;
    int counts[3] = {0}, most = 0;
    memset(prompt, 'h', sizeof(prompt) - 1);
    for (int i = 0; i < 1000; i++) {
        uint64_t blocks[1024];
        pcr_key_t key;
        pcr_decision_t d;
        uint32_t from;
        if (tails) {
            snprintf(prompt + 2048, 16, "%015d", i);
            prompt[2048 + 15] = 't';
        }
        make_key(p, prompt, &key, blocks);
        pcr_policy_decide(p, &key, loads, (uint64_t)i, &d);
        pcr_policy_commit(p, d.backend, &key, (uint64_t)i, &from);
        counts[d.backend]++;
    }
    for (int b = 0; b < 3; b++)
        most = counts[b] > most ? counts[b] : most;
    return most;
}

/* busiest_of_1000() on a replica tuned through the bus with `o`. */
static int busiest_after_tune(const pcr_policy_opts_t *o, int tails)
{
    pcr_bus_t *bus = pcr_bus_new(1);
    pcr_policy_t *w0 = replica();
    pcr_bus_tune(bus, o);
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 0, &w0), 1);
    int most = busiest_of_1000(w0, tails);
    pcr_policy_free(w0);
    pcr_bus_free(bus);
    return most;
}

/* A tune carries every option: with share_margin 1 (and no share penalty), the busiest pod of
 * a hot prompt ends one request further under the share bound (366 of 1000 without it). */
static void test_tune_carries_the_share_margin(void)
{
    int most[2];
    for (int margin = 0; margin <= 1; margin++) {
        pcr_policy_opts_t o;
        pcr_policy_opts_default(&o);
        o.share_penalty = 0;
        o.share_reserve = 0;
        o.share_margin = margin;
        most[margin] = busiest_after_tune(&o, 0);
    }
    PCR_CHECK_EQ_INT(most[0], 366);
    PCR_CHECK_EQ_INT(most[1], 365);
}

/* ... and share_reserve and its tokens: the replica's own defaults keep the busiest pod of the
 * hot prompt at 360, six requests short of the bound (every pod holds the prompt, so none saves
 * anything over another); tuned to no reserve, or to one that passes nothing over, it reaches
 * the bound. */
static void test_tune_carries_the_share_reserve(void)
{
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    o.share_penalty = 0;
    PCR_CHECK_EQ_INT(busiest_after_tune(&o, 0), 360);
    o.share_reserve = 0;
    PCR_CHECK_EQ_INT(busiest_after_tune(&o, 0), 366);
    o.share_reserve = 0.8;
    o.share_reserve_tokens = 0;
    PCR_CHECK_EQ_INT(busiest_after_tune(&o, 0), 366);
}

/* ... and share_exempt_tokens: 1000 prompts with a hot head and a tail of their own. Held to the
 * share bound they spread (no pod over 366); at 1 token every one is exempt, and the pod that
 * holds the head keeps them all. */
static void test_tune_carries_the_share_exemption(void)
{
    int most[2];
    for (int exempt = 0; exempt <= 1; exempt++) {
        pcr_policy_opts_t o;
        pcr_policy_opts_default(&o);
        o.share_penalty = 0;
        o.share_exempt_tokens = exempt ? 1 : 0;
        most[exempt] = busiest_after_tune(&o, 1);
    }
    PCR_CHECK(most[0] <= 366);
    PCR_CHECK_EQ_INT(most[1], 1000);
}

/* Precise mode: a pod's events, published by the subscriber's thread (the control's side),
 * reach every worker's replica: stored blocks, in the pods' table and matched by the tokens'
 * chains; removed and cleared ones gone; a tune that turns the mode on makes a fresh replica
 * with a table. */
static void test_kv_events_reach_every_replica(void)
{
    pcr_bus_t *bus = pcr_bus_new(2);
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    pcr_policy_t *w[2] = {replica(), replica()};
    pcr_bus_tune(bus, (o.index_events = 1, &o));
    pcr_backend_desc_t d[3] = {{"a", "", 1, 0}, {"b", "", 1, 0}, {"c", "", 1, 0}};
    for (int i = 0; i < 3; i++)
        pcr_bus_backend_set(bus, PCR_BUS_CONTROL, i, &d[i]);
    uint32_t tokens[48];
    for (int i = 0; i < 48; i++)
        tokens[i] = 1000 + (uint32_t)i;
    uint64_t hashes[3] = {0xfffffffffffffff1ull, 2, 3}, chains[4];
    pcr_kvt_stored_t ev = {hashes, 3, 0, 0, tokens, 16, PCR_KVT_GPU, 0};
    pcr_bus_kv_stored(bus, 1, &ev, 5);
    for (int k = 0; k < 2; k++) {
        PCR_CHECK_EQ_INT((int)pcr_bus_drain(bus, (unsigned)k, &w[k]), 5);
        const pcr_kvtable_t *t = pcr_policy_kvtable(w[k]);
        PCR_CHECK(t != NULL && pcr_kvtable_entries(t, 1, PCR_KVT_GPU) == 3);
        size_t n = pcr_kvtable_key(0, 16, tokens, 48, chains, 4);
        uint32_t any[3];
        PCR_CHECK_EQ_INT((int)pcr_kvtable_match(t, chains, n, NULL, any), 3);
        PCR_CHECK(any[1] == 3 && any[0] == 0);
    }
    pcr_bus_kv_removed(bus, 1, hashes + 2, 1, PCR_KVT_GPU);
    for (int k = 0; k < 2; k++) {
        pcr_bus_drain(bus, (unsigned)k, &w[k]);
        PCR_CHECK(pcr_kvtable_entries(pcr_policy_kvtable(w[k]), 1, PCR_KVT_GPU) == 2);
    }
    pcr_bus_kv_clear(bus, 1);
    for (int k = 0; k < 2; k++) {
        pcr_bus_drain(bus, (unsigned)k, &w[k]);
        PCR_CHECK(pcr_kvtable_entries(pcr_policy_kvtable(w[k]), 1, PCR_KVT_GPU) == 0);
        pcr_policy_free(w[k]);
    }
    pcr_bus_free(bus);
}

/* A drain with a budget applies updates in order until they cost that many blocks (at least
 * one update), keeps the rest for the next, and takes newer updates only after them; the
 * backlog says whether any are left. */
static void test_drain_some_applies_in_slices_in_order(void)
{
    pcr_bus_t *bus = pcr_bus_new(2);
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    pcr_policy_t *w = replica();
    pcr_bus_tune(bus, (o.index_events = 1, &o));
    pcr_backend_desc_t d[3] = {{"a", "", 1, 0}, {"b", "", 1, 0}, {"c", "", 1, 0}};
    for (int i = 0; i < 3; i++)
        pcr_bus_backend_set(bus, PCR_BUS_CONTROL, i, &d[i]);
    PCR_CHECK_EQ_INT((int)pcr_bus_drain(bus, 0, &w), 4);
    PCR_CHECK(!pcr_bus_backlog(bus, 0));
    static uint32_t tokens[64 * 16];
    static uint64_t hashes[64];
    for (size_t i = 0; i < 64 * 16; i++)
        tokens[i] = 7 + (uint32_t)i;
    for (size_t i = 0; i < 64; i++)
        hashes[i] = 500 + i;
    /* Four events of 16 blocks each, a chain: the second's parent is the first's last. */
    for (int e = 0; e < 4; e++) {
        pcr_kvt_stored_t ev = {hashes + 16 * e, 16, e > 0, e > 0 ? hashes[16 * e - 1] : 0,
                               tokens + 256 * e, 16, PCR_KVT_GPU, 0};
        pcr_bus_kv_stored(bus, 2, &ev, 5);
    }
    const pcr_kvtable_t *t = pcr_policy_kvtable(w);
    PCR_CHECK(pcr_bus_backlog(bus, 0));
    /* 20 blocks' budget: two events (17 each counted), then the rest. */
    PCR_CHECK_EQ_INT((int)pcr_bus_drain_some(bus, 0, &w, 20), 2);
    PCR_CHECK_EQ_INT((int)pcr_kvtable_entries(t, 2, PCR_KVT_GPU), 32);
    PCR_CHECK(pcr_bus_backlog(bus, 0));
    /* A newer update waits behind the two left. */
    pcr_bus_kv_clear(bus, 2);
    PCR_CHECK_EQ_INT((int)pcr_bus_drain_some(bus, 0, &w, 1), 1);
    PCR_CHECK_EQ_INT((int)pcr_kvtable_entries(t, 2, PCR_KVT_GPU), 48);
    PCR_CHECK_EQ_INT((int)pcr_bus_drain_some(bus, 0, &w, 1000), 1);
    PCR_CHECK_EQ_INT((int)pcr_kvtable_entries(t, 2, PCR_KVT_GPU), 64);
    PCR_CHECK(pcr_bus_backlog(bus, 0));
    PCR_CHECK_EQ_INT((int)pcr_bus_drain_some(bus, 0, &w, 1000), 1);
    PCR_CHECK_EQ_INT((int)pcr_kvtable_entries(t, 2, PCR_KVT_GPU), 0);
    PCR_CHECK(!pcr_bus_backlog(bus, 0));
    PCR_CHECK_EQ_INT((int)pcr_bus_drain_some(bus, 0, &w, 1000), 0);
    /* The whole drain takes what a sliced one left, then what came since. */
    pcr_bus_kv_stored(bus, 2, &(pcr_kvt_stored_t){hashes, 16, 0, 0, tokens, 16, PCR_KVT_GPU, 0},
                      6);
    pcr_bus_kv_stored(bus, 2, &(pcr_kvt_stored_t){hashes + 16, 16, 1, hashes[15], tokens + 256,
                                                  16, PCR_KVT_GPU, 0}, 6);
    PCR_CHECK_EQ_INT((int)pcr_bus_drain_some(bus, 0, &w, 1), 1);
    pcr_bus_kv_removed(bus, 2, hashes + 16, 16, PCR_KVT_GPU);
    PCR_CHECK_EQ_INT((int)pcr_bus_drain(bus, 0, &w), 2);
    PCR_CHECK_EQ_INT((int)pcr_kvtable_entries(t, 2, PCR_KVT_GPU), 16);
    PCR_CHECK(!pcr_bus_backlog(bus, 0));
    pcr_policy_free(w);
    pcr_bus_free(bus);
}

/* A tune that changes the keys (another policy, another block size), drained before the
 * control thread's messages that follow it (every slot's membership): the fresh replica still
 * knows its pods and routes. Before, it started empty and every request in between got 404. */
static void test_tune_that_changes_the_keys_keeps_the_pods(void)
{
    pcr_bus_t *bus = pcr_bus_new(1);
    pcr_policy_t *w0 = replica();
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    o.kind = PCR_POLICY_LEAST_LOADED;
    o.block_bytes *= 2;
    pcr_bus_tune(bus, &o);
    PCR_CHECK_EQ_INT(pcr_bus_drain(bus, 0, &w0), 1);
    PCR_CHECK_EQ_INT(pcr_policy_backend_slots(w0), 3);
    pcr_backend_load_t loads[3];
    memset(loads, 0, sizeof(loads));
    loads[2].usable = 1;
    uint64_t blocks[1024];
    pcr_key_t key;
    memset(prompt, 'k', sizeof(prompt) - 1);
    make_key(w0, prompt, &key, blocks);
    pcr_decision_t d;
    PCR_CHECK_EQ_INT(pcr_policy_decide(w0, &key, loads, 1, &d), 0);
    PCR_CHECK_EQ_INT(d.backend, 2);
    pcr_policy_free(w0);
    pcr_bus_free(bus);
}

static int tapped[8];

static void on_tap(const pcr_bus_msg_t *m, void *arg)
{
    if (m->op >= 1 && m->op < 8)
        tapped[m->op]++;
    PCR_CHECK(m->op != PCR_BUS_OP_COMMIT || (m->key->nblocks > 0 && m->arg == 9));
}

static void test_tap_sees_the_workers_updates_only(void)
{
    pcr_bus_t *bus = pcr_bus_new(1);
    pcr_policy_t *w0 = replica();
    uint64_t blocks[1024];
    pcr_key_t key;
    memset(prompt, 'r', sizeof(prompt) - 1);
    make_key(w0, prompt, &key, blocks);
    pcr_bus_commit(bus, 0, 0, &key, 9);
    PCR_CHECK_EQ_INT(pcr_bus_drain_tap(bus, on_tap, NULL), 0); /* off until enabled */
    pcr_bus_enable_tap(bus);
    memset(tapped, 0, sizeof(tapped));
    pcr_bus_commit(bus, 0, 0, &key, 9);
    pcr_bus_state(bus, 0, PCR_BACKEND_RESTARTED, 1);  /* the control thread's own: not tapped */
    PCR_CHECK_EQ_INT(pcr_bus_drain_tap(bus, on_tap, NULL), 1);
    PCR_CHECK_EQ_INT(tapped[PCR_BUS_OP_COMMIT], 1);
    PCR_CHECK_EQ_INT(tapped[PCR_BUS_OP_STATE], 0);
    pcr_policy_free(w0);
    pcr_bus_free(bus);
}

static void test_undrained_inbox_is_bounded(void)
{
    pcr_bus_t *bus = pcr_bus_new(2);
    uint64_t blocks[512];
    memset(blocks, 7, sizeof(blocks));
    pcr_key_t key = {.blocks = blocks, .nblocks = 512, .prompt_tokens = 1};
    /* 4 KiB a message: past PCR_BUS_MAX_BYTES the rest is dropped and counted. */
    size_t n = PCR_BUS_MAX_BYTES / (512 * 8) + 100;
    for (size_t i = 0; i < n; i++)
        pcr_bus_commit(bus, 0, 0, &key, i);
    PCR_CHECK(pcr_bus_dropped(bus) >= 100);
    PCR_CHECK(pcr_bus_dropped(bus) < 200);
    pcr_bus_free(bus);
}

int main(void)
{
    PCR_RUN(test_commit_reaches_the_others_not_the_sender);
    PCR_RUN(test_observe_and_feedback_reach_the_others);
    PCR_RUN(test_control_reaches_every_worker);
    PCR_RUN(test_tune_carries_the_share_margin);
    PCR_RUN(test_tune_carries_the_share_exemption);
    PCR_RUN(test_tune_carries_the_share_reserve);
    PCR_RUN(test_kv_events_reach_every_replica);
    PCR_RUN(test_drain_some_applies_in_slices_in_order);
    PCR_RUN(test_tune_that_changes_the_keys_keeps_the_pods);
    PCR_RUN(test_tap_sees_the_workers_updates_only);
    PCR_RUN(test_undrained_inbox_is_bounded);
    return pcr_test_done();
}
