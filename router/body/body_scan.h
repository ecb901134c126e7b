/* router/body/body_scan.h: feeds a request body, chunk by chunk, to yajl without yajl ever holding
 * a long string across chunks (the reader in body.c is its only user).
 *
 * yajl 2.1 hands a string to its callback only whole: a string that spans two yajl_parse()
 * calls is copied into its lexer's buffer and re-scanned from its first byte on every later
 * call, so a 512 KiB prompt read in 16 KiB chunks is scanned 16 times over in all, and in full
 * again after its last byte (258 us on this machine, against 12 us for json-c's tokener,
 * which cannot say where a string's bytes are before it ends). So the scanner follows where
 * each string starts and ends (an unescaped quote; the length of an escape: two bytes, or six
 * for \uXXXX) and does nothing else with JSON: yajl validates every byte.
 *
 *   - Outside strings, bytes go to the structure parser P (a yajl handle whose callbacks are
 *     the reader's) as they come.
 *   - A string at most `short_max` bytes long (the reader chooses, per string) goes to P
 *     whole, from the chunk, or from a small buffer when it spans chunks; the reader gets its
 *     decoded value from P's callback (keys, "model", "role", "type").
 *   - A longer string reaches P as "" and its contents go, in pieces cut at character and
 *     escape boundaries, each piece a whole string token, to simdjson (body_check.h), and to
 *     the validator V (a second yajl handle, reading one endless array of strings) when
 *     simdjson refuses one: every byte is checked once, and yajl has the last word.
 *   - Every string's raw bytes (as sent, escapes undecoded) go to the reader as they arrive,
 *     which is how a prompt is hashed before its end is read.
 *
 * Numbers and literals too reach P whole: one cut by a chunk's end is held (at most 256
 * bytes; a longer one is refused) and given to P with the next chunk, so that yajl never
 * holds a token across calls. That also keeps its error offsets exact: for a token that
 * spanned calls, yajl names the second call's first byte. Memory is bounded: the buffers
 * below, whatever the body. */
#ifndef PCR_ROUTER_BODY_SCAN_H
#define PCR_ROUTER_BODY_SCAN_H

#include <stddef.h>
#include <stdint.h>

#include <yajl/yajl_parse.h>

#define PCR_SCAN_SHORT_MAX 512      /* the largest short_max a reader may ask for */
#define PCR_SCAN_TOKEN_MAX 256      /* the longest number or literal */
#define PCR_SCAN_WINDOW 16384       /* bytes scanned per step, so a piece for V stays bounded */

/* The first fatal error, shared by the scanner and the reader: rc (PCR_ERR_PARSE or
 * PCR_ERR_NOMEM; 0 while none) and a message for the client. */
typedef struct {
    int rc;
    char msg[256];
    int add_at;                /* set with rc from a callback: the scanner appends the byte */
} pcr_scan_err_t;

/* What the reader is told of strings. Each returns 0, or nonzero after setting err->rc. */
typedef struct {
    /* An opening quote, after P has read everything before it. Sets *short_max (at most
     * PCR_SCAN_SHORT_MAX): up to that many bytes, the string goes to P whole. */
    int (*string_begin)(void *ud, size_t *short_max);
    /* The next raw bytes of the string's contents (between its quotes, escapes as sent). */
    int (*string_bytes)(void *ud, const char *p, size_t n);
    /* Its closing quote, before P reads the string: `was_long` when P will read "". */
    int (*string_end)(void *ud, int was_long);
} pcr_scan_cbs_t;

typedef struct pcr_body_scan pcr_body_scan_t;

/* `p_cbs` and `ud` are P's yajl callbacks and their context. NULL when out of memory. */
pcr_body_scan_t *pcr_body_scan_new(const yajl_callbacks *p_cbs, const pcr_scan_cbs_t *cbs,
                                   void *ud, pcr_scan_err_t *err);
void pcr_body_scan_free(pcr_body_scan_t *s);  /* NULL is a no-op */
/* Ready for the next body, with the same callbacks, as if new; its buffers are kept. After
 * PCR_ERR_NOMEM the scanner can only be freed. */
int pcr_body_scan_reset(pcr_body_scan_t *s);

/* The next chunk. Returns 0 or err->rc; after an error every call returns it again. */
int pcr_body_scan_feed(pcr_body_scan_t *s, const char *data, size_t len);

/* The last byte was fed: 0 when the body is one complete JSON value, else err->rc. */
int pcr_body_scan_finish(pcr_body_scan_t *s);

#endif
