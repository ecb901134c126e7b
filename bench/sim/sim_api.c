/* bench/sim/sim_api.c: the OpenAI / vLLM surface of vllm-sim: request bodies in (cJSON),
 * response bodies and SSE events out, /v1/models and /metrics in vLLM's names.
 *
 * Canonical prompt (what the cache hashes): for /v1/completions the `prompt` string, or the
 * JSON text of a non-string prompt (token ids); for /v1/chat/completions each message as
 * "<|role|>" then its content (a string, or the "text" of its parts), in order. A token is 4
 * bytes of it, rounded up.
 *
 * The toy tokenizer (/tokenize and the two render endpoints) says so exactly: token i is bytes
 * 4i..4i+3 of the canonical prompt as a little-endian u32, a last partial group zero-padded.
 * So a pod's block of 16 tokens is exactly one 64-byte block of its cache, and the token ids
 * of its KV events are the ones /tokenize gives. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pcr/common.h"
#include "sim.h"
#include "sim_kvev.h"

const double sim_ttft_bounds[SIM_TTFT_BUCKETS] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
};

static void add_content(struct evbuffer *b, const cJSON *content)
{
    if (cJSON_IsString(content)) {
        evbuffer_add(b, content->valuestring, strlen(content->valuestring));
    } else if (cJSON_IsArray(content)) {
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (cJSON_IsString(t))
                evbuffer_add(b, t->valuestring, strlen(t->valuestring));
        }
    }
}

/* Builds the canonical prompt into b; returns 0, or -1 with *why set. */
static int canonical_prompt(const cJSON *root, int chat, struct evbuffer *b, const char **why)
{
    if (!chat) {
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        if (cJSON_IsString(prompt)) {
            evbuffer_add(b, prompt->valuestring, strlen(prompt->valuestring));
            return 0;
        }
        if (cJSON_IsArray(prompt)) {
            char *text = cJSON_PrintUnformatted(prompt);
            if (!text) {
                *why = "out of memory";
                return -1;
            }
            evbuffer_add(b, text, strlen(text));
            cJSON_free(text);
            return 0;
        }
        *why = "prompt must be a string or an array";
        return -1;
    }
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        *why = "messages must be a non-empty array";
        return -1;
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) {
            *why = "each message needs a role";
            return -1;
        }
        evbuffer_add_printf(b, "<|%s|>", role->valuestring);
        add_content(b, cJSON_GetObjectItemCaseSensitive(m, "content"));
    }
    return 0;
}

/* Writes v in decimal at d, two digits a step; returns the end. */
static char *put_u32(char *d, uint32_t v)
{
    static const char pairs[201] =
        "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
        "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
        "8081828384858687888990919293949596979899";
    char t[10];
    int n = 10;
    while (v >= 100) {
        unsigned r = v % 100;
        v /= 100;
        t[--n] = pairs[2 * r + 1];
        t[--n] = pairs[2 * r];
    }
    if (v >= 10) {
        t[--n] = pairs[2 * v + 1];
        t[--n] = pairs[2 * v];
    } else {
        t[--n] = (char)('0' + v);
    }
    memcpy(d, t + n, (size_t)(10 - n));
    return d + (10 - n);
}

/* Appends the toy tokenizer's ids of `len` bytes as a JSON array, formatted in one pass into
 * space reserved for the longest answer (10 digits and a comma a token): a 5,000-token
 * prompt's 55 KB are written without a call per token. */
static int add_token_ids(struct evbuffer *out, const unsigned char *p, size_t len)
{
    size_t ntok = (len + PCR_KV_TOKEN_BYTES - 1) / PCR_KV_TOKEN_BYTES;
    struct evbuffer_iovec v;
    if (ntok > (SIZE_MAX - 2) / 11 || evbuffer_reserve_space(out, 2 + ntok * 11, &v, 1) != 1)
        return -1;
    char *d = v.iov_base;
    *d++ = '[';
    for (size_t i = 0; i < len; i += PCR_KV_TOKEN_BYTES) {
        unsigned char t[PCR_KV_TOKEN_BYTES] = {0};
        memcpy(t, p + i, len - i < PCR_KV_TOKEN_BYTES ? len - i : PCR_KV_TOKEN_BYTES);
        uint32_t id = (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 |
                      (uint32_t)t[3] << 24;
        if (i)
            *d++ = ',';
        d = put_u32(d, id);
    }
    *d++ = ']';
    v.iov_len = (size_t)(d - (char *)v.iov_base);
    return evbuffer_commit_space(out, &v, 1);
}

static long max_tokens_of(const cJSON *root, int chat);

int sim_api_tokenize(sim_conn_t *c, int kind, const char *body, size_t len,
                     struct evbuffer *out)
{
    const sim_conf_t *conf = c->pod->conf;
    const char *why = NULL;
    struct evbuffer *prompt = evbuffer_new();
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!prompt) {
        why = "out of memory";
        goto bad;
    }
    if (!cJSON_IsObject(root)) {
        why = "body is not a JSON object";
        goto bad;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) &&
        (!cJSON_IsString(model) || strcmp(model->valuestring, conf->model) != 0)) {
        cJSON_Delete(root);
        evbuffer_free(prompt);
        sim_conn_error(c, 404, "NotFoundError", "The model does not exist.");
        return -1;
    }
    /* /tokenize takes messages (a chat) or a prompt, which vLLM wants a string. */
    int chat = kind == SIM_TOK_RENDER_CHAT ||
               (kind == SIM_TOK_TOKENIZE && cJSON_GetObjectItemCaseSensitive(root, "messages"));
    if (kind == SIM_TOK_TOKENIZE && !chat &&
        !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "prompt"))) {
        why = "prompt must be a string (or give messages)";
        goto bad;
    }
    if (canonical_prompt(root, chat, prompt, &why) != 0)
        goto bad;
    size_t plen = evbuffer_get_length(prompt);
    const unsigned char *p = evbuffer_pullup(prompt, -1);
    size_t ntok = (plen + PCR_KV_TOKEN_BYTES - 1) / PCR_KV_TOKEN_BYTES;
    if (kind == SIM_TOK_TOKENIZE) {
        /* vLLM's TokenizeResponse: count, max_model_len, tokens, token_strs (null unless
         * return_token_strs, which the toy tokenizer does not do). */
        evbuffer_add_printf(out, "{\"count\":%zu,\"max_model_len\":%llu,\"tokens\":", ntok,
                            (unsigned long long)conf->max_model_len);
        if (add_token_ids(out, p, plen) != 0) {
            why = "out of memory";
            goto bad;
        }
        evbuffer_add(out, ",\"token_strs\":null}", 19);
    } else {
        /* vLLM's GenerateRequest: the chat render answers one, the completion render a list
         * of them (one per prompt; the sim takes one prompt). sampling_params carries only
         * max_tokens here. */
        long mt = max_tokens_of(root, chat);
        evbuffer_add_printf(out, "%s{\"request_id\":\"render-%s-%llu\",\"token_ids\":",
                            chat ? "" : "[", c->pod->name,
                            (unsigned long long)__atomic_add_fetch(&c->pod->next_render, 1,
                                                                       __ATOMIC_RELAXED));
        if (add_token_ids(out, p, plen) != 0) {
            why = "out of memory";
            goto bad;
        }
        evbuffer_add_printf(out, ",\"features\":null,\"sampling_params\":{\"max_tokens\":%ld},"
                            "\"model\":\"%s\",\"stream\":false,\"stream_options\":null,"
                            "\"cache_salt\":null,\"priority\":0,\"kv_transfer_params\":null}%s",
                            mt, conf->model, chat ? "" : "]");
    }
    evbuffer_free(prompt);
    cJSON_Delete(root);
    return 0;
bad:
    if (prompt)
        evbuffer_free(prompt);
    cJSON_Delete(root);
    sim_conn_error(c, 400, "BadRequestError", why);
    return -1;
}

static long get_int(const cJSON *root, const char *key, long dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsNumber(v) ? (long)v->valuedouble : dflt;
}

/* The request's output limit: max_completion_tokens (chat) or max_tokens, else the sim's
 * defaults, 256 for a chat and 16 for a completion. */
static long max_tokens_of(const cJSON *root, int chat)
{
    long mt = get_int(root, chat ? "max_completion_tokens" : "max_tokens", -1);
    if (mt < 0 && chat)
        mt = get_int(root, "max_tokens", -1);
    return mt < 0 ? (chat ? 256 : 16) : mt;
}

sim_req_t *sim_api_parse(sim_conn_t *c, int chat, const char *body, size_t len)
{
    sim_pod_t *pod = c->pod;
    const sim_conf_t *conf = pod->conf;
    const char *why = NULL;
    char msg[96];
    struct evbuffer *prompt = NULL;
    sim_req_t *r = NULL;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(root)) {
        why = "body is not a JSON object";
        goto bad;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && (!cJSON_IsString(model) || strcmp(model->valuestring, conf->model) != 0)) {
        cJSON_Delete(root);
        sim_conn_error(c, 404, "NotFoundError", "The model does not exist.");
        return NULL;
    }
    prompt = evbuffer_new();
    if (!prompt || canonical_prompt(root, chat, prompt, &why) != 0)
        goto bad;
    r = calloc(1, sizeof(*r));
    if (!r) {
        why = "out of memory";
        goto bad;
    }
    size_t plen = evbuffer_get_length(prompt);
    r->pod = pod;
    r->conn = c;
    r->chat = chat;
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(root, "stream");
    r->stream = cJSON_IsTrue(stream);
    /* As vLLM: a stream reports usage only when asked, in one last event of its own. */
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    r->include_usage = !r->stream || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
    r->prompt_tokens = (plen + PCR_KV_TOKEN_BYTES - 1) / PCR_KV_TOKEN_BYTES;
    long mt = max_tokens_of(root, chat);
    r->max_tokens = mt < 1 ? 1 : (size_t)mt;
    if (r->prompt_tokens == 0) {
        why = "the prompt is empty";
        goto bad;
    }
    if (r->prompt_tokens + r->max_tokens > conf->max_model_len) {
        why = "prompt tokens plus max_tokens exceed the model's maximum context length";
        goto bad;
    }
    size_t nb = plen / PCR_KV_BLOCK_BYTES;
    r->hashes = malloc((nb ? nb : 1) * sizeof(uint64_t));
    if (!r->hashes) {
        why = "out of memory";
        goto bad;
    }
    r->nblocks = pcr_kvcache_hash_prompt(evbuffer_pullup(prompt, -1), plen, 0, r->hashes, nb);
    if (conf->kv_events && nb > 0) {
        r->prompt = malloc(nb * PCR_KV_BLOCK_BYTES);
        if (!r->prompt) {
            why = "out of memory";
            goto bad;
        }
        evbuffer_copyout(prompt, r->prompt, nb * PCR_KV_BLOCK_BYTES);
    }
    r->private_blocks = sim_model_private_blocks(r->prompt_tokens, r->nblocks, r->max_tokens);
    if (r->nblocks + r->private_blocks > pcr_kvcache_capacity(pod->kv)) {
        why = "the request needs more KV cache blocks than the pod has";
        goto bad;
    }
    if (!r->stream) {
        r->text = evbuffer_new();
        if (!r->text) {
            why = "out of memory";
            goto bad;
        }
    }
    /* vLLM's "priority": an integer, lower served earlier; anything but 0 is refused by a
     * server without priority scheduling, in vLLM's words. */
    const cJSON *prio = cJSON_GetObjectItemCaseSensitive(root, "priority");
    if (prio && !cJSON_IsNull(prio)) {
        if (!cJSON_IsNumber(prio) || !(prio->valuedouble >= -2147483648.0) ||
            !(prio->valuedouble <= 2147483647.0) ||
            prio->valuedouble != (double)(int)prio->valuedouble) {
            why = "priority must be an integer";
            goto bad;
        }
        r->priority = (int)prio->valuedouble;
        if (r->priority != 0 && !conf->sc.priority) {
            snprintf(msg, sizeof msg, "Got priority %d but Priority scheduling is not enabled.",
                     r->priority);
            why = msg;
            goto bad;
        }
    }
    r->seq = ++pod->next_seq;
    sim_pd_parse(r, root);
    evbuffer_free(prompt);
    cJSON_Delete(root);
    return r;
bad:
    pod->rejected++;
    sim_req_free(r);
    if (prompt)
        evbuffer_free(prompt);
    cJSON_Delete(root);
    sim_conn_error(c, 400, "BadRequestError", why);
    return NULL;
}

void sim_req_free(sim_req_t *r)
{
    if (!r)
        return;
    if (r->timer)
        event_free(r->timer);
    if (r->rtt_timer)
        event_free(r->rtt_timer);
    if (r->text)
        evbuffer_free(r->text);
    free(r->hashes);
    free(r->prompt);
    free(r);
}

static const char *const tokens[] = {
    " the", " cache", " is", " warm", " and", " the", " answer", " streams", " back", ",",
    " token", " by", " token", ".", " A", " router",
};

void sim_api_token_text(size_t i, struct evbuffer *out)
{
    const char *t = tokens[i % PCR_ARRAY_SIZE(tokens)];
    evbuffer_add(out, t, strlen(t));
}

static void add_usage(const sim_req_t *r, size_t completion, struct evbuffer *out)
{
    evbuffer_add_printf(out, "\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":%zu,"
                        "\"total_tokens\":%zu,\"prompt_tokens_details\":{\"cached_tokens\":%zu}}",
                        r->prompt_tokens, completion, r->prompt_tokens + completion, r->hit_tokens);
}

static void add_head(const sim_req_t *r, const char *object, struct evbuffer *out)
{
    evbuffer_add_printf(out, "{\"id\":\"%s-%s-%llu\",\"object\":\"%s\",\"created\":%lld,"
                        "\"model\":\"%s\",\"system_fingerprint\":\"%s\",",
                        r->chat ? "chatcmpl" : "cmpl", r->pod->name, (unsigned long long)r->seq,
                        object, (long long)time(NULL), r->pod->conf->model, r->pod->name);
}

void sim_api_stream_event(const sim_req_t *r, size_t first_tok, size_t ntok, int final,
                          struct evbuffer *out)
{
    evbuffer_add(out, "data: ", 6);
    add_head(r, r->chat ? "chat.completion.chunk" : "text_completion", out);
    if (r->chat)
        evbuffer_add_printf(out, "\"choices\":[{\"index\":0,\"delta\":{%s\"content\":\"",
                            first_tok == 0 ? "\"role\":\"assistant\"," : "");
    else
        evbuffer_add_printf(out, "\"choices\":[{\"index\":0,\"text\":\"");
    for (size_t i = 0; i < ntok; i++)
        sim_api_token_text(first_tok + i, out);
    evbuffer_add_printf(out, "\"%s,\"logprobs\":null,\"finish_reason\":%s}]}\n\n", r->chat ? "}" : "",
                        final ? "\"length\"" : "null");
    if (final && r->include_usage) {
        /* vLLM's usage event: no choices, the whole request's usage. */
        evbuffer_add(out, "data: ", 6);
        add_head(r, r->chat ? "chat.completion.chunk" : "text_completion", out);
        evbuffer_add(out, "\"choices\":[],", 13);
        add_usage(r, first_tok + ntok, out);
        evbuffer_add(out, "}\n\n", 3);
    }
    if (final)
        evbuffer_add(out, "data: [DONE]\n\n", 14);
}

void sim_api_full_response(const sim_req_t *r, struct evbuffer *out)
{
    add_head(r, r->chat ? "chat.completion" : "text_completion", out);
    if (r->chat)
        evbuffer_add_printf(out, "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                            "\"content\":\"");
    else
        evbuffer_add_printf(out, "\"choices\":[{\"index\":0,\"text\":\"");
    evbuffer_add_buffer(out, r->text);   /* moves: the request is done */
    evbuffer_add_printf(out, "\"%s,\"logprobs\":null,\"finish_reason\":\"length\"}],",
                        r->chat ? "}" : "");
    add_usage(r, r->sent, out);
    sim_pd_answer(r, out);
    evbuffer_add(out, "}", 1);
}

void sim_api_models(const sim_pod_t *pod, struct evbuffer *out)
{
    evbuffer_add_printf(out, "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\","
                        "\"created\":%lld,\"owned_by\":\"vllm\",\"root\":\"%s\","
                        "\"max_model_len\":%llu}]}", pod->conf->model, (long long)time(NULL),
                        pod->conf->model, (unsigned long long)pod->conf->max_model_len);
}

static void metric(struct evbuffer *out, const char *name, const char *type, const char *help,
                   const char *model, double v)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=\"%s\"} %.17g\n",
                        name, help, name, type, name, model, v);
}

/* vLLM's request histograms, as many as it takes to grow the page to conf->metrics_pad_bytes:
 * what a scraper reads through on a real pod (its values here are zeros). */
static void metrics_pad(const sim_pod_t *pod, struct evbuffer *out, size_t start)
{
    static const char *const families[] = {
        "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds", "vllm:time_per_output_token_seconds",
        "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
        "vllm:request_params_max_tokens", "vllm:iteration_tokens_total",
    };
    const char *m = pod->conf->model;
    for (unsigned f = 0; evbuffer_get_length(out) - start < pod->conf->metrics_pad_bytes; f++) {
        char name[96];
        snprintf(name, sizeof name, "%s%s", families[f % 10], f < 10 ? "" : "_extra");
        evbuffer_add_printf(out, "# HELP %s Histogram of %s.\n# TYPE %s histogram\n", name, name,
                            name);
        double le = 0.001;
        for (int i = 0; i < 24; i++, le *= 2)
            evbuffer_add_printf(out, "%s_bucket{le=\"%g\",model_name=\"%s\"} 0.0\n", name, le, m);
        evbuffer_add_printf(out, "%s_bucket{le=\"+Inf\",model_name=\"%s\"} 0.0\n"
                            "%s_count{model_name=\"%s\"} 0.0\n%s_sum{model_name=\"%s\"} 0.0\n",
                            name, m, name, m, name, m);
    }
}

void sim_api_metrics(const sim_pod_t *pod, struct evbuffer *out)
{
    size_t start = evbuffer_get_length(out);
    const char *m = pod->conf->model;
    size_t cap = pcr_kvcache_capacity(pod->kv);
    double usage = (double)(pcr_kvcache_pinned(pod->kv) + pcr_kvcache_reserved(pod->kv)) / cap;
    metric(out, "vllm:num_requests_running", "gauge",
           "Number of requests in model execution batches.", m,
           pod->conf->step ? pod->eng.running.n : pod->running.n);
    metric(out, "vllm:num_requests_waiting", "gauge",
           "Number of requests waiting to be processed.", m,
           pod->conf->step ? pod->eng.waiting.n : pod->waiting.n);
    metric(out, "vllm:kv_cache_usage_perc", "gauge",
           "KV-cache usage. 1 means 100 percent usage.", m, usage);
    metric(out, "vllm:prefix_cache_queries_total", "counter",
           "Prefix cache queries, in terms of number of queried tokens.", m,
           (double)pod->prefix_queries);
    metric(out, "vllm:prefix_cache_hits_total", "counter",
           "Prefix cache hits, in terms of number of cached tokens.", m, (double)pod->prefix_hits);
    metric(out, "vllm:num_preemptions_total", "counter",
           "Cumulative number of preemption from the engine.", m,
           (double)(pod->conf->step ? pod->eng.preemptions : pod->preemptions));
    metric(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", m,
           (double)pod->prompt_tokens);
    metric(out, "vllm_sim:kv_handed_total", "counter",
           "Prefill legs answered with kv_transfer_params (--role).", m, pod->kv_handed);
    metric(out, "vllm_sim:kv_pulls_total", "counter",
           "Decode legs that pulled a prefill pod's KV blocks.", m, pod->kv_pulls);
    metric(out, "vllm_sim:kv_pulled_tokens_total", "counter",
           "Prompt tokens whose KV blocks were pulled.", m, pod->kv_pulled_tokens);
    metric(out, "vllm_sim:kv_pull_invalid_total", "counter",
           "Decode legs with missing or invalid kv_transfer_params: prefilled locally.", m,
           pod->kv_pull_invalid);
    metric(out, "vllm:generation_tokens_total", "counter",
           "Number of generation tokens processed.", m, (double)pod->generation_tokens);
    evbuffer_add_printf(out, "# HELP vllm:request_success_total Count of successfully processed "
                        "requests.\n# TYPE vllm:request_success_total counter\n"
                        "vllm:request_success_total{finished_reason=\"length\",model_name=\"%s\"} "
                        "%llu\n", m, (unsigned long long)pod->success);
    if (!pod->conf->hide_cache_config)
        evbuffer_add_printf(out, "# HELP vllm:cache_config_info Information of the LLMEngine "
                            "CacheConfig\n# TYPE vllm:cache_config_info gauge\n"
                            "vllm:cache_config_info{block_size=\"%d\",model_name=\"%s\","
                            "num_gpu_blocks=\"%zu\"} 1\n", PCR_KV_BLOCK_TOKENS, m, cap);
    evbuffer_add_printf(out, "# HELP vllm:time_to_first_token_seconds Histogram of time to "
                        "first token in seconds.\n"
                        "# TYPE vllm:time_to_first_token_seconds histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < SIM_TTFT_BUCKETS; i++) {
        cum += pod->ttft_buckets[i];
        evbuffer_add_printf(out, "vllm:time_to_first_token_seconds_bucket{le=\"%g\","
                            "model_name=\"%s\"} %llu\n", sim_ttft_bounds[i], m,
                            (unsigned long long)cum);
    }
    cum += pod->ttft_buckets[SIM_TTFT_BUCKETS];
    evbuffer_add_printf(out, "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\","
                        "model_name=\"%s\"} %llu\n", m, (unsigned long long)cum);
    evbuffer_add_printf(out, "vllm:time_to_first_token_seconds_count{model_name=\"%s\"} %llu\n"
                        "vllm:time_to_first_token_seconds_sum{model_name=\"%s\"} %.9g\n",
                        m, (unsigned long long)pod->ttft_count, m, pod->ttft_sum);
    evbuffer_add_printf(out, "# HELP process_start_time_seconds Start time of the process since "
                        "unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\n"
                        "process_start_time_seconds %.17g\n", pod->start_time);
    evbuffer_add_printf(out, "# HELP vllm_sim:faults_total Faults injected or seen by the "
                        "simulator.\n# TYPE vllm_sim:faults_total counter\n"
                        "vllm_sim:faults_total{kind=\"fail\",pod=\"%s\"} %llu\n"
                        "vllm_sim:faults_total{kind=\"drop\",pod=\"%s\"} %llu\n"
                        "vllm_sim:faults_total{kind=\"stall\",pod=\"%s\"} %llu\n"
                        "vllm_sim:faults_total{kind=\"cancelled\",pod=\"%s\"} %llu\n"
                        "vllm_sim:faults_total{kind=\"rejected\",pod=\"%s\"} %llu\n",
                        pod->name, (unsigned long long)pod->failed_injected,
                        pod->name, (unsigned long long)pod->dropped,
                        pod->name, (unsigned long long)pod->stalled,
                        pod->name, (unsigned long long)pod->cancelled,
                        pod->name, (unsigned long long)pod->rejected);
    if (pod->kvev) {
        sim_kvev_stats_t st;
        sim_kvev_stats(pod->kvev, &st);
        evbuffer_add_printf(out, "# HELP vllm_sim:kv_event_batches_total KV-event batches made, "
                            "and those --kv-events-drop kept from the wire.\n"
                            "# TYPE vllm_sim:kv_event_batches_total counter\n"
                            "vllm_sim:kv_event_batches_total{kind=\"made\",pod=\"%s\"} %llu\n"
                            "vllm_sim:kv_event_batches_total{kind=\"dropped\",pod=\"%s\"} %llu\n"
                            "# HELP vllm_sim:kv_event_replays_total Replay requests answered.\n"
                            "# TYPE vllm_sim:kv_event_replays_total counter\n"
                            "vllm_sim:kv_event_replays_total{pod=\"%s\"} %llu\n"
                            "# HELP vllm_sim:kv_event_orphan_blocks_total Stored blocks whose "
                            "prompt the publisher could not find (a bug if not 0).\n"
                            "# TYPE vllm_sim:kv_event_orphan_blocks_total counter\n"
                            "vllm_sim:kv_event_orphan_blocks_total{pod=\"%s\"} %llu\n",
                            pod->name, (unsigned long long)st.batches,
                            pod->name, (unsigned long long)st.dropped,
                            pod->name, (unsigned long long)st.replays,
                            pod->name, (unsigned long long)st.unknown_owner);
    }
    if (pod->conf->foreign_rate > 0)
        evbuffer_add_printf(out, "# HELP vllm_sim:foreign_requests_total Requests made inside "
                            "the pod (--foreign-load), admitted to the cache or refused.\n"
                            "# TYPE vllm_sim:foreign_requests_total counter\n"
                            "vllm_sim:foreign_requests_total{outcome=\"admitted\",pod=\"%s\"} "
                            "%llu\nvllm_sim:foreign_requests_total{outcome=\"refused\",pod=\"%s\"} "
                            "%llu\n", pod->name,
                            (unsigned long long)(pod->foreign - pod->foreign_refused), pod->name,
                            (unsigned long long)pod->foreign_refused);
    if (pod->conf->ncap_sched > 0)
        evbuffer_add_printf(out, "# HELP vllm_sim:kv_blocks_withheld KV blocks the capacity "
                            "schedule takes from the pod now.\n"
                            "# TYPE vllm_sim:kv_blocks_withheld gauge\n"
                            "vllm_sim:kv_blocks_withheld{pod=\"%s\"} %zu\n", pod->name,
                            pod->withheld);
    if (pod->conf->metrics_pad_bytes > 0)
        metrics_pad(pod, out, start);
}
