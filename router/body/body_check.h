/* router/body/body_check.h: a fast check that a piece of a long string is valid JSON string text,
 * with simdjson (router/body/body_check.cpp), for body_scan.c.
 *
 * Why: a long string's contents are most of a long prompt's bytes, and they must be checked
 * after each chunk arrives, the last chunk too. yajl scans them at about 2.4 GB/s here
 * (7 us for a 16 KiB chunk: most of the 10 us a decision may take after the last byte);
 * simdjson checks the same bytes at about 8 GB/s, and its UTF-8 kernel alone (for a piece whose
 * escapes and control bytes body_scan.c found valid as it looked for the string's end) at
 * several times that. simdjson accepts fewer strings than yajl
 * (it refuses lone surrogates, overlong forms, code points past U+10FFFF), never more, so
 * body_scan.c asks yajl about any piece simdjson refuses, and yajl's verdict and error
 * message stand: the body's validity is yajl's, whatever the check. */
#ifndef PCR_ROUTER_BODY_CHECK_H
#define PCR_ROUTER_BODY_CHECK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes past the end that must be readable (simdjson's SIMD loads read ahead; their values do
 * not matter). */
#define PCR_BODY_CHECK_PADDING 64

/* 1 when buf[0, len) is one JSON string token ("...") that simdjson accepts, else 0 (also when
 * out of memory). Uses one parser per thread, kept between calls. */
int pcr_body_check_string(const char *buf, size_t len);

/* 1 when buf[0, len) is valid UTF-8 as simdjson checks it (no overlong forms, no surrogates,
 * nothing past U+10FFFF), else 0. Reads only buf[0, len). The fast check of a piece whose
 * escapes and control bytes the scanner has already found valid: simdjson's UTF-8 kernel runs
 * at several times the speed of its string parser. */
int pcr_body_check_utf8(const char *buf, size_t len);

/* The simdjson version the binary was built with ("3.0.1"): Debian builds simdjson as a shared
 * library with no call that reports its own, so --version can only show the headers'. */
const char *pcr_body_check_simdjson_version(void);

#ifdef __cplusplus
}
#endif

#endif
