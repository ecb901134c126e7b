/* router/http/tokenize.c: owns precise mode's tokenization of a routed request (tokenize.h):
 * the worker's cache of token chains, the question to a pod that serves the model (its body
 * made with jansson; its answer read as it arrives with yajl's callbacks, bounded), its
 * deadline, and the return to the decision (pcr_proxy_dispatch) with the key's token chains,
 * or without them.
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
 * prompts' chains, 16 KiB each). A prompt whose chains would pass it is not kept.
 *
 * The answer is an array of thousands of integers (a 5,500-token chat prompt: 60 KB): a tree
 * of it (a value allocated per id) costs several times what the ids are worth, so yajl's
 * callbacks read it chunk by chunk as it arrives, keep only the ids the chains take, and keep
 * neither the answer nor a tree of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <yajl/yajl_parse.h>

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

/* The answer's reader: {"tokens": [...]} from /tokenize, {"token_ids": [...]} from the chat
 * render, a list of one such object from the completion render. Unknown fields are skipped;
 * the ids array must be there, hold only integers in 0..2^32-1, and (as in a tree, where the
 * last of a repeated key wins) a repeated one replaces the earlier. */
#define ANSWER_MAX_DEPTH 64

typedef struct {
    const char *key;              /* "tokens" or "token_ids" */
    size_t keylen;
    unsigned depth;               /* maps and arrays open */
    unsigned obj_depth;           /* the answer object's depth: 1, or 2 in a list (0: not yet) */
    unsigned elements;            /* of a list at the root */
    int want_ids;                 /* the key was the ids': its value comes next */
    int in_ids;                   /* in the ids array */
    int seen;                     /* an ids array was read */
    int bad;
    uint32_t *ids;                /* the first `keep` of them */
    size_t n, cap, keep;          /* n: all of them, counted */
} answer_t;

struct pcr_tokreq {
    pcr_exchange_t *ex;
    pcr_upreq_t *up;
    struct event *deadline;
    yajl_handle y;                /* the answer's parser, once a 200 head came */
    answer_t a;
    size_t bytes;                 /* of the answer, at most routing.tokenize_max_bytes */
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
    if (t->y != NULL)
        yajl_free(t->y);
    free(t->a.ids);
    free(t);
    ex->tok = NULL;
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    finish(arg, FAIL_TIMEOUT);
}

/* ---- the answer ------------------------------------------------------------------------ */

/* Every value: a scalar (start 0) or a map or array opening (start 1, array: is_array). The
 * value of the ids key must be an array; in it, only integers. */
static int answer_value(answer_t *a, int start, int is_array)
{
    if (a->want_ids) {
        a->want_ids = 0;
        if (!start || !is_array)
            return 0;
        a->in_ids = 1;
        a->seen = 1;
        a->n = 0; /* a repeated key: the last one wins */
        return 1;
    }
    if (a->in_ids && a->depth == a->obj_depth + 1)
        return 0; /* not an integer in the ids array */
    if (a->depth == 0) {
        /* The root: the object, or a list of it. */
        if (!start)
            return 0;
        a->obj_depth = is_array ? 2 : 1;
    } else if (a->depth == 1 && a->obj_depth == 2) {
        /* An element of a list at the root: exactly one, the object. */
        if (!start || is_array || a->elements++ != 0)
            return 0;
    }
    return 1;
}

static int ans_open(answer_t *a, int is_array)
{
    if (!answer_value(a, 1, is_array) || a->depth >= ANSWER_MAX_DEPTH)
        return 0;
    a->depth++;
    return 1;
}

static int ans_close(answer_t *a)
{
    if (a->in_ids && a->depth == a->obj_depth + 1)
        a->in_ids = 0;
    a->depth--;
    return 1;
}

static int on_ans_null(void *ctx) { return answer_value(ctx, 0, 0); }
static int on_ans_bool(void *ctx, int v) { return answer_value(ctx, 0, 0); }
static int on_ans_double(void *ctx, double v) { return answer_value(ctx, 0, 0); }
static int on_ans_string(void *ctx, const unsigned char *s, size_t n)
{
    return answer_value(ctx, 0, 0);
}
static int on_ans_start_map(void *ctx) { return ans_open(ctx, 0); }
static int on_ans_start_array(void *ctx) { return ans_open(ctx, 1); }
static int on_ans_end(void *ctx) { return ans_close(ctx); }

static int on_ans_key(void *ctx, const unsigned char *k, size_t n)
{
    answer_t *a = ctx;
    if (a->depth == a->obj_depth)
        a->want_ids = n == a->keylen && memcmp(k, a->key, n) == 0;
    return 1;
}

static int on_ans_integer(void *ctx, long long v)
{
    answer_t *a = ctx;
    if (!a->in_ids || a->depth != a->obj_depth + 1)
        return answer_value(a, 0, 0);
    if (v < 0 || v > (long long)UINT32_MAX)
        return 0;
    if (a->n < a->keep) {
        if (a->n == a->cap) {
            size_t cap = a->cap ? a->cap * 2 : 1024;
            cap = cap < a->keep ? cap : a->keep;
            uint32_t *ids = realloc(a->ids, cap * sizeof(uint32_t));
            if (ids == NULL)
                return 0;
            a->ids = ids;
            a->cap = cap;
        }
        a->ids[a->n] = (uint32_t)v;
    }
    a->n++;
    return 1;
}

static const yajl_callbacks answer_cbs = {
    on_ans_null, on_ans_bool, on_ans_integer, on_ans_double, NULL, on_ans_string,
    on_ans_start_map, on_ans_key, on_ans_end, on_ans_start_array, on_ans_end,
};

static void on_tok_head(void *ctx, int status, const pcr_hdr_t *h, size_t n, int64_t clen)
{
    pcr_exchange_t *ex = ctx;
    struct pcr_tokreq *t = ex->tok;
    /* A head is the start of an answer: nothing read before it counts. */
    if (t->y != NULL)
        yajl_free(t->y);
    t->y = NULL;
    free(t->a.ids);
    t->a = (answer_t){0};
    t->bytes = 0;
    t->too_large = 0;
    t->status = status;
    if (status != 200)
        return;
    /* Only the tokens the chains take are kept; every one is checked and counted. */
    t->a.key = t->render ? "token_ids" : "tokens";
    t->a.keylen = strlen(t->a.key);
    t->a.keep = pcr_policy_max_tblocks(ex->w->policy) * ex->w->cfg->routing.kv_block_tokens;
    t->y = yajl_alloc(&answer_cbs, NULL, &t->a);
    if (t->y == NULL)
        t->a.bad = 1;
}

static void on_tok_body(void *ctx, const char *data, size_t len)
{
    pcr_exchange_t *ex = ctx;
    struct pcr_tokreq *t = ex->tok;
    if (t->too_large || t->a.bad || t->y == NULL)
        return;
    if (t->bytes + len > ex->w->cfg->routing.tokenize_max_bytes) {
        t->too_large = 1;
        return;
    }
    t->bytes += len;
    if (yajl_parse(t->y, (const unsigned char *)data, len) != yajl_status_ok)
        t->a.bad = 1;
}

/* The answer's ids, read, into the key's chains. */
static int read_answer(pcr_exchange_t *ex)
{
    struct pcr_tokreq *t = ex->tok;
    answer_t *a = &t->a;
    const pcr_policy_t *p = ex->w->policy;
    size_t room = pcr_policy_max_tblocks(p);
    if (a->bad || t->y == NULL || yajl_complete_parse(t->y) != yajl_status_ok || !a->seen ||
        room == 0 || room > ex->tblocks_cap)
        return -1;
    ex->key.tblocks = ex->tblocks;
    if (pcr_policy_key_tokens(p, 0, a->ids, a->n < a->keep ? a->n : a->keep, &ex->key) != 0)
        return -1;
    ex->key.prompt_tokens = a->n;
    return 0;
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
    if (t != NULL)
        t->deadline = evtimer_new(w->base, on_deadline, ex);
    if (t == NULL || req == NULL || pool == NULL || t->deadline == NULL ||
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
