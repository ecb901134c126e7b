/* router/obs/accesslog.h: where access-log lines go: stderr or log.access_log_path, written by a
 * thread of its own so that no event loop ever waits on a disk or a pipe.
 *
 * Each worker has a queue (a ring of whole lines, one producer, the writer the one consumer);
 * a line that finds its queue full is dropped and counted, never waited for. The file is
 * opened for appending and reopened on request (SIGUSR1, for log rotation, or a reload that
 * names another file): the writer first writes every line queued before, so each line lands
 * in exactly one of the two files. Made on the main thread before the workers start; freed
 * after they stopped, once every queued line is written. */
#ifndef PCR_ROUTER_ACCESSLOG_H
#define PCR_ROUTER_ACCESSLOG_H

#include <stddef.h>
#include <stdint.h>

#include "pcr/common.h"

typedef struct pcr_accesslog pcr_accesslog_t;

#define PCR_ACCESSLOG_QUEUE_BYTES (1024 * 1024)  /* per worker */
#define PCR_ACCESSLOG_MAX_LINE (16 * 1024)       /* longer lines are dropped */

/* `path` "" or NULL: stderr. `queue_bytes` per queue, rounded up to a power of two (at least
 * PCR_ACCESSLOG_MAX_LINE). NULL when the file cannot be opened or the thread not started:
 * `err` (errlen bytes) says why. */
pcr_accesslog_t *pcr_accesslog_new(const char *path, unsigned nqueues, size_t queue_bytes,
                                   char *err, size_t errlen);
/* Writes what is queued, stops the writer, closes the file. NULL is a no-op. No queue may be
 * written to from here on. */
void pcr_accesslog_free(pcr_accesslog_t *al);

/* One line, ending with '\n', from the owner of queue `q` (its worker). Never blocks: 0, or
 * the line is dropped and counted: PCR_ERR_FULL (the queue is), PCR_ERR_TOO_LARGE (the line
 * is longer than PCR_ACCESSLOG_MAX_LINE); PCR_ERR_INVAL for no such queue. */
int pcr_accesslog_write(pcr_accesslog_t *al, unsigned q, const char *line, size_t len);

/* A line that could not be made: counted with the dropped ones. */
void pcr_accesslog_drop(pcr_accesslog_t *al);

/* Any thread: the writer reopens the file after writing what is queued; `path` non-NULL
 * switches to another file ("" for stderr). A file that cannot be opened is logged and the
 * current one kept. */
void pcr_accesslog_reopen(pcr_accesslog_t *al, const char *path);

/* Lines dropped so far: queue full, too long, or a failed write (any thread). */
uint64_t pcr_accesslog_dropped(const pcr_accesslog_t *al);
/* Reopens done so far (any thread): a test's way of knowing one happened. */
uint64_t pcr_accesslog_reopens(const pcr_accesslog_t *al);

#endif
