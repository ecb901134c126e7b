/* router/body/body_fields.c: which field of a request body is which (router/body/body.c has the
 * canonical bytes they become). yajl's callbacks (P, body_scan.h) and the scanner's string
 * events drive a stack of levels: root, messages, message, content parts, part, stream
 * options, and "emit" levels that copy a value out as compact JSON (tools, tool calls, a part's
 * other members, a completion's non-string prompt). The level a value starts in, and the key
 * before it, decide where its bytes go; a field of the wrong type is kept as the error to
 * tell at finish, and what follows it is only parsed. */
#include <string.h>

#include <xxhash.h>

#include "body_int.h"
#include "pcr/common.h"

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
        pcr_body_fatal(r, PCR_ERR_PARSE, "request body nests deeper than %d levels", MAX_DEPTH);
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
        return pcr_body_emit_c(r, sink, vt == VT_MAP ? '{' : '[') &&
               push(r, K_EMIT, vt == VT_MAP, sink);
    *mode = M_EMIT;
    return vt == VT_STRING ? pcr_body_emit_c(r, sink, '"') : 1;
}

/* "<key>": for a part member, its raw key kept in r->keyname. */
static int member_head(pcr_body_reader_t *r)
{
    if (r->keyname.over)
        return pcr_body_inval(r, "'messages[%zu].content[%zu]' has a key longer than %d bytes",
                              r->msg_i,
                     r->part_i, NAME_MAX_BYTES);
    return pcr_body_emit_tag(r, TAG_MEMBER) && pcr_body_emit_c(r, SINK_CANON, '"') &&
           pcr_body_emit(r, SINK_CANON, r->keyname.b, r->keyname.n) &&
           pcr_body_emit(r, SINK_CANON, "\":", 2);
}

static int root_value(pcr_body_reader_t *r, level_t *L, int vt, int *mode)
{
    switch (L->key) {
    case KEY_MODEL:
        if (vt != VT_STRING)
            return pcr_body_inval(r, "'model' must be a string");
        r->want_short = NAME_MAX_BYTES;
        return 1;
    case KEY_PROMPT:
        if (vt == VT_STRING) {
            *mode = M_TEXT;
            return 1;
        }
        if (vt == VT_ARRAY)
            return pcr_body_emit_tag(r, TAG_JSON) && emit_value(r, vt, SINK_CANON, mode);
        return pcr_body_inval(r, "'prompt' must be a string or an array");
    case KEY_MESSAGES:
        if (vt != VT_ARRAY)
            return pcr_body_inval(r, "'messages' must be an array");
        return push(r, K_MESSAGES, 0, 0);
    case KEY_TOOLS:
        return vt == VT_NULL ? 1 : emit_value(r, vt, SINK_CONTEXT, mode);
    case KEY_USER:
        if (vt != VT_STRING)
            break;
        r->want_short = NAME_MAX_BYTES;
        return 1;
    case KEY_PRIORITY:
        r->has_priority = 1;
        break;
    case KEY_STREAM_OPTIONS:
        r->stream_options = 1;
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
            return pcr_body_inval(r, "'messages[%zu].role' must be a string", r->msg_i);
        name_reset(&r->role);
        *mode = M_ROLE;
        return 1;
    case KEY_CONTENT:
        if (vt == VT_STRING) {
            *mode = M_TEXT;
            return pcr_body_text_begin(r);
        }
        if (vt == VT_ARRAY)
            return push(r, K_PARTS, 0, 0);
        if (vt == VT_NULL)
            return 1;
        return pcr_body_inval(r, "'messages[%zu].content' must be a string, an array or null",
                              r->msg_i);
    case KEY_TOOL_CALLS:
        if (vt == VT_NULL)
            return 1;
        return pcr_body_emit_tag(r, TAG_CALLS) && emit_value(r, vt, SINK_CANON, mode);
    }
    return skip(r, vt);
}

static int part_value(pcr_body_reader_t *r, level_t *L, int vt, int *mode)
{
    if (L->key == KEY_TEXT) {
        if (vt != VT_STRING)
            return pcr_body_inval(r, "'messages[%zu].content[%zu].text' must be a string",
                                  r->msg_i, r->part_i);
        *mode = M_TEXT;
        return pcr_body_text_begin(r);
    }
    if (L->key == KEY_TYPE && vt == VT_STRING) {
        /* Decided at its end: "text" adds nothing, anything else is a member. */
        name_reset(&r->type);
        r->want_short = NAME_MAX_BYTES;
        *mode = M_TYPE;
        return 1;
    }
    if (!member_head(r))
        return 0;
    if (r->inval)  /* its key was too long */
        return 1;
    return emit_value(r, vt, SINK_CANON, mode);
}

static int value_dispatch(pcr_body_reader_t *r, int vt, int *mode)
{
    *mode = M_NONE;
    if (r->depth == 0) {
        if (vt != VT_MAP || r->root_done)
            return pcr_body_fatal(r, PCR_ERR_PARSE, "request body must be a JSON object");
        return push(r, K_ROOT, 1, 0);
    }
    level_t *L = top(r);
    if (r->inval || L->kind == K_SKIP)
        return skip(r, vt);
    switch (L->kind) {
    case K_EMIT:
        if (L->is_map ? !pcr_body_emit_c(r, L->sink, ':')
                      : L->n > 0 && !pcr_body_emit_c(r, L->sink, ','))
            return 0;
        return emit_value(r, vt, L->sink, mode);
    case K_ROOT:
        return root_value(r, L, vt, mode);
    case K_MESSAGES:
        if (vt != VT_MAP)
            return pcr_body_inval(r, "'messages[%zu]' must be an object", L->n);
        r->msg_i = L->n;
        return push(r, K_MESSAGE, 1, 0);
    case K_MESSAGE:
        return message_value(r, L, vt, mode);
    case K_PARTS:
        if (vt != VT_MAP)
            return pcr_body_inval(r, "'messages[%zu].content[%zu]' must be an object", r->msg_i,
                                  L->n);
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
    if (mode == M_EMIT && !pcr_body_emit(r, r->sink, text, n))
        return 0;
    return value_end(r);
}

static int on_null(void *ud)
{
    return scalar(ud, VT_NULL, "null", 4);
}

static int on_number(void *ud, const char *s, size_t n)
{
    pcr_body_reader_t *r = ud;
    /* max_tokens or max_completion_tokens (a chat request may carry both, the second being
     * the newer name): a whole number of up to 12 digits (more is no real request's); the
     * larger of the two is what the request may cost. */
    if (r->depth > 0 && !r->inval && top(r)->kind == K_ROOT &&
        (top(r)->key == KEY_MAX_TOKENS || top(r)->key == KEY_MAX_COMPLETION_TOKENS) &&
        n > 0 && n <= 12) {
        uint64_t v = 0;
        size_t i = 0;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            v = v * 10 + (uint64_t)(s[i] - '0');
        if (i == n && v > r->max_tokens)
            r->max_tokens = v;
    }
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
                pcr_body_inval(r, "'model' is longer than %d bytes", NAME_MAX_BYTES);
            memcpy(r->model, s, n);
            r->model[n] = '\0';
            r->model_len = n;
        } else if (L->kind == K_ROOT && L->key == KEY_USER) {
            r->has_user = !r->str_long && n > 0;
            r->user_hash = r->has_user ? XXH3_64bits(s, n) : 0;
        } else if (L->kind == K_MESSAGE && L->key == KEY_ROLE) {
            if (r->role.over)
                pcr_body_inval(r, "'messages[%zu].role' is longer than %d bytes", r->msg_i,
                      NAME_MAX_BYTES);
            L->seen |= SEEN_ROLE_OK;
        } else if (L->kind == K_PART && L->key == KEY_TEXT) {
            L->seen |= SEEN_TEXT_OK;
        } else if (L->kind == K_PART && L->key == KEY_TYPE) {
            if (r->str_long || r->type.over)
                pcr_body_inval(r, "'messages[%zu].content[%zu].type' is longer than %d bytes",
                               r->msg_i,
                      r->part_i, NAME_MAX_BYTES);
            else if (n == 4 && memcmp(s, "text", 4) == 0)
                L->seen |= SEEN_IS_TEXT;
            else if (!member_head(r) || !pcr_body_emit_c(r, SINK_CANON, '"') ||
                     !pcr_body_emit(r, SINK_CANON, r->type.b, r->type.n) ||
                     !pcr_body_emit_c(r, SINK_CANON, '"'))
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
    {K_ROOT, KEY_MAX_TOKENS, "max_tokens"},
    {K_ROOT, KEY_MAX_COMPLETION_TOKENS, "max_completion_tokens"},
    {K_ROOT, KEY_USER, "user"},
    {K_ROOT, KEY_PRIORITY, "priority"},
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
        /* A completion's "messages" or "tools", a chat's "prompt": fields like any other. */
        if (r->api == PCR_API_CHAT ? k == KEY_PROMPT : k == KEY_MESSAGES || k == KEY_TOOLS)
            return KEY_OTHER;
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
        return pcr_body_inval(r, "request body has '%s' more than once", key_name(k));
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
            if (!pcr_body_emit_c(r, L->sink, L->is_map ? '}' : ']'))
                return 0;
            break;
        case K_MESSAGE:
            if (!(L->seen & SEEN_ROLE_OK)) {
                pcr_body_inval(r, "'messages[%zu].role' must be a string", r->msg_i);
                break;
            }
            if (!pcr_body_emit_tag(r, TAG_ROLE) ||
                !pcr_body_emit(r, SINK_CANON, r->role.b, r->role.n))
                return 0;
            break;
        case K_PART:
            if ((L->seen & SEEN_IS_TEXT) && !(L->seen & SEEN_TEXT_OK))
                pcr_body_inval(r, "'messages[%zu].content[%zu].text' must be a string", r->msg_i,
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

const yajl_callbacks pcr_body_p_callbacks = {
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
            if ((L->n > 0 && !pcr_body_emit_c(r, L->sink, ',')) ||
                !pcr_body_emit_c(r, L->sink, '"'))
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
        return pcr_body_emit(r, SINK_CANON, p, n) ? 0 : -1;
    case M_EMIT:
        return pcr_body_emit(r, r->sink, p, n) ? 0 : -1;
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
    int ok = r->mode == M_EMIT ? pcr_body_emit_c(r, r->sink, '"') : 1;
    r->mode = M_NONE;
    return ok ? 0 : -1;
}

const pcr_scan_cbs_t pcr_body_scan_callbacks = {on_string_begin, on_string_bytes, on_string_end};

