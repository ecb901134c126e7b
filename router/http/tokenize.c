/* router/http/tokenize.c: owns precise mode's tokenization of a routed request (tokenize.h):
 * the workers' shared cache of token chains, the question to a pod that serves the model (made
 * of the request's own fields; its answer read as it arrives with yajl's callbacks, bounded),
 * its deadline, and the return to the decision (pcr_proxy_dispatch) with the key's token
 * chains, or without them.
 *
 *   routed -> key -> cache hit?  yes: chains into the key -> dispatch
 *                    prefix hit?  yes: the cached prompt's chains, as many as the shared
 *                                      text's share of its tokens less one, or the text
 *                                      key alone (pcr_policy_prefix_use) -> dispatch;
 *                                      a refresh (the prompt's own tokens, for the cache;
 *                                      an unknown tail's check reported with them);
 *                                      unless the policy says wait (or probe): as no
 *                                no:  POST /tokenize (or .../render) on the worker's pool for
 *                                     tokenizing -> answer: chains, cached (a probe
 *                                     reported) -> dispatch
 *                                                -> error, timeout: dispatch on the text key
 *
 * The cache is the process's (every worker's, under one lock) and direct-mapped, its slot the
 * prompt's last chained text block (which names the whole prompt: the model, a chat's tools
 * and a last partial block are mixed in, pcr/prefix.h) with the prompt's length: a colliding
 * prompt replaces the older one. It holds the chains and text blocks, never the tokens, at
 * most routing.tokenize_cache_entries prompts and, all together, at most
 * routing.tokenize_cache_bytes (8 bytes a block, the chains up to max_prefix_bytes' worth:
 * without the byte bound, the entries alone could hold 4096 long prompts' blocks, 160 KiB
 * each). Past it, older prompts make room (make_room); one larger than it alone is not kept.
 * Its prefix
 * map (routing.tokenize_reuse_prefix) names, for each text block of a cached prompt but its
 * last, the slot that holds it: a prompt that begins as a cached one did is routed without
 * waiting for a pod, and a refresh, which no request waits for, caches its own tokens.
 *
 * The answer is an array of thousands of integers (a 5,500-token chat prompt: 60 KB): a tree
 * of it (a value allocated per id) costs several times what the ids are worth, so yajl's
 * callbacks read it chunk by chunk as it arrives, keep only the ids the chains take, and keep
 * neither the answer nor a tree of it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <yajl/yajl_parse.h>

#include "body_raw.h"
#include "log.h"
#include "pools.h"
#include "tokenize.h"

enum { FAIL_TIMEOUT = 0, FAIL_ERROR, FAIL_ANSWER, FAIL_NO_POD };

typedef struct {
    uint64_t key, check;          /* the last text block; its length and count of blocks */
    uint64_t prompt_tokens;       /* the exact count the pod gave */
    uint64_t text_tokens;         /* the text key's count (canonical bytes / 4) */
    uint64_t *chains;             /* heap, the prompt's text blocks but the last right after
                                   * them (ntext): where a prompt that begins as it does parts
                                   * from it; NULL: an empty slot */
    size_t nchains;
    size_t ntext;
    uint32_t gen;                 /* which prompt the slot holds: new at each put, 0 never */
    uint32_t block_tokens;        /* the policy's kv_block_tokens when the chains were cut: a
                                   * reload that changes it leaves them unused */
} tokslot_t;

/* The prefix map: each text block of a cached prompt but its last (which may be partial)
 * names the slot that holds the prompt and its place there. Direct-mapped: a later prompt
 * with the same block, or a colliding one, takes the entry; any entry of the prompt left
 * leads to its slot, whose own text blocks then say how far the two prompts agree. */
typedef struct {
    uint64_t key;                 /* the text block's chained hash */
    uint32_t slot, gen, block;    /* gen: the slot's when it was put (0: an empty entry) */
} tokpref_t;

#define PREFIX_ENTRIES_PER_SLOT 16

/* The process's cache, shared by the workers (srv->tokcache): a conversation's turns and an
 * agent's steps come on connections of their own, to any worker, and each finds the tokens of
 * the one before whichever worker asked for them. One lock: a lookup or a put copies at most a
 * prompt's chains and walks its text blocks once, in microseconds. */
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

struct pcr_tokcache {
    tokslot_t *slots;
    size_t n;
    tokpref_t *pref;
    size_t npref;
    size_t bytes;                 /* the slots' chains and text blocks, at most
                                   * routing.tokenize_cache_bytes */
    uint32_t gen;
    size_t hand;                  /* the next slot make_room frees */
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
    pcr_worker_t *w;
    pcr_exchange_t *ex;           /* the request waiting for it; NULL: a refresh */
    pcr_key_t *key;               /* the text key in, its token chains out: &ex->key, or &own */
    pcr_key_t own;                /* a refresh's copy of the text key; blocks and tblocks heap */
    pcr_upreq_t *up;
    struct event *deadline;
    yajl_handle y;                /* the answer's parser, once a 200 head came */
    answer_t a;
    size_t bytes;                 /* of the answer, at most routing.tokenize_max_bytes */
    int status;
    int too_large;
    int render;                   /* the answer is a render endpoint's */
    uint64_t t0_ns;               /* a waiting request's start (pcr_tokenize_start) */
    /* A refresh's question is sent once its request was dispatched (`go`): until then it keeps
     * a copy of the request's body and what the pod must serve. */
    struct event *go;
    char *raw;
    size_t rawlen;
    char *model;
    uint64_t model_hash;
    int chat;
    /* A refresh of an unknown tail that went without waiting: its chains are checked as a
     * waiting probe's are (pcr_policy_prefix_probed), `tail_known` the chains it went on. */
    int tail;
    size_t tail_known;
};

/* ---- the cache (under cache_lock) ---------------------------------------------------- */

static struct pcr_tokcache *cache_of(pcr_worker_t *w, int make)
{
    unsigned want = w->cfg->routing.tokenize_cache_entries;
    struct pcr_tokcache *c = w->srv->tokcache;
    if (c != NULL || !make || want == 0)
        return c;
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->npref = (size_t)want * PREFIX_ENTRIES_PER_SLOT;
    c->slots = calloc(want, sizeof(*c->slots));
    c->pref = calloc(c->npref, sizeof(*c->pref));
    if (c->slots == NULL || c->pref == NULL) {
        free(c->slots);
        free(c->pref);
        free(c);
        return NULL;
    }
    c->n = want;
    w->srv->tokcache = c;
    return c;
}

/* The slots in use: a reload may change the size; the slots in place are kept, fewer or more
 * used. */
static size_t cache_used(const pcr_worker_t *w, const struct pcr_tokcache *c)
{
    unsigned want = w->cfg->routing.tokenize_cache_entries;
    return c->n < want ? c->n : want;
}

static tokslot_t *cache_slot(pcr_worker_t *w, const pcr_key_t *k, uint64_t *check, int make)
{
    if (w->cfg->routing.tokenize_cache_entries == 0 || k->nblocks == 0)
        return NULL;
    struct pcr_tokcache *c = cache_of(w, make);
    if (c == NULL)
        return NULL;
    uint64_t key = k->blocks[k->nblocks - 1];
    *check = k->prompt_tokens << 20 ^ k->nblocks;
    return &c->slots[key % cache_used(w, c)];
}

/* Room for `room` chains (at least one) in the exchange, kept when it is recycled: as many
 * as the prompt makes, not the horizon's worth (pcr_policy_max_tblocks). */
static int tblocks_room(pcr_exchange_t *ex, size_t room)
{
    room = room > 0 ? room : 1;
    if (ex->tblocks_cap >= room)
        return 0;
    uint64_t *b = realloc(ex->tblocks, room * sizeof(uint64_t));
    if (b == NULL)
        return PCR_ERR_NOMEM;
    ex->tblocks = b;
    ex->tblocks_cap = room;
    return 0;
}

static int cache_get(pcr_exchange_t *ex)
{
    uint64_t check;
    int hit = 0;
    pthread_mutex_lock(&cache_lock);
    tokslot_t *s = cache_slot(ex->w, &ex->key, &check, 0);
    if (s != NULL && s->chains != NULL && s->key == ex->key.blocks[ex->key.nblocks - 1] &&
        s->check == check && s->block_tokens == pcr_policy_kv_block_tokens(ex->w->policy) &&
        tblocks_room(ex, s->nchains) == 0) {
        memcpy(ex->tblocks, s->chains, s->nchains * sizeof(uint64_t));
        ex->key.tblocks = ex->tblocks;
        ex->key.ntblocks = s->nchains;
        ex->key.prompt_tokens = s->prompt_tokens;
        hit = 1;
    }
    pthread_mutex_unlock(&cache_lock);
    return hit;
}

/* A prompt not cached whole whose text begins as a cached prompt's does: the longest such
 * prefix the map knows, from the prompt's last whole text block down. The shared text is
 * blocks 0..i; its tokens are counted in the cached prompt's proportion of tokens to text
 * (no byte offsets come with the tokens), and one block less is taken, for the tokens a
 * tokenizer merges across the end of the shared text. The request gets those chains and its
 * prompt's tokens counted in the same proportion (PCR_PREFIX_TOKENS, or _UNPROBED), unless
 * pcr_policy_prefix_use says its text key tells more (PCR_PREFIX_TEXT) or its own tokens could
 * change the decision (PCR_PREFIX_WAIT, as when no prefix is found, or _PROBE). */
static pcr_prefix_use_t prefix_get(pcr_exchange_t *ex)
{
    pcr_worker_t *w = ex->w;
    const pcr_routing_conf_t *rc = &w->cfg->routing;
    uint32_t bt = pcr_policy_kv_block_tokens(w->policy); /* what the chains are cut at */
    pcr_key_t *k = &ex->key;
    uint64_t text_tokens = k->prompt_tokens;
    size_t shared = 0, n = 0;
    if (rc->tokenize_cache_entries == 0 || k->nblocks < 2 || bt == 0)
        return PCR_PREFIX_WAIT;
    pthread_mutex_lock(&cache_lock);
    struct pcr_tokcache *c = w->srv->tokcache;
    size_t used = c != NULL ? cache_used(w, c) : 0;
    for (size_t i = k->nblocks - 1; used > 0 && i-- > 0;) {
        const tokpref_t *e = &c->pref[k->blocks[i] % c->npref];
        if (e->gen == 0 || e->key != k->blocks[i] || e->block != i || e->slot >= used)
            continue;
        const tokslot_t *s = &c->slots[e->slot];
        if (s->chains == NULL || s->gen != e->gen || s->text_tokens == 0 ||
            s->block_tokens != bt)
            continue;
        /* Blocks 0..i agree (a block's chain names its whole prefix); the next ones may too,
         * when the map lost their entries to later prompts. */
        const uint64_t *text = s->chains + s->nchains;
        size_t j = i + 1;
        while (j < s->ntext && j + 1 < k->nblocks && text[j] == k->blocks[j])
            j++;
        i = j - 1;
        uint64_t shared_text = (uint64_t)(i + 1) * rc->block_bytes / 4;
        n = shared_text * s->prompt_tokens / s->text_tokens / bt;
        n = n > 0 ? n - 1 : 0;
        if (n > s->nchains)
            n = s->nchains;
        if (n > 0 && tblocks_room(ex, n) == 0) {
            memcpy(ex->tblocks, s->chains, n * sizeof(uint64_t));
            uint64_t tokens = text_tokens * s->prompt_tokens / s->text_tokens;
            k->prompt_tokens = tokens > n * bt ? tokens : n * bt;
            shared = i + 1;
        }
        break; /* a shorter shared text gives no more */
    }
    pthread_mutex_unlock(&cache_lock);
    if (shared == 0)
        return PCR_PREFIX_WAIT;
    k->tblocks = ex->tblocks;
    k->ntblocks = n;
    /* A pod sent more of this prompt's text than the shared text (a previous turn whose tokens
     * were never cached) that alone holds the shared tokens' blocks: the text says it is
     * there. One that no longer holds them: its own tokens. Several that hold them all, none
     * sent more: its own tokens while such waits pay (tok_known, for the report in finish). */
    pcr_prefix_use_t use = pcr_policy_prefix_use(w->policy, k, shared);
    ex->tok_known = n;
    if (use != PCR_PREFIX_TOKENS && use != PCR_PREFIX_UNPROBED) {
        k->tblocks = NULL;
        k->ntblocks = 0;
        k->prompt_tokens = text_tokens;
    }
    return use;
}

/* Room for `add` bytes in place of `old` (slot `keep`'s) under `limit`: other prompts go, in
 * the order of a hand that sweeps the slots. The cache is direct-mapped and keeps no order of
 * use, so the hand frees prompts in no order that favours one, and a full cache still takes
 * new prompts: turned away, they would leave it holding the first ones for good. */
static void make_room(struct pcr_tokcache *c, const tokslot_t *keep, size_t used, size_t old,
                      size_t add, size_t limit)
{
    for (size_t k = 0; k < used && c->bytes - old + add > limit; k++) {
        tokslot_t *v = &c->slots[c->hand % used];
        c->hand = (c->hand + 1) % used;
        if (v == keep || v->chains == NULL)
            continue;
        c->bytes -= (v->nchains + v->ntext) * sizeof(uint64_t);
        free(v->chains);
        *v = (tokslot_t){0}; /* its prefix entries lead nowhere now (gen 0) */
    }
}

/* The chains of `tok` (its exact count in prompt_tokens) under the text key `text`; each text
 * block of it but the last into the prefix map. */
static void cache_put(pcr_worker_t *w, const pcr_key_t *text, const pcr_key_t *tok)
{
    uint64_t check;
    pthread_mutex_lock(&cache_lock);
    tokslot_t *s = cache_slot(w, text, &check, 1);
    struct pcr_tokcache *c = w->srv->tokcache;
    size_t limit = w->cfg->routing.tokenize_cache_bytes;
    size_t ntext = text->nblocks - 1;
    size_t old = s != NULL && s->chains != NULL ? (s->nchains + s->ntext) * sizeof(uint64_t) : 0;
    size_t add = (tok->ntblocks + ntext) * sizeof(uint64_t);
    /* Past the bound, other prompts make room; one larger than the bound alone is not kept,
     * and its slot keeps what it had. */
    if (s != NULL && limit != 0 && add <= limit)
        make_room(c, s, cache_used(w, c), old, add, limit);
    uint64_t *chains = s == NULL || (limit != 0 && c->bytes - old + add > limit)
                           ? NULL
                           : malloc(add ? add : sizeof(uint64_t));
    if (chains != NULL) {
        memcpy(chains, tok->tblocks, tok->ntblocks * sizeof(uint64_t));
        memcpy(chains + tok->ntblocks, text->blocks, ntext * sizeof(uint64_t));
        free(s->chains);
        c->bytes = c->bytes - old + add;
        PCR_STORE(w->srv->tokcache_bytes,
                  c->bytes + c->n * sizeof(*c->slots) + c->npref * sizeof(*c->pref));
        if (++c->gen == 0)
            c->gen = 1;
        *s = (tokslot_t){text->blocks[text->nblocks - 1], check, tok->prompt_tokens,
                         text->prompt_tokens, chains, tok->ntblocks, ntext, c->gen,
                         pcr_policy_kv_block_tokens(w->policy)};
        uint32_t slot = (uint32_t)(s - c->slots);
        for (size_t i = 0; i + 1 < text->nblocks; i++)
            c->pref[text->blocks[i] % c->npref] = (tokpref_t){text->blocks[i], slot, c->gen,
                                                              (uint32_t)i};
    }
    pthread_mutex_unlock(&cache_lock);
}

static void tokreq_free(struct pcr_tokreq *t);

void pcr_tokenize_worker_free(pcr_worker_t *w)
{
    if (w->tok_refresh != NULL)
        tokreq_free(w->tok_refresh);
    w->tok_refresh = NULL;
}

void pcr_tokenize_server_free(pcr_server_t *srv)
{
    struct pcr_tokcache *c = srv->tokcache;
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->slots[i].chains);
    free(c->slots);
    free(c->pref);
    free(c);
    srv->tokcache = NULL;
    PCR_STORE(srv->tokcache_bytes, 0);
}

/* ---- the question ---------------------------------------------------------------------- */

/* A render endpoint's body: the request itself, less what makes it a stream (jansson: the
 * render mode keeps every field of the request, so it is rebuilt from a tree of it). */
static char *render_body(const char *raw, size_t len, int chat, const char **path)
{
    json_t *root = json_loadb(raw, len, 0, NULL);
    char *out = NULL;
    if (json_is_object(root)) {
        *path = chat ? "/v1/chat/completions/render" : "/v1/completions/render";
        json_object_del(root, "stream");
        json_object_del(root, "stream_options");
        out = json_dumps(root, JSON_COMPACT);
    }
    json_decref(root);
    return out;
}

/* Appends `"name":` and a value's JSON text (a field's as the client sent it). */
static void put_field(struct evbuffer *q, const char *name, const char *json, size_t len)
{
    evbuffer_add_printf(q, "%s\"%s\":", evbuffer_get_length(q) > 1 ? "," : "", name);
    evbuffer_add(q, json, len);
}

/* The body for the pod: /tokenize takes {"model","prompt"} or {"model","messages",
 * "add_generation_prompt"} (with the request's tools, which the chat template renders), a
 * render endpoint the request itself. The fields are the request's own JSON text, found by
 * simdjson (body_raw.h) in a body the reader checked: no tree of the body is made (10 ms for a
 * 400 KB prompt with jansson) and no JSON is parsed by hand. NULL when the request has nothing
 * the pod would take (a prompt of several strings, of token ids: tokens are no question then),
 * or out of memory. */
static char *question_body(const char *raw, size_t len, int chat, int render, const char **path)
{
    if (render)
        return render_body(raw, len, chat, path);
    enum { MODEL, PROMPT, MESSAGES, TOOLS, AGP, NFIELDS };
    static const char *const names[NFIELDS] = {"model", "prompt", "messages", "tools",
                                               "add_generation_prompt"};
    pcr_body_raw_t f[NFIELDS];
    if (pcr_body_raw_fields(raw, len, names, NFIELDS, f) != 0)
        return NULL;
    if (chat ? f[MESSAGES].type != PCR_RAW_ARRAY : f[PROMPT].type != PCR_RAW_STRING)
        return NULL;
    if (f[AGP].type != PCR_RAW_BOOL)
        f[AGP].at = NULL; /* not a boolean: true, as vLLM's default */
    struct evbuffer *q = evbuffer_new();
    if (q == NULL)
        return NULL;
    evbuffer_add(q, "{", 1);
    if (f[MODEL].at != NULL)
        put_field(q, "model", f[MODEL].at, f[MODEL].len);
    if (chat) {
        put_field(q, "messages", f[MESSAGES].at, f[MESSAGES].len);
        if (f[AGP].at != NULL)
            put_field(q, "add_generation_prompt", f[AGP].at, f[AGP].len);
        else
            put_field(q, "add_generation_prompt", "true", 4);
        if (f[TOOLS].at != NULL)
            put_field(q, "tools", f[TOOLS].at, f[TOOLS].len);
    } else {
        put_field(q, "prompt", f[PROMPT].at, f[PROMPT].len);
    }
    evbuffer_add(q, "}", 1);
    *path = "/tokenize";
    size_t n = evbuffer_get_length(q);
    char *out = malloc(n + 1);
    if (out != NULL && evbuffer_remove(q, out, n) == (int)n)
        out[n] = '\0';
    else {
        free(out);
        out = NULL;
    }
    evbuffer_free(q);
    return out;
}

/* A usable pod for the request's model, in turn from the worker's last one: any pod that
 * serves a model tokenizes it as every other does. */
static pcr_backend_t *pick_pod(pcr_worker_t *w, const char *model, uint64_t model_hash)
{
    size_t n = pcr_backend_slots(w->srv);
    uint64_t now = pcr_now_us();
    for (size_t k = 0; k < n; k++) {
        size_t i = (w->tok_next + k) % n;
        pcr_backend_t *be = pcr_backend_at(w->srv, i);
        if (be != NULL && PCR_LOAD(be->up) && !PCR_LOAD(be->removed) &&
            !pcr_backend_ejected(be, now) && pcr_backend_serves(be, model, model_hash)) {
            w->tok_next = (unsigned)(i + 1);
            return be;
        }
    }
    return NULL;
}

static void tokreq_free(struct pcr_tokreq *t)
{
    if (t->up != NULL)
        pcr_upstream_cancel(t->up);
    if (t->deadline != NULL)
        event_free(t->deadline);
    if (t->y != NULL)
        yajl_free(t->y);
    free(t->a.ids);
    if (t->go != NULL)
        event_free(t->go);
    free(t->raw);
    free(t->model);
    free(t->own.blocks);
    free(t->own.tblocks);
    free(t);
}

/* Ends a tokenization: a request's (a failure `why`, or -1 with the key's chains made) is
 * routed; a refresh is only freed. */
static void finish(struct pcr_tokreq *t, int why)
{
    pcr_exchange_t *ex = t->ex;
    if (ex == NULL) {
        if (why < 0 && t->tail) {
            int paid = pcr_policy_prefix_probed(t->w->policy, t->key, t->tail_known);
            PCR_INC(t->w->metrics.tokenize_tail_checked[paid ? 0 : 1]);
        }
        t->w->tok_refresh = NULL;
        tokreq_free(t);
        return;
    }
    pcr_worker_t *w = ex->w;
    ex->ns_tokenize = pcr_now_ns() - t->t0_ns;
    pcr_tokenize_cancel(ex);
    ex->t_hashed_ns = 0; /* the decision reads the clock anew */
    if (why >= 0) {
        PCR_INC(w->metrics.tokenize_failures[why]);
        ex->key.tblocks = NULL;
        ex->key.ntblocks = 0;
    } else if (ex->tok_probe) {
        int paid = pcr_policy_prefix_probed(w->policy, &ex->key, ex->tok_known);
        PCR_INC(w->metrics.tokenize_tail[paid ? 0 : 1]);
    }
    ex->tok_probe = 0;
    pcr_proxy_dispatch(ex);
}

void pcr_tokenize_cancel(pcr_exchange_t *ex)
{
    struct pcr_tokreq *t = ex->tok;
    if (t == NULL)
        return;
    ex->w->tok_asking--;
    tokreq_free(t);
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
    struct pcr_tokreq *t = ctx;
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
    t->a.keep = pcr_policy_max_tblocks(t->w->policy) * t->w->cfg->routing.kv_block_tokens;
    t->y = yajl_alloc(&answer_cbs, NULL, &t->a);
    if (t->y == NULL)
        t->a.bad = 1;
}

static void on_tok_body(void *ctx, const char *data, size_t len)
{
    struct pcr_tokreq *t = ctx;
    if (t->too_large || t->a.bad || t->y == NULL)
        return;
    if (t->bytes + len > t->w->cfg->routing.tokenize_max_bytes) {
        t->too_large = 1;
        return;
    }
    t->bytes += len;
    if (yajl_parse(t->y, (const unsigned char *)data, len) != yajl_status_ok)
        t->a.bad = 1;
}

/* Room for `n` chains (at least one) where t's go: the waiting exchange's, or a refresh's own. */
static uint64_t *chains_room(struct pcr_tokreq *t, size_t n)
{
    n = n > 0 ? n : 1;
    if (t->ex != NULL)
        return tblocks_room(t->ex, n) == 0 ? t->ex->tblocks : NULL;
    uint64_t *b = realloc(t->own.tblocks, n * sizeof(uint64_t));
    if (b != NULL)
        t->own.tblocks = b;
    return b;
}

/* The answer's ids, read, into the key's chains. */
static int read_answer(struct pcr_tokreq *t)
{
    answer_t *a = &t->a;
    const pcr_policy_t *p = t->w->policy;
    size_t kept = a->n < a->keep ? a->n : a->keep;
    if (a->bad || t->y == NULL || yajl_complete_parse(t->y) != yajl_status_ok || !a->seen ||
        pcr_policy_max_tblocks(p) == 0)
        return -1;
    uint64_t *room = chains_room(t, pcr_policy_ntblocks(p, kept));
    if (room == NULL)
        return -1;
    t->key->tblocks = room;
    if (pcr_policy_key_tokens(p, 0, a->ids, kept, t->key) != 0)
        return -1;
    t->key->prompt_tokens = a->n;
    return 0;
}

static void on_tok_done(void *ctx)
{
    struct pcr_tokreq *t = ctx;
    t->up = NULL;
    if (t->status != 200 || t->too_large) {
        finish(t, t->status == 200 ? FAIL_ANSWER : FAIL_ERROR);
        return;
    }
    pcr_key_t text = *t->key;
    if (read_answer(t) != 0) {
        finish(t, FAIL_ANSWER);
        return;
    }
    cache_put(t->w, &text, t->key);
    finish(t, -1);
}

static void on_tok_error(void *ctx, pcr_up_error_t err, int got_head)
{
    struct pcr_tokreq *t = ctx;
    t->up = NULL;
    finish(t, err == PCR_UP_TIMEOUT ? FAIL_TIMEOUT : FAIL_ERROR);
}

static const pcr_upstream_cbs_t tok_cbs = {on_tok_head, on_tok_body, on_tok_done, on_tok_error,
                                           NULL, NULL, NULL, NULL};

/* Asks a pod that serves `model` for the tokens of the prompt in the request body `raw`, for
 * `t`, under routing.tokenize_timeout_ms. -1 when nothing was asked: no pod (*no_pod set), a
 * prompt no pod is asked about, out of memory. */
static int send_question(struct pcr_tokreq *t, const char *raw, size_t len, const char *model,
                         uint64_t model_hash, int chat, int *no_pod)
{
    pcr_worker_t *w = t->w;
    const pcr_config_t *cfg = w->cfg;
    pcr_backend_t *be = pick_pod(w, model != NULL ? model : "", model_hash);
    const char *path = NULL;
    *no_pod = be == NULL;
    t->render = cfg->routing.tokenize_render;
    char *body = be != NULL ? question_body(raw, len, chat, t->render, &path) : NULL;
    if (body == NULL)
        return -1;
    struct evbuffer *req = evbuffer_new();
    pcr_pool_t *pool = pcr_pools_tokenize(w, be);
    int ok = req != NULL && pool != NULL &&
             evbuffer_add_printf(req, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: "
                                      "application/json\r\nContent-Length: %zu\r\n\r\n",
                                 path, be->host_header, strlen(body)) >= 0 &&
             evbuffer_add(req, body, strlen(body)) == 0;
    free(body);
    if (ok)
        t->up = pcr_upstream_send(pool, &(pcr_up_send_t){.head = req}, &tok_cbs, t);
    else if (req != NULL)
        evbuffer_free(req);
    if (!ok || t->up == NULL)
        return -1;
    PCR_INC(w->metrics.tokenize_calls);
    struct timeval tv = pcr_ms_to_tv(cfg->routing.tokenize_timeout_ms);
    event_add(t->deadline, &tv);
    return 0;
}

static int is_chat(const pcr_exchange_t *ex)
{
    return ex->route != NULL && ex->route->api == PCR_API_CHAT;
}

/* Asks a pod for the tokens of ex's prompt, for the request, which waits. NULL when nothing
 * was asked (send_question). */
static struct pcr_tokreq *ask(pcr_exchange_t *ex, int *no_pod)
{
    struct pcr_tokreq *t = calloc(1, sizeof(*t));
    *no_pod = 0;
    if (t == NULL)
        return NULL;
    t->w = ex->w;
    t->ex = ex;
    t->key = &ex->key;
    t->deadline = evtimer_new(ex->w->base, on_deadline, t);
    size_t len = evbuffer_get_length(ex->body);
    const char *raw = len ? (const char *)evbuffer_pullup(ex->body, -1) : "";
    if (t->deadline == NULL || raw == NULL ||
        send_question(t, raw, len, ex->req.model, ex->model_hash, is_chat(ex), no_pod) != 0) {
        tokreq_free(t);
        return NULL;
    }
    return t;
}

/* A refresh's question, once the loop has dispatched its request: making it (simdjson's walk
 * of the body, a copy of its fields) is not on the request's way. */
static void refresh_go(evutil_socket_t fd, short what, void *arg)
{
    struct pcr_tokreq *t = arg;
    pcr_worker_t *w = t->w;
    int no_pod;
    int rc = send_question(t, t->raw, t->rawlen, t->model, t->model_hash, t->chat, &no_pod);
    free(t->raw);
    t->raw = NULL;
    if (rc != 0) {
        w->tok_refresh = NULL;
        tokreq_free(t);
        return;
    }
    PCR_INC(w->metrics.tokenize_refreshes);
}

/* After a prefix hit: the prompt's own tokens for the cache, so that the next prompt that
 * extends it (a conversation's next turn) finds it; for an unknown tail that went unprobed,
 * also the check of whether waiting would have paid (`tail`). At most one at a time a worker,
 * started only while no request of the worker waits for a tokenization (a request that comes
 * after takes the pool's other connection). Its question is made and sent from the loop
 * (refresh_go), after the request that found the prefix is dispatched; `text` is copied. */
static void refresh(pcr_exchange_t *ex, const pcr_key_t *text, int tail)
{
    pcr_worker_t *w = ex->w;
    if (w->tok_refresh != NULL || w->tok_asking != 0 || w->draining)
        return;
    struct pcr_tokreq *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return;
    t->w = w;
    t->tail = tail;
    t->tail_known = ex->tok_known;
    t->own = *text;
    t->own.tblocks = NULL; /* made with the answer (chains_room) */
    t->own.ntblocks = 0;
    t->key = &t->own;
    t->own.blocks = malloc(text->nblocks * sizeof(uint64_t));
    t->rawlen = evbuffer_get_length(ex->body);
    t->raw = malloc(t->rawlen + 1);
    t->model = ex->req.model != NULL ? strdup(ex->req.model) : NULL;
    t->model_hash = ex->model_hash;
    t->chat = is_chat(ex);
    t->deadline = evtimer_new(w->base, on_deadline, t);
    t->go = event_new(w->base, -1, 0, refresh_go, t);
    if (t->own.blocks == NULL || t->raw == NULL || (ex->req.model != NULL && t->model == NULL) ||
        t->deadline == NULL || t->go == NULL ||
        evbuffer_copyout(ex->body, t->raw, t->rawlen) != (ev_ssize_t)t->rawlen) {
        tokreq_free(t);
        return;
    }
    memcpy(t->own.blocks, text->blocks, text->nblocks * sizeof(uint64_t));
    event_active(t->go, EV_TIMEOUT, 1);
    w->tok_refresh = t;
}

int pcr_tokenize_start(pcr_exchange_t *ex)
{
    pcr_worker_t *w = ex->w;
    const pcr_config_t *cfg = w->cfg;
    if (!cfg->routing.index_events || pcr_policy_max_tblocks(w->policy) == 0 || !ex->has_key)
        return 1;
    uint64_t t0 = pcr_now_ns();
    ex->tokenized = 1;
    ex->tok_probe = 0;
    if (cache_get(ex)) {
        PCR_INC(w->metrics.tokenize_cache_hits);
        ex->ns_tokenize = pcr_now_ns() - t0;
        return 1;
    }
    pcr_key_t text = ex->key;
    pcr_prefix_use_t reuse =
        cfg->routing.tokenize_reuse_prefix ? prefix_get(ex) : PCR_PREFIX_WAIT;
    if (reuse != PCR_PREFIX_WAIT && reuse != PCR_PREFIX_PROBE) {
        if (reuse == PCR_PREFIX_TEXT)
            PCR_INC(w->metrics.tokenize_prefix_text);
        else
            PCR_INC(w->metrics.tokenize_prefix_hits);
        if (reuse == PCR_PREFIX_UNPROBED)
            PCR_INC(w->metrics.tokenize_tail[2]);
        refresh(ex, &text, reuse == PCR_PREFIX_UNPROBED);
        ex->ns_tokenize = pcr_now_ns() - t0;
        return 1;
    }
    int no_pod;
    ex->tok = ask(ex, &no_pod);
    if (ex->tok == NULL) {
        /* No pod, a prompt no pod is asked about, or out of memory: routed on the text key
         * (with no pod, as a tokenization that failed). */
        if (no_pod)
            PCR_INC(w->metrics.tokenize_failures[FAIL_NO_POD]);
        ex->tokenized = no_pod;
        ex->ns_tokenize = pcr_now_ns() - t0;
        return 1;
    }
    ex->tok->t0_ns = t0;
    ex->tok_probe = reuse == PCR_PREFIX_PROBE;
    w->tok_asking++;
    return 0;
}
