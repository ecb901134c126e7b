/* router/http1.c: the HTTP/1.1 checks both sides share (http1.h). */
#include <string.h>
#include <strings.h>

#include "http1.h"
#include "pcr/common.h"

int pcr_http_token_valid(const char *s, size_t len)
{
    /* tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" /
     *         "|" / "~" / DIGIT / ALPHA   (RFC 9110, 5.6.2) */
    static const char extra[] = "!#$%&'*+-.^_`|~";
    if (len == 0)
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c != '\0' && strchr(extra, c) != NULL)))
            return 0;
    }
    return 1;
}

int pcr_http_value_valid(const char *v, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (v[i] == '\r' || v[i] == '\n' || v[i] == '\0')
            return 0;
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

int pcr_http_hop_by_hop(const char *n, size_t len, const char *connection_values)
{
    static const char *const hop[] = {"connection", "keep-alive", "proxy-connection",
                                      "transfer-encoding", "te", "trailer", "upgrade", "host",
                                      "content-length", "expect", "http2-settings"};
    if (len > 0 && n[0] == ':')
        return 1; /* HTTP/2 pseudo-headers */
    for (size_t i = 0; i < PCR_ARRAY_SIZE(hop); i++)
        if (strlen(hop[i]) == len && strncasecmp(n, hop[i], len) == 0)
            return 1;
    return connection_values != NULL &&
           pcr_http_list_has(connection_values, strlen(connection_values), n, len);
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
