/* test_kv_decode.c: router/kv/kv_decode.cpp, vLLM's KV-event payloads. The payloads are built
 * with msgpack-c's C packer, as vLLM's msgspec would encode them: both encodings, both hash
 * forms, then every way a payload can be wrong. */
#include <msgpack.h>
#include <stdlib.h>
#include <xxhash.h>

#include "kv/kv_decode.h"
#include "pcr/common.h"
#include "pcr_test.h"

static msgpack_sbuffer sb;
static msgpack_packer pk;

static void begin(void)
{
    msgpack_sbuffer_destroy(&sb);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
}

static void str(const char *s) { msgpack_pack_str_with_body(&pk, s, strlen(s)); }

static void u64s(const uint64_t *v, size_t n)
{
    msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint64(&pk, v[i]);
}

static void tokens(uint32_t first, size_t n)
{
    msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint32(&pk, first + (uint32_t)i);
}

static pcr_kv_decoder_t *dec;
static pcr_kv_batch_t batch;
static char err[160];

static int decode(void) { return pcr_kv_decode(dec, sb.data, sb.size, &batch, err, sizeof(err)); }

static const uint64_t H[2] = {0xfedcba9876543210ull, 7}; /* one past 2^63, as vLLM's are */

/* vLLM up to 0.23: positional arrays, the tag first. */
static void test_array_encoding(void)
{
    begin();
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1733.5);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_array(&pk, 7); /* BlockStored, up to medium */
    str("BlockStored");
    u64s(H, 2);
    msgpack_pack_nil(&pk);
    tokens(100, 8);
    msgpack_pack_uint32(&pk, 4);
    msgpack_pack_nil(&pk);
    str("GPU");
    msgpack_pack_array(&pk, 3);
    str("BlockRemoved");
    u64s(H + 1, 1);
    str("CPU");
    msgpack_pack_array(&pk, 1);
    str("AllBlocksCleared");
    msgpack_pack_uint32(&pk, 1);
    PCR_CHECK_EQ_INT(decode(), 0);
    PCR_CHECK_STR(err, "");
    PCR_CHECK_EQ_INT(batch.nevents, 3);
    PCR_CHECK_EQ_INT(batch.unknown, 0);
    PCR_CHECK(batch.ts == 1733.5);
    PCR_CHECK_EQ_INT(batch.has_rank, 1);
    PCR_CHECK_EQ_INT(batch.dp_rank, 1);
    const pcr_kv_event_t *e = pcr_kv_decoded_event(dec, 0);
    PCR_CHECK(e != NULL && e->kind == PCR_KV_STORED);
    if (e != NULL) {
        PCR_CHECK_EQ_INT(e->nhashes, 2);
        PCR_CHECK_EQ_U64(e->hashes[0], H[0]);
        PCR_CHECK_EQ_U64(e->hashes[1], H[1]);
        PCR_CHECK_EQ_INT(e->has_parent, 0);
        PCR_CHECK_EQ_INT(e->block_size, 4);
        PCR_CHECK_EQ_INT(e->ntokens, 8);
        PCR_CHECK_EQ_INT(e->tokens[7], 107);
        PCR_CHECK_EQ_INT(e->medium, PCR_KV_MEDIUM_GPU);
        PCR_CHECK_EQ_INT(e->has_lora, 0);
        PCR_CHECK_EQ_INT(e->group_idx, -1);
    }
    e = pcr_kv_decoded_event(dec, 1);
    PCR_CHECK(e != NULL && e->kind == PCR_KV_REMOVED && e->nhashes == 1 && e->hashes[0] == 7 &&
              e->medium == PCR_KV_MEDIUM_CPU);
    e = pcr_kv_decoded_event(dec, 2);
    PCR_CHECK(e != NULL && e->kind == PCR_KV_CLEARED && e->nhashes == 0);
    PCR_CHECK(pcr_kv_decoded_event(dec, 3) == NULL);
}

/* Trailing fields may be absent; later ones (lora_name, extra_keys, group_idx, the cache
 * spec) are taken or skipped; a batch without its rank is whole. */
static void test_array_trailing_fields(void)
{
    begin();
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint32(&pk, 5);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_array(&pk, 5);
    str("BlockStored");
    u64s(H, 1);
    msgpack_pack_uint64(&pk, 42);
    tokens(0, 16);
    msgpack_pack_uint32(&pk, 16);
    msgpack_pack_array(&pk, 13);
    str("BlockStored");
    u64s(H + 1, 1);
    msgpack_pack_nil(&pk);
    tokens(0, 2);
    msgpack_pack_uint32(&pk, 2);
    msgpack_pack_int64(&pk, 3);     /* lora_id */
    msgpack_pack_nil(&pk);          /* medium */
    str("adapter");                 /* lora_name */
    msgpack_pack_array(&pk, 1);     /* extra_keys: anything */
    msgpack_pack_map(&pk, 1);
    str("mm");
    str("x");
    msgpack_pack_uint32(&pk, 2);    /* group_idx */
    str("full_attention");
    msgpack_pack_nil(&pk);
    msgpack_pack_true(&pk);         /* a field this version does not know */
    PCR_CHECK_EQ_INT(decode(), 0);
    PCR_CHECK_STR(err, "");
    PCR_CHECK_EQ_INT(batch.nevents, 2);
    PCR_CHECK_EQ_INT(batch.has_rank, 0);
    PCR_CHECK(batch.ts == 5.0);
    const pcr_kv_event_t *e = pcr_kv_decoded_event(dec, 0);
    PCR_CHECK(e != NULL && e->has_parent && e->parent == 42 && e->medium == PCR_KV_MEDIUM_NONE);
    e = pcr_kv_decoded_event(dec, 1);
    PCR_CHECK(e != NULL && e->has_lora && e->lora_id == 3 && e->group_idx == 2);
}

/* vLLM 0.26 on: maps keyed by "type", same names, unknown keys skipped whatever they hold,
 * "type" anywhere in the map. */
static void test_map_encoding(void)
{
    begin();
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, 1.0);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_map(&pk, 7);
    str("block_hashes");
    u64s(H, 2);
    str("future_field");
    msgpack_pack_map(&pk, 1);
    str("deep");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_nil(&pk);
    msgpack_pack_float(&pk, 1.5f);
    str("type");
    str("BlockStored");
    str("token_ids");
    tokens(7, 4);
    str("block_size");
    msgpack_pack_uint32(&pk, 2);
    str("parent_block_hash");
    msgpack_pack_uint64(&pk, 9);
    str("medium");
    str("CPU");
    msgpack_pack_map(&pk, 2);
    str("type");
    str("BlockRemoved");
    str("block_hashes");
    u64s(H, 1);
    msgpack_pack_nil(&pk);
    PCR_CHECK_EQ_INT(decode(), 0);
    PCR_CHECK_STR(err, "");
    PCR_CHECK_EQ_INT(batch.nevents, 2);
    const pcr_kv_event_t *e = pcr_kv_decoded_event(dec, 0);
    PCR_CHECK(e != NULL && e->kind == PCR_KV_STORED && e->nhashes == 2 && e->ntokens == 4 &&
              e->tokens[0] == 7 && e->parent == 9 && e->medium == PCR_KV_MEDIUM_CPU);
    e = pcr_kv_decoded_event(dec, 1);
    PCR_CHECK(e != NULL && e->kind == PCR_KV_REMOVED && e->hashes[0] == H[0]);
}

/* The batch as a map, as vLLM's publisher sends it where EventBatch is not array_like:
 * {"ts", "events", "data_parallel_rank"}, keys in any order, unknown ones skipped (whatever
 * they hold), events in either encoding. */
static void test_map_batch(void)
{
    begin();
    msgpack_pack_map(&pk, 4);
    str("data_parallel_rank");
    msgpack_pack_uint32(&pk, 3);
    str("future");
    msgpack_pack_map(&pk, 1);
    str("x");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_nil(&pk);
    str("events");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_map(&pk, 6);
    str("type");
    str("BlockStored");
    str("block_hashes");
    u64s(H, 1);
    str("parent_block_hash");
    msgpack_pack_nil(&pk);
    str("token_ids");
    tokens(40, 4);
    str("block_size");
    msgpack_pack_uint32(&pk, 4);
    str("lora_name");
    msgpack_pack_nil(&pk);
    msgpack_pack_array(&pk, 1);
    str("AllBlocksCleared");
    str("ts");
    msgpack_pack_double(&pk, 12.25);
    PCR_CHECK_EQ_INT(decode(), 0);
    PCR_CHECK_STR(err, "");
    PCR_CHECK_EQ_INT(batch.nevents, 2);
    PCR_CHECK(batch.ts == 12.25 && batch.has_rank && batch.dp_rank == 3);
    const pcr_kv_event_t *e = pcr_kv_decoded_event(dec, 0);
    PCR_CHECK(e != NULL && e->kind == PCR_KV_STORED && e->nhashes == 1 && e->hashes[0] == H[0] &&
              e->ntokens == 4 && e->tokens[3] == 43 && !e->has_parent);
    e = pcr_kv_decoded_event(dec, 1);
    PCR_CHECK(e != NULL && e->kind == PCR_KV_CLEARED);
    /* A rank of nil, and no ts at all: still a batch. */
    begin();
    msgpack_pack_map(&pk, 2);
    str("events");
    msgpack_pack_array(&pk, 0);
    str("data_parallel_rank");
    msgpack_pack_nil(&pk);
    PCR_CHECK_EQ_INT(decode(), 0);
    PCR_CHECK(batch.nevents == 0 && !batch.has_rank);
}

/* Bytes hashes are folded to 64 bits: equal bytes, equal values; a parent in bytes too. */
static void test_bytes_hashes(void)
{
    static const char a[32] = "0123456789abcdef0123456789abcdef", b[32] = "x";
    begin();
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_array(&pk, 5);
    str("BlockStored");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_bin_with_body(&pk, b, sizeof(b));
    msgpack_pack_bin_with_body(&pk, a, sizeof(a));
    tokens(0, 1);
    msgpack_pack_uint32(&pk, 1);
    msgpack_pack_array(&pk, 2);
    str("BlockRemoved");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_bin_with_body(&pk, a, sizeof(a));
    msgpack_pack_bin_with_body(&pk, b, sizeof(b));
    PCR_CHECK_EQ_INT(decode(), 0);
    const pcr_kv_event_t *s = pcr_kv_decoded_event(dec, 0), *r = pcr_kv_decoded_event(dec, 1);
    PCR_CHECK(s != NULL && r != NULL);
    if (s != NULL && r != NULL) {
        PCR_CHECK_EQ_U64(s->hashes[0], XXH3_64bits(b, sizeof(b)));
        PCR_CHECK_EQ_U64(s->parent, XXH3_64bits(a, sizeof(a)));
        PCR_CHECK_EQ_U64(r->hashes[0], s->parent);
        PCR_CHECK_EQ_U64(r->hashes[1], s->hashes[0]);
        PCR_CHECK(r->hashes[0] != r->hashes[1]);
    }
}

/* A type this decoder does not know is skipped and counted; the others stay. */
static void test_unknown_event_type(void)
{
    begin();
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_array(&pk, 3);
    str("BlockMoved");
    u64s(H, 2);
    tokens(0, 3);
    msgpack_pack_map(&pk, 2);
    str("type");
    str("SomethingNew");
    str("block_hashes");
    u64s(H, 1);
    msgpack_pack_array(&pk, 1);
    str("AllBlocksCleared");
    PCR_CHECK_EQ_INT(decode(), 0);
    PCR_CHECK_EQ_INT(batch.nevents, 1);
    PCR_CHECK_EQ_INT(batch.unknown, 2);
    const pcr_kv_event_t *e = pcr_kv_decoded_event(dec, 0);
    PCR_CHECK(e != NULL && e->kind == PCR_KV_CLEARED);
}

/* One event inside an otherwise good batch. */
static int decode_one(void (*event)(void))
{
    begin();
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_array(&pk, 1);
    str("AllBlocksCleared");
    event();
    return decode();
}

static void ev_count_mismatch(void)
{
    msgpack_pack_array(&pk, 5);
    str("BlockStored");
    u64s(H, 2);
    msgpack_pack_nil(&pk);
    tokens(0, 7);
    msgpack_pack_uint32(&pk, 4);
}
static void ev_hash_string(void)
{
    msgpack_pack_array(&pk, 2);
    str("BlockRemoved");
    msgpack_pack_array(&pk, 1);
    str("abc");
}
static void ev_block_size_zero(void)
{
    msgpack_pack_array(&pk, 5);
    str("BlockStored");
    u64s(H, 1);
    msgpack_pack_nil(&pk);
    tokens(0, 0);
    msgpack_pack_uint32(&pk, 0);
}
static void ev_negative_token(void)
{
    msgpack_pack_array(&pk, 5);
    str("BlockStored");
    u64s(H, 1);
    msgpack_pack_nil(&pk);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_int64(&pk, -1);
    msgpack_pack_uint32(&pk, 1);
}
static void ev_no_type(void)
{
    msgpack_pack_map(&pk, 1);
    str("block_hashes");
    u64s(H, 1);
}
static void ev_tag_not_string(void)
{
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint32(&pk, 1);
}
static void ev_stored_without_tokens(void)
{
    msgpack_pack_array(&pk, 2);
    str("BlockStored");
    u64s(H, 1);
}
static void ev_scalar(void) { msgpack_pack_uint32(&pk, 3); }
static void ev_hashes_twice(void)
{
    msgpack_pack_map(&pk, 3);
    str("type");
    str("BlockRemoved");
    str("block_hashes");
    u64s(H, 1);
    str("block_hashes");
    u64s(H, 1);
}
static void ev_int_key(void)
{
    msgpack_pack_map(&pk, 1);
    msgpack_pack_uint32(&pk, 1);
    str("BlockRemoved");
}

/* Each malformed event fails the whole batch, says which event and why, and leaves nothing:
 * the good event before it is not handed out either. */
static void test_malformed_events(void)
{
    static const struct {
        void (*fn)(void);
        const char *err;
    } cases[] = {
        {ev_count_mismatch, "event 1: BlockStored: 7 tokens for 2 blocks of 4"},
        {ev_hash_string, "event 1: a block hash must be an integer or bytes"},
        {ev_block_size_zero, "event 1: block_size must be an integer from 1 to 65536"},
        {ev_negative_token, "event 1: a token id must be an integer from 0 to 2^32-1"},
        {ev_no_type, "event 1: an event without its type"},
        {ev_tag_not_string, "event 1: an event array must start with its type"},
        {ev_stored_without_tokens, "event 1: BlockStored without token_ids"},
        {ev_scalar, "an event must be an array or a map"},
        {ev_hashes_twice, "event 1: block_hashes given twice"},
        {ev_int_key, "event 1: a map key must be a string"},
    };
    for (size_t i = 0; i < PCR_ARRAY_SIZE(cases); i++) {
        PCR_CHECK_EQ_INT(decode_one(cases[i].fn), PCR_ERR_PARSE);
        PCR_CHECK_STR(err, cases[i].err);
        PCR_CHECK_EQ_INT(batch.nevents, 0);
        PCR_CHECK(pcr_kv_decoded_event(dec, 0) == NULL);
    }
}

/* Payloads that are not batches, cut short, padded, nested too deep or too many. */
static void test_malformed_payloads(void)
{
    begin();
    msgpack_pack_map(&pk, 0);
    PCR_CHECK_EQ_INT(decode(), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "a batch map without \"events\"");
    begin();
    str("batch");
    PCR_CHECK_EQ_INT(decode(), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "the payload is not an array [ts, events, rank]");
    /* The map form: a key given twice, events that are not an array, a key not a string. */
    begin();
    msgpack_pack_map(&pk, 2);
    str("events");
    msgpack_pack_array(&pk, 0);
    str("events");
    msgpack_pack_array(&pk, 0);
    PCR_CHECK_EQ_INT(decode(), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "the batch's \"events\" given twice");
    begin();
    msgpack_pack_map(&pk, 1);
    str("events");
    msgpack_pack_map(&pk, 0);
    PCR_CHECK_EQ_INT(decode(), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "the batch's events must be an array");
    begin();
    msgpack_pack_map(&pk, 1);
    msgpack_pack_uint32(&pk, 1);
    msgpack_pack_array(&pk, 0);
    PCR_CHECK_EQ_INT(decode(), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "a map key must be a string");
    begin();
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint32(&pk, 0);
    PCR_CHECK_EQ_INT(decode(), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "a batch is [ts, events, rank], not 1 items");
    begin();
    msgpack_pack_array(&pk, 2);
    str("now");
    PCR_CHECK_EQ_INT(decode(), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "the batch's ts must be a number");
    /* Cut short: a whole batch less its last byte. */
    decode_one(ev_count_mismatch);
    begin();
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_array(&pk, 1);
    str("AllBlocksCleared");
    PCR_CHECK_EQ_INT(pcr_kv_decode(dec, sb.data, sb.size - 1, &batch, err, sizeof(err)),
                     PCR_ERR_PARSE);
    PCR_CHECK(strstr(err, "ends inside") != NULL);
    PCR_CHECK_EQ_INT(pcr_kv_decode(dec, sb.data, 0, &batch, err, sizeof(err)), PCR_ERR_PARSE);
    /* A second object after the batch. */
    msgpack_pack_nil(&pk);
    PCR_CHECK_EQ_INT(decode(), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "1 bytes after the batch");
    /* An array header declaring 2^32-1 elements in 5 bytes: refused when the bytes run out,
     * with nothing allocated for the declared size (ASan would report a 96 GiB malloc). */
    static const unsigned char huge[] = {0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff};
    PCR_CHECK_EQ_INT(pcr_kv_decode(dec, huge, sizeof(huge), &batch, err, sizeof(err)),
                     PCR_ERR_PARSE);
    /* Nesting in a skipped field: bounded. */
    begin();
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    str("future");
    for (int i = 0; i < 40; i++)
        msgpack_pack_array(&pk, 1);
    msgpack_pack_nil(&pk);
    PCR_CHECK_EQ_INT(decode(), PCR_ERR_TOO_LARGE);
    PCR_CHECK_STR(err, "event 0: more than 16 levels of nesting");
    /* More events than a batch may hold. */
    begin();
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_array(&pk, PCR_KV_MAX_EVENTS + 1);
    for (unsigned i = 0; i <= PCR_KV_MAX_EVENTS; i++) {
        msgpack_pack_array(&pk, 1);
        str("AllBlocksCleared");
    }
    PCR_CHECK_EQ_INT(decode(), PCR_ERR_TOO_LARGE);
    PCR_CHECK_STR(err, "more than 65536 events in a batch");
    /* The decoder is whole again after all that. */
    test_array_encoding();
}

static void test_sequence_frames(void)
{
    static const unsigned char seven[8] = {0, 0, 0, 0, 0, 0, 0, 7};
    static const unsigned char end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    static const unsigned char big[8] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
    int64_t s = 0;
    PCR_CHECK_EQ_INT(pcr_kv_seq(seven, 8, &s), 0);
    PCR_CHECK_EQ_INT(s, 7);
    PCR_CHECK_EQ_INT(pcr_kv_seq(end, 8, &s), 0);
    PCR_CHECK_EQ_INT(s, -1);
    PCR_CHECK_EQ_INT(pcr_kv_seq(big, 8, &s), 0);
    PCR_CHECK_EQ_U64((uint64_t)s, 0x0102030405060708ull);
    PCR_CHECK_EQ_INT(pcr_kv_seq(seven, 7, &s), PCR_ERR_PARSE);
    PCR_CHECK_EQ_INT(pcr_kv_seq(seven, 0, &s), PCR_ERR_PARSE);
}

int main(void)
{
    msgpack_sbuffer_init(&sb);
    dec = pcr_kv_decoder_new();
    PCR_CHECK(dec != NULL);
    PCR_RUN(test_array_encoding);
    PCR_RUN(test_array_trailing_fields);
    PCR_RUN(test_map_encoding);
    PCR_RUN(test_map_batch);
    PCR_RUN(test_bytes_hashes);
    PCR_RUN(test_unknown_event_type);
    PCR_RUN(test_malformed_events);
    PCR_RUN(test_malformed_payloads);
    PCR_RUN(test_sequence_frames);
    pcr_kv_decoder_free(dec);
    pcr_kv_decoder_free(NULL);
    msgpack_sbuffer_destroy(&sb);
    return pcr_test_done();
}
