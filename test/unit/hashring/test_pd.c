/* test_pd.c: hashring/pd.c, the prefill/decode decision (include/pcr/pd.h). */
#include <stdlib.h>

#include "pcr/pd.h"
#include "pcr_test.h"

#define NB 4
/* Pods 0 and 1 prefill, 2 and 3 decode. */
static const pcr_backend_desc_t pods[NB] = {
    {"pre-a", "", 1, 0}, {"pre-b", "", 1, 0}, {"dec-a", "", 1, 0}, {"dec-b", "", 1, 0}};
static const unsigned char roles[NB] = {PCR_ROLE_PREFILL, PCR_ROLE_PREFILL, PCR_ROLE_DECODE,
                                        PCR_ROLE_DECODE};

typedef struct {
    uint64_t blocks[1024];
    pcr_key_t k;
} keybuf_t;

static pcr_key_t *key_of(pcr_policy_t *p, keybuf_t *kb, size_t bytes, char c)
{
    char *s = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        s[i] = (char)(c + (char)(i % 7));
    kb->k = (pcr_key_t){.blocks = kb->blocks};
    pcr_policy_key(p, "m", 1, s, bytes, &kb->k);
    free(s);
    return &kb->k;
}

static pcr_policy_t *make(void)
{
    pcr_policy_opts_t o;
    pcr_policy_opts_default(&o);
    return pcr_policy_new(&o, pods, NB);
}

static void idle(pcr_backend_load_t *l)
{
    memset(l, 0, NB * sizeof(*l));
    for (int b = 0; b < NB; b++)
        l[b].usable = 1;
}

static void test_modes(void)
{
    pcr_policy_t *p = make();
    pcr_pd_opts_t o;
    pcr_pd_opts_default(&o);
    pcr_backend_load_t l[NB], scratch[NB];
    idle(l);
    keybuf_t kb;
    pcr_key_t *long_prompt = key_of(p, &kb, 40000, 'a'); /* 10k tokens, all uncached */
    pcr_pd_decision_t d;
    /* auto, idle pool, a long prompt: prefill remotely; decode on a decode pod. */
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, long_prompt, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_REMOTE);
    PCR_CHECK(d.decode.backend == 2 || d.decode.backend == 3);
    PCR_CHECK(d.prefill.backend == 0 || d.prefill.backend == 1);
    PCR_CHECK(d.remote_us > 0 && d.local_us > 0);
    /* never: local. */
    o.mode = PCR_PD_NEVER;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, long_prompt, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK(d.outcome == PCR_PD_LOCAL_MODE && d.prefill.backend == -1 && d.decode.backend >= 2);
    /* always: remote even for a short prompt. */
    o.mode = PCR_PD_ALWAYS;
    keybuf_t kb2;
    pcr_key_t *short_prompt = key_of(p, &kb2, 400, 'q');
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, short_prompt, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_REMOTE);
    /* auto, a short prompt: stays on the decode pod. */
    o.mode = PCR_PD_AUTO;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, short_prompt, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_LOCAL_CACHED);
    PCR_CHECK_STR(pcr_pd_outcome_name(d.outcome), "local_cached");
    pcr_policy_free(p);
}

/* The decode pod already holds most of the prompt (pulled there before): little is left to
 * prefill, so it stays; with the prefill pods' queues long, a long prefill stays too, where a
 * fixed rule would send it to wait behind them. */
static void test_auto_keeps_the_gain(void)
{
    pcr_policy_t *p = make();
    pcr_pd_opts_t o;
    pcr_pd_opts_default(&o);
    pcr_backend_load_t l[NB], scratch[NB];
    idle(l);
    keybuf_t kb;
    pcr_key_t *k = key_of(p, &kb, 40000, 'c');
    pcr_pd_decision_t d;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &d), 0);
    int dec = d.decode.backend;
    PCR_CHECK_EQ_INT(pcr_policy_commit(p, dec, k, 2, NULL), 0);
    keybuf_t kb2;
    pcr_key_t *next_turn = key_of(p, &kb2, 40400, 'c'); /* the same, 100 tokens longer */
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, next_turn, l, roles, scratch, NB, 3, &d), 0);
    PCR_CHECK_EQ_INT(d.decode.backend, dec);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_LOCAL_CACHED);
    /* Prefill pods each with 200k tokens queued: a new long prompt prefills locally. */
    l[0].queued_prefill = l[1].queued_prefill = 200000;
    l[0].inflight = l[1].inflight = 20;
    keybuf_t kb3;
    pcr_key_t *other = key_of(p, &kb3, 40000, 'x');
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, other, l, roles, scratch, NB, 4, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_LOCAL_BUSY);
    PCR_CHECK(d.remote_us > o.max_ttft_ratio * d.local_us);
    PCR_CHECK_EQ_INT(d.prefill.backend, -1);
    /* The fixed rule sends it there anyway. */
    o.mode = PCR_PD_ALWAYS;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, other, l, roles, scratch, NB, 4, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_REMOTE);
    pcr_policy_free(p);
}

/* A remote prefill's decode leg waits behind the decode pod's queue as a local prefill does:
 * a busy decode pod makes both expected first tokens later by the same time. Not behind
 * what the router holds for that pod: a decode leg prefills nothing and is never held. */
static void test_remote_waits_for_the_decode_queue(void)
{
    pcr_policy_t *p = make();
    pcr_pd_opts_t o;
    pcr_pd_opts_default(&o);
    pcr_backend_load_t l[NB], scratch[NB];
    idle(l);
    keybuf_t kb;
    pcr_key_t *k = key_of(p, &kb, 40000, 'w');
    pcr_pd_decision_t idle_d, busy_d;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &idle_d), 0);
    l[2].queued_prefill = l[3].queued_prefill = 50000;
    l[2].sent_prefill = l[3].sent_prefill = 50000;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &busy_d), 0);
    double dl = busy_d.local_us - idle_d.local_us, dr = busy_d.remote_us - idle_d.remote_us;
    PCR_CHECK(dl > 0);
    PCR_CHECK(dr > dl * 0.99 && dr < dl * 1.01);
    /* Nine tenths of it held in the router: the local prefill waits for all of it, the decode
     * leg for the tenth in the engine. */
    l[2].sent_prefill = l[3].sent_prefill = 5000;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &busy_d), 0);
    double hl = busy_d.local_us - idle_d.local_us, hr = busy_d.remote_us - idle_d.remote_us;
    PCR_CHECK(hl > dl * 0.99 && hl < dl * 1.01);
    PCR_CHECK(hr > dl * 0.099 && hr < dl * 0.101);
    pcr_policy_free(p);
}

/* What a local prefill costs the decode pod's running streams: with the prefill pods' queues
 * long enough that the first token alone would keep a long prompt local, a decode pod running
 * many streams sends it remote all the same, counting its streams as the router does (in
 * flight) or as the pod says (running), whichever is more; with itl_weight 0 (the default),
 * first tokens alone decide again. */
static void test_auto_weighs_the_streams_stalled(void)
{
    pcr_policy_t *p = make();
    pcr_pd_opts_t o;
    pcr_pd_opts_default(&o);
    PCR_CHECK(o.itl_weight == 0);
    o.itl_weight = 0.05;
    pcr_backend_load_t l[NB], scratch[NB];
    idle(l);
    l[0].queued_prefill = l[1].queued_prefill = 20000;
    keybuf_t kb;
    pcr_key_t *k = key_of(p, &kb, 40000, 's'); /* 10k tokens, all uncached */
    pcr_pd_decision_t d;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_LOCAL_BUSY);   /* an idle decode pod: nothing stalls */
    PCR_CHECK(d.itl_us == 0 && d.stall_us > 0);
    double stall = d.stall_us;
    /* The stall is the prefill's own time on the decode pod, whatever is queued there. */
    l[2].queued_prefill = l[3].queued_prefill = 3000;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK(d.stall_us > stall * 0.99 && d.stall_us < stall * 1.01);
    l[2].queued_prefill = l[3].queued_prefill = 0;
    l[2].inflight = l[3].inflight = 20;   /* a few streams: not worth the wait */
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_LOCAL_BUSY);
    PCR_CHECK(d.itl_us > 19.9 * stall && d.itl_us < 20.1 * stall);
    l[2].inflight = l[3].inflight = 60;   /* many: the stall outweighs the later first token */
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_REMOTE);
    PCR_CHECK(d.remote_us > o.max_ttft_ratio * d.local_us);
    PCR_CHECK(d.remote_us <= o.max_ttft_ratio * d.local_us + o.itl_weight * d.itl_us);
    l[2].inflight = l[3].inflight = 0;   /* the pods' own count, when it is the larger */
    l[2].pod_running = l[3].pod_running = 60;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_REMOTE);
    o.itl_weight = 0;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_LOCAL_BUSY);
    pcr_policy_free(p);
}

/* No prefill pod usable: the decode pod prefills (fallback). No decode pod: unavailable. */
static void test_fallbacks(void)
{
    pcr_policy_t *p = make();
    pcr_pd_opts_t o;
    pcr_pd_opts_default(&o);
    pcr_backend_load_t l[NB], scratch[NB];
    keybuf_t kb;
    pcr_key_t *k = key_of(p, &kb, 40000, 'e');
    pcr_pd_decision_t d;
    idle(l);
    l[0].usable = l[1].usable = 0;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &d), 0);
    PCR_CHECK(d.outcome == PCR_PD_FALLBACK && d.decode.backend >= 2 && d.prefill.backend == -1);
    idle(l);
    l[2].usable = l[3].usable = 0;
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, NB, 1, &d), PCR_ERR_UNAVAIL);
    PCR_CHECK_EQ_INT(d.decode.backend, -1);
    /* Pods of role both serve either side. */
    static const unsigned char both[NB] = {0, 0, 0, 0};
    idle(l);
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, both, scratch, NB, 1, &d), 0);
    PCR_CHECK_EQ_INT(d.outcome, PCR_PD_FALLBACK); /* no pod is prefill-only */
    PCR_CHECK_EQ_INT(pcr_pd_decide(p, &o, k, l, roles, scratch, 2, 1, &d), PCR_ERR_INVAL);
    pcr_policy_free(p);
}

int main(void)
{
    PCR_RUN(test_modes);
    PCR_RUN(test_auto_keeps_the_gain);
    PCR_RUN(test_remote_waits_for_the_decode_queue);
    PCR_RUN(test_auto_weighs_the_streams_stalled);
    PCR_RUN(test_fallbacks);
    return pcr_test_done();
}
