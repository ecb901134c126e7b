/* hashring/prefix.c: chained XXH3-64 block hashes of the canonical prompt bytes, one-shot and
 * streamed, with the model and the context mixed in last. See include/pcr/prefix.h for the
 * scheme; test_prefix.c pins it. */
#include <stdlib.h>
#include <string.h>

/* Inlined: a key mixes the model into up to 512 blocks with an 8-byte hash each, and a call
 * into the shared library per hash cost as much as the hash. Same algorithm, same values.
 * The blocks themselves are hashed in prefix_blocks.c, built per vector unit. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "pcr/common.h"
#include "pcr/prefix.h"
#include "prefix_blocks.h"

struct pcr_prefix_stream {
    size_t block_bytes, max_prefix_bytes, max_blocks;
    uint64_t *chain;           /* chain[0..nblocks) of the full blocks hashed so far */
    size_t nblocks, cap;
    unsigned char *partial;    /* the block being filled: plen of block_bytes bytes */
    size_t plen;
    size_t hashed;             /* canonical bytes taken into blocks, <= max_prefix_bytes */
    uint64_t total;            /* canonical and context bytes fed, all of them */
    XXH3_state_t *ctx;         /* created at the first context bytes */
    int has_ctx;
    int err;
};

size_t pcr_prefix_max_blocks(size_t block_bytes, size_t max_prefix_bytes)
{
    if (block_bytes == 0)
        return 0;
    return max_prefix_bytes / block_bytes + (max_prefix_bytes % block_bytes != 0);
}

/* The last step: a bijection of the chain value for one (model, context). The chain value is
 * hashed as little-endian bytes so replicas on any CPU agree. */
static uint64_t mix(uint64_t chain, uint64_t ctx)
{
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(chain >> (8 * i));
    return XXH3_64bits_withSeed(le, sizeof(le), ctx);
}

static uint64_t ctx_seed(const char *model, size_t model_len, uint64_t context)
{
    return XXH3_64bits_withSeed(model_len ? model : "", model_len, context);
}

size_t pcr_prefix_hash(const char *model, size_t model_len, const void *bytes, size_t len,
                       size_t block_bytes, size_t max_prefix_bytes, uint64_t *out)
{
    const unsigned char *p = bytes;

    if (block_bytes == 0 || bytes == NULL || out == NULL)
        return 0;
    if (len > max_prefix_bytes)
        len = max_prefix_bytes;
    size_t n = len / block_bytes, rest = len % block_bytes;
    uint64_t chain = pcr_prefix_blocks(p, n, block_bytes, 0, out);
    if (rest > 0) {
        pcr_prefix_blocks(p + n * block_bytes, 1, rest, chain, &out[n]);
        n++;
    }
    uint64_t ctx = ctx_seed(model, model_len, 0);
    for (size_t i = 0; i < n; i++)
        out[i] = mix(out[i], ctx);
    return n;
}

pcr_prefix_stream_t *pcr_prefix_stream_new(size_t block_bytes, size_t max_prefix_bytes)
{
    if (block_bytes == 0 || max_prefix_bytes == 0)
        return NULL;
    pcr_prefix_stream_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->block_bytes = block_bytes;
    s->max_prefix_bytes = max_prefix_bytes;
    s->max_blocks = pcr_prefix_max_blocks(block_bytes, max_prefix_bytes);
    /* Room for the default 512 blocks at once; a larger max_prefix_bytes grows on demand,
     * so a short prompt never pays for the longest one. */
    s->cap = s->max_blocks < 512 ? s->max_blocks : 512;
    s->chain = malloc(s->cap * sizeof(*s->chain));
    s->partial = malloc(block_bytes);
    if (s->chain == NULL || s->partial == NULL) {
        pcr_prefix_stream_free(s);
        return NULL;
    }
    return s;
}

void pcr_prefix_stream_free(pcr_prefix_stream_t *s)
{
    if (s == NULL)
        return;
    free(s->chain);
    free(s->partial);
    XXH3_freeState(s->ctx);
    free(s);
}

void pcr_prefix_stream_reset(pcr_prefix_stream_t *s)
{
    if (s == NULL)
        return;
    s->nblocks = 0;
    s->plen = 0;
    s->hashed = 0;
    s->total = 0;
    s->has_ctx = 0;
    s->err = 0;
}

/* Hashes n whole blocks from data onto the chain. The caller's bytes are never more than
 * max_prefix_bytes, so the chain never needs more than max_blocks. */
static int push_blocks(pcr_prefix_stream_t *s, const unsigned char *data, size_t n)
{
    if (s->nblocks + n > s->cap) {
        size_t ncap = s->cap;
        while (ncap < s->nblocks + n)
            ncap *= 2;
        if (ncap > s->max_blocks)
            ncap = s->max_blocks;
        uint64_t *nc = ncap >= s->nblocks + n ? realloc(s->chain, ncap * sizeof(*nc)) : NULL;
        if (nc == NULL)
            return s->err = PCR_ERR_NOMEM;
        s->chain = nc;
        s->cap = ncap;
    }
    uint64_t parent = s->nblocks ? s->chain[s->nblocks - 1] : 0;
    pcr_prefix_blocks(data, n, s->block_bytes, parent, s->chain + s->nblocks);
    s->nblocks += n;
    return 0;
}

int pcr_prefix_stream_update(pcr_prefix_stream_t *s, const void *bytes, size_t len)
{
    const unsigned char *p = bytes;

    if (s == NULL || (bytes == NULL && len > 0))
        return PCR_ERR_INVAL;
    if (s->err != 0)
        return s->err;
    s->total += len;
    size_t take = s->max_prefix_bytes - s->hashed;
    if (take > len)
        take = len;
    s->hashed += take;
    if (s->plen > 0 && take > 0) {
        size_t fill = s->block_bytes - s->plen < take ? s->block_bytes - s->plen : take;
        memcpy(s->partial + s->plen, p, fill);
        s->plen += fill;
        p += fill;
        take -= fill;
        if (s->plen == s->block_bytes) {
            s->plen = 0;
            if (push_blocks(s, s->partial, 1) != 0)
                return s->err;
        }
    }
    /* Whole blocks straight from the caller's bytes: no copy on the long-prompt path. */
    size_t whole = take / s->block_bytes;
    if (whole > 0 && push_blocks(s, p, whole) != 0)
        return s->err;
    p += whole * s->block_bytes;
    take -= whole * s->block_bytes;
    if (take > 0) {
        memcpy(s->partial, p, take);
        s->plen = take;
    }
    return 0;
}

int pcr_prefix_stream_context(pcr_prefix_stream_t *s, const void *bytes, size_t len)
{
    if (s == NULL || (bytes == NULL && len > 0))
        return PCR_ERR_INVAL;
    if (s->err != 0)
        return s->err;
    if (!s->has_ctx) {
        if (s->ctx == NULL && (s->ctx = XXH3_createState()) == NULL)
            return s->err = PCR_ERR_NOMEM;
        XXH3_64bits_reset(s->ctx);
        s->has_ctx = 1;
    }
    XXH3_64bits_update(s->ctx, bytes, len);
    s->total += len;
    return 0;
}

uint64_t pcr_prefix_stream_bytes(const pcr_prefix_stream_t *s)
{
    return s != NULL ? s->total : 0;
}

size_t pcr_prefix_stream_finish(const pcr_prefix_stream_t *s, const char *model,
                                size_t model_len, uint64_t *out, int *err)
{
    if (err != NULL)
        *err = 0;
    if (s == NULL || out == NULL || (model == NULL && model_len > 0)) {
        if (err != NULL)
            *err = PCR_ERR_INVAL;
        return 0;
    }
    if (s->err != 0) {
        if (err != NULL)
            *err = s->err;
        return 0;
    }
    uint64_t ctx = ctx_seed(model, model_len, s->has_ctx ? XXH3_64bits_digest(s->ctx) : 0);
    size_t n = s->nblocks;
    for (size_t i = 0; i < n; i++)
        out[i] = mix(s->chain[i], ctx);
    if (s->plen > 0) {
        /* The final partial block, hashed here so the stream stays as it was. */
        uint64_t last;
        pcr_prefix_blocks(s->partial, 1, s->plen, n ? s->chain[n - 1] : 0, &last);
        out[n++] = mix(last, ctx);
    }
    return n;
}
