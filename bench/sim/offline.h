/* bench/sim/offline.h: routing_offline, a deterministic discrete-event simulator of pcrouter in
 * front of simulated vLLM pods, in virtual time.
 *
 *   offline.c      flags, the workload (prompts synthesised and hashed once), the report
 *   offline_run.c  one run: the router's bookkeeping, the policy, the pods, the event queue
 *
 * The pods are vllm_sim's (kvcache.c and sim_model.c: same cache, same admission, same
 * latency model; with --engine step, step_engine.c, as vllm_sim --engine step); the router is libpcrhash itself, fed the loads pcrouter would count
 * (in-flight requests, their uncached prefill until the first byte, the pods' waiting queues
 * as a scrape last saw them). What it leaves out: network and proxy time (but the round trip
 * to a second zone with --zones), and the wall-clock jitter a time-scaled real run adds. Same
 * inputs, same figures, on any machine. */
#ifndef PCR_BENCH_OFFLINE_H
#define PCR_BENCH_OFFLINE_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "pcr/policy.h"
#include "sim_model.h"
#include "step_engine.h"

/* One request of the workload, prepared once for every run. */
typedef struct {
    double arrival_us;
    size_t prompt_tokens, max_tokens;
    uint64_t *kv;              /* the pod's 16-token block hashes */
    size_t nkv, private_blocks;
    pcr_key_t key;             /* the router's key (blocks owned here) */
    uint64_t head_hash;        /* HAProxy's key: the first 256 bytes of the prompt */
    int bad;                   /* the pods would refuse it (too long): counted as an error */
} off_req_t;

typedef struct {
    off_req_t *reqs;
    size_t n;
} off_work_t;

typedef struct {
    size_t npods;
    uint64_t capacity_tokens;  /* each pod's real KV cache */
    sim_model_t m;
    int step;                  /* --engine step: the pods run step_engine.c, not sim_model.c */
    sim_step_conf_t sc;        /* its configuration */
    double scrape_us;          /* how often the router reads the pods' waiting queues */
    const double *slowdown;    /* NULL, or per pod: its prefill and decode take this many times
                                * m's (a pool of unlike GPUs) */
    double jitter_us;          /* the router sees each time to first byte late by up to this
                                * (uniform, seeded): what a real, time-scaled run adds */
    const char *names;         /* pod i is named names + i: the names place the pods on the
                                * rings, so another prefix is another placement */
    double unstreamed;         /* this fraction of the rows (rt_unstreamed) asks for a whole
                                * answer: no first token for the router to see, so its prefill
                                * leaves the budget at the policy's expected first token, as
                                * pcrouter's prefill timer does; no TTFT, no rate observation */
    FILE *requests;            /* NULL, or one JSON line per finished request is written here
                                * (--requests): the decision, the hold and the first token */
    size_t far_pods;           /* --zones: the last far_pods pods are in zone "b", the router
                                * and the others in zone "a"; 0: no zones (nobody has one) */
    double rtt_us;             /* ... and a request to zone b reaches its pod this late: the
                                * round trip, both ways at once, as vllm_sim --rtt-ms */
} off_setup_t;

/* One routing configuration to simulate. */
typedef struct {
    char label[128];
    int haproxy;               /* HAProxy's body hash with bounded loads instead of a policy */
    pcr_policy_opts_t opts;
    int observe;               /* pass time to first byte to pcr_policy_observe */
    int feedback;              /* pass delivered cached tokens to pcr_policy_feedback */
    double index_capacity;     /* the index believes each pod holds this many times its cache
                                * (misconfigured pods; 1 = told the truth) */
    double hold_tokens;        /* routing.hold_tokens: a pod with this much uncached prefill
                                * sent and not yet at its first token gets no more; the router
                                * holds the rest (pcr/hold.h). 0: off */
    int hold_deps;             /* a held request goes before one that counts on the blocks it
                                * brings (pcr_hold_depends; the router's rule, default on) */
    int hold_unstreamed;       /* unstreamed completions are held as streams are (pcrouter's
                                * rule, default on); off: they go at once, counted the same */
    int zone_aware;            /* with zones: the router knows its zone, "a" (default on); off:
                                * routing.zone unset, every pod alike to the policy */
} off_variant_t;

typedef struct {
    size_t completed, errors;
    size_t completed_streams;  /* of them, streams (the TTFT figures are theirs) */
    size_t due_n;              /* unstreamed completions whose first token was expected */
    double due_err_us, due_abs_err_us; /* sums of (expected - true first token), and of |...| */
    double hit_rate;           /* pods' cached tokens / prompt tokens */
    double predicted_tokens;   /* cached tokens the index predicted on the chosen pods */
    double delivered_tokens;   /* ... the pods delivered */
    double seen_delivered_tokens; /* ... of them within the prefix the index sees */
    double abs_error_tokens;   /* sum of |predicted - seen delivered| per request */
    double prompt_tokens;
    double ttft_p50_ms, ttft_p90_ms, ttft_p99_ms, ttft_mean_ms;
    double share;              /* max/mean requests per pod */
    double work_share;         /* max/mean prompt tokens prefilled per pod */
    double makespan_s;
    uint64_t reasons[PCR_REASON__COUNT];
    /* With --engine step only, what a load generator reports; each as {p50, p90, p99, mean}.
     * ITL: the gaps between a stream's tokens; TPOT: a stream's (last - first token) over
     * its tokens after the first; e2e and output tokens: every completed request's. */
    double itl_ms[4], tpot_ms[4], e2e_ms[4], output_tokens[4];
    double output_tokens_total, output_tokens_per_s, requests_per_s; /* over the makespan */
    uint64_t steps, preemptions;
    /* With zones: completed requests answered from zone b, and bytes both ways (the prompt's
     * 4 bytes per token out, SSE_EVENT_BYTES per output token back) over all and over those. */
    size_t cross_zone_requests;
    double bytes_all, bytes_cross;
} off_result_t;

/* What one streamed token costs on the wire, bytes: a chat.completion.chunk event of
 * vllm_sim's (sim_api.c), about what vLLM writes. Only the byte share uses it. */
#define SSE_EVENT_BYTES 200.0

/* Simulates `w` through `v` on `s`. 0, or -1 when out of memory or when the policy cannot be
 * built (a message on stderr). */
int off_run(const off_work_t *w, const off_setup_t *s, const off_variant_t *v,
            off_result_t *out);

#endif
