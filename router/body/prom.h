/* router/body/prom.h: reads the Prometheus text a vLLM pod serves at /metrics into a plain sample
 * of the few values the router uses. Pure: no I/O, no allocation, no global state, so it can
 * be unit-tested and fuzzed on bytes alone (router/upstream/scrape.c does the I/O and applies it).
 *
 * The pod is not trusted: every line is bounded, every number read is checked, and a line of
 * a metric the router reads that breaks the text format (or holds a value the router cannot
 * use: NaN, an infinity, a negative count, a usage outside 0..1) is skipped and counted, never
 * half-read. Lines of other metrics are dismissed on their first bytes, unchecked. */
#ifndef PCR_ROUTER_PROM_H
#define PCR_ROUTER_PROM_H

#include <stddef.h>
#include <stdint.h>

/* A longer line is skipped as malformed (vLLM's longest, cache_config_info, is under 1 KiB). */
#define PCR_PROM_MAX_LINE 8192
/* More labels on one sample than this: malformed. */
#define PCR_PROM_MAX_LABELS 64
/* Bounds of vllm:cache_config_info's labels: their product (tokens) times 4 (bytes of
 * canonical prompt per token) stays far inside a uint64_t. */
#define PCR_PROM_MAX_BLOCK_SIZE (1u << 20)
#define PCR_PROM_MAX_GPU_BLOCKS (1ull << 32)

/* Bits of pcr_pod_sample_t.seen: which values the text held (at least one valid line). */
enum {
    PCR_PROM_WAITING      = 1 << 0,
    PCR_PROM_RUNNING      = 1 << 1,
    PCR_PROM_HITS         = 1 << 2,
    PCR_PROM_QUERIES      = 1 << 3,
    PCR_PROM_KV_USAGE     = 1 << 4,
    PCR_PROM_CACHE_CONFIG = 1 << 5,
    PCR_PROM_START_TIME   = 1 << 6,
    PCR_PROM_SUCCESS      = 1 << 7,
};

/* What one scrape found. Every double is finite and >= 0; a value whose bit is not in `seen`
 * is 0. Sums run over label sets (one pod may serve several models or engines). */
typedef struct {
    unsigned seen;
    double num_requests_waiting;   /* vllm:num_requests_waiting, summed */
    double num_requests_running;   /* vllm:num_requests_running, summed */
    double prefix_cache_hits;      /* tokens: vllm:prefix_cache_hits_total (v1) or
                                      vllm:gpu_prefix_cache_hits_total (v0), summed */
    double prefix_cache_queries;   /* tokens: vllm:prefix_cache_queries_total or
                                      vllm:gpu_prefix_cache_queries_total, summed */
    double kv_cache_usage;         /* vllm:kv_cache_usage_perc (or gpu_cache_usage_perc on older
                                      vLLM): a fraction 0..1, the largest over label sets */
    uint64_t block_size;           /* vllm:cache_config_info{block_size="16",...}: 1..MAX */
    uint64_t num_gpu_blocks;       /* its num_gpu_blocks label: 1..MAX; the last valid line wins */
    double process_start_time;     /* process_start_time_seconds (Unix time, > 0); the last wins */
    double request_success;        /* requests the pod finished, whoever sent them:
                                      vllm:request_success_total, summed (finished_reason) */
    size_t samples;                /* sample lines read, of any metric */
    size_t bad_lines;              /* lines skipped as malformed or out of range */
    size_t other_lines;            /* lines of other metrics, dismissed on their first bytes */
} pcr_pod_sample_t;

/* Reads text[0..len) (no NUL needed; NUL bytes make a line malformed) into *out, which it
 * clears first. A last line without its '\n' is ignored: the text format ends every line, so
 * it was cut. Returns 0, or PCR_ERR_INVAL when out is NULL or text is NULL with len > 0. */
int pcr_prom_parse(const char *text, size_t len, pcr_pod_sample_t *out);

/* The same, as the page arrives in pieces cut anywhere: lines whole in a piece are read where
 * they are, only a line cut by a piece's end is copied (at most PCR_PROM_MAX_LINE + 1 bytes; a
 * longer one is followed without a copy). begin, feed any number of times, end: the sample is
 * the one pcr_prom_parse gives for the pieces put together. Valid until the next begin. */
typedef struct {
    pcr_pod_sample_t s;
    size_t ncarry;
    int overlong, ov;
    char carry[PCR_PROM_MAX_LINE + 1];  /* a line and the '\r' read_line may strip */
} pcr_prom_reader_t;

void pcr_prom_begin(pcr_prom_reader_t *r);
void pcr_prom_feed(pcr_prom_reader_t *r, const char *data, size_t len);
const pcr_pod_sample_t *pcr_prom_end(pcr_prom_reader_t *r);

#endif
