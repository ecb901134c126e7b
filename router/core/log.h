/* router/core/log.h: leveled logging to stderr, one line per event, with a UTC timestamp.
 * The access log (one line per request) has a writer of its own (accesslog.h). */
#ifndef PCR_ROUTER_LOG_H
#define PCR_ROUTER_LOG_H

#include "config.h"

#include <stddef.h>

void pcr_log_set_level(pcr_log_level_t level);
/* The time as every log line starts with it, "2026-01-31T12:00:00.123Z" (UTC, ms); returns
 * its length. */
size_t pcr_log_time(char *buf, size_t cap);
int pcr_log_enabled(pcr_log_level_t level);
void pcr_log(pcr_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define pcr_log_error(...) pcr_log(PCR_LOG_ERROR, __VA_ARGS__)
#define pcr_log_warn(...)  pcr_log(PCR_LOG_WARN, __VA_ARGS__)
#define pcr_log_info(...)  pcr_log(PCR_LOG_INFO, __VA_ARGS__)
#define pcr_log_debug(...) do { if (pcr_log_enabled(PCR_LOG_DEBUG)) pcr_log(PCR_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
