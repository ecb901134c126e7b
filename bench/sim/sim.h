/* bench/sim/sim.h: the types vllm-sim's files share (one process, 1..N pods, one event loop
 * for every pod's engine and streams, and --tokenize-threads for the toy tokenizer).
 *
 *   vllm_sim.c    flags, pods, listeners, signals, main
 *   sim_http.c    HTTP/1.1 connections (http-parser), routing of paths, writing responses
 *   sim_api.c     OpenAI bodies in (cJSON) and out, /metrics text, /v1/models
 *   sim_engine.c  the pod's scheduler: FIFO admission, KV cache, latency model, token emission;
 *                 with --engine step, engine steps on a timer instead (step_engine.c); the
 *                 pod's restart, --foreign-load and --capacity-schedule
 *   kvcache.c     the prefix cache (shared with the replayer's ceiling)
 *   sim_model.c   the latency model and admission rule (shared with routing_offline)
 *   step_engine.c the step engine after vLLM's scheduler (shared with routing_offline)
 *   sim_kvev.c    --kv-events: the pod's KV-cache events on ZMQ, as vLLM publishes them
 *   sim_pd.c      --role prefill|decode: vLLM's NixlConnector pull mode between its pods
 *   sim_tok.c     the toy tokenizer's threads: connections that ask for /tokenize or a render
 *                 endpoint move to their pod's tokenizer loop
 *
 * Every duration in sim_conf_t is model time (what a real pod would take); the engine divides
 * by time_scale to get wall-clock time. */
#ifndef PCR_BENCH_SIM_H
#define PCR_BENCH_SIM_H

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <http_parser.h>
#include <stdint.h>

#include "kvcache.h"
#include "sim_model.h"
#include "step_engine.h"

typedef pcr_kvcache_phase_t sim_cap_phase_t;   /* --capacity-schedule's phases (kvcache.h) */

enum { SIM_ROLE_BOTH = 0, SIM_ROLE_PREFILL, SIM_ROLE_DECODE };

typedef struct {
    const char *model;            /* --model, served model name */
    const char *host;             /* --host: where the pods listen */
    const char *kv_advertise_host;/* --kv-advertise-host: remote_host a prefill pod gives */
    double kv_transfer_tps;       /* --kv-transfer-tokens-per-s: KV pulled, model time */
    double time_scale;            /* --time-scale: 60 = everything 60x faster */
    sim_model_t m;                /* --prefill-us-per-token, --prefill-batch-slowdown,
                                     --overhead-ms, --itl-ms, --itl-per-seq-us, --max-num-seqs */
    int step;                     /* --engine step: pods run in engine steps (step_engine.c) */
    sim_step_conf_t sc;           /* --max-num-batched-tokens, --step-base-ms, --step-seq-us,
                                     --step-kv-ns-per-token, and the two flags shared with m;
                                     sc.priority: --scheduling-policy priority (both engines) */
    double rtt_us;                /* --rtt-ms: a round trip to another zone, model time */
    uint64_t capacity_tokens;     /* --capacity-tokens: KV cache size */
    uint64_t max_model_len;       /* --max-model-len: prompt + max_tokens limit */
    double fail_rate, drop_rate, stall_rate;
    unsigned tick_us;             /* --tick-us: shortest wall-clock gap between two writes */
    size_t max_body_bytes;
    double start_time;            /* wall clock at start, s: process_start_time_seconds */
    size_t metrics_pad_bytes;     /* --metrics-pad-bytes: /metrics grown to about this size */
    int hide_cache_config;        /* --hide-cache-config: no vllm:cache_config_info in /metrics */
    double tokenize_delay_us;     /* --tokenize-delay-ms: /tokenize and render answer this late */
    int tokenize_threads;         /* --tokenize-threads: the tokenizer's loops (0: none) */
    int kv_events;                /* --kv-events PORT given: pods publish KV events (sim_kvev.h) */
    int kv_events_port;           /* pod i on PORT+2i, its replay on PORT+2i+1; 0: any */
    int kv_events_encoding;       /* --kv-events-encoding: SIM_KVEV_ARRAY, _MAP, _MAP_BATCH */
    double kv_events_drop;        /* --kv-events-drop: batches left unpublished (but buffered) */
    double foreign_rate;          /* --foreign-load: requests per second (model time) the
                                     router never sent, made inside the pod */
    size_t foreign_tokens;        /* --foreign-tokens: their prompt length */
    const sim_cap_phase_t *cap_sched;   /* --capacity-schedule S:F,...: the usable cache is F */
    size_t ncap_sched;                  /* of the capacity for S s (model time), in a cycle */
} sim_conf_t;

typedef struct sim_pod sim_pod_t;
typedef struct sim_conn sim_conn_t;
typedef struct sim_kvev sim_kvev_t;
typedef struct sim_req sim_req_t;

enum { SIM_REQ_WAITING, SIM_REQ_RUNNING, SIM_REQ_IN_FLIGHT /* crossing zones (--rtt-ms) */ };

struct sim_req {
    sim_pod_t *pod;
    sim_conn_t *conn;
    sim_req_t *prev, *next;     /* on the pod's waiting or running list */
    int state;
    int chat, stream, include_usage;   /* usage: always in a full answer, on request in a stream */
    uint64_t seq;               /* id number, per pod: arrival order */
    int priority;               /* the body's "priority": lower first (priority scheduling) */
    size_t prompt_tokens, max_tokens;
    uint64_t *hashes;           /* full prompt blocks, chained */
    unsigned char *prompt;      /* --kv-events: the full blocks' bytes, for their token ids */
    size_t nblocks, private_blocks;
    size_t hit_tokens;
    size_t sent;                /* tokens emitted */
    size_t drop_at;             /* close the connection after this many tokens (0: never) */
    double arrival_us;          /* wall clock, monotonic */
    double first_token_us;      /* wall clock at which the first token is due */
    double prefill_start_us;    /* wall clock at which its prefill begins (latency engine) */
    double prefill_end_us;      /* wall clock at which its prefill ends (latency engine) */
    size_t hit_blocks;          /* cached at its admission (latency engine) */
    int admitted;               /* admitted once: its hit and prompt are counted (latency
                                   engine; a preempted request is not counted again) */
    double next_token_us;
    struct event *timer;
    struct event *rtt_timer;    /* --rtt-ms: the request reaches the engine when it fires */
    struct evbuffer *text;      /* non-streaming: the generated text so far */
    sim_step_seq_t step;        /* --engine step: its sequence in the pod's engine */
    int kv_remote_decode;       /* a prefill leg: answer with kv_transfer_params */
    size_t pull_blocks;         /* a decode leg with valid parameters: blocks it pulls */
    double pull_us;             /* their transfer, model time */
    int pulled;                 /* they are in the cache */
};

typedef struct {
    sim_req_t *head, *tail;
    unsigned n;
} sim_list_t;

#define SIM_TTFT_BUCKETS 22

struct sim_pod {
    const sim_conf_t *conf;
    struct event_base *base;
    char *name;
    int index;                  /* in --port order: its tokenizer loop is index % threads */
    int port;
    struct evconnlistener *listener;    /* on the tokenizer's loop when there is one */
    pcr_kvcache_t *kv;
    sim_list_t waiting, running;
    double prefill_busy_until_us;
    sim_step_t eng;             /* --engine step: the engine, its step timer, when the step */
    struct event *step_timer;   /* under way ends (wall clock) */
    double step_due_us;
    uint64_t next_seq;
    uint64_t next_render;       /* render answers' request ids (the tokenizer's thread) */
    uint64_t prefix_queries, prefix_hits;   /* tokens */
    uint64_t prompt_tokens, generation_tokens;
    uint64_t success, failed_injected, dropped, stalled, cancelled, rejected;
    uint64_t preemptions;       /* latency engine, priority scheduling: prefills preempted */
    uint64_t ttft_buckets[SIM_TTFT_BUCKETS + 1];
    double ttft_sum;
    uint64_t ttft_count;
    sim_conn_t *conns;          /* every open connection on the main loop, for shutdown */
    sim_conn_t *tok_conns;      /* those on its tokenizer's thread (sim_tok.c): that thread's */
    sim_kvev_t *kvev;           /* --kv-events: the publisher, or NULL */
    struct event *foreign_timer;/* --foreign-load: the next foreign request's arrival */
    double foreign_due_us;
    uint64_t foreign_rng;
    unsigned char *foreign_bytes;   /* the foreign request being admitted: its prompt and */
    uint64_t *foreign_hashes;       /* block names (foreign_hashes != NULL only meanwhile) */
    uint64_t *foreign_buf;
    uint64_t foreign, foreign_refused;
    double start_time;          /* process_start_time_seconds: conf->start_time, or the last
                                   POST /sim/restart */
    struct event *cap_timer;    /* --capacity-schedule: the next phase, or a retry */
    size_t cap_phase;
    double cap_phase_end_us;
    sim_pod_t *cap_next;        /* the process's scheduled pods, started together */
    size_t withheld;            /* blocks the schedule holds as a reservation */
    int role;                   /* --role: SIM_ROLE_* */
    uint64_t kv_handed, kv_pulls, kv_pulled_tokens, kv_pull_invalid;
};

struct sim_conn {
    sim_pod_t *pod;
    sim_conn_t *prev, *next;    /* on pod->conns, or pod->tok_conns when on_tok */
    struct event_base *base;    /* the loop that serves it */
    int on_tok;                 /* on its pod's tokenizer thread (sim_tok.c) */
    struct event *move_ev;      /* fires to hand it to the other loop (to_tok) */
    int to_tok;
    struct bufferevent *bev;
    http_parser parser;
    char *url;
    size_t url_len;
    struct evbuffer *body;
    int header_is_expect;       /* the header field being read is "Expect" */
    int expect_continue;
    int message_ready;          /* a request is parsed, not yet dispatched */
    int busy;                   /* a response is pending (parser paused) */
    int keep_alive;
    int closing;                /* close once the output is flushed */
    int too_large;
    int in_parse;               /* parse_input is on the stack */
    sim_req_t *req;             /* the generation in progress, if any */
    struct event *delay;        /* --tokenize-delay-ms: fires to send `delayed` */
    struct evbuffer *delayed;   /* a tokenize answer's body, held back */
};

extern const double sim_ttft_bounds[SIM_TTFT_BUCKETS];

/* A connection between two loops: what it had read and not parsed, written and not sent, and
 * the request it had just read (to dispatch on arrival). */
typedef struct {
    struct evbuffer *in, *out, *body;
    char *url;
    size_t url_len;
    int method, keep_alive, too_large;
} sim_conn_state_t;
void sim_conn_state_dispose(sim_conn_state_t *st);

/* sim_http.c */
void sim_http_accept(sim_pod_t *pod, evutil_socket_t fd);
/* A connection that moved here from the other loop (sim_tok.c), on `base`, the tokenizer's
 * when `tok`: takes `fd` and `st`, then dispatches the request it carries. */
void sim_http_adopt(sim_pod_t *pod, struct event_base *base, int tok, evutil_socket_t fd,
                    sim_conn_state_t *st);
void sim_conn_close(sim_conn_t *c);
/* A whole response: status line, x-sim-pod, content type and length, body. Ends the exchange. */
void sim_conn_respond(sim_conn_t *c, int status, const char *ctype, const char *body, size_t len);
/* An error in OpenAI's shape. */
void sim_conn_error(sim_conn_t *c, int status, const char *type, const char *msg);
/* Starts a chunked (SSE) response; chunks follow with sim_conn_chunk, end with sim_conn_end. */
void sim_conn_start_stream(sim_conn_t *c);
void sim_conn_chunk(sim_conn_t *c, struct evbuffer *data);
void sim_conn_end(sim_conn_t *c);   /* last chunk, then the next request on the connection */

/* sim_api.c */
/* Parses a completion body into a new request (not yet submitted). On a bad body it answers
 * the error itself and returns NULL. */
sim_req_t *sim_api_parse(sim_conn_t *c, int chat, const char *body, size_t len);
/* Appends one SSE event carrying `ntok` tokens (final: with finish_reason, then the usage event
 * when the request asked for it with stream_options.include_usage, as vLLM does, and [DONE]). */
void sim_api_stream_event(const sim_req_t *r, size_t first_tok, size_t ntok, int final,
                          struct evbuffer *out);
/* The whole non-streaming response body. */
void sim_api_full_response(const sim_req_t *r, struct evbuffer *out);
void sim_api_token_text(size_t i, struct evbuffer *out);
/* The toy tokenizer's endpoints: POST /tokenize, /v1/completions/render and
 * /v1/chat/completions/render (sim_api.c says what a token is). Writes the answer's body to
 * out and returns 0, or answers the error itself (400, 404) and returns -1. */
enum { SIM_TOK_TOKENIZE, SIM_TOK_RENDER_COMPLETION, SIM_TOK_RENDER_CHAT };
int sim_api_tokenize(sim_conn_t *c, int kind, const char *body, size_t len,
                     struct evbuffer *out);
void sim_api_metrics(const sim_pod_t *pod, struct evbuffer *out);
void sim_api_models(const sim_pod_t *pod, struct evbuffer *out);
void sim_req_free(sim_req_t *r);

/* sim_engine.c */
double sim_now_us(void);
double sim_rand(void);           /* uniform in [0, 1), seeded by --seed */
void sim_rand_seed(uint64_t seed);
void sim_engine_submit(sim_req_t *r);  /* queues it; answers when its time comes */
void sim_engine_cancel(sim_req_t *r);  /* the client left: frees the slot and the request */
/* --engine step: the pod's step timer (arg: the pod): the step ends, the next begins. */
void sim_engine_on_step(evutil_socket_t fd, short what, void *arg);
/* The bytes of the prompt being admitted whose block names are `hashes` (block i at
 * i * PCR_KV_BLOCK_BYTES), or NULL: how the KV-event publisher finds a stored block's tokens. */
const unsigned char *sim_engine_block_bytes(const sim_pod_t *pod, const uint64_t *hashes);
/* --foreign-load: starts the pod's foreign requests (0, or -1 when out of memory). */
int sim_engine_foreign_start(sim_pod_t *pod, uint64_t seed);
void sim_engine_foreign_stop(sim_pod_t *pod);
/* --capacity-schedule: readies the pod's cycle (0, or -1 when out of memory). Every pod's
 * cycle starts with the first request any pod of the process is sent. */
int sim_engine_capacity_start(sim_pod_t *pod);
void sim_engine_capacity_stop(sim_pod_t *pod);
/* POST /sim/restart: the pod dies and comes back empty. Every connection but `keep` is cut
 * (their requests die with the pod), the cache is emptied, /metrics starts again from zero
 * with a new process_start_time_seconds, and the KV events start a new life at sequence 0
 * with AllBlocksCleared. */
void sim_engine_restart(sim_pod_t *pod, sim_conn_t *keep);

/* sim_tok.c: the tokenizer's threads. _init on the main thread before the pods' listeners,
 * with 1..SIM_TOK_THREADS_MAX loops (-1: none, the main loop does everything); a pod's
 * listener goes on sim_tok_base(pod), its tokenizer's loop; _run once they are made; _stop
 * after the main loop ends (it frees the listeners too). _move hands a connection's state to
 * its pod's tokenizer (to_tok) or to the main loop; -1: it stays. _cut (the pod restarted)
 * closes the pod's connections on its tokenizer's thread. */
#define SIM_TOK_THREADS_MAX 64
int sim_tok_init(struct event_base *main_base, int nthreads);
struct event_base *sim_tok_base(const sim_pod_t *pod);
int sim_tok_run(void);
void sim_tok_stop(sim_pod_t *pods, int npods);
int sim_tok_move(sim_conn_t *c, int to_tok, sim_conn_state_t *st);
void sim_tok_cut(sim_pod_t *pod);
int sim_tok_running(void);

/* sim_pd.c */
const char *sim_pd_role_name(int role);
struct cJSON;
/* The request's kv_transfer_params (root: its body): a prefill leg is marked, a decode leg's
 * parameters checked (valid: pull_blocks and pull_us set; invalid: counted). */
void sim_pd_parse(sim_req_t *r, const struct cJSON *root);
/* Its transfer is over: the pulled blocks go into the pod's cache (once). */
void sim_pd_pulled(sim_req_t *r);
/* A whole answer's kv_transfer_params member (",\"kv_transfer_params\":{...}"), when the
 * request was a prefill leg stopped on its one token; nothing otherwise. */
void sim_pd_answer(const sim_req_t *r, struct evbuffer *out);

#endif
