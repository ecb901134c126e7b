/* test_http1.c: router/core/http1.c, the HTTP/1.1 checks both sides share, against the RFC's own
 * definitions written the slow, obvious way, and the number formatting against printf. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "http1.h"
#include "pcr_test.h"

/* RFC 9110, 5.6.2. */
static int is_tchar(int c)
{
    return c != 0 && (isdigit(c) || (c < 128 && isalpha(c)) || strchr("!#$%&'*+-.^_`|~", c));
}

static void test_token(void)
{
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        char one[3] = {'a', (char)c, 'z'};
        bad += pcr_http_token_valid(one, 3) != is_tchar(c);
        bad += pcr_http_token_valid(one + 1, 1) != is_tchar(c);
    }
    PCR_CHECK_EQ_INT(bad, 0);
    PCR_CHECK(pcr_http_token_valid("Content-Type", 12));
    PCR_CHECK(!pcr_http_token_valid("", 0));
    PCR_CHECK(!pcr_http_token_valid("Host ", 5));
    PCR_CHECK(!pcr_http_token_valid("a\0b", 3));
}

static void test_value(void)
{
    for (int c = 0; c < 256; c++) {
        char v[4] = {'x', ' ', (char)c, 'y'};
        PCR_CHECK_EQ_INT(pcr_http_value_valid(v, 4), c != '\r' && c != '\n' && c != 0);
    }
    PCR_CHECK(pcr_http_value_valid("", 0));
    PCR_CHECK(pcr_http_value_valid("\t\x7f\x80\xff", 4));
}

static void test_hop_by_hop(void)
{
    static const char *const hop[] = {"connection", "keep-alive", "proxy-connection",
                                      "transfer-encoding", "te", "trailer", "upgrade", "host",
                                      "content-length", "expect", "http2-settings"};
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++) {
        char up[32];
        size_t n = strlen(hop[i]);
        for (size_t k = 0; k < n; k++)
            up[k] = (char)(k % 2 ? toupper((unsigned char)hop[i][k]) : hop[i][k]);
        PCR_CHECK(pcr_http_hop_by_hop(hop[i], n, NULL));
        PCR_CHECK(pcr_http_hop_by_hop(up, n, NULL));
        PCR_CHECK(!pcr_http_hop_by_hop(hop[i], n - 1, NULL));  /* a prefix is another name */
    }
    /* Names as long as listed ones, and the usual end-to-end fields. */
    static const char *const e2e[] = {"tx", "hosts", "accept", "trailed", "upgrader",
                                      "connectiom", "keep_alive", "content-lengtx",
                                      "content-type", "authorization", "user-agent", "x"};
    for (size_t i = 0; i < sizeof(e2e) / sizeof(e2e[0]); i++)
        PCR_CHECK(!pcr_http_hop_by_hop(e2e[i], strlen(e2e[i]), NULL));
    PCR_CHECK(pcr_http_hop_by_hop(":path", 5, NULL));
    PCR_CHECK(pcr_http_hop_by_hop("X-Trace", 7, ",close, x-trace"));
    PCR_CHECK(!pcr_http_hop_by_hop("X-Trace", 7, ",x-trace-id"));
}

static void test_numbers(void)
{
    char got[32], want[32];
    int bad = 0;
    for (int i = 0; i < 20000; i++) {
        /* 0-999, the largest value, then every magnitude (a golden-ratio walk, shifted). */
        uint64_t v = i < 1000 ? (uint64_t)i : i == 1000 ? UINT64_MAX
                   : ((uint64_t)i * 0x9E3779B97F4A7C15ull) >> (i % 64);
        size_t n = pcr_http_put_dec(got, v);
        snprintf(want, sizeof(want), "%llu", (unsigned long long)v);
        bad += n != strlen(want) || memcmp(got, want, n) != 0;
        n = pcr_http_put_hex(got, v);
        snprintf(want, sizeof(want), "%llx", (unsigned long long)v);
        bad += n != strlen(want) || memcmp(got, want, n) != 0;
    }
    PCR_CHECK_EQ_INT(bad, 0);
}

int main(void)
{
    PCR_RUN(test_token);
    PCR_RUN(test_value);
    PCR_RUN(test_hop_by_hop);
    PCR_RUN(test_numbers);
    return pcr_test_done();
}
