/* router/body/body.h: reads an OpenAI-style request body as it arrives and gives what routing
 * needs: the model, `stream`, `stream_options.include_usage`, the prompt's size and its
 * prefix key (pcr/prefix.h), hashed from canonical prompt bytes (see body.c for the format).
 *
 * The reader is fed each chunk of the body as it is read (an HTTP/1.1 read, an HTTP/2 DATA
 * frame) and parses and hashes it then, with yajl (body_scan.h says how), so the work left
 * after the last byte does not grow with the prompt. It keeps neither the body nor the prompt:
 * its memory is bounded, whatever the body: about 40 KiB, and 8 bytes a prefix block (32 KiB
 * at most at the default 1 MiB horizon).
 * The router keeps the raw body apart, for forwarding. */
#ifndef PCR_ROUTER_BODY_H
#define PCR_ROUTER_BODY_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/policy.h"

typedef enum {
    PCR_API_COMPLETIONS = 0,   /* POST /v1/completions: "prompt" */
    PCR_API_CHAT,              /* POST /v1/chat/completions: "messages" (and "tools") */
} pcr_api_t;

typedef struct {
    size_t block_bytes;        /* the policy's (pcr_policy_opts_t), default 256 */
    size_t max_prefix_bytes;   /* default 1048576 */
    int keep_canonical;        /* also keep the canonical bytes in the result (tests, tools);
                                * they are as long as the prompt: not for the request path */
} pcr_body_opts_t;

void pcr_body_opts_default(pcr_body_opts_t *o);

typedef struct {
    char *model;               /* heap copy of "model", "" when absent */
    size_t model_len;
    int stream;                /* "stream": true */
    int include_usage;         /* "stream_options": {"include_usage": true} */
    size_t prompt_tokens;      /* canonical bytes (tools included) / 4, rounded up: all of it */
    uint64_t *blocks;          /* heap: the prefix key, model and tools mixed in */
    size_t nblocks;
    char *key;                 /* heap, only with keep_canonical: the canonical prompt bytes */
    size_t key_len;
    char *context;             /* heap, only with keep_canonical: a chat request's tools, as */
    size_t context_len;        /* hashed (compact JSON, strings as sent); "" without tools */
    int stream_options;        /* "stream_options" is present (pcrouter then adds none) */
    uint64_t max_tokens;       /* "max_tokens" (or "max_completion_tokens"), 0 when absent or
                                  not a whole number */
    uint64_t user_hash;        /* XXH3-64 of "user" when has_user (a session key) */
    int has_user;              /* "user" is a non-empty string of at most 512 bytes */
    int has_priority;          /* "priority" is present (the pods' scheduling priority) */
} pcr_body_t;

/* The key to route on, a view into `b` (valid while b is). */
static inline pcr_key_t pcr_body_key(const pcr_body_t *b)
{
    pcr_key_t k = {.blocks = b->blocks, .nblocks = b->nblocks, .prompt_tokens = b->prompt_tokens};
    return k;
}

typedef struct pcr_body_reader pcr_body_reader_t;

/* A reader for one request body; `opts` NULL means the defaults. NULL when out of memory or
 * when opts are invalid (block_bytes or max_prefix_bytes 0). */
pcr_body_reader_t *pcr_body_reader_new(pcr_api_t api, const pcr_body_opts_t *opts);
/* NULL is a no-op. The reader's memory is kept for the next pcr_body_reader_new() on the same
 * thread (a few are kept per thread); a thread that made readers calls
 * pcr_body_reader_cache_clear() before it ends, which frees the ones kept. */
void pcr_body_reader_free(pcr_body_reader_t *r);
void pcr_body_reader_cache_clear(void);

/* The next `len` bytes of the body, any split. Returns 0, or an error as below once the body
 * is known to be bad (JSON that cannot parse, nesting too deep); every later call returns it
 * again. A body that parses but lacks a field is told at finish, so a JSON error still wins. */
int pcr_body_reader_feed(pcr_body_reader_t *r, const void *data, size_t len);

/* The last byte was fed. Returns 0 and fills `out` (free it with pcr_body_dispose), or:
 *   PCR_ERR_PARSE  the body is not JSON, or not a JSON object, or nests deeper than 256;
 *   PCR_ERR_INVAL  it lacks "prompt" (completions) / "messages" (chat), or a field has a
 *                  wrong type, or a name we must read is longer than 512 bytes;
 *   PCR_ERR_NOMEM
 * On error `out` holds nothing to free and pcr_body_reader_error() tells why, in words a user
 * can read: "request body is not valid JSON (at byte 17: invalid char in json text)",
 * "'messages' must be an array". */
int pcr_body_reader_finish(pcr_body_reader_t *r, pcr_body_t *out);

/* The message of the error feed or finish returned; "" when none. */
const char *pcr_body_reader_error(const pcr_body_reader_t *r);

/* One-shot: the whole body at once, with the default opts and keep_canonical set. Same
 * results and errors as a reader; `err` (errlen bytes) gets the message. */
int pcr_body_parse(pcr_api_t api, const char *buf, size_t len, pcr_body_t *out, char *err,
                   size_t errlen);

/* The same with explicit opts. */
int pcr_body_parse_opts(pcr_api_t api, const pcr_body_opts_t *opts, const char *buf, size_t len,
                        pcr_body_t *out, char *err, size_t errlen);

void pcr_body_dispose(pcr_body_t *b);  /* frees what a parse filled; safe twice */

#endif
