/* router/body/prom.c: the Prometheus text reader behind pcr_prom_parse (contract in prom.h).
 *
 * It reads the text format line by line, as the exposition format defines a sample line:
 *
 *   name [ "{" label="value" { "," label="value" } [","] "}" ] value [ timestamp ]
 *
 * A line of one of the few metrics the router reads is parsed in full (name, labels with their
 * escapes, value, timestamp) before any of it is used, so a line cut or garbled anywhere is
 * skipped whole; a line that does not begin with one of those names is dismissed there (it is
 * counted, not checked: the router takes nothing from it). Numbers go through strtod/strtoull on a bounded copy and must
 * use every character given; what is then out of range for the router (NaN, infinities,
 * negative counts, a sum that would overflow) makes the line bad rather than clamped, so a
 * sample never holds a value the pod did not really report. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pcr/common.h"
#include "prom.h"

/* Longest number token: a double printed with %.17g takes 24; anything longer is not one. */
#define NUM_MAX 64

typedef struct {
    const char *name;            /* the metric name */
    size_t nlen;
    unsigned bit;                /* which known metric it is (0: none of ours) */
    const char *block_size;      /* raw label values of vllm:cache_config_info, NULL absent */
    size_t block_size_len;
    const char *gpu_blocks;
    size_t gpu_blocks_len;
    double value;
} line_t;

/* The metrics the router keeps; the others are parsed (to count bad lines) and dropped. */
#define KNOWN(name, bit) {name, sizeof(name) - 1, bit}
static const struct {
    const char *name;
    size_t len;
    unsigned bit;
} known[] = {
    KNOWN("vllm:num_requests_waiting", PCR_PROM_WAITING),
    KNOWN("vllm:num_requests_running", PCR_PROM_RUNNING),
    KNOWN("vllm:prefix_cache_hits_total", PCR_PROM_HITS),
    KNOWN("vllm:gpu_prefix_cache_hits_total", PCR_PROM_HITS),          /* vLLM v0 */
    KNOWN("vllm:prefix_cache_queries_total", PCR_PROM_QUERIES),
    KNOWN("vllm:gpu_prefix_cache_queries_total", PCR_PROM_QUERIES),    /* vLLM v0 */
    KNOWN("vllm:kv_cache_usage_perc", PCR_PROM_KV_USAGE),
    KNOWN("vllm:gpu_cache_usage_perc", PCR_PROM_KV_USAGE),             /* older vLLM */
    KNOWN("vllm:cache_config_info", PCR_PROM_CACHE_CONFIG),
    KNOWN("process_start_time_seconds", PCR_PROM_START_TIME),
    KNOWN("vllm:request_success_total", PCR_PROM_SUCCESS),
};

static int is_blank(char ch) { return ch == ' ' || ch == '\t'; }

/* Name characters: N_FIRST may start a label name, N_COLON is ':' (metric names only),
 * N_DIGIT may follow the first. A table, since a vLLM page is some 40 KB of names. */
enum { N_FIRST = 1, N_COLON = 2, N_DIGIT = 4 };
#define NAME_RANGE(a, b, v) [a ... b] = v
static const unsigned char name_class[256] = {
    NAME_RANGE('a', 'z', N_FIRST), NAME_RANGE('A', 'Z', N_FIRST), ['_'] = N_FIRST,
    [':'] = N_COLON, NAME_RANGE('0', '9', N_DIGIT),
};

/* Advances *p over a name ([a-zA-Z_:][a-zA-Z0-9_:]*, no ':' for labels); 0 when there is none. */
static size_t scan_name(const char **p, const char *end, int colon)
{
    const char *s = *p, *q = s;
    unsigned first = N_FIRST | (colon ? N_COLON : 0), rest = first | N_DIGIT;
    if (q == end || !(name_class[(unsigned char)*q] & first))
        return 0;
    for (q++; q < end && (name_class[(unsigned char)*q] & rest); q++)
        ;
    *p = q;
    return (size_t)(q - s);
}

static void skip_blanks(const char **p, const char *end)
{
    while (*p < end && is_blank(**p))
        (*p)++;
}

/* Advances *p over one blank-free token; its length (0 when none). */
static size_t scan_token(const char **p, const char *end)
{
    const char *s = *p;
    while (*p < end && !is_blank(**p))
        (*p)++;
    return (size_t)(*p - s);
}

/* A whole token as a double (strtod's syntax, so "NaN" and "+Inf" too); -1 when it is not. */
static int parse_double(const char *s, size_t n, double *out)
{
    char buf[NUM_MAX];
    char *endp;
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (is_blank(buf[0]))
        return -1;
    errno = 0;
    *out = strtod(buf, &endp);
    /* ERANGE on underflow still gives a usable (tiny) value; overflow gives an infinity,
     * which the caller rejects like any other. */
    return endp == buf + n ? 0 : -1;
}

/* A label value as an unsigned integer in 1..max: digits only; -1 otherwise. */
static int parse_count(const char *s, size_t n, uint64_t max, uint64_t *out)
{
    char buf[24];
    if (n == 0 || n >= sizeof buf)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    unsigned long long v = strtoull(buf, NULL, 10);
    if (errno != 0 || v < 1 || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Reads {label="value",...} at *p (just past the '{'); 0, or -1 when malformed. */
static int scan_labels(const char **p, const char *end, line_t *ln)
{
    for (unsigned count = 0;; count++) {
        skip_blanks(p, end);
        if (*p < end && **p == '}') {
            (*p)++;
            return 0;
        }
        if (count == PCR_PROM_MAX_LABELS)
            return -1;
        const char *lname = *p;
        size_t llen = scan_name(p, end, 0);
        if (llen == 0)
            return -1;
        skip_blanks(p, end);
        if (*p >= end || **p != '=')
            return -1;
        (*p)++;
        skip_blanks(p, end);
        if (*p >= end || **p != '"')
            return -1;
        const char *v = ++(*p), *q = v;
        for (;;) {
            while (q < end && *q != '"' && *q != '\\')
                q++;
            if (q == end)
                return -1;
            if (*q == '"')
                break;
            if (++q == end)     /* an escape takes the next character */
                return -1;
            q++;
        }
        *p = q;
        size_t vlen = (size_t)(*p - v);
        (*p)++;
        const char **slot = NULL;
        size_t *slot_len = NULL;
        if (llen == 10 && memcmp(lname, "block_size", 10) == 0) {
            slot = &ln->block_size;
            slot_len = &ln->block_size_len;
        } else if (llen == 14 && memcmp(lname, "num_gpu_blocks", 14) == 0) {
            slot = &ln->gpu_blocks;
            slot_len = &ln->gpu_blocks_len;
        }
        if (slot != NULL) {
            if (*slot != NULL)
                return -1;      /* a label twice: which one would be meant? */
            *slot = v;
            *slot_len = vlen;
        }
        skip_blanks(p, end);
        if (*p < end && **p == ',')
            (*p)++;
        else if (*p >= end || **p != '}')
            return -1;
    }
}

static unsigned known_bit(const char *name, size_t n)
{
    if (n < 22)
        return 0;       /* shorter than the shortest known name */
    for (size_t i = 0; i < PCR_ARRAY_SIZE(known); i++)
        if (known[i].len == n && memcmp(known[i].name, name, n) == 0)
            return known[i].bit;
    return 0;
}

/* Whether a line begins with one of the known names, whole: followed by a blank, a '{' or
 * nothing. Each name is compared only when its sixth byte matches (they differ there). */
static int known_start(const char *s, size_t n)
{
    if (n < 22)
        return 0;
    for (size_t i = 0; i < PCR_ARRAY_SIZE(known); i++) {
        size_t k = known[i].len;
        if (s[5] == known[i].name[5] && n >= k && memcmp(s, known[i].name, k) == 0 &&
            (n == k || is_blank(s[k]) || s[k] == '{'))
            return 1;
    }
    return 0;
}

/* Parses one sample line (no '\n'); 0, or -1 when it breaks the format. */
static int parse_line(const char *s, size_t n, line_t *ln)
{
    const char *p = s, *end = s + n;
    memset(ln, 0, sizeof *ln);
    ln->name = p;
    if ((ln->nlen = scan_name(&p, end, 1)) == 0)
        return -1;
    ln->bit = known_bit(ln->name, ln->nlen);
    const char *mark = p;
    skip_blanks(&p, end);
    if (p < end && *p == '{') {
        p++;
        if (scan_labels(&p, end, ln) != 0)
            return -1;
        mark = p;
        skip_blanks(&p, end);
    }
    if (p == mark)
        return -1;      /* the value is set apart by blanks */
    const char *v = p;
    size_t vlen = scan_token(&p, end);
    if (parse_double(v, vlen, &ln->value) != 0)
        return -1;
    skip_blanks(&p, end);
    const char *ts = p;
    size_t tlen = scan_token(&p, end);
    if (tlen > 0) {
        /* A timestamp, in milliseconds: an integer, perhaps negative; never used. */
        size_t i = ts[0] == '-';
        if (tlen == i || tlen - i > 19)
            return -1;
        for (; i < tlen; i++)
            if (ts[i] < '0' || ts[i] > '9')
                return -1;
    }
    skip_blanks(&p, end);
    return p == end ? 0 : -1;
}

/* Adds v to a sum over label sets; -1 when v is not a count or the sum would overflow. */
static int add_count(double *sum, double v)
{
    if (!isfinite(v) || v < 0 || !isfinite(*sum + v))
        return -1;
    *sum += v;
    return 0;
}

/* Keeps what one parsed line says; -1 when its value is unusable for the router. */
static int keep(const line_t *ln, pcr_pod_sample_t *out)
{
    unsigned bit = ln->bit;
    double *sum = bit == PCR_PROM_WAITING ? &out->num_requests_waiting
                : bit == PCR_PROM_RUNNING ? &out->num_requests_running
                : bit == PCR_PROM_HITS ? &out->prefix_cache_hits
                : bit == PCR_PROM_QUERIES ? &out->prefix_cache_queries
                : bit == PCR_PROM_SUCCESS ? &out->request_success : NULL;
    switch (bit) {
    case 0:
        return 0;
    case PCR_PROM_WAITING:
    case PCR_PROM_RUNNING:
    case PCR_PROM_HITS:
    case PCR_PROM_QUERIES:
    case PCR_PROM_SUCCESS:
        if (add_count(sum, ln->value) != 0)
            return -1;
        break;
    case PCR_PROM_KV_USAGE:
        if (!(ln->value >= 0 && ln->value <= 1))   /* NaN fails too */
            return -1;
        if (ln->value > out->kv_cache_usage)
            out->kv_cache_usage = ln->value;
        break;
    case PCR_PROM_CACHE_CONFIG: {
        uint64_t bs, nb;
        if (ln->block_size == NULL || ln->gpu_blocks == NULL ||
            parse_count(ln->block_size, ln->block_size_len, PCR_PROM_MAX_BLOCK_SIZE, &bs) != 0 ||
            parse_count(ln->gpu_blocks, ln->gpu_blocks_len, PCR_PROM_MAX_GPU_BLOCKS, &nb) != 0)
            return -1;
        out->block_size = bs;
        out->num_gpu_blocks = nb;
        break;
    }
    case PCR_PROM_START_TIME:
        if (!isfinite(ln->value) || !(ln->value > 0))
            return -1;
        out->process_start_time = ln->value;
        break;
    }
    out->seen |= bit;
    return 0;
}

static void read_line(const char *s, size_t n, pcr_pod_sample_t *out)
{
    line_t ln;
    if (n > 0 && s[n - 1] == '\r')
        n--;    /* CRLF: not the format, but harmless to accept */
    size_t i = 0;
    while (i < n && is_blank(s[i]))
        i++;
    if (i == n || s[i] == '#')
        return;     /* blank, or # HELP / # TYPE / a comment */
    if (n > PCR_PROM_MAX_LINE) {
        out->bad_lines++;
        return;
    }
    /* A line that does not begin with a metric the router reads is dismissed there: most of a
     * vLLM page is histograms, and reading them in full was most of the cost of a scrape. */
    if (!known_start(s + i, n - i)) {
        if (name_class[(unsigned char)s[i]] & (N_FIRST | N_COLON))
            out->other_lines++;
        else
            out->bad_lines++;   /* not even a name */
        return;
    }
    if (memchr(s, '\0', n) != NULL || parse_line(s + i, n - i, &ln) != 0 ||
        keep(&ln, out) != 0) {
        out->bad_lines++;
        return;
    }
    out->samples++;
}

/* ---- reading a page as it arrives ----------------------------------------------------- */

enum { OV_BLANKS, OV_BLANKS_CR, OV_IGNORED, OV_BAD };

/* A line longer than the carry, seen piece by piece: read_line would find it too long unless it
 * is blank or a comment, which its first byte other than a blank says (a '\r' only when it is
 * not the line's last byte: read_line strips that one). */
static void overlong_see(pcr_prom_reader_t *r, const char *s, size_t n)
{
    for (size_t i = 0; i < n && r->ov < OV_IGNORED; i++) {
        char ch = s[i];
        if (r->ov == OV_BLANKS_CR)
            r->ov = OV_BAD;     /* the '\r' was not the last byte */
        else if (is_blank(ch))
            continue;
        else if (ch == '\r')
            r->ov = OV_BLANKS_CR;
        else
            r->ov = ch == '#' ? OV_IGNORED : OV_BAD;
    }
}

/* Part of a line whose start is carried; `complete` when its '\n' came. */
static void carry_add(pcr_prom_reader_t *r, const char *s, size_t n, int complete)
{
    if (!r->overlong) {
        if (r->ncarry + n <= sizeof r->carry) {
            memcpy(r->carry + r->ncarry, s, n);
            r->ncarry += n;
            if (complete) {
                read_line(r->carry, r->ncarry, &r->s);
                r->ncarry = 0;
            }
            return;
        }
        /* Longer than any line read_line would take: only its kind is followed from here. */
        r->overlong = 1;
        r->ov = OV_BLANKS;
        overlong_see(r, r->carry, r->ncarry);
        r->ncarry = 0;
    }
    overlong_see(r, s, n);
    if (complete) {
        if (r->ov == OV_BAD)
            r->s.bad_lines++;
        r->overlong = 0;
    }
}

void pcr_prom_begin(pcr_prom_reader_t *r)
{
    memset(&r->s, 0, sizeof r->s);
    r->ncarry = 0;
    r->overlong = 0;
    r->ov = OV_BLANKS;
}

void pcr_prom_feed(pcr_prom_reader_t *r, const char *data, size_t len)
{
    const char *p = data, *end = data + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl != NULL ? nl : end) - p);
        if (nl != NULL && r->ncarry == 0 && !r->overlong)
            read_line(p, n, &r->s);      /* whole in this piece: read where it is */
        else
            carry_add(r, p, n, nl != NULL);
        if (nl == NULL)
            break;
        p = nl + 1;
    }
}

const pcr_pod_sample_t *pcr_prom_end(pcr_prom_reader_t *r)
{
    /* A last line without its '\n' was cut: not read. */
    r->ncarry = 0;
    r->overlong = 0;
    return &r->s;
}

int pcr_prom_parse(const char *text, size_t len, pcr_pod_sample_t *out)
{
    if (out == NULL || (text == NULL && len > 0))
        return PCR_ERR_INVAL;
    memset(out, 0, sizeof *out);
    if (len == 0)
        return 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            break;      /* a cut last line: the format ends every line with '\n' */
        read_line(p, (size_t)(nl - p), out);
        p = nl + 1;
    }
    return 0;
}
