/* router/http/tokenize.c: owns precise mode's tokenization of a routed request (tokenize.h):
 * the worker's cache of token chains, the question to a pod that serves the model (its body
 * made and its answer read with jansson, both bounded), its deadline, and the return to the
 * decision (pcr_proxy_dispatch) with the key's token chains, or without them.
 *
 *   routed -> key -> cache hit?  yes: chains into the key -> dispatch
 *                                no:  POST /tokenize (or .../render) on the worker's pool for
 *                                     tokenizing -> answer: chains, cached -> dispatch
 *                                                -> error, timeout: dispatch on the text key
 *
 * The cache is direct-mapped, its slot the prompt's last chained text block (which names the
 * whole prompt: the model, a chat's tools and a last partial block are mixed in, pcr/prefix.h)
 * with the prompt's length: a colliding prompt replaces the older one. It holds the chains,
 * never the tokens, at most routing.tokenize_cache_entries of them and, all together, at most
 * routing.tokenize_cache_bytes of chains (a prompt's chains are 8 bytes a block, up to
 * max_prefix_bytes' worth: without the byte bound, the entries alone could hold 4096 long
 * prompts' chains, 16 KiB each). A prompt whose chains would pass it is not kept. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>

#include "log.h"
#include "pools.h"
#include "tokenize.h"

enum { FAIL_TIMEOUT = 0, FAIL_ERROR, FAIL_ANSWER, FAIL_NO_POD };

typedef struct {
    uint64_t key, check;          /* the last text block; its length and count of blocks */
    uint64_t prompt_tokens;       /* the exact count the pod gave */
    uint64_t *chains;             /* heap; NULL: an empty slot */
    size_t nchains;
} tokslot_t;

struct pcr_tokcache {
    tokslot_t *slots;
    size_t n;
    size_t bytes;                 /* the chains' bytes, at most routing.tokenize_cache_bytes */
};

struct pcr_tokreq {
    pcr_exchange_t *ex;
    pcr_upreq_t *up;
    struct event *deadline;
    struct evbuffer *answer;
    int status;
    int too_large;
    int render;                   /* the answer is a render endpoint's */
    uint64_t t0_ns;
};

/* ---- the cache ------------------------------------------------------------------------- */

static tokslot_t *cache_slot(pcr_worker_t *w, const pcr_key_t *k, uint64_t *check, int make)
{
    unsigned want = w->cfg->routing.tokenize_cache_entries;
    if (want == 0 || k->nblocks == 0)
        return NULL;
    struct pcr_tokcache *c = w->tokcache;
    if (c == NULL && make) {
        c = calloc(1, sizeof(*c));
        if (c != NULL && (c->slots = calloc(want, sizeof(*c->slots))) == NULL) {
            free(c);
            c = NULL;
        }
        if (c != NULL)
            c->n = want;
        w->tokcache = c;
    }
    if (c == NULL)
        return NULL;
    uint64_t key = k->blocks[k->nblocks - 1];
    *check = k->prompt_tokens << 20 ^ k->nblocks;
    /* A reload may change the size: the slots in place are kept, fewer or more used. */
    size_t n = c->n < want ? c->n : want;
    return &c->slots[key % n];
}

static int cache_get(pcr_exchange_t *ex)
{
    uint64_t check;
    tokslot_t *s = cache_slot(ex->w, &ex->key, &check, 0);
    if (s == NULL || s->chains == NULL || s->key != ex->key.blocks[ex->key.nblocks - 1] ||
        s->check != check || s->nchains > ex->tblocks_cap)
        return 0;
    memcpy(ex->tblocks, s->chains, s->nchains * sizeof(uint64_t));
    ex->key.tblocks = ex->tblocks;
    ex->key.ntblocks = s->nchains;
    ex->key.prompt_tokens = s->prompt_tokens;
    return 1;
}

static void cache_put(pcr_exchange_t *ex, const pcr_key_t *text)
{
    uint64_t check;
    tokslot_t *s = cache_slot(ex->w, text, &check, 1);
    if (s == NULL)
        return;
    struct pcr_tokcache *c = ex->w->tokcache;
    size_t limit = ex->w->cfg->routing.tokenize_cache_bytes;
    size_t old = s->chains != NULL ? s->nchains * sizeof(uint64_t) : 0;
    size_t add = ex->key.ntblocks * sizeof(uint64_t);
    if (limit != 0 && c->bytes - old + add > limit)
        return; /* the slot keeps what it had */
    uint64_t *chains = malloc((ex->key.ntblocks ? ex->key.ntblocks : 1) * sizeof(uint64_t));
    if (chains == NULL)
        return;
    memcpy(chains, ex->key.tblocks, ex->key.ntblocks * sizeof(uint64_t));
    free(s->chains);
    c->bytes = c->bytes - old + add;
    PCR_STORE(ex->w->metrics.tokcache_bytes, c->bytes + c->n * sizeof(*c->slots));
    *s = (tokslot_t){text->blocks[text->nblocks - 1], check, ex->key.prompt_tokens, chains,
                     ex->key.ntblocks};
}

void pcr_tokenize_worker_free(pcr_worker_t *w)
{
    struct pcr_tokcache *c = w->tokcache;
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->slots[i].chains);
    free(c->slots);
    free(c);
    w->tokcache = NULL;
}

/* ---- the question ---------------------------------------------------------------------- */

/* The body for the pod, from the request's (jansson, so nothing of the client's JSON is
 * copied by hand): /tokenize takes {"model","prompt"} or {"model","messages",
 * "add_generation_prompt"} (with the request's tools, which the chat template renders); a
 * render endpoint takes the request itself. NULL when the request has nothing the pod would
 * take (a prompt of several strings, of token ids: tokens are no question then). */
static char *question_body(pcr_exchange_t *ex, int render, const char **path)
{
    size_t len = evbuffer_get_length(ex->body);
    const char *raw = len ? (const char *)evbuffer_pullup(ex->body, -1) : "";
    json_t *root = json_loadb(raw, len, 0, NULL), *q = NULL;
    char *out = NULL;
    if (!json_is_object(root))
        goto done;
    int chat = ex->route != NULL && ex->route->api == PCR_API_CHAT;
    if (render) {
        *path = chat ? "/v1/chat/completions/render" : "/v1/completions/render";
        json_object_del(root, "stream");
        json_object_del(root, "stream_options");
        out = json_dumps(root, JSON_COMPACT);
        goto done;
    }
    *path = "/tokenize";
    q = json_object();
    json_t *model = json_object_get(root, "model");
    if (q == NULL || (model != NULL && json_object_set(q, "model", model) != 0))
        goto done;
    if (chat) {
        json_t *msgs = json_object_get(root, "messages"), *tools = json_object_get(root, "tools");
        json_t *agp = json_object_get(root, "add_generation_prompt");
        if (!json_is_array(msgs) || json_object_set(q, "messages", msgs) != 0 ||
            json_object_set_new(q, "add_generation_prompt",
                                json_is_boolean(agp) ? json_incref(agp) : json_true()) != 0 ||
            (tools != NULL && json_object_set(q, "tools", tools) != 0))
            goto done;
    } else {
        json_t *prompt = json_object_get(root, "prompt");
        if (!json_is_string(prompt) || json_object_set(q, "prompt", prompt) != 0)
            goto done;
    }
    out = json_dumps(q, JSON_COMPACT);
done:
    json_decref(q);
    json_decref(root);
    return out;
}

/* A usable pod for the request's model, in turn from the worker's last one: any pod that
 * serves a model tokenizes it as every other does. */
static pcr_backend_t *pick_pod(pcr_exchange_t *ex)
{
    pcr_worker_t *w = ex->w;
    size_t n = pcr_backend_slots(w->srv);
    const char *model = ex->req.model ? ex->req.model : "";
    uint64_t now = pcr_now_us();
    for (size_t k = 0; k < n; k++) {
        size_t i = (w->tok_next + k) % n;
        pcr_backend_t *be = pcr_backend_at(w->srv, i);
        if (be != NULL && PCR_LOAD(be->up) && !PCR_LOAD(be->removed) &&
            !pcr_backend_ejected(be, now) && pcr_backend_serves(be, model, ex->model_hash)) {
            w->tok_next = (unsigned)(i + 1);
            return be;
        }
    }
    return NULL;
}

/* Ends the tokenization (a failure `why`, or -1 with the key's chains made) and routes. */
static void finish(pcr_exchange_t *ex, int why)
{
    pcr_worker_t *w = ex->w;
    ex->ns_tokenize = pcr_now_ns() - ex->tok->t0_ns;
    pcr_tokenize_cancel(ex);
    ex->t_hashed_ns = 0; /* the decision reads the clock anew */
    if (why >= 0) {
        PCR_INC(w->metrics.tokenize_failures[why]);
        ex->key.tblocks = NULL;
        ex->key.ntblocks = 0;
    }
    pcr_proxy_dispatch(ex);
}

void pcr_tokenize_cancel(pcr_exchange_t *ex)
{
    struct pcr_tokreq *t = ex->tok;
    if (t == NULL)
        return;
    if (t->up != NULL)
        pcr_upstream_cancel(t->up);
    if (t->deadline != NULL)
        event_free(t->deadline);
    if (t->answer != NULL)
        evbuffer_free(t->answer);
    free(t);
    ex->tok = NULL;
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    finish(arg, FAIL_TIMEOUT);
}

static void on_tok_head(void *ctx, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    pcr_exchange_t *ex = ctx;
    ex->tok->status = status;
}

static void on_tok_body(void *ctx, const char *data, size_t len)
{
    pcr_exchange_t *ex = ctx;
    struct pcr_tokreq *t = ex->tok;
    if (t->too_large)
        return;
    if (evbuffer_get_length(t->answer) + len > ex->w->cfg->routing.tokenize_max_bytes) {
        t->too_large = 1;
        return;
    }
    evbuffer_add(t->answer, data, len);
}

/* The answer's token ids into the key's chains: {"tokens": [...]} from /tokenize,
 * {"token_ids": [...]} from the chat render, a list of those from the completion render. */
static int read_answer(pcr_exchange_t *ex)
{
    struct pcr_tokreq *t = ex->tok;
    size_t len = evbuffer_get_length(t->answer);
    const char *raw = len ? (const char *)evbuffer_pullup(t->answer, -1) : "";
    json_t *root = json_loadb(raw, len, 0, NULL);
    json_t *obj = json_is_array(root) && json_array_size(root) == 1 ? json_array_get(root, 0)
                                                                      : root;
    json_t *ids = json_object_get(obj, t->render ? "token_ids" : "tokens");
    int rc = -1;
    size_t n = json_array_size(ids);
    const pcr_policy_t *p = ex->w->policy;
    size_t room = pcr_policy_max_tblocks(p);
    /* Only the tokens the chains take are copied; every one is checked and counted. */
    size_t keep = room * ex->w->cfg->routing.kv_block_tokens;
    uint32_t *tokens = malloc((n < keep ? n : keep) * sizeof(uint32_t) + 1);
    if (!json_is_array(ids) || tokens == NULL || room == 0 || room > ex->tblocks_cap)
        goto done;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > (json_int_t)UINT32_MAX)
            goto done;
        if (i < keep)
            tokens[i] = (uint32_t)json_integer_value(v);
    }
    ex->key.tblocks = ex->tblocks;
    if (pcr_policy_key_tokens(p, 0, tokens, n < keep ? n : keep, &ex->key) != 0)
        goto done;
    ex->key.prompt_tokens = n;
    rc = 0;
done:
    free(tokens);
    json_decref(root);
    return rc;
}

static void on_tok_done(void *ctx)
{
    pcr_exchange_t *ex = ctx;
    struct pcr_tokreq *t = ex->tok;
    t->up = NULL;
    if (t->status != 200 || t->too_large) {
        finish(ex, t->status == 200 ? FAIL_ANSWER : FAIL_ERROR);
        return;
    }
    pcr_key_t text = ex->key;
    if (read_answer(ex) != 0) {
        finish(ex, FAIL_ANSWER);
        return;
    }
    cache_put(ex, &text);
    finish(ex, -1);
}

static void on_tok_error(void *ctx, pcr_up_error_t err, int got_head)
{
    pcr_exchange_t *ex = ctx;
    ex->tok->up = NULL;
    finish(ex, err == PCR_UP_TIMEOUT ? FAIL_TIMEOUT : FAIL_ERROR);
}

static const pcr_upstream_cbs_t tok_cbs = {on_tok_head, on_tok_body, on_tok_done, on_tok_error,
                                           NULL, NULL, NULL, NULL};

/* Room for the policy's chains in the exchange (kept when it is recycled). */
static int tblocks_room(pcr_exchange_t *ex, size_t room)
{
    if (ex->tblocks_cap >= room)
        return 0;
    uint64_t *b = realloc(ex->tblocks, room * sizeof(uint64_t));
    if (b == NULL)
        return PCR_ERR_NOMEM;
    ex->tblocks = b;
    ex->tblocks_cap = room;
    return 0;
}

int pcr_tokenize_start(pcr_exchange_t *ex)
{
    pcr_worker_t *w = ex->w;
    const pcr_config_t *cfg = w->cfg;
    size_t room = pcr_policy_max_tblocks(w->policy);
    if (!cfg->routing.index_events || room == 0 || !ex->has_key || tblocks_room(ex, room) != 0)
        return 1;
    uint64_t t0 = pcr_now_ns();
    ex->tokenized = 1;
    if (cache_get(ex)) {
        PCR_INC(w->metrics.tokenize_cache_hits);
        ex->ns_tokenize = pcr_now_ns() - t0;
        return 1;
    }
    pcr_backend_t *be = pick_pod(ex);
    const char *path = NULL;
    int render = cfg->routing.tokenize_render;
    char *body = be != NULL ? question_body(ex, render, &path) : NULL;
    if (body == NULL) {
        /* No pod, or a prompt no pod is asked about: routed on the text key. */
        if (be == NULL)
            PCR_INC(w->metrics.tokenize_failures[FAIL_NO_POD]);
        ex->tokenized = be == NULL;
        ex->ns_tokenize = pcr_now_ns() - t0;
        return 1;
    }
    struct pcr_tokreq *t = calloc(1, sizeof(*t));
    struct evbuffer *req = evbuffer_new();
    pcr_pool_t *pool = pcr_pools_tokenize(w, be);
    ex->tok = t; /* from here on pcr_tokenize_cancel frees what was made */
    if (t != NULL) {
        t->answer = evbuffer_new();
        t->deadline = evtimer_new(w->base, on_deadline, ex);
    }
    if (t == NULL || req == NULL || pool == NULL || t->answer == NULL || t->deadline == NULL ||
        evbuffer_add_printf(req, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
                                 "\r\nContent-Length: %zu\r\n\r\n", path, be->host_header,
                            strlen(body)) < 0 ||
        evbuffer_add(req, body, strlen(body)) != 0) {
        /* Out of memory: routed on the text key. */
        free(body);
        if (req != NULL)
            evbuffer_free(req);
        pcr_tokenize_cancel(ex);
        ex->tokenized = 0;
        return 1;
    }
    free(body);
    t->ex = ex;
    t->render = render;
    t->t0_ns = t0;
    ex->tok = t;
    PCR_INC(w->metrics.tokenize_calls);
    t->up = pcr_upstream_send(pool, &(pcr_up_send_t){.head = req}, &tok_cbs, ex);
    if (t->up == NULL) {
        pcr_tokenize_cancel(ex);
        ex->tokenized = 0;
        return 1;
    }
    struct timeval tv = pcr_ms_to_tv(cfg->routing.tokenize_timeout_ms);
    event_add(t->deadline, &tv);
    return 0;
}
