/* router/kv/kv_decode.h: vLLM's KV-cache events, decoded (precise mode's input).
 *
 * A vLLM pod started with --kv-events-config publishes, on a ZMQ PUB socket, messages of three
 * frames: a topic, an 8-byte big-endian sequence number, and a msgpack payload
 * `[ts, events, data_parallel_rank]` (the rank may be absent), or, from a publisher whose
 * EventBatch is not msgspec array_like, the map {"ts", "events", "data_parallel_rank"}
 * (other keys skipped). Each event is BlockStored,
 * BlockRemoved or AllBlocksCleared, in one of two encodings, both accepted because a fleet in
 * the middle of an upgrade sends both:
 *   - up to vLLM 0.23, a positional array with the tag first, trailing fields optional:
 *     ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
 *      lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window],
 *     ["BlockRemoved", block_hashes, medium, group_idx], ["AllBlocksCleared"];
 *   - from vLLM 0.26, a map with "type" and the same field names; unknown keys are skipped.
 * A block hash is an unsigned 64-bit integer or raw bytes; bytes are folded to 64 bits with
 * XXH3, since the router only needs an identity for the pod's block (to undo it at
 * BlockRemoved), never the engine's hash itself.
 *
 * The decoder is strict and all or nothing: a payload is checked whole (types, ranges, token
 * count = blocks x block size, nothing after the payload) before any event is handed out, so a
 * malformed batch changes nothing and is one counted error. Event types it does not know are
 * skipped and counted. It reads through msgpack-c's event-driven parser (the C++ half of the
 * library), which allocates nothing for a declared array size: a 5-byte payload declaring 2^32
 * elements costs nothing, where msgpack-c's C API allocates the declared size first. Memory is
 * bounded by the payload: at most 8 bytes of hash or 4 of token per payload byte. */
#ifndef PCR_KV_DECODE_H
#define PCR_KV_DECODE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    PCR_KV_STORED = 1,
    PCR_KV_REMOVED,
    PCR_KV_CLEARED,
} pcr_kv_kind_t;

typedef enum {
    PCR_KV_MEDIUM_NONE = 0,   /* not said (vLLM before it had the field): the GPU */
    PCR_KV_MEDIUM_GPU,
    PCR_KV_MEDIUM_CPU,        /* offloaded: a hit there is worth less */
    PCR_KV_MEDIUM_OTHER,
} pcr_kv_medium_t;

/* One event. Pointers are the decoder's, valid until its next pcr_kv_decode(). */
typedef struct {
    pcr_kv_kind_t kind;
    pcr_kv_medium_t medium;
    const uint64_t *hashes;    /* the pod's block hashes, in order */
    uint32_t nhashes;
    uint32_t block_size;       /* STORED: tokens per block */
    const uint32_t *tokens;    /* STORED: nhashes x block_size token ids */
    uint32_t ntokens;
    int has_parent;            /* STORED: the block before the first one, or none (a root) */
    uint64_t parent;
    int has_lora;
    int64_t lora_id;
    int32_t group_idx;         /* the KV cache group (hybrid models), -1 when absent */
} pcr_kv_event_t;

typedef struct {
    double ts;                 /* the pod's clock, seconds */
    int has_rank;
    int64_t dp_rank;           /* data-parallel rank of the publishing engine */
    uint32_t nevents;          /* known events, available through pcr_kv_decoded_event() */
    uint32_t unknown;          /* events of a type this decoder does not know, skipped */
} pcr_kv_batch_t;

typedef struct pcr_kv_decoder pcr_kv_decoder_t;

/* A decoder keeps its buffers between payloads (one per subscriber thread). NULL when out of
 * memory. _free(NULL) is a no-op. */
pcr_kv_decoder_t *pcr_kv_decoder_new(void);
void pcr_kv_decoder_free(pcr_kv_decoder_t *d);

/* Decodes one payload. 0 with `out` filled, or PCR_ERR_PARSE (malformed: `err` says where and
 * what, and no event is available), PCR_ERR_TOO_LARGE (past the limits below) or
 * PCR_ERR_NOMEM. */
int pcr_kv_decode(pcr_kv_decoder_t *d, const void *payload, size_t len, pcr_kv_batch_t *out,
                  char *err, size_t errlen);
const pcr_kv_event_t *pcr_kv_decoded_event(const pcr_kv_decoder_t *d, uint32_t i);

/* Limits: more events in one batch, or nesting deeper in a field this decoder skips, is
 * refused. */
#define PCR_KV_MAX_EVENTS 65536u
#define PCR_KV_MAX_DEPTH  16u

/* A sequence-number frame: 8 bytes, big-endian, signed (replay's end marker is -1). 0, or
 * PCR_ERR_PARSE when the frame is not 8 bytes. */
int pcr_kv_seq(const void *frame, size_t len, int64_t *seq);

#ifdef __cplusplus
}
#endif

#endif
