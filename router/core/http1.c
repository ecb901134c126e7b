/* router/core/http1.c: the HTTP/1.1 checks both sides share (http1.h). */
#include <string.h>
#include <strings.h>

#include "http1.h"
#include "pcr/common.h"

/* tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" /
 *         "|" / "~" / DIGIT / ALPHA   (RFC 9110, 5.6.2): one load per byte, every header of
 * every request and response is checked. */
static const unsigned char tchar[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1, ['+'] = 1,
    ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1, ['~'] = 1,
    ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
};

int pcr_http_token_valid(const char *s, size_t len)
{
    if (len == 0)
        return 0;
    unsigned char ok = 1;
    for (size_t i = 0; i < len; i++)
        ok &= tchar[(unsigned char)s[i]];
    return ok;
}

int pcr_http_value_valid(const char *v, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c <= '\r' && (c == '\r' || c == '\n' || c == '\0'))
            return 0;
    }
    return 1;
}

int pcr_http_te_is_chunked(const char *v, size_t len)
{
    while (len > 0 && (v[0] == ' ' || v[0] == '\t')) {
        v++;
        len--;
    }
    while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    return len == 7 && strncasecmp(v, "chunked", 7) == 0;
}

int pcr_http_list_has(const char *list, size_t list_len, const char *name, size_t len)
{
    const char *p = list, *end = list + list_len;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
            p++;
        const char *e = p;
        while (e < end && *e != ',' && *e != ' ' && *e != '\t')
            e++;
        if (e > p && (size_t)(e - p) == len && strncasecmp(p, name, len) == 0)
            return 1;
        p = e;
    }
    return 0;
}

static int name_is(const char *n, const char *want, size_t len)
{
    return strncasecmp(n, want, len) == 0;
}

int pcr_http_hop_by_hop(const char *n, size_t len, const char *connection_values)
{
    if (len > 0 && n[0] == ':')
        return 1; /* HTTP/2 pseudo-headers */
    /* The fixed list, by length first: most fields are compared with nothing. */
    int hop = 0;
    switch (len) {
    case 2: hop = name_is(n, "te", 2); break;
    case 4: hop = name_is(n, "host", 4); break;
    case 6: hop = name_is(n, "expect", 6); break;
    case 7: hop = name_is(n, "trailer", 7) || name_is(n, "upgrade", 7); break;
    case 10: hop = name_is(n, "connection", 10) || name_is(n, "keep-alive", 10); break;
    case 14: hop = name_is(n, "content-length", 14) || name_is(n, "http2-settings", 14); break;
    case 16: hop = name_is(n, "proxy-connection", 16); break;
    case 17: hop = name_is(n, "transfer-encoding", 17); break;
    }
    return hop || (connection_values != NULL && pcr_http_list_has(connection_values, strlen(connection_values), n, len));
}

size_t pcr_http_put_dec(char *out, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

size_t pcr_http_put_hex(char *out, uint64_t v)
{
    char tmp[16];
    size_t n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v != 0);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

void pcr_fold_reset(pcr_fold_t *f)
{
    f->val_end = NULL;
    f->in_value = 0;
    f->prev_at_end = 0;
}

void pcr_fold_begin(pcr_fold_t *f, const char *buf, size_t len)
{
    f->buf_start = buf;
    f->buf_end = buf + len;
}

void pcr_fold_end(pcr_fold_t *f)
{
    f->prev_at_end = f->in_value && f->val_end == f->buf_end;
    for (const char *p = f->buf_end; p > f->buf_start; p--) {
        if (p[-1] != ' ' && p[-1] != '\t') {
            f->prev_last = p[-1];
            break;
        }
    }
}

void pcr_fold_field(pcr_fold_t *f) { f->in_value = 0; }

int pcr_fold_value(pcr_fold_t *f, const char *at, size_t len)
{
    if (f->in_value && !(at == f->buf_start && f->prev_at_end))
        return -1;
    if (!f->in_value && len > 0) {
        /* A value begins after the colon and optional whitespace; a line feed in between is a
         * fold. (An empty value is reported with len 0 at the next line: not a fold.) */
        const char *p = at;
        while (p > f->buf_start && (p[-1] == ' ' || p[-1] == '\t'))
            p--;
        char before = p > f->buf_start ? p[-1] : f->prev_last;
        if (before == '\n')
            return -1;
    }
    f->in_value = 1;
    f->val_end = at + len;
    return 0;
}
