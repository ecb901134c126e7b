/* test/fuzz/fuzz_net.c: the shared parts of the socket-driving fuzz targets (fuzz_net.h). */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "fuzz.h"
#include "fuzz_net.h"

/* ---- the virtual clock ----------------------------------------------------------------- */

/* Far from 0, so that no "time since" computed by the router can underflow. */
#define CLOCK_START_NS (1000000ull * 1000000000ull)
/* Each input after the first starts on a multiple of this, at least this far past where the
 * last one ended: every timer a kept server armed before (its tick, back-offs) is then due,
 * and fires at the input's first turn, as it does for every input. */
#define CLOCK_EPOCH_NS (1000ull * 1000000000ull)

static __thread int clock_virtual;
static __thread int clock_started;
static __thread uint64_t clock_ns, clock_input_ns;

/* The executable's clock_gettime() comes first in the dynamic linker's search, so libevent
 * and the router read this one (fuzz_net.h). The real clock is the system call itself: libc's
 * own entry point is the one this definition hides. */
int clock_gettime(clockid_t id, struct timespec *ts)
{
    if (clock_virtual && (id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_COARSE ||
                          id == CLOCK_MONOTONIC_RAW || id == CLOCK_BOOTTIME)) {
        ts->tv_sec = (time_t)(clock_ns / 1000000000u);
        ts->tv_nsec = (long)(clock_ns % 1000000000u);
        return 0;
    }
    return (int)syscall(SYS_clock_gettime, id, ts);
}

void fuzz_clock_start(void)
{
    if (!clock_started)
        clock_ns = CLOCK_START_NS;
    else
        clock_ns = (clock_ns / CLOCK_EPOCH_NS + 2) * CLOCK_EPOCH_NS;
    clock_started = 1;
    clock_input_ns = clock_ns;
    clock_virtual = 1;
}

void fuzz_clock_stop(void) { clock_virtual = 0; }

void fuzz_clock_advance(uint64_t ms) { clock_ns += ms * 1000000u; }

uint64_t fuzz_clock_ms(void) { return (clock_ns - clock_input_ns) / 1000000u; }

/* ---- buffers ----------------------------------------------------------------------------- */

void fuzz_buf_add(fuzz_buf_t *b, const void *data, size_t len)
{
    if (len == 0)
        return;
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + len)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        FUZZ_CHECK(p != NULL);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, len);
    b->len += len;
}

void fuzz_buf_consume(fuzz_buf_t *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

int fuzz_mem_eq(const void *a, const void *b, size_t n) { return n == 0 || memcmp(a, b, n) == 0; }

void fuzz_buf_free(fuzz_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ---- sockets ----------------------------------------------------------------------------- */

int fuzz_listen(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    FUZZ_CHECKF(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(fd, 64) == 0 &&
                    getsockname(fd, (struct sockaddr *)&sa, &len) == 0,
                "loopback listener: %s", strerror(errno));
    *port = ntohs(sa.sin_port);
    return fd;
}

int fuzz_accept(int lfd)
{
    return accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

size_t fuzz_read(int fd, fuzz_buf_t *b, int *eof)
{
    size_t total = 0;
    uint8_t chunk[16384];
    for (;;) {
        ssize_t n = recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
        if (n > 0) {
            fuzz_buf_add(b, chunk, (size_t)n);
            total += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            *eof = 1;
        return total;
    }
}

size_t fuzz_write(int fd, const void *data, size_t len)
{
    ssize_t n = send(fd, data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    return n > 0 ? (size_t)n : 0;
}

void fuzz_close_reset(int fd)
{
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
}

/* ---- cutting an input into writes ------------------------------------------------------ */

void fuzz_split_init(fuzz_split_t *s, uint32_t seed, size_t max)
{
    s->x = seed ? seed * 2654435761u | 1 : 0;
    s->max = max ? max : 1;
}

size_t fuzz_split_next(fuzz_split_t *s, size_t left)
{
    if (s->x == 0)
        return left;
    s->x ^= s->x << 13;
    s->x ^= s->x >> 17;
    s->x ^= s->x << 5;
    /* One piece in four as long as allowed, the others short: the cuts that matter fall
     * inside a line, a field or a chunk-size. */
    size_t n = 1 + (s->x % 4 == 0 ? s->x % s->max : (s->x >> 2) % 8);
    return n < left ? n : left;
}

/* ---- running the loop ---------------------------------------------------------------------- */

/* Turns in a row without a step moving anything, before the loop counts as quiet. One is
 * enough: event_base_loop(EVLOOP_NONBLOCK) returns only after a pass that found no event to
 * run (the router has done all it can with what its sockets hold), and the step then reads
 * all the harness's sockets hold; when it finds nothing and writes nothing, the next turn
 * would find the same. Both ends are in this process, on a socketpair and loopback TCP,
 * whose bytes are readable on the other side once the write returns. */
#define QUIET_TURNS 1

int fuzz_run(struct event_base *base, fuzz_step_fn step, void *arg, unsigned *turns)
{
    int idle = 0;
    while (idle < QUIET_TURNS) {
        if (*turns == 0)
            return -1;
        (*turns)--;
        event_base_loop(base, EVLOOP_NONBLOCK);
        int moved = step(arg);
        if (moved || event_base_get_num_events(base, EVENT_BASE_COUNT_ACTIVE) > 0)
            idle = 0;
        else
            idle++;
    }
    return 0;
}
