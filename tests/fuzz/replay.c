/* replay.c: a harness of tests/fuzz as a test (fuzz.h): replay [--seeds TARGET] [FILE|DIR...]
 * runs LLVMFuzzerTestOneInput on TARGET's seeds and regression inputs (seeds.c), each followed
 * by MUTANTS copies of it changed at random (a fixed seed: the same cases every run), then on
 * each file named and each file in each directory named, in name order; every input ends at
 * the end of readable memory. Exit 0 when every input passed (a failed property aborts, naming
 * the input on stderr first); 2 for a file it cannot read or no input at all. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

/* @p n bytes readable up to a page mapped PROT_NONE after them. */
static uint8_t *guarded(size_t n, void **map, size_t *maplen)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), data = (n + pg - 1) / pg * pg;
    *maplen = data + pg;
    uint8_t *m = mmap(NULL, *maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m + data, pg, PROT_NONE)) abort();
    *map = m;
    return m + data - n;
}

/* fuzz_alloc's memory: where its mapping starts and its length, then the caller's bytes. */
typedef struct {
    void *map;
    size_t len;
} mapping_t;

void *fuzz_alloc(size_t n)
{
    mapping_t m;
    uint8_t *s = guarded(sizeof m + n, &m.map, &m.len);
    memcpy(s, &m, sizeof m);
    return s + sizeof m;
}

void fuzz_free(void *p)
{
    if (p == NULL) return;
    mapping_t m;
    memcpy(&m, (uint8_t *)p - sizeof m, sizeof m);
    munmap(m.map, m.len);
}

#define MUTANTS 256

static uint64_t rs;

static uint64_t rnd(void) { return fuzz_xorshift(&rs); }

static void run(const uint8_t *p, size_t n)
{
    uint8_t *d = fuzz_alloc(n);
    memcpy(d, p, n);
    LLVMFuzzerTestOneInput(d, n);
    fuzz_free(d);
}

static int inputs;

/* fuzz_seed_fn: @p p, then MUTANTS copies with 1 to 4 edits each (a byte set or flipped, the
 * end cut, a byte inserted, a run copied elsewhere), when @p target is the one asked for. */
static void seed_one(const char *target, const char *name, const void *p, size_t n, void *arg)
{
    if (strcmp(target, arg) != 0) return;
    fprintf(stderr, "replay: seed %s/%s and %d copies changed\n", target, name, MUTANTS);
    run(p, n);
    uint8_t *b = malloc(n + 64);
    if (b == NULL) abort();
    rs = 0x9E3779B97F4A7C15ull ^ n;
    for (const char *c = name; *c; c++) rs = (rs ^ (uint8_t)*c) * 0x100000001B3ull;
    for (int k = 0; k < MUTANTS; k++) {
        size_t len = n;
        memcpy(b, p, n);
        for (int e = 1 + (int)(rnd() % 4); e > 0; e--) {
            uint64_t r = rnd(), at = len ? r % len : 0;
            switch (rnd() % 5) {
            case 0: if (len) b[at] = (uint8_t)rnd(); break;
            case 1: if (len) b[at] ^= (uint8_t)(1u << (r % 8)); break;
            case 2: len = at; break;
            case 3:
                if (len < n + 64) {
                    memmove(b + at + 1, b + at, len - at);
                    b[at] = (uint8_t)rnd();
                    len++;
                }
                break;
            default: {
                size_t from = len ? rnd() % len : 0, run_len = len ? rnd() % (len - from + 1) : 0;
                if (run_len > len - at) run_len = len - at;
                memmove(b + at, b + from, run_len);
            }
            }
        }
        run(b, len);
    }
    free(b);
    inputs += 1 + MUTANTS;
}

static int one(const char *path)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (f == NULL || fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "replay: %s: not a readable file\n", path);
        if (f) fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *d = fuzz_alloc(n);
    size_t got = n ? fread(d, 1, n, f) : 0;
    fclose(f);
    if (got != n) {
        fprintf(stderr, "replay: %s: read %zu of %zu bytes\n", path, got, n);
        fuzz_free(d);
        return -1;
    }
    fprintf(stderr, "replay: %s\n", path); /* which input, should the harness abort */
    LLVMFuzzerTestOneInput(d, n);
    fuzz_free(d);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seeds") == 0 && i + 1 < argc) {
            fuzz_seeds(seed_one, argv[++i]);
            continue;
        }
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            struct dirent **names;
            int k = scandir(argv[i], &names, NULL, by_name);
            if (k < 0) {
                perror(argv[i]);
                return 2;
            }
            for (int j = 0; j < k; j++) {
                char path[4096];
                int skip = names[j]->d_name[0] == '.';
                snprintf(path, sizeof path, "%s/%s", argv[i], names[j]->d_name);
                free(names[j]);
                if (skip) continue;
                if (one(path)) return 2;
                inputs++;
            }
            free(names);
        } else {
            if (one(argv[i])) return 2;
            inputs++;
        }
    }
    if (inputs == 0) {
        fprintf(stderr, "replay: no input\n");
        return 2;
    }
    printf("replay: %d inputs passed\n", inputs);
    return 0;
}
