/* test/integration/cut_submit.c: an LD_PRELOAD library for test_io_uring.py that makes one
 * io_uring submit come back short, as the kernel does when it cannot allocate a request: the
 * first submit of two operations or more takes all of them but the last, waits for those
 * only, and leaves the last prepared and never submitted. Only a process started with
 * PCR_TEST_CUT_SUBMIT in its environment is touched. pcrouter itself has no test hook. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdlib.h>

#include <liburing.h>

typedef int (*submit_fn)(struct io_uring *, unsigned);

int io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr)
{
    static int cut;
    submit_fn real = (submit_fn)dlsym(RTLD_NEXT, "io_uring_submit_and_wait");
    unsigned pending = ring->sq.sqe_tail - ring->sq.sqe_head;
    if (pending >= 2 && wait_nr == pending && getenv("PCR_TEST_CUT_SUBMIT") != NULL &&
        !__atomic_exchange_n(&cut, 1, __ATOMIC_RELAXED)) {
        ring->sq.sqe_tail -= 1; /* hidden from this submit */
        int rc = real(ring, pending - 1);
        ring->sq.sqe_tail += 1; /* prepared, never submitted */
        return rc;
    }
    return real(ring, wait_nr);
}
