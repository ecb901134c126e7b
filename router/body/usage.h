/* router/body/usage.h: reads a completion's `usage` (prompt tokens, and the cached ones vLLM
 * reports in usage.prompt_tokens_details.cached_tokens) from the response bytes as pcrouter
 * forwards them, without holding the stream back and without changing what the client receives.
 *
 *   JSON answer   a bounded copy (PCR_USAGE_MAX_JSON) is kept while the bytes go out, in
 *                 blocks of the thread's kept sizes (never one buffer grown by reallocation:
 *                 an answer of a few hundred KiB would be copied again at every doubling,
 *                 into pages faulted in afresh). Its bytes are scanned as they come for a
 *                 name of cached_tokens; only an answer that may name it is joined into one
 *                 buffer and parsed with cJSON once the body ended. A larger body is not read.
 *   SSE stream    the bytes go out as they come; the current event is copied (up to
 *                 PCR_USAGE_MAX_EVENT) and, at its blank line, its `data:` is parsed with cJSON
 *                 only when it names "usage". The last such event wins.
 *   SSE, strip    pcrouter itself asked the pod for usage (upstream.request_usage): each event
 *                 is passed on whole at its blank line, and the usage-only event (`"choices":
 *                 []`, which vLLM sends last when asked) is dropped. Holding an event until its
 *                 blank line delays nothing a client can see: SSE clients act on whole events.
 *                 An event longer than PCR_USAGE_MAX_EVENT is no usage event: it is passed on
 *                 as it comes.
 *   rewrite       (pcr_usage_rewrite) the answer's cached tokens are replaced by a value of
 *                 pcrouter's: a disaggregated request's decode pod reports the prompt it
 *                 pulled, and the client is told what the prefill pod reused. A JSON answer
 *                 is held (up to PCR_USAGE_MAX_JSON; past it, passed on as it came) and sent
 *                 rewritten at its end; an SSE stream's events are held to their blank line,
 *                 as with strip, and an event naming usage goes out rewritten.
 *
 * The reader owns its buffers; the bytes for the client go out through `emit`. */
#ifndef PCR_ROUTER_USAGE_H
#define PCR_ROUTER_USAGE_H

#include <stddef.h>
#include <stdint.h>

#define PCR_USAGE_MAX_JSON (1024 * 1024)
#define PCR_USAGE_MAX_EVENT (64 * 1024)

typedef enum {
    PCR_USAGE_OFF = 0,  /* not a completion answer pcrouter reads: bytes pass untouched */
    PCR_USAGE_JSON,
    PCR_USAGE_SSE,
} pcr_usage_mode_t;

struct pcr_usage_block;

typedef void (*pcr_usage_emit_fn)(void *ctx, const char *data, size_t len);

typedef struct {
    pcr_usage_mode_t mode;
    int strip;              /* SSE: drop the usage-only event */
    int rewrite;            /* replace cached_tokens with set_cached (pcr_usage_rewrite) */
    uint64_t set_cached;
    char *buf;              /* SSE: the current event */
    size_t len, cap;
    struct pcr_usage_block *head, *tail; /* JSON: the body so far, block by block */
    size_t json_len;
    int may_name;           /* JSON: the body may name cached_tokens: parse it at the end */
    char edge[12];          /* JSON: the last bytes scanned, for a name cut between reads */
    size_t edge_len;
    int over;               /* JSON: past the bound, given up; SSE: this event is too long */
    size_t line_len;        /* SSE: bytes of the current line */
    int prev_cr;            /* SSE: line endings may be CR, LF or CRLF */
    int end_pending;        /* SSE: a blank line ended in CR; an LF may still follow */
    /* What was found. */
    int found;              /* a usage object with prompt_tokens_details.cached_tokens */
    uint64_t prompt_tokens, cached_tokens;
    uint64_t completion_tokens; /* usage.completion_tokens, 0 when absent */
} pcr_usage_t;

/* The mode for a response: its status and the values of its Content-Type and
 * Content-Encoding headers (NULL when absent). Only a 2xx answer in JSON or SSE, not
 * compressed, is read. */
pcr_usage_mode_t pcr_usage_mode(int status, const char *content_type, size_t ct_len,
                                const char *content_encoding, size_t ce_len);

void pcr_usage_init(pcr_usage_t *u, pcr_usage_mode_t mode, int strip);
void pcr_usage_dispose(pcr_usage_t *u);  /* frees the buffers; safe twice */
/* After init, before the first byte: usage.prompt_tokens_details.cached_tokens in what the
 * client receives becomes `cached` (where the answer carries such a usage object). What is
 * found (u->cached_tokens) stays the pod's own count. */
void pcr_usage_rewrite(pcr_usage_t *u, uint64_t cached);

/* Response body bytes, in order; what the client is to receive goes to emit(ctx, ...). */
void pcr_usage_feed(pcr_usage_t *u, const char *data, size_t len, pcr_usage_emit_fn emit,
                    void *ctx);
/* The body ended: emits what is still held, reads the JSON answer. Returns u->found. */
int pcr_usage_finish(pcr_usage_t *u, pcr_usage_emit_fn emit, void *ctx);

/* Where to insert `"stream_options":{"include_usage":true}` in a request body already known
 * to be one JSON object with nothing but whitespace after it: the offset of its closing brace,
 * and whether the object is empty (no comma needed). -1 when the body does not end with '}'. */
long pcr_usage_insert_at(const char *body, size_t len, int *empty);

#endif
