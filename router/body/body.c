/* router/body/body.c: reads an OpenAI-style request body (router/body/body.h) as it arrives, and
 * hashes its canonical prompt bytes into the prefix key while it does.
 *
 * The canonical bytes
 * -------------------
 * They are made of the JSON text as sent: every string as its raw bytes between the quotes
 * (escapes undecoded), every other value as compact JSON (no whitespace) with its strings the
 * same way. Raw JSON text never holds a byte below 0x20 (yajl refuses one in a string), so
 * the records are framed by such bytes, and no content byte can be mistaken for framing:
 *
 * /v1/completions: a string "prompt" is its raw bytes; any other prompt (a token-id array, an
 * array of prompts, ...) is 0x06 followed by its compact JSON.
 *
 * /v1/chat/completions: each message in order, each ending with its role:
 *
 *   0x02 <text>            string content, or a run of text parts one after the other (so
 *                          "hi" and [{"type":"text","text":"hi"}] give the same bytes, as a
 *                          chat template renders them); a part's "type":"text" adds nothing
 *   0x03 "<key>":<JSON>    any other member of a content part ("type":"image_url", ...)
 *   0x05 <JSON>            the message's "tool_calls"
 *   0x01 <role>            last: ends the message (and any run of text)
 *
 * in the order the message's fields come. Example: {"messages":[{"role":"user","content":
 * "hi"}]} gives "\x02hi\x01user". A message's bytes depend on that message only, so a
 * request that repeats the previous turn's messages and adds some extends the previous
 * turn's bytes: the property that makes a conversation's turns share their prefix blocks.
 * The role is written last because a message's fields may come in any order, and the
 * content must be hashed as it arrives. "tools" (any place in the body) is not in these
 * bytes: its compact JSON is hashed apart and mixed, with the model, into every block
 * (pcr/prefix.h), since a chat template puts the tools before the first message.
 *
 * Why raw bytes: a stream cannot know a string's decoded length before its end (the old
 * netstring framing needed it first), and decoding escapes would mean a JSON lexer of our
 * own. The price: "\u00e9" and "é" (or "\/" and "/") hash differently. A client writes one
 * conversation's turns with the same encoder, so its turns still share prefixes; two
 * clients spelling one prompt two ways at worst miss a cache, never get a wrong answer.
 *
 * How: body_scan.c feeds yajl and says where strings are; body_fields.c, driven by yajl's
 * callbacks and those string events, knows which field is which and writes the records here.
 * This file has the output (the prefix key's stream, and the bytes themselves for tests) and
 * the API. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "body_int.h"
#include "evmem.h"
#include "pcr/common.h"

/* ---- errors ------------------------------------------------------------------------------- */

/* A fatal error: yajl stops (callbacks return 0). */
int pcr_body_fatal(pcr_body_reader_t *r, int rc, const char *fmt, ...)
{
    if (r->err.rc == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err.msg, sizeof(r->err.msg), fmt, ap);
        va_end(ap);
        r->err.rc = rc;
    }
    return 0;
}

/* A field error: kept for finish, while yajl reads on, so that a body that is not JSON at all
 * is told so whatever its fields. Returns 1 (go on). */
int pcr_body_inval(pcr_body_reader_t *r, const char *fmt, ...)
{
    if (!r->inval) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->inval_msg, sizeof(r->inval_msg), fmt, ap);
        va_end(ap);
        r->inval = 1;
    }
    return 1;
}

int pcr_body_nomem(pcr_body_reader_t *r)
{
    return pcr_body_fatal(r, PCR_ERR_NOMEM, "out of memory while reading the request body");
}

/* ---- output: the canonical bytes and the context ------------------------------------------ */

static int buf_put(buf_t *b, const void *data, size_t n)
{
    /* Kept for tests and tools only (keep_canonical), which read bodies far below the cap. */
    int rc = pcr_grow(&b->p, &b->cap, b->len + n + 1, 256, (size_t)1 << 30, NULL);
    if (rc != 0)
        return rc;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static int context_flush(pcr_body_reader_t *r)
{
    int rc = r->cplen > 0 ? pcr_prefix_stream_context(r->key, r->cpend, r->cplen) : 0;
    r->cplen = 0;
    return rc;
}

static int context_put(pcr_body_reader_t *r, const void *p, size_t n)
{
    if (r->cplen + n > sizeof(r->cpend)) {
        int rc = context_flush(r);
        if (rc != 0 || n > sizeof(r->cpend))
            return rc != 0 ? rc : pcr_prefix_stream_context(r->key, p, n);
    }
    memcpy(r->cpend + r->cplen, p, n);
    r->cplen += n;
    return 0;
}

/* Returns 1, or 0 after a fatal error (so callbacks can return it). */
int pcr_body_emit(pcr_body_reader_t *r, int sink, const void *p, size_t n)
{
    int rc = sink == SINK_CANON ? pcr_prefix_stream_update(r->key, p, n) : context_put(r, p, n);
    if (rc == 0 && r->o.keep_canonical)
        rc = buf_put(sink == SINK_CANON ? &r->canon : &r->context, p, n);
    return rc == 0 ? 1 : pcr_body_nomem(r);
}

int pcr_body_emit_c(pcr_body_reader_t *r, int sink, char c)
{
    return pcr_body_emit(r, sink, &c, 1);
}

int pcr_body_emit_tag(pcr_body_reader_t *r, char tag)
{
    r->text_open = 0;
    return pcr_body_emit_c(r, SINK_CANON, tag);
}

int pcr_body_text_begin(pcr_body_reader_t *r)
{
    if (r->text_open)
        return 1;
    if (!pcr_body_emit_tag(r, TAG_TEXT))
        return 0;
    r->text_open = 1;
    return 1;
}

/* ---- the API ------------------------------------------------------------------------------- */

void pcr_body_opts_default(pcr_body_opts_t *o)
{
    pcr_policy_opts_t po;
    pcr_policy_opts_default(&po);
    memset(o, 0, sizeof(*o));
    o->block_bytes = po.block_bytes;
    o->max_prefix_bytes = po.max_prefix_bytes;
}

/* Spare readers: a reader is about 40 KiB in a handful of blocks (the reader with its level
 * stack and the scanner with its scratch, from router/core/evmem.c's spans; the prefix chain),
 * too large for malloc's per-thread caches, and one is needed per request. Freed readers are
 * kept on their thread's list, up to SPARE_MAX, and the next reader is one of them, reset. A
 * reader lives while its body arrives: with bodies of more than one read, every client
 * sending one holds a reader at once, and with 16 kept, 64 clients sending 32 KiB bodies made
 * and zeroed 48 new readers per round (2.5% of the CPU). 64 kept: at most 2.6 MiB per thread. */
#define SPARE_MAX 64

static __thread pcr_spare_t spare;

static void reader_destroy(pcr_body_reader_t *r)
{
    pcr_body_scan_free(r->scan);
    pcr_prefix_stream_free(r->key);
    free(r->canon.p);
    free(r->context.p);
    pcr_evmem_free(r);
}

/* A spare reader made like new for `api` and `o`, or NULL. */
static pcr_body_reader_t *reader_reuse(pcr_api_t api, const pcr_body_opts_t *o)
{
    pcr_spare_link_t *link = pcr_spare_take(&spare);
    if (link == NULL)
        return NULL;
    pcr_body_reader_t *r = PCR_SPARE_OBJ(link, pcr_body_reader_t, spare);
    pcr_body_scan_t *scan = r->scan;
    pcr_prefix_stream_t *key = r->key;
    if (r->o.block_bytes != o->block_bytes || r->o.max_prefix_bytes != o->max_prefix_bytes) {
        pcr_prefix_stream_free(key); /* made for other sizes (a reload changed them) */
        key = pcr_prefix_stream_new(o->block_bytes, o->max_prefix_bytes);
    } else {
        pcr_prefix_stream_reset(key);
    }
    free(r->canon.p);
    free(r->context.p);
    memset(r, 0, offsetof(pcr_body_reader_t, st));
    r->api = api;
    r->o = *o;
    r->scan = scan;
    r->key = key;
    if (key == NULL || pcr_body_scan_reset(scan) != 0) {
        reader_destroy(r);
        return NULL;
    }
    return r;
}

void pcr_body_reader_cache_clear(void)
{
    pcr_spare_link_t *link;
    while ((link = pcr_spare_take(&spare)) != NULL)
        reader_destroy(PCR_SPARE_OBJ(link, pcr_body_reader_t, spare));
}

pcr_body_reader_t *pcr_body_reader_new(pcr_api_t api, const pcr_body_opts_t *opts)
{
    pcr_body_opts_t o;
    if (opts == NULL)
        pcr_body_opts_default(&o);
    else
        o = *opts;
    if (o.block_bytes == 0 || o.max_prefix_bytes == 0)
        return NULL;
    pcr_body_reader_t *r = reader_reuse(api, &o);
    if (r != NULL)
        return r;
    r = pcr_evmem_calloc_in(1, sizeof(*r), PCR_MEMCOUNT_READERS);
    if (r == NULL)
        return NULL;
    r->api = api;
    r->o = o;
    r->key = pcr_prefix_stream_new(o.block_bytes, o.max_prefix_bytes);
    r->scan = pcr_body_scan_new(&pcr_body_p_callbacks, &pcr_body_scan_callbacks, r, &r->err);
    if (r->key == NULL || r->scan == NULL) {
        reader_destroy(r);
        return NULL;
    }
    return r;
}

void pcr_body_reader_free(pcr_body_reader_t *r)
{
    if (r == NULL)
        return;
    if (!pcr_spare_put(&spare, &r->spare, SPARE_MAX))
        reader_destroy(r);
}

int pcr_body_reader_feed(pcr_body_reader_t *r, const void *data, size_t len)
{
    if (r == NULL)
        return PCR_ERR_INVAL;
    if (r->finished) {
        if (r->err.rc == 0)
            pcr_body_fatal(r, PCR_ERR_INVAL, "request body fed after its end");
        return r->err.rc;
    }
    return pcr_body_scan_feed(r->scan, data, len);
}

const char *pcr_body_reader_error(const pcr_body_reader_t *r)
{
    if (r == NULL)
        return "";
    return r->err.rc != 0 ? r->err.msg : r->inval ? r->inval_msg : "";
}

static char *dup_bytes(const char *p, size_t n)
{
    char *d = malloc(n + 1);
    if (d != NULL) {
        if (n > 0)
            memcpy(d, p, n);
        d[n] = '\0';
    }
    return d;
}

int pcr_body_reader_finish(pcr_body_reader_t *r, pcr_body_t *out)
{
    int rc;

    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (r == NULL || out == NULL)
        return PCR_ERR_INVAL;
    if (r->finished) {
        if (r->err.rc == 0)
            pcr_body_fatal(r, PCR_ERR_INVAL, "request body finished twice");
        return r->err.rc;
    }
    r->finished = 1;
    if ((rc = pcr_body_scan_finish(r->scan)) != 0)
        return rc;
    if (r->inval)
        return PCR_ERR_INVAL;
    int want = r->api == PCR_API_CHAT ? KEY_MESSAGES : KEY_PROMPT;
    if (!(r->root_seen & (1u << want))) {
        pcr_body_inval(r, "'%s' is required", want == KEY_MESSAGES ? "messages" : "prompt");
        return PCR_ERR_INVAL;
    }
    if (context_flush(r) != 0) {
        pcr_body_nomem(r);
        return PCR_ERR_NOMEM;
    }
    /* As many blocks as the bytes fed can make (the context's bytes are counted too: a bound,
     * not the count): a short prompt's key is a small block, not the longest key's 4 KiB. */
    size_t max = pcr_prefix_max_blocks(r->o.block_bytes, r->o.max_prefix_bytes);
    uint64_t fed = pcr_prefix_stream_bytes(r->key);
    if (fed / r->o.block_bytes + 1 < max)
        max = (size_t)(fed / r->o.block_bytes) + 1;
    out->blocks = malloc((max ? max : 1) * sizeof(uint64_t));
    out->model = dup_bytes(r->model, r->model_len);
    if (out->blocks == NULL || out->model == NULL)
        goto oom;
    out->nblocks = pcr_prefix_stream_finish(r->key, r->model, r->model_len, out->blocks, &rc);
    if (rc != 0)
        goto oom;
    out->model_len = r->model_len;
    out->stream = r->stream;
    out->include_usage = r->include_usage;
    out->stream_options = r->stream_options;
    out->max_tokens = r->max_tokens;
    out->user_hash = r->user_hash;
    out->has_user = r->has_user;
    out->has_priority = r->has_priority;
    uint64_t bytes = pcr_prefix_stream_bytes(r->key);
    out->prompt_tokens =
        (size_t)(bytes / PCR_BYTES_PER_TOKEN + (bytes % PCR_BYTES_PER_TOKEN != 0));
    if (r->o.keep_canonical) {
        out->key = dup_bytes(r->canon.p, r->canon.len);
        out->key_len = r->canon.len;
        out->context = dup_bytes(r->context.p, r->context.len);
        out->context_len = r->context.len;
        if (out->key == NULL || out->context == NULL)
            goto oom;
    }
    return 0;
oom:
    pcr_body_dispose(out);
    pcr_body_nomem(r);
    return PCR_ERR_NOMEM;
}

int pcr_body_parse_opts(pcr_api_t api, const pcr_body_opts_t *opts, const char *buf, size_t len,
                        pcr_body_t *out, char *err, size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    if (out == NULL || (buf == NULL && len > 0)) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "no request body");
        return PCR_ERR_INVAL;
    }
    pcr_body_reader_t *r = pcr_body_reader_new(api, opts);
    if (r == NULL) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen, "out of memory while reading the request body");
        return PCR_ERR_NOMEM;
    }
    int rc = pcr_body_reader_feed(r, buf, len);
    if (rc == 0)
        rc = pcr_body_reader_finish(r, out);
    if (rc != 0 && err != NULL && errlen > 0)
        snprintf(err, errlen, "%s", pcr_body_reader_error(r));
    pcr_body_reader_free(r);
    return rc;
}

int pcr_body_parse(pcr_api_t api, const char *buf, size_t len, pcr_body_t *out, char *err,
                   size_t errlen)
{
    pcr_body_opts_t o;
    pcr_body_opts_default(&o);
    o.keep_canonical = 1;
    return pcr_body_parse_opts(api, &o, buf, len, out, err, errlen);
}

void pcr_body_dispose(pcr_body_t *b)
{
    if (b == NULL)
        return;
    free(b->model);
    free(b->blocks);
    free(b->key);
    free(b->context);
    memset(b, 0, sizeof(*b));
}
