/* fuzz_body.c: libFuzzer target for the request body reader (router/body/body.c, body_scan.c):
 * body -> key.
 *
 * Input: byte 0 picks the API (bit 0) and the prefix block size (bits 1-2); byte 1 seeds the
 * chunking; the rest is the body. The body is read once whole and once in chunks of random
 * sizes (1 byte to 20 KiB, small ones often), and the two results must be equal: the same
 * error with the same message (byte offset included), or the same model, flags, prompt size,
 * key and canonical bytes. Whatever the reader says, yajl reading the whole body at once
 * must agree on whether it is JSON: a body yajl refuses must be refused as JSON, and a body
 * yajl accepts may be refused as JSON only for one of the reader's limits. Of a body the
 * reader accepts, the top-level fields precise mode copies into its question
 * (router/body/body_raw.h) are found, each inside the body and JSON on its own.
 *
 * Build (clang, clang++ for the one C++ file): -fsanitize=fuzzer,address,undefined with
 * router/body/body.c, body_fields.c, body_scan.c, body_check.cpp, body_raw.cpp and the files of hashring/,
 * linked with -lyajl -lsimdjson -lxxhash -lm. The seed corpus is test/fuzz/corpus/body/. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "body.h"
#include "body_raw.h"
#include "body_result.h"
#include "pcr/common.h"


static void read_whole(pcr_api_t api, const pcr_body_opts_t *o, const char *body, size_t len,
                       result_t *res)
{
    memset(res, 0, sizeof(*res));
    res->rc = pcr_body_parse_opts(api, o, body, len, &res->b, res->msg, sizeof(res->msg));
}

static void read_chunked(pcr_api_t api, const pcr_body_opts_t *o, const char *body, size_t len,
                         uint32_t seed, result_t *res)
{
    memset(res, 0, sizeof(*res));
    pcr_body_reader_t *r = pcr_body_reader_new(api, o);
    if (r == NULL)
        abort();
    uint32_t x = seed * 2654435761u + 1;
    size_t off = 0;
    while (off < len && res->rc == 0) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        size_t step = 1 + (x % 4 == 0 ? x % 20480 : x % 9);
        if (step > len - off)
            step = len - off;
        res->rc = pcr_body_reader_feed(r, body + off, step);
        off += step;
    }
    if (res->rc == 0)
        res->rc = pcr_body_reader_finish(r, &res->b);
    snprintf(res->msg, sizeof(res->msg), "%s", pcr_body_reader_error(r));
    pcr_body_reader_free(r);
}

static int yajl_accepts(const char *body, size_t len)
{
    yajl_handle h = yajl_alloc(NULL, NULL, NULL);
    int ok = yajl_parse(h, (const unsigned char *)body, len) == yajl_status_ok &&
             yajl_complete_parse(h) == yajl_status_ok;
    yajl_free(h);
    return ok;
}

/* The reader's own limits, on top of JSON's grammar. */
static int is_limit(const char *msg)
{
    return strstr(msg, "nests deeper than") != NULL || strstr(msg, "a number or word longer than") != NULL ||
           strstr(msg, "must be a JSON object") != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    static const size_t blocks[] = {256, 16, 1, 64};
    pcr_api_t api = data[0] & 1 ? PCR_API_CHAT : PCR_API_COMPLETIONS;
    pcr_body_opts_t o;
    pcr_body_opts_default(&o);
    o.block_bytes = blocks[(data[0] >> 1) & 3];
    o.max_prefix_bytes = o.block_bytes == 1 ? 300 : o.max_prefix_bytes;
    o.keep_canonical = 1;
    const char *body = (const char *)data + 2;
    size_t len = size - 2;

    result_t whole, chunked;
    read_whole(api, &o, body, len, &whole);
    read_chunked(api, &o, body, len, (uint32_t)data[1] << 8 | (uint32_t)(data[0] >> 3), &chunked);
    if (!body_result_same(&whole, &chunked)) {
        fprintf(stderr, "whole: %d '%s'\nchunked: %d '%s'\n", whole.rc, whole.msg, chunked.rc,
                chunked.msg);
        abort();
    }
    int json_ok = yajl_accepts(body, len);
    if (!json_ok && whole.rc != PCR_ERR_PARSE) {
        fprintf(stderr, "yajl refuses the body, the reader says %d '%s'\n", whole.rc, whole.msg);
        abort();
    }
    if (json_ok && whole.rc == PCR_ERR_PARSE && !is_limit(whole.msg)) {
        fprintf(stderr, "yajl accepts the body, the reader says '%s'\n", whole.msg);
        abort();
    }
    if (whole.rc == 0 && (whole.b.model == NULL || whole.b.blocks == NULL))
        abort();
    if (whole.rc == 0) {
        static const char *const names[] = {"model", "prompt", "messages", "tools",
                                            "add_generation_prompt"};
        pcr_body_raw_t f[5];
        if (pcr_body_raw_fields(body, len, names, 5, f) == 0) {
            for (int i = 0; i < 5; i++)
                if (f[i].at != NULL && (f[i].at < body || f[i].at + f[i].len > body + len ||
                                        !yajl_accepts(f[i].at, f[i].len))) {
                    fprintf(stderr, "field %s: %zu bytes at %td, not JSON on its own\n",
                            names[i], f[i].len, f[i].at - body);
                    abort();
                }
            if (f[0].at != NULL && f[0].type != PCR_RAW_STRING)
                abort(); /* the reader takes only a string model */
        } else if (f[0].type != PCR_RAW_NONE) {
            abort(); /* a failure says nothing was found */
        }
    }
    pcr_body_dispose(&whole.b);
    pcr_body_dispose(&chunked.b);
    return 0;
}
