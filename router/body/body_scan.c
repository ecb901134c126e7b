/* router/body/body_scan.c: a request body to yajl, chunk by chunk, with no string re-scanned
 * (router/body/body_scan.h says why and how). This file knows where strings start and end and
 * how long an escape is; whether the JSON is valid is yajl's to say, for every byte. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "body_check.h"
#include "body_scan.h"
#include "evmem.h"
#include "pcr/common.h"

enum { ESC_NONE = 0, ESC_CHAR, ESC_HEX };  /* after a backslash; in the 4 digits of \uXXXX */

/* P's memory. yajl makes a handle in a few small blocks (the handle, its lexer, the lexer's
 * buffer, the state stack as it grows) and P is made anew for every body, so they come from
 * this arena, which the next body's P starts over: blocks are only handed out, a free is a
 * no-op, and what does not fit is an ordinary malloc. Each block has a header with its size
 * (for realloc) and its origin. 4 KiB: yajl's first text buffer is 2 KiB, and an ordinary
 * completion body needs one after the handle's 0.5 KiB, which a 2 KiB arena sent to malloc's
 * slow path on every request. */
#define ARENA_BYTES 4096
#define ARENA_ALIGN 16

typedef struct {
    size_t used;
    _Alignas(ARENA_ALIGN) unsigned char mem[ARENA_BYTES];
} arena_t;

typedef struct {
    _Alignas(ARENA_ALIGN) size_t size;
    size_t heap;               /* 1: from malloc */
} block_t;

struct pcr_body_scan {
    yajl_handle p;             /* the structure, long strings read as "" */
    yajl_handle v;             /* long strings' contents: an array of strings, never closed;
                                * made when simdjson first refuses a piece (most bodies never
                                * need it), and kept by a reset while it has refused none */
    int v_failed;              /* V refused a piece: it is no longer the empty array's state */
    const yajl_callbacks *p_cbs;
    const pcr_scan_cbs_t *cbs;
    void *ud;
    pcr_scan_err_t *err;
    uint64_t off;              /* body offset of the chunk being fed */

    /* Outside strings: a number or literal cut by the chunk's end, given to P whole with the
     * next chunk (yajl re-scans a token that spans calls, and names the wrong byte for a
     * mistake found in one). */
    char tbuf[PCR_SCAN_TOKEN_MAX + 1];  /* and the byte that ends it */
    size_t tlen;
    uint64_t t_off;            /* its body offset */

    /* The string being read. */
    int in_string, is_long;
    size_t short_max;
    size_t clen;               /* content bytes so far */
    uint64_t quote_off;        /* body offset of its opening quote */
    int esc;
    unsigned esc_left;         /* ESC_HEX: digits still to come */
    unsigned esc_value;        /* ESC_HEX: the digits so far */
    int suspect;               /* find_end saw, in this string's bytes not yet checked, a
                                * control byte, a bad escape or a surrogate escape: the next
                                * piece gets the full check, not only UTF-8's */
    unsigned esc_have;         /* bytes of the unfinished escape, backslash included */
    uint64_t esc_end;          /* body offset just past the last whole escape */
    char sbuf[PCR_SCAN_SHORT_MAX + 2];  /* a short string spanning chunks: quote, contents */
    size_t slen;
    char pend[8];              /* long: contents not yet given to V (a split escape or */
    size_t plen;               /* UTF-8 character, at most 5 bytes) */
    uint64_t v_off;            /* body offset of pend[0] */
    char *scratch;             /* one piece for V: comma, quote, pend, contents, quote */
    arena_t arena;             /* P's blocks */
    yajl_alloc_funcs p_alloc;
};

#define SCRATCH_BYTES (3 + sizeof(((pcr_body_scan_t *)0)->pend) + PCR_SCAN_SHORT_MAX + \
                       PCR_SCAN_WINDOW + 2 + PCR_BODY_CHECK_PADDING)

/* Outside strings, the bytes that end a number or literal (yajl's whitespace: JSON's and
 * \v, \f). */
static const unsigned char delim[256] = {
    [' '] = 1, ['\t'] = 1, ['\n'] = 1, ['\r'] = 1, ['\v'] = 1, ['\f'] = 1,
    ['{'] = 1, ['}'] = 1, ['['] = 1, [']'] = 1, [','] = 1, [':'] = 1,
};

static void *arena_malloc(void *ctx, size_t n)
{
    arena_t *a = ctx;
    size_t need = sizeof(block_t) + (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    block_t *b;
    if (n <= ARENA_BYTES && need <= ARENA_BYTES - a->used) {
        b = (block_t *)(void *)(a->mem + a->used);
        a->used += need;
        b->heap = 0;
    } else if ((b = malloc(sizeof(block_t) + n)) != NULL) {
        b->heap = 1;
    } else {
        return NULL;
    }
    b->size = n;
    return b + 1;
}

static void arena_free(void *ctx, void *p)
{
    if (p == NULL)
        return;
    block_t *b = (block_t *)p - 1;
    if (b->heap)
        free(b);
}

static void *arena_realloc(void *ctx, void *p, size_t n)
{
    if (p == NULL)
        return arena_malloc(ctx, n);
    block_t *b = (block_t *)p - 1;
    if (b->heap) {
        block_t *nb = realloc(b, sizeof(block_t) + n);
        if (nb == NULL)
            return NULL;
        nb->size = n;
        return nb + 1;
    }
    if (n <= b->size)
        return p;
    void *np = arena_malloc(ctx, n);
    if (np != NULL)
        memcpy(np, p, b->size);
    return np;
}

static int fail(pcr_body_scan_t *s, int rc, const char *fmt, ...)
{
    if (s->err->rc != 0)
        return s->err->rc;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err->msg, sizeof(s->err->msg), fmt, ap);
    va_end(ap);
    return s->err->rc = rc;
}

/* A callback of the reader's refused: its error, or a generic one if it set none. */
static int cb_failed(pcr_body_scan_t *s)
{
    return s->err->rc != 0 ? s->err->rc : fail(s, PCR_ERR_PARSE, "request body could not be read");
}

/* yajl's reason, without its "lexical error: " / "parse error: " prefix and final ".\n". */
static int yajl_fail(pcr_body_scan_t *s, yajl_handle h, uint64_t at)
{
    unsigned char *e = yajl_get_error(h, 0, NULL, 0);
    const char *why = e != NULL ? (const char *)e : "";
    const char *colon = strstr(why, "error: ");
    if (colon != NULL)
        why = colon + 7;
    size_t n = strlen(why);
    while (n > 0 && (why[n - 1] == '\n' || why[n - 1] == '.' || why[n - 1] == ' '))
        n--;
    int rc;
    if (n == 16 && memcmp(why, "trailing garbage", 16) == 0)
        rc = fail(s, PCR_ERR_PARSE, "request body has data after its JSON value (at byte %llu)",
                  (unsigned long long)at);
    else
        rc = fail(s, PCR_ERR_PARSE, "request body is not valid JSON (at byte %llu: %.*s)",
                  (unsigned long long)at, (int)n, why);
    if (e != NULL)
        yajl_free_error(h, e);
    return rc;
}

/* Feeds P bytes that start at body offset `at`. */
static int p_feed(pcr_body_scan_t *s, const char *buf, size_t n, uint64_t at)
{
    if (n == 0)
        return 0;
    yajl_status st = yajl_parse(s->p, (const unsigned char *)buf, n);
    if (st == yajl_status_ok)
        return 0;
    size_t used = yajl_get_bytes_consumed(s->p);
    if (st == yajl_status_client_canceled) {
        if (s->err->rc == 0)
            return fail(s, PCR_ERR_PARSE, "request body could not be read");
        if (s->err->add_at) {  /* where P stopped: the same byte however the body was cut */
            size_t k = strlen(s->err->msg);
            snprintf(s->err->msg + k, sizeof(s->err->msg) - k, " (at byte %llu)",
                     (unsigned long long)(at + (used < n ? used : n)));
            s->err->add_at = 0;
        }
        return s->err->rc;
    }
    return yajl_fail(s, s->p, at + (used < n ? used : n));
}

/* How many bytes at the end of a long string's contents `c` (n bytes) must wait for the next
 * chunk, so a piece for V never ends inside an escape or a UTF-8 character. A byte sequence
 * that is invalid anyway is not held back: V refuses it wherever it is cut. */
static size_t holdback(const pcr_body_scan_t *s, const char *c, size_t n)
{
    if (s->esc != ESC_NONE)
        return s->esc_have < n ? s->esc_have : n;
    /* Never a byte of an escape: in "\<0xC3>" the 0xC3 is the escape's (bad) character. */
    size_t floor = s->esc_end > s->v_off ? (size_t)(s->esc_end - s->v_off) : 0;
    size_t i = n, k = 0;
    while (k < 3 && i > 0 && ((unsigned char)c[i - 1] & 0xC0) == 0x80) {
        i--;
        k++;
    }
    if (i == 0)
        return 0;
    unsigned char lead = (unsigned char)c[i - 1];
    size_t need = (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3
                : (lead & 0xF8) == 0xF0 ? 4 : 1;
    size_t have = n - (i - 1);
    return need > 1 && have < need && i - 1 >= floor ? have : 0;
}

/* V, in the state of an array whose first string was read: every piece given to it is one
 * more string, comma first. */
static int v_open(pcr_body_scan_t *s)
{
    s->v = yajl_alloc(NULL, NULL, NULL);
    if (s->v == NULL)
        return PCR_ERR_NOMEM;
    if (yajl_parse(s->v, (const unsigned char *)"[\"\"", 3) != yajl_status_ok) {
        yajl_free(s->v);
        s->v = NULL;
        return PCR_ERR_NOMEM;
    }
    return 0;
}

/* Checks the held bytes, then `a` and `b` (the string's next contents, in order), as one
 * string token, less what must wait; `closed` when the string ends with them. */
static int v_feed(pcr_body_scan_t *s, const char *a, size_t an, const char *b, size_t bn,
                  int closed)
{
    /* The piece: the caller's bytes where they are (the common case: nothing held, one
     * part), else held bytes and both parts joined in the scratch. */
    char *c = s->scratch + 2;
    const char *piece = a;
    size_t n = s->plen + an + bn;
    if (s->plen > 0 || bn > 0) {
        memcpy(c, s->pend, s->plen);
        if (an > 0)
            memcpy(c + s->plen, a, an);
        if (bn > 0)
            memcpy(c + s->plen + an, b, bn);
        piece = c;
    }
    size_t h = closed ? 0 : holdback(s, piece, n), k = n - h;
    memcpy(s->pend, piece + k, h);
    s->plen = h;
    if (k == 0 && !closed)
        return 0;
    int suspect = s->suspect;
    if (h == 0)
        s->suspect = 0; /* every byte find_end has seen is in this piece */
    /* Escapes and control bytes were found valid by find_end as it looked for the end, unless
     * it saw something suspect: UTF-8 is all that is left to check, in place. */
    if (!suspect && pcr_body_check_utf8(piece, k)) {
        s->v_off += k;
        return 0;
    }
    if (piece != c)
        memcpy(c, piece, k); /* the full check reads a padded, quoted copy */
    s->scratch[0] = ',';
    s->scratch[1] = '"';
    c[k] = '"';
    if (!pcr_body_check_string(s->scratch + 1, k + 2)) {
        /* simdjson refused it: yajl says whether it is JSON, and where not. The comma
         * first: yajl copies the first token of each call into its lexer's buffer (the
         * previous call ended at EOF), and a comma is cheaper to copy than 16 KiB. */
        if (s->v == NULL && v_open(s) != 0)
            return fail(s, PCR_ERR_NOMEM, "out of memory while reading the request body");
        if (yajl_parse(s->v, (const unsigned char *)s->scratch, k + 3) != yajl_status_ok) {
            s->v_failed = 1;
            size_t used = yajl_get_bytes_consumed(s->v);
            /* V's offsets 0 and 1 are what we added. Not clamped to k: when V stops at our
             * closing quote, that quote stands where the held-back byte is, and yajl given
             * the whole body stops after that byte too. */
            used = used > 1 ? used - 2 : 0;
            return yajl_fail(s, s->v, s->v_off + used);
        }
    }
    s->v_off += k;
    return 0;
}

static int string_begin(pcr_body_scan_t *s, uint64_t at)
{
    s->in_string = 1;
    s->is_long = 0;
    s->clen = 0;
    s->slen = 0;
    s->esc = ESC_NONE;
    s->esc_have = 0;
    s->suspect = 0;
    s->quote_off = at;
    s->short_max = PCR_SCAN_SHORT_MAX;
    if (s->cbs->string_begin(s->ud, &s->short_max) != 0)
        return cb_failed(s);
    if (s->short_max > PCR_SCAN_SHORT_MAX)
        s->short_max = PCR_SCAN_SHORT_MAX;
    return 0;
}

static int token_too_long(pcr_body_scan_t *s, uint64_t at)
{
    return fail(s, PCR_ERR_PARSE, "request body is not valid JSON (at byte %llu: a number or "
                "word longer than %d bytes)", (unsigned long long)at, PCR_SCAN_TOKEN_MAX);
}

/* A held token goes on in this chunk: to its end (then to P, whole) or to the chunk's end. */
static int token_go_on(pcr_body_scan_t *s, const char *data, size_t len, size_t *pos)
{
    size_t i = *pos;
    while (i < len && data[i] != '"' && !delim[(unsigned char)data[i]])
        i++;
    size_t n = i - *pos;
    if (s->tlen + n > PCR_SCAN_TOKEN_MAX)
        return token_too_long(s, s->off + *pos + (PCR_SCAN_TOKEN_MAX - s->tlen));
    memcpy(s->tbuf + s->tlen, data + *pos, n);
    s->tlen += n;
    *pos = i;
    if (i == len)
        return 0;
    /* With the byte that ends it, as in a chunk read whole: yajl needs it to end a number. */
    size_t t = s->tlen;
    if (data[i] != '"') {
        s->tbuf[t++] = data[i];
        *pos = i + 1;
    }
    s->tlen = 0;
    return p_feed(s, s->tbuf, t, s->t_off);
}

/* Outside strings, from *pos to the next quote or the chunk's end: to P, but for a number or
 * literal the chunk's end cuts, which is held for the next chunk. */
static int scan_outside(pcr_body_scan_t *s, const char *data, size_t len, size_t *pos,
                        size_t *sstart)
{
    size_t from = *pos, i = from, run = 0;
    int rc;

    if (s->tlen > 0) {
        if ((rc = token_go_on(s, data, len, pos)) != 0 || *pos == len)
            return rc;
        from = i = *pos;
    }
    for (; i < len; i++) {
        unsigned char ch = (unsigned char)data[i];
        if (ch == '"')
            break;
        if (delim[ch])
            run = 0;
        else if (++run > PCR_SCAN_TOKEN_MAX) {
            /* P reads up to the token first: a mistake before it is the one to tell. */
            if ((rc = p_feed(s, data + from, i - PCR_SCAN_TOKEN_MAX - from, s->off + from)) != 0)
                return rc;
            return token_too_long(s, s->off + i);
        }
    }
    size_t held = i == len ? run : 0;
    if ((rc = p_feed(s, data + from, i - held - from, s->off + from)) != 0)
        return rc;
    if (held > 0) {
        memcpy(s->tbuf, data + i - held, held);
        s->tlen = held;
        s->t_off = s->off + i - held;
    }
    if (i < len) {
        *sstart = i;
        if ((rc = string_begin(s, s->off + i)) != 0)
            return rc;
        i++;
    }
    *pos = i;
    return 0;
}

/* The first '"', '\\' or control byte (below 0x20, never valid in a string) in [p, end), or
 * end: memchr for three kinds of byte. Prompts have an escape every line or so, and a memchr
 * call per kind per escape costs more than the scan. 16 bytes at a time with SSE2 (x86-64's
 * baseline), 32 with AVX2 where the CPU has it (chosen once, at start). */
static const char *find_special_tail(const char *p, const char *end)
{
    for (; p < end; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
            return p;
    return end;
}

static const char *find_special_base(const char *p, const char *end)
{
#if defined(__SSE2__)
    const __m128i q = _mm_set1_epi8('"'), b = _mm_set1_epi8('\\'), c = _mm_set1_epi8(0x1F);
    for (; end - p >= 16; p += 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)p);
        /* x <= 0x1F (unsigned) where max(x, 0x1F) == 0x1F */
        __m128i ctl = _mm_cmpeq_epi8(_mm_max_epu8(x, c), c);
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_or_si128(
            _mm_or_si128(_mm_cmpeq_epi8(x, q), _mm_cmpeq_epi8(x, b)), ctl));
        if (m != 0)
            return p + __builtin_ctz(m);
    }
#endif
    return find_special_tail(p, end);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_FIND_AVX2 1
__attribute__((target("avx2")))
static const char *find_special_avx2(const char *p, const char *end)
{
    const __m256i q = _mm256_set1_epi8('"'), b = _mm256_set1_epi8('\\');
    const __m256i c = _mm256_set1_epi8(0x1F);
    for (; end - p >= 32; p += 32) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)p);
        __m256i ctl = _mm256_cmpeq_epi8(_mm256_max_epu8(x, c), c);
        unsigned m = (unsigned)_mm256_movemask_epi8(_mm256_or_si256(
            _mm256_or_si256(_mm256_cmpeq_epi8(x, q), _mm256_cmpeq_epi8(x, b)), ctl));
        if (m != 0)
            return p + __builtin_ctz(m);
    }
    return find_special_base(p, end);
}
#endif

static const char *(*find_special)(const char *, const char *) = find_special_base;

__attribute__((constructor)) static void find_special_pick(void)
{
#if defined(HAVE_FIND_AVX2)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        find_special = find_special_avx2;
#endif
}

static int hex_value(unsigned char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch |= 0x20;
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* The end of the string's contents in data[from, wend): its closing quote, or wend. Follows
 * escapes so that \" does not end the string. */
static size_t find_end(pcr_body_scan_t *s, const char *data, size_t from, size_t wend,
                       int *closed)
{
    size_t p = from;

    *closed = 0;
    while (p < wend) {
        if (s->esc == ESC_CHAR) {
            unsigned char ch = (unsigned char)data[p++];
            s->esc_have++;
            if (ch == 'u') {
                s->esc = ESC_HEX;
                s->esc_left = 4;
                s->esc_value = 0;
            } else {
                if (strchr("\"\\/bfnrt", ch) == NULL || ch == 0)
                    s->suspect = 1;
                s->esc = ESC_NONE;
                s->esc_have = 0;
                s->esc_end = s->off + p;
            }
            continue;
        }
        if (s->esc == ESC_HEX) {
            while (p < wend && s->esc_left > 0) {
                int h = hex_value((unsigned char)data[p++]);
                if (h < 0)
                    s->suspect = 1;
                s->esc_value = (s->esc_value << 4) | (unsigned)(h & 0xF);
                s->esc_left--;
                s->esc_have++;
            }
            if (s->esc_left == 0) {
                /* A surrogate's validity depends on its pair: simdjson and yajl decide. */
                if (s->esc_value >= 0xD800 && s->esc_value <= 0xDFFF)
                    s->suspect = 1;
                s->esc = ESC_NONE;
                s->esc_have = 0;
                s->esc_end = s->off + p;
            }
            continue;
        }
        p = (size_t)(find_special(data + p, data + wend) - data);
        if (p == wend)
            break;
        if (data[p] == '"') {
            *closed = 1;
            return p;
        }
        if (data[p] != '\\') {  /* a control byte: invalid, the full check says where */
            s->suspect = 1;
            p++;
            continue;
        }
        s->esc = ESC_CHAR;
        s->esc_have = 1;
        p++;
    }
    return wend;
}

/* Inside a string, data[*pos, wend): its bytes to the reader, and to P or V. */
static int scan_inside(pcr_body_scan_t *s, const char *data, size_t wend, size_t *pos,
                       size_t sstart)
{
    size_t from = *pos;
    int closed, rc;
    size_t cend = find_end(s, data, from, wend, &closed), n = cend - from;

    if (n > 0 && s->cbs->string_bytes(s->ud, data + from, n) != 0)
        return cb_failed(s);
    if (!s->is_long && s->clen + n > s->short_max) {
        /* Too long for P: what came so far, and this, go to V. */
        s->is_long = 1;
        s->plen = 0;
        s->v_off = s->quote_off + 1;
        if (sstart != SIZE_MAX)
            rc = v_feed(s, data + sstart + 1, cend - sstart - 1, NULL, 0, closed);
        else
            rc = v_feed(s, s->sbuf + 1, s->slen - 1, data + from, n, closed);
    } else if (s->is_long) {
        rc = v_feed(s, data + from, n, NULL, 0, closed);
    } else {
        if (sstart == SIZE_MAX) {  /* began in an earlier chunk: keep it for P */
            memcpy(s->sbuf + s->slen, data + from, n);
            s->slen += n;
        }
        rc = 0;
    }
    s->clen += n;
    if (rc != 0)
        return rc;
    if (!closed) {
        *pos = wend;
        return 0;
    }
    s->in_string = 0;
    *pos = cend + 1;
    if (s->cbs->string_end(s->ud, s->is_long) != 0)
        return cb_failed(s);
    if (s->is_long)
        return p_feed(s, "\"\"", 2, s->quote_off);
    if (sstart != SIZE_MAX)
        return p_feed(s, data + sstart, cend + 1 - sstart, s->off + sstart);
    s->sbuf[s->slen++] = '"';
    return p_feed(s, s->sbuf, s->slen, s->quote_off);
}

int pcr_body_scan_feed(pcr_body_scan_t *s, const char *data, size_t len)
{
    size_t pos = 0, sstart = SIZE_MAX;  /* where the string began, when in this chunk */
    int rc = 0;

    if (s->err->rc != 0)
        return s->err->rc;
    if (data == NULL && len > 0)
        return fail(s, PCR_ERR_PARSE, "request body could not be read");
    while (pos < len && rc == 0) {
        if (!s->in_string) {
            rc = scan_outside(s, data, len, &pos, &sstart);
        } else {
            size_t wend = len - pos > PCR_SCAN_WINDOW ? pos + PCR_SCAN_WINDOW : len;
            rc = scan_inside(s, data, wend, &pos, sstart);
        }
    }
    if (rc == 0 && s->in_string && !s->is_long && sstart != SIZE_MAX) {
        /* A short string goes on in the next chunk: keep what P is to read of it. */
        s->slen = len - sstart;
        memcpy(s->sbuf, data + sstart, s->slen);
    }
    s->off += len;
    return rc;
}

int pcr_body_scan_finish(pcr_body_scan_t *s)
{
    if (s->err->rc != 0)
        return s->err->rc;
    if (s->in_string)
        return fail(s, PCR_ERR_PARSE, "request body is not valid JSON (at byte %llu: it ends "
                    "inside a string)", (unsigned long long)s->off);
    if (s->tlen > 0) {
        size_t t = s->tlen;
        s->tlen = 0;
        if (p_feed(s, s->tbuf, t, s->t_off) != 0)
            return s->err->rc;
    }
    if (yajl_complete_parse(s->p) != yajl_status_ok)
        return s->err->rc != 0 ? s->err->rc : yajl_fail(s, s->p, s->off);
    return 0;
}

pcr_body_scan_t *pcr_body_scan_new(const yajl_callbacks *p_cbs, const pcr_scan_cbs_t *cbs,
                                   void *ud, pcr_scan_err_t *err)
{
    /* One block, the scratch after the scanner: 24 KiB of router/core/evmem.c's classes, where
     * two blocks took 30 (zeroed: simdjson reads the scratch's padding). */
    size_t at = (sizeof(pcr_body_scan_t) + 63) / 64 * 64;
    pcr_body_scan_t *s = pcr_evmem_calloc_in(1, at + SCRATCH_BYTES, PCR_MEMCOUNT_READERS);
    if (s == NULL)
        return NULL;
    s->p_cbs = p_cbs;
    s->cbs = cbs;
    s->ud = ud;
    s->err = err;
    s->p_alloc = (yajl_alloc_funcs){arena_malloc, arena_realloc, arena_free, &s->arena};
    s->scratch = (char *)s + at;
    s->p = yajl_alloc(p_cbs, &s->p_alloc, ud);
    if (s->p == NULL) {
        pcr_body_scan_free(s);
        return NULL;
    }
    return s;
}

int pcr_body_scan_reset(pcr_body_scan_t *s)
{
    /* yajl 2.1 has no reset: P is made anew. V is kept while it has refused nothing: it is
     * then exactly where a new one starts (a complete string inside the array), since every
     * piece it reads is one whole string. */
    yajl_handle v = s->v_failed ? NULL : s->v;
    if (s->v_failed && s->v != NULL)
        yajl_free(s->v);
    if (s->p != NULL)
        yajl_free(s->p); /* its blocks from the arena are dropped with it, below */
    const yajl_callbacks *p_cbs = s->p_cbs;
    const pcr_scan_cbs_t *cbs = s->cbs;
    void *ud = s->ud;
    pcr_scan_err_t *err = s->err;
    char *scratch = s->scratch;
    /* Cleared up to the arena: its bytes need not be, only its fill. */
    memset(s, 0, offsetof(pcr_body_scan_t, arena));
    s->arena.used = 0;
    s->p_cbs = p_cbs;
    s->cbs = cbs;
    s->ud = ud;
    s->err = err;
    s->scratch = scratch;
    s->v = v;
    s->p_alloc = (yajl_alloc_funcs){arena_malloc, arena_realloc, arena_free, &s->arena};
    s->p = yajl_alloc(s->p_cbs, &s->p_alloc, s->ud);
    return s->p != NULL ? 0 : PCR_ERR_NOMEM;
}

void pcr_body_scan_free(pcr_body_scan_t *s)
{
    if (s == NULL)
        return;
    if (s->p != NULL)
        yajl_free(s->p);
    if (s->v != NULL)
        yajl_free(s->v);
    pcr_evmem_free(s);
}
