/* router/core/http1.h: what both HTTP/1.1 sides of the proxy (h1_server.c for clients, upstream.c
 * for pods) check the same way, as strictly as RFC 9110 and 9112 say: field names, field
 * values, Transfer-Encoding, hop-by-hop fields, and line folding. http-parser does the parsing;
 * these are the checks it leaves to its caller. */
#ifndef PCR_ROUTER_HTTP1_H
#define PCR_ROUTER_HTTP1_H

#include <stddef.h>
#include <stdint.h>

/* An RFC 9110 field name: one or more tchar (so no whitespace before the colon). */
int pcr_http_token_valid(const char *s, size_t len);
/* A field value as received: no CR, LF or NUL. */
int pcr_http_value_valid(const char *v, size_t len);
/* A Transfer-Encoding value pcrouter accepts: exactly "chunked" (any case, optional whitespace
 * around it). Anything else (a list, another coding) is refused: it is how requests are
 * smuggled past a proxy and a pod that read it differently. */
int pcr_http_te_is_chunked(const char *v, size_t len);
/* Whether a field is hop-by-hop, never forwarded: the fixed list (Connection, Keep-Alive,
 * Transfer-Encoding, TE, Trailer, Upgrade, Proxy-Connection, Host, Content-Length, Expect,
 * HTTP2-Settings, and HTTP/2 pseudo-headers), or a name listed in the message's Connection
 * fields (`connection_values`: their values joined by commas, NULL when none). Names are
 * compared case-insensitively, exactly as parsed. */
int pcr_http_hop_by_hop(const char *name, size_t len, const char *connection_values);
/* Whether a list field's value (a Connection field's: tokens between commas and whitespace,
 * `list_len` bytes, no terminator needed) names `name`, case-insensitively. */
int pcr_http_list_has(const char *list, size_t list_len, const char *name, size_t len);

/* Numbers in heads (Content-Length, a status, a chunk size) without printf, which costs more
 * than the rest of a head: the digits of `v` at `out` (no NUL; room for 20 decimal or 16 hex
 * digits), and how many. */
size_t pcr_http_put_dec(char *out, uint64_t v);
size_t pcr_http_put_hex(char *out, uint64_t v);

/* Line folding (obs-fold) shows up from http-parser in two ways: as a second piece of the same
 * field value, or, when the fold comes before any of the value ("Name:\r\n value"), as a
 * value whose first byte follows a line feed and whitespace (http-parser skips them as leading
 * whitespace). A second piece is legitimate only when the previous read ended inside the value
 * and the next one starts with its rest; the tracker tells the two apart, and remembers the
 * last byte of the previous read for a value that starts a read. */
typedef struct {
    const char *buf_start, *buf_end;   /* the bytes of the current http_parser_execute() */
    const char *val_end;               /* where the last value piece ended */
    int in_value;                      /* a value is open (no field name since) */
    int prev_at_end;                   /* the previous read ended exactly where a value piece did */
    char prev_last;                    /* last byte other than SP/HT of the earlier reads */
} pcr_fold_t;

/* Forgets the value state at a message's start; the bounds of the read in progress are kept
 * (a message may begin in the middle of one read, and its values go on into the next). */
void pcr_fold_reset(pcr_fold_t *f);
/* Before each http_parser_execute(buf, len). */
void pcr_fold_begin(pcr_fold_t *f, const char *buf, size_t len);
/* After it. */
void pcr_fold_end(pcr_fold_t *f);
/* From on_header_field. */
void pcr_fold_field(pcr_fold_t *f);
/* From on_header_value: 0, or -1 when this piece continues a folded line. */
int pcr_fold_value(pcr_fold_t *f, const char *at, size_t len);

#endif
