/* test/fuzz/replay_main.c: runs a fuzz target without libFuzzer, so `make test` replays every
 * corpus with gcc, in the release and the sanitizer builds alike.
 *
 *   replay_NAME NAME PATH...
 *
 * Each PATH is a corpus folder (every file in it, in name order, dotfiles skipped) or one
 * file. Each input is copied into a heap block of exactly its size, so AddressSanitizer sees
 * a read one byte past it. Output is TAP, one line per PATH:
 *
 *   ok 1 - config: test/fuzz/corpus/config (57 inputs)
 *
 * An empty or unreadable PATH fails (a corpus that replays nothing tests nothing). A crash or
 * a broken invariant (FUZZ_CHECK aborts) prints "not ok" with the input's file name before
 * the process dies, so the failing input is named in the test log. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

#if defined(__SANITIZE_ADDRESS__)
#define REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REPLAY_ASAN 1
#endif
#endif

/* Corpus files are small; anything larger is a mistake, not an input. */
#define REPLAY_MAX_INPUT (16u * 1024 * 1024)

/* The sanitizers call this hook, when it is there, just before they end the process. */
void __sanitizer_set_death_callback(void (*cb)(void)) __attribute__((weak));

static const char *target;   /* NAME */
static int case_no;          /* TAP number of the PATH being replayed */
static char current[4096];   /* the input being replayed, for the crash report */

static void put(const char *s)
{
    ssize_t w = write(STDOUT_FILENO, s, strlen(s));
    (void)w;
}

/* Async-signal-safe: only write(2). */
static void report_crash(void)
{
    char num[16];
    int n = case_no, i = (int)sizeof num - 1;
    num[i] = '\0';
    do
        num[--i] = (char)('0' + n % 10);
    while ((n /= 10) > 0 && i > 0);
    put("not ok ");
    put(num + i);
    put(" - ");
    put(target);
    put(": crashed on ");
    put(current);
    put("\n");
}

static void on_signal(int sig)
{
    report_crash();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* One input: -1 (and a message) when the file cannot be read. */
static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    uint8_t *buf = NULL;
    int rc = -1;
    if (f == NULL || fstat(fileno(f), &st) != 0 || st.st_size < 0 ||
        (uint64_t)st.st_size > REPLAY_MAX_INPUT) {
        printf("# %s: %s\n", path, f == NULL ? strerror(errno) : "unreadable or over 16 MiB");
        goto out;
    }
    size_t size = (size_t)st.st_size;
    buf = malloc(size ? size : 1);
    if (buf == NULL || fread(buf, 1, size, f) != size) {
        printf("# %s: short read\n", path);
        goto out;
    }
    snprintf(current, sizeof current, "%s", path);
    fflush(stdout);
    LLVMFuzzerTestOneInput(buf, size);
    rc = 0;
out:
    free(buf);
    if (f != NULL)
        fclose(f);
    return rc;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every input under `path` (a folder, or one file); how many, or -1. */
static long replay_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        printf("# %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return replay_file(path) == 0 ? 1 : -1;
    DIR *d = opendir(path);
    if (d == NULL) {
        printf("# %s: %s\n", path, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    long count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (nn == NULL) {
                count = -1;
                break;
            }
            names = nn;
        }
        if ((names[n] = strdup(e->d_name)) == NULL) {
            count = -1;
            break;
        }
        n++;
    }
    closedir(d);
    if (count == 0 && n > 0)
        qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n && count >= 0; i++) {
        char file[4096];
        if ((size_t)snprintf(file, sizeof file, "%s/%s", path, names[i]) >= sizeof file ||
            replay_file(file) != 0)
            count = -1;
        else
            count++;
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return count;
}

int main(int argc, char **argv)
{
    int failed = 0;
    if (argc < 3) {
        fprintf(stderr, "usage: %s NAME CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    target = argv[1];
    signal(SIGABRT, on_signal);
#ifndef REPLAY_ASAN
    /* Under AddressSanitizer these are its own: its report says more than ours. */
    signal(SIGSEGV, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGFPE, on_signal);
    signal(SIGILL, on_signal);
#endif
    if (__sanitizer_set_death_callback != NULL)
        __sanitizer_set_death_callback(report_crash);
    for (int i = 2; i < argc; i++) {
        case_no = i - 1;
        long n = replay_path(argv[i]);
        if (n <= 0) {
            printf("not ok %d - %s: %s (%s)\n", case_no, target, argv[i],
                   n == 0 ? "no inputs" : "unreadable");
            failed++;
        } else {
            printf("ok %d - %s: %s (%ld inputs)\n", case_no, target, argv[i], n);
        }
        fflush(stdout);
    }
    printf("1..%d\n", argc - 2);
    return failed ? 1 : 0;
}
