/* router/obs/version.c: the version, the commit and the libraries' versions (router/obs/version.h).
 *
 * Each library is asked for its version at run time where it has a call for it, because the
 * shared library a binary runs with may be newer than the headers it was built with (a Debian
 * security update replaces the .so, not the binary); the headers' version is printed beside it
 * when they differ. hiredis 0.14 and simdjson have no such call, so only their headers' version
 * is known. */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <event2/event.h>
#include <ares.h>
#include <hiredis/hiredis.h>
#include <http_parser.h>
#include <jansson.h>
#include <nghttp2/nghttp2.h>
#include <openssl/crypto.h>
#include <openssl/opensslv.h>
#include <xxhash.h>
#include <yajl/yajl_version.h>

#include "body_check.h"

#include "version.h"
#include "version_gen.h"

#define PCR_STR_(x) #x
#define PCR_STR(x) PCR_STR_(x)

const char *pcr_version_string(void) { return PCR_VERSION_PROJECT; }

const char *pcr_version_commit(void)
{
    /* vcs_tag leaves the fallback when git failed; an empty answer is no commit either. */
    return PCR_VERSION_COMMIT[0] != '\0' ? PCR_VERSION_COMMIT : "unknown";
}

static void lib_line(FILE *f, const char *name, const char *running, const char *built)
{
    if (built == NULL || strcmp(running, built) == 0)
        fprintf(f, "%-12s %s\n", name, running);
    else
        fprintf(f, "%-12s %s (built with %s)\n", name, running, built);
}

/* Three version numbers as "M.m.p". */
static void dotted(char *out, size_t n, unsigned major, unsigned minor, unsigned patch)
{
    snprintf(out, n, "%u.%u.%u", major, minor, patch);
}

/* A version packed in decimal as MMmmpp (xxHash's and yajl's), as "M.m.p". */
static void dotted_decimal(char *out, size_t n, unsigned v)
{
    dotted(out, n, v / 10000, v / 100 % 100, v % 100);
}

void pcr_version_print(FILE *f)
{
    char run[32], built[32];
    fprintf(f, "pcrouter %s\n", pcr_version_string());
    lib_line(f, "commit:", pcr_version_commit(), NULL);
    lib_line(f, "libevent:", event_get_version(), LIBEVENT_VERSION);
    lib_line(f, "nghttp2:", nghttp2_version(0)->version_str, NGHTTP2_VERSION);
    lib_line(f, "OpenSSL:", OpenSSL_version(OPENSSL_VERSION), OPENSSL_VERSION_TEXT);
    lib_line(f, "jansson:", jansson_version_str(), JANSSON_VERSION);
    lib_line(f, "cJSON:", cJSON_Version(),
             PCR_STR(CJSON_VERSION_MAJOR) "." PCR_STR(CJSON_VERSION_MINOR) "." PCR_STR(CJSON_VERSION_PATCH));
    lib_line(f, "c-ares:", ares_version(NULL), ARES_VERSION_STR);
    lib_line(f, "hiredis:",
             PCR_STR(HIREDIS_MAJOR) "." PCR_STR(HIREDIS_MINOR) "." PCR_STR(HIREDIS_PATCH)
             " (headers; the library does not report its version)", NULL);
    unsigned long hp = http_parser_version();
    dotted(run, sizeof(run), (unsigned)(hp >> 16) & 255, (unsigned)(hp >> 8) & 255, (unsigned)hp & 255);
    dotted(built, sizeof(built), HTTP_PARSER_VERSION_MAJOR, HTTP_PARSER_VERSION_MINOR,
           HTTP_PARSER_VERSION_PATCH);
    lib_line(f, "http-parser:", run, built);
    dotted_decimal(run, sizeof(run), XXH_versionNumber());
    dotted(built, sizeof(built), XXH_VERSION_MAJOR, XXH_VERSION_MINOR, XXH_VERSION_RELEASE);
    lib_line(f, "xxHash:", run, built);
    dotted_decimal(run, sizeof(run), (unsigned)yajl_version());
    dotted(built, sizeof(built), YAJL_MAJOR, YAJL_MINOR, YAJL_MICRO);
    lib_line(f, "yajl:", run, built);
    char sj[64];
    snprintf(sj, sizeof(sj), "%s (headers; the library does not report its version)",
             pcr_body_check_simdjson_version());
    lib_line(f, "simdjson:", sj, NULL);
}
