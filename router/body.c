/* router/body.c: reads an OpenAI-style request body (router/body.h) with cJSON and builds the
 * canonical prompt bytes that the prefix key is hashed from.
 *
 * The canonical bytes
 * -------------------
 * /v1/completions: a string "prompt" is its own UTF-8 bytes; any other prompt (a token-id
 * array, an array of prompts, an array of token arrays) is its compact JSON text, so equal
 * prompts still give equal keys.
 *
 * /v1/chat/completions: a sequence of records, each a one-letter tag followed by
 * length-prefixed fields ("<decimal length>:<bytes>", netstring style, so no byte of content
 * can be mistaken for framing, whatever it contains):
 *
 *   T<len>:<tools JSON>                 once, first, when "tools" is present
 *   M<len>:<role>                       each message, in order, followed by its content:
 *     t<len>:<text>                     string content, or a run of consecutive text parts
 *                                       concatenated (so "hi" and [{"type":"text","text":"hi"}]
 *                                       give the same bytes, as a chat template renders them)
 *     o<len>:<part JSON>                a non-text part (image_url, input_audio, ...)
 *     c<len>:<tool_calls JSON>          an assistant message's tool calls, when present
 *
 * Example: {"messages":[{"role":"user","content":"hi"}]} gives "M4:usert2:hi".
 * A message's bytes depend only on that message, so two requests that share their first N
 * messages (and tools) share the canonical bytes of those N messages as a byte prefix: the
 * property that makes a multi-turn conversation's turns extend one another's prefix. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "body.h"
#include "pcr/common.h"

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static int buf_reserve(buf_t *b, size_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    size_t ncap = b->cap ? b->cap : 256;
    while (ncap < b->len + more)
        ncap *= 2;
    char *np = realloc(b->p, ncap);
    if (np == NULL)
        return PCR_ERR_NOMEM;
    b->p = np;
    b->cap = ncap;
    return 0;
}

static int buf_put(buf_t *b, const void *data, size_t n)
{
    if (buf_reserve(b, n) != 0)
        return PCR_ERR_NOMEM;
    if (n > 0)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

/* Writes the tag and "<n>:"; the caller then writes exactly n bytes. */
static int buf_field_head(buf_t *b, char tag, size_t n)
{
    char head[32];
    int k = snprintf(head, sizeof(head), "%c%zu:", tag, n);
    return buf_put(b, head, (size_t)k);
}

static int buf_field(buf_t *b, char tag, const char *s, size_t n)
{
    if (buf_field_head(b, tag, n) != 0)
        return PCR_ERR_NOMEM;
    return buf_put(b, s, n);
}

static int buf_json_field(buf_t *b, char tag, const cJSON *item)
{
    char *text = cJSON_PrintUnformatted(item);
    if (text == NULL)
        return PCR_ERR_NOMEM;
    int rc = tag ? buf_field(b, tag, text, strlen(text)) : buf_put(b, text, strlen(text));
    cJSON_free(text);
    return rc;
}

static int set_err(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static int is_text_part(const cJSON *part)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    return cJSON_IsString(type) && strcmp(type->valuestring, "text") == 0;
}

/* Multi-part content: runs of text parts as one "t" field, other parts as "o" fields. */
static int put_parts(buf_t *b, const cJSON *content, size_t mi, char *err, size_t errlen)
{
    size_t pi = 0;
    const cJSON *part = content->child;
    while (part != NULL) {
        if (!cJSON_IsObject(part))
            return set_err(err, errlen, PCR_ERR_INVAL,
                           "'messages[%zu].content[%zu]' must be an object", mi, pi);
        if (!is_text_part(part)) {
            if (buf_json_field(b, 'o', part) != 0)
                return PCR_ERR_NOMEM;
            part = part->next;
            pi++;
            continue;
        }
        size_t total = 0, k = pi;
        const cJSON *q;
        for (q = part; q != NULL && cJSON_IsObject(q) && is_text_part(q); q = q->next, k++) {
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(q, "text");
            if (!cJSON_IsString(text))
                return set_err(err, errlen, PCR_ERR_INVAL,
                               "'messages[%zu].content[%zu].text' must be a string", mi, k);
            total += strlen(text->valuestring);
        }
        if (buf_field_head(b, 't', total) != 0 || buf_reserve(b, total) != 0)
            return PCR_ERR_NOMEM;
        for (; part != q; part = part->next, pi++) {
            const char *s = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
            buf_put(b, s, strlen(s));
        }
    }
    return 0;
}

static int chat_key(buf_t *b, const cJSON *root, char *err, size_t errlen)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    size_t mi = 0;
    int rc;

    if (msgs == NULL)
        return set_err(err, errlen, PCR_ERR_INVAL, "'messages' is required");
    if (!cJSON_IsArray(msgs))
        return set_err(err, errlen, PCR_ERR_INVAL, "'messages' must be an array");
    if (tools != NULL && !cJSON_IsNull(tools) && buf_json_field(b, 'T', tools) != 0)
        return PCR_ERR_NOMEM;
    for (const cJSON *m = msgs->child; m != NULL; m = m->next, mi++) {
        if (!cJSON_IsObject(m))
            return set_err(err, errlen, PCR_ERR_INVAL, "'messages[%zu]' must be an object", mi);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!cJSON_IsString(role))
            return set_err(err, errlen, PCR_ERR_INVAL, "'messages[%zu].role' must be a string",
                           mi);
        if (buf_field(b, 'M', role->valuestring, strlen(role->valuestring)) != 0)
            return PCR_ERR_NOMEM;
        if (cJSON_IsString(content)) {
            if (buf_field(b, 't', content->valuestring, strlen(content->valuestring)) != 0)
                return PCR_ERR_NOMEM;
        } else if (cJSON_IsArray(content)) {
            if ((rc = put_parts(b, content, mi, err, errlen)) != 0)
                return rc;
        } else if (content != NULL && !cJSON_IsNull(content)) {
            return set_err(err, errlen, PCR_ERR_INVAL,
                           "'messages[%zu].content' must be a string, an array or null", mi);
        }
        if (calls != NULL && !cJSON_IsNull(calls) && buf_json_field(b, 'c', calls) != 0)
            return PCR_ERR_NOMEM;
    }
    return 0;
}

static int completions_key(buf_t *b, const cJSON *root, char *err, size_t errlen)
{
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (prompt == NULL)
        return set_err(err, errlen, PCR_ERR_INVAL, "'prompt' is required");
    if (cJSON_IsString(prompt))
        return buf_put(b, prompt->valuestring, strlen(prompt->valuestring));
    if (cJSON_IsArray(prompt))
        return buf_json_field(b, 0, prompt);
    return set_err(err, errlen, PCR_ERR_INVAL, "'prompt' must be a string or an array");
}

int pcr_body_parse(pcr_api_t api, const char *buf, size_t len, pcr_body_t *out, char *err,
                   size_t errlen)
{
    const char *end = NULL;
    cJSON *root = NULL;
    buf_t key = {0};
    int rc;

    if (out == NULL || (buf == NULL && len > 0))
        return set_err(err, errlen, PCR_ERR_INVAL, "no request body");
    memset(out, 0, sizeof(*out));
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (root == NULL) {
        size_t at = end != NULL && end >= buf ? (size_t)(end - buf) : 0;
        return set_err(err, errlen, PCR_ERR_PARSE, "request body is not valid JSON (at byte %zu)",
                       at);
    }
    while (end != NULL && (size_t)(end - buf) < len &&
           (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
        end++;
    if (end != NULL && (size_t)(end - buf) < len) {
        rc = set_err(err, errlen, PCR_ERR_PARSE,
                     "request body has data after its JSON value (at byte %zu)",
                     (size_t)(end - buf));
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        rc = set_err(err, errlen, PCR_ERR_PARSE, "request body must be a JSON object");
        goto fail;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model != NULL && !cJSON_IsString(model)) {
        rc = set_err(err, errlen, PCR_ERR_INVAL, "'model' must be a string");
        goto fail;
    }
    rc = api == PCR_API_CHAT ? chat_key(&key, root, err, errlen)
                             : completions_key(&key, root, err, errlen);
    if (rc == PCR_ERR_NOMEM)
        set_err(err, errlen, rc, "out of memory while reading the request body");
    if (rc != 0)
        goto fail;
    const char *m = model != NULL ? model->valuestring : "";
    out->model_len = strlen(m);
    out->model = malloc(out->model_len + 1);
    if (out->model == NULL || buf_put(&key, "", 1) != 0) {
        rc = set_err(err, errlen, PCR_ERR_NOMEM, "out of memory while reading the request body");
        goto fail;
    }
    memcpy(out->model, m, out->model_len + 1);
    out->key = key.p;
    out->key_len = key.len - 1;  /* a NUL follows the bytes, for convenience in logs and tests */
    out->stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "stream"));
    out->stream_options = cJSON_GetObjectItemCaseSensitive(root, "stream_options") != NULL;
    cJSON_Delete(root);
    return 0;
fail:
    free(out->model);
    free(key.p);
    memset(out, 0, sizeof(*out));
    cJSON_Delete(root);
    return rc;
}

void pcr_body_dispose(pcr_body_t *b)
{
    if (b == NULL)
        return;
    free(b->model);
    free(b->key);
    memset(b, 0, sizeof(*b));
}
