/* router/share/share_codec.c: encoding and decoding the batches replicas exchange through Redis
 * (format in share_codec.h). The decoder reads nothing it has not bounds-checked, and checks
 * everything before it hands out the first op. */
#include <stdlib.h>
#include <string.h>

#include "pcr/common.h"
#include "share_codec.h"

static const unsigned char MAGIC[3] = {'p', 'c', 'r'};

static void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t get16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const unsigned char *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* A name fit for a log line and a metrics label. */
static int name_ok(const unsigned char *s, size_t n)
{
    if (n == 0 || n > PCR_SHARE_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] == 0x7F)
            return 0;
    return 1;
}

/* ---- the encoder --------------------------------------------------------------------- */

int pcr_share_enc_init(pcr_share_enc_t *e, const char *const *names, size_t nnames)
{
    memset(e, 0, sizeof(*e));
    if (nnames > PCR_SHARE_MAX_NAMES)
        return PCR_ERR_INVAL;
    e->names = names;
    e->nnames = nnames;
    e->slot = malloc((nnames ? nnames : 1) * sizeof(*e->slot));
    e->used = malloc((nnames ? nnames : 1) * sizeof(*e->used));
    if (e->slot == NULL || e->used == NULL) {
        pcr_share_enc_dispose(e);
        return PCR_ERR_NOMEM;
    }
    for (size_t i = 0; i < nnames; i++)
        e->slot[i] = -1;
    return 0;
}

void pcr_share_enc_dispose(pcr_share_enc_t *e)
{
    free(e->slot);
    free(e->used);
    free(e->ops);
    free(e->prev);
    memset(e, 0, sizeof(*e));
}

void pcr_share_enc_reset(pcr_share_enc_t *e)
{
    for (size_t i = 0; i < e->nused; i++)
        e->slot[e->used[i]] = -1;
    e->nused = 0;
    e->names_bytes = 0;
    e->len = 0;
    e->nops = 0;
    e->nprev = 0;
}

/* Grows the array *buf of `elem`-byte elements to hold `need` of them; 0 or PCR_ERR_NOMEM
 * (the array unchanged). No cap of its own: a batch is as large as its caller lets it grow
 * before it sends it (share.c sends at redis.batch_max_bytes). */
static int grow(void **buf, size_t *cap, size_t need, size_t elem)
{
    return pcr_grow_elems(buf, cap, need, elem, 512, (size_t)-1, NULL) == 0 ? 0 : PCR_ERR_NOMEM;
}

int pcr_share_enc_add(pcr_share_enc_t *e, pcr_share_opcode_t op, unsigned backend,
                      const uint64_t *blocks, size_t n, uint64_t arg)
{
    if (backend >= e->nnames || n == 0 || n > UINT32_MAX || e->nops == UINT32_MAX ||
        (op != PCR_SHARE_COMMIT && op != PCR_SHARE_FORGET) || (op == PCR_SHARE_FORGET && arg > n))
        return PCR_ERR_INVAL;
    /* Checked at its first use in the batch: the caller's names may be NULL where unused. */
    if (e->slot[backend] < 0 && (e->names[backend] == NULL ||
                                 !name_ok((const unsigned char *)e->names[backend],
                                          strlen(e->names[backend]))))
        return PCR_ERR_INVAL;
    size_t shared = 0;
    while (shared < n && shared < e->nprev && blocks[shared] == e->prev[shared])
        shared++;
    size_t fresh = n - shared;
    /* Both buffers are grown before anything changes, so a failure leaves the batch whole. */
    void *ops = e->ops, *prev = e->prev;
    int rc = grow(&ops, &e->cap, e->len + PCR_SHARE_OP_BYTES + fresh * 8, 1);
    e->ops = ops;
    if (rc == 0) {
        rc = grow(&prev, &e->prev_cap, n, sizeof(uint64_t));
        e->prev = prev;
    }
    if (rc < 0)
        return rc;
    if (e->slot[backend] < 0) {
        e->slot[backend] = (int32_t)e->nused;
        e->used[e->nused++] = backend;
        e->names_bytes += 1 + strlen(e->names[backend]);
    }
    unsigned char *p = e->ops + e->len;
    p[0] = (unsigned char)op;
    put16(p + 1, (uint16_t)e->slot[backend]);
    put32(p + 3, (uint32_t)shared);
    put32(p + 7, (uint32_t)fresh);
    put64(p + 11, arg);
    p += PCR_SHARE_OP_BYTES;
    for (size_t i = shared; i < n; i++, p += 8)
        put64(p, blocks[i]);
    e->len = (size_t)(p - e->ops);
    memcpy(e->prev + shared, blocks + shared, fresh * sizeof(uint64_t));
    e->nprev = n;
    e->nops++;
    return 0;
}

size_t pcr_share_enc_size(const pcr_share_enc_t *e)
{
    return PCR_SHARE_HDR_BYTES + e->names_bytes + e->len;
}

int pcr_share_enc_finish(const pcr_share_enc_t *e, const pcr_share_hdr_t *h, unsigned char **out,
                         size_t *len)
{
    size_t total = pcr_share_enc_size(e);
    unsigned char *b = malloc(total), *p = b;
    *out = NULL;
    *len = 0;
    if (b == NULL)
        return PCR_ERR_NOMEM;
    memcpy(p, MAGIC, 3);
    p[3] = PCR_SHARE_VERSION;
    p[4] = (unsigned char)h->flags;
    p[5] = 0;
    put16(p + 6, (uint16_t)e->nused);
    put32(p + 8, h->block_bytes);
    put32(p + 12, e->nops);
    put64(p + 16, h->replica);
    put64(p + 24, h->sent_ms);
    p += PCR_SHARE_HDR_BYTES;
    for (size_t i = 0; i < e->nused; i++) {
        const char *name = e->names[e->used[i]];
        size_t n = strlen(name);
        *p++ = (unsigned char)n;
        memcpy(p, name, n);
        p += n;
    }
    if (e->len)
        memcpy(p, e->ops, e->len);
    *out = b;
    *len = total;
    return 0;
}

/* ---- the decoder --------------------------------------------------------------------- */

const char *pcr_share_decode(const void *buf, size_t len, size_t max_blocks,
                             pcr_share_batch_t *b)
{
    const unsigned char *p = buf, *end = p + len;
    memset(b, 0, sizeof(*b));
    if (buf == NULL || len < PCR_SHARE_HDR_BYTES)
        return "shorter than the 32-byte header";
    if (memcmp(p, MAGIC, 3) != 0)
        return "no \"pcr\" magic: not a pcrouter batch";
    if (p[3] != PCR_SHARE_VERSION)
        return "a version this pcrouter does not read";
    if (p[4] & ~(PCR_SHARE_F_SNAPSHOT | PCR_SHARE_F_ANNOUNCE))
        return "unknown flags";
    if (p[5] != 0)
        return "reserved byte not 0";
    b->hdr.flags = p[4];
    b->nnames = get16(p + 6);
    b->hdr.block_bytes = get32(p + 8);
    b->nops = get32(p + 12);
    b->hdr.replica = get64(p + 16);
    b->hdr.sent_ms = get64(p + 24);
    b->max_blocks = max_blocks;
    if (b->hdr.block_bytes == 0)
        return "block_bytes 0";
    p += PCR_SHARE_HDR_BYTES;

    b->names = p;
    for (size_t i = 0; i < b->nnames; i++) {
        if (p >= end || (size_t)(end - p) - 1 < *p)
            return "backend names run past the end";
        if (!name_ok(p + 1, *p))
            return "a backend name empty or holding a control character";
        p += 1 + *p;
    }

    /* Walk every op once: lengths, references and front coding, before anything is used. */
    b->ops = p;
    size_t prev_n = 0;
    for (uint32_t i = 0; i < b->nops; i++) {
        if ((size_t)(end - p) < PCR_SHARE_OP_BYTES)
            return "an op runs past the end";
        unsigned op = p[0];
        uint16_t name = get16(p + 1);
        uint64_t shared = get32(p + 3), fresh = get32(p + 7), arg = get64(p + 11);
        uint64_t n = shared + fresh;
        p += PCR_SHARE_OP_BYTES;
        if (op != PCR_SHARE_COMMIT && op != PCR_SHARE_FORGET)
            return "unknown op";
        if ((b->hdr.flags & PCR_SHARE_F_SNAPSHOT) && op != PCR_SHARE_COMMIT)
            return "a snapshot holds an op other than commit";
        if (name >= b->nnames)
            return "an op names a backend the batch does not list";
        if (shared > prev_n)
            return "an op shares more blocks than the previous key has";
        if (n == 0)
            return "an op with an empty key";
        if (n > max_blocks)
            return "a key longer than routing.max_prefix_bytes allows";
        if (op == PCR_SHARE_FORGET && arg > n)
            return "a forget from past its key's end";
        if ((size_t)(end - p) / 8 < fresh)
            return "an op's blocks run past the end";
        p += fresh * 8;
        prev_n = (size_t)n;
    }
    if (p != end)
        return "bytes after the last op";
    b->end = end;
    b->at = b->ops;
    return NULL;
}

int pcr_share_next_name(const pcr_share_batch_t *b, size_t *pos, const char **s, size_t *len)
{
    /* *pos is a byte offset into the names: the walk was bounds-checked by the decoder. */
    const unsigned char *p = b->names + *pos;
    if (p >= b->ops)
        return 0;
    *s = (const char *)p + 1;
    *len = *p;
    *pos += 1 + (size_t)*p;
    return 1;
}

int pcr_share_next(pcr_share_batch_t *b, uint64_t *blocks, pcr_share_op_t *op)
{
    if (b->done >= b->nops || b->at == NULL)
        return 0;
    const unsigned char *p = b->at;
    size_t shared = get32(p + 3), fresh = get32(p + 7);
    op->op = (pcr_share_opcode_t)p[0];
    op->name = get16(p + 1);
    op->arg = get64(p + 11);
    p += PCR_SHARE_OP_BYTES;
    for (size_t i = 0; i < fresh; i++, p += 8)
        blocks[shared + i] = get64(p);
    op->blocks = blocks;
    op->nblocks = shared + fresh;
    b->at = p;
    b->done++;
    return 1;
}
