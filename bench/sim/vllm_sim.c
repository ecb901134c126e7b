/* bench/sim/vllm_sim.c: vllm-sim, simulated vLLM pods for routing benchmarks and demos.
 *
 * One process, one event loop, one pod per --port (each with its own name, cache, queue and
 * metrics). Prints "vllm-sim: pod NAME listening on HOST:PORT" per pod (the real port when
 * asked for 0), with --kv-events "vllm-sim: pod NAME kv-events tcp://HOST:PORT replay
 * tcp://HOST:PORT" after it, then "vllm-sim: ready". SIGINT/SIGTERM stop it cleanly.
 *
 * Defaults are close to vLLM serving Llama-3-8B in BF16 on one H100 80GB:
 *   KV cache 400k tokens (128 KiB per token; ~52 GB left after weights and activations),
 *   prefill ~14k tokens/s (70 us/token), decode step 12 ms at batch 1 growing 60 us per
 *   running sequence, 15 ms fixed overhead, max_num_seqs 256, max_model_len 131072.
 * With --engine step the pods run in engine steps after vLLM's scheduler instead
 * (step_engine.h; its defaults and their sources are in docs/BENCH_ENGINE.md). */
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <arpa/inet.h>

#include <zmq.h>

#include "sim.h"
#include "sim_kvev.h"

#define MAX_PODS 64

static void usage(FILE *f)
{
    fprintf(f,
"usage: vllm_sim [options]\n"
"  --host ADDR                  bind address (default 127.0.0.1)\n"
"  --port N                     a pod on port N (0: any free port); repeat for more pods\n"
"                               (default one pod on 8000)\n"
"  --name NAME                  name of the pod of the same rank (default pod-0, pod-1, ...)\n"
"  --model NAME                 served model name (default sim-8b)\n"
"  --time-scale F               everything F times faster (default 1)\n"
"  --capacity-tokens N          KV cache size per pod, tokens (default 400000)\n"
"  --max-num-seqs N             running requests at most (default 256)\n"
"  --max-model-len N            prompt + max_tokens at most (default 131072)\n"
"  --prefill-us-per-token F     prefill time per uncached token, us (default 70)\n"
"  --prefill-batch-slowdown F   prefill slower by F per running request (default 0.005)\n"
"  --engine KIND                latency (default: the latency model above) or step: engine\n"
"                               steps after vLLM's scheduler, each carrying every running\n"
"                               stream's next token and prefill chunks up to a budget;\n"
"                               uses --max-num-seqs, --prefill-us-per-token and:\n"
"  --max-num-batched-tokens N   step: tokens per engine step (default 8192)\n"
"  --long-prefill-token-threshold N\n"
"                               step: tokens one request computes in a step at most,\n"
"                               as vLLM's flag (default 0: no limit)\n"
"  --step-base-ms F             step: a step's fixed time, ms (default 7.4)\n"
"  --step-seq-us F              step: time per decoding sequence, us (default 30)\n"
"  --step-kv-ns-per-token F     step: time per context token a sequence reads, ns\n"
"                               (default 39)\n"
"  --scheduling-policy P        fcfs (default) or priority: as vLLM's flag, a request's\n"
"                               integer \"priority\" (lower first, default 0) orders the\n"
"                               waiting queue and a better one preempts worse ones\n"
"                               (bench/README.md says how, per engine); with fcfs a body\n"
"                               with a priority other than 0 gets 400, as from vLLM\n"
"  --overhead-ms F              fixed time to first token, ms (default 15)\n"
"  --itl-ms F                   inter-token latency at batch 1, ms (default 12)\n"
"  --itl-per-seq-us F           inter-token latency added per running request, us (default 60)\n"
"  --rtt-ms F                   a round trip to another zone, ms of model time: every\n"
"                               request reaches the engine this much later, so its first\n"
"                               byte and every write after it come this much later\n"
"                               (default 0)\n"
"  --tick-us N                  shortest wall-clock gap between writes of a stream (default 1000)\n"
"  --fail-rate F                answer this fraction with 500 (default 0)\n"
"  --drop-rate F                close this fraction mid-stream (default 0)\n"
"  --stall-rate F               never answer this fraction (default 0)\n"
"  --seed N                     seed of the fault draws (default 1)\n"
"  --metrics-pad-bytes N        grow /metrics to about N bytes with latency histograms nobody\n"
"                               reads, as a real vLLM page is tens of KiB (default 0: no)\n"
"  --hide-cache-config          leave vllm:cache_config_info out of /metrics, as a pod that\n"
"                               hides its KV capacity (the router then trusts its config)\n"
"  --tokenize-delay-ms F        /tokenize and the render endpoints answer F ms (model time)\n"
"                               late (default 0)\n"
"  --tokenize-threads N         the toy tokenizer's threads, each with the listeners of its\n"
"                               pods (pod i on thread i mod N); 0: none, the main loop\n"
"                               tokenizes (default: one per pod, at most 8)\n"
"  --kv-events PORT             publish vLLM's KV events: pod i on ZMQ PUB tcp://HOST:PORT+2i,\n"
"                               its replay ROUTER on PORT+2i+1 (0: ports the OS picks)\n"
"  --kv-events-encoding E       array (vLLM <= 0.23, default), map (vLLM 0.26 on: events\n"
"                               as maps) or map-batch (the batch a map too, and no topic\n"
"                               in replay answers, as vLLM's kv_events.py at 0181ea31)\n"
"  --kv-events-drop F           leave this fraction of batches unpublished, still in the\n"
"                               replay buffer, so subscribers see gaps (default 0)\n"
"  --foreign-load F             F requests per second (model time) per pod that no router\n"
"                               sent, random prompts through the cache: it evicts in an\n"
"                               order the router cannot guess (default 0)\n"
"  --foreign-tokens N           their prompt length in tokens (default 1024)\n"
"  --capacity-schedule S:F,...  the usable KV cache is F (0 < F <= 1) of the capacity for S\n"
"                               seconds (model time), then the next phase, in a cycle;\n"
"                               shrinking evicts in LRU order (default: no schedule)\n"
"  --role R[,R...]              prefill, decode or both (default), for every pod or one per\n"
"                               pod in --port order: vLLM's NixlConnector pull mode between\n"
"                               the pods of this process (sim_pd.c)\n"
"  --kv-transfer-tokens-per-s F a decode pod pulls a prefill pod's KV blocks at F prompt\n"
"                               tokens per second, model time (default 200000)\n"
"  --kv-transfer-gbps F         the same as F GB/s at 128 KiB per token\n"
"  --kv-advertise-host H        remote_host a prefill pod gives (default: --host), which a\n"
"                               decode pod accepts only as --host\n"
"  POST /sim/restart            (endpoint) the pod dies and comes back empty: connections\n"
"                               cut, cache cleared, KV events restart at 0 with\n"
"                               AllBlocksCleared\n"
"  POST /sim/stall?ms=N         (endpoint, for tests) the main loop, which runs every pod's\n"
"                               streams, does nothing else for N ms; the tokenizers, on\n"
"                               threads of their own, still answer\n"
"  POST /sim/tokenizer/stall?ms=N (endpoint, for tests) the pod's tokenizer thread does\n"
"                               nothing else for N ms, as while it tokenizes a long prompt\n");
}

static int valid_name(const char *s)
{
    if (!*s || strlen(s) > 128)
        return 0;
    for (; *s; s++)
        if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') || ('0' <= *s && *s <= '9') ||
              strchr("._:/-", *s)))
            return 0;
    return 1;
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sim_http_accept(arg, fd);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    event_base_loopbreak(arg);
}

int main(int argc, char **argv)
{
    sim_conf_t conf = {
        .model = "sim-8b", .time_scale = 1, .m = SIM_MODEL_DEFAULTS, .sc = SIM_STEP_DEFAULTS,
        .capacity_tokens = 400000, .max_model_len = 131072,
        .tick_us = 1000, .max_body_bytes = 64u << 20, .foreign_tokens = 1024,
        .tokenize_threads = -1,
        .kv_transfer_tps = 200000,
    };
    int roles[MAX_PODS] = {0}, nroles = 0;
    const char *host = "127.0.0.1";
    int ports[MAX_PODS], nports = 0, nnames = 0;
    const char *names[MAX_PODS];
    uint64_t seed = 1;
    static sim_cap_phase_t cap_sched[PCR_KV_MAX_PHASES];
    conf.cap_sched = cap_sched;
    enum { O_HOST = 256, O_PORT, O_NAME, O_MODEL, O_SCALE, O_CAP, O_SEQS, O_MML, O_PREFILL,
           O_SLOW, O_OVER, O_ITL, O_ITLSEQ, O_TICK, O_FAIL, O_DROP, O_STALL, O_SEED, O_PAD,
           O_HIDE, O_HELP, O_ENGINE, O_MNBT, O_SBASE, O_SSEQ, O_SKV, O_RTT, O_TOKDELAY,
           O_KVEV, O_KVENC, O_KVDROP, O_FOREIGN, O_FTOK, O_CAPSCHED, O_ROLE, O_KVTPS, O_KVGBPS,
           O_KVHOST, O_SCHED, O_TOKTHREADS, O_LPTT };
    static const struct option opts[] = {
        {"host", 1, 0, O_HOST}, {"port", 1, 0, O_PORT}, {"name", 1, 0, O_NAME},
        {"model", 1, 0, O_MODEL}, {"time-scale", 1, 0, O_SCALE},
        {"capacity-tokens", 1, 0, O_CAP}, {"max-num-seqs", 1, 0, O_SEQS},
        {"max-model-len", 1, 0, O_MML}, {"prefill-us-per-token", 1, 0, O_PREFILL},
        {"prefill-batch-slowdown", 1, 0, O_SLOW}, {"overhead-ms", 1, 0, O_OVER},
        {"itl-ms", 1, 0, O_ITL}, {"itl-per-seq-us", 1, 0, O_ITLSEQ}, {"tick-us", 1, 0, O_TICK},
        {"fail-rate", 1, 0, O_FAIL}, {"drop-rate", 1, 0, O_DROP}, {"stall-rate", 1, 0, O_STALL},
        {"seed", 1, 0, O_SEED}, {"metrics-pad-bytes", 1, 0, O_PAD},
        {"hide-cache-config", 0, 0, O_HIDE}, {"help", 0, 0, O_HELP},
        {"engine", 1, 0, O_ENGINE}, {"max-num-batched-tokens", 1, 0, O_MNBT},
        {"step-base-ms", 1, 0, O_SBASE}, {"step-seq-us", 1, 0, O_SSEQ},
        {"step-kv-ns-per-token", 1, 0, O_SKV}, {"rtt-ms", 1, 0, O_RTT},
        {"tokenize-delay-ms", 1, 0, O_TOKDELAY}, {"kv-events", 1, 0, O_KVEV},
        {"kv-events-encoding", 1, 0, O_KVENC}, {"kv-events-drop", 1, 0, O_KVDROP},
        {"foreign-load", 1, 0, O_FOREIGN}, {"foreign-tokens", 1, 0, O_FTOK},
        {"capacity-schedule", 1, 0, O_CAPSCHED}, {"role", 1, 0, O_ROLE},
        {"kv-transfer-tokens-per-s", 1, 0, O_KVTPS}, {"kv-transfer-gbps", 1, 0, O_KVGBPS},
        {"kv-advertise-host", 1, 0, O_KVHOST}, {"scheduling-policy", 1, 0, O_SCHED},
        {"tokenize-threads", 1, 0, O_TOKTHREADS},
        {"long-prefill-token-threshold", 1, 0, O_LPTT},
        {0, 0, 0, 0},
    };
    int o;
    double v;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (o) {
        case O_HOST: host = optarg; break;
        case O_PORT:
            if (nports == MAX_PODS || parse_double(optarg, 0, 65535, &v)) bad = 1;
            else ports[nports++] = (int)v;
            break;
        case O_NAME:
            if (nnames == MAX_PODS || !valid_name(optarg)) bad = 1; else names[nnames++] = optarg;
            break;
        case O_MODEL: if (!valid_name(optarg)) bad = 1; else conf.model = optarg; break;
        case O_SCALE: bad = parse_double(optarg, 1e-3, 1e6, &conf.time_scale); break;
        case O_CAP:
            bad = parse_double(optarg, PCR_KV_BLOCK_TOKENS, 1e10, &v);
            conf.capacity_tokens = (uint64_t)v;
            break;
        case O_SEQS:
            bad = parse_double(optarg, 1, 1e6, &v);
            conf.m.max_num_seqs = conf.sc.max_num_seqs = (unsigned)v;
            break;
        case O_MML: bad = parse_double(optarg, 1, 1e9, &v); conf.max_model_len = (uint64_t)v; break;
        case O_PREFILL:
            bad = parse_double(optarg, 0, 1e7, &conf.m.prefill_us_per_token);
            conf.sc.prefill_us_per_token = conf.m.prefill_us_per_token;
            break;
        case O_ENGINE:
            bad = strcmp(optarg, "step") != 0 && strcmp(optarg, "latency") != 0;
            conf.step = strcmp(optarg, "step") == 0;
            break;
        case O_SCHED:
            bad = strcmp(optarg, "fcfs") != 0 && strcmp(optarg, "priority") != 0;
            conf.sc.priority = strcmp(optarg, "priority") == 0;
            break;
        case O_MNBT:
            bad = parse_double(optarg, 1, 1e7, &v);
            conf.sc.max_batched_tokens = (unsigned)v;
            break;
        case O_LPTT:
            bad = parse_double(optarg, 0, 1e7, &v);
            conf.sc.long_prefill = (unsigned)v;
            break;
        case O_SBASE: bad = parse_double(optarg, 0, 1e6, &v); conf.sc.base_us = v * 1000; break;
        case O_SSEQ: bad = parse_double(optarg, 0, 1e7, &conf.sc.decode_us_per_seq); break;
        case O_RTT: bad = parse_double(optarg, 0, 1e6, &v); conf.rtt_us = v * 1000; break;
        case O_SKV:
            bad = parse_double(optarg, 0, 1e7, &v);
            conf.sc.ctx_us_per_token = v / 1000;
            break;
        case O_SLOW: bad = parse_double(optarg, 0, 1e3, &conf.m.prefill_batch_slowdown); break;
        case O_OVER: bad = parse_double(optarg, 0, 1e7, &conf.m.overhead_ms); break;
        case O_ITL: bad = parse_double(optarg, 0, 1e7, &conf.m.itl_ms); break;
        case O_ITLSEQ: bad = parse_double(optarg, 0, 1e7, &conf.m.itl_per_seq_us); break;
        case O_TICK: bad = parse_double(optarg, 0, 1e7, &v); conf.tick_us = (unsigned)v; break;
        case O_FAIL: bad = parse_double(optarg, 0, 1, &conf.fail_rate); break;
        case O_DROP: bad = parse_double(optarg, 0, 1, &conf.drop_rate); break;
        case O_STALL: bad = parse_double(optarg, 0, 1, &conf.stall_rate); break;
        case O_SEED: bad = parse_double(optarg, 0, 1e18, &v); seed = (uint64_t)v; break;
        case O_PAD:
            bad = parse_double(optarg, 0, 16 << 20, &v);
            conf.metrics_pad_bytes = (size_t)v;
            break;
        case O_HIDE: conf.hide_cache_config = 1; break;
        case O_TOKDELAY:
            bad = parse_double(optarg, 0, 1e7, &v);
            conf.tokenize_delay_us = v * 1000;
            break;
        case O_TOKTHREADS:
            bad = parse_double(optarg, 0, SIM_TOK_THREADS_MAX, &v);
            conf.tokenize_threads = (int)v;
            break;
        case O_KVEV:
            bad = parse_double(optarg, 0, 65535, &v);
            conf.kv_events = 1;
            conf.kv_events_port = (int)v;
            break;
        case O_KVENC:
            bad = strcmp(optarg, "array") != 0 && strcmp(optarg, "map") != 0 &&
                  strcmp(optarg, "map-batch") != 0;
            conf.kv_events_encoding = strcmp(optarg, "map") == 0         ? SIM_KVEV_MAP
                                      : strcmp(optarg, "map-batch") == 0 ? SIM_KVEV_MAP_BATCH
                                                                         : SIM_KVEV_ARRAY;
            break;
        case O_KVDROP: bad = parse_double(optarg, 0, 1, &conf.kv_events_drop); break;
        case O_FOREIGN: bad = parse_double(optarg, 0, 1e6, &conf.foreign_rate); break;
        case O_CAPSCHED: bad = pcr_kvcache_schedule_parse(optarg, cap_sched, &conf.ncap_sched); break;
        case O_FTOK:
            bad = parse_double(optarg, PCR_KV_BLOCK_TOKENS, 1 << 24, &v);
            conf.foreign_tokens = (size_t)v;
            break;
        case O_ROLE: {
            char buf[1024];
            snprintf(buf, sizeof buf, "%s", optarg);
            nroles = 0;
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && !bad;
                 t = strtok_r(NULL, ",", &save)) {
                int role = strcmp(t, "prefill") == 0 ? SIM_ROLE_PREFILL
                           : strcmp(t, "decode") == 0 ? SIM_ROLE_DECODE
                           : strcmp(t, "both") == 0   ? SIM_ROLE_BOTH : -1;
                if (role < 0 || nroles == MAX_PODS)
                    bad = 1;
                else
                    roles[nroles++] = role;
            }
            bad |= nroles == 0;
            break;
        }
        case O_KVTPS: bad = parse_double(optarg, 1, 1e12, &conf.kv_transfer_tps); break;
        case O_KVGBPS:
            bad = parse_double(optarg, 1e-6, 1e6, &v);
            conf.kv_transfer_tps = v * 1e9 / 131072.0;
            break;
        case O_KVHOST: if (!valid_name(optarg)) bad = 1; else conf.kv_advertise_host = optarg; break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "vllm-sim: bad value for --%s: %s\n", opts[o - O_HOST].name, optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "vllm-sim: unexpected argument %s\n", argv[optind]);
        return 2;
    }
    if (nports == 0)
        ports[nports++] = 8000;
    if (nroles > 1 && nroles != nports) {
        fprintf(stderr, "vllm-sim: --role gives %d roles for %d pods (give one, or one per pod)\n",
                nroles, nports);
        return 2;
    }
    conf.host = host;
    if (!conf.kv_advertise_host)
        conf.kv_advertise_host = host;
    if (nnames > nports) {
        fprintf(stderr, "vllm-sim: more --name than --port\n");
        return 2;
    }
    if (conf.kv_events && conf.kv_events_port && conf.kv_events_port + 2 * nports - 1 > 65535) {
        fprintf(stderr, "vllm-sim: --kv-events %d leaves no ports for %d pods\n",
                conf.kv_events_port, nports);
        return 2;
    }
    sim_rand_seed(seed);
    signal(SIGPIPE, SIG_IGN);
    /* What vLLM's /metrics says of its process: a restart shows as a new start time. */
    struct timeval started;
    gettimeofday(&started, NULL);
    conf.start_time = (double)started.tv_sec + started.tv_usec / 1e6;

    int rc = 1;
    struct event_base *base = event_base_new();
    sim_pod_t pods[MAX_PODS];
    memset(pods, 0, sizeof pods);
    struct event *sigint = evsignal_new(base, SIGINT, on_signal, base);
    struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, base);
    void *zctx = conf.kv_events ? zmq_ctx_new() : NULL;
    if (!base || !sigint || !sigterm || (conf.kv_events && !zctx))
        goto out;
    event_add(sigint, NULL);
    event_add(sigterm, NULL);
    /* The toy tokenizer on threads of its own, with the listeners: the main loop, late under
     * load, would make a router waiting for tokens late too. Without them the main loop does
     * everything. */
    if (conf.tokenize_threads < 0)
        conf.tokenize_threads = nports < 8 ? nports : 8;
    if (conf.tokenize_threads > nports)
        conf.tokenize_threads = nports;   /* a thread without a pod would have nothing to do */
    if (conf.tokenize_threads > 0 && sim_tok_init(base, conf.tokenize_threads) != 0) {
        fprintf(stderr, "vllm-sim: no tokenizer thread: the main loop tokenizes\n");
        conf.tokenize_threads = 0;
    }
    for (int i = 0; i < nports; i++) {
        sim_pod_t *pod = &pods[i];
        char dflt[32];
        snprintf(dflt, sizeof dflt, "pod-%d", i);
        pod->conf = &conf;
        pod->base = base;
        pod->index = i;
        pod->name = strdup(i < nnames ? names[i] : dflt);
        pod->start_time = conf.start_time;
        pod->role = nroles == 0 ? SIM_ROLE_BOTH : roles[nroles == 1 ? 0 : i];
        size_t blocks = (size_t)(conf.capacity_tokens / PCR_KV_BLOCK_TOKENS);
        pod->kv = pcr_kvcache_new(blocks);
        if (!pod->name || !pod->kv) {
            fprintf(stderr, "vllm-sim: cannot allocate a cache of %zu blocks\n", blocks);
            goto out;
        }
        if (conf.step) {
            pod->step_timer = evtimer_new(base, sim_engine_on_step, pod);
            if (!pod->step_timer || sim_step_init(&pod->eng, &conf.sc, pod->kv) != 0) {
                fprintf(stderr, "vllm-sim: out of memory\n");
                goto out;
            }
        }
        struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(ports[i]) };
        if (inet_pton(AF_INET, host, &sin.sin_addr) != 1) {
            fprintf(stderr, "vllm-sim: --host must be an IPv4 address: %s\n", host);
            goto out;
        }
        struct event_base *accept_base = sim_tok_base(pod) ? sim_tok_base(pod) : base;
        pod->listener = evconnlistener_new_bind(accept_base, on_accept, pod,
                                                LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE, 1024,
                                                (struct sockaddr *)&sin, sizeof sin);
        if (!pod->listener) {
            fprintf(stderr, "vllm-sim: cannot listen on %s:%d: %s\n", host, ports[i],
                    evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
            goto out;
        }
        socklen_t sl = sizeof sin;
        getsockname(evconnlistener_get_fd(pod->listener), (struct sockaddr *)&sin, &sl);
        pod->port = ntohs(sin.sin_port);
        fprintf(stderr, "vllm-sim: pod %s listening on %s:%d\n", pod->name, host, pod->port);
        if (pod->role != SIM_ROLE_BOTH)
            fprintf(stderr, "vllm-sim: pod %s role %s\n", pod->name, sim_pd_role_name(pod->role));
        if (conf.kv_events) {
            int p = conf.kv_events_port ? conf.kv_events_port + 2 * i : 0;
            pod->kvev = sim_kvev_new(pod, zctx, host, p, p ? p + 1 : 0, conf.kv_events_encoding,
                                     conf.kv_events_drop, seed + (uint64_t)i);
            if (!pod->kvev)
                goto out;
        }
        if ((conf.foreign_rate > 0 && sim_engine_foreign_start(pod, seed + (uint64_t)i) != 0) ||
            (conf.ncap_sched > 0 && sim_engine_capacity_start(pod) != 0)) {
            fprintf(stderr, "vllm-sim: out of memory\n");
            goto out;
        }
    }
    if (conf.tokenize_threads > 0 && sim_tok_run() != 0) {
        fprintf(stderr, "vllm-sim: cannot start the tokenizer's threads\n");
        goto out;
    }
    fprintf(stderr, "vllm-sim: ready (model %s, %d pod%s, capacity %llu tokens, time scale %g, "
            "%s engine, %s scheduling, %d tokenizer thread%s)\n", conf.model, nports,
            nports > 1 ? "s" : "", (unsigned long long)conf.capacity_tokens, conf.time_scale,
            conf.step ? "step" : "latency", conf.sc.priority ? "priority" : "fcfs",
            conf.tokenize_threads, conf.tokenize_threads == 1 ? "" : "s");
    event_base_dispatch(base);
    rc = 0;
out:
    sim_tok_stop(pods, nports);
    for (int i = 0; i < nports; i++) {
        sim_pod_t *pod = &pods[i];
        while (pod->conns)
            sim_conn_close(pod->conns);
        if (pod->listener)
            evconnlistener_free(pod->listener);
        if (pod->step_timer)
            event_free(pod->step_timer);
        sim_engine_foreign_stop(pod);
        sim_engine_capacity_stop(pod);
        sim_kvev_free(pod->kvev);
        sim_step_dispose(&pod->eng);
        pcr_kvcache_free(pod->kv);
        free(pod->name);
    }
    if (sigint) event_free(sigint);
    if (sigterm) event_free(sigterm);
    if (base) event_base_free(base);
    if (zctx) zmq_ctx_term(zctx);
    return rc;
}
