/* router/config.c: the config loader. It owns every rule about pcrouter's JSON config file
 * (which keys exist, their types, defaults and ranges) and the text of every error about it;
 * nothing else in the router reads the file.
 *
 * It works in two passes, so that no value is ever parsed by hand-written code:
 *
 *   1. jansson parses the text (duplicate keys rejected) and a table-driven validator walks
 *      the tree, filling pcr_config_t and collecting every error it meets, each with the key
 *      path it concerns ("backends[1].url") but no position: jansson keeps none for values.
 *   2. Only when there are errors, a small scanner walks the raw text, already known to be
 *      valid JSON, and records where the key and the value of every path start. Each error
 *      then takes the line and column of its path (or of its nearest located parent), the
 *      errors are sorted by position and printed one per line.
 *
 * Lines and columns are 1-based; columns count UTF-8 characters, as jansson's do, so the
 * positions of parse errors (from jansson) and of validation errors (from the scanner) agree. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <jansson.h>

#include "config.h"
#include "pcr/common.h"

/* A config file larger than this is a mistake (a log, a dump), not a config. */
#define CONFIG_MAX_FILE_BYTES (16u * 1024 * 1024)
/* Longest value quoted in full in a message; longer ones are cut, so one error stays one line. */
#define QUOTE_MAX 80

/* ---------------------------------------------------------------------------------------- */
/* Key paths: "backends[1].url", built by pushing and popping components on one buffer.      */

typedef struct {
    char *s;
    size_t len, cap;
    int nomem;
} pathbuf_t;

static int path_append(pathbuf_t *pb, const char *add, size_t n)
{
    if (pb->len + n + 1 > pb->cap) {
        size_t cap = pb->cap ? pb->cap : 64;
        while (cap < pb->len + n + 1)
            cap *= 2;
        char *s = realloc(pb->s, cap);
        if (s == NULL) {
            pb->nomem = 1;
            return PCR_ERR_NOMEM;
        }
        pb->s = s;
        pb->cap = cap;
    }
    memcpy(pb->s + pb->len, add, n);
    pb->len += n;
    pb->s[pb->len] = '\0';
    return 0;
}

/* Each push returns a mark; path_pop(mark) restores the path as it was before the push. */
static size_t path_push_key(pathbuf_t *pb, const char *key)
{
    size_t mark = pb->len;
    if ((mark == 0 || path_append(pb, ".", 1) == 0) && path_append(pb, key, strlen(key)) != 0)
        pb->len = mark;
    if (pb->s != NULL)
        pb->s[pb->len] = '\0';
    return mark;
}

static size_t path_push_index(pathbuf_t *pb, size_t i)
{
    char buf[32];
    size_t mark = pb->len;
    int n = snprintf(buf, sizeof buf, "[%zu]", i);
    path_append(pb, buf, (size_t)n);
    return mark;
}

static void path_pop(pathbuf_t *pb, size_t mark)
{
    pb->len = mark;
    if (pb->s != NULL)
        pb->s[mark] = '\0';
}

static const char *path_str(const pathbuf_t *pb)
{
    return pb->s != NULL ? pb->s : "";
}

/* ---------------------------------------------------------------------------------------- */
/* Error collection.                                                                         */

typedef struct {
    char *path;          /* "" for the root */
    char *msg;
    int at_key;          /* point at the key (an unknown key) rather than at the value */
    int located;         /* line/col already known (parse and file errors) */
    int line, col;
    size_t seq;          /* order of discovery: breaks ties so the sort is stable */
} cfg_err_t;

typedef struct {
    const char *name;    /* file name used in messages */
    pathbuf_t path;      /* where the validator is */
    cfg_err_t *errs;
    size_t nerrs, caperrs;
    int nomem;
} cfg_ctx_t;

static cfg_err_t *err_new(cfg_ctx_t *c)
{
    if (c->nerrs == c->caperrs) {
        size_t cap = c->caperrs ? c->caperrs * 2 : 8;
        cfg_err_t *e = realloc(c->errs, cap * sizeof *e);
        if (e == NULL) {
            c->nomem = 1;
            return NULL;
        }
        c->errs = e;
        c->caperrs = cap;
    }
    cfg_err_t *e = &c->errs[c->nerrs];
    memset(e, 0, sizeof *e);
    e->seq = c->nerrs;
    return e;
}

static void err_vadd(cfg_ctx_t *c, int at_key, int line, int col, const char *fmt, va_list ap)
{
    cfg_err_t *e = err_new(c);
    if (e == NULL)
        return;
    e->path = strdup(path_str(&c->path));
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

/* An error about the value at the current path. */
static void __attribute__((format(printf, 2, 3))) err(cfg_ctx_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vadd(c, 0, -1, -1, fmt, ap);
    va_end(ap);
}

/* An error about the key at the current path (an unknown key points at the key itself). */
static void __attribute__((format(printf, 2, 3))) err_key(cfg_ctx_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vadd(c, 1, -1, -1, fmt, ap);
    va_end(ap);
}

/* An error whose position is already known (jansson's parse errors, unreadable files). */
static void __attribute__((format(printf, 4, 5)))
err_at(cfg_ctx_t *c, int line, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vadd(c, 0, line < 0 ? 0 : line, col < 0 ? 0 : col, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------- */
/* The position scanner. It runs only on text jansson has accepted, and only records where   */
/* each key path starts; it still checks every bound, so text it does not expect makes it    */
/* stop early (later errors then fall back to a located parent) instead of reading past.     */

typedef struct {
    char *path;          /* "" for the root */
    int kline, kcol;     /* where its key starts; for array elements and the root, its value */
    int vline, vcol;     /* where its value starts */
} pos_t;

typedef struct {
    const char *p, *end;
    int line, col;       /* position of *p */
    pathbuf_t path;
    pathbuf_t key;       /* the object key being decoded */
    pos_t *v;
    size_t n, cap;
    int nomem;
} scan_t;

/* Columns count characters: a UTF-8 continuation byte (10xxxxxx) does not start one. */
static void scan_advance(scan_t *s)
{
    unsigned char b = (unsigned char)*s->p++;
    if (b == '\n') {
        s->line++;
        s->col = 1;
    } else if ((b & 0xC0) != 0x80) {
        s->col++;
    }
}

static void scan_ws(scan_t *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        scan_advance(s);
}

static int scan_record(scan_t *s, int kline, int kcol)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        pos_t *v = realloc(s->v, cap * sizeof *v);
        if (v == NULL)
            goto nomem;
        s->v = v;
        s->cap = cap;
    }
    pos_t *e = &s->v[s->n];
    e->path = strdup(path_str(&s->path));
    if (e->path == NULL)
        goto nomem;
    e->kline = kline;
    e->kcol = kcol;
    e->vline = s->line;
    e->vcol = s->col;
    s->n++;
    return 0;
nomem:
    s->nomem = 1;
    return PCR_ERR_NOMEM;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Reads the 4 hex digits after "\u"; -1 if they are not there. */
static long scan_hex4(scan_t *s)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int h = s->p < s->end ? hexval(*s->p) : -1;
        if (h < 0)
            return -1;
        v = v * 16 + h;
        scan_advance(s);
    }
    return v;
}

static void utf8_put(pathbuf_t *out, unsigned long cp)
{
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xC0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (char)(0xF0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    path_append(out, b, n);
}

/* Skips a string at *p == '"'. When `out` is not NULL, decodes it there (keys must be
 * decoded: jansson hands the validator "a\u0062" as "ab", and paths must match). */
static int scan_string(scan_t *s, pathbuf_t *out)
{
    if (out != NULL)
        path_pop(out, 0);
    scan_advance(s);  /* the opening quote */
    while (s->p < s->end) {
        char ch = *s->p;
        if (ch == '"') {
            scan_advance(s);
            return 0;
        }
        if (ch != '\\') {
            if (out != NULL)
                path_append(out, s->p, 1);
            scan_advance(s);
            continue;
        }
        scan_advance(s);
        if (s->p >= s->end)
            break;
        char esc = *s->p;
        scan_advance(s);
        if (esc == 'u') {
            long cp = scan_hex4(s);
            if (cp < 0)
                return -1;
            /* A high surrogate followed by "\uDC00".."\uDFFF" names one character above U+FFFF. */
            if (cp >= 0xD800 && cp <= 0xDBFF && s->end - s->p >= 6 && s->p[0] == '\\' &&
                s->p[1] == 'u') {
                scan_advance(s);
                scan_advance(s);
                long lo = scan_hex4(s);
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return -1;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (out != NULL)
                utf8_put(out, (unsigned long)cp);
        } else if (out != NULL) {
            const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
            const char *hit = strchr(from, esc);
            char dec = hit != NULL && esc != '\0' ? to[hit - from] : esc;
            path_append(out, &dec, 1);
        }
    }
    return -1;
}

static int scan_value(scan_t *s, int kline, int kcol, int depth);

/* Scans the object or array at *p. Its members, "key": value pairs in an object and bare
 * values in an array, are each followed by ',' or the closing bracket. */
static int scan_container(scan_t *s, int depth)
{
    char close = *s->p == '{' ? '}' : ']';
    scan_advance(s);
    scan_ws(s);
    if (s->p < s->end && *s->p == close) {
        scan_advance(s);
        return 0;
    }
    for (size_t i = 0;; i++) {
        scan_ws(s);
        int kline = s->line, kcol = s->col;  /* an array element's "key" is the element */
        size_t mark;
        if (close == '}') {
            if (s->p >= s->end || *s->p != '"' || scan_string(s, &s->key) != 0)
                return -1;
            scan_ws(s);
            if (s->p >= s->end || *s->p != ':')
                return -1;
            scan_advance(s);
            mark = path_push_key(&s->path, path_str(&s->key));
        } else {
            mark = path_push_index(&s->path, i);
        }
        int rc = scan_value(s, kline, kcol, depth + 1);
        path_pop(&s->path, mark);
        if (rc != 0)
            return rc;
        scan_ws(s);
        if (s->p < s->end && *s->p == close) {
            scan_advance(s);
            return 0;
        }
        if (s->p >= s->end || *s->p != ',')
            return -1;
        scan_advance(s);
    }
}

/* Records the value at the current path, then skips it. Scalars other than strings (numbers,
 * true, false, null) are skipped up to the next delimiter: their content does not matter. */
static int scan_value(scan_t *s, int kline, int kcol, int depth)
{
    /* jansson refuses nesting deeper than 2048, so this bound is never reached on its output;
     * it only keeps the recursion bounded should the two ever disagree. */
    if (depth > 4096)
        return -1;
    scan_ws(s);
    if (s->p >= s->end || scan_record(s, kline ? kline : s->line, kline ? kcol : s->col) != 0)
        return -1;
    switch (*s->p) {
    case '{':
    case '[':
        return scan_container(s, depth);
    case '"':
        return scan_string(s, NULL);
    default:
        while (s->p < s->end && strchr(",]} \t\r\n", *s->p) == NULL)
            scan_advance(s);
        return 0;
    }
}

static int pos_cmp(const void *a, const void *b)
{
    return strcmp(((const pos_t *)a)->path, ((const pos_t *)b)->path);
}

/* The position of `path`, or of its nearest located parent ("a[1].b" -> "a[1]" -> "a" -> ""). */
static const pos_t *pos_find(const scan_t *s, const char *path)
{
    char *tmp = strdup(path);
    const pos_t *hit = NULL;
    if (tmp == NULL || s->n == 0) {
        free(tmp);
        return NULL;
    }
    for (;;) {
        pos_t key = { .path = tmp };
        hit = bsearch(&key, s->v, s->n, sizeof *s->v, pos_cmp);
        if (hit != NULL || tmp[0] == '\0')
            break;
        char *dot = strrchr(tmp, '.'), *br = strrchr(tmp, '[');
        char *cut = dot > br ? dot : br;
        if (cut == NULL)
            cut = tmp;
        *cut = '\0';
    }
    free(tmp);
    return hit;
}

static void scan_dispose(scan_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i].path);
    free(s->v);
    free(s->path.s);
    free(s->key.s);
}

/* Gives every error not yet located the line and column of its path in `text`. */
static void locate_errors(cfg_ctx_t *c, const char *text, size_t len)
{
    scan_t s = { .p = text, .end = text + len, .line = 1, .col = 1 };
    size_t pending = 0;
    for (size_t i = 0; i < c->nerrs; i++)
        pending += !c->errs[i].located;
    if (pending == 0)
        return;  /* parse errors come located by jansson, and the text is not JSON to scan */
    scan_value(&s, 0, 0, 0);  /* stops early on what it cannot read: what it found still counts */
    if (s.n > 0)
        qsort(s.v, s.n, sizeof *s.v, pos_cmp);
    for (size_t i = 0; i < c->nerrs; i++) {
        cfg_err_t *e = &c->errs[i];
        if (e->located)
            continue;
        const pos_t *p = pos_find(&s, e->path);
        e->line = p == NULL ? 1 : e->at_key ? p->kline : p->vline;
        e->col = p == NULL ? 1 : e->at_key ? p->kcol : p->vcol;
        e->located = 1;
    }
    if (s.nomem || s.path.nomem || s.key.nomem)
        c->nomem = 1;
    scan_dispose(&s);
}

/* ---------------------------------------------------------------------------------------- */
/* Printing the errors.                                                                      */

static int err_cmp(const void *a, const void *b)
{
    const cfg_err_t *x = a, *y = b;
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

static char *format_errors(cfg_ctx_t *c)
{
    char *out = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&out, &size);
    if (f == NULL)
        return NULL;
    qsort(c->errs, c->nerrs, sizeof *c->errs, err_cmp);
    for (size_t i = 0; i < c->nerrs; i++) {
        const cfg_err_t *e = &c->errs[i];
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

static void ctx_dispose(cfg_ctx_t *c)
{
    for (size_t i = 0; i < c->nerrs; i++) {
        free(c->errs[i].path);
        free(c->errs[i].msg);
    }
    free(c->errs);
    free(c->path.s);
}

/* Locates and prints the errors of `c` into *errors (when asked), then frees them. Returns 1
 * when there was any error: the load has failed. */
static int ctx_finish(cfg_ctx_t *c, const char *text, size_t len, char **errors)
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
    ctx_dispose(c);
    return failed;
}

/* ---------------------------------------------------------------------------------------- */
/* Describing values in messages.                                                            */

/* `s` between double quotes, escaped as JSON would, cut after QUOTE_MAX bytes. */
static const char *quote(char *buf, size_t n, const char *s)
{
    size_t o = 0, i;
    buf[o++] = '"';
    /* Past QUOTE_MAX, a multi-byte character already begun is finished, never cut. */
    for (i = 0; s[i] && (i < QUOTE_MAX || ((unsigned char)s[i] & 0xC0) == 0x80) && o + 8 < n; i++) {
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

#define QBUF (QUOTE_MAX * 6 + 16)

/* "string \"10\"", "integer 3", "number 1.5", "boolean true", "null", "array", "object". */
static const char *describe(char *buf, size_t n, const json_t *v)
{
    char q[QBUF];
    switch (json_typeof(v)) {
    case JSON_STRING:  snprintf(buf, n, "string %s", quote(q, sizeof q, json_string_value(v))); break;
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

static void err_type(cfg_ctx_t *c, const char *expected, const json_t *v)
{
    char d[QBUF + 16];
    err(c, "expected %s, got %s", expected, describe(d, sizeof d, v));
}

/* Optimal string alignment distance (edits: insert, delete, substitute, swap two neighbours),
 * used only to suggest a known key for a mistyped one; longer keys are never close enough. */
static int edit_distance(const char *a, const char *b)
{
    enum { MAXLEN = 48 };
    size_t la = strlen(a), lb = strlen(b);
    int d[MAXLEN + 1][MAXLEN + 1];
    if (la > MAXLEN || lb > MAXLEN)
        return INT_MAX;
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int best = d[i - 1][j - 1] + cost;
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[la][lb];
}

/* ---------------------------------------------------------------------------------------- */
/* The schema: each JSON object is a table of fields; one reader walks any table.            */

typedef enum {
    FT_UINT,        /* integer into unsigned */
    FT_SIZE,        /* integer into size_t */
    FT_U64,         /* integer into uint64_t */
    FT_DOUBLE,      /* number (integer or real) into double */
    FT_BOOL,        /* boolean into int */
    FT_STRING,      /* string into char * (heap) */
    FT_FILE,        /* string naming a readable file */
    FT_POLICY,      /* routing policy name into pcr_policy_kind_t */
    FT_LOG_LEVEL,   /* log level name into pcr_log_level_t */
    FT_HTTP_PATH,   /* "/..." request path into char * */
    FT_ADDRESS,     /* listen address: fills pcr_listen_conf_t's address, addr, addrlen */
    FT_TLS,         /* tls object: fills pcr_listen_conf_t's tls, cert, key */
    FT_URL,         /* backend url: fills pcr_backend_conf_t's url, host, port */
    FT_MODELS,      /* array of model names: fills pcr_backend_conf_t's models, nmodels */
    FT_SECTION,     /* object read with `sub` into the struct at `offset` */
    FT_LISTENERS,   /* the listen array of pcr_config_t */
    FT_BACKENDS,    /* the backends array of pcr_config_t */
} field_type_t;

enum { F_REQUIRED = 1, F_NONEMPTY = 2 };

typedef struct field {
    const char *key;
    field_type_t type;
    unsigned flags;
    size_t offset;                /* of the member it fills, within the table's struct */
    long long min, max;           /* integer range, inclusive; max LLONG_MAX = unbounded */
    double dmin, dmax;            /* number range, inclusive; dmax INFINITY = unbounded */
    const struct field *sub;      /* FT_SECTION */
    size_t nsub;
} field_t;

#define F_INT(T, k, ty, lo, hi) { .key = #k, .type = ty, .offset = offsetof(T, k), .min = lo, .max = hi }
#define F_DBL(T, k, lo, hi) { .key = #k, .type = FT_DOUBLE, .offset = offsetof(T, k), .dmin = lo, .dmax = hi }
#define F_OF(T, k, ty, fl) { .key = #k, .type = ty, .flags = fl, .offset = offsetof(T, k) }
#define F_SECTION(k, tbl) { .key = #k, .type = FT_SECTION, .offset = offsetof(pcr_config_t, k), \
                            .sub = tbl, .nsub = PCR_ARRAY_SIZE(tbl) }

#define DAY_MS 86400000LL

static const field_t tls_fields[] = {
    F_OF(pcr_listen_conf_t, cert, FT_FILE, F_REQUIRED | F_NONEMPTY),
    F_OF(pcr_listen_conf_t, key, FT_FILE, F_REQUIRED | F_NONEMPTY),
};

static const field_t listen_fields[] = {
    F_OF(pcr_listen_conf_t, address, FT_ADDRESS, F_REQUIRED),
    F_OF(pcr_listen_conf_t, tls, FT_TLS, 0),
};

static const field_t backend_fields[] = {
    F_OF(pcr_backend_conf_t, name, FT_STRING, F_REQUIRED | F_NONEMPTY),
    F_OF(pcr_backend_conf_t, url, FT_URL, F_REQUIRED),
    F_OF(pcr_backend_conf_t, zone, FT_STRING, 0),
    F_INT(pcr_backend_conf_t, weight, FT_UINT, 1, 1000),
    F_INT(pcr_backend_conf_t, capacity_tokens, FT_U64, 1, LLONG_MAX),
    F_INT(pcr_backend_conf_t, max_connections, FT_UINT, 1, 65535),
    F_OF(pcr_backend_conf_t, models, FT_MODELS, 0),
};

static const field_t routing_fields[] = {
    F_OF(pcr_routing_conf_t, policy, FT_POLICY, 0),
    F_OF(pcr_routing_conf_t, zone, FT_STRING, 0),
    F_INT(pcr_routing_conf_t, block_bytes, FT_SIZE, 16, 65536),
    F_INT(pcr_routing_conf_t, max_prefix_bytes, FT_SIZE, 16, 16777216),
    F_INT(pcr_routing_conf_t, index_max_bytes, FT_SIZE, 65536, 1LL << 40),
    F_DBL(pcr_routing_conf_t, load_factor, 1.0, INFINITY),
    F_DBL(pcr_routing_conf_t, load_weight, 0.0, INFINITY),
    F_DBL(pcr_routing_conf_t, zone_penalty, 0.0, INFINITY),
    F_INT(pcr_routing_conf_t, vnodes, FT_UINT, 1, 10000),
};

static const field_t limits_fields[] = {
    F_INT(pcr_limits_conf_t, max_body_bytes, FT_SIZE, 1024, 1LL << 32),
    F_INT(pcr_limits_conf_t, max_header_bytes, FT_SIZE, 1024, 1048576),
    F_INT(pcr_limits_conf_t, max_concurrent_streams, FT_UINT, 1, 100000),
    F_INT(pcr_limits_conf_t, max_client_connections, FT_UINT, 1, 1000000),
};

/* Every network wait has a timeout (house rule 7): no timeout accepts 0 but drain_ms, where 0
 * means "close at once". A day bounds them all and keeps them inside an unsigned. */
static const field_t timeouts_fields[] = {
    F_INT(pcr_timeouts_conf_t, connect_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, response_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, stream_idle_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, upstream_keepalive_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, client_idle_ms, FT_UINT, 1, DAY_MS),
    F_INT(pcr_timeouts_conf_t, drain_ms, FT_UINT, 0, DAY_MS),
};

static const field_t upstream_fields[] = {
    F_INT(pcr_upstream_conf_t, max_connections, FT_UINT, 1, 65535),
    F_INT(pcr_upstream_conf_t, retries, FT_UINT, 0, 16),
};

static const field_t health_fields[] = {
    F_INT(pcr_health_conf_t, interval_ms, FT_UINT, 0, DAY_MS),
    F_INT(pcr_health_conf_t, timeout_ms, FT_UINT, 1, DAY_MS),
    F_OF(pcr_health_conf_t, path, FT_HTTP_PATH, 0),
    F_INT(pcr_health_conf_t, fall, FT_UINT, 1, 100),
    F_INT(pcr_health_conf_t, rise, FT_UINT, 1, 100),
};

static const field_t log_fields[] = {
    F_OF(pcr_log_conf_t, level, FT_LOG_LEVEL, 0),
    F_OF(pcr_log_conf_t, access_log, FT_BOOL, 0),
};

static const field_t root_fields[] = {
    F_OF(pcr_config_t, listen, FT_LISTENERS, F_REQUIRED),
    F_OF(pcr_config_t, backends, FT_BACKENDS, F_REQUIRED),
    F_SECTION(routing, routing_fields),
    F_SECTION(limits, limits_fields),
    F_SECTION(timeouts, timeouts_fields),
    F_SECTION(upstream, upstream_fields),
    F_SECTION(health, health_fields),
    F_SECTION(log, log_fields),
};

static const char *const log_level_names[] = {
    [PCR_LOG_ERROR] = "error", [PCR_LOG_WARN] = "warn", [PCR_LOG_INFO] = "info",
    [PCR_LOG_DEBUG] = "debug",
};

/* Reports every key of `obj` the table does not know, listing the allowed ones and the
 * closest of them when it is a likely typo (edit distance at most 2). */
static void check_keys(cfg_ctx_t *c, const json_t *obj, const field_t *fields, size_t n)
{
    const char *key;
    const json_t *v;
    char allowed[512];
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(allowed + o, sizeof allowed - o, "%s%s", i ? ", " : "", fields[i].key);
    json_object_foreach((json_t *)obj, key, v) {
        const char *best = NULL;
        int best_d = 3;
        for (size_t i = 0; i < n; i++) {
            if (strcmp(key, fields[i].key) == 0)
                goto known;
            int d = edit_distance(key, fields[i].key);
            if (d < best_d && (size_t)d < strlen(key)) {
                best_d = d;
                best = fields[i].key;
            }
        }
        char q[QBUF];
        size_t mark = path_push_key(&c->path, key);
        if (best != NULL)
            err_key(c, "unknown key %s; did you mean \"%s\"? (allowed: %s)",
                    quote(q, sizeof q, key), best, allowed);
        else
            err_key(c, "unknown key %s (allowed: %s)", quote(q, sizeof q, key), allowed);
        path_pop(&c->path, mark);
known:;
    }
}

static int has_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7F)
            return 1;
    return 0;
}

/* Replaces the heap string at *slot; 0, or PCR_ERR_NOMEM with *slot unchanged. */
static int set_string(cfg_ctx_t *c, char **slot, const char *s)
{
    char *copy = strdup(s);
    if (copy == NULL) {
        c->nomem = 1;
        return PCR_ERR_NOMEM;
    }
    free(*slot);
    *slot = copy;
    return 0;
}

/* A string value that may go into a log line, a header or a metrics label. */
static const char *get_text(cfg_ctx_t *c, const json_t *v, unsigned flags)
{
    if (!json_is_string(v)) {
        err_type(c, "string", v);
        return NULL;
    }
    const char *s = json_string_value(v);
    if ((flags & F_NONEMPTY) && s[0] == '\0') {
        err(c, "must not be empty");
        return NULL;
    }
    if (has_control(s)) {
        char q[QBUF];
        err(c, "must not contain control characters, got %s", quote(q, sizeof q, s));
        return NULL;
    }
    return s;
}

/* ---------------------------------------------------------------------------------------- */
/* Addresses and URLs.                                                                       */

/* "0".."65535" exactly (digits only); -1 otherwise. */
static long parse_port(const char *s, size_t len)
{
    long v = 0;
    if (len == 0 || len > 5)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v <= 65535 ? v : -1;
}

/* "IP:PORT" or "[IPv6]:PORT", numeric (a listener is never named by a host to resolve). Returns
 * NULL, or why the address is wrong. */
static const char *parse_listen_address(const char *s, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[INET6_ADDRSTRLEN + 1];
    const char *port;
    size_t hlen;
    memset(ss, 0, sizeof *ss);
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (close == NULL)
            return "missing \"]\"";
        if (close[1] != ':')
            return "missing \":PORT\" after \"]\"";
        hlen = (size_t)(close - s - 1);
        port = close + 2;
        if (hlen >= sizeof host)
            return "not a numeric IPv6 address";
        memcpy(host, s + 1, hlen);
        host[hlen] = '\0';
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
            return "not a numeric IPv6 address";
        a->sin6_family = AF_INET6;
        *len = sizeof *a;
    } else {
        const char *colon = strrchr(s, ':');
        if (colon == NULL)
            return "missing \":PORT\"";
        hlen = (size_t)(colon - s);
        port = colon + 1;
        if (memchr(s, ':', hlen) != NULL)
            return "an IPv6 address must be in brackets, as in \"[::1]:8080\"";
        if (hlen >= sizeof host)
            return "not a numeric IPv4 address";
        memcpy(host, s, hlen);
        host[hlen] = '\0';
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
            return "not a numeric IPv4 address (host names are not resolved)";
        a->sin_family = AF_INET;
        *len = sizeof *a;
    }
    long p = parse_port(port, strlen(port));
    if (p < 0)
        return "the port must be a number from 0 to 65535";
    if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)p);
    else
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)p);
    return NULL;
}

static int is_host_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '.' || ch == '_';
}

/* "http://HOST[:PORT][/]", HOST a name, an IPv4 address or a bracketed IPv6 address. On
 * success sets *host (heap, without brackets) and *port and returns NULL; otherwise returns
 * why, or "" when the scheme is wrong (the generic message says it all). */
static const char *parse_url(const char *url, char **host, uint16_t *port)
{
    const char *h, *end;   /* the host as written, brackets of an IPv6 address excluded */
    const char *rest;      /* what follows the host */
    long p = 80;
    if (strncasecmp(url, "https://", 8) == 0)
        return "TLS to backends is not supported yet; use http://";
    if (strncasecmp(url, "http://", 7) != 0)
        return "";
    h = url + 7;
    if (*h == '[') {
        char tmp[INET6_ADDRSTRLEN + 1];
        struct in6_addr a6;
        const char *close = strchr(h, ']');
        h++;
        if (close == NULL || (size_t)(close - h) >= sizeof tmp)
            return "not a valid bracketed IPv6 address";
        memcpy(tmp, h, (size_t)(close - h));
        tmp[close - h] = '\0';
        if (inet_pton(AF_INET6, tmp, &a6) != 1)
            return "not a valid bracketed IPv6 address";
        end = close;
        rest = close + 1;
    } else {
        for (end = h; is_host_char(*end); end++)
            ;
        if (end == h)
            return "the host is missing";
        rest = end;
    }
    if (*rest == ':') {
        size_t plen = strcspn(rest + 1, "/?#");
        p = parse_port(rest + 1, plen);
        if (p < 1)
            return "the port must be a number from 1 to 65535";
        rest += 1 + plen;
    }
    if (rest[0] == '/' && rest[1] == '\0')
        rest++;
    if (*rest == '/' || *rest == '?' || *rest == '#')
        return "a path or query is not allowed";
    if (*rest != '\0')
        return "the host may hold only letters, digits, \"-\", \".\" and \"_\"";
    *host = strndup(h, (size_t)(end - h));
    *port = (uint16_t)p;
    return *host == NULL ? "out of memory" : NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* The reader.                                                                               */

static void read_fields(cfg_ctx_t *c, const json_t *obj, void *base, const field_t *f, size_t n);

static void read_integer(cfg_ctx_t *c, void *slot, const field_t *f, const json_t *v)
{
    if (!json_is_integer(v)) {
        err_type(c, "integer", v);
        return;
    }
    long long x = json_integer_value(v);
    if (x < f->min || x > f->max) {
        if (f->max == LLONG_MAX)
            err(c, "must be >= %lld, got %lld", f->min, x);
        else
            err(c, "must be between %lld and %lld, got %lld", f->min, f->max, x);
        return;
    }
    if (f->type == FT_UINT)
        *(unsigned *)slot = (unsigned)x;
    else if (f->type == FT_SIZE)
        *(size_t *)slot = (size_t)x;
    else
        *(uint64_t *)slot = (uint64_t)x;
}

static void read_models(cfg_ctx_t *c, pcr_backend_conf_t *b, const json_t *v)
{
    if (!json_is_array(v)) {
        err_type(c, "array of strings", v);
        return;
    }
    size_t n = json_array_size(v);
    if (n == 0)
        return;  /* like no "models" at all: any model, learned from the pod's /v1/models */
    b->models = calloc(n, sizeof *b->models);
    if (b->models == NULL) {
        c->nomem = 1;
        return;
    }
    b->nmodels = n;
    for (size_t i = 0; i < n; i++) {
        size_t mark = path_push_index(&c->path, i);
        const char *s = get_text(c, json_array_get(v, i), F_NONEMPTY);
        if (s != NULL)
            set_string(c, &b->models[i], s);
        path_pop(&c->path, mark);
    }
}

/* Reads a non-empty array of objects, each read with `fields` into a new array of `size`-byte
 * elements whose defaults `init` sets first. *n is set as soon as the array exists, so that
 * pcr_config_free sees every element whatever the errors. */
static void *read_object_array(cfg_ctx_t *c, const json_t *v, const char *what, size_t size,
                               const field_t *fields, size_t nfields,
                               void (*init)(cfg_ctx_t *, void *), size_t *n)
{
    if (!json_is_array(v)) {
        err_type(c, "array", v);
        return NULL;
    }
    if (json_array_size(v) == 0) {
        err(c, "must not be empty: at least one %s is needed", what);
        return NULL;
    }
    char *arr = calloc(json_array_size(v), size);
    if (arr == NULL) {
        c->nomem = 1;
        return NULL;
    }
    *n = json_array_size(v);
    for (size_t i = 0; i < *n; i++) {
        const json_t *el = json_array_get(v, i);
        size_t mark = path_push_index(&c->path, i);
        if (init != NULL)
            init(c, arr + i * size);
        if (!json_is_object(el))
            err_type(c, "object", el);
        else
            read_fields(c, el, arr + i * size, fields, nfields);
        path_pop(&c->path, mark);
    }
    return arr;
}

static int listen_port_is_0(const pcr_listen_conf_t *l)
{
    if (l->addr.ss_family == AF_INET6)
        return ((const struct sockaddr_in6 *)&l->addr)->sin6_port == 0;
    return ((const struct sockaddr_in *)&l->addr)->sin_port == 0;
}

static void read_listeners(cfg_ctx_t *c, pcr_config_t *cfg, const json_t *v)
{
    cfg->listen = read_object_array(c, v, "listener", sizeof *cfg->listen, listen_fields,
                                    PCR_ARRAY_SIZE(listen_fields), NULL, &cfg->nlisten);
    /* Compared as sockets, so "[::1]:80" and "[0:0::1]:80" clash; two listeners on port 0
     * do not: the OS gives each its own port. */
    for (size_t i = 1; i < cfg->nlisten; i++) {
        const pcr_listen_conf_t *l = &cfg->listen[i];
        for (size_t j = 0; j < i && l->addrlen != 0 && !listen_port_is_0(l); j++) {
            const pcr_listen_conf_t *o = &cfg->listen[j];
            if (o->addrlen == l->addrlen && memcmp(&o->addr, &l->addr, l->addrlen) == 0) {
                char q[QBUF];
                size_t mark = path_push_index(&c->path, i);
                path_push_key(&c->path, "address");
                err(c, "duplicate listen address %s (also listen[%zu].address)",
                    quote(q, sizeof q, l->address), j);
                path_pop(&c->path, mark);
                break;
            }
        }
    }
}

static void backend_init(cfg_ctx_t *c, void *el)
{
    pcr_backend_conf_t *b = el;
    b->weight = 1;
    b->capacity_tokens = 1048576;
    b->max_connections = 0;  /* filled from upstream.max_connections once that is read */
    set_string(c, &b->zone, "");
}

static void read_backends(cfg_ctx_t *c, pcr_config_t *cfg, const json_t *v)
{
    cfg->backends = read_object_array(c, v, "backend", sizeof *cfg->backends, backend_fields,
                                      PCR_ARRAY_SIZE(backend_fields), backend_init, &cfg->nbackends);
    /* The name places the backend on the ring: two with one name would share a place. */
    for (size_t i = 1; i < cfg->nbackends; i++) {
        const char *name = cfg->backends[i].name;
        for (size_t j = 0; j < i && name != NULL; j++) {
            if (cfg->backends[j].name != NULL && strcmp(cfg->backends[j].name, name) == 0) {
                char q[QBUF];
                size_t mark = path_push_index(&c->path, i);
                path_push_key(&c->path, "name");
                err(c, "duplicate backend name %s (also backends[%zu].name)",
                    quote(q, sizeof q, name), j);
                path_pop(&c->path, mark);
                break;
            }
        }
    }
}

/* Reads one value `v` of field `f` into the struct at `base`; the path names `v`. */
static void read_field(cfg_ctx_t *c, void *base, const field_t *f, const json_t *v)
{
    void *slot = (char *)base + f->offset;
    const char *s;
    char q[QBUF];

    switch (f->type) {
    case FT_UINT:
    case FT_SIZE:
    case FT_U64:
        read_integer(c, slot, f, v);
        break;
    case FT_DOUBLE:
        if (!json_is_number(v)) {
            err_type(c, "number", v);
        } else if (json_number_value(v) < f->dmin || json_number_value(v) > f->dmax) {
            if (isinf(f->dmax))
                err(c, "must be >= %g, got %g", f->dmin, json_number_value(v));
            else
                err(c, "must be between %g and %g, got %g", f->dmin, f->dmax, json_number_value(v));
        } else {
            *(double *)slot = json_number_value(v);
        }
        break;
    case FT_BOOL:
        if (!json_is_boolean(v))
            err_type(c, "boolean", v);
        else
            *(int *)slot = json_is_true(v);
        break;
    case FT_STRING:
        if ((s = get_text(c, v, f->flags)) != NULL)
            set_string(c, slot, s);
        break;
    case FT_FILE:
        if ((s = get_text(c, v, f->flags)) == NULL)
            break;
        /* Checked now so a bad path stops the start with a clear error, not a TLS failure
         * later; relative paths are relative to the working directory, as the process opens them. */
        if (access(s, R_OK) != 0)
            err(c, "cannot read %s: %s", quote(q, sizeof q, s), strerror(errno));
        set_string(c, slot, s);
        break;
    case FT_POLICY:
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        if (pcr_policy_kind_parse(s, slot) != 0) {
            char names[256];
            size_t o = 0;
            for (int k = 0; k < 16 && strcmp(pcr_policy_kind_name(k), "unknown") != 0; k++)
                o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", k ? ", " : "",
                                      pcr_policy_kind_name(k));
            err(c, "unknown policy %s; expected one of %s", quote(q, sizeof q, s), names);
        }
        break;
    case FT_LOG_LEVEL:
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        for (size_t k = 0; k < PCR_ARRAY_SIZE(log_level_names); k++) {
            if (strcmp(s, log_level_names[k]) == 0) {
                *(pcr_log_level_t *)slot = (pcr_log_level_t)k;
                return;
            }
        }
        err(c, "unknown log level %s; expected one of error, warn, info, debug", quote(q, sizeof q, s));
        break;
    case FT_HTTP_PATH:
        if ((s = get_text(c, v, 0)) == NULL)
            break;
        /* It goes into a request line as is: no space, no control character, nothing to encode. */
        if (s[0] != '/' || strpbrk(s, " #") != NULL)
            err(c, "expected a request path such as \"/health\", got %s", quote(q, sizeof q, s));
        else
            set_string(c, slot, s);
        break;
    case FT_ADDRESS: {
        pcr_listen_conf_t *l = base;
        const char *why;
        if (!json_is_string(v)) {
            err_type(c, "string", v);
            break;
        }
        s = json_string_value(v);
        if ((why = parse_listen_address(s, &l->addr, &l->addrlen)) != NULL) {
            l->addrlen = 0;
            err(c, "expected \"IP:PORT\" or \"[IPv6]:PORT\", got %s: %s", quote(q, sizeof q, s), why);
        }
        set_string(c, &l->address, s);
        break;
    }
    case FT_TLS:
        if (!json_is_object(v)) {
            err_type(c, "object", v);
            break;
        }
        ((pcr_listen_conf_t *)base)->tls = 1;
        read_fields(c, v, base, tls_fields, PCR_ARRAY_SIZE(tls_fields));
        break;
    case FT_URL: {
        pcr_backend_conf_t *b = base;
        const char *why;
        if (!json_is_string(v)) {
            err_type(c, "string", v);
            break;
        }
        s = json_string_value(v);
        free(b->host);
        b->host = NULL;
        why = parse_url(s, &b->host, &b->port);
        if (why != NULL)
            err(c, "expected \"http://host:port\", got %s%s%s", quote(q, sizeof q, s),
                why[0] ? ": " : "", why);
        set_string(c, &b->url, s);
        break;
    }
    case FT_MODELS:
        read_models(c, base, v);
        break;
    case FT_SECTION:
        if (!json_is_object(v))
            err_type(c, "object", v);
        else
            read_fields(c, v, slot, f->sub, f->nsub);
        break;
    case FT_LISTENERS:
        read_listeners(c, base, v);
        break;
    case FT_BACKENDS:
        read_backends(c, base, v);
        break;
    }
}

static void read_fields(cfg_ctx_t *c, const json_t *obj, void *base, const field_t *f, size_t n)
{
    check_keys(c, obj, f, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_object_get(obj, f[i].key);
        if (v == NULL) {
            if (f[i].flags & F_REQUIRED)
                err(c, "missing required key \"%s\"", f[i].key);
            continue;
        }
        size_t mark = path_push_key(&c->path, f[i].key);
        read_field(c, base, &f[i], v);
        path_pop(&c->path, mark);
    }
}

static pcr_config_t *config_new(cfg_ctx_t *c, const char *name)
{
    pcr_config_t *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL) {
        c->nomem = 1;
        return NULL;
    }
    cfg->routing = (pcr_routing_conf_t){
        .policy = PCR_POLICY_CACHE_AWARE, .block_bytes = 256, .max_prefix_bytes = 131072,
        .index_max_bytes = 268435456, .load_factor = 1.25, .load_weight = 1.0,
        .zone_penalty = 2048, .vnodes = 160,
    };
    cfg->limits = (pcr_limits_conf_t){
        .max_body_bytes = 33554432, .max_header_bytes = 16384, .max_concurrent_streams = 256,
        .max_client_connections = 10000,
    };
    cfg->timeouts = (pcr_timeouts_conf_t){
        .connect_ms = 2000, .response_ms = 600000, .stream_idle_ms = 300000,
        .upstream_keepalive_ms = 60000, .client_idle_ms = 120000, .drain_ms = 30000,
    };
    cfg->upstream = (pcr_upstream_conf_t){ .max_connections = 256, .retries = 1 };
    cfg->health = (pcr_health_conf_t){ .interval_ms = 2000, .timeout_ms = 1000, .fall = 2, .rise = 1 };
    cfg->log = (pcr_log_conf_t){ .level = PCR_LOG_INFO, .access_log = 1 };
    set_string(c, &cfg->path, name);
    set_string(c, &cfg->routing.zone, "");
    set_string(c, &cfg->health.path, "/health");
    return cfg;
}

static void read_root(cfg_ctx_t *c, pcr_config_t *cfg, const json_t *root)
{
    if (!json_is_object(root)) {
        err_type(c, "object", root);
        return;
    }
    read_fields(c, root, cfg, root_fields, PCR_ARRAY_SIZE(root_fields));

    /* Checks across keys, once each key is known valid on its own. */
    const json_t *routing = json_object_get(root, "routing");
    if (json_is_object(routing) && json_object_get(routing, "max_prefix_bytes") != NULL &&
        cfg->routing.max_prefix_bytes < cfg->routing.block_bytes) {
        size_t mark = path_push_key(&c->path, "routing");
        path_push_key(&c->path, "max_prefix_bytes");
        err(c, "must be >= routing.block_bytes (%zu), got %zu", cfg->routing.block_bytes,
            cfg->routing.max_prefix_bytes);
        path_pop(&c->path, mark);
    }
    for (size_t i = 0; i < cfg->nbackends; i++)
        if (cfg->backends[i].max_connections == 0)
            cfg->backends[i].max_connections = cfg->upstream.max_connections;
}

static pcr_config_t *config_from_text(const char *text, size_t len, const char *name, char **errors)
{
    cfg_ctx_t c = { .name = name };
    json_error_t jerr;
    pcr_config_t *cfg = NULL;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);

    if (root == NULL) {
        err_at(&c, jerr.line, jerr.column, "%s", jerr.text);
        goto cleanup;
    }
    cfg = config_new(&c, name);
    if (cfg != NULL)
        read_root(&c, cfg, root);

cleanup:
    json_decref(root);
    if (ctx_finish(&c, text, len, errors)) {
        pcr_config_free(cfg);
        cfg = NULL;
    }
    return cfg;
}

pcr_config_t *pcr_config_parse(const char *text, const char *name, char **errors)
{
    if (errors != NULL)
        *errors = NULL;
    if (name == NULL)
        name = "(config)";
    if (text == NULL) {
        cfg_ctx_t c = { .name = name };
        err_at(&c, 0, 0, "no config text");
        ctx_finish(&c, NULL, 0, errors);
        return NULL;
    }
    return config_from_text(text, strlen(text), name, errors);
}

pcr_config_t *pcr_config_load(const char *path, char **errors)
{
    cfg_ctx_t c = { .name = path != NULL ? path : "(null)" };
    pcr_config_t *cfg = NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    FILE *f = NULL;

    if (errors != NULL)
        *errors = NULL;
    if (path == NULL || (f = fopen(path, "rb")) == NULL) {
        err_at(&c, 0, 0, "cannot read: %s", strerror(path == NULL ? EINVAL : errno));
        goto cleanup;
    }
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 16384;
            char *nb = cap <= CONFIG_MAX_FILE_BYTES + 1 ? realloc(buf, cap) : NULL;
            if (nb == NULL) {
                err_at(&c, 0, 0, "cannot read: %s", cap > CONFIG_MAX_FILE_BYTES + 1
                       ? "larger than 16 MiB, surely not a config file" : strerror(ENOMEM));
                goto cleanup;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        err_at(&c, 0, 0, "cannot read: %s", strerror(errno));
        goto cleanup;
    }
    cfg = config_from_text(buf, len, path, errors);

cleanup:
    if (f != NULL)
        fclose(f);
    free(buf);
    if (cfg == NULL && c.nerrs + c.nomem > 0)
        ctx_finish(&c, NULL, 0, errors);
    else
        ctx_dispose(&c);
    return cfg;
}

void pcr_config_free(pcr_config_t *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < cfg->nlisten; i++) {
        free(cfg->listen[i].address);
        free(cfg->listen[i].cert);
        free(cfg->listen[i].key);
    }
    free(cfg->listen);
    for (size_t i = 0; i < cfg->nbackends; i++) {
        pcr_backend_conf_t *b = &cfg->backends[i];
        free(b->name);
        free(b->url);
        free(b->host);
        free(b->zone);
        for (size_t j = 0; j < b->nmodels; j++)
            free(b->models[j]);
        free(b->models);
    }
    free(cfg->backends);
    free(cfg->routing.zone);
    free(cfg->health.path);
    free(cfg->path);
    free(cfg);
}
