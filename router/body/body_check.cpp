// router/body/body_check.cpp: router/body/body_check.h with simdjson, the one C++ file of pcrouter:
// a C interface to simdjson's DOM parser, which checks a string token's escapes, UTF-8 and control
// bytes with SIMD. See body_check.h for why and how its verdict is used.
#include <simdjson.h>

#include "body_check.h"

static_assert(simdjson::SIMDJSON_PADDING <= PCR_BODY_CHECK_PADDING,
              "the scanner's buffer must pad what simdjson reads past the end");

extern "C" int pcr_body_check_string(const char *buf, size_t len)
{
    // One per thread: its buffers grow once to the largest piece (about 16 KiB) and stay.
    static thread_local simdjson::dom::parser parser;
    try {
        simdjson::dom::element doc;
        if (parser.parse(buf, len, false).get(doc) != simdjson::SUCCESS)
            return 0;
        return doc.is_string() ? 1 : 0;
    } catch (...) {
        return 0;  // nothing may cross into C; "not accepted" sends the piece to yajl
    }
}

extern "C" int pcr_body_check_utf8(const char *buf, size_t len)
{
    return simdjson::validate_utf8(buf, len) ? 1 : 0;  // noexcept
}

#define PCR_STR_(x) #x
#define PCR_STR(x) PCR_STR_(x)

extern "C" const char *pcr_body_check_simdjson_version(void)
{
    return PCR_STR(SIMDJSON_VERSION);
}
