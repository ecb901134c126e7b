/* router/config/config_pos.c: key paths, and the position scanner that finds where each key path
 * starts in the raw text of a config file (contract in config_pos.h).
 *
 * The scanner runs only when the loader has errors to place, on text jansson has accepted, and
 * only records where each key path starts; it still checks every bound, so text it does not
 * expect makes it stop early (later errors then fall back to a located parent) instead of
 * reading past the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_pos.h"
#include "pcr/common.h"

/* ---------------------------------------------------------------------------------------- */
/* Key paths.                                                                                */

int pcr_cfg_path_append(pcr_cfg_path_t *pb, const char *add, size_t n)
{
    /* A key path names keys of one config file, which is at most 16 MiB (config.c). */
    if (pcr_grow(&pb->s, &pb->cap, pb->len + n + 1, 64, 16u * 1024 * 1024 + 1, NULL) != 0) {
        pb->nomem = 1;
        return PCR_ERR_NOMEM;
    }
    memcpy(pb->s + pb->len, add, n);
    pb->len += n;
    pb->s[pb->len] = '\0';
    return 0;
}

size_t pcr_cfg_path_push_key(pcr_cfg_path_t *pb, const char *key)
{
    size_t mark = pb->len;
    if ((mark == 0 || pcr_cfg_path_append(pb, ".", 1) == 0) &&
        pcr_cfg_path_append(pb, key, strlen(key)) != 0)
        pb->len = mark;
    if (pb->s != NULL)
        pb->s[pb->len] = '\0';
    return mark;
}

size_t pcr_cfg_path_push_index(pcr_cfg_path_t *pb, size_t i)
{
    char buf[32];
    size_t mark = pb->len;
    int n = snprintf(buf, sizeof buf, "[%zu]", i);
    pcr_cfg_path_append(pb, buf, (size_t)n);
    return mark;
}

void pcr_cfg_path_pop(pcr_cfg_path_t *pb, size_t mark)
{
    pb->len = mark;
    if (pb->s != NULL)
        pb->s[mark] = '\0';
}

const char *pcr_cfg_path_str(const pcr_cfg_path_t *pb)
{
    return pb->s != NULL ? pb->s : "";
}

/* ---------------------------------------------------------------------------------------- */
/* The position scanner.                                                                     */

typedef struct {
    const char *p, *end;
    int line, col;       /* position of *p */
    pcr_cfg_path_t path;
    pcr_cfg_path_t key;  /* the object key being decoded */
    pcr_cfg_posmap_t *m; /* where it records what it finds */
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
    pcr_cfg_posmap_t *m = s->m;
    /* One position per key of a config file, which is at most 16 MiB (config.c). */
    if (pcr_grow_elems(&m->v, &m->cap, m->n + 1, sizeof(*m->v), 64, 16u * 1024 * 1024, NULL) != 0)
        goto nomem;
    pcr_cfg_pos_t *e = &m->v[m->n];
    e->path = strdup(pcr_cfg_path_str(&s->path));
    if (e->path == NULL)
        goto nomem;
    e->kline = kline;
    e->kcol = kcol;
    e->vline = s->line;
    e->vcol = s->col;
    m->n++;
    return 0;
nomem:
    m->nomem = 1;
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

static void utf8_put(pcr_cfg_path_t *out, unsigned long cp)
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
    pcr_cfg_path_append(out, b, n);
}

/* Skips a string at *p == '"'. When `out` is not NULL, decodes it there (keys must be
 * decoded: jansson hands the validator "a\u0062" as "ab", and paths must match). */
static int scan_string(scan_t *s, pcr_cfg_path_t *out)
{
    if (out != NULL)
        pcr_cfg_path_pop(out, 0);
    scan_advance(s);  /* the opening quote */
    while (s->p < s->end) {
        char ch = *s->p;
        if (ch == '"') {
            scan_advance(s);
            return 0;
        }
        if (ch != '\\') {
            if (out != NULL)
                pcr_cfg_path_append(out, s->p, 1);
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
            pcr_cfg_path_append(out, &dec, 1);
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
            mark = pcr_cfg_path_push_key(&s->path, pcr_cfg_path_str(&s->key));
        } else {
            mark = pcr_cfg_path_push_index(&s->path, i);
        }
        int rc = scan_value(s, kline, kcol, depth + 1);
        pcr_cfg_path_pop(&s->path, mark);
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
    return strcmp(((const pcr_cfg_pos_t *)a)->path, ((const pcr_cfg_pos_t *)b)->path);
}

/* ---------------------------------------------------------------------------------------- */
/* The map of positions.                                                                     */

void pcr_cfg_pos_scan(pcr_cfg_posmap_t *m, const char *text, size_t len)
{
    scan_t s = { .p = text, .end = text + len, .line = 1, .col = 1, .m = m };
    scan_value(&s, 0, 0, 0);  /* stops early on what it cannot read: what it found still counts */
    if (m->n > 0)
        qsort(m->v, m->n, sizeof *m->v, pos_cmp);
    if (s.path.nomem || s.key.nomem)
        m->nomem = 1;
    free(s.path.s);
    free(s.key.s);
}

const pcr_cfg_pos_t *pcr_cfg_pos_find(const pcr_cfg_posmap_t *m, const char *path)
{
    char *tmp = strdup(path);
    const pcr_cfg_pos_t *hit = NULL;
    if (tmp == NULL || m->n == 0) {
        free(tmp);
        return NULL;
    }
    for (;;) {
        pcr_cfg_pos_t key = { .path = tmp };
        hit = bsearch(&key, m->v, m->n, sizeof *m->v, pos_cmp);
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

void pcr_cfg_pos_dispose(pcr_cfg_posmap_t *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->v[i].path);
    free(m->v);
    m->v = NULL;
    m->n = m->cap = 0;
}

