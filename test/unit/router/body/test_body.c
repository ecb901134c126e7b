/* test_body.c: router/body/body.c, request bodies to canonical prompt bytes and prefix keys: the
 * format, the fields, the key's properties, the errors. Chunking: test_body_scan.c. */
#include <malloc.h>
#include <stdlib.h>

#include "body.h"
#include "memacct.h"
#include "memcount.h"
#include "pcr/common.h"
#include "pcr/prefix.h"
#include "pcr_test.h"

static char err[256];

static int parse(pcr_api_t api, const char *json, pcr_body_t *b)
{
    err[0] = '\0';
    return pcr_body_parse(api, json, strlen(json), b, err, sizeof(err));
}

static int key_is(const pcr_body_t *b, const char *want, size_t n)
{
    return b->key_len == n && memcmp(b->key, want, n) == 0;
}

static int same_blocks(const pcr_body_t *a, const pcr_body_t *b)
{
    return a->nblocks == b->nblocks &&
           memcmp(a->blocks, b->blocks, a->nblocks * sizeof(uint64_t)) == 0;
}

static void test_completions_string(void)
{
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS,
                           "{\"model\":\"llama\",\"prompt\":\"Hello\\nworld\",\"stream\":true}", &b), 0);
    PCR_CHECK_STR(b.model, "llama");
    PCR_CHECK_EQ_INT(b.model_len, 5);
    PCR_CHECK(key_is(&b, "Hello\\nworld", 12));  /* raw: the escape as sent */
    PCR_CHECK_EQ_INT(b.stream, 1);
    PCR_CHECK_EQ_INT(b.include_usage, 0);
    PCR_CHECK_EQ_INT(b.prompt_tokens, 3);
    PCR_CHECK_EQ_INT(b.nblocks, 1);
    /* The key is pcr/prefix.h's of those bytes and that model. */
    uint64_t want[2];
    PCR_CHECK_EQ_INT(pcr_prefix_hash("llama", 5, "Hello\\nworld", 12, 256, 131072, want), 1);
    PCR_CHECK_EQ_U64(b.blocks[0], want[0]);
    pcr_key_t k = pcr_body_key(&b);
    PCR_CHECK(k.blocks == b.blocks && k.nblocks == 1 && k.prompt_tokens == 3);
    PCR_CHECK_EQ_INT(b.stream_options, 0);
    pcr_body_dispose(&b);
    pcr_body_dispose(&b);  /* safe twice */
    /* Any stream_options, even one that asks for nothing, is the client's: noted. */
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS,
                           "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{}}", &b), 0);
    PCR_CHECK_EQ_INT(b.stream_options, 1);
    pcr_body_dispose(&b);
}

static void test_completions_arrays(void)
{
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"prompt\": [1, 2,  3]}", &b), 0);
    PCR_CHECK_STR(b.model, "");
    PCR_CHECK_EQ_INT(b.model_len, 0);
    PCR_CHECK(key_is(&b, "\x06[1,2,3]", 8));
    PCR_CHECK_EQ_INT(b.stream, 0);
    pcr_body_dispose(&b);
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS,
                           "{\"prompt\":[\"a\", [1.5e3, true, null], {\"k\" : \"v\"}],\"model\":\"m\"}",
                           &b), 0);
    const char *want = "\x06[\"a\",[1.5e3,true,null],{\"k\":\"v\"}]";
    PCR_CHECK(key_is(&b, want, strlen(want)));
    pcr_body_dispose(&b);
    /* A string prompt that reads like an array is not the array. */
    pcr_body_t s;
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"prompt\":\"[1,2,3]\"}", &s), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"prompt\":[1,2,3]}", &b), 0);
    PCR_CHECK(!same_blocks(&s, &b));
    pcr_body_dispose(&s);
    pcr_body_dispose(&b);
}

static void test_stream_options(void)
{
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"stream_options\":{\"x\":[true],\"include_usage\":true},\"stream\":false,"
                           "\"messages\":[],\"other\":{\"stream\":true}}", &b), 0);
    PCR_CHECK_EQ_INT(b.stream, 0);
    PCR_CHECK_EQ_INT(b.include_usage, 1);
    PCR_CHECK_EQ_INT(b.nblocks, 0);
    PCR_CHECK_EQ_INT(b.prompt_tokens, 0);
    pcr_body_dispose(&b);
    /* Only the top level's "stream" counts, and only a boolean. */
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"x\":{\"stream\":true},\"stream\":1,\"messages\":[]}", &b), 0);
    PCR_CHECK_EQ_INT(b.stream, 0);
    pcr_body_dispose(&b);
}

/* max_tokens and max_completion_tokens may come together (a chat request from a client that
 * sends both names); the larger is what the request may cost. Each name twice is refused. */
static void test_max_tokens_both_names(void)
{
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[],\"max_tokens\":16,"
                           "\"max_completion_tokens\":32}", &b), 0);
    PCR_CHECK_EQ_INT(b.max_tokens, 32);
    pcr_body_dispose(&b);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[],\"max_completion_tokens\":8}", &b), 0);
    PCR_CHECK_EQ_INT(b.max_tokens, 8);
    pcr_body_dispose(&b);
    PCR_CHECK(parse(PCR_API_CHAT, "{\"messages\":[],\"max_tokens\":1,\"max_tokens\":2}", &b) < 0);
}

static void test_chat_format(void)
{
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                           "{\"content\":\"hi\",\"role\":\"user\",\"name\":\"x\"}]}", &b), 0);
    const char *want = "\x02" "Be brief.\x01system\x02hi\x01user";
    PCR_CHECK(key_is(&b, want, strlen(want)));
    PCR_CHECK_EQ_INT(b.context_len, 0);
    pcr_body_dispose(&b);
    /* Tools apart (in the context), tool calls and null content. */
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"tools\":[{\"type\":\"function\", \"f\": {\"a\":[1,{}]}}],\"messages\":[{\"role\":\"user\","
                           "\"content\":\"x\"},{\"role\":\"assistant\",\"content\":null,"
                           "\"tool_calls\":[{\"id\":\"1\"}]}]}", &b), 0);
    want = "\x02x\x01user\x05[{\"id\":\"1\"}]\x01" "assistant";
    PCR_CHECK(key_is(&b, want, strlen(want)));
    PCR_CHECK_STR(b.context, "[{\"type\":\"function\",\"f\":{\"a\":[1,{}]}}]");
    /* Tools count in the prompt's size. */
    PCR_CHECK_EQ_INT(b.prompt_tokens, (b.key_len + b.context_len + 3) / 4);
    pcr_body_dispose(&b);
}

static void test_chat_multipart(void)
{
    pcr_body_t b, s;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"he\"},"
                           "{\"text\":\"llo\",\"type\":\"text\"},{\"type\":\"image_url\",\"image_url\":"
                           "{\"url\":\"http://x/a.png\"}},{\"type\":\"text\",\"text\":\"!\"}]}]}", &b), 0);
    const char *want = "\x02hello\x03\"type\":\"image_url\"\x03\"image_url\":{\"url\":\"http://x/a.png\"}"
                       "\x02!\x01user";
    PCR_CHECK(key_is(&b, want, strlen(want)));
    pcr_body_dispose(&b);
    /* Text parts give the same bytes as the same string content. */
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"h\"},"
                           "{\"type\":\"text\",\"text\":\"i\"}]}]}", &b), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &s), 0);
    PCR_CHECK(b.key_len == s.key_len && memcmp(b.key, s.key, s.key_len) == 0);
    PCR_CHECK(same_blocks(&b, &s));
    pcr_body_dispose(&b);
    pcr_body_dispose(&s);
}

/* Framing cannot be faked by content: a message whose text holds the framing of two messages
 * (as JSON escapes, the only way a control byte can be in a string) differs from them. */
static void test_chat_unambiguous(void)
{
    pcr_body_t a, b;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0001user\\u0002hi\"}]}", &a), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                           "{\"role\":\"user\",\"content\":\"hi\"}]}", &b), 0);
    PCR_CHECK(a.key_len != b.key_len || memcmp(a.key, b.key, a.key_len) != 0);
    for (size_t i = 0; i < a.key_len; i++)  /* no control byte but the framing's */
        PCR_CHECK((unsigned char)a.key[i] >= 0x20 || i == 0 || i == a.key_len - 5);
    pcr_body_dispose(&a);
    pcr_body_dispose(&b);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"ab\",\"content\":\"c\"}]}", &a), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"a\",\"content\":\"bc\"}]}", &b), 0);
    PCR_CHECK(a.key_len != b.key_len || memcmp(a.key, b.key, a.key_len) != 0);
    pcr_body_dispose(&a);
    pcr_body_dispose(&b);
    /* One message "ab" is not two messages "a", "b". */
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":\"ab\"}]}", &a), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"text\","
                           "\"text\":\"a\"},{\"type\":\"image\"},{\"type\":\"text\",\"text\":\"b\"}]}]}", &b), 0);
    PCR_CHECK(a.key_len != b.key_len || memcmp(a.key, b.key, a.key_len) != 0);
    pcr_body_dispose(&a);
    pcr_body_dispose(&b);
}

/* A conversation's next turn extends the previous turn's bytes, and so its full blocks. */
static void test_chat_turns_share_prefix(void)
{
    pcr_body_t t1, t2;
    char big[3000];
    for (size_t i = 0; i < sizeof(big) - 1; i++)
        big[i] = (char)('a' + i % 23);
    big[sizeof(big) - 1] = '\0';
    char *b1 = malloc(8000), *b2 = malloc(8000);
    snprintf(b1, 8000, "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
             "{\"role\":\"user\",\"content\":\"q1\"}],\"temperature\":0.5}", big);
    snprintf(b2, 8000, "{\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
             "{\"role\":\"user\",\"content\":\"q1\"},{\"content\":\"a1\",\"role\":\"assistant\"},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q2\"}]}],\"model\":\"m\"}", big);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, b1, &t1), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, b2, &t2), 0);
    PCR_CHECK(t2.key_len > t1.key_len);
    PCR_CHECK(memcmp(t1.key, t2.key, t1.key_len) == 0);
    size_t full = t1.key_len / 256;
    PCR_CHECK_EQ_INT(full, 11);
    PCR_CHECK(t2.nblocks > full);
    PCR_CHECK(memcmp(t1.blocks, t2.blocks, full * sizeof(uint64_t)) == 0);
    pcr_body_dispose(&t1);
    pcr_body_dispose(&t2);
    free(b1);
    free(b2);
}

/* Where "model" and "tools" come does not matter; what they are does, in every block. */
static void test_field_order_and_models(void)
{
    static const char *const same[] = {
        "{\"model\":\"m\",\"tools\":[{\"a\":1}],\"messages\":[{\"role\":\"u\",\"content\":\"hello\"}]}",
        "{\"messages\":[{\"role\":\"u\",\"content\":\"hello\"}],\"tools\":[{\"a\":1}],\"model\":\"m\"}",
        "{\"tools\":[{\"a\": 1}],\"messages\":[{\"role\":\"u\",\"content\":\"hello\"}],\"model\":\"m\"}",
        "{\"messages\":[{\"role\":\"u\",\"content\":\"hello\"}],\"model\":\"m\",\"tools\":[ {\"a\":1} ]}",
    };
    pcr_body_t b[4], o;
    for (int i = 0; i < 4; i++)
        PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, same[i], &b[i]), 0);
    for (int i = 1; i < 4; i++)
        PCR_CHECK(same_blocks(&b[0], &b[i]));
    /* Another model, other tools, no tools: no block in common. */
    static const char *const other[] = {
        "{\"model\":\"m2\",\"tools\":[{\"a\":1}],\"messages\":[{\"role\":\"u\",\"content\":\"hello\"}]}",
        "{\"model\":\"m\",\"tools\":[{\"a\":2}],\"messages\":[{\"role\":\"u\",\"content\":\"hello\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"u\",\"content\":\"hello\"}]}",
    };
    for (int i = 0; i < 3; i++) {
        PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, other[i], &o), 0);
        PCR_CHECK(o.nblocks == 1 && o.blocks[0] != b[0].blocks[0]);
        pcr_body_dispose(&o);
    }
    for (int i = 0; i < 4; i++)
        pcr_body_dispose(&b[i]);
    /* Completions: the model after a prompt of many blocks. */
    char *p1 = malloc(4200), *p2 = malloc(4200);
    char text[4000];
    memset(text, 'x', sizeof(text) - 1);
    text[sizeof(text) - 1] = '\0';
    snprintf(p1, 4200, "{\"model\":\"a\",\"prompt\":\"%s\"}", text);
    snprintf(p2, 4200, "{\"prompt\":\"%s\",\"model\":\"a\"}", text);
    pcr_body_t c1, c2;
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, p1, &c1), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, p2, &c2), 0);
    PCR_CHECK_EQ_INT(c1.nblocks, 16);
    PCR_CHECK(same_blocks(&c1, &c2));
    pcr_body_dispose(&c2);
    snprintf(p2, 4200, "{\"prompt\":\"%s\",\"model\":\"b\"}", text);
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, p2, &c2), 0);
    for (size_t i = 0; i < c1.nblocks; i++)
        for (size_t j = 0; j < c2.nblocks; j++)
            PCR_CHECK(c1.blocks[i] != c2.blocks[j]);
    pcr_body_dispose(&c1);
    pcr_body_dispose(&c2);
    free(p1);
    free(p2);
}

static void test_errors(void)
{
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\": [", &b), PCR_ERR_PARSE);
    PCR_CHECK(strstr(err, "not valid JSON (at byte 14") != NULL);
    PCR_CHECK(b.key == NULL && b.model == NULL && b.blocks == NULL);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "", &b), PCR_ERR_PARSE);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "[1,2]", &b), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "request body must be a JSON object");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "\"x\"", &b), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "request body must be a JSON object");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{} x", &b), PCR_ERR_PARSE);
    PCR_CHECK(strstr(err, "has data after its JSON value") != NULL);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"a\":1,\"b\":nul,\"c\":2}", &b), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "request body is not valid JSON (at byte 14: invalid string in json text)");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"a\":\"x\\qy\"}", &b), PCR_ERR_PARSE);
    PCR_CHECK(strstr(err, "(at byte 8:") != NULL);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"a\":\"unterminated", &b), PCR_ERR_PARSE);
    PCR_CHECK(strstr(err, "ends inside a string") != NULL);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages' is required");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":\"hi\"}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages' must be an array");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"u\"},3]}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages[1]' must be an object");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages[0].role' must be a string");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":5}]}", &b),
                     PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages[0].content' must be a string, an array or null");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"text\"}]}]}", &b),
                     PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages[0].content[0].text' must be a string");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"u\",\"content\":[{},{\"text\":7}]}]}", &b),
                     PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages[0].content[1].text' must be a string");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[\"x\"]}]}", &b),
                     PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages[0].content[0]' must be an object");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[],\"messages\":[]}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "request body has 'messages' more than once");
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"model\":\"m\"}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'prompt' is required");
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"prompt\":{}}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'prompt' must be a string or an array");
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"prompt\":\"x\",\"model\":7}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'model' must be a string");
    /* "messages" is not a completion's prompt, nor "prompt" a chat's messages. */
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"messages\":[]}", &b), PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"prompt\":\"x\"}", &b), PCR_ERR_INVAL);
    /* A JSON error wins over a field error, wherever each is. */
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":\"hi\", x}", &b), PCR_ERR_PARSE);
    PCR_CHECK(b.key == NULL && b.model == NULL && b.blocks == NULL);
    /* Not NUL-terminated: only len bytes are read. */
    const char buf[] = "{\"prompt\":\"abc\"}GARBAGE";
    PCR_CHECK_EQ_INT(pcr_body_parse(PCR_API_COMPLETIONS, buf, 16, &b, err, sizeof(err)), 0);
    PCR_CHECK(key_is(&b, "abc", 3));
    pcr_body_dispose(&b);
    PCR_CHECK_EQ_INT(pcr_body_parse(PCR_API_COMPLETIONS, NULL, 3, &b, err, sizeof(err)), PCR_ERR_INVAL);
}

/* Names we read are bounded; longer ones are refused, not cut. */
static void test_name_limits(void)
{
    char *body = malloc(4096), name[700];
    memset(name, 'n', sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    pcr_body_t b;
    snprintf(body, 4096, "{\"model\":\"%.512s\",\"prompt\":\"x\"}", name);
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, body, &b), 0);
    PCR_CHECK_EQ_INT(b.model_len, 512);
    pcr_body_dispose(&b);
    snprintf(body, 4096, "{\"model\":\"%s\",\"prompt\":\"x\"}", name);
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, body, &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'model' is longer than 512 bytes");
    snprintf(body, 4096, "{\"messages\":[{\"role\":\"%s\",\"content\":\"x\"}]}", name);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, body, &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages[0].role' is longer than 512 bytes");
    snprintf(body, 4096, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"%s\":1}]}]}", name);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, body, &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages[0].content[0]' has a key longer than 512 bytes");
    /* A long key we do not read is fine, and a long key in tools is hashed whole. */
    snprintf(body, 4096, "{\"%s\":1,\"tools\":[{\"%s\":2}],\"messages\":[]}", name, name);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, body, &b), 0);
    PCR_CHECK_EQ_INT(b.context_len, strlen(name) + 8);
    pcr_body_dispose(&b);
    free(body);
}

static void test_large_prompt(void)
{
    size_t n = 1200000;
    char *json = malloc(n + 64);
    char *p = json + sprintf(json, "{\"prompt\":\"");
    for (size_t i = 0; i < n; i++)
        *p++ = (char)('a' + i % 26);
    strcpy(p, "\"}");
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, json, &b), 0);
    PCR_CHECK_EQ_INT(b.key_len, n);
    PCR_CHECK(b.key[0] == 'a' && b.key[n - 1] == (char)('a' + (n - 1) % 26));
    PCR_CHECK_EQ_INT(b.prompt_tokens, n / 4);
    PCR_CHECK_EQ_INT(b.nblocks, 4096);  /* max_prefix_bytes: only the first 1 MiB */
    pcr_body_dispose(&b);
    free(json);
}

/* What one reader holds, as the memory account counts it (PCR_MEM_READER_COST): malloc's bytes
 * in use, and the blocks from router/core/evmem.c's spans, for readers made at the default
 * sizes and fed a body's start, within a tenth. Not under AddressSanitizer or ThreadSanitizer,
 * whose allocators malloc's count does not see. */
static void test_reader_cost(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return;
#endif
    pcr_body_reader_cache_clear();
    enum { N = 64 };
    static const char start[] = "{\"model\":\"m\",\"prompt\":\"a long prompt";
    pcr_body_reader_t *r[N];
    struct mallinfo2 before = mallinfo2();
    uint64_t blocks = pcr_memcount_sum(PCR_MEMCOUNT_READERS);
    for (int i = 0; i < N; i++) {
        r[i] = pcr_body_reader_new(PCR_API_COMPLETIONS, NULL);
        PCR_CHECK(r[i] != NULL);
        PCR_CHECK(pcr_body_reader_feed(r[i], start, sizeof(start) - 1) == 0);
    }
    struct mallinfo2 after = mallinfo2();
    size_t each = (after.uordblks - before.uordblks +
                   (size_t)(pcr_memcount_sum(PCR_MEMCOUNT_READERS) - blocks)) / N;
    PCR_CHECK(each * 10 >= PCR_MEM_READER_COST * 9);
    PCR_CHECK(each * 10 <= PCR_MEM_READER_COST * 11);
    for (int i = 0; i < N; i++)
        pcr_body_reader_free(r[i]);
    pcr_body_reader_cache_clear();
}

int main(void)
{
    PCR_RUN(test_reader_cost);
    PCR_RUN(test_completions_string);
    PCR_RUN(test_completions_arrays);
    PCR_RUN(test_stream_options);
    PCR_RUN(test_max_tokens_both_names);
    PCR_RUN(test_chat_format);
    PCR_RUN(test_chat_multipart);
    PCR_RUN(test_chat_unambiguous);
    PCR_RUN(test_chat_turns_share_prefix);
    PCR_RUN(test_field_order_and_models);
    PCR_RUN(test_errors);
    PCR_RUN(test_name_limits);
    PCR_RUN(test_large_prompt);
    return pcr_test_done();
}
