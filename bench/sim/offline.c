/* bench/sim/offline.c: routing_offline's command line, workload and report (see offline.h).
 *
 * It reads a Mooncake trace as replay does (replay_trace.c: same rows, same synthesised
 * prompts), hashes every prompt once for the pods and once for the router, computes the same
 * LRU ceiling, then simulates each policy and each --variant of cache_aware in turn and prints
 * one table (and --json). A run of the 12k-request conversation trace takes seconds, so a
 * sweep over knobs fits where real runs would take hours. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "offline.h"
#include "pcr/hold.h"
#include "replay_trace.h"

#define MAX_VARIANTS 256
#define MAX_MODEL_LEN 131072   /* vllm_sim's default --max-model-len */
#define MODEL "sim-8b"         /* what replay sends: the router seeds keys with it */

static void usage(FILE *f)
{
    fprintf(f,
"usage: routing_offline --trace FILE [options]\n"
"  --trace FILE          Mooncake JSONL trace (as replay reads it)\n"
"  --limit N             first N rows only (default all)\n"
"  --pods N              simulated pods (default 8)\n"
"  --capacity-tokens N   KV cache per pod, tokens (default 1000000)\n"
"  --max-tokens-cap N    max_tokens = min(output_length, N) (default 4096)\n"
"  --slowdown F,F,...    pod i prefills and decodes F times slower (default all 1)\n"
"  --names PREFIX        pod i is named PREFIX<i> (default pod-): the names place the pods\n"
"                        on the consistent-hash rings, so another prefix samples another\n"
"                        placement\n"
"  --jitter-ms F         the router sees each first byte up to F ms late (uniform, seeded;\n"
"                        default 0), so learns the pods' rates from later times and sends\n"
"                        held requests that much later: a real run's network and\n"
"                        scheduling, in model time\n"
"  --engine KIND         latency (default: the pods' latency model, sim_model.c) or step\n"
"                        (the pods run in engine steps after vLLM's scheduler,\n"
"                        step_engine.c, and the report adds inter-token latency, time per\n"
"                        output token, end to end, output tokens and throughput)\n"
"  --max-num-batched-tokens N  step: tokens per engine step (default 8192)\n"
"  --max-num-seqs N      running requests per pod at most (default 256)\n"
"  --prefill-us-per-token F  prefill time per uncached token, us (default 70)\n"
"  --step-base-ms F      step: a step's fixed time, ms (default 7.4)\n"
"  --step-seq-us F       step: time per decoding sequence, us (default 30)\n"
"  --step-kv-ns-per-token F  step: time per context token a sequence reads, ns (default\n"
"                        39)\n"
"  --unstreamed F        this fraction of the rows asks for a whole answer (\"stream\":\n"
"                        false), the same rows as replay --unstreamed picks: its prefill\n"
"                        leaves the hold budget at the policy's expected first token (as\n"
"                        pcrouter's prefill timer), or at its answer if that is earlier;\n"
"                        TTFT counts streams only (default 0)\n"
"  --zones RTT_MS        pods in two zones, as bench/routing.py --zones: the router and the\n"
"                        first pods in zone a, the last --far-pods in zone b, which a request\n"
"                        reaches RTT_MS later (its round trip, as vllm_sim --rtt-ms), so its\n"
"                        first token and its end are that much later; the report adds the\n"
"                        share of requests and bytes that crossed zones (default 0: no zones)\n"
"  --far-pods N          pods in zone b with --zones (default half, rounded down)\n"
"  --scrape-ms F         model time between two reads of the pods' queues (default 20000:\n"
"                        pcrouter's 1 s health interval in a real run at time scale 20)\n"
"  --policies LIST       of round_robin,least_loaded,consistent_hash,cache_aware,haproxy_hash\n"
"                        (default all five)\n"
"  --routing JSON        routing keys for every pcrouter policy, as in the config\n"
"                        (load_factor, load_weight, ...), plus \"observe\", \"feedback\"\n"
"                        (booleans; feedback defaults to true, as in the config),\n"
"                        \"index_capacity\" (the index believes a pod holds\n"
"                        this many times its cache), \"hold_tokens\" (as in the\n"
"                        config, default 20480; HAProxy never holds) and \"hold_deps\"\n"
"                        (boolean, default true: a held request goes before one that\n"
"                        counts on the blocks it brings, as pcrouter does) and\n"
"                        \"hold_unstreamed\" (boolean, default true, as pcrouter; false: an\n"
"                        unstreamed completion goes at once, counted as it is when held)\n"
"                        and \"zone_aware\" (boolean, default true; with --zones, false leaves\n"
"                        the router's zone unset: zone-blind)\n"
"  --variant LABEL={...} also run cache_aware with these keys over --routing (repeatable)\n"
"  --json FILE           write every result as JSON\n"
"  --requests FILE       write one JSON line per finished request (every policy's, labelled):\n"
"                        its pod and route, matched blocks, uncached prefill, cached tokens,\n"
"                        time held at the router, prefill ahead at its send, TTFT and end to\n"
"                        end, in ms of model time (as pcrouter's access log, for comparing)\n"
"Columns: pred/del is the cached tokens the index predicted over those the pods delivered\n"
"within the prefix it sees (max_prefix_bytes); |error| the mean per-request difference\n"
"over the prompt tokens.\n"
"  --quiet               no table\n");
}

/* ---- routing keys ------------------------------------------------------------------------- */

static int num_key(const cJSON *o, const char *k, double lo, double hi, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi) {
        fprintf(stderr, "routing_offline: \"%s\" must be a number in [%g, %g]\n", k, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

static int bool_key(const cJSON *o, const char *k, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v)
        return 0;
    if (!cJSON_IsBool(v)) {
        fprintf(stderr, "routing_offline: \"%s\" must be true or false\n", k);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

/* The numeric routing keys, as the config names them, and their ranges. */
static const struct {
    const char *key;
    size_t off;                /* a double in pcr_policy_opts_t */
    double lo, hi;
} num_keys[] = {
    {"load_factor", offsetof(pcr_policy_opts_t, load_factor), 1, 100},
    {"inflight_factor", offsetof(pcr_policy_opts_t, inflight_factor), 1, 100},
    {"load_weight", offsetof(pcr_policy_opts_t, load_weight), 0, 1000},
    {"load_scale", offsetof(pcr_policy_opts_t, load_scale), 0, 1e12},
    {"share_factor", offsetof(pcr_policy_opts_t, share_factor), 0, 100},
    {"share_penalty", offsetof(pcr_policy_opts_t, share_penalty), 0, 1e9},
    {"share_exempt_tokens", offsetof(pcr_policy_opts_t, share_exempt_tokens), 0, 1e12},
    {"share_reserve", offsetof(pcr_policy_opts_t, share_reserve), 0, 1},
    {"share_reserve_tokens", offsetof(pcr_policy_opts_t, share_reserve_tokens), 0, 1e12},
    {"zone_penalty", offsetof(pcr_policy_opts_t, zone_penalty), 0, 1e9},
    {"prefill_us_per_token", offsetof(pcr_policy_opts_t, prefill_us_per_token), 1e-3, 1e6},
    {"ttft_overhead_us", offsetof(pcr_policy_opts_t, ttft_overhead_us), 0, 1e8},
};

/* What the router does with no routing keys: the library's options, an index told the truth,
 * feedback on, streams held at routing.hold_tokens' default. */
static void variant_defaults(off_variant_t *v)
{
    pcr_policy_opts_default(&v->opts);
    v->index_capacity = 1;
    v->feedback = 1;
    v->hold_tokens = PCR_HOLD_TOKENS_DEFAULT;
    v->hold_deps = 1;
    v->hold_unstreamed = 1;
    v->zone_aware = 1;
}

/* Applies the keys of `json` to `v`. 0, or -1 with a message. */
static int apply_routing(off_variant_t *v, const char *json)
{
    static const char *const other[] = {"vnodes", "observe", "feedback", "index_capacity",
                                        "hold_tokens", "hold_deps", "hold_unstreamed",
                                        "zone_aware"};
    cJSON *o = cJSON_Parse(json);
    int rc = -1;
    if (!cJSON_IsObject(o)) {
        fprintf(stderr, "routing_offline: not a JSON object: %s\n", json);
        goto out;
    }
    for (const cJSON *c = o->child; c; c = c->next) {
        int known = 0;
        for (size_t k = 0; k < sizeof num_keys / sizeof num_keys[0]; k++)
            known |= strcmp(num_keys[k].key, c->string) == 0;
        for (size_t k = 0; k < sizeof other / sizeof other[0]; k++)
            known |= strcmp(other[k], c->string) == 0;
        if (!known) {
            fprintf(stderr, "routing_offline: unknown routing key \"%s\"\n", c->string);
            goto out;
        }
    }
    for (size_t k = 0; k < sizeof num_keys / sizeof num_keys[0]; k++)
        if (num_key(o, num_keys[k].key, num_keys[k].lo, num_keys[k].hi,
                    (double *)((char *)&v->opts + num_keys[k].off)))
            goto out;
    double vnodes = v->opts.vnodes;
    if (num_key(o, "vnodes", 1, 10000, &vnodes) ||
        num_key(o, "index_capacity", 0.001, 1000, &v->index_capacity) ||
        num_key(o, "hold_tokens", 0, 4294967295.0, &v->hold_tokens) ||
        bool_key(o, "observe", &v->observe) || bool_key(o, "feedback", &v->feedback) ||
        bool_key(o, "hold_deps", &v->hold_deps) ||
        bool_key(o, "hold_unstreamed", &v->hold_unstreamed) ||
        bool_key(o, "zone_aware", &v->zone_aware))
        goto out;
    v->opts.vnodes = (unsigned)vnodes;
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

/* ---- the workload ------------------------------------------------------------------------- */

static int prepare(off_work_t *w, const rt_trace_t *t, size_t cap, uint64_t capacity_tokens)
{
    pcr_policy_opts_t o;
    pcr_backend_desc_t one = {"x", "", 1, 0};
    pcr_policy_opts_default(&o);
    pcr_policy_t *p = pcr_policy_new(&o, &one, 1);
    w->reqs = calloc(t->n ? t->n : 1, sizeof(*w->reqs));
    w->n = t->n;
    if (!p || !w->reqs)
        goto oom;
    size_t kv_capacity = (size_t)(capacity_tokens / PCR_KV_BLOCK_TOKENS);
    for (size_t i = 0; i < t->n; i++) {
        off_req_t *r = &w->reqs[i];
        size_t len;
        char *text = rt_prompt(t, i, &len);
        if (!text)
            goto oom;
        r->arrival_us = (t->rows[i].timestamp_ms - t->rows[0].timestamp_ms) * 1000.0;
        r->prompt_tokens = (len + PCR_KV_TOKEN_BYTES - 1) / PCR_KV_TOKEN_BYTES;
        size_t mt = t->rows[i].output_length < cap ? t->rows[i].output_length : cap;
        r->max_tokens = mt ? mt : 1;
        r->nkv = len / PCR_KV_BLOCK_BYTES;
        r->kv = malloc((r->nkv ? r->nkv : 1) * sizeof(uint64_t));
        r->key.blocks = malloc(pcr_policy_max_blocks(p) * sizeof(uint64_t));
        if (!r->kv || !r->key.blocks) {
            free(text);
            goto oom;
        }
        pcr_kvcache_hash_prompt(text, len, 0, r->kv, r->nkv);
        r->private_blocks = sim_model_private_blocks(r->prompt_tokens, r->nkv, r->max_tokens);
        r->bad = r->prompt_tokens + r->max_tokens > MAX_MODEL_LEN ||
                 r->nkv + r->private_blocks > kv_capacity;
        pcr_policy_key(p, MODEL, strlen(MODEL), text, len, &r->key);
        r->head_hash = XXH3_64bits(text, len < 256 ? len : 256);
        free(text);
    }
    pcr_policy_free(p);
    return 0;
oom:
    pcr_policy_free(p);
    fprintf(stderr, "routing_offline: out of memory\n");
    return -1;
}

static void work_dispose(off_work_t *w)
{
    for (size_t i = 0; w->reqs && i < w->n; i++) {
        free(w->reqs[i].kv);
        free(w->reqs[i].key.blocks);
    }
    free(w->reqs);
}

/* ---- the report --------------------------------------------------------------------------- */

/* --engine step: the row adds what a load generator reports. */
static void print_step_row(const off_variant_t *v, const off_result_t *r, double ceiling)
{
    printf("%-22s %8.4f %7.3f %9.0fms %9.0fms %9.0fms %7.1fms %7.1fms %9.0f %8.2f %6llu %6zu\n",
           v->label, r->hit_rate, r->hit_rate / ceiling, r->ttft_p50_ms, r->ttft_p99_ms,
           r->ttft_mean_ms, r->itl_ms[3], r->itl_ms[2], r->output_tokens_per_s, r->share,
           (unsigned long long)r->preemptions, r->errors);
    fflush(stdout);
}

/* --zones: under the row, what crossed to zone b. */
static void print_zones(const off_result_t *r)
{
    printf("  crossed zones: %.3f of requests, %.3f of bytes\n",
           r->completed ? (double)r->cross_zone_requests / (double)r->completed : NAN,
           r->bytes_all > 0 ? r->bytes_cross / r->bytes_all : NAN);
    fflush(stdout);
}

static void print_row(const off_variant_t *v, const off_result_t *r, double ceiling)
{
    printf("%-22s %8.4f %7.3f %9.0fms %9.0fms %8.2f %8.3f %8.3f %6zu\n", v->label,
           r->hit_rate, r->hit_rate / ceiling, r->ttft_p50_ms, r->ttft_p99_ms, r->share,
           r->seen_delivered_tokens > 0 ? r->predicted_tokens / r->seen_delivered_tokens : NAN,
           r->prompt_tokens > 0 ? r->abs_error_tokens / r->prompt_tokens : NAN, r->errors);
    fflush(stdout);
}

static cJSON *result_json(const off_variant_t *v, const off_result_t *r, double ceiling,
                          int step, int zones)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "label", v->label);
    cJSON_AddNumberToObject(j, "completed", (double)r->completed);
    cJSON_AddNumberToObject(j, "errors", (double)r->errors);
    cJSON_AddNumberToObject(j, "completed_streams", (double)r->completed_streams);
    cJSON_AddNumberToObject(j, "hit_rate", r->hit_rate);
    cJSON_AddNumberToObject(j, "ceiling", ceiling);
    cJSON_AddNumberToObject(j, "fraction_of_ceiling", r->hit_rate / ceiling);
    cJSON_AddNumberToObject(j, "share_max_over_mean", r->share);
    cJSON_AddNumberToObject(j, "work_max_over_mean", r->work_share);
    cJSON_AddNumberToObject(j, "predicted_tokens", r->predicted_tokens);
    cJSON_AddNumberToObject(j, "delivered_tokens", r->delivered_tokens);
    cJSON_AddNumberToObject(j, "seen_delivered_tokens", r->seen_delivered_tokens);
    cJSON_AddNumberToObject(j, "prompt_tokens", r->prompt_tokens);
    cJSON_AddNumberToObject(j, "abs_error_tokens", r->abs_error_tokens);
    cJSON_AddNumberToObject(j, "makespan_s", r->makespan_s);
    cJSON *t = cJSON_AddObjectToObject(j, "ttft_ms_model");
    cJSON_AddNumberToObject(t, "p50", r->ttft_p50_ms);
    cJSON_AddNumberToObject(t, "p90", r->ttft_p90_ms);
    cJSON_AddNumberToObject(t, "p99", r->ttft_p99_ms);
    cJSON_AddNumberToObject(t, "mean", r->ttft_mean_ms);
    if (r->due_n > 0) {   /* --unstreamed: the expected first token against the true one */
        cJSON *e = cJSON_AddObjectToObject(j, "expected_first_token_error_ms");
        cJSON_AddNumberToObject(e, "mean", r->due_err_us / (double)r->due_n / 1000.0);
        cJSON_AddNumberToObject(e, "mean_abs", r->due_abs_err_us / (double)r->due_n / 1000.0);
    }
    if (step) {
        /* Each figure as {p50, p90, p99, mean}, then the ones a table quotes, flat. */
        static const char *const q[4] = {"p50", "p90", "p99", "mean"};
        const struct {
            const char *name;
            const double *v;
        } f[] = {{"itl_ms_model", r->itl_ms}, {"tpot_ms_model", r->tpot_ms},
                 {"e2e_ms_model", r->e2e_ms}, {"output_tokens", r->output_tokens}};
        for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
            cJSON *o = cJSON_AddObjectToObject(j, f[k].name);
            for (int p = 0; p < 4; p++)
                cJSON_AddNumberToObject(o, q[p], f[k].v[p]);
        }
        cJSON_AddNumberToObject(j, "output_tokens_total", r->output_tokens_total);
        cJSON_AddNumberToObject(j, "output_tokens_per_s", r->output_tokens_per_s);
        cJSON_AddNumberToObject(j, "requests_per_s", r->requests_per_s);
        cJSON_AddNumberToObject(j, "ttft_mean_ms", r->ttft_mean_ms);
        cJSON_AddNumberToObject(j, "ttft_p99_ms", r->ttft_p99_ms);
        cJSON_AddNumberToObject(j, "itl_mean_ms", r->itl_ms[3]);
        cJSON_AddNumberToObject(j, "itl_p99_ms", r->itl_ms[2]);
        cJSON_AddNumberToObject(j, "tpot_mean_ms", r->tpot_ms[3]);
        cJSON_AddNumberToObject(j, "steps", (double)r->steps);
        cJSON_AddNumberToObject(j, "preemptions", (double)r->preemptions);
    }
    if (zones) {   /* as replay --far-pods names them */
        cJSON_AddNumberToObject(j, "cross_zone_requests", (double)r->cross_zone_requests);
        cJSON_AddNumberToObject(j, "cross_zone_request_share",
                                r->completed ? (double)r->cross_zone_requests /
                                                   (double)r->completed : 0);
        cJSON_AddNumberToObject(j, "cross_zone_byte_share",
                                r->bytes_all > 0 ? r->bytes_cross / r->bytes_all : 0);
    }
    cJSON *rs = cJSON_AddObjectToObject(j, "reasons");
    for (int k = 0; k < PCR_REASON__COUNT; k++)
        if (r->reasons[k])
            cJSON_AddNumberToObject(rs, pcr_reason_name((pcr_reason_t)k), (double)r->reasons[k]);
    return j;
}

static int parse_count(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *trace = NULL, *json = NULL, *routing = "{}", *requests = NULL;
    const char *policies = "round_robin,least_loaded,consistent_hash,cache_aware,haproxy_hash";
    const char *variants[MAX_VARIANTS];
    size_t nvariants = 0, limit = 0;
    double cap = 4096, v;
    int quiet = 0;
    off_setup_t s = {.npods = 8, .capacity_tokens = 1000000, .m = SIM_MODEL_DEFAULTS,
                     .sc = SIM_STEP_DEFAULTS, .scrape_us = 20e6, .names = "pod-"};
    enum { O_TRACE = 256, O_LIMIT, O_PODS, O_CAP, O_MTC, O_SCRAPE, O_POL, O_ROUT, O_VAR,
           O_JSON, O_QUIET, O_HELP, O_SLOW, O_JITTER, O_NAMES, O_UNSTREAMED, O_REQS, O_ENGINE,
           O_MNBT, O_MNS, O_PREFILL, O_SBASE, O_SSEQ, O_SKV, O_ZONES, O_FAR };
    const char *slowdown = NULL;
    double rtt_ms = 0, far = -1;
    static const struct option opts[] = {
        {"trace", 1, 0, O_TRACE}, {"limit", 1, 0, O_LIMIT}, {"pods", 1, 0, O_PODS},
        {"capacity-tokens", 1, 0, O_CAP}, {"max-tokens-cap", 1, 0, O_MTC},
        {"scrape-ms", 1, 0, O_SCRAPE}, {"policies", 1, 0, O_POL}, {"routing", 1, 0, O_ROUT},
        {"variant", 1, 0, O_VAR}, {"json", 1, 0, O_JSON}, {"quiet", 0, 0, O_QUIET},
        {"help", 0, 0, O_HELP}, {"slowdown", 1, 0, O_SLOW}, {"jitter-ms", 1, 0, O_JITTER},
        {"names", 1, 0, O_NAMES}, {"unstreamed", 1, 0, O_UNSTREAMED},
        {"requests", 1, 0, O_REQS}, {"engine", 1, 0, O_ENGINE},
        {"max-num-batched-tokens", 1, 0, O_MNBT}, {"max-num-seqs", 1, 0, O_MNS},
        {"prefill-us-per-token", 1, 0, O_PREFILL}, {"step-base-ms", 1, 0, O_SBASE},
        {"step-seq-us", 1, 0, O_SSEQ}, {"step-kv-ns-per-token", 1, 0, O_SKV},
        {"zones", 1, 0, O_ZONES}, {"far-pods", 1, 0, O_FAR}, {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (o) {
        case O_TRACE: trace = optarg; break;
        case O_LIMIT: bad = parse_count(optarg, 0, 1e9, &v); limit = (size_t)v; break;
        case O_PODS: bad = parse_count(optarg, 1, 4096, &v); s.npods = (size_t)v; break;
        case O_CAP:
            bad = parse_count(optarg, 1024, 1e10, &v);
            s.capacity_tokens = (uint64_t)v;
            break;
        case O_MTC: bad = parse_count(optarg, 1, 1e6, &cap); break;
        case O_SCRAPE: bad = parse_count(optarg, 1, 1e9, &v); s.scrape_us = v * 1000; break;
        case O_POL: policies = optarg; break;
        case O_ROUT: routing = optarg; break;
        case O_VAR:
            bad = nvariants == MAX_VARIANTS || !strstr(optarg, "={");
            if (!bad)
                variants[nvariants++] = optarg;
            break;
        case O_JSON: json = optarg; break;
        case O_REQS: requests = optarg; break;
        case O_SLOW: slowdown = optarg; break;
        case O_JITTER: bad = parse_count(optarg, 0, 1e6, &v); s.jitter_us = v * 1000; break;
        case O_NAMES:
            bad = strlen(optarg) == 0 || strlen(optarg) > 64;
            s.names = optarg;
            break;
        case O_UNSTREAMED: bad = parse_count(optarg, 0, 1, &s.unstreamed); break;
        case O_ENGINE:
            bad = strcmp(optarg, "step") != 0 && strcmp(optarg, "latency") != 0;
            s.step = strcmp(optarg, "step") == 0;
            break;
        case O_MNBT:
            bad = parse_count(optarg, 1, 1e7, &v);
            s.sc.max_batched_tokens = (unsigned)v;
            break;
        case O_MNS:
            bad = parse_count(optarg, 1, 1e6, &v);
            s.sc.max_num_seqs = s.m.max_num_seqs = (unsigned)v;
            break;
        case O_PREFILL:
            bad = parse_count(optarg, 0, 1e7, &s.m.prefill_us_per_token);
            s.sc.prefill_us_per_token = s.m.prefill_us_per_token;
            break;
        case O_SBASE: bad = parse_count(optarg, 0, 1e6, &v); s.sc.base_us = v * 1000; break;
        case O_SSEQ: bad = parse_count(optarg, 0, 1e7, &s.sc.decode_us_per_seq); break;
        case O_SKV: bad = parse_count(optarg, 0, 1e7, &v); s.sc.ctx_us_per_token = v / 1000; break;
        case O_ZONES: bad = parse_count(optarg, 0, 1e6, &rtt_ms); break;
        case O_FAR: bad = parse_count(optarg, 1, 4096, &far); break;
        case O_QUIET: quiet = 1; break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "routing_offline: bad value for --%s: %s\n", opts[o - O_TRACE].name,
                    optarg);
            return 2;
        }
    }
    if (!trace || optind < argc) {
        usage(stderr);
        return 2;
    }

    if (rtt_ms > 0) {
        s.far_pods = far >= 0 ? (size_t)far : s.npods / 2;
        s.rtt_us = rtt_ms * 1000;
        if (s.far_pods == 0 || s.far_pods >= s.npods) {
            fprintf(stderr, "routing_offline: --zones needs pods in both zones (--pods, "
                            "--far-pods)\n");
            return 2;
        }
    } else if (far >= 0) {
        fprintf(stderr, "routing_offline: --far-pods goes with --zones\n");
        return 2;
    }

    double *slow = NULL;
    if (slowdown) {
        slow = calloc(s.npods, sizeof(*slow));
        char *copy = strdup(slowdown), *sv = NULL, *tok = copy ? strtok_r(copy, ",", &sv) : NULL;
        for (size_t b = 0; slow && b < s.npods; b++) {
            if (tok && parse_count(tok, 0.01, 100, &slow[b]) != 0) {
                fprintf(stderr, "routing_offline: bad --slowdown value %s\n", tok);
                free(copy);
                free(slow);
                return 2;
            }
            if (!tok)
                slow[b] = 1;
            if (tok)
                tok = strtok_r(NULL, ",", &sv);
        }
        free(copy);
        s.slowdown = slow;
    }

    /* Every run to make: the listed policies, then the variants. */
    size_t nruns = 0;
    off_variant_t *runs = calloc(MAX_VARIANTS + 8, sizeof(*runs));
    char *list = strdup(policies), *save = NULL;
    int rc = 2;
    if (!runs || !list)
        goto out;
    for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        off_variant_t *r = &runs[nruns];
        variant_defaults(r);
        snprintf(r->label, sizeof r->label, "%s", name);
        if (strcmp(name, "haproxy_hash") == 0) {
            r->haproxy = 1;
            r->hold_tokens = 0;   /* HAProxy sends at once */
        } else if (pcr_policy_kind_parse(name, &r->opts.kind) != 0) {
            fprintf(stderr, "routing_offline: unknown policy %s\n", name);
            goto out;
        }
        if (apply_routing(r, routing) != 0)
            goto out;
        if (++nruns == 8)
            break;
    }
    for (size_t k = 0; k < nvariants; k++) {
        off_variant_t *r = &runs[nruns++];
        const char *eq = strstr(variants[k], "={");
        variant_defaults(r);
        snprintf(r->label, sizeof r->label, "%.*s", (int)(eq - variants[k]), variants[k]);
        if (apply_routing(r, routing) != 0 || apply_routing(r, eq + 1) != 0)
            goto out;
    }

    rt_trace_t t;
    off_work_t w = {0};
    rc = 1;
    if (rt_trace_load(&t, trace, 0, limit) != 0)
        goto out;
    uint64_t ch, cq;
    double ceiling = rt_ceiling(&t, s.capacity_tokens * s.npods, NULL, 0, &ch, &cq);
    if (ceiling < 0 || prepare(&w, &t, (size_t)cap, s.capacity_tokens) != 0) {
        rt_trace_dispose(&t);
        work_dispose(&w);
        goto out;
    }
    rt_trace_dispose(&t);
    if (!quiet) {
        printf("routing_offline: %s, %zu requests, %zu pods x %llu tokens, ceiling %.4f\n",
               trace, w.n, s.npods, (unsigned long long)s.capacity_tokens, ceiling);
        if (s.step)
            printf("%-22s %8s %7s %11s %11s %11s %9s %9s %9s %8s %6s %6s\n", "policy",
                   "hit rate", "of ceil", "TTFT p50", "TTFT p99", "TTFT mean", "ITL mean",
                   "ITL p99", "out tok/s", "max/mean", "preempt", "errors");
        else
            printf("%-22s %8s %7s %11s %11s %8s %8s %8s %6s\n", "policy", "hit rate",
                   "of ceil", "TTFT p50", "TTFT p99", "max/mean", "pred/del", "|error|",
                   "errors");
    }
    cJSON *all = cJSON_CreateObject();
    cJSON_AddStringToObject(all, "trace", trace);
    cJSON_AddNumberToObject(all, "requests", (double)w.n);
    cJSON_AddNumberToObject(all, "pods", (double)s.npods);
    cJSON_AddNumberToObject(all, "capacity_tokens", (double)s.capacity_tokens);
    cJSON_AddNumberToObject(all, "ceiling", ceiling);
    if (s.step)
        cJSON_AddStringToObject(all, "engine", "step");
    if (s.far_pods > 0) {
        cJSON_AddNumberToObject(all, "far_pods", (double)s.far_pods);
        cJSON_AddNumberToObject(all, "rtt_ms", rtt_ms);
    }
    cJSON *arr = cJSON_AddArrayToObject(all, "results");
    rc = 0;
    if (requests != NULL && (s.requests = fopen(requests, "w")) == NULL) {
        fprintf(stderr, "routing_offline: cannot write %s\n", requests);
        rc = 1;
        nruns = 0;
    }
    for (size_t k = 0; k < nruns; k++) {
        off_result_t res;
        if (off_run(&w, &s, &runs[k], &res) != 0) {
            rc = 1;
            continue;
        }
        if (!quiet && s.step)
            print_step_row(&runs[k], &res, ceiling);
        else if (!quiet)
            print_row(&runs[k], &res, ceiling);
        if (!quiet && s.far_pods > 0)
            print_zones(&res);
        cJSON_AddItemToArray(arr, result_json(&runs[k], &res, ceiling, s.step, s.far_pods > 0));
    }
    if (s.requests != NULL && (ferror(s.requests) | fclose(s.requests)) != 0) {
        fprintf(stderr, "routing_offline: cannot write %s\n", requests);
        rc = 1;
    }
    if (json) {
        char *text = cJSON_Print(all);
        FILE *f = fopen(json, "w");
        int werr = !f || !text || fputs(text, f) < 0;
        if ((f && fclose(f) != 0) || werr) {
            fprintf(stderr, "routing_offline: cannot write %s\n", json);
            rc = 1;
        }
        cJSON_free(text);
    }
    cJSON_Delete(all);
    work_dispose(&w);
out:
    free(list);
    free(runs);
    free(slow);
    return rc;
}
