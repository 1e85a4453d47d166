/* fuzz.h: what the harnesses of tests/fuzz share (README.md there says how they run).
 *
 * Each fuzz_<name>.c defines LLVMFuzzerTestOneInput(). Built with clang's -fsanitize=fuzzer it
 * is a libFuzzer program (tests/fuzz/run.sh); built with replay.c (FUZZ_REPLAY) it is a test
 * that runs the harness on every file of tests/fuzz/corpus/<name>, each input placed so that
 * its last byte is the last readable one before a page that is not (a read past it faults,
 * with no sanitizer), and fuzz_alloc() memory placed the same way. */
#ifndef PS_FUZZ_H
#define PS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A property the harness asserts: on failure, the message and abort() (libFuzzer then keeps
 * the input as a crash file; the replay test fails naming it). */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s: ", FUZZ_NAME);                                                    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/** @brief The next number of xorshift64 state @p s (nonzero): the fixed-seed randomness of the
 *  replay tests and of tests/unit/test_mutate.c. */
static inline uint64_t fuzz_xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/** @brief @p n bytes of memory of their own that ends with them (replay: a page no one may
 *  read follows; libFuzzer: AddressSanitizer's bounds). No alignment is promised (replay: the
 *  end is page-aligned, so the start is wherever @p n puts it), as none is for a peer's bytes.
 *  @return the memory (never NULL: aborts when out of memory), given back with fuzz_free(). */
void *fuzz_alloc(size_t n);

/** @brief Give back fuzz_alloc()'s memory @p p (NULL: nothing). */
void fuzz_free(void *p);

/** @brief @p n bytes at @p p and a NUL, in fuzz_alloc() memory (fuzz_free() gives it back). */
static inline char *fuzz_text(const uint8_t *p, size_t n)
{
    char *s = fuzz_alloc(n + 1);
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* fuzz_tcpguard's receive in flight (64 KiB at a fixed address, so that the fuzzer and
 * fuzz_seeds can name it in a put request). */
#define FUZZ_TCPGUARD_SLOT 0x5a0000000000ull
#define FUZZ_TCPGUARD_SLOT_BYTES 65536

/* Called by fuzz_seeds() for each input @p p of @p n bytes named @p name of harness @p target
 * ("wire", "json", ...; the name of fuzz_<target>). */
typedef void (*fuzz_seed_fn)(const char *target, const char *name, const void *p, size_t n,
                             void *arg);

/** @brief Every harness's seeds and regression inputs (seeds.c), each handed to @p fn with
 *  @p arg. The bytes are @p fn's to read during the call only. */
void fuzz_seeds(fuzz_seed_fn fn, void *arg);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
