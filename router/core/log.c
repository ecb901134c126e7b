/* router/core/log.c: owns the stderr log writer. Lines are formatted whole, then written with one
 * write(2), so lines from a busy process never interleave mid-line. */
#include <stdarg.h>
#include <stdio.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static pcr_log_level_t log_level = PCR_LOG_INFO;
static const char *const level_names[] = {"error", "warn", "info", "debug"};

/* A reload sets it on the control thread while workers log: a relaxed atomic. */
void pcr_log_set_level(pcr_log_level_t level) { __atomic_store_n(&log_level, level, __ATOMIC_RELAXED); }

int pcr_log_enabled(pcr_log_level_t level)
{
    return level <= __atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

size_t pcr_log_time(char *buf, size_t cap)
{
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (long)(tv.tv_usec / 1000));
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

void pcr_log(pcr_log_level_t level, const char *fmt, ...)
{
    if (!pcr_log_enabled(level))
        return;
    char line[2048];
    size_t t = pcr_log_time(line, sizeof(line));
    int n = (int)t + snprintf(line + t, sizeof(line) - t, " %s ", level_names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
