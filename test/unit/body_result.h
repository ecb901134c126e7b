/* body_result.h: what one read of a request body gave (router/body/body.h), and whether two reads
 * gave the same, for the tests that read one body in several ways and compare: the unit test
 * of the scanner (test/unit/router/body/test_body_scan.c) and the body fuzz target
 * (test/fuzz/fuzz_body.c). One comparison, so that a field added to pcr_body_t is checked by
 * both or by neither. */
#ifndef PCR_TEST_BODY_RESULT_H
#define PCR_TEST_BODY_RESULT_H

#include <stdint.h>
#include <string.h>

#include "body.h"

typedef struct {
    int rc;
    char msg[256];
    pcr_body_t b;
} result_t;

/* The same outcome: the same code and message, and when accepted the same fields. */
static inline int body_result_same(const result_t *a, const result_t *b)
{
    if (a->rc != b->rc || strcmp(a->msg, b->msg) != 0)
        return 0;
    if (a->rc != 0)
        return 1;
    const pcr_body_t *x = &a->b, *y = &b->b;
    return x->model_len == y->model_len && memcmp(x->model, y->model, x->model_len) == 0 &&
           x->stream == y->stream && x->include_usage == y->include_usage &&
           x->prompt_tokens == y->prompt_tokens && x->nblocks == y->nblocks &&
           memcmp(x->blocks, y->blocks, x->nblocks * sizeof(uint64_t)) == 0 &&
           x->key_len == y->key_len && memcmp(x->key, y->key, x->key_len) == 0 &&
           x->context_len == y->context_len && memcmp(x->context, y->context, x->context_len) == 0;
}

#endif
