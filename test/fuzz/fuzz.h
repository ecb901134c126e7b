/* test/fuzz/fuzz.h: what every fuzz target shares. A target defines
 *
 *   int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
 *
 * and checks its invariants with FUZZ_CHECK: a broken one prints what broke and aborts, which
 * libFuzzer records as a crash (its input saved) and replay_main.c reports as a failed test.
 * A target must be deterministic, keep no state between inputs, and free all it allocates
 * (LeakSanitizer runs under both). */
#ifndef PCR_FUZZ_H
#define PCR_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond) do { \
    if (!(cond)) { \
        fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
        abort(); \
    } } while (0)

/* The same, with a printf-style explanation of the values involved. */
#define FUZZ_CHECKF(cond, ...) do { \
    if (!(cond)) { \
        fprintf(stderr, "fuzz check failed: %s (%s:%d): ", #cond, __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__); \
        fputc('\n', stderr); \
        abort(); \
    } } while (0)

#endif
