/* bench/sim/replay_trace.h: Mooncake JSONL traces in memory, and the LRU ceiling.
 *
 * Row: {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]},
 * one JSON object per line (cJSON per line). The ceiling is the prefix hit rate of one LRU
 * cache as big as all pods together, fed the same synthesised prompts in arrival order and
 * counted exactly as a pod counts (kvcache.c, 16-token blocks, tokens). */
#ifndef PCR_BENCH_REPLAY_TRACE_H
#define PCR_BENCH_REPLAY_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"

typedef struct {
    double timestamp_ms;
    size_t input_length, output_length;
    uint64_t *hash_ids;
    size_t nids;
} rt_row_t;

typedef struct {
    rt_row_t *rows;
    size_t n;
} rt_trace_t;

/* Reads rows [skip, skip+limit) (limit 0: all). Returns 0, or -1 with a message on stderr
 * naming the file and line. */
int rt_trace_load(rt_trace_t *t, const char *path, size_t skip, size_t limit);
void rt_trace_dispose(rt_trace_t *t);

/* The prompt text of row i (synth.c); *len gets its length. Caller frees. NULL when out of
 * memory. */
char *rt_prompt(const rt_trace_t *t, size_t i, size_t *len);

/* Hit rate (cached tokens / prompt tokens) of one LRU cache of capacity_tokens over the
 * trace; *hits and *queries get the token counts. -1 when out of memory. With a capacity
 * schedule (nph > 0; kvcache.h) the cache's usable part follows it from the first row's
 * timestamp, as vllm_sim's pods follow theirs from their first request: what a pool whose
 * capacity comes and goes could at best have hit. */
double rt_ceiling(const rt_trace_t *t, uint64_t capacity_tokens, const pcr_kvcache_phase_t *ph,
                  size_t nph, uint64_t *hits, uint64_t *queries);

/* Sorts v[0..n) ascending; then rt_percentile gives its p-th percentile (nearest rank), NAN
 * when n is 0. Shared by replay and routing_offline, so both report the same figure. */
void rt_sort(double *v, size_t n);
double rt_percentile(const double *sorted, size_t n, double p);

/* Whether row i asks for a whole answer ("stream": false) when `fraction` of the rows do:
 * drawn from the row's index (splitmix64), so that every run, the replayer's and
 * routing_offline's alike, picks the same rows. */
int rt_unstreamed(size_t i, double fraction);

#endif
