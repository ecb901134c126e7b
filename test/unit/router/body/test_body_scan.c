/* test_body_scan.c: router/body/body_scan.c through the reader: the same body gives the same result
 * (fields, key, canonical bytes, or error and its byte) however it is cut into chunks; it is
 * valid exactly when yajl, given the whole body at once, says so; and memory stays bounded
 * whatever the body (deep nesting, many messages, long prompts, long numbers). */
#include <malloc.h>
#include <stdlib.h>

#include <yajl/yajl_parse.h>

#include "body.h"
#include "body_result.h"
#include "body_scan.h"
#include "pcr/common.h"
#include "pcr_test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}


/* Reads `body` cut before each of cuts[0..ncuts) (ascending). */
static void read_cut(pcr_api_t api, const char *body, size_t len, const size_t *cuts,
                     size_t ncuts, int keep, result_t *res)
{
    pcr_body_opts_t o;
    pcr_body_opts_default(&o);
    o.keep_canonical = keep;
    memset(res, 0, sizeof(*res));
    pcr_body_reader_t *r = pcr_body_reader_new(api, &o);
    size_t from = 0;
    res->rc = 0;
    for (size_t i = 0; i <= ncuts && res->rc == 0; i++) {
        size_t to = i < ncuts ? cuts[i] : len;
        res->rc = pcr_body_reader_feed(r, body + from, to - from);
        from = to;
    }
    if (res->rc == 0)
        res->rc = pcr_body_reader_finish(r, &res->b);
    snprintf(res->msg, sizeof(res->msg), "%s", pcr_body_reader_error(r));
    pcr_body_reader_free(r);
}

/* Random chunks of 1..max bytes. */
static void read_random(pcr_api_t api, const char *body, size_t len, size_t max, result_t *res)
{
    size_t cap = len / 1 + 1, n = 0;
    size_t *cuts = malloc(cap * sizeof(*cuts));
    for (size_t at = 0;;) {
        size_t step = 1 + rnd() % (rnd() % 4 == 0 ? 8 : max);
        at += step;
        if (at >= len)
            break;
        cuts[n++] = at;
    }
    read_cut(api, body, len, cuts, n, 1, res);
    free(cuts);
}

/* Bodies that cross every path: strings around the scanner's limits (64 and 512 bytes), with
 * escapes and multi-byte characters, parts, tools, tool calls, numbers, literals. */
static char *make_body(int which, pcr_api_t *api, size_t *len)
{
    char s70[80], s600[620];
    for (int i = 0; i < 70; i++)
        s70[i] = (char)('a' + i % 26);
    s70[70] = '\0';
    /* 600 bytes: ASCII, \n and \" and \u00e9 escapes, a 2-byte and a 4-byte character. */
    size_t n = 0;
    for (size_t i = 0; n < 590; i++) {
        static const char *const bits[] = {"ab", "\\n", "\\\"", "\\u00e9", "\xc3\xa9", "\xf0\x9f\x98\x80", "\\\\", "z"};
        const char *b = bits[i % 8];
        size_t k = strlen(b);
        memcpy(s600 + n, b, k);
        n += k;
    }
    s600[n] = '\0';
    char *body = malloc(8192);
    *api = PCR_API_CHAT;
    switch (which) {
    case 0:
        snprintf(body, 8192, "{\"model\":\"llama-3\",\"stream\":true,\"stream_options\":"
                 "{\"include_usage\":true},\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
                 "{\"role\":\"user\",\"content\":\"%s\"}]}", s600, s70);
        break;
    case 1:
        snprintf(body, 8192, "{\"messages\":[{\"content\":[{\"type\":\"text\",\"text\":\"%s\"},"
                 "{\"type\":\"image_url\",\"image_url\":{\"url\":\"%s\"}},{\"text\":\"x\",\"type\":\"text\"}],"
                 "\"role\":\"user\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
                 "[{\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":\"%s\"}}]}],"
                 "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"%s\",\"n\":[1,-2.5e+3,true,"
                 "false,null]}}],\"model\":\"m\",\"temperature\":0.7}", s70, s600, s70, s600);
        break;
    case 2:
        *api = PCR_API_COMPLETIONS;
        snprintf(body, 8192, " {\"prompt\" : \"%s\" , \"model\" : \"\\u006d\\n\", \"n\": 12345678901234567890 }\n",
                 s600);
        break;
    case 3:
        *api = PCR_API_COMPLETIONS;
        snprintf(body, 8192, "{\"prompt\":[[1,2,3],\"%s\",{\"%s\":[]}],\"max_tokens\":16}", s70, s600);
        break;
    case 4:  /* errors, each at one byte */
        snprintf(body, 8192, "{\"messages\":[{\"role\":\"u\",\"content\":\"%s\\x%s\"}]}", s600, s70);
        break;
    case 5:
        snprintf(body, 8192, "{\"messages\":[{\"role\":\"u\",\"content\":\"%s\xc3%s\"}]}", s600, s70);
        break;
    case 6:
        snprintf(body, 8192, "{\"messages\":[{\"role\":\"u\",\"content\":\"%s\\u12G4\"}]}", s600);
        break;
    case 7:
        snprintf(body, 8192, "{\"messages\":[{\"role\":\"u\",\"content\":\"%s\x01\"}]}", s70);
        break;
    case 8:
        snprintf(body, 8192, "{\"messages\":[{\"role\":\"u\",\"content\":\"%s\"} {}]}", s600);
        break;
    case 9:
        snprintf(body, 8192, "{\"messages\":[{\"role\":7,\"content\":\"%s\"}],\"x\":[1,2,tru]}", s600);
        break;
    case 10:
        snprintf(body, 8192, "{\"messages\":[{\"role\":\"u\",\"content\":\"%s\"}],\"model\":5}", s70);
        break;
    /* What the fuzzer found: each once gave another error, or another byte, when cut. */
    case 11:  /* a field refused for its type, whose value is a container */
        snprintf(body, 8192, "{\"model\":{\"a\":[1,{}]},\"messages\":[{\"role\":[],\"content\":\"%s\"}]}", s70);
        break;
    case 12:  /* a misplaced number: yajl names the byte it starts at */
        snprintf(body, 8192, "{\"prompt\":\"x\",\"n\":9 %s}", "12345678901234567890123456789012345");
        break;
    case 13:  /* an escape whose character is a byte >= 0x80, in a long string */
        snprintf(body, 8192, "{\"prompt\":\"%s\\\xdc%s\"}", s600, s70);
        break;
    case 14:  /* a mistake, then a word too long: the mistake is told */
        snprintf(body, 8192, "{\"prompt\":\"x\" bad: %s%s%s%s}", s70, s70, s70, s70);
        break;
    default:  /* an invalid character, then a lead byte, at a cut */
        snprintf(body, 8192, "{\"prompt\":\"%s\xdd\xdc\xdc%s\"}", s70, s70);
        break;
    }
    *len = strlen(body);
    return body;
}

#define NBODIES 16

/* Every single cut, every pair of cuts near the strings' ends, and byte by byte. */
static void test_every_split(void)
{
    for (int w = 0; w < NBODIES; w++) {
        pcr_api_t api;
        size_t len;
        char *body = make_body(w, &api, &len);
        result_t whole, part;
        read_cut(api, body, len, NULL, 0, 1, &whole);
        if (w < 4 && whole.rc != 0)
            printf("# body %d: %s\n", w, whole.msg);
        PCR_CHECK(w >= 4 ? whole.rc != 0 : whole.rc == 0);
        int bad = 0;
        for (size_t cut = 0; cut <= len && !bad; cut++) {
            read_cut(api, body, len, &cut, 1, 1, &part);
            if (!body_result_same(&whole, &part)) {
                printf("# body %d cut at %zu: rc %d '%s' vs %d '%s'\n", w, cut, part.rc, part.msg,
                       whole.rc, whole.msg);
                bad = 1;
            }
            pcr_body_dispose(&part.b);
        }
        size_t *all = malloc(len * sizeof(*all));
        for (size_t i = 0; i < len; i++)
            all[i] = i;
        read_cut(api, body, len, all, len, 1, &part);
        if (!body_result_same(&whole, &part)) {
            printf("# body %d byte by byte: rc %d '%s'\n", w, part.rc, part.msg);
            bad = 1;
        }
        pcr_body_dispose(&part.b);
        for (int k = 0; k < 300 && !bad; k++) {
            size_t c[2] = {rnd() % len, rnd() % len};
            if (c[0] > c[1]) {
                size_t t = c[0];
                c[0] = c[1];
                c[1] = t;
            }
            read_cut(api, body, len, c, 2, 1, &part);
            bad = !body_result_same(&whole, &part);
            pcr_body_dispose(&part.b);
        }
        PCR_CHECK(!bad);
        pcr_body_dispose(&whole.b);
        free(all);
        free(body);
    }
}

/* Errors name the byte yajl, reading the whole body, stops at. */
static size_t yajl_error_at(const char *body, size_t len)
{
    yajl_handle h = yajl_alloc(NULL, NULL, NULL);
    yajl_status st = yajl_parse(h, (const unsigned char *)body, len);
    size_t at = st == yajl_status_ok ? len : yajl_get_bytes_consumed(h);
    if (st == yajl_status_ok && yajl_complete_parse(h) == yajl_status_ok)
        at = (size_t)-1;
    yajl_free(h);
    return at;
}

static void test_error_bytes(void)
{
    static const int parse_errors[] = {4, 5, 6, 7, 8, 12, 13, 15};
    for (size_t e = 0; e < PCR_ARRAY_SIZE(parse_errors); e++) {
        int w = parse_errors[e];
        pcr_api_t api;
        size_t len;
        char *body = make_body(w, &api, &len);
        result_t res;
        read_cut(api, body, len, NULL, 0, 1, &res);
        char want[64];
        snprintf(want, sizeof(want), "(at byte %zu", yajl_error_at(body, len));
        if (strstr(res.msg, want) == NULL)
            printf("# body %d: '%s', yajl says %s\n", w, res.msg, want);
        PCR_CHECK_EQ_INT(res.rc, PCR_ERR_PARSE);
        PCR_CHECK(strstr(res.msg, want) != NULL);
        free(body);
    }
}

/* A large chat body (long prompts with escapes and UTF-8, many messages) in random chunks. */
static void test_random_splits_large(void)
{
    size_t cap = 700000, n = 0;
    char *body = malloc(cap);
    n += (size_t)sprintf(body, "{\"messages\":[");
    for (int m = 0; n < cap - 70000; m++) {
        n += (size_t)sprintf(body + n, "%s{\"role\":\"%s\",\"content\":\"", m ? "," : "",
                             m % 2 ? "assistant" : "user");
        size_t want = m % 7 == 0 ? 60000 : 1 + rnd() % 3000;
        for (size_t i = 0; i < want; i++) {
            uint64_t x = rnd() % 64;
            if (x == 0)
                n += (size_t)sprintf(body + n, "\\n");
            else if (x == 1)
                n += (size_t)sprintf(body + n, "\\u00e9");
            else if (x == 2)
                n += (size_t)sprintf(body + n, "\xe2\x82\xac");
            else
                body[n++] = (char)('a' + x % 26);
        }
        n += (size_t)sprintf(body + n, "\"}");
    }
    n += (size_t)sprintf(body + n, "],\"model\":\"big\"}");
    result_t whole, part;
    read_cut(PCR_API_CHAT, body, n, NULL, 0, 1, &whole);
    PCR_CHECK_EQ_INT(whole.rc, 0);
    PCR_CHECK_EQ_INT(whole.b.nblocks, 2718);  /* all of it: under the 1 MiB horizon */
    for (int round = 0; round < 40; round++) {
        read_random(PCR_API_CHAT, body, n, round % 2 ? 16384 : 3000, &part);
        PCR_CHECK(body_result_same(&whole, &part));
        pcr_body_dispose(&part.b);
    }
    pcr_body_dispose(&whole.b);
    free(body);
}

/* Valid exactly when yajl says so: random edits of valid bodies (quotes, backslashes, control
 * and UTF-8 bytes, brackets) read in random chunks. The first byte stays '{'. */
static void test_validity_parity(void)
{
    static const char spice[] = {'"', '\\', 'u', '0', 'x', 0x01, (char)0xc3, (char)0xa9,
                                 (char)0xe2, (char)0x80, '}', ']', '{', '[', ',', ':', ' ', 'n'};
    int mismatches = 0, invalid = 0;
    for (int round = 0; round < 3000; round++) {
        pcr_api_t api;
        size_t len;
        char *body = make_body((int)(rnd() % 4), &api, &len);
        int edits = 1 + (int)(rnd() % 3);
        for (int e = 0; e < edits; e++) {
            size_t at = 1 + rnd() % (len - 1);
            body[at] = spice[rnd() % sizeof(spice)];
        }
        result_t res;
        read_random(api, body, len, 1 + rnd() % 700, &res);
        int yajl_ok = yajl_error_at(body, len) == (size_t)-1;
        invalid += !yajl_ok;
        if (yajl_ok != (res.rc != PCR_ERR_PARSE)) {
            if (mismatches++ < 3)
                printf("# round %d: yajl %s, reader %d '%s'\n", round, yajl_ok ? "ok" : "invalid",
                       res.rc, res.msg);
        }
        pcr_body_dispose(&res.b);
        free(body);
    }
    PCR_CHECK_EQ_INT(mismatches, 0);
    PCR_CHECK(invalid > 1000);  /* the edits did break bodies */
}

/* A long string's pieces are checked in place for UTF-8 once the scan for its end has found
 * its escapes and control bytes valid; anything else gets the full check. Each escape or byte
 * below, alone in a long prompt and read in random chunks, is valid exactly when yajl says so
 * and, when not, refused at the byte yajl names. */
static void test_long_string_checks(void)
{
    static const char *const cases[] = {
        "\\u00e9", "\\uD83D\\uDE00", "\\ud83d\\ude00", "\\uD83D", "\\uDE00x", "\\uD83Dabc",
        "\\u12G4", "\\u12", "\\x", "\\/", "\\b\\f\\n\\r\\t\\\"\\\\", "\\\x01",
        "\x01", "\x1f", "\x7f", "\xc3\xa9", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
        "\xe2\x82", "\xf0\x9f\x98\x80", "\xff", "\\u0000", "\\uFFFF", "\\uDBFF\\uDFFF",
    };
    int mismatches = 0, invalid = 0;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int place = 0; place < 6; place++) {
            /* The case at the start, the middle or the end of a 3000-byte prompt, and where a
             * 16 KiB piece may end. */
            size_t before = place == 0 ? 0 : place == 1 ? 1500 : place == 2 ? 2990
                          : place == 3 ? 600 : place == 4 ? 2047 : 1;
            char body[4096];
            size_t n = (size_t)snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"");
            memset(body + n, 'a', before);
            n += before;
            size_t cl = strlen(cases[c]);
            memcpy(body + n, cases[c], cl);
            n += cl;
            memset(body + n, 'b', 3000 - before);
            n += 3000 - before;
            n += (size_t)snprintf(body + n, sizeof(body) - n, "\"}");
            size_t want = yajl_error_at(body, n);
            invalid += want != (size_t)-1;
            for (int round = 0; round < 8; round++) {
                result_t res;
                if (round == 0)
                    read_cut(PCR_API_COMPLETIONS, body, n, NULL, 0, 1, &res);
                else
                    read_random(PCR_API_COMPLETIONS, body, n, 1 + rnd() % 2000, &res);
                int ok = res.rc != PCR_ERR_PARSE;
                char at[48];
                snprintf(at, sizeof(at), "at byte %zu", want);
                if (ok != (want == (size_t)-1) || (!ok && strstr(res.msg, at) == NULL)) {
                    if (mismatches++ < 3)
                        printf("# case %zu place %d: yajl %zd, reader %d '%s'\n", c, place,
                               (ssize_t)want, res.rc, res.msg);
                }
                pcr_body_dispose(&res.b);
            }
        }
    }
    PCR_CHECK_EQ_INT(mismatches, 0);
    printf("# %d of %zu bodies invalid\n", invalid, 6 * sizeof(cases) / sizeof(cases[0]));
    PCR_CHECK(invalid >= 6 * 6);  /* the bad escapes and bytes were refused in every place */
}

static size_t heap_used(void)
{
    return mallinfo2().uordblks;
}

/* Feeds `len` bytes made by gen() in 16 KiB chunks; returns the reader's rc and the heap it
 * grew by at its largest while being fed. */
static int feed_generated(pcr_api_t api, size_t len, void (*gen)(char *, size_t, size_t),
                          size_t *grew, result_t *res)
{
    char chunk[16384];
    pcr_body_reader_cache_clear();  /* a fresh reader: its growth is all counted */
    size_t base = heap_used(), peak = 0;
    pcr_body_reader_t *r = pcr_body_reader_new(api, NULL);
    int rc = 0;
    for (size_t off = 0; off < len && rc == 0; off += sizeof(chunk)) {
        size_t n = len - off < sizeof(chunk) ? len - off : sizeof(chunk);
        gen(chunk, off, n);
        rc = pcr_body_reader_feed(r, chunk, n);
        size_t used = heap_used() - base;
        peak = used > peak ? used : peak;
    }
    memset(res, 0, sizeof(*res));
    if (rc == 0)
        rc = pcr_body_reader_finish(r, &res->b);
    snprintf(res->msg, sizeof(res->msg), "%s", pcr_body_reader_error(r));
    pcr_body_reader_free(r);
    *grew = peak;
    printf("# heap grew by %zu bytes at most\n", peak);
    return rc;
}

static size_t g_len;

static void gen_deep(char *out, size_t off, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = off + i == 0 ? '{' : off + i < 5 ? "\"x\":"[off + i - 1] : '[';
}

static const char msgs_head[] = "{\"messages\":[";
static const char msgs_one[] = "{\"role\":\"user\",\"content\":\"0123456789\"},";
#define MSGS_LEN(n) (sizeof(msgs_head) - 1 + (n) * (sizeof(msgs_one) - 1) + 4)

/* {"messages":[ then copies of one message, then {}]} */
static void gen_messages(char *out, size_t off, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t p = off + i;
        if (p < sizeof(msgs_head) - 1)
            out[i] = msgs_head[p];
        else if (p >= g_len - 4)
            out[i] = "{}]}"[p - (g_len - 4)];
        else
            out[i] = msgs_one[(p - (sizeof(msgs_head) - 1)) % (sizeof(msgs_one) - 1)];
    }
}

static void gen_prompt(char *out, size_t off, size_t n)
{
    static const char head[] = "{\"prompt\":\"";
    for (size_t i = 0; i < n; i++) {
        size_t p = off + i;
        out[i] = p < sizeof(head) - 1 ? head[p] : p == g_len - 2 ? '"' : p == g_len - 1 ? '}'
               : p % 50 == 0 ? '\\' : p % 50 == 1 ? 'n' : (char)('a' + p % 26);
    }
}

static void gen_number(char *out, size_t off, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = off + i < 6 ? "{\"n\":1"[off + i] : '7';
}

static void test_limits_bounded(void)
{
    size_t grew;
    result_t res;
#if defined(__SANITIZE_ADDRESS__)
    const int heap_known = 0;  /* ASan's allocator does not fill mallinfo2 */
#else
    const int heap_known = 1;
#endif
    /* 4 MiB of '[': refused at depth 256, without holding the rest. */
    g_len = 4 << 20;
    PCR_CHECK_EQ_INT(feed_generated(PCR_API_CHAT, g_len, gen_deep, &grew, &res), PCR_ERR_PARSE);
    PCR_CHECK(strstr(res.msg, "nests deeper than 256 levels") != NULL);
    PCR_CHECK(!heap_known || grew < 64 * 1024);
    /* 250,000 messages (10 MB): fine, and read in bounded memory. */
    g_len = MSGS_LEN(250000);
    PCR_CHECK_EQ_INT(feed_generated(PCR_API_CHAT, g_len, gen_messages, &grew, &res), PCR_ERR_INVAL);
    PCR_CHECK_STR(res.msg, "'messages[250000].role' must be a string");  /* the last is {} */
    PCR_CHECK(!heap_known || grew < 64 * 1024);
    /* An 8 MiB prompt: the reader keeps none of it. */
    g_len = 8 << 20;
    PCR_CHECK_EQ_INT(feed_generated(PCR_API_COMPLETIONS, g_len, gen_prompt, &grew, &res), 0);
    PCR_CHECK_EQ_INT(res.b.nblocks, 4096);  /* max_prefix_bytes: only the first 1 MiB */
    PCR_CHECK_EQ_INT(res.b.prompt_tokens, (g_len - 13 + 3) / 4);
    PCR_CHECK(!heap_known || grew < 64 * 1024);
    pcr_body_dispose(&res.b);
    /* A 1 MiB number: refused at 256 digits (yajl would re-scan it as it grows). */
    g_len = 1 << 20;
    PCR_CHECK_EQ_INT(feed_generated(PCR_API_CHAT, g_len, gen_number, &grew, &res), PCR_ERR_PARSE);
    PCR_CHECK_STR(res.msg, "request body is not valid JSON (at byte 261: a number or word longer than 256 bytes)");
    pcr_body_t b;
    char num[300];
    memset(num, '9', sizeof(num));
    snprintf(num, sizeof(num), "{\"messages\":[],\"n\":1%0255d}", 0);
    PCR_CHECK_EQ_INT(pcr_body_parse(PCR_API_CHAT, num, strlen(num), &b, res.msg, sizeof(res.msg)), 0);
    pcr_body_dispose(&b);
}

/* The reader's contract around its calls. */
static void test_feed_contract(void)
{
    pcr_body_reader_t *r = pcr_body_reader_new(PCR_API_CHAT, NULL);
    pcr_body_t b;
    PCR_CHECK_EQ_INT(pcr_body_reader_feed(r, "", 0), 0);
    PCR_CHECK_EQ_INT(pcr_body_reader_feed(r, "{\"messages\":[]", 14), 0);
    PCR_CHECK_EQ_INT(pcr_body_reader_feed(r, NULL, 0), 0);
    PCR_CHECK_EQ_INT(pcr_body_reader_feed(r, "}", 1), 0);
    PCR_CHECK_STR(pcr_body_reader_error(r), "");
    PCR_CHECK_EQ_INT(pcr_body_reader_finish(r, &b), 0);
    pcr_body_dispose(&b);
    PCR_CHECK(pcr_body_reader_finish(r, &b) != 0);  /* once only */
    PCR_CHECK(b.blocks == NULL);
    pcr_body_reader_free(r);
    /* After an error, every call gives it again. */
    r = pcr_body_reader_new(PCR_API_CHAT, NULL);
    PCR_CHECK_EQ_INT(pcr_body_reader_feed(r, "{\"a\":x", 6), 0);  /* "x..." may go on */
    PCR_CHECK_EQ_INT(pcr_body_reader_feed(r, "}", 1), PCR_ERR_PARSE);
    PCR_CHECK_EQ_INT(pcr_body_reader_feed(r, "}", 1), PCR_ERR_PARSE);
    PCR_CHECK_EQ_INT(pcr_body_reader_finish(r, &b), PCR_ERR_PARSE);
    PCR_CHECK(strstr(pcr_body_reader_error(r), "at byte 6") != NULL);  /* yajl: after the x */
    pcr_body_reader_free(r);
    pcr_body_reader_free(NULL);
    pcr_body_opts_t o = {0, 100, 0};
    PCR_CHECK(pcr_body_reader_new(PCR_API_CHAT, &o) == NULL);
}

/* Readers are recycled (body.h): whatever the last body of a reader was (an error in P, in V,
 * a body V accepted, other opts), the next body read with it gives exactly what a new reader
 * gives. */
static void test_recycled(void)
{
    result_t fresh[NBODIES], again;
    for (int w = 0; w < NBODIES; w++) {
        pcr_api_t api;
        size_t len;
        char *body = make_body(w, &api, &len);
        pcr_body_reader_cache_clear();
        read_cut(api, body, len, NULL, 0, 1, &fresh[w]);
        free(body);
    }
    int bad = 0;
    for (int before = 0; before < NBODIES; before++) {
        for (int w = 0; w < NBODIES; w++) {
            pcr_api_t api;
            size_t len;
            char *body = make_body(before, &api, &len);
            pcr_body_reader_cache_clear();
            read_cut(api, body, len, NULL, 0, 1, &again);  /* leaves its reader spare */
            pcr_body_dispose(&again.b);
            free(body);
            body = make_body(w, &api, &len);
            size_t cut = len / 2;
            read_cut(api, body, len, &cut, 1, 1, &again);
            if (!body_result_same(&fresh[w], &again) && bad++ < 3)
                printf("# body %d after %d: rc %d '%s' vs %d '%s'\n", w, before, again.rc,
                       again.msg, fresh[w].rc, fresh[w].msg);
            pcr_body_dispose(&again.b);
            free(body);
        }
    }
    PCR_CHECK_EQ_INT(bad, 0);
    /* Other block sizes than the spare reader's: its key is made for the new ones. */
    pcr_body_opts_t o;
    pcr_body_opts_default(&o);
    o.block_bytes = 16;
    pcr_body_t b1, b2;
    char err[256];
    static const char small[] = "{\"prompt\":\"0123456789abcdefghijklmnopqrstuvwxyz\"}";
    pcr_body_reader_cache_clear();
    PCR_CHECK_EQ_INT(pcr_body_parse_opts(PCR_API_COMPLETIONS, &o, small, strlen(small), &b1, err,
                                         sizeof(err)), 0);
    PCR_CHECK_EQ_INT(b1.nblocks, 3);
    PCR_CHECK_EQ_INT(pcr_body_parse(PCR_API_COMPLETIONS, small, strlen(small), &b2, err,
                                    sizeof(err)), 0);
    PCR_CHECK_EQ_INT(b2.nblocks, 1);
    uint64_t want = b2.blocks[0];
    pcr_body_dispose(&b1);
    pcr_body_dispose(&b2);
    /* More readers alive at once than are kept, all freed, then used again. */
    pcr_body_reader_t *many[40];
    for (size_t i = 0; i < PCR_ARRAY_SIZE(many); i++)
        many[i] = pcr_body_reader_new(PCR_API_COMPLETIONS, NULL);
    for (size_t i = 0; i < PCR_ARRAY_SIZE(many); i++)
        pcr_body_reader_free(many[i]);
    for (size_t i = 0; i < PCR_ARRAY_SIZE(many); i++) {
        many[i] = pcr_body_reader_new(PCR_API_COMPLETIONS, NULL);
        PCR_CHECK_EQ_INT(pcr_body_reader_feed(many[i], small, strlen(small)), 0);
        PCR_CHECK_EQ_INT(pcr_body_reader_finish(many[i], &b1), 0);
        PCR_CHECK_EQ_INT(b1.nblocks, 1);
        PCR_CHECK(b1.blocks[0] == want);
        pcr_body_dispose(&b1);
    }
    for (size_t i = 0; i < PCR_ARRAY_SIZE(many); i++)
        pcr_body_reader_free(many[i]);
    for (int w = 0; w < NBODIES; w++)
        pcr_body_dispose(&fresh[w].b);
    pcr_body_reader_cache_clear();
}

int main(void)
{
    PCR_RUN(test_every_split);
    PCR_RUN(test_error_bytes);
    PCR_RUN(test_random_splits_large);
    PCR_RUN(test_validity_parity);
    PCR_RUN(test_long_string_checks);
    PCR_RUN(test_limits_bounded);
    PCR_RUN(test_feed_contract);
    PCR_RUN(test_recycled);
    return pcr_test_done();
}
