/* router/body.h: reads an OpenAI-style request body and builds its canonical prompt bytes.
 *
 * cJSON (not jansson) parses request bodies: prompts run to hundreds of KiB and cJSON is
 * about 15x faster there. The canonical bytes are what the prefix key is hashed from (see
 * docs/ARCHITECTURE.md, "The routing model"). */
#ifndef PCR_ROUTER_BODY_H
#define PCR_ROUTER_BODY_H

#include <stddef.h>

typedef enum {
    PCR_API_COMPLETIONS = 0,   /* POST /v1/completions: "prompt" */
    PCR_API_CHAT,              /* POST /v1/chat/completions: "messages" (and "tools") */
} pcr_api_t;

typedef struct {
    char *model;               /* heap copy of "model", "" when absent */
    size_t model_len;
    char *key;                 /* heap: canonical prompt bytes (see body.c for the format) */
    size_t key_len;
    int stream;                /* "stream": true */
    int stream_options;        /* "stream_options" is present (pcrouter then adds none) */
} pcr_body_t;

/* Parses `len` bytes of `buf` (need not be NUL-terminated). Returns 0 and fills `out`, or:
 *   PCR_ERR_PARSE  the body is not JSON, or not a JSON object;
 *   PCR_ERR_INVAL  it lacks "prompt" (completions) / "messages" (chat), or one has a wrong type;
 *   PCR_ERR_NOMEM
 * On error `out` holds nothing to free and `err` (errlen bytes) gets a message a user can read,
 * such as "request body is not valid JSON (at byte 17)" or "'messages' must be an array". */
int pcr_body_parse(pcr_api_t api, const char *buf, size_t len, pcr_body_t *out, char *err,
                   size_t errlen);

void pcr_body_dispose(pcr_body_t *b);  /* frees what pcr_body_parse filled; safe twice */

#endif
