/* test/fuzz/fuzz_net.h: what the fuzz targets that drive the router over real sockets share
 * (fuzz_h1_request.c, fuzz_h1_response.c, fuzz_h2_request.c): a virtual clock, loopback
 * sockets, byte buffers, the cutting of an input into writes, and running an event loop one
 * turn at a time until nothing moves.
 *
 * The virtual clock. Every deadline of the router is a libevent timer or a pcr_now_us()
 * reading, and both read CLOCK_MONOTONIC through clock_gettime(). fuzz_net.c defines
 * clock_gettime() itself (the executable's definition comes before libc's for every library),
 * and while fuzz_clock_start() is in force on the calling thread, the monotonic clocks read the
 * harness's own time, which moves only by fuzz_clock_advance(): a request head 2 s late is a
 * call, not a 2 s wait, an input replays the same way on any machine, and no wall-clock time
 * can fire a deadline in the middle of an input. Other clocks and other threads (libFuzzer's
 * own timers) read the real time. */
#ifndef PCR_FUZZ_NET_H
#define PCR_FUZZ_NET_H

#include <stddef.h>
#include <stdint.h>

struct event_base;

/* ---- the virtual clock ----------------------------------------------------------------- */

/* From now on this thread's monotonic clock reads the virtual time: from a fixed start the
 * first time; later, from a multiple of a fixed epoch (1000 s) at least one epoch past where
 * the previous input left it. Time never goes back, so a server kept across inputs
 * (fuzz_router.h) sees a monotonic clock, and every timer it armed during an earlier input is
 * due when the next begins: each input starts from the same phase. */
void fuzz_clock_start(void);
void fuzz_clock_stop(void);
void fuzz_clock_advance(uint64_t ms);
uint64_t fuzz_clock_ms(void);   /* virtual milliseconds since the last fuzz_clock_start() */

/* ---- buffers ----------------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t len, cap;
} fuzz_buf_t;

void fuzz_buf_add(fuzz_buf_t *b, const void *data, size_t len);   /* aborts when out of memory */
/* Drops the first n bytes. */
void fuzz_buf_consume(fuzz_buf_t *b, size_t n);
void fuzz_buf_free(fuzz_buf_t *b);
/* memcmp(a, b, n) == 0, where an empty buffer's pointer may be NULL. */
int fuzz_mem_eq(const void *a, const void *b, size_t n);

/* ---- sockets ----------------------------------------------------------------------------- */

/* A non-blocking listening socket on 127.0.0.1, on a port the kernel picks (*port). */
int fuzz_listen(uint16_t *port);
/* A connection waiting on `lfd`, non-blocking, or -1 when none. */
int fuzz_accept(int lfd);
/* Reads what `fd` holds now into `b`: the bytes read; *eof set once the peer closed (or the
 * connection broke). */
size_t fuzz_read(int fd, fuzz_buf_t *b, int *eof);
/* Writes what the socket takes now (never SIGPIPE): the bytes written, 0 when none fit or the
 * peer is gone. */
size_t fuzz_write(int fd, const void *data, size_t len);
/* Closes `fd` with a reset rather than a FIN, so no TIME_WAIT is left behind. */
void fuzz_close_reset(int fd);

/* ---- cutting an input into writes ------------------------------------------------------ */

/* seed 0: one piece; else pieces of 1..max bytes, small ones often, from a xorshift. */
typedef struct {
    uint32_t x;
    size_t max;
} fuzz_split_t;

void fuzz_split_init(fuzz_split_t *s, uint32_t seed, size_t max);
size_t fuzz_split_next(fuzz_split_t *s, size_t left);

/* ---- running the loop ---------------------------------------------------------------------- */

/* The harness's own I/O for one turn (read what the router wrote, answer as the peer): 1 when
 * it moved anything, 0 when not. */
typedef int (*fuzz_step_fn)(void *arg);

/* Runs event-loop turns (EVLOOP_NONBLOCK: until a pass finds no event to run), each followed
 * by `step`, until a step moved nothing and no event waits: what is left waits for the peer,
 * or for time to pass. Each turn counts against *turns; when they run out it returns -1 (the router
 * never goes quiet: a busy loop), else 0. */
int fuzz_run(struct event_base *base, fuzz_step_fn step, void *arg, unsigned *turns);

#endif
