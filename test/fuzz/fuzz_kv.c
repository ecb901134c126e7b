/* test/fuzz/fuzz_kv.c: the decoder of vLLM's KV-event payloads (router/kv/kv_decode.cpp) on
 * any bytes, as a pod, a stale publisher or anything that reaches its port could send them.
 *
 * Invariants, beyond "no crash, no leak, no undefined behaviour, no allocation sized by a
 * declared length":
 *   1. A rejected payload yields no event.
 *   2. An accepted one yields events that are whole: a stored event has at least one block
 *      and exactly blocks x block_size tokens, a removed one no token, a cleared one nothing.
 *   3. Written again with msgpack-c's C packer, in either encoding (positional arrays, as
 *      vLLM up to 0.23, and maps, as vLLM 0.26), what was read decodes to the same events.
 *
 * Corpus: test/fuzz/corpus/kv/ (made with python3-msgpack, as msgspec encodes), replayed by
 * `make test`; `make fuzz` runs it under libFuzzer. */
#include <msgpack.h>
#include <string.h>

#include "fuzz.h"
#include "kv/kv_decode.h"

typedef struct {
    pcr_kv_event_t e;
    uint64_t *hashes;
    uint32_t *tokens;
} copy_t;

static void pack_str(msgpack_packer *pk, const char *s) { msgpack_pack_str_with_body(pk, s, strlen(s)); }

static const char *medium_name(pcr_kv_medium_t m)
{
    return m == PCR_KV_MEDIUM_GPU ? "GPU" : m == PCR_KV_MEDIUM_CPU ? "CPU" : "NVMe";
}

/* One field's value, by name; both encodings use it. */
static void pack_field(msgpack_packer *pk, const pcr_kv_event_t *e, const char *f)
{
    if (strcmp(f, "block_hashes") == 0) {
        msgpack_pack_array(pk, e->nhashes);
        for (uint32_t i = 0; i < e->nhashes; i++)
            msgpack_pack_uint64(pk, e->hashes[i]);
    } else if (strcmp(f, "parent_block_hash") == 0) {
        e->has_parent ? msgpack_pack_uint64(pk, e->parent) : msgpack_pack_nil(pk);
    } else if (strcmp(f, "token_ids") == 0) {
        msgpack_pack_array(pk, e->ntokens);
        for (uint32_t i = 0; i < e->ntokens; i++)
            msgpack_pack_uint32(pk, e->tokens[i]);
    } else if (strcmp(f, "block_size") == 0) {
        msgpack_pack_uint32(pk, e->block_size);
    } else if (strcmp(f, "lora_id") == 0) {
        e->has_lora ? msgpack_pack_int64(pk, e->lora_id) : msgpack_pack_nil(pk);
    } else if (strcmp(f, "medium") == 0) {
        e->medium == PCR_KV_MEDIUM_NONE ? msgpack_pack_nil(pk) : pack_str(pk, medium_name(e->medium));
    } else if (strcmp(f, "group_idx") == 0) {
        e->group_idx < 0 ? msgpack_pack_nil(pk) : msgpack_pack_uint32(pk, (uint32_t)e->group_idx);
    }
}

static const char *stored_fields[] = {"block_hashes", "parent_block_hash", "token_ids",
                                      "block_size", "lora_id", "medium", "lora_name",
                                      "extra_keys", "group_idx"};
static const char *removed_fields[] = {"block_hashes", "medium", "group_idx"};

static void pack_event(msgpack_packer *pk, const pcr_kv_event_t *e, int as_map)
{
    const char *tag = e->kind == PCR_KV_STORED ? "BlockStored"
                      : e->kind == PCR_KV_REMOVED ? "BlockRemoved" : "AllBlocksCleared";
    const char **fields = e->kind == PCR_KV_STORED ? stored_fields : removed_fields;
    size_t n = e->kind == PCR_KV_STORED ? 9 : e->kind == PCR_KV_REMOVED ? 3 : 0;
    if (as_map) {
        msgpack_pack_map(pk, 1 + n);
        pack_str(pk, "type");
    } else {
        msgpack_pack_array(pk, 1 + n);
    }
    pack_str(pk, tag);
    for (size_t i = 0; i < n; i++) {
        if (as_map)
            pack_str(pk, fields[i]);
        if (strcmp(fields[i], "lora_name") == 0 || strcmp(fields[i], "extra_keys") == 0)
            msgpack_pack_nil(pk);
        else
            pack_field(pk, e, fields[i]);
    }
}

static void same_event(const pcr_kv_event_t *a, const copy_t *b)
{
    FUZZ_CHECK(a->kind == b->e.kind && a->nhashes == b->e.nhashes && a->ntokens == b->e.ntokens);
    FUZZ_CHECK(a->block_size == b->e.block_size && a->has_parent == b->e.has_parent);
    FUZZ_CHECK(!a->has_parent || a->parent == b->e.parent);
    FUZZ_CHECK(a->has_lora == b->e.has_lora && (!a->has_lora || a->lora_id == b->e.lora_id));
    FUZZ_CHECK(a->group_idx == b->e.group_idx);
    /* An unknown medium name reads back as OTHER, whatever it was. */
    FUZZ_CHECK(a->medium == b->e.medium);
    FUZZ_CHECK(a->nhashes == 0 || memcmp(a->hashes, b->hashes, a->nhashes * 8) == 0);
    FUZZ_CHECK(a->ntokens == 0 || memcmp(a->tokens, b->tokens, a->ntokens * 4) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pcr_kv_decoder_t *d = pcr_kv_decoder_new();
    FUZZ_CHECK(d != NULL);
    pcr_kv_batch_t b;
    char err[160];
    int rc = pcr_kv_decode(d, data, size, &b, err, sizeof(err));
    if (rc != 0) {
        FUZZ_CHECK(b.nevents == 0 && pcr_kv_decoded_event(d, 0) == NULL && err[0] != '\0');
        pcr_kv_decoder_free(d);
        return 0;
    }
    copy_t *c = calloc(b.nevents ? b.nevents : 1, sizeof(*c));
    FUZZ_CHECK(c != NULL);
    for (uint32_t i = 0; i < b.nevents; i++) {
        const pcr_kv_event_t *e = pcr_kv_decoded_event(d, i);
        FUZZ_CHECK(e != NULL);
        if (e->kind == PCR_KV_STORED)
            FUZZ_CHECKF(e->nhashes >= 1 && e->block_size >= 1 && e->block_size <= 65536 &&
                            (uint64_t)e->nhashes * e->block_size == e->ntokens,
                        "%u blocks of %u, %u tokens", e->nhashes, e->block_size, e->ntokens);
        else if (e->kind == PCR_KV_REMOVED)
            FUZZ_CHECK(e->ntokens == 0);
        else
            FUZZ_CHECK(e->kind == PCR_KV_CLEARED && e->nhashes == 0 && e->ntokens == 0);
        c[i].e = *e;
        c[i].hashes = malloc(e->nhashes * 8 + 1);
        c[i].tokens = malloc(e->ntokens * 4 + 1);
        FUZZ_CHECK(c[i].hashes != NULL && c[i].tokens != NULL);
        if (e->nhashes)
            memcpy(c[i].hashes, e->hashes, e->nhashes * 8);
        if (e->ntokens)
            memcpy(c[i].tokens, e->tokens, e->ntokens * 4);
        c[i].e.hashes = c[i].hashes; /* the decoder's own are reused by the next decode */
        c[i].e.tokens = c[i].tokens;
    }
    FUZZ_CHECK(pcr_kv_decoded_event(d, b.nevents) == NULL);
    for (int as_map = 0; as_map < 2; as_map++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_array(&pk, 3);
        msgpack_pack_double(&pk, b.ts);
        msgpack_pack_array(&pk, b.nevents);
        for (uint32_t i = 0; i < b.nevents; i++)
            pack_event(&pk, &c[i].e, as_map);
        b.has_rank ? msgpack_pack_int64(&pk, b.dp_rank) : msgpack_pack_nil(&pk);
        pcr_kv_batch_t again;
        int rc2 = pcr_kv_decode(d, sb.data, sb.size, &again, err, sizeof(err));
        FUZZ_CHECKF(rc2 == 0, "the re-encoded batch was refused: %s", err);
        FUZZ_CHECK(again.nevents == b.nevents && again.unknown == 0);
        FUZZ_CHECK(again.has_rank == b.has_rank && (!b.has_rank || again.dp_rank == b.dp_rank));
        for (uint32_t i = 0; i < b.nevents; i++)
            same_event(pcr_kv_decoded_event(d, i), &c[i]);
        msgpack_sbuffer_destroy(&sb);
    }
    for (uint32_t i = 0; i < b.nevents; i++) {
        free(c[i].hashes);
        free(c[i].tokens);
    }
    free(c);
    pcr_kv_decoder_free(d);
    return 0;
}
