/* bench/sim/synth.c: id -> text, see synth.h.
 *
 * Words come from a small fixed vocabulary, picked by splitmix64 seeded with the id; a block
 * is words separated by single spaces, the last word cut at the block's end. */
#include "synth.h"

#include <string.h>

static const char *const words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on",
    "be", "at", "by", "this", "had", "not", "are", "but", "from", "or", "have", "an", "they",
    "which", "one", "you", "were", "all", "we", "when", "there", "can", "model", "cache",
    "prefix", "token", "router", "request", "block", "memory", "stream", "answer", "question",
    "system", "user", "assistant", "tool", "result", "value", "number", "time", "people",
    "water", "light", "river", "mountain", "city", "book", "story", "garden", "window",
};
#define NWORDS (sizeof(words) / sizeof(words[0]))

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void pcr_synth_block(uint64_t id, char *out)
{
    uint64_t state = id ^ 0x5ca1ab1e0ddba11ULL;
    size_t pos = 0;
    while (pos < PCR_SYNTH_BLOCK_BYTES) {
        uint64_t r = splitmix64(&state);
        /* Four words per draw: 16 bits each pick one. */
        for (int k = 0; k < 4 && pos < PCR_SYNTH_BLOCK_BYTES; k++) {
            const char *w = words[((r >> (16 * k)) & 0xffff) % NWORDS];
            size_t wl = strlen(w);
            if (pos) {
                out[pos++] = ' ';
                if (pos == PCR_SYNTH_BLOCK_BYTES)
                    break;
            }
            if (wl > PCR_SYNTH_BLOCK_BYTES - pos)
                wl = PCR_SYNTH_BLOCK_BYTES - pos;
            memcpy(out + pos, w, wl);
            pos += wl;
        }
    }
}

size_t pcr_synth_prompt(const uint64_t *ids, size_t n, size_t input_tokens, uint64_t fill_id,
                        char *out)
{
    size_t len = pcr_synth_prompt_len(input_tokens);
    char block[PCR_SYNTH_BLOCK_BYTES];
    size_t pos = 0;
    for (size_t i = 0; pos < len; i++) {
        uint64_t id = i < n ? ids[i] : (fill_id * 0x100000001b3ULL) ^ (i + 0x8000000000000000ULL);
        size_t take = len - pos < PCR_SYNTH_BLOCK_BYTES ? len - pos : PCR_SYNTH_BLOCK_BYTES;
        if (take == PCR_SYNTH_BLOCK_BYTES) {
            pcr_synth_block(id, out + pos);
        } else {
            pcr_synth_block(id, block);
            memcpy(out + pos, block, take);
        }
        pos += take;
    }
    return len;
}
