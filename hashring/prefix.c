/* hashring/prefix.c: chained XXH3-64 block hashes of the canonical prompt bytes, one-shot and
 * streamed, with the model and the context mixed in last. See include/pcr/prefix.h for the
 * scheme; test_prefix.c pins it. */
#include <stdlib.h>
#include <string.h>

/* Inlined: a key mixes the model into up to 512 blocks with an 8-byte hash each, and a call
 * into the shared library per hash cost as much as the hash. Same algorithm, same values. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "pcr/common.h"
#include "pcr/prefix.h"
#include "prefix_long.h"

/* A block's hash: inlined when short, the dispatched library call when long. */
static inline uint64_t block_hash(const void *data, size_t n, uint64_t seed)
{
    return n >= PCR_PREFIX_LONG_MIN ? pcr_prefix_hash_long(data, n, seed)
                                    : XXH3_64bits_withSeed(data, n, seed);
}

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
    uint64_t seed = 0;
    size_t n = 0;

    if (block_bytes == 0 || bytes == NULL || out == NULL)
        return 0;
    if (len > max_prefix_bytes)
        len = max_prefix_bytes;
    for (size_t off = 0; off < len; off += block_bytes) {
        size_t take = len - off < block_bytes ? len - off : block_bytes;
        seed = block_hash(p + off, take, seed);
        out[n++] = seed;
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

static int push_block(pcr_prefix_stream_t *s, const void *data, size_t n)
{
    if (s->nblocks == s->cap) {
        size_t ncap = s->cap * 2 < s->max_blocks ? s->cap * 2 : s->max_blocks;
        uint64_t *nc = ncap > s->cap ? realloc(s->chain, ncap * sizeof(*nc)) : NULL;
        if (nc == NULL)
            return s->err = PCR_ERR_NOMEM;
        s->chain = nc;
        s->cap = ncap;
    }
    uint64_t seed = s->nblocks ? s->chain[s->nblocks - 1] : 0;
    s->chain[s->nblocks++] = block_hash(data, n, seed);
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
            if (push_block(s, s->partial, s->block_bytes) != 0)
                return s->err;
        }
    }
    /* Whole blocks straight from the caller's bytes: no copy on the long-prompt path. */
    for (; take >= s->block_bytes; p += s->block_bytes, take -= s->block_bytes)
        if (push_block(s, p, s->block_bytes) != 0)
            return s->err;
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
        uint64_t last = block_hash(s->partial, s->plen, n ? s->chain[n - 1] : 0);
        out[n++] = mix(last, ctx);
    }
    return n;
}
