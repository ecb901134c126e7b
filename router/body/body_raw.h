/* router/body/body_raw.h: the raw JSON text of named top-level fields of a request body that
 * was read and checked already (body.h), with simdjson's On-Demand parser
 * (router/body/body_raw.cpp).
 *
 * Why: precise mode asks a pod for a prompt's tokens with a question made of the request's
 * own fields (router/http/tokenize.c). A tree of the body (jansson) and its dump cost 0.6 ms
 * for a 26 KB prompt and 10 ms for 400 KB, on the request's path and on the worker's loop;
 * simdjson finds the fields at several GB/s and they are copied as they were sent. */
#ifndef PCR_ROUTER_BODY_RAW_H
#define PCR_ROUTER_BODY_RAW_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PCR_RAW_NONE = 0, PCR_RAW_STRING, PCR_RAW_ARRAY, PCR_RAW_BOOL, PCR_RAW_OTHER } pcr_raw_type_t;

typedef struct {
    const char *at;       /* into the body; NULL: the field is absent */
    size_t len;           /* its JSON text, as sent (maybe with spaces after it) */
    pcr_raw_type_t type;
} pcr_body_raw_t;

/* For each of `names`, the value of the body's last top-level field of that name (as the
 * pods' JSON parsers take a repeated key), in out[i]. json[0, len) must be a JSON object.
 * Returns 0, or -1 when it is not one, when a named field's value is an object (none of the
 * fields copied is one), or out of memory. */
int pcr_body_raw_fields(const char *json, size_t len, const char *const *names, size_t n,
                        pcr_body_raw_t *out);

#ifdef __cplusplus
}
#endif

#endif
