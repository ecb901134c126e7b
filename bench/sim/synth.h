/* bench/sim/synth.h: deterministic prompt text for trace rows that carry only block ids.
 *
 * A Mooncake row names its prompt by `hash_ids`, one per 512-token block, with no text. The
 * replayer turns each id into exactly PCR_SYNTH_BLOCK_BYTES bytes (512 tokens of 4 bytes, the
 * simulator's token) of lowercase words and spaces derived from the id alone, and cuts the
 * prompt to input_length tokens. So equal id prefixes give equal text prefixes, each trace
 * block is exactly 32 simulator blocks, and the text needs no JSON escaping.
 * No I/O, no allocation. */
#ifndef PCR_BENCH_SYNTH_H
#define PCR_BENCH_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#define PCR_SYNTH_BLOCK_TOKENS 512
#define PCR_SYNTH_BLOCK_BYTES (PCR_SYNTH_BLOCK_TOKENS * 4)

/* Writes the PCR_SYNTH_BLOCK_BYTES bytes of block `id` to out (no terminating NUL). */
void pcr_synth_block(uint64_t id, char *out);

/* Bytes of a prompt of `input_tokens` tokens. */
static inline size_t pcr_synth_prompt_len(size_t input_tokens) { return input_tokens * 4; }

/* Writes the prompt of a row: blocks ids[0..n) in order, cut to input_tokens * 4 bytes. When
 * the ids are too few for input_tokens (a malformed row), the rest is filled with blocks named
 * from `fill_id` (pass something unique to the row) so the length still holds.
 * out must hold pcr_synth_prompt_len(input_tokens) bytes; returns that length. */
size_t pcr_synth_prompt(const uint64_t *ids, size_t n, size_t input_tokens, uint64_t fill_id,
                        char *out);

#endif
