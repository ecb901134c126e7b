/* test/fuzz/fuzz_prom.c: the Prometheus text parser (router/body/prom.c) and the scrape that
 * applies it to a backend (router/upstream/scrape.c), on any bytes a pod could send.
 *
 * Invariants, beyond "no crash, no leak, no undefined behaviour":
 *   1. The sample is sane: every value finite and >= 0, the usage within 0..1, the KV labels
 *      within their bounds, a value not seen is 0, and no more lines read than there are.
 *   2. Lines are independent: the input cut at a line boundary near its middle, each half
 *      parsed alone, gives the whole's sample (sums add, maxima and last values combine).
 *   3. Numbers round-trip: values taken from the input's first bytes, printed as a pod would
 *      (%.17g, %llu), read back exactly when the router can use them, refused otherwise.
 *   4. The backend gets what the sample says, saturated to its integer fields.
 *   5. Syntax, against a second reader: each line, parsed alone, is accepted only when libc's
 *      regex (POSIX ERE) of the sample line matches it and its value is a whole strtod number,
 *      and such a line of a metric the router ignores is always accepted. */
#include <math.h>
#include <regex.h>
#include <string.h>

#include <event2/buffer.h>

#include "backend.h"
#include "bus.h"
#include "fuzz.h"
#include "log.h"
#include "prom.h"
#include "scrape.h"

static void check_sane(const pcr_pod_sample_t *s, const uint8_t *data, size_t size)
{
    const struct {
        unsigned bit;
        double v;
    } vals[] = {
        {PCR_PROM_WAITING, s->num_requests_waiting}, {PCR_PROM_RUNNING, s->num_requests_running},
        {PCR_PROM_HITS, s->prefix_cache_hits},       {PCR_PROM_QUERIES, s->prefix_cache_queries},
        {PCR_PROM_KV_USAGE, s->kv_cache_usage},      {PCR_PROM_START_TIME, s->process_start_time},
    };
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        FUZZ_CHECKF(isfinite(vals[i].v) && vals[i].v >= 0, "value %zu is %g", i, vals[i].v);
        FUZZ_CHECKF((s->seen & vals[i].bit) || vals[i].v == 0, "value %zu unseen but %g", i,
                    vals[i].v);
    }
    FUZZ_CHECK(s->kv_cache_usage <= 1);
    FUZZ_CHECK(!(s->seen & PCR_PROM_START_TIME) || s->process_start_time > 0);
    if (s->seen & PCR_PROM_CACHE_CONFIG) {
        FUZZ_CHECK(s->block_size >= 1 && s->block_size <= PCR_PROM_MAX_BLOCK_SIZE);
        FUZZ_CHECK(s->num_gpu_blocks >= 1 && s->num_gpu_blocks <= PCR_PROM_MAX_GPU_BLOCKS);
    } else {
        FUZZ_CHECK(s->block_size == 0 && s->num_gpu_blocks == 0);
    }
    FUZZ_CHECK(s->seen < (PCR_PROM_START_TIME << 1));
    size_t lines = 0;
    for (size_t i = 0; i < size; i++)
        lines += data[i] == '\n';
    FUZZ_CHECKF(s->samples + s->bad_lines + s->other_lines <= lines, "%zu samples + %zu bad in %zu lines",
                s->samples, s->bad_lines, lines);
}

static int close_to(double whole, double sum)
{
    double scale = whole > sum ? whole : sum;
    return fabs(whole - sum) <= scale * 1e-9;
}

static void check_split(const pcr_pod_sample_t *w, const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data + size / 2, '\n', size - size / 2);
    if (nl == NULL)
        return;
    size_t cut = (size_t)(nl - data) + 1;
    pcr_pod_sample_t a, b;
    FUZZ_CHECK(pcr_prom_parse((const char *)data, cut, &a) == 0);
    FUZZ_CHECK(pcr_prom_parse((const char *)data + cut, size - cut, &b) == 0);
    /* A sum that overflows in the whole is refused at the line that overflows it, which each
     * half alone would have accepted: then the halves cannot be compared. */
    const double big = 1e300;
    if (a.num_requests_waiting + b.num_requests_waiting > big ||
        a.num_requests_running + b.num_requests_running > big ||
        a.prefix_cache_hits + b.prefix_cache_hits > big ||
        a.prefix_cache_queries + b.prefix_cache_queries > big)
        return;
    FUZZ_CHECK(w->seen == (a.seen | b.seen));
    FUZZ_CHECK(w->samples == a.samples + b.samples);
    FUZZ_CHECK(w->bad_lines == a.bad_lines + b.bad_lines);
    FUZZ_CHECK(w->other_lines == a.other_lines + b.other_lines);
    FUZZ_CHECK(close_to(w->num_requests_waiting, a.num_requests_waiting + b.num_requests_waiting));
    FUZZ_CHECK(close_to(w->num_requests_running, a.num_requests_running + b.num_requests_running));
    FUZZ_CHECK(close_to(w->prefix_cache_hits, a.prefix_cache_hits + b.prefix_cache_hits));
    FUZZ_CHECK(close_to(w->prefix_cache_queries, a.prefix_cache_queries + b.prefix_cache_queries));
    FUZZ_CHECK(w->kv_cache_usage == fmax(a.kv_cache_usage, b.kv_cache_usage));
    const pcr_pod_sample_t *last = (b.seen & PCR_PROM_CACHE_CONFIG) ? &b : &a;
    FUZZ_CHECK(w->block_size == last->block_size && w->num_gpu_blocks == last->num_gpu_blocks);
    last = (b.seen & PCR_PROM_START_TIME) ? &b : &a;
    FUZZ_CHECK(w->process_start_time == last->process_start_time);
}

/* The reader fed in pieces (cut where the input's first bytes say, down to single bytes)
 * gives exactly what the whole text gives. */
static void check_pieces(const pcr_pod_sample_t *w, const uint8_t *data, size_t size)
{
    static pcr_prom_reader_t r;
    size_t step = size > 0 ? (size_t)data[0] % 7 : 1;
    size_t sizes[] = {1, 2, 3, 64, 1000, PCR_PROM_MAX_LINE, size / 2 + 1};
    pcr_prom_begin(&r);
    for (size_t off = 0, i = step; off < size; i++) {
        size_t n = sizes[i % PCR_ARRAY_SIZE(sizes)];
        if (n > size - off)
            n = size - off;
        pcr_prom_feed(&r, (const char *)data + off, n);
        off += n;
    }
    const pcr_pod_sample_t *p = pcr_prom_end(&r);
    FUZZ_CHECK(memcmp(p, w, sizeof *w) == 0 ||
               (p->seen == w->seen && p->samples == w->samples && p->bad_lines == w->bad_lines &&
                p->other_lines == w->other_lines &&
                p->num_requests_waiting == w->num_requests_waiting &&
                p->num_requests_running == w->num_requests_running &&
                p->prefix_cache_hits == w->prefix_cache_hits &&
                p->prefix_cache_queries == w->prefix_cache_queries &&
                p->kv_cache_usage == w->kv_cache_usage && p->block_size == w->block_size &&
                p->num_gpu_blocks == w->num_gpu_blocks &&
                p->process_start_time == w->process_start_time));
}

static void check_round_trip(const uint8_t *data, size_t size)
{
    double v;
    uint64_t u;
    uint8_t raw[16] = {0};
    memcpy(raw, data, size < sizeof raw ? size : sizeof raw);
    memcpy(&v, raw, sizeof v);
    memcpy(&u, raw + 8, sizeof u);
    char text[512];
    snprintf(text, sizeof text,
             "vllm:num_requests_waiting{model_name=\"m\"} %.17g\n"
             "vllm:kv_cache_usage_perc{engine=\"0\"} %.17g\n"
             "process_start_time_seconds %.17g\n"
             "vllm:cache_config_info{block_size=\"%llu\",num_gpu_blocks=\"%llu\"} 1.0\n",
             v, v, v, (unsigned long long)u, (unsigned long long)(u >> 11));
    pcr_pod_sample_t s;
    FUZZ_CHECK(pcr_prom_parse(text, strlen(text), &s) == 0);
    int count_ok = isfinite(v) && v >= 0;
    int usage_ok = v >= 0 && v <= 1;
    int start_ok = isfinite(v) && v > 0;
    int kv_ok = u >= 1 && u <= PCR_PROM_MAX_BLOCK_SIZE && (u >> 11) >= 1 &&
                (u >> 11) <= PCR_PROM_MAX_GPU_BLOCKS;
    FUZZ_CHECKF(!!(s.seen & PCR_PROM_WAITING) == count_ok, "%.17g as a count", v);
    FUZZ_CHECKF(!!(s.seen & PCR_PROM_KV_USAGE) == usage_ok, "%.17g as a usage", v);
    FUZZ_CHECKF(!!(s.seen & PCR_PROM_START_TIME) == start_ok, "%.17g as a start time", v);
    FUZZ_CHECKF(!!(s.seen & PCR_PROM_CACHE_CONFIG) == kv_ok, "block_size %llu",
                (unsigned long long)u);
    FUZZ_CHECK(!count_ok || s.num_requests_waiting == v);
    FUZZ_CHECK(!usage_ok || s.kv_cache_usage == v);
    FUZZ_CHECK(!start_ok || s.process_start_time == v);
    FUZZ_CHECK(!kv_ok || (s.block_size == u && s.num_gpu_blocks == u >> 11));
    FUZZ_CHECK(s.samples + s.bad_lines == 4);
}

/* The scrape applied to a fresh backend. What it tells the policy replicas (capacity, a
 * restart) goes to a bus with no worker to hear it: nothing here reads it back. */
static void check_apply(const pcr_pod_sample_t *s, const uint8_t *data, size_t size)
{
    static pcr_config_t cfg;
    static pcr_server_t srv;
    static pcr_backend_conf_t bconf = {.name = "pod-a"};
    if (srv.bus == NULL) {
        pcr_log_set_level(PCR_LOG_ERROR);
        cfg.routing.block_bytes = 256;
        srv.cfg = &cfg;
        srv.bus = pcr_bus_new(0);
        FUZZ_CHECK(srv.bus != NULL);
    }
    pcr_backend_t be;
    memset(&be, 0, sizeof be);
    be.srv = &srv;
    be.conf = bconf;
    struct evbuffer *body = evbuffer_new();
    FUZZ_CHECK(body != NULL);
    evbuffer_add(body, data, size);
    pcr_scrape_parse(&be, body);
    evbuffer_free(body);
    FUZZ_CHECK(be.pod_scrapes == 1);
    if (s->seen & PCR_PROM_WAITING) {
        FUZZ_CHECK(be.pod_waiting == (s->num_requests_waiting >= 4294967295.0 ? UINT32_MAX
                                      : (uint32_t)s->num_requests_waiting));
        FUZZ_CHECK(be.pod_running == (s->num_requests_running >= 4294967295.0 ? UINT32_MAX
                                      : (uint32_t)s->num_requests_running));
    } else {
        FUZZ_CHECK(be.pod_waiting == 0 && be.pod_running == 0);
    }
    /* The first scrape is the baseline of the counters: nothing delivered yet. */
    FUZZ_CHECK(be.pod_hits == 0 && be.pod_queries == 0);
    FUZZ_CHECK(be.pod_have_hits == !!(s->seen & PCR_PROM_HITS));
    FUZZ_CHECK(be.pod_cache_tokens == s->block_size * s->num_gpu_blocks);
}

/* The sample line of the text format: name, labels (quoted values with escapes, a trailing
 * comma and blanks allowed, as Prometheus' own parser allows them), blanks, a value token
 * (group 8), an optional integer timestamp. */
#define LABEL "[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*\"([^\"\\]|\\\\.)*\"[ \t]*"
#define SAMPLE_RE "^[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*" \
                  "(\\{[ \t]*(" LABEL "(," LABEL ")*(,[ \t]*)?)?\\})?" \
                  "[ \t]+([^ \t]+)([ \t]+-?[0-9]{1,19})?[ \t]*$"

/* The metrics the reader reads; a line that does not begin with one of them, whole, is
 * dismissed (other_lines) when it begins with a name character, and bad otherwise. */
static const char *const read_names[] = {
    "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries_total", "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc", "vllm:cache_config_info", "process_start_time_seconds",
};

static int begins_read_name(const char *l)
{
    for (size_t i = 0; i < sizeof read_names / sizeof read_names[0]; i++) {
        size_t k = strlen(read_names[i]);
        if (strncmp(l, read_names[i], k) == 0 &&
            (l[k] == '\0' || l[k] == ' ' || l[k] == '\t' || l[k] == '{'))
            return 1;
    }
    return 0;
}

/* Which label sets the reader may refuse beyond syntax: more than it allows, or the KV labels
 * twice (it refuses those whatever the metric). */
static int labels_refusable(const char *line)
{
    const char *bs = strstr(line, "block_size"), *nb = strstr(line, "num_gpu_blocks");
    size_t eq = 0;
    for (const char *p = line; *p; p++)
        eq += *p == '=';
    return eq > PCR_PROM_MAX_LABELS || (bs && strstr(bs + 1, "block_size")) ||
           (nb && strstr(nb + 1, "num_gpu_blocks"));
}

static void check_syntax(const uint8_t *data, size_t size)
{
    static regex_t re;
    static int compiled;
    if (!compiled) {
        FUZZ_CHECK(regcomp(&re, SAMPLE_RE, REG_EXTENDED) == 0);
        compiled = 1;
    }
    const char *p = (const char *)data, *end = p + size;
    for (int lines = 0; lines < 32 && p < end; lines++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            return;
        size_t n = (size_t)(nl - p);
        char line[1024];
        int skip = n + 2 > sizeof line || memchr(p, '\0', n) != NULL;
        if (!skip) {
            memcpy(line, p, n + 1);     /* with its '\n', for pcr_prom_parse */
            line[n + 1] = '\0';
        }
        p = nl + 1;
        if (skip)
            continue;
        pcr_pod_sample_t s;
        FUZZ_CHECK(pcr_prom_parse(line, n + 1, &s) == 0);
        line[n] = '\0';
        if (n > 0 && line[n - 1] == '\r')
            line[n - 1] = '\0';    /* the reader allows CRLF */
        size_t lead = strspn(line, " \t");
        if (line[lead] == '\0' || line[lead] == '#') {
            FUZZ_CHECK(s.samples == 0 && s.bad_lines == 0);
            continue;
        }
        if (!begins_read_name(line + lead)) {
            int name = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:",
                              line[lead]) != NULL;
            FUZZ_CHECKF(s.samples == 0 && s.other_lines == (size_t)name &&
                        s.bad_lines == (size_t)!name, "a line not read, counted wrong: %s", line);
            continue;
        }
        regmatch_t m[10];
        int ok = regexec(&re, line, 10, m, 0) == 0;
        if (ok) {
            /* The value token, whole, as strtod reads it. */
            char num[64], *endp;
            size_t vlen = (size_t)(m[8].rm_eo - m[8].rm_so);
            ok = vlen < sizeof num;
            if (ok) {
                memcpy(num, line + m[8].rm_so, vlen);
                num[vlen] = '\0';
                strtod(num, &endp);
                ok = endp == num + vlen;
            }
        }
        FUZZ_CHECKF(s.samples + s.bad_lines == 1, "line counted %zu times: %s",
                    s.samples + s.bad_lines, line);
        FUZZ_CHECKF(ok || s.samples == 0, "accepted, but not a sample line: %s", line);
        FUZZ_CHECKF(!ok || s.samples == 1 || strncmp(line + lead, "vllm:", 5) == 0 ||
                    strncmp(line + lead, "process_start_time_seconds", 26) == 0 ||
                    labels_refusable(line), "a sample line refused: %s", line);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pcr_pod_sample_t s;
    FUZZ_CHECK(pcr_prom_parse((const char *)data, size, &s) == 0);
    check_sane(&s, data, size);
    check_split(&s, data, size);
    check_pieces(&s, data, size);
    check_round_trip(data, size);
    check_apply(&s, data, size);
    check_syntax(data, size);
    return 0;
}
