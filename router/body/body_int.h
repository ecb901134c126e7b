/* router/body/body_int.h: the reader's state, shared by body.c (the canonical bytes, their output
 * and the API) and body_fields.c (which field of the body is which). Nothing else includes
 * this. */
#ifndef PCR_ROUTER_BODY_INT_H
#define PCR_ROUTER_BODY_INT_H

#include <stddef.h>
#include <stdint.h>

#include <yajl/yajl_parse.h>

#include "body.h"
#include "body_scan.h"
#include "spare.h"
#include "pcr/prefix.h"

#define MAX_DEPTH 256
#define SMALL 64                        /* strings we need only raw: P reads them up to this */
#define NAME_MAX_BYTES PCR_SCAN_SHORT_MAX /* model, role, part type, keys we interpret */

enum { TAG_ROLE = 0x01, TAG_TEXT = 0x02, TAG_MEMBER = 0x03, TAG_CALLS = 0x05, TAG_JSON = 0x06 };

/* What a level of the document is to us. */
enum { K_ROOT, K_MESSAGES, K_MESSAGE, K_PARTS, K_PART, K_STREAM_OPTS, K_EMIT, K_SKIP };

enum { KEY_NONE, KEY_OTHER, KEY_MODEL, KEY_PROMPT, KEY_MESSAGES, KEY_TOOLS, KEY_STREAM,
       KEY_STREAM_OPTIONS, KEY_INCLUDE_USAGE, KEY_ROLE, KEY_CONTENT, KEY_TOOL_CALLS, KEY_TEXT,
       KEY_TYPE, KEY_MAX_TOKENS, KEY_MAX_COMPLETION_TOKENS, KEY_USER, KEY_PRIORITY, KEY__COUNT };

/* Level flags past the key bits. */
#define SEEN_ROLE_OK (1u << 24)   /* message: a role string was read */
#define SEEN_TEXT_OK (1u << 25)   /* part: a text string was read */
#define SEEN_IS_TEXT (1u << 26)   /* part: "type" is "text" */

enum { VT_MAP, VT_ARRAY, VT_STRING, VT_NUMBER, VT_BOOL, VT_NULL };

/* Where a string's raw bytes go. */
enum { M_NONE, M_TEXT, M_EMIT, M_KEY, M_ROLE, M_TYPE };

enum { SINK_CANON, SINK_CONTEXT };

typedef struct {
    unsigned char kind, is_map, expect_value, key, sink;
    uint32_t seen;             /* keys read (1 << KEY_x), and the SEEN_ flags */
    size_t n;                  /* values read so far */
} level_t;

typedef struct {
    char b[NAME_MAX_BYTES];
    size_t n;
    int over;                  /* more than NAME_MAX_BYTES came */
} name_t;

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

struct pcr_body_reader {
    pcr_api_t api;
    pcr_body_opts_t o;
    pcr_body_scan_t *scan;
    pcr_scan_err_t err;        /* fatal: the body cannot be read on */
    int inval;                 /* the first field error, told at finish */
    char inval_msg[256];
    int finished;
    pcr_prefix_stream_t *key;
    pcr_spare_link_t spare;    /* on its thread's list of spare readers (body.c) */

    size_t depth;
    uint32_t root_seen;
    int root_done;

    int mode, sink;            /* the string being read */
    size_t want_short;         /* what string_begin tells the scanner */
    int str_long;              /* the string P reads next was too long for it ("") */
    int text_open;             /* a 0x02 run is open */
    size_t msg_i, part_i;      /* for messages: which message, which part */
    name_t keyname, role, type;

    char model[NAME_MAX_BYTES + 1];
    size_t model_len;
    int stream, include_usage;
    int stream_options;        /* the key is present, whatever its value */
    uint64_t max_tokens;       /* "max_tokens" or "max_completion_tokens", 0 when absent */
    uint64_t user_hash;        /* XXH3 of "user" (a session key), when has_user */
    int has_user;
    int has_priority;          /* "priority" is present, whatever its value */
    buf_t canon, context;      /* kept with o.keep_canonical only */
    char cpend[256];           /* context bytes not yet hashed: the tools come a few bytes */
    size_t cplen;              /* at a time, and each XXH3 update has a fixed cost */

    /* Last: a recycled reader is cleared up to here; a level is set whole when pushed. */
    level_t st[MAX_DEPTH];
};

/* body.c: errors. fatal stops yajl (returns 0, for callbacks to return); inval keeps the first
 * field error for finish while yajl reads on (returns 1), so that a body that is not JSON at
 * all is told so whatever its fields. */
int pcr_body_fatal(pcr_body_reader_t *r, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int pcr_body_inval(pcr_body_reader_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int pcr_body_nomem(pcr_body_reader_t *r);

/* body.c: output to the canonical bytes (SINK_CANON) or the context (SINK_CONTEXT). Each
 * returns 1, or 0 after a fatal error. */
int pcr_body_emit(pcr_body_reader_t *r, int sink, const void *p, size_t n);
int pcr_body_emit_c(pcr_body_reader_t *r, int sink, char c);
int pcr_body_emit_tag(pcr_body_reader_t *r, char tag);   /* a record's tag; ends a text run */
int pcr_body_text_begin(pcr_body_reader_t *r);            /* 0x02, unless a text run is open */

/* body_fields.c: P's callbacks and the scanner's string events. */
extern const yajl_callbacks pcr_body_p_callbacks;
extern const pcr_scan_cbs_t pcr_body_scan_callbacks;

#endif
