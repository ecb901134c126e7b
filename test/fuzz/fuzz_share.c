/* test/fuzz/fuzz_share.c: the decoder of the batches replicas exchange through Redis
 * (router/share/share_codec.c) on any bytes, as another replica, a foreign writer or a corrupted
 * key could put them in the stream or a snapshot.
 *
 * Invariants, beyond "no crash, no leak, no undefined behaviour":
 *   1. A rejected batch yields no op.
 *   2. An accepted batch yields exactly its nops ops, each within bounds: a key of 1..max_blocks
 *      blocks, a listed backend, a forget from within its key, only commits in a snapshot.
 *   3. Re-encoding what was read gives a batch that decodes to the same ops, is no larger
 *      (the encoder lists only the names used and shares every leading block it can), and
 *      re-encodes to itself byte for byte.
 *
 * Corpus: test/fuzz/corpus/share/, replayed by `make test` (test/fuzz/meson.build); `make fuzz`
 * runs it under libFuzzer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "share_codec.h"

/* Small enough for the fuzzer to reach the "too long" branch, large enough for real keys. */
#define MAX_BLOCKS 512

typedef struct {
    pcr_share_opcode_t op;
    unsigned name;
    size_t n;
    uint64_t arg;
    uint64_t *blocks;
} op_copy_t;

/* Reads every op of an accepted batch, checking invariant 2; NULL when out of memory. */
static op_copy_t *read_ops(pcr_share_batch_t *b, uint64_t *scratch)
{
    op_copy_t *ops = calloc(b->nops ? b->nops : 1, sizeof(*ops));
    if (ops == NULL)
        return NULL;
    pcr_share_op_t op;
    uint32_t i = 0;
    while (pcr_share_next(b, scratch, &op) == 1) {
        FUZZ_CHECK(i < b->nops);
        FUZZ_CHECK(op.nblocks >= 1 && op.nblocks <= MAX_BLOCKS);
        FUZZ_CHECK(op.name < b->nnames);
        FUZZ_CHECK(op.op == PCR_SHARE_COMMIT || op.op == PCR_SHARE_FORGET);
        FUZZ_CHECK(op.op != PCR_SHARE_FORGET || op.arg <= op.nblocks);
        FUZZ_CHECK(!(b->hdr.flags & PCR_SHARE_F_SNAPSHOT) || op.op == PCR_SHARE_COMMIT);
        ops[i] = (op_copy_t){op.op, op.name, op.nblocks, op.arg, malloc(op.nblocks * 8)};
        FUZZ_CHECK(ops[i].blocks != NULL);
        memcpy(ops[i].blocks, op.blocks, op.nblocks * 8);
        i++;
    }
    FUZZ_CHECK(i == b->nops);
    return ops;
}

/* A name as a C string. Not strndup: a name may end the input, and strndup may look past
 * `n` for a NUL (ASan's strict_string_checks, which make test sets, reports it). */
static char *name_copy(const char *s, size_t n)
{
    char *c = malloc(n + 1);
    FUZZ_CHECK(c != NULL);
    memcpy(c, s, n);
    c[n] = '\0';
    return c;
}

static void free_ops(op_copy_t *ops, uint32_t n)
{
    for (uint32_t i = 0; ops != NULL && i < n; i++)
        free(ops[i].blocks);
    free(ops);
}

/* Encodes `ops` over `names` with header `h`. */
static unsigned char *reencode(char **names, size_t nnames, const op_copy_t *ops, uint32_t nops,
                               const pcr_share_hdr_t *h, size_t *len)
{
    pcr_share_enc_t e;
    FUZZ_CHECK(pcr_share_enc_init(&e, (const char *const *)names, nnames) == 0);
    for (uint32_t i = 0; i < nops; i++)
        FUZZ_CHECK(pcr_share_enc_add(&e, ops[i].op, ops[i].name, ops[i].blocks, ops[i].n,
                                     ops[i].arg) == 0);
    unsigned char *out;
    FUZZ_CHECK(pcr_share_enc_finish(&e, h, &out, len) == 0);
    pcr_share_enc_dispose(&e);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint64_t scratch[MAX_BLOCKS], scratch2[MAX_BLOCKS];
    pcr_share_batch_t b;
    pcr_share_op_t op;
    if (pcr_share_decode(data, size, MAX_BLOCKS, &b) != NULL) {
        FUZZ_CHECK(pcr_share_next(&b, scratch, &op) == 0);        /* invariant 1 */
        return 0;
    }
    op_copy_t *ops = read_ops(&b, scratch);
    FUZZ_CHECK(ops != NULL);

    /* The names as C strings, in the batch's order: the encoder's backend ids. */
    char **names = calloc(b.nnames ? b.nnames : 1, sizeof(*names));
    FUZZ_CHECK(names != NULL);
    size_t pos = 0, k = 0, nlen;
    const char *s;
    while (pcr_share_next_name(&b, &pos, &s, &nlen)) {
        FUZZ_CHECK(k < b.nnames);
        names[k] = name_copy(s, nlen);
        k++;
    }
    FUZZ_CHECK(k == b.nnames);

    size_t len1, len2;
    unsigned char *once = reencode(names, b.nnames, ops, b.nops, &b.hdr, &len1);
    FUZZ_CHECK(len1 <= size);
    pcr_share_batch_t b1;
    FUZZ_CHECK(pcr_share_decode(once, len1, MAX_BLOCKS, &b1) == NULL);
    FUZZ_CHECK(b1.nops == b.nops && b1.hdr.flags == b.hdr.flags &&
               b1.hdr.replica == b.hdr.replica && b1.hdr.sent_ms == b.hdr.sent_ms &&
               b1.hdr.block_bytes == b.hdr.block_bytes);
    for (uint32_t i = 0; i < b.nops; i++) {
        FUZZ_CHECK(pcr_share_next(&b1, scratch2, &op) == 1);
        FUZZ_CHECK(op.op == ops[i].op && op.nblocks == ops[i].n && op.arg == ops[i].arg);
        FUZZ_CHECK(memcmp(op.blocks, ops[i].blocks, op.nblocks * 8) == 0);
        /* The same backend name, though perhaps at another index. */
        size_t p1 = 0, l1 = 0;
        const char *s1 = NULL;
        for (unsigned j = 0; j <= op.name; j++)
            FUZZ_CHECK(pcr_share_next_name(&b1, &p1, &s1, &l1) == 1);
        FUZZ_CHECK(l1 == strlen(names[ops[i].name]) && memcmp(s1, names[ops[i].name], l1) == 0);
    }
    FUZZ_CHECK(pcr_share_next(&b1, scratch2, &op) == 0);

    /* Encoding what the re-encoded batch holds gives it back byte for byte. */
    pcr_share_batch_t b2;
    FUZZ_CHECK(pcr_share_decode(once, len1, MAX_BLOCKS, &b2) == NULL);
    op_copy_t *ops2 = read_ops(&b2, scratch2);
    FUZZ_CHECK(ops2 != NULL);
    char **names2 = calloc(b2.nnames ? b2.nnames : 1, sizeof(*names2));
    FUZZ_CHECK(names2 != NULL);
    pos = 0;
    for (k = 0; pcr_share_next_name(&b2, &pos, &s, &nlen); k++)
        names2[k] = name_copy(s, nlen);
    unsigned char *twice = reencode(names2, b2.nnames, ops2, b2.nops, &b2.hdr, &len2);
    FUZZ_CHECK(len2 == len1 && memcmp(once, twice, len1) == 0);

    for (k = 0; k < b2.nnames; k++)
        free(names2[k]);
    free(names2);
    free_ops(ops2, b2.nops);
    free(twice);
    free(once);
    for (k = 0; k < b.nnames; k++)
        free(names[k]);
    free(names);
    free_ops(ops, b.nops);
    return 0;
}
