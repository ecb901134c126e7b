/* test/unit/router/share/test_share_codec.c: tests router/share/share_codec.c, the batches replicas
 * exchange through Redis: what is encoded decodes to the same ops (random sequences against the
 * list that made them), front coding shares leading blocks, and every malformed batch is rejected
 * whole with its reason: each truncation, each field out of range, and any byte flipped. */
#include <stdlib.h>
#include <string.h>

#include "pcr/common.h"
#include "pcr_test.h"
#include "share_codec.h"

static const char *const NAMES[] = {"pod-a", "pod-b", "pod-c", "pod-\xc3\xa9"};
#define NNAMES 4
#define MAXB 64

typedef struct {
    pcr_share_opcode_t op;
    unsigned backend;
    uint64_t blocks[MAXB];
    size_t n;
    uint64_t arg;
} ref_op_t;

static const pcr_share_hdr_t HDR = {0, 256, 0x1122334455667788ull, 1700000000123ull};

/* Encodes `ops` into a heap batch. */
static unsigned char *encode(const ref_op_t *ops, size_t nops, unsigned flags, size_t *len)
{
    pcr_share_enc_t e;
    PCR_CHECK_EQ_INT(pcr_share_enc_init(&e, NAMES, NNAMES), 0);
    for (size_t i = 0; i < nops; i++)
        PCR_CHECK_EQ_INT(pcr_share_enc_add(&e, ops[i].op, ops[i].backend, ops[i].blocks, ops[i].n,
                                           ops[i].arg), 0);
    pcr_share_hdr_t h = HDR;
    h.flags = flags;
    unsigned char *out = NULL;
    PCR_CHECK_EQ_INT(pcr_share_enc_finish(&e, &h, &out, len), 0);
    PCR_CHECK_EQ_INT(*len, pcr_share_enc_size(&e));
    pcr_share_enc_dispose(&e);
    return out;
}

/* Decodes `buf` and checks it holds exactly `ops`, backends named as NAMES. */
static void check_decodes_to(const unsigned char *buf, size_t len, const ref_op_t *ops,
                             size_t nops, unsigned flags)
{
    pcr_share_batch_t b;
    const char *why = pcr_share_decode(buf, len, MAXB, &b);
    PCR_CHECK(why == NULL);
    if (why != NULL) {
        printf("# %s\n", why);
        return;
    }
    PCR_CHECK_EQ_INT(b.hdr.flags, flags);
    PCR_CHECK_EQ_INT(b.hdr.block_bytes, HDR.block_bytes);
    PCR_CHECK_EQ_U64(b.hdr.replica, HDR.replica);
    PCR_CHECK_EQ_U64(b.hdr.sent_ms, HDR.sent_ms);
    PCR_CHECK_EQ_INT(b.nops, nops);
    const char *names[NNAMES + 1];
    size_t lens[NNAMES + 1], pos = 0, nn = 0;
    while (nn <= NNAMES && pcr_share_next_name(&b, &pos, &names[nn], &lens[nn]))
        nn++;
    PCR_CHECK_EQ_INT(nn, b.nnames);
    uint64_t blocks[MAXB];
    pcr_share_op_t op;
    for (size_t i = 0; i < nops; i++) {
        PCR_CHECK_EQ_INT(pcr_share_next(&b, blocks, &op), 1);
        PCR_CHECK_EQ_INT(op.op, ops[i].op);
        PCR_CHECK(op.name < nn);
        if (op.name < nn) {
            const char *want = NAMES[ops[i].backend];
            PCR_CHECK(lens[op.name] == strlen(want) && memcmp(names[op.name], want, lens[op.name]) == 0);
        }
        PCR_CHECK_EQ_INT(op.nblocks, ops[i].n);
        PCR_CHECK(op.nblocks == ops[i].n && memcmp(op.blocks, ops[i].blocks, op.nblocks * 8) == 0);
        PCR_CHECK_EQ_U64(op.arg, ops[i].arg);
    }
    PCR_CHECK_EQ_INT(pcr_share_next(&b, blocks, &op), 0);
}

/* A chained key: blocks of one prefix share their leading values, like real prefix keys. */
static void make_key(ref_op_t *o, uint64_t root, size_t common, uint64_t tail, size_t n)
{
    for (size_t i = 0; i < n; i++)
        o->blocks[i] = i < common ? root * 1000 + i : tail * 1000003 + i;
    o->n = n;
}

static void test_round_trip(void)
{
    ref_op_t ops[5];
    memset(ops, 0, sizeof ops);
    ops[0] = (ref_op_t){PCR_SHARE_COMMIT, 2, {0}, 0, 0};
    make_key(&ops[0], 7, 10, 1, 12);
    ops[1] = (ref_op_t){PCR_SHARE_COMMIT, 0, {0}, 0, 1234};
    make_key(&ops[1], 7, 10, 2, 20);          /* shares 10 blocks with ops[0] */
    ops[2] = (ref_op_t){PCR_SHARE_FORGET, 0, {0}, 0, 15};
    make_key(&ops[2], 7, 10, 2, 20);          /* the same key: shares all of it */
    ops[3] = (ref_op_t){PCR_SHARE_COMMIT, 3, {0}, 0, 0};
    make_key(&ops[3], 9, 1, 3, 1);            /* one block, nothing shared */
    ops[4] = (ref_op_t){PCR_SHARE_FORGET, 2, {0}, 0, 0};
    make_key(&ops[4], 9, 1, 3, MAXB);         /* forget all of a longest key */
    size_t len;
    unsigned char *buf = encode(ops, 5, 0, &len);
    check_decodes_to(buf, len, ops, 5, 0);
    /* Only the backends used are listed: 3 of 4. */
    pcr_share_batch_t b;
    PCR_CHECK(pcr_share_decode(buf, len, MAXB, &b) == NULL);
    PCR_CHECK_EQ_INT(b.nnames, 3);
    free(buf);
}

static void test_front_coding_shares_leading_blocks(void)
{
    ref_op_t ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = ops[1].op = PCR_SHARE_COMMIT;
    make_key(&ops[0], 5, 40, 1, 48);
    make_key(&ops[1], 5, 40, 2, 50);
    size_t len;
    unsigned char *buf = encode(ops, 2, 0, &len);
    /* 48 blocks, then 10 fresh ones: 40 were not written twice. */
    size_t names = 1 + strlen(NAMES[0]);
    PCR_CHECK_EQ_INT(len, PCR_SHARE_HDR_BYTES + names + 2 * PCR_SHARE_OP_BYTES + (48 + 10) * 8);
    check_decodes_to(buf, len, ops, 2, 0);
    free(buf);
}

static void test_empty_batch_and_snapshot_flags(void)
{
    size_t len;
    unsigned char *buf = encode(NULL, 0, PCR_SHARE_F_ANNOUNCE, &len);
    PCR_CHECK_EQ_INT(len, PCR_SHARE_HDR_BYTES);
    check_decodes_to(buf, len, NULL, 0, PCR_SHARE_F_ANNOUNCE);
    free(buf);
    ref_op_t op = {PCR_SHARE_COMMIT, 1, {0}, 0, 60000};
    make_key(&op, 1, 3, 1, 3);
    buf = encode(&op, 1, PCR_SHARE_F_SNAPSHOT, &len);
    check_decodes_to(buf, len, &op, 1, PCR_SHARE_F_SNAPSHOT);
    free(buf);
}

/* Random op sequences, keys drawn from a few prefixes so front coding is exercised. */
static void test_random_round_trips(void)
{
    srand(12345);
    for (int round = 0; round < 300; round++) {
        size_t nops = (size_t)(rand() % 40);
        ref_op_t *ops = calloc(nops ? nops : 1, sizeof(*ops));
        for (size_t i = 0; i < nops; i++) {
            ops[i].op = rand() % 3 ? PCR_SHARE_COMMIT : PCR_SHARE_FORGET;
            ops[i].backend = (unsigned)(rand() % NNAMES);
            size_t n = 1 + (size_t)(rand() % MAXB);
            make_key(&ops[i], (uint64_t)(rand() % 3), (size_t)(rand() % (MAXB + 1)),
                     (uint64_t)rand(), n);
            ops[i].arg = ops[i].op == PCR_SHARE_FORGET ? (uint64_t)(rand() % (int)(n + 1))
                                                       : (uint64_t)rand() * (uint64_t)rand();
        }
        size_t len;
        unsigned char *buf = encode(ops, nops, 0, &len);
        check_decodes_to(buf, len, ops, nops, 0);
        free(buf);
        free(ops);
    }
}

static void test_encoder_refuses_bad_input(void)
{
    pcr_share_enc_t e;
    uint64_t k[3] = {1, 2, 3};
    /* Names are checked when an op first uses them: an empty slot (NULL) or a name that cannot
     * travel is refused there, and the batch stays as it was. */
    char longname[PCR_SHARE_NAME_MAX + 2];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    const char *bad[] = {"ok", "", "a\nb", NULL, longname};
    PCR_CHECK_EQ_INT(pcr_share_enc_init(&e, bad, 5), 0);
    for (unsigned b = 1; b < 5; b++)
        PCR_CHECK_EQ_INT(pcr_share_enc_add(&e, PCR_SHARE_COMMIT, b, k, 3, 0), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_share_enc_count(&e), 0);
    PCR_CHECK_EQ_INT(pcr_share_enc_size(&e), PCR_SHARE_HDR_BYTES);
    PCR_CHECK_EQ_INT(pcr_share_enc_add(&e, PCR_SHARE_COMMIT, 0, k, 3, 0), 0);
    PCR_CHECK_EQ_INT(pcr_share_enc_count(&e), 1);
    pcr_share_enc_dispose(&e);

    PCR_CHECK_EQ_INT(pcr_share_enc_init(&e, NAMES, NNAMES), 0);
    PCR_CHECK_EQ_INT(pcr_share_enc_add(&e, PCR_SHARE_COMMIT, NNAMES, k, 3, 0), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_share_enc_add(&e, PCR_SHARE_COMMIT, 0, k, 0, 0), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_share_enc_add(&e, PCR_SHARE_FORGET, 0, k, 3, 4), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_share_enc_add(&e, (pcr_share_opcode_t)9, 0, k, 3, 0), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(pcr_share_enc_count(&e), 0);
    PCR_CHECK_EQ_INT(pcr_share_enc_add(&e, PCR_SHARE_FORGET, 0, k, 3, 3), 0);
    PCR_CHECK_EQ_INT(pcr_share_enc_count(&e), 1);
    /* Reset starts afresh: no names, no ops, no previous key to share with. */
    pcr_share_enc_reset(&e);
    PCR_CHECK_EQ_INT(pcr_share_enc_size(&e), PCR_SHARE_HDR_BYTES);
    PCR_CHECK_EQ_INT(pcr_share_enc_add(&e, PCR_SHARE_COMMIT, 1, k, 3, 0), 0);
    PCR_CHECK_EQ_INT(pcr_share_enc_size(&e), PCR_SHARE_HDR_BYTES + 6 + PCR_SHARE_OP_BYTES + 24);
    pcr_share_enc_dispose(&e);
}

/* Backends come and go: a slot's name may change between batches, and the next batch carries
 * the new one. */
static void test_a_slot_renamed_between_batches(void)
{
    const char *names[3] = {"pod-a", NULL, "pod-c"};
    pcr_share_enc_t e;
    PCR_CHECK_EQ_INT(pcr_share_enc_init(&e, names, 3), 0);
    uint64_t k[2] = {7, 8};
    const char *want[2] = {"pod-c", "10.0.0.9:8000"};
    for (int round = 0; round < 2; round++) {
        PCR_CHECK_EQ_INT(pcr_share_enc_add(&e, PCR_SHARE_COMMIT, 2, k, 2, 0), 0);
        pcr_share_hdr_t h = {0, 256, 1, 2};
        unsigned char *buf = NULL;
        size_t len = 0;
        PCR_CHECK_EQ_INT(pcr_share_enc_finish(&e, &h, &buf, &len), 0);
        pcr_share_batch_t b;
        PCR_CHECK(buf != NULL && pcr_share_decode(buf, len, 16, &b) == NULL);
        size_t pos = 0, nl = 0;
        const char *name = NULL;
        PCR_CHECK_EQ_INT(b.nnames, 1);
        PCR_CHECK(pcr_share_next_name(&b, &pos, &name, &nl) == 1 && nl == strlen(want[round]) &&
                  memcmp(name, want[round], nl) == 0);
        free(buf);
        pcr_share_enc_reset(&e);
        names[2] = "10.0.0.9:8000";   /* the slot's backend left, another joined */
    }
    pcr_share_enc_dispose(&e);
}

/* ---- malformed batches ---------------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A two-op batch (commit 4 blocks to pod-a, forget from block 2 of a key sharing 3) to break. */
static unsigned char *sample(size_t *len)
{
    ref_op_t ops[2];
    memset(ops, 0, sizeof ops);
    ops[0] = (ref_op_t){PCR_SHARE_COMMIT, 0, {11, 12, 13, 14}, 4, 0};
    ops[1] = (ref_op_t){PCR_SHARE_FORGET, 0, {11, 12, 13, 99, 98}, 5, 2};
    return encode(ops, 2, 0, len);
}

/* Offsets in sample(): header 32, one name (1 + 5), op 0 at 38, its 4 blocks, op 1 at 89. */
#define OP0 38
#define OP1 (OP0 + PCR_SHARE_OP_BYTES + 32)

static void check_reason(const unsigned char *buf, size_t len, size_t max_blocks, const char *want)
{
    pcr_share_batch_t b;
    const char *why = pcr_share_decode(buf, len, max_blocks, &b);
    PCR_CHECK_STR(why, want);
    /* A rejected batch yields no op. */
    uint64_t blocks[MAXB];
    pcr_share_op_t op;
    PCR_CHECK_EQ_INT(pcr_share_next(&b, blocks, &op), 0);
}

static void test_every_truncation_is_rejected(void)
{
    size_t len;
    unsigned char *buf = sample(&len);
    PCR_CHECK_EQ_INT(len, OP1 + PCR_SHARE_OP_BYTES + 16);
    for (size_t n = 0; n < len; n++) {
        /* A copy of exactly n bytes, so ASan sees any read past them. */
        unsigned char *cut = malloc(n ? n : 1);
        memcpy(cut, buf, n);
        pcr_share_batch_t b;
        PCR_CHECK(pcr_share_decode(cut, n, MAXB, &b) != NULL);
        free(cut);
    }
    check_reason(buf, 10, MAXB, "shorter than the 32-byte header");
    check_reason(buf, OP0 + 3, MAXB, "an op runs past the end");
    check_reason(buf, OP0 + PCR_SHARE_OP_BYTES + 31, MAXB, "an op's blocks run past the end");
    check_reason(buf, 35, MAXB, "backend names run past the end");
    /* And one byte too many. */
    unsigned char *more = malloc(len + 1);
    memcpy(more, buf, len);
    more[len] = 0;
    check_reason(more, len + 1, MAXB, "bytes after the last op");
    free(more);
    free(buf);
}

static void test_each_field_checked(void)
{
    size_t len;
    unsigned char *orig = sample(&len), *buf = malloc(len);
#define BREAK(stmt, max_blocks, reason) do { \
    memcpy(buf, orig, len); stmt; check_reason(buf, len, max_blocks, reason); } while (0)
    BREAK(buf[0] = 'P', MAXB, "no \"pcr\" magic: not a pcrouter batch");
    BREAK(buf[3] = 2, MAXB, "a version this pcrouter does not read");
    BREAK(buf[4] = 4, MAXB, "unknown flags");
    BREAK(buf[5] = 1, MAXB, "reserved byte not 0");
    BREAK(put32(buf + 8, 0), MAXB, "block_bytes 0");
    BREAK(buf[4] = PCR_SHARE_F_SNAPSHOT, MAXB, "a snapshot holds an op other than commit");
    BREAK(buf[33] = 'x' - 0x60, MAXB, "a backend name empty or holding a control character");
    BREAK(buf[32] = 0, MAXB, "a backend name empty or holding a control character");
    BREAK(buf[OP0] = 3, MAXB, "unknown op");
    BREAK(buf[OP0] = 0, MAXB, "unknown op");
    BREAK(buf[OP0 + 1] = 1, MAXB, "an op names a backend the batch does not list");
    BREAK(put32(buf + OP0 + 3, 1), MAXB, "an op shares more blocks than the previous key has");
    BREAK(put32(buf + OP1 + 3, 5), MAXB, "an op shares more blocks than the previous key has");
    BREAK((put32(buf + OP1 + 3, 0), put32(buf + OP1 + 7, 0), buf[OP1 + 11] = 0), MAXB,
          "an op with an empty key");
    BREAK(buf[OP1 + 11] = 6, MAXB, "a forget from past its key's end");
    BREAK((void)0, 4, "a key longer than routing.max_prefix_bytes allows");
    /* A count of ops far larger than the bytes: stopped by the bytes, not trusted. */
    BREAK(put32(buf + 12, 0xFFFFFFFFu), MAXB, "an op runs past the end");
    BREAK(put32(buf + OP0 + 7, 0xFFFFFFFFu), MAXB, "a key longer than routing.max_prefix_bytes allows");
    BREAK(put32(buf + OP0 + 7, 0xFFFFFFFFu), (size_t)1 << 40, "an op's blocks run past the end");
#undef BREAK
    free(buf);
    free(orig);
}

/* Any single byte changed: rejected, or still a batch whose every op reads within bounds. */
static void test_flipped_bytes_never_read_out_of_bounds(void)
{
    size_t len;
    unsigned char *orig = sample(&len);
    for (size_t i = 0; i < len; i++) {
        for (int v = 0; v < 256; v += 17) {
            unsigned char *buf = malloc(len);
            memcpy(buf, orig, len);
            buf[i] = (unsigned char)v;
            pcr_share_batch_t b;
            if (pcr_share_decode(buf, len, MAXB, &b) == NULL) {
                uint64_t blocks[MAXB];
                pcr_share_op_t op;
                uint32_t n = 0;
                while (pcr_share_next(&b, blocks, &op) == 1) {
                    PCR_CHECK(op.nblocks >= 1 && op.nblocks <= MAXB);
                    PCR_CHECK(op.name < b.nnames);
                    n++;
                }
                PCR_CHECK_EQ_INT(n, b.nops);
            }
            free(buf);
        }
    }
    free(orig);
}

int main(void)
{
    PCR_RUN(test_round_trip);
    PCR_RUN(test_front_coding_shares_leading_blocks);
    PCR_RUN(test_empty_batch_and_snapshot_flags);
    PCR_RUN(test_random_round_trips);
    PCR_RUN(test_encoder_refuses_bad_input);
    PCR_RUN(test_a_slot_renamed_between_batches);
    PCR_RUN(test_every_truncation_is_rejected);
    PCR_RUN(test_each_field_checked);
    PCR_RUN(test_flipped_bytes_never_read_out_of_bounds);
    return pcr_test_done();
}
