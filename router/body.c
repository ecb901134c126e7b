/* router/body.c: reads an OpenAI-style request body (router/body.h) as it arrives, and hashes
 * its canonical prompt bytes into the prefix key while it does.
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
 * How: body_scan.c feeds yajl and tells this file where strings are; yajl's callbacks drive a
 * stack of levels (root, messages, message, content parts, part, and "emit" levels that
 * copy a value out as compact JSON), which decides where each string's raw bytes go. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "body.h"
#include "body_scan.h"
#include "pcr/common.h"
#include "pcr/prefix.h"

#define MAX_DEPTH 256
#define SMALL 64                        /* strings we need only raw: P reads them up to this */
#define NAME_MAX_BYTES PCR_SCAN_SHORT_MAX /* model, role, part type, keys we interpret */

enum { TAG_ROLE = 0x01, TAG_TEXT = 0x02, TAG_MEMBER = 0x03, TAG_CALLS = 0x05, TAG_JSON = 0x06 };

/* What a level of the document is to us. */
enum { K_ROOT, K_MESSAGES, K_MESSAGE, K_PARTS, K_PART, K_STREAM_OPTS, K_EMIT, K_SKIP };

enum { KEY_NONE, KEY_OTHER, KEY_MODEL, KEY_PROMPT, KEY_MESSAGES, KEY_TOOLS, KEY_STREAM,
       KEY_STREAM_OPTIONS, KEY_INCLUDE_USAGE, KEY_ROLE, KEY_CONTENT, KEY_TOOL_CALLS, KEY_TEXT,
       KEY_TYPE, KEY__COUNT };

/* Level flags past the key bits. */
#define SEEN_ROLE_OK (1u << 24)   /* message: a role string was read */
#define SEEN_TEXT_OK (1u << 25)   /* part: a text string was read */
#define SEEN_IS_TEXT (1u << 26)   /* part: "type" is "text" */

enum { VT_MAP, VT_ARRAY, VT_STRING, VT_NUMBER, VT_BOOL, VT_NULL };

/* Where a string's raw bytes go. */
enum { M_NONE, M_TEXT, M_EMIT, M_KEY, M_ROLE, M_TYPE };

enum { SINK_CANON, SINK_CONTEXT };

typedef struct {
    unsigned char kind, is_map, expect_value, key, sink;
    uint32_t seen;             /* keys read (1 << KEY_x), and the SEEN_ flags */
    size_t n;                  /* values read so far */
} level_t;

typedef struct {
    char b[NAME_MAX_BYTES];
    size_t n;
    int over;                  /* more than NAME_MAX_BYTES came */
} name_t;

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

struct pcr_body_reader {
    pcr_api_t api;
    pcr_body_opts_t o;
    pcr_body_scan_t *scan;
    pcr_scan_err_t err;        /* fatal: the body cannot be read on */
    int inval;                 /* the first field error, told at finish */
    char inval_msg[256];
    int finished;
    pcr_prefix_stream_t *key;

    level_t st[MAX_DEPTH];
    size_t depth;
    uint32_t root_seen;
    int root_done;

    int mode, sink;            /* the string being read */
    size_t want_short;         /* what string_begin tells the scanner */
    int str_long;              /* the string P reads next was too long for it ("") */
    int text_open;             /* a 0x02 run is open */
    size_t msg_i, part_i;      /* for messages: which message, which part */
    name_t keyname, role, type;

    char model[NAME_MAX_BYTES + 1];
    size_t model_len;
    int stream, include_usage;
    buf_t canon, context;      /* kept with o.keep_canonical only */
    char cpend[256];           /* context bytes not yet hashed: the tools come a few bytes */
    size_t cplen;              /* at a time, and each XXH3 update has a fixed cost */
};

/* ---- errors ------------------------------------------------------------------------------- */

/* A fatal error: yajl stops (callbacks return 0). */
static int fatal(pcr_body_reader_t *r, int rc, const char *fmt, ...)
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
static int inval(pcr_body_reader_t *r, const char *fmt, ...)
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

static int nomem(pcr_body_reader_t *r)
{
    return fatal(r, PCR_ERR_NOMEM, "out of memory while reading the request body");
}

/* ---- output: the canonical bytes and the context ------------------------------------------ */

static int buf_put(buf_t *b, const void *data, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->len + n + 1)
            ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (np == NULL)
            return PCR_ERR_NOMEM;
        b->p = np;
        b->cap = ncap;
    }
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
static int emit(pcr_body_reader_t *r, int sink, const void *p, size_t n)
{
    int rc = sink == SINK_CANON ? pcr_prefix_stream_update(r->key, p, n) : context_put(r, p, n);
    if (rc == 0 && r->o.keep_canonical)
        rc = buf_put(sink == SINK_CANON ? &r->canon : &r->context, p, n);
    return rc == 0 ? 1 : nomem(r);
}

static int emit_c(pcr_body_reader_t *r, int sink, char c)
{
    return emit(r, sink, &c, 1);
}

static int emit_tag(pcr_body_reader_t *r, char tag)
{
    r->text_open = 0;
    return emit_c(r, SINK_CANON, tag);
}

static int text_begin(pcr_body_reader_t *r)
{
    if (r->text_open)
        return 1;
    if (!emit_tag(r, TAG_TEXT))
        return 0;
    r->text_open = 1;
    return 1;
}

static void name_put(name_t *nm, const char *p, size_t n)
{
    if (nm->n + n > sizeof(nm->b)) {
        nm->over = 1;
        return;
    }
    memcpy(nm->b + nm->n, p, n);
    nm->n += n;
}

static void name_reset(name_t *nm)
{
    nm->n = 0;
    nm->over = 0;
}

/* ---- levels -------------------------------------------------------------------------------- */

static level_t *top(pcr_body_reader_t *r)
{
    return &r->st[r->depth - 1];
}

static int push(pcr_body_reader_t *r, int kind, int is_map, int sink)
{
    if (r->depth == MAX_DEPTH) {
        fatal(r, PCR_ERR_PARSE, "request body nests deeper than %d levels", MAX_DEPTH);
        r->err.add_at = 1;
        return 0;
    }
    level_t *L = &r->st[r->depth++];
    memset(L, 0, sizeof(*L));
    L->kind = (unsigned char)kind;
    L->is_map = (unsigned char)is_map;
    L->sink = (unsigned char)sink;
    return 1;
}

/* A value was read whole: its parent counts it and waits for the next key. */
static int value_end(pcr_body_reader_t *r)
{
    if (r->depth == 0) {
        r->root_done = 1;
        return 1;
    }
    level_t *L = top(r);
    L->n++;
    L->expect_value = 0;
    L->key = KEY_NONE;
    return 1;
}

static int skip(pcr_body_reader_t *r, int vt)
{
    return vt == VT_MAP || vt == VT_ARRAY ? push(r, K_SKIP, vt == VT_MAP, 0) : 1;
}

/* A value copied out as compact JSON to `sink`: containers become emit levels, a string's
 * raw bytes follow in M_EMIT, a scalar's text is written by its callback (mode M_EMIT). */
static int emit_value(pcr_body_reader_t *r, int vt, int sink, int *mode)
{
    r->sink = sink;
    if (vt == VT_MAP || vt == VT_ARRAY)
        return emit_c(r, sink, vt == VT_MAP ? '{' : '[') && push(r, K_EMIT, vt == VT_MAP, sink);
    *mode = M_EMIT;
    return vt == VT_STRING ? emit_c(r, sink, '"') : 1;
}

/* "<key>": for a part member, its raw key kept in r->keyname. */
static int member_head(pcr_body_reader_t *r)
{
    if (r->keyname.over)
        return inval(r, "'messages[%zu].content[%zu]' has a key longer than %d bytes", r->msg_i,
                     r->part_i, NAME_MAX_BYTES);
    return emit_tag(r, TAG_MEMBER) && emit_c(r, SINK_CANON, '"') &&
           emit(r, SINK_CANON, r->keyname.b, r->keyname.n) && emit(r, SINK_CANON, "\":", 2);
}

static int root_value(pcr_body_reader_t *r, level_t *L, int vt, int *mode)
{
    switch (L->key) {
    case KEY_MODEL:
        if (vt != VT_STRING)
            return inval(r, "'model' must be a string");
        r->want_short = NAME_MAX_BYTES;
        return 1;
    case KEY_PROMPT:
        if (vt == VT_STRING) {
            *mode = M_TEXT;
            return 1;
        }
        if (vt == VT_ARRAY)
            return emit_tag(r, TAG_JSON) && emit_value(r, vt, SINK_CANON, mode);
        return inval(r, "'prompt' must be a string or an array");
    case KEY_MESSAGES:
        if (vt != VT_ARRAY)
            return inval(r, "'messages' must be an array");
        return push(r, K_MESSAGES, 0, 0);
    case KEY_TOOLS:
        return vt == VT_NULL ? 1 : emit_value(r, vt, SINK_CONTEXT, mode);
    case KEY_STREAM_OPTIONS:
        if (vt == VT_MAP)
            return push(r, K_STREAM_OPTS, 1, 0);
        break;
    }
    return skip(r, vt);
}

static int message_value(pcr_body_reader_t *r, level_t *L, int vt, int *mode)
{
    switch (L->key) {
    case KEY_ROLE:
        if (vt != VT_STRING)
            return inval(r, "'messages[%zu].role' must be a string", r->msg_i);
        name_reset(&r->role);
        *mode = M_ROLE;
        return 1;
    case KEY_CONTENT:
        if (vt == VT_STRING) {
            *mode = M_TEXT;
            return text_begin(r);
        }
        if (vt == VT_ARRAY)
            return push(r, K_PARTS, 0, 0);
        if (vt == VT_NULL)
            return 1;
        return inval(r, "'messages[%zu].content' must be a string, an array or null", r->msg_i);
    case KEY_TOOL_CALLS:
        if (vt == VT_NULL)
            return 1;
        return emit_tag(r, TAG_CALLS) && emit_value(r, vt, SINK_CANON, mode);
    }
    return skip(r, vt);
}

static int part_value(pcr_body_reader_t *r, level_t *L, int vt, int *mode)
{
    if (L->key == KEY_TEXT) {
        if (vt != VT_STRING)
            return inval(r, "'messages[%zu].content[%zu].text' must be a string", r->msg_i,
                         r->part_i);
        *mode = M_TEXT;
        return text_begin(r);
    }
    if (L->key == KEY_TYPE && vt == VT_STRING) {
        /* Decided at its end: "text" adds nothing, anything else is a member. */
        name_reset(&r->type);
        r->want_short = NAME_MAX_BYTES;
        *mode = M_TYPE;
        return 1;
    }
    if (!member_head(r) || r->inval)
        return r->inval ? skip(r, vt) : 0;
    return emit_value(r, vt, SINK_CANON, mode);
}

static int value_dispatch(pcr_body_reader_t *r, int vt, int *mode)
{
    *mode = M_NONE;
    if (r->depth == 0) {
        if (vt != VT_MAP || r->root_done)
            return fatal(r, PCR_ERR_PARSE, "request body must be a JSON object");
        return push(r, K_ROOT, 1, 0);
    }
    level_t *L = top(r);
    if (r->inval || L->kind == K_SKIP)
        return skip(r, vt);
    switch (L->kind) {
    case K_EMIT:
        if (L->is_map ? !emit_c(r, L->sink, ':') : L->n > 0 && !emit_c(r, L->sink, ','))
            return 0;
        return emit_value(r, vt, L->sink, mode);
    case K_ROOT:
        return root_value(r, L, vt, mode);
    case K_MESSAGES:
        if (vt != VT_MAP)
            return inval(r, "'messages[%zu]' must be an object", L->n);
        r->msg_i = L->n;
        return push(r, K_MESSAGE, 1, 0);
    case K_MESSAGE:
        return message_value(r, L, vt, mode);
    case K_PARTS:
        if (vt != VT_MAP)
            return inval(r, "'messages[%zu].content[%zu]' must be an object", r->msg_i, L->n);
        r->part_i = L->n;
        return push(r, K_PART, 1, 0);
    case K_PART:
        return part_value(r, L, vt, mode);
    }
    return skip(r, vt);  /* K_STREAM_OPTS: its booleans are read by on_boolean */
}

/* A value starts (a container's bracket, a scalar, a string's opening quote). Returns 1, or 0
 * after a fatal error. Sets *mode: where a string's bytes go, or M_EMIT for a scalar whose
 * text its callback must write. A container always gets its level, even one refused as a
 * field's value (it is skipped), so that its end pops what its start pushed. */
static int value_begin(pcr_body_reader_t *r, int vt, int *mode)
{
    size_t depth = r->depth;
    if (!value_dispatch(r, vt, mode))
        return 0;
    if ((vt == VT_MAP || vt == VT_ARRAY) && r->depth == depth)
        return push(r, K_SKIP, vt == VT_MAP, 0);
    return 1;
}

/* ---- yajl's callbacks (P) ------------------------------------------------------------------ */

static int scalar(pcr_body_reader_t *r, int vt, const char *text, size_t n)
{
    int mode;
    if (!value_begin(r, vt, &mode))
        return 0;
    if (mode == M_EMIT && !emit(r, r->sink, text, n))
        return 0;
    return value_end(r);
}

static int on_null(void *ud)
{
    return scalar(ud, VT_NULL, "null", 4);
}

static int on_number(void *ud, const char *s, size_t n)
{
    return scalar(ud, VT_NUMBER, s, n);
}

static int on_boolean(void *ud, int b)
{
    pcr_body_reader_t *r = ud;
    if (r->depth > 0 && !r->inval) {
        level_t *L = top(r);
        if (L->kind == K_ROOT && L->key == KEY_STREAM)
            r->stream = b != 0;
        else if (L->kind == K_STREAM_OPTS && L->key == KEY_INCLUDE_USAGE)
            r->include_usage = b != 0;
    }
    return scalar(r, VT_BOOL, b ? "true" : "false", b ? 4 : 5);
}

/* A string value, after the scanner gave its raw bytes: P's decoded copy ("" when it was too
 * long for P, r->str_long). */
static int on_string(void *ud, const unsigned char *s, size_t n)
{
    pcr_body_reader_t *r = ud;
    if (r->depth > 0 && !r->inval) {
        level_t *L = top(r);
        if (L->kind == K_ROOT && L->key == KEY_MODEL) {
            if (r->str_long)
                inval(r, "'model' is longer than %d bytes", NAME_MAX_BYTES);
            memcpy(r->model, s, n);
            r->model[n] = '\0';
            r->model_len = n;
        } else if (L->kind == K_MESSAGE && L->key == KEY_ROLE) {
            if (r->role.over)
                inval(r, "'messages[%zu].role' is longer than %d bytes", r->msg_i,
                      NAME_MAX_BYTES);
            L->seen |= SEEN_ROLE_OK;
        } else if (L->kind == K_PART && L->key == KEY_TEXT) {
            L->seen |= SEEN_TEXT_OK;
        } else if (L->kind == K_PART && L->key == KEY_TYPE) {
            if (r->str_long || r->type.over)
                inval(r, "'messages[%zu].content[%zu].type' is longer than %d bytes", r->msg_i,
                      r->part_i, NAME_MAX_BYTES);
            else if (n == 4 && memcmp(s, "text", 4) == 0)
                L->seen |= SEEN_IS_TEXT;
            else if (!member_head(r) || !emit_c(r, SINK_CANON, '"') ||
                     !emit(r, SINK_CANON, r->type.b, r->type.n) || !emit_c(r, SINK_CANON, '"'))
                return 0;
        }
    }
    return value_end(r);
}

static const struct {
    unsigned char kind, key;
    const char *name;
} known_keys[] = {
    {K_ROOT, KEY_MODEL, "model"},
    {K_ROOT, KEY_PROMPT, "prompt"},
    {K_ROOT, KEY_MESSAGES, "messages"},
    {K_ROOT, KEY_TOOLS, "tools"},
    {K_ROOT, KEY_STREAM, "stream"},
    {K_ROOT, KEY_STREAM_OPTIONS, "stream_options"},
    {K_STREAM_OPTS, KEY_INCLUDE_USAGE, "include_usage"},
    {K_MESSAGE, KEY_ROLE, "role"},
    {K_MESSAGE, KEY_CONTENT, "content"},
    {K_MESSAGE, KEY_TOOL_CALLS, "tool_calls"},
    {K_PART, KEY_TEXT, "text"},
    {K_PART, KEY_TYPE, "type"},
};

static int key_id(const pcr_body_reader_t *r, int kind, const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < PCR_ARRAY_SIZE(known_keys); i++) {
        if (known_keys[i].kind != kind || strlen(known_keys[i].name) != n ||
            memcmp(known_keys[i].name, s, n) != 0)
            continue;
        int k = known_keys[i].key;
        if (kind == K_ROOT && (k == KEY_PROMPT) != (r->api == PCR_API_COMPLETIONS) &&
            (k == KEY_PROMPT || k == KEY_MESSAGES || k == KEY_TOOLS))
            return KEY_OTHER;  /* "prompt" is chat's business no more than "messages" is ours */
        return k;
    }
    return KEY_OTHER;
}

static const char *key_name(int key)
{
    for (size_t i = 0; i < PCR_ARRAY_SIZE(known_keys); i++)
        if (known_keys[i].key == key)
            return known_keys[i].name;
    return "?";
}

static int on_map_key(void *ud, const unsigned char *s, size_t n)
{
    pcr_body_reader_t *r = ud;
    level_t *L = top(r);
    L->expect_value = 1;
    if (r->inval || L->kind == K_EMIT || L->kind == K_SKIP)
        return 1;
    int k = r->str_long ? KEY_OTHER : key_id(r, L->kind, s, n);
    L->key = (unsigned char)k;
    if (k == KEY_OTHER)
        return 1;
    if (L->seen & (1u << k))
        return inval(r, "request body has '%s' more than once", key_name(k));
    L->seen |= 1u << k;
    if (L->kind == K_ROOT)
        r->root_seen = L->seen;
    return 1;
}

static int container_begin(pcr_body_reader_t *r, int vt)
{
    int mode;
    return value_begin(r, vt, &mode);
}

static int on_start_map(void *ud)
{
    return container_begin(ud, VT_MAP);
}

static int on_start_array(void *ud)
{
    return container_begin(ud, VT_ARRAY);
}

static int container_end(pcr_body_reader_t *r)
{
    level_t *L = top(r);
    if (!r->inval) {
        switch (L->kind) {
        case K_EMIT:
            if (!emit_c(r, L->sink, L->is_map ? '}' : ']'))
                return 0;
            break;
        case K_MESSAGE:
            if (!(L->seen & SEEN_ROLE_OK)) {
                inval(r, "'messages[%zu].role' must be a string", r->msg_i);
                break;
            }
            if (!emit_tag(r, TAG_ROLE) || !emit(r, SINK_CANON, r->role.b, r->role.n))
                return 0;
            break;
        case K_PART:
            if ((L->seen & SEEN_IS_TEXT) && !(L->seen & SEEN_TEXT_OK))
                inval(r, "'messages[%zu].content[%zu].text' must be a string", r->msg_i,
                      r->part_i);
            break;
        }
    }
    r->depth--;
    return value_end(r);
}

static int on_end_map(void *ud)
{
    return container_end(ud);
}

static int on_end_array(void *ud)
{
    return container_end(ud);
}

static const yajl_callbacks p_callbacks = {
    .yajl_null = on_null,
    .yajl_boolean = on_boolean,
    .yajl_number = on_number,
    .yajl_string = on_string,
    .yajl_start_map = on_start_map,
    .yajl_map_key = on_map_key,
    .yajl_end_map = on_end_map,
    .yajl_start_array = on_start_array,
    .yajl_end_array = on_end_array,
};

/* ---- the scanner's string events ---------------------------------------------------------- */

static int on_string_begin(void *ud, size_t *short_max)
{
    pcr_body_reader_t *r = ud;
    r->mode = M_NONE;
    r->str_long = 0;
    r->want_short = SMALL;
    if (r->depth > 0 && top(r)->is_map && !top(r)->expect_value) {  /* a key */
        level_t *L = top(r);
        if (L->kind == K_EMIT) {
            if ((L->n > 0 && !emit_c(r, L->sink, ',')) || !emit_c(r, L->sink, '"'))
                return -1;
            r->mode = M_EMIT;
            r->sink = L->sink;
        } else if (L->kind != K_SKIP && !r->inval) {
            name_reset(&r->keyname);
            r->mode = M_KEY;
            r->want_short = NAME_MAX_BYTES;
        }
    } else {
        int mode;
        if (!value_begin(r, VT_STRING, &mode))
            return -1;
        r->mode = mode;
    }
    *short_max = r->want_short;
    return 0;
}

static int on_string_bytes(void *ud, const char *p, size_t n)
{
    pcr_body_reader_t *r = ud;
    switch (r->mode) {
    case M_TEXT:
        return emit(r, SINK_CANON, p, n) ? 0 : -1;
    case M_EMIT:
        return emit(r, r->sink, p, n) ? 0 : -1;
    case M_KEY:
        name_put(&r->keyname, p, n);
        break;
    case M_ROLE:
        name_put(&r->role, p, n);
        break;
    case M_TYPE:
        name_put(&r->type, p, n);
        break;
    }
    return 0;
}

static int on_string_end(void *ud, int was_long)
{
    pcr_body_reader_t *r = ud;
    r->str_long = was_long;
    int ok = r->mode == M_EMIT ? emit_c(r, r->sink, '"') : 1;
    r->mode = M_NONE;
    return ok ? 0 : -1;
}

static const pcr_scan_cbs_t scan_callbacks = {on_string_begin, on_string_bytes, on_string_end};

/* ---- the API ------------------------------------------------------------------------------- */

void pcr_body_opts_default(pcr_body_opts_t *o)
{
    pcr_policy_opts_t po;
    pcr_policy_opts_default(&po);
    memset(o, 0, sizeof(*o));
    o->block_bytes = po.block_bytes;
    o->max_prefix_bytes = po.max_prefix_bytes;
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
    pcr_body_reader_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->api = api;
    r->o = o;
    r->key = pcr_prefix_stream_new(o.block_bytes, o.max_prefix_bytes);
    r->scan = pcr_body_scan_new(&p_callbacks, &scan_callbacks, r, &r->err);
    if (r->key == NULL || r->scan == NULL) {
        pcr_body_reader_free(r);
        return NULL;
    }
    return r;
}

void pcr_body_reader_free(pcr_body_reader_t *r)
{
    if (r == NULL)
        return;
    pcr_body_scan_free(r->scan);
    pcr_prefix_stream_free(r->key);
    free(r->canon.p);
    free(r->context.p);
    free(r);
}

int pcr_body_reader_feed(pcr_body_reader_t *r, const void *data, size_t len)
{
    if (r == NULL)
        return PCR_ERR_INVAL;
    if (r->finished && r->err.rc == 0)
        return fatal(r, PCR_ERR_INVAL, "request body fed after its end"), r->err.rc;
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
    if (r->finished)
        return r->err.rc != 0 ? r->err.rc : fatal(r, PCR_ERR_INVAL, "request body finished twice"),
               r->err.rc;
    r->finished = 1;
    if ((rc = pcr_body_scan_finish(r->scan)) != 0)
        return rc;
    if (r->inval)
        return PCR_ERR_INVAL;
    int want = r->api == PCR_API_CHAT ? KEY_MESSAGES : KEY_PROMPT;
    if (!(r->root_seen & (1u << want))) {
        inval(r, "'%s' is required", key_name(want));
        return PCR_ERR_INVAL;
    }
    if (context_flush(r) != 0) {
        nomem(r);
        return PCR_ERR_NOMEM;
    }
    size_t max = pcr_prefix_max_blocks(r->o.block_bytes, r->o.max_prefix_bytes);
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
    uint64_t bytes = pcr_prefix_stream_bytes(r->key);
    out->prompt_tokens = (size_t)(bytes / 4 + (bytes % 4 != 0));
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
    nomem(r);
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
