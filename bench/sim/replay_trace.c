/* bench/sim/replay_trace.c: trace loading, the LRU ceiling and percentiles, see replay_trace.h. */
#include "replay_trace.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache.h"
#include "synth.h"

static int bad_row(const char *path, size_t line, const char *why)
{
    fprintf(stderr, "replay: %s:%zu: %s\n", path, line, why);
    return -1;
}

int rt_trace_load(rt_trace_t *t, const char *path, size_t skip, size_t limit)
{
    memset(t, 0, sizeof(*t));
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0, lineno = 0, alloc = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len <= 1 && (len == 0 || line[0] == '\n'))
            continue;
        if (lineno <= skip)
            continue;
        if (limit && t->n >= limit)
            break;
        cJSON *o = cJSON_ParseWithLength(line, (size_t)len);
        const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "timestamp");
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(o, "input_length");
        const cJSON *out = cJSON_GetObjectItemCaseSensitive(o, "output_length");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "hash_ids");
        if (!cJSON_IsNumber(ts) || !cJSON_IsNumber(in) || !cJSON_IsNumber(out) ||
            !cJSON_IsArray(ids) || in->valuedouble < 1 || out->valuedouble < 0) {
            cJSON_Delete(o);
            rc = bad_row(path, lineno, "not a Mooncake row (timestamp, input_length, "
                         "output_length, hash_ids)");
            break;
        }
        if (t->n == alloc) {
            size_t na = alloc ? alloc * 2 : 1024;
            rt_row_t *nr = realloc(t->rows, na * sizeof(*nr));
            if (!nr) {
                cJSON_Delete(o);
                rc = bad_row(path, lineno, "out of memory");
                break;
            }
            t->rows = nr;
            alloc = na;
        }
        rt_row_t *r = &t->rows[t->n];
        r->timestamp_ms = ts->valuedouble;
        r->input_length = (size_t)in->valuedouble;
        r->output_length = (size_t)out->valuedouble;
        r->nids = (size_t)cJSON_GetArraySize(ids);
        r->hash_ids = malloc((r->nids ? r->nids : 1) * sizeof(uint64_t));
        if (!r->hash_ids) {
            cJSON_Delete(o);
            rc = bad_row(path, lineno, "out of memory");
            break;
        }
        size_t k = 0;
        const cJSON *id;
        cJSON_ArrayForEach(id, ids)
            r->hash_ids[k++] = cJSON_IsNumber(id) ? (uint64_t)id->valuedouble : 0;
        t->n++;
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    if (rc)
        rt_trace_dispose(t);
    return rc;
}

void rt_trace_dispose(rt_trace_t *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->rows[i].hash_ids);
    free(t->rows);
    memset(t, 0, sizeof(*t));
}

char *rt_prompt(const rt_trace_t *t, size_t i, size_t *len)
{
    const rt_row_t *r = &t->rows[i];
    char *buf = malloc(pcr_synth_prompt_len(r->input_length) + 1);
    if (!buf)
        return NULL;
    *len = pcr_synth_prompt(r->hash_ids, r->nids, r->input_length, i, buf);
    buf[*len] = 0;
    return buf;
}

double rt_ceiling(const rt_trace_t *t, uint64_t capacity_tokens, const pcr_kvcache_phase_t *ph,
                  size_t nph, uint64_t *hits, uint64_t *queries)
{
    size_t cap = (size_t)(capacity_tokens / PCR_KV_BLOCK_TOKENS), withheld = 0;
    pcr_kvcache_t *kv = pcr_kvcache_new(cap);
    uint64_t *hashes = NULL;
    size_t hcap = 0;
    *hits = *queries = 0;
    if (!kv)
        return -1;
    for (size_t i = 0; i < t->n; i++) {
        if (nph > 0) {   /* withhold what the phase takes away, evicting LRU first */
            double f = pcr_kvcache_schedule_at(
                ph, nph, (t->rows[i].timestamp_ms - t->rows[0].timestamp_ms) / 1000.0);
            size_t keep = (size_t)(f * (double)cap + 0.5), target = cap - (keep < 1 ? 1 : keep);
            size_t hit;
            if (withheld > target) {
                pcr_kvcache_release(kv, NULL, 0, withheld - target);
                withheld = target;
            } else if (withheld < target &&   /* nothing is pinned between rows: it fits */
                       pcr_kvcache_acquire(kv, NULL, 0, target - withheld, &hit) == 0) {
                withheld = target;
            }
        }
        size_t len;
        char *text = rt_prompt(t, i, &len);
        if (!text)
            goto oom;
        size_t nb = len / PCR_KV_BLOCK_BYTES;
        if (nb > hcap) {
            uint64_t *nh = realloc(hashes, nb * sizeof(*nh));
            if (!nh) {
                free(text);
                goto oom;
            }
            hashes = nh;
            hcap = nb;
        }
        pcr_kvcache_hash_prompt(text, len, 0, hashes, nb);
        free(text);
        size_t hit_blocks = 0;
        *queries += t->rows[i].input_length;
        /* A prompt bigger than the whole cache is a miss and leaves the cache as it was. */
        if (pcr_kvcache_acquire(kv, hashes, nb, 0, &hit_blocks) == 0) {
            *hits += pcr_kvcache_hit_tokens(hit_blocks, t->rows[i].input_length);
            pcr_kvcache_release(kv, hashes, nb, 0);
        }
    }
    free(hashes);
    pcr_kvcache_free(kv);
    return *queries ? (double)*hits / (double)*queries : 0;
oom:
    free(hashes);
    pcr_kvcache_free(kv);
    return -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void rt_sort(double *v, size_t n)
{
    if (n > 1) /* an empty list may be NULL, which qsort may not be given */
        qsort(v, n, sizeof(double), cmp_double);
}

int rt_unstreamed(size_t i, double fraction)
{
    uint64_t z = (uint64_t)i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0 < fraction;
}

double rt_percentile(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return NAN;
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return sorted[k ? k - 1 : 0];
}
