/* router/body/usage.c: reads `usage` from a completion's response bytes as they are forwarded
 * (router/body/usage.h). cJSON parses; this file only finds what to parse: the end of a JSON body,
 * or the `data:` of one server-sent event.
 *
 * SSE framing (the WHATWG rules, what vLLM and every client follow): lines end with CR, LF or
 * CRLF; a blank line ends an event; a line "data: x" (one optional space after the colon)
 * adds "x" to the event's data, lines joined with LF; other fields are ignored here. A CRLF
 * split across two reads is one line end: `prev_cr` remembers the CR, and a blank line that is
 * a CR ends its event only once the next byte shows whether an LF belongs to it. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "pcr/common.h"
#include "evmem.h"
#include "usage.h"

/* Counts above this are not a prompt's tokens: the answer is not believed. */
#define MAX_TOKENS 1e12

static int starts_with(const char *s, size_t len, const char *prefix)
{
    size_t n = strlen(prefix);
    return len >= n && strncasecmp(s, prefix, n) == 0 &&
           (len == n || s[n] == ';' || s[n] == ' ' || s[n] == '\t');
}

pcr_usage_mode_t pcr_usage_mode(int status, const char *content_type, size_t ct_len,
                                const char *content_encoding, size_t ce_len)
{
    if (status < 200 || status > 299 || content_type == NULL)
        return PCR_USAGE_OFF;
    if (content_encoding != NULL && !starts_with(content_encoding, ce_len, "identity"))
        return PCR_USAGE_OFF; /* compressed: the bytes are not JSON */
    if (starts_with(content_type, ct_len, "application/json"))
        return PCR_USAGE_JSON;
    if (starts_with(content_type, ct_len, "text/event-stream"))
        return PCR_USAGE_SSE;
    return PCR_USAGE_OFF;
}

void pcr_usage_init(pcr_usage_t *u, pcr_usage_mode_t mode, int strip)
{
    pcr_usage_dispose(u);
    u->mode = mode;
    u->strip = strip && mode == PCR_USAGE_SSE;
}

void pcr_usage_rewrite(pcr_usage_t *u, uint64_t cached)
{
    if (u->mode == PCR_USAGE_OFF)
        return;
    u->rewrite = 1;
    u->set_cached = cached;
    if (u->mode == PCR_USAGE_SSE)
        u->strip = u->strip ? u->strip : 2; /* events held whole; 2: none dropped */
}

/* The rewritten text of `root` (its cached tokens set), or NULL when it names none. */
static char *rewritten(const pcr_usage_t *u, cJSON *root)
{
    cJSON *usage = cJSON_GetObjectItemCaseSensitive(root, "usage");
    cJSON *details = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details");
    cJSON *cached = cJSON_GetObjectItemCaseSensitive(details, "cached_tokens");
    if (!cJSON_IsNumber(cached))
        return NULL;
    cJSON_SetNumberValue(cached, (double)u->set_cached);
    return cJSON_PrintUnformatted(root);
}

/* A JSON answer's copy is a list of these, each one of the thread's kept block sizes. */
#define BLOCK_BYTES 16384
struct pcr_usage_block {
    struct pcr_usage_block *next;
    size_t len;
    char data[];
};
#define BLOCK_ROOM (BLOCK_BYTES - offsetof(struct pcr_usage_block, data))

static void blocks_free(pcr_usage_t *u)
{
    for (struct pcr_usage_block *b = u->head, *next; b != NULL; b = next) {
        next = b->next;
        pcr_evmem_free(b);
    }
    u->head = u->tail = NULL;
    u->json_len = 0;
}

void pcr_usage_dispose(pcr_usage_t *u)
{
    pcr_evmem_free(u->buf);
    blocks_free(u);
    memset(u, 0, sizeof(*u));
}

/* Appends to the copy, up to `max` bytes in all; 0, or -1 when it would go past (or memory
 * ran out: then the copy is given up the same way). */
static int buf_add(pcr_usage_t *u, const char *data, size_t n, size_t max)
{
    /* From the thread's kept blocks (evmem.h): one of these per answer, 2-4 KiB for a short
     * completion, is past malloc's per-thread caches. */
    if (pcr_grow(&u->buf, &u->cap, u->len + n, 4096, max, pcr_evmem_realloc) != 0)
        return -1;
    memcpy(u->buf + u->len, data, n);
    u->len += n;
    return 0;
}

static int token_count(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > MAX_TOKENS)
        return -1;
    *out = (uint64_t)v->valuedouble;
    return 0;
}

/* `root` is a response or a stream chunk. Returns 1 when it carries a usage object with cached
 * tokens (recorded in u), else 0. */
static int read_usage(pcr_usage_t *u, const cJSON *root)
{
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(root, "usage");
    const cJSON *details = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details");
    uint64_t cached, prompt = 0;
    if (!cJSON_IsObject(usage) ||
        token_count(cJSON_GetObjectItemCaseSensitive(details, "cached_tokens"), &cached) < 0)
        return 0;
    (void)token_count(cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens"), &prompt);
    uint64_t completion = 0;
    (void)token_count(cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens"), &completion);
    u->completion_tokens = completion;
    u->found = 1;
    u->cached_tokens = cached;
    u->prompt_tokens = prompt;
    return 1;
}

/* ---- SSE ------------------------------------------------------------------------------ */

/* The event in u->buf is complete: reads its usage, if it names any. Returns 1 when it is a
 * usage-only event (a usage object and no choices), the one a strip drops. */
static int event_inspect(pcr_usage_t *u, char **rewrite)
{
    static const char needle[] = "\"usage\"";
    if (u->len < sizeof(needle) - 1 || memmem(u->buf, u->len, needle, sizeof(needle) - 1) == NULL)
        return 0;
    char *data = malloc(u->len + 1);
    size_t dlen = 0;
    int ndata = 0, usage_only = 0;
    if (data == NULL)
        return 0;
    /* The data lines' values, joined with LF. */
    for (size_t i = 0; i < u->len;) {
        size_t j = i;
        while (j < u->len && u->buf[j] != '\r' && u->buf[j] != '\n')
            j++;
        const char *line = u->buf + i;
        size_t n = j - i;
        if (n >= 4 && memcmp(line, "data", 4) == 0 && (n == 4 || line[4] == ':')) {
            size_t v = n > 4 ? 5 : 4;
            if (v < n && line[v] == ' ')
                v++;
            if (ndata++ > 0)
                data[dlen++] = '\n';
            memcpy(data + dlen, line + v, n - v);
            dlen += n - v;
        }
        i = j + (j < u->len && u->buf[j] == '\r' && j + 1 < u->len && u->buf[j + 1] == '\n' ? 2 : 1);
    }
    cJSON *root = ndata > 0 ? cJSON_ParseWithLength(data, dlen) : NULL;
    if (cJSON_IsObject(root) && read_usage(u, root)) {
        const cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
        usage_only = choices == NULL || (cJSON_IsArray(choices) && cJSON_GetArraySize(choices) == 0);
        if (rewrite != NULL && u->rewrite)
            *rewrite = rewritten(u, root);
    }
    cJSON_Delete(root);
    free(data);
    return usage_only;
}

/* Bytes of the current event: copied while it may still be a usage event; a strip holds them
 * until the event ends. An event past the bound is passed on from then on. */
static void event_take(pcr_usage_t *u, const char *p, size_t n, pcr_usage_emit_fn emit, void *ctx)
{
    if (n == 0)
        return;
    if (!u->over && buf_add(u, p, n, PCR_USAGE_MAX_EVENT) == 0)
        return;
    if (u->strip && !u->over && u->len > 0)
        emit(ctx, u->buf, u->len);
    u->over = 1;
    u->len = 0;
    if (u->strip)
        emit(ctx, p, n);
}

/* The current event ended (its blank line is in it): passed on, or dropped. */
static void event_end(pcr_usage_t *u, pcr_usage_emit_fn emit, void *ctx)
{
    if (!u->over) {
        char *text = NULL;
        int drop = event_inspect(u, &text) && u->strip == 1;
        if (text != NULL && !drop) {
            /* One data line and the blank line: the same event, its usage rewritten. */
            emit(ctx, "data: ", 6);
            emit(ctx, text, strlen(text));
            emit(ctx, "\n\n", 2);
        } else if (u->strip && !drop && u->len > 0) {
            emit(ctx, u->buf, u->len);
        }
        cJSON_free(text);
    }
    u->len = 0;
    u->over = 0;
}

static void sse_feed(pcr_usage_t *u, const char *data, size_t len, pcr_usage_emit_fn emit,
                     void *ctx)
{
    size_t seg = 0;  /* the first byte not yet given to the current event */
    if (!u->strip)
        emit(ctx, data, len);  /* passed on at once; what follows only looks */
    for (size_t i = 0; i < len; i++) {
        char c = data[i];
        if (u->end_pending) {
            /* The blank line was a CR: an LF after it is still part of it, so of the event. */
            size_t upto = c == '\n' ? i + 1 : i;
            u->end_pending = 0;
            u->prev_cr = 0;
            event_take(u, data + seg, upto - seg, emit, ctx);
            seg = upto;
            event_end(u, emit, ctx);
            if (c == '\n')
                continue;
        }
        if (c == '\n' && u->prev_cr) {
            u->prev_cr = 0;  /* the second half of a CRLF */
            continue;
        }
        if (c != '\n' && c != '\r') {
            u->prev_cr = 0;
            u->line_len++;
            continue;
        }
        u->prev_cr = c == '\r';
        if (u->line_len > 0) {
            u->line_len = 0;
            continue;
        }
        /* A blank line: the event ends here, or after the LF that may follow a CR. */
        if (c == '\r') {
            u->end_pending = 1;
            continue;
        }
        event_take(u, data + seg, i + 1 - seg, emit, ctx);
        seg = i + 1;
        event_end(u, emit, ctx);
    }
    event_take(u, data + seg, len - seg, emit, ctx);
}

/* Whether a JSON answer can name cached_tokens at all: as those bytes, or with a \u escape
 * somewhere in the key (the one escape that can write a letter or '_'). Most answers cannot
 * (a pod without --enable-prompt-tokens-details sends no details), and parsing one costs more
 * than everything else pcrouter does to forward it, so those are not parsed: what they would
 * give is known, nothing. */
static int may_name_cached(const char *p, size_t n)
{
    /* memchr, not memmem: glibc's memchr is vectorised, its memmem walks byte by byte, and
     * both bytes looked for are rare in an answer. */
    const char *end = p + n;
    for (const char *q = p; (q = memchr(q, '_', (size_t)(end - q))) != NULL; q++)
        if (q - p >= 6 && end - q >= 7 && memcmp(q - 6, "cached_tokens", 13) == 0)
            return 1;
    for (const char *q = p; (q = memchr(q, '\\', (size_t)(end - q))) != NULL; q++)
        if (end - q >= 2 && q[1] == 'u')
            return 1;
    return 0;
}

/* Scans a JSON answer's new bytes for a name of cached_tokens, across the cut between reads
 * too: the last bytes of the read before, with the first of this one, are looked at together
 * (a name is 13 bytes, so each side of a cut holds at most 12 of it). */
static void json_scan(pcr_usage_t *u, const char *data, size_t n)
{
    if (u->may_name)
        return;
    char win[2 * sizeof(u->edge)];
    size_t head = n < sizeof(u->edge) ? n : sizeof(u->edge);
    memcpy(win, u->edge, u->edge_len);
    memcpy(win + u->edge_len, data, head);
    u->may_name = may_name_cached(win, u->edge_len + head) || may_name_cached(data, n);
    /* The edge becomes the last bytes of what was scanned. */
    size_t keep = u->edge_len + head < sizeof(u->edge) ? u->edge_len + head : sizeof(u->edge);
    if (n >= sizeof(u->edge))
        memcpy(u->edge, data + n - keep, keep);
    else
        memcpy(u->edge, win + u->edge_len + head - keep, keep);
    u->edge_len = keep;
}

/* Appends to the JSON copy; returns how many bytes it took: all of them, or fewer when memory
 * ran out. */
static size_t json_add(pcr_usage_t *u, const char *data, size_t n)
{
    size_t took = 0;
    while (took < n) {
        if (u->tail == NULL || u->tail->len == BLOCK_ROOM) {
            struct pcr_usage_block *b = pcr_evmem_malloc(BLOCK_BYTES);
            if (b == NULL)
                break;
            b->next = NULL;
            b->len = 0;
            if (u->tail != NULL)
                u->tail->next = b;
            else
                u->head = b;
            u->tail = b;
        }
        size_t k = BLOCK_ROOM - u->tail->len < n - took ? BLOCK_ROOM - u->tail->len : n - took;
        memcpy(u->tail->data + u->tail->len, data + took, k);
        u->tail->len += k;
        u->json_len += k;
        took += k;
    }
    return took;
}

static void json_emit(const pcr_usage_t *u, pcr_usage_emit_fn emit, void *ctx)
{
    for (const struct pcr_usage_block *b = u->head; b != NULL; b = b->next)
        emit(ctx, b->data, b->len);
}

/* The copy in one buffer (malloc'd, json_len bytes), or NULL when memory ran out. */
static char *json_join(const pcr_usage_t *u)
{
    char *p = malloc(u->json_len ? u->json_len : 1), *at = p;
    if (p == NULL)
        return NULL;
    for (const struct pcr_usage_block *b = u->head; b != NULL; b = b->next) {
        memcpy(at, b->data, b->len);
        at += b->len;
    }
    return p;
}

/* ---- the API -------------------------------------------------------------------------- */

void pcr_usage_feed(pcr_usage_t *u, const char *data, size_t len, pcr_usage_emit_fn emit,
                    void *ctx)
{
    if (len == 0)
        return;
    switch (u->mode) {
    case PCR_USAGE_SSE:
        sse_feed(u, data, len, emit, ctx);
        return;
    case PCR_USAGE_JSON: {
        if (u->over)
            break;
        size_t took = len <= PCR_USAGE_MAX_JSON - u->json_len ? json_add(u, data, len) : 0;
        if (took == len) {
            json_scan(u, data, len);
            break;
        }
        /* Too large for a completion worth reading (or no memory): give up on it. What a
         * rewrite held goes out as it came, the first `took` bytes of this read included. */
        if (u->rewrite) {
            json_emit(u, emit, ctx);
            data += took;
            len -= took;
        }
        u->over = 1;
        blocks_free(u);
        break;
    }
    case PCR_USAGE_OFF:
        break;
    }
    if (u->mode == PCR_USAGE_JSON && u->rewrite && !u->over)
        return; /* held until the end */
    emit(ctx, data, len);
}

int pcr_usage_finish(pcr_usage_t *u, pcr_usage_emit_fn emit, void *ctx)
{
    if (u->mode == PCR_USAGE_JSON && !u->over && u->json_len > 0) {
        char *whole = u->may_name ? json_join(u) : NULL;
        cJSON *root = whole != NULL ? cJSON_ParseWithLength(whole, u->json_len) : NULL;
        char *text = NULL;
        if (cJSON_IsObject(root) && read_usage(u, root) && u->rewrite)
            text = rewritten(u, root);
        cJSON_Delete(root);
        free(whole);
        if (u->rewrite) {
            if (text != NULL)
                emit(ctx, text, strlen(text));
            else
                json_emit(u, emit, ctx); /* held, and nothing to rewrite */
        }
        cJSON_free(text);
        blocks_free(u);
    } else if (u->mode == PCR_USAGE_SSE && u->end_pending) {
        u->end_pending = 0;
        event_end(u, emit, ctx); /* the stream ended on a CR */
    } else if (u->mode == PCR_USAGE_SSE && u->len > 0) {
        /* A last event with no blank line after it: clients discard it, so it is no usage
         * event to drop either; what is held goes out as it came. */
        if (!u->over)
            (void)event_inspect(u, NULL);
        if (u->strip && !u->over)
            emit(ctx, u->buf, u->len);
        u->len = 0;
    }
    return u->found;
}

long pcr_usage_insert_at(const char *body, size_t len, int *empty)
{
    /* JSON whitespace is these four. Nothing else may follow the object (the body parser
     * checked), so the last other byte is the object's own closing brace: no string or
     * nested value can end the body. */
    size_t end = len;
    while (end > 0 && strchr(" \t\r\n", body[end - 1]) != NULL && body[end - 1] != '\0')
        end--;
    if (end == 0 || body[end - 1] != '}')
        return -1;
    size_t k = end - 1;
    while (k > 0 && strchr(" \t\r\n", body[k - 1]) != NULL && body[k - 1] != '\0')
        k--;
    /* A member's value never ends in '{' (an empty nested object ends in '}'), so '{' here is
     * the object's own opening brace: it has no member. */
    *empty = k > 0 && body[k - 1] == '{';
    return (long)(end - 1);
}
