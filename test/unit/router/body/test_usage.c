/* test/unit/router/body/test_usage.c: tests router/body/usage.c, the reading of a completion's
 * usage from the bytes pcrouter forwards: JSON answers (bounded), SSE streams with any line endings
 * and any split of the bytes into reads, the strip of the usage-only event pcrouter asked for (and
 * nothing else), and where stream_options goes into a request body. */
#include <stdlib.h>
#include <string.h>

#include "pcr_test.h"
#include "usage.h"

typedef struct {
    char *p;
    size_t len, cap;
} sink_t;

static void sink(void *ctx, const char *data, size_t len)
{
    sink_t *s = ctx;
    if (s->len + len + 1 > s->cap) {
        s->cap = (s->len + len + 1) * 2;
        s->p = realloc(s->p, s->cap);
    }
    memcpy(s->p + s->len, data, len);
    s->len += len;
    s->p[s->len] = '\0';
}

/* Feeds `in` in pieces cut at `cuts` (ascending offsets), finishes, returns what the client got
 * (caller frees) and the reader's findings in *u (disposed already). */
static char *run(pcr_usage_mode_t mode, int strip, const char *in, size_t len, const size_t *cuts,
                 size_t ncuts, pcr_usage_t *found)
{
    pcr_usage_t u;
    sink_t s = {0};
    memset(&u, 0, sizeof(u));
    pcr_usage_init(&u, mode, strip);
    size_t at = 0;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : len;
        pcr_usage_feed(&u, in + at, end - at, sink, &s);
        at = end;
    }
    pcr_usage_finish(&u, sink, &s);
    *found = u;
    found->buf = NULL;
    pcr_usage_dispose(&u);
    if (s.p == NULL)
        s.p = calloc(1, 1);
    return s.p;
}

/* Every way of cutting `in` in two, and byte by byte, must give `want` and the same findings. */
static int every_split(pcr_usage_mode_t mode, int strip, const char *in, const char *want,
                       int want_found, uint64_t want_cached, uint64_t want_prompt)
{
    size_t len = strlen(in), bad = 0;
    pcr_usage_t u;
    for (size_t cut = 0; cut <= len; cut++) {
        char *out = run(mode, strip, in, len, &cut, 1, &u);
        if (strcmp(out, want) != 0 || u.found != want_found ||
            (want_found && (u.cached_tokens != want_cached || u.prompt_tokens != want_prompt))) {
            if (bad++ == 0) {
                printf("# split at %zu: found %d cached %llu, got: ", cut, u.found,
                       (unsigned long long)u.cached_tokens);
                for (const char *c = out; *c; c++)
                    printf(*c == '\r' ? "\\r" : *c == '\n' ? "\\n" : "%c", *c);
                printf("\n");
            }
        }
        free(out);
    }
    size_t *cuts = malloc((len ? len : 1) * sizeof(size_t));
    for (size_t i = 0; i < len; i++)
        cuts[i] = i;
    char *out = run(mode, strip, in, len, cuts, len, &u);
    bad += strcmp(out, want) != 0 || u.found != want_found;
    free(out);
    free(cuts);
    return bad == 0;
}

static void test_mode(void)
{
    PCR_CHECK_EQ_INT(pcr_usage_mode(200, "application/json", 16, NULL, 0), PCR_USAGE_JSON);
    PCR_CHECK_EQ_INT(pcr_usage_mode(200, "Application/JSON; charset=utf-8", 31, NULL, 0), PCR_USAGE_JSON);
    PCR_CHECK_EQ_INT(pcr_usage_mode(200, "text/event-stream", 17, NULL, 0), PCR_USAGE_SSE);
    PCR_CHECK_EQ_INT(pcr_usage_mode(200, "text/event-stream", 17, "identity", 8), PCR_USAGE_SSE);
    PCR_CHECK_EQ_INT(pcr_usage_mode(200, "application/json", 16, "gzip", 4), PCR_USAGE_OFF);
    PCR_CHECK_EQ_INT(pcr_usage_mode(400, "application/json", 16, NULL, 0), PCR_USAGE_OFF);
    PCR_CHECK_EQ_INT(pcr_usage_mode(200, "application/jsonl", 17, NULL, 0), PCR_USAGE_OFF);
    PCR_CHECK_EQ_INT(pcr_usage_mode(200, "text/plain", 10, NULL, 0), PCR_USAGE_OFF);
    PCR_CHECK_EQ_INT(pcr_usage_mode(200, NULL, 0, NULL, 0), PCR_USAGE_OFF);
}

static const char json_answer[] =
    "{\"id\":\"cmpl-1\",\"choices\":[{\"text\":\"hi \\\"usage\\\"\"}],"
    "\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":3,\"total_tokens\":1203,"
    "\"prompt_tokens_details\":{\"cached_tokens\":1024}}}";

static void test_json_answer(void)
{
    PCR_CHECK(every_split(PCR_USAGE_JSON, 0, json_answer, json_answer, 1, 1024, 1200));
    /* No details (a pod without --enable-prompt-tokens-details): nothing is found. */
    PCR_CHECK(every_split(PCR_USAGE_JSON, 0,
                          "{\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":null}}",
                          "{\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":null}}", 0, 0, 0));
    /* Not JSON, or numbers that are no token counts: nothing found, bytes untouched. */
    PCR_CHECK(every_split(PCR_USAGE_JSON, 0, "{\"usage\":", "{\"usage\":", 0, 0, 0));
    const char *neg = "{\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":-5}}}";
    PCR_CHECK(every_split(PCR_USAGE_JSON, 0, neg, neg, 0, 0, 0));
    /* An answer that never names cached_tokens is not parsed; one that names it through an
     * escape still is, and is read. */
    const char *esc = "{\"usage\":{\"prompt_tokens\":7,\"prompt_tokens_details\":"
                      "{\"cached\\u005ftokens\":3}}}";
    PCR_CHECK(every_split(PCR_USAGE_JSON, 0, esc, esc, 1, 3, 7));
}

static void test_json_bound(void)
{
    /* Past PCR_USAGE_MAX_JSON the copy is given up: every byte still goes out. */
    size_t pad = PCR_USAGE_MAX_JSON;
    size_t len = pad + sizeof(json_answer) + 16;
    char *big = malloc(len);
    size_t o = (size_t)snprintf(big, len, "{\"pad\":\"");
    memset(big + o, 'a', pad);
    o += pad;
    o += (size_t)snprintf(big + o, len - o, "\",%s", json_answer + 1);
    pcr_usage_t u;
    size_t cuts[] = {100, pad / 2, pad + 3};
    char *out = run(PCR_USAGE_JSON, 0, big, o, cuts, 3, &u);
    PCR_CHECK_EQ_INT(u.found, 0);
    PCR_CHECK(strlen(out) == o && memcmp(out, big, o) == 0);
    free(out);
    free(big);
}

/* A large answer, held in many blocks: its usage is read whatever the cut (including cuts inside
 * the cached_tokens name, after a read of many bytes), and a rewrite sends it whole. */
static void test_json_large(void)
{
    size_t pad = 100000, len = pad + sizeof(json_answer) + 16;
    char *big = malloc(len);
    size_t o = (size_t)snprintf(big, len, "{\"pad\":\"");
    memset(big + o, 'a', pad);
    o += pad;
    o += (size_t)snprintf(big + o, len - o, "\",%s", json_answer + 1);
    size_t name = (size_t)(strstr(big, "cached_tokens") - big);
    pcr_usage_t u;
    for (size_t cut = name - 2; cut <= name + 15; cut++) {
        size_t cuts[] = {16000, cut};
        char *out = run(PCR_USAGE_JSON, 0, big, o, cuts, 2, &u);
        PCR_CHECK(u.found == 1 && u.cached_tokens == 1024 && u.prompt_tokens == 1200);
        PCR_CHECK(strlen(out) == o && memcmp(out, big, o) == 0);
        free(out);
    }
    size_t steps[] = {1, 13, 4096, 16383, 16384, 16385, 65536};
    for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
        size_t n = 0, *cuts = malloc((o / steps[k] + 1) * sizeof(size_t));
        for (size_t at = steps[k]; at < o; at += steps[k])
            cuts[n++] = at;
        pcr_usage_t r;
        sink_t s = {0};
        memset(&r, 0, sizeof(r));
        pcr_usage_init(&r, PCR_USAGE_JSON, 0);
        pcr_usage_rewrite(&r, 7);
        size_t at = 0;
        for (size_t i = 0; i <= n; i++) {
            size_t end = i < n ? cuts[i] : o;
            pcr_usage_feed(&r, big + at, end - at, sink, &s);
            PCR_CHECK(i == n || s.len == 0); /* held until the end */
            at = end;
        }
        PCR_CHECK(pcr_usage_finish(&r, sink, &s) == 1 && r.cached_tokens == 1024);
        /* 1024 became 7: three bytes fewer. */
        PCR_CHECK(s.p != NULL && s.len == o - 3 && strstr(s.p, "\"cached_tokens\":7}") != NULL &&
                  memcmp(s.p, big, pad) == 0);
        pcr_usage_dispose(&r);
        free(s.p);
        free(cuts);
    }
    free(big);
}

#define EV(text) "data: {\"choices\":[{\"text\":\"" text "\"}],\"usage\":null}\n\n"
#define USAGE_EV "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":2," \
                 "\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\n"

static void test_sse_reads_and_passes_everything(void)
{
    const char *in = ": a comment\n\n" EV("a") EV("b") USAGE_EV "data: [DONE]\n\n";
    PCR_CHECK(every_split(PCR_USAGE_SSE, 0, in, in, 1, 256, 300));
    /* Continuous usage on every chunk: the last one counts. */
    const char *cont =
        "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\n"
        "data: {\"choices\":[{\"text\":\"b\"}],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n";
    PCR_CHECK(every_split(PCR_USAGE_SSE, 0, cont, cont, 1, 8, 9));
    /* No usage at all. */
    const char *none = EV("a") "data: [DONE]\n\n";
    PCR_CHECK(every_split(PCR_USAGE_SSE, 0, none, none, 0, 0, 0));
}

static void test_sse_strip_drops_only_the_usage_event(void)
{
    const char *in = EV("a") EV("b") USAGE_EV "data: [DONE]\n\n";
    const char *want = EV("a") EV("b") "data: [DONE]\n\n";
    PCR_CHECK(every_split(PCR_USAGE_SSE, 1, in, want, 1, 256, 300));
    /* CRLF and bare CR line endings: the dropped event takes its whole blank line. */
    const char *crlf = "data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\n"
                       "data: {\"choices\":[],\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":16}}}\r\n\r\n"
                       "data: [DONE]\r\n\r\n";
    PCR_CHECK(every_split(PCR_USAGE_SSE, 1, crlf,
                          "data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata: [DONE]\r\n\r\n", 1, 16, 0));
    const char *cr = "data: {\"choices\":[{\"text\":\"a\"}]}\r\r"
                     "data:{\"choices\":[],\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":32}}}\r\r"
                     "data: [DONE]\r\r";
    PCR_CHECK(every_split(PCR_USAGE_SSE, 1, cr, "data: {\"choices\":[{\"text\":\"a\"}]}\r\rdata: [DONE]\r\r",
                          1, 32, 0));
    /* Usage riding on a content event is the client's content: kept. */
    const char *rides = "data: {\"choices\":[{\"text\":\"z\"}],\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\n";
    PCR_CHECK(every_split(PCR_USAGE_SSE, 1, rides, rides, 1, 48, 0));
    /* Data split over two lines is joined with LF before parsing. */
    const char *two = "data: {\"choices\":[],\n"
                      "data: \"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n";
    PCR_CHECK(every_split(PCR_USAGE_SSE, 1, two, "", 1, 64, 0));
}

static void test_sse_long_events_pass(void)
{
    /* An event past PCR_USAGE_MAX_EVENT is passed on as it comes, even with a strip on, and
     * the events after it are read again. */
    size_t n = PCR_USAGE_MAX_EVENT + 100;
    size_t len = n + 512;
    char *in = malloc(len);
    size_t o = (size_t)snprintf(in, len, "data: \"");
    memset(in + o, 'q', n);
    o += n;
    o += (size_t)snprintf(in + o, len - o, "\"\n\n%s", USAGE_EV);
    size_t cuts[] = {10, 60000, n + 9};
    pcr_usage_t u;
    char *out = run(PCR_USAGE_SSE, 1, in, o, cuts, 3, &u);
    PCR_CHECK_EQ_INT(u.found, 1);
    PCR_CHECK_EQ_INT(u.cached_tokens, 256);
    PCR_CHECK(strlen(out) == o - strlen(USAGE_EV) && memcmp(out, in, strlen(out)) == 0);
    free(out);
    free(in);
}

static void test_sse_unfinished_last_event(void)
{
    /* No blank line at the end: held bytes still reach the client, unchanged. */
    const char *in = EV("a") "data: {\"choices\":[],\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":5}}}";
    PCR_CHECK(every_split(PCR_USAGE_SSE, 1, in, in, 1, 5, 0));
}

static void test_insert_at(void)
{
    int empty = -1;
    PCR_CHECK_EQ_INT(pcr_usage_insert_at("{\"a\":1}", 7, &empty), 6);
    PCR_CHECK_EQ_INT(empty, 0);
    PCR_CHECK_EQ_INT(pcr_usage_insert_at("{\"a\":\"}\"} \r\n\t", 13, &empty), 8);
    PCR_CHECK_EQ_INT(empty, 0);
    PCR_CHECK_EQ_INT(pcr_usage_insert_at("{\"a\":{}}", 8, &empty), 7);
    PCR_CHECK_EQ_INT(empty, 0);
    PCR_CHECK_EQ_INT(pcr_usage_insert_at(" { \n } ", 7, &empty), 5);
    PCR_CHECK_EQ_INT(empty, 1);
    PCR_CHECK_EQ_INT(pcr_usage_insert_at("[1]", 3, &empty), -1);
    PCR_CHECK_EQ_INT(pcr_usage_insert_at("   ", 3, &empty), -1);
    PCR_CHECK_EQ_INT(pcr_usage_insert_at("", 0, &empty), -1);
}

/* A rewrite (a disaggregated request's decode leg): the client gets the cached tokens given,
 * however the bytes are cut; the reader still finds the pod's own. */
static int rewrite_every_split(pcr_usage_mode_t mode, int strip, const char *in, const char *want,
                               uint64_t pod_cached)
{
    size_t len = strlen(in), bad = 0;
    for (size_t cut = 0; cut <= len; cut++) {
        pcr_usage_t u;
        sink_t s = {0};
        memset(&u, 0, sizeof(u));
        pcr_usage_init(&u, mode, strip);
        pcr_usage_rewrite(&u, 7);
        pcr_usage_feed(&u, in, cut, sink, &s);
        pcr_usage_feed(&u, in + cut, len - cut, sink, &s);
        pcr_usage_finish(&u, sink, &s);
        if (s.p == NULL || strcmp(s.p, want) != 0 || !u.found || u.cached_tokens != pod_cached) {
            if (bad++ == 0)
                printf("# split at %zu: found %d cached %llu, got: %s\n", cut, u.found,
                       (unsigned long long)u.cached_tokens, s.p ? s.p : "(nothing)");
        }
        pcr_usage_dispose(&u);
        free(s.p);
    }
    return bad == 0;
}

static void test_rewrite(void)
{
    const char *want = "{\"id\":\"cmpl-1\",\"choices\":[{\"text\":\"hi \\\"usage\\\"\"}],"
                       "\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":3,\"total_tokens\":1203,"
                       "\"prompt_tokens_details\":{\"cached_tokens\":7}}}";
    PCR_CHECK(rewrite_every_split(PCR_USAGE_JSON, 0, json_answer, want, 1024));
    const char *chunk = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
    const char *usage_in = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,"
                           "\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n";
    const char *usage_out = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,"
                            "\"prompt_tokens_details\":{\"cached_tokens\":7}}}\n\n";
    char in[512], out[512];
    snprintf(in, sizeof in, "%s%sdata: [DONE]\n\n", chunk, usage_in);
    snprintf(out, sizeof out, "%s%sdata: [DONE]\n\n", chunk, usage_out);
    PCR_CHECK(rewrite_every_split(PCR_USAGE_SSE, 0, in, out, 8));
    /* With strip (pcrouter asked for the usage), the usage-only event is still dropped. */
    snprintf(out, sizeof out, "%sdata: [DONE]\n\n", chunk);
    PCR_CHECK(rewrite_every_split(PCR_USAGE_SSE, 1, in, out, 8));
}

int main(void)
{
    PCR_RUN(test_mode);
    PCR_RUN(test_json_answer);
    PCR_RUN(test_json_bound);
    PCR_RUN(test_json_large);
    PCR_RUN(test_sse_reads_and_passes_everything);
    PCR_RUN(test_sse_strip_drops_only_the_usage_event);
    PCR_RUN(test_sse_long_events_pass);
    PCR_RUN(test_sse_unfinished_last_event);
    PCR_RUN(test_insert_at);
    PCR_RUN(test_rewrite);
    return pcr_test_done();
}
