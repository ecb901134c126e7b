/* router/share/share_codec.h: the binary batch format that pcrouter replicas exchange through Redis
 * (docs/SHARING.md): what one replica learned about which backend holds which prefix.
 *
 * Pure: no I/O, no clock, no Redis. The encoder builds one batch in memory; the decoder checks
 * a whole batch before anything of it is used, so a malformed batch is rejected whole, with a
 * reason, and never half applied. Every count and length is checked against the bytes that
 * are really there; nothing is trusted.
 *
 * Layout, all integers little-endian:
 *
 *   header (32 bytes)
 *     "pcr"        3 bytes, the magic
 *     version      u8   PCR_SHARE_VERSION
 *     flags        u8   PCR_SHARE_F_SNAPSHOT | PCR_SHARE_F_ANNOUNCE, nothing else
 *     reserved     u8   0
 *     nnames       u16  backend names that follow
 *     block_bytes  u32  routing.block_bytes of the sender: keys are comparable only if equal
 *     nops         u32  updates that follow the names
 *     replica      u64  the sender's random id (a new one at every start)
 *     sent_ms      u64  the sender's wall clock when it sent the batch (ms since the epoch)
 *   names: nnames x ( len u8 (1..255) | len bytes, no control character )
 *   ops:   nops x ( op u8 | name u16 | shared u32 | fresh u32 | arg u64 | fresh x u64 blocks )
 *
 * An op's key is `shared` leading blocks of the previous op's key followed by `fresh` new ones
 * (front coding: the turns of a conversation, the users of one system prompt, share their
 * leading blocks). op is PCR_SHARE_COMMIT (`arg`: the update's age in ms when sent) or
 * PCR_SHARE_FORGET (`arg`: the first block to forget, at most the key's length). A snapshot
 * (flag SNAPSHOT) holds commits only. */
#ifndef PCR_ROUTER_SHARE_CODEC_H
#define PCR_ROUTER_SHARE_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define PCR_SHARE_VERSION 1
#define PCR_SHARE_HDR_BYTES 32
#define PCR_SHARE_OP_BYTES 19          /* an op without its blocks */
#define PCR_SHARE_NAME_MAX PCR_BACKEND_NAME_MAX  /* config.h checks names against it */
#define PCR_SHARE_MAX_NAMES 65535

enum {
    PCR_SHARE_F_SNAPSHOT = 1,          /* a replica's whole knowledge, commits with their age */
    PCR_SHARE_F_ANNOUNCE = 2,          /* the sender's snapshot was just rewritten: load it */
};

typedef enum {
    PCR_SHARE_COMMIT = 1,              /* the backend holds the key */
    PCR_SHARE_FORGET = 2,              /* the backend failed it: drop blocks arg.. of the key */
} pcr_share_opcode_t;

typedef struct {
    unsigned flags;
    uint32_t block_bytes;
    uint64_t replica;
    uint64_t sent_ms;
} pcr_share_hdr_t;

/* ---- the encoder --------------------------------------------------------------------- */

/* One batch being built over the sender's backends, named by id (0..nnames-1). Embedded:
 * pcr_share_enc_init / pcr_share_enc_dispose. A failed add leaves the batch as it was. The
 * names array is the caller's: an entry may be NULL where no op uses it, and may change while
 * the batch is empty (after a reset), never while an op in the batch names it. */
typedef struct {
    const char *const *names;  /* the sender's backend names, by id; borrowed */
    size_t nnames;
    int32_t *slot;             /* backend id -> its index among the batch's names, or -1 */
    uint32_t *used;            /* batch name index -> backend id */
    size_t nused;
    size_t names_bytes;        /* what the used names take in the batch */
    unsigned char *ops;        /* the encoded ops */
    size_t len, cap;
    uint32_t nops;
    uint64_t *prev;            /* the last op's key, for front coding */
    size_t nprev, prev_cap;
} pcr_share_enc_t;

/* 0, PCR_ERR_NOMEM, or PCR_ERR_INVAL (more than PCR_SHARE_MAX_NAMES names). */
int pcr_share_enc_init(pcr_share_enc_t *e, const char *const *names, size_t nnames);
void pcr_share_enc_dispose(pcr_share_enc_t *e);

/* Empties the batch (keeps its buffers). */
void pcr_share_enc_reset(pcr_share_enc_t *e);

/* Appends one op about `backend` and the key blocks[0..n) (n >= 1). 0, PCR_ERR_NOMEM, or
 * PCR_ERR_INVAL (backend out of range, n 0 or over UINT32_MAX, a forget from past n, or the
 * backend's name NULL, empty, longer than PCR_SHARE_NAME_MAX or holding a control character). */
int pcr_share_enc_add(pcr_share_enc_t *e, pcr_share_opcode_t op, unsigned backend,
                      const uint64_t *blocks, size_t n, uint64_t arg);

static inline uint32_t pcr_share_enc_count(const pcr_share_enc_t *e) { return e->nops; }

/* The bytes the batch would take if finished now. */
size_t pcr_share_enc_size(const pcr_share_enc_t *e);

/* Writes the batch with header `h` into a new heap buffer (*out, *len; caller frees).
 * 0 or PCR_ERR_NOMEM. The batch stays as it is (reset it to start another). */
int pcr_share_enc_finish(const pcr_share_enc_t *e, const pcr_share_hdr_t *h, unsigned char **out,
                         size_t *len);

/* ---- the decoder --------------------------------------------------------------------- */

/* A batch checked whole by pcr_share_decode, read with pcr_share_next_name and pcr_share_next.
 * It points into the buffer given to pcr_share_decode, which must outlive it. */
typedef struct {
    pcr_share_hdr_t hdr;
    size_t nnames;
    uint32_t nops;
    size_t max_blocks;
    const unsigned char *names, *ops, *end;
    const unsigned char *at;   /* the next op */
    uint32_t done;             /* ops read */
} pcr_share_batch_t;

typedef struct {
    pcr_share_opcode_t op;
    unsigned name;             /* index among the batch's names */
    const uint64_t *blocks;    /* the caller's buffer given to pcr_share_next */
    size_t nblocks;            /* 1..max_blocks */
    uint64_t arg;
} pcr_share_op_t;

/* Checks the whole of buf[0..len): NULL when it is a well-formed batch whose keys are at most
 * `max_blocks` long (then *b is ready to read), else why not, a sentence for a log line. */
const char *pcr_share_decode(const void *buf, size_t len, size_t max_blocks,
                             pcr_share_batch_t *b);

/* The batch's backend names in order: *pos = 0 first; returns 1 with the next name in *s and
 * *len (not NUL-terminated), 0 after the last. */
int pcr_share_next_name(const pcr_share_batch_t *b, size_t *pos, const char **s, size_t *len);

/* The next op: returns 1 and fills *op, whose blocks are written to `blocks` (room for
 * max_blocks; pass the same buffer every time, as a key may reuse the previous one's leading
 * blocks); 0 after the last op. */
int pcr_share_next(pcr_share_batch_t *b, uint64_t *blocks, pcr_share_op_t *op);

#endif
