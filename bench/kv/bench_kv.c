/* bench_kv.c: how fast router/kv/kv_decode.cpp reads vLLM's KV-event payloads
 * (`make bench-kv`), against msgpack-c's own C unpacker building its object tree from the same
 * bytes in the same run (the baseline: what decoding costs before any of our checks).
 *
 * The payloads are what a busy pod sends: batches of 64 events, 3 stored for each removed, a
 * stored event carrying 1 to 4 blocks of 16 tokens, 64-bit hashes above 2^63, in vLLM's
 * positional encoding and in its map encoding. Each figure is the median of 7 runs of about
 * 0.3 s; the target is 1M events per second on one core. */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "kv/kv_decode.h"

#define EVENTS 64
#define BATCHES 256
#define RUNS 7

static void str(msgpack_packer *pk, const char *s) { msgpack_pack_str_with_body(pk, s, strlen(s)); }

/* One batch of EVENTS events; `as_map` as vLLM 0.26 encodes them. */
static void make_batch(msgpack_sbuffer *sb, int as_map, double ts)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, ts);
    msgpack_pack_array(&pk, EVENTS);
    for (int i = 0; i < EVENTS; i++) {
        int stored = i % 4 != 3;
        unsigned blocks = 1 + (unsigned)(next() % 4);
        if (stored) {
            if (as_map) {
                msgpack_pack_map(&pk, 7);
                str(&pk, "type");
            } else {
                msgpack_pack_array(&pk, 7);
            }
            str(&pk, "BlockStored");
            if (as_map)
                str(&pk, "block_hashes");
            msgpack_pack_array(&pk, blocks);
            for (unsigned b = 0; b < blocks; b++)
                msgpack_pack_uint64(&pk, next() | 1ull << 63);
            if (as_map)
                str(&pk, "parent_block_hash");
            msgpack_pack_uint64(&pk, next());
            if (as_map)
                str(&pk, "token_ids");
            msgpack_pack_array(&pk, blocks * 16);
            for (unsigned t = 0; t < blocks * 16; t++)
                msgpack_pack_uint32(&pk, (uint32_t)(next() % 128000));
            if (as_map)
                str(&pk, "block_size");
            msgpack_pack_uint32(&pk, 16);
            if (as_map)
                str(&pk, "lora_id");
            msgpack_pack_nil(&pk);
            if (as_map)
                str(&pk, "medium");
            str(&pk, "GPU");
        } else {
            if (as_map) {
                msgpack_pack_map(&pk, 3);
                str(&pk, "type");
            } else {
                msgpack_pack_array(&pk, 3);
            }
            str(&pk, "BlockRemoved");
            if (as_map)
                str(&pk, "block_hashes");
            msgpack_pack_array(&pk, blocks);
            for (unsigned b = 0; b < blocks; b++)
                msgpack_pack_uint64(&pk, next());
            if (as_map)
                str(&pk, "medium");
            str(&pk, "GPU");
        }
    }
    msgpack_pack_uint32(&pk, 0);
}

/* Events per second of one pass of `fn` over every batch, about 0.3 s. */
static double rate(msgpack_sbuffer *sb, int (*fn)(const msgpack_sbuffer *))
{
    long events = 0;
    double t0 = now_s(), t;
    do {
        for (int b = 0; b < BATCHES; b++)
            events += fn(&sb[b]);
        t = now_s();
    } while (t - t0 < 0.3);
    return events / (t - t0);
}

/* The two decoders in turns, RUNS runs each, so a noisy moment falls on both; the medians. */
static void measure(msgpack_sbuffer *sb, int (*a)(const msgpack_sbuffer *),
                    int (*b)(const msgpack_sbuffer *), double *ma, double *mb)
{
    double ra[RUNS], rb[RUNS];
    for (int r = 0; r < RUNS; r++) {
        ra[r] = rate(sb, a);
        rb[r] = rate(sb, b);
    }
    *ma = median(ra, RUNS);
    *mb = median(rb, RUNS);
}

static pcr_kv_decoder_t *dec;

static int ours(const msgpack_sbuffer *sb)
{
    pcr_kv_batch_t b;
    char err[160];
    if (pcr_kv_decode(dec, sb->data, sb->size, &b, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_kv: a batch was refused: %s\n", err);
        exit(1);
    }
    return (int)b.nevents;
}

static int msgpack_tree(const msgpack_sbuffer *sb)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int n = 0;
    if (msgpack_unpack_next(&u, sb->data, sb->size, &off) == MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_ARRAY && u.data.via.array.size >= 2)
        n = (int)u.data.via.array.ptr[1].via.array.size;
    msgpack_unpacked_destroy(&u);
    return n;
}

int main(void)
{
    dec = pcr_kv_decoder_new();
    if (dec == NULL)
        return 1;
    printf("| encoding | bytes/event | kv_decode, events/s | msgpack-c tree, events/s | ratio |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    for (int as_map = 0; as_map < 2; as_map++) {
        msgpack_sbuffer sb[BATCHES];
        size_t bytes = 0;
        for (int b = 0; b < BATCHES; b++) {
            msgpack_sbuffer_init(&sb[b]);
            make_batch(&sb[b], as_map, 1000.0 + b);
            bytes += sb[b].size;
        }
        double mine, base;
        measure(sb, ours, msgpack_tree, &mine, &base);
        printf("| %s | %.0f | %.2fM | %.2fM | %.2fx |\n", as_map ? "map (vLLM 0.26)" : "array (vLLM 0.23)",
               (double)bytes / (BATCHES * EVENTS), mine / 1e6, base / 1e6, mine / base);
        for (int b = 0; b < BATCHES; b++)
            msgpack_sbuffer_destroy(&sb[b]);
    }
    pcr_kv_decoder_free(dec);
    return 0;
}
