/* test_body.c: router/body.c, request bodies to canonical prompt bytes. */
#include <stdlib.h>

#include "body.h"
#include "pcr/common.h"
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

static void test_completions_string(void)
{
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS,
                           "{\"model\":\"llama\",\"prompt\":\"Hello\\nworld\",\"stream\":true}", &b), 0);
    PCR_CHECK_STR(b.model, "llama");
    PCR_CHECK_EQ_INT(b.model_len, 5);
    PCR_CHECK(key_is(&b, "Hello\nworld", 11));
    PCR_CHECK_EQ_INT(b.stream, 1);
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
    PCR_CHECK(key_is(&b, "[1,2,3]", 7));
    PCR_CHECK_EQ_INT(b.stream, 0);
    pcr_body_dispose(&b);
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"prompt\":[\"a\", \"b\"],\"model\":\"m\"}", &b), 0);
    PCR_CHECK(key_is(&b, "[\"a\",\"b\"]", 9));
    pcr_body_dispose(&b);
}

static void test_chat_format(void)
{
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                           "{\"role\":\"user\",\"content\":\"hi\"}]}", &b), 0);
    const char *want = "M6:systemt9:Be brief.M4:usert2:hi";
    PCR_CHECK(key_is(&b, want, strlen(want)));
    pcr_body_dispose(&b);
    /* Tools first, then messages; tool calls and null content. */
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"tools\":[{\"type\":\"function\"}],\"messages\":[{\"role\":\"user\","
                           "\"content\":\"x\"},{\"role\":\"assistant\",\"content\":null,"
                           "\"tool_calls\":[{\"id\":\"1\"}]}]}", &b), 0);
    want = "T21:[{\"type\":\"function\"}]M4:usert1:xM9:assistantc12:[{\"id\":\"1\"}]";
    PCR_CHECK(key_is(&b, want, strlen(want)));
    pcr_body_dispose(&b);
}

static void test_chat_multipart(void)
{
    pcr_body_t b, s;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"he\"},"
                           "{\"type\":\"text\",\"text\":\"llo\"},{\"type\":\"image_url\",\"image_url\":"
                           "{\"url\":\"http://x/a.png\"}},{\"type\":\"text\",\"text\":\"!\"}]}]}", &b), 0);
    const char *want = "M4:usert5:helloo57:{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x/a.png\"}}t1:!";
    PCR_CHECK(key_is(&b, want, strlen(want)));
    pcr_body_dispose(&b);
    /* Text parts give the same bytes as the same string content. */
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}]}",
                           &b), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &s), 0);
    PCR_CHECK(b.key_len == s.key_len && memcmp(b.key, s.key, s.key_len) == 0);
    pcr_body_dispose(&b);
    pcr_body_dispose(&s);
}

/* Separators cannot be faked by content: a message that contains the framing of two messages
 * differs from those two messages. */
static void test_chat_unambiguous(void)
{
    pcr_body_t a, b;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"at2:hiM4:usert1:x\"}]}", &a), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                           "{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"user\",\"content\":\"x\"}]}", &b), 0);
    PCR_CHECK(a.key_len != b.key_len || memcmp(a.key, b.key, a.key_len) != 0);
    pcr_body_dispose(&a);
    pcr_body_dispose(&b);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"ab\",\"content\":\"c\"}]}", &a), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"a\",\"content\":\"bc\"}]}", &b), 0);
    PCR_CHECK(a.key_len != b.key_len || memcmp(a.key, b.key, a.key_len) != 0);
    pcr_body_dispose(&a);
    pcr_body_dispose(&b);
}

static void test_chat_turns_share_prefix(void)
{
    pcr_body_t t1, t2;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                           "{\"role\":\"user\",\"content\":\"q1\"}],\"temperature\":0.5}", &t1), 0);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                           "{\"role\":\"user\",\"content\":\"q1\"},{\"content\":\"a1\",\"role\":\"assistant\"},"
                           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q2\"}]}],\"model\":\"m\"}",
                           &t2), 0);
    PCR_CHECK(t2.key_len > t1.key_len);
    PCR_CHECK(memcmp(t1.key, t2.key, t1.key_len) == 0);
    pcr_body_dispose(&t1);
    pcr_body_dispose(&t2);
}

static void test_errors(void)
{
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\": [", &b), PCR_ERR_PARSE);
    PCR_CHECK(strstr(err, "not valid JSON") != NULL);
    PCR_CHECK(b.key == NULL && b.model == NULL);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "", &b), PCR_ERR_PARSE);
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "[1,2]", &b), PCR_ERR_PARSE);
    PCR_CHECK_STR(err, "request body must be a JSON object");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{} x", &b), PCR_ERR_PARSE);
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
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT,
                           "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"text\"}]}]}", &b),
                     PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'messages[0].content[0].text' must be a string");
    PCR_CHECK_EQ_INT(parse(PCR_API_CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[\"x\"]}]}", &b),
                     PCR_ERR_INVAL);
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"model\":\"m\"}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'prompt' is required");
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"prompt\":{}}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'prompt' must be a string or an array");
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, "{\"prompt\":\"x\",\"model\":7}", &b), PCR_ERR_INVAL);
    PCR_CHECK_STR(err, "'model' must be a string");
    PCR_CHECK(b.key == NULL && b.model == NULL);
    /* Not NUL-terminated: only len bytes are read. */
    const char buf[] = "{\"prompt\":\"abc\"}GARBAGE";
    PCR_CHECK_EQ_INT(pcr_body_parse(PCR_API_COMPLETIONS, buf, 16, &b, err, sizeof(err)), 0);
    PCR_CHECK(key_is(&b, "abc", 3));
    pcr_body_dispose(&b);
}

static void test_large_prompt(void)
{
    size_t n = 200000;
    char *json = malloc(n + 64);
    char *p = json + sprintf(json, "{\"prompt\":\"");
    for (size_t i = 0; i < n; i++)
        *p++ = (char)('a' + i % 26);
    strcpy(p, "\"}");
    pcr_body_t b;
    PCR_CHECK_EQ_INT(parse(PCR_API_COMPLETIONS, json, &b), 0);
    PCR_CHECK_EQ_INT(b.key_len, n);
    PCR_CHECK(b.key[0] == 'a' && b.key[n - 1] == (char)('a' + (n - 1) % 26));
    pcr_body_dispose(&b);
    free(json);
}

int main(void)
{
    PCR_RUN(test_completions_string);
    PCR_RUN(test_completions_arrays);
    PCR_RUN(test_chat_format);
    PCR_RUN(test_chat_multipart);
    PCR_RUN(test_chat_unambiguous);
    PCR_RUN(test_chat_turns_share_prefix);
    PCR_RUN(test_errors);
    PCR_RUN(test_large_prompt);
    return pcr_test_done();
}
