/* router/config/config_err.c: the errors of one config load (contract in config_err.h). It owns
 * their collection, the words that describe a value in a message, the edit distance behind
 * "did you mean", and their final form: each error takes the line and column of its key path
 * (or of its nearest located parent) from the position scanner, then they are sorted by
 * position and printed one per line as FILE:LINE:COLUMN: KEY.PATH: message. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcr/common.h"
#include "config_err.h"

/* ---------------------------------------------------------------------------------------- */
/* Error collection.                                                                         */

static pcr_cfg_err_t *err_new(pcr_cfg_ctx_t *c)
{
    /* At most one error per byte of a config file, which is at most 16 MiB (config.c). */
    if (pcr_grow_elems(&c->errs, &c->caperrs, c->nerrs + 1, sizeof(*c->errs), 8,
                       16u * 1024 * 1024, NULL) != 0) {
        c->nomem = 1;
        return NULL;
    }
    pcr_cfg_err_t *e = &c->errs[c->nerrs];
    memset(e, 0, sizeof *e);
    e->seq = c->nerrs;
    return e;
}

static void err_vadd(pcr_cfg_ctx_t *c, int at_key, int line, int col, const char *fmt, va_list ap)
{
    pcr_cfg_err_t *e = err_new(c);
    if (e == NULL)
        return;
    e->path = strdup(pcr_cfg_path_str(&c->path));
    if (e->path == NULL || vasprintf(&e->msg, fmt, ap) < 0) {
        free(e->path);
        c->nomem = 1;
        return;
    }
    e->at_key = at_key;
    e->located = line >= 0;
    e->line = line;
    e->col = col;
    c->nerrs++;
}

void pcr_cfg_err(pcr_cfg_ctx_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vadd(c, 0, -1, -1, fmt, ap);
    va_end(ap);
}

void pcr_cfg_err_key(pcr_cfg_ctx_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vadd(c, 1, -1, -1, fmt, ap);
    va_end(ap);
}

void pcr_cfg_err_at(pcr_cfg_ctx_t *c, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vadd(c, 0, line < 0 ? 0 : line, col < 0 ? 0 : col, fmt, ap);
    va_end(ap);
}

/* Gives every error not yet located the line and column of its path in `text`. */
static void locate_errors(pcr_cfg_ctx_t *c, const char *text, size_t len)
{
    pcr_cfg_posmap_t m = { 0 };
    size_t pending = 0;
    for (size_t i = 0; i < c->nerrs; i++)
        pending += !c->errs[i].located;
    if (pending == 0)
        return;  /* parse errors come located by jansson, and the text is not JSON to scan */
    pcr_cfg_pos_scan(&m, text, len);
    for (size_t i = 0; i < c->nerrs; i++) {
        pcr_cfg_err_t *e = &c->errs[i];
        if (e->located)
            continue;
        const pcr_cfg_pos_t *p = pcr_cfg_pos_find(&m, e->path);
        e->line = p == NULL ? 1 : e->at_key ? p->kline : p->vline;
        e->col = p == NULL ? 1 : e->at_key ? p->kcol : p->vcol;
        e->located = 1;
    }
    if (m.nomem)
        c->nomem = 1;
    pcr_cfg_pos_dispose(&m);
}

/* ---------------------------------------------------------------------------------------- */
/* Printing the errors.                                                                      */

static int err_cmp(const void *a, const void *b)
{
    const pcr_cfg_err_t *x = a, *y = b;
    if (x->line != y->line)
        return x->line < y->line ? -1 : 1;
    if (x->col != y->col)
        return x->col < y->col ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Writes `s` so that no byte of it can break the one-error-per-line format. */
static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch < 0x20 || ch == 0x7F)
            fprintf(f, "\\x%02x", ch);
        else
            fputc(ch, f);
    }
}

static char *format_errors(pcr_cfg_ctx_t *c)
{
    char *out = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&out, &size);
    if (f == NULL)
        return NULL;
    qsort(c->errs, c->nerrs, sizeof *c->errs, err_cmp);
    for (size_t i = 0; i < c->nerrs; i++) {
        const pcr_cfg_err_t *e = &c->errs[i];
        put_escaped(f, c->name);
        fprintf(f, ":%d:%d: ", e->line, e->col);
        put_escaped(f, e->path[0] ? e->path : "$");
        fputs(": ", f);
        put_escaped(f, e->msg);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

void pcr_cfg_ctx_dispose(pcr_cfg_ctx_t *c)
{
    for (size_t i = 0; i < c->nerrs; i++) {
        free(c->errs[i].path);
        free(c->errs[i].msg);
    }
    free(c->errs);
    free(c->path.s);
}

int pcr_cfg_ctx_finish(pcr_cfg_ctx_t *c, const char *text, size_t len, char **errors)
{
    int failed = c->nerrs > 0 || c->nomem || c->path.nomem;
    if (c->nerrs > 0 && text != NULL)
        locate_errors(c, text, len);
    if (failed && errors != NULL) {
        if (c->nomem || c->path.nomem) {
            /* Partial errors could mislead; say what really went wrong. */
            if (asprintf(errors, "%s:0:0: $: out of memory\n", c->name) < 0)
                *errors = NULL;
        } else {
            *errors = format_errors(c);
        }
    }
    pcr_cfg_ctx_dispose(c);
    return failed;
}

/* ---------------------------------------------------------------------------------------- */
/* Describing values in messages.                                                            */

const char *pcr_cfg_quote(char *buf, size_t n, const char *s)
{
    size_t o = 0, i;
    buf[o++] = '"';
    /* Past PCR_CFG_QUOTE_MAX, a multi-byte character already begun is finished, never cut. */
    for (i = 0; s[i] && (i < PCR_CFG_QUOTE_MAX || ((unsigned char)s[i] & 0xC0) == 0x80) &&
                o + 8 < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)ch;
        } else if (ch < 0x20 || ch == 0x7F) {
            o += (size_t)snprintf(buf + o, n - o, "\\u%04x", ch);
        } else {
            buf[o++] = (char)ch;
        }
    }
    if (s[i] != '\0')
        o += (size_t)snprintf(buf + o, n - o, "...");
    snprintf(buf + o, n - o, "\"");
    return buf;
}

/* "string \"10\"", "integer 3", "number 1.5", "boolean true", "null", "array", "object". */
static const char *describe(char *buf, size_t n, const json_t *v)
{
    char q[PCR_CFG_QBUF];
    switch (json_typeof(v)) {
    case JSON_STRING:  snprintf(buf, n, "string %s", pcr_cfg_quote(q, sizeof q, json_string_value(v))); break;
    case JSON_INTEGER: snprintf(buf, n, "integer %" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL:    snprintf(buf, n, "number %g", json_real_value(v)); break;
    case JSON_TRUE:    snprintf(buf, n, "boolean true"); break;
    case JSON_FALSE:   snprintf(buf, n, "boolean false"); break;
    case JSON_NULL:    snprintf(buf, n, "null"); break;
    case JSON_ARRAY:   snprintf(buf, n, "array"); break;
    case JSON_OBJECT:  snprintf(buf, n, "object"); break;
    }
    return buf;
}

void pcr_cfg_err_type(pcr_cfg_ctx_t *c, const char *expected, const json_t *v)
{
    char d[PCR_CFG_QBUF + 16];
    pcr_cfg_err(c, "expected %s, got %s", expected, describe(d, sizeof d, v));
}

int pcr_cfg_edit_distance(const char *a, const char *b)
{
    enum { MAXLEN = 48 };
    size_t la = strlen(a), lb = strlen(b);
    /* Three rows of the table (i - 2, i - 1, i): a transposition looks two rows back. */
    int rows[3][MAXLEN + 1];
    if (la > MAXLEN || lb > MAXLEN)
        return INT_MAX;
    for (size_t j = 0; j <= lb; j++)
        rows[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int *cur = rows[i % 3], *up = rows[(i - 1) % 3], *up2 = rows[(i - 2) % 3];
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int best = up[j - 1] + cost;
            if (up[j] + 1 < best) best = up[j] + 1;
            if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                up2[j - 2] + 1 < best)
                best = up2[j - 2] + 1;
            cur[j] = best;
        }
    }
    return rows[la % 3][lb];
}

