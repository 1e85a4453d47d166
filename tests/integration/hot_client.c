/* hot_client.c: a libps worker for the hot-path allocation test (test_cluster.c,
 * hot_path_allocations). Test code, not part of psd.
 *
 *   hot_client MANIFEST NUMEL WARM STEPS [COUNTS...]
 *
 * Joins, declares "hot.big" (NUMEL floats, several chunks) and "hot.small" (64 floats, fused
 * with the big one's parts), and runs WARM + STEPS steps (the manifest's consistency; one
 * worker) as a training loop does: the
 * step from the coordinator, both pushes in one group, both pulls of the step's result in
 * another (with HOT_CODEC set, compressed: see main). After the WARM steps and again at the end it reads the allocation counts of its own
 * code, libps included (libps is a static library; the file in ALLOC_COUNT_FILE, kept by
 * alloc_count.so with ALLOC_COUNT_OBJ empty), and of every COUNTS file (psd's),
 * and prints how many allocations each made during the STEPS steps, with the sites; a process
 * that counted none before them is not being counted (exit 1). With HOT_CODEC, hot.big's pulls
 * must come back in bf16 and not all zero.
 * Exit 0 when none allocated, 3 when one did, 1 when the steps or a count could not be had. */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc_count.h"
#include "ps/ps_client.h"

#define MAX_COUNTS 8

/* Map counter file @p path read-only; NULL (with a message) when it is not there or not
 * counting. */
static const alloc_count_t *counts_map(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    void *m = MAP_FAILED;
    if (fd >= 0) {
        m = mmap(NULL, sizeof(alloc_count_t), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
    }
    if (m == MAP_FAILED ||
        __atomic_load_n(&((const alloc_count_t *)m)->magic, __ATOMIC_ACQUIRE) !=
            ALLOC_COUNT_MAGIC) {
        printf("hot_client: %s: no allocation counts (alloc_count.so not preloaded, or its "
               "object not found)\n",
               path);
        return NULL;
    }
    return m;
}

/* A snapshot of @p src, which the counting process updates meanwhile (atomics). */
static void counts_copy(alloc_count_t *dst, const alloc_count_t *src)
{
    dst->magic = __atomic_load_n(&src->magic, __ATOMIC_ACQUIRE);
    dst->calls = __atomic_load_n(&src->calls, __ATOMIC_ACQUIRE);
    dst->overflow = __atomic_load_n(&src->overflow, __ATOMIC_ACQUIRE);
    for (int i = 0; i < ALLOC_COUNT_SITES; i++) {
        dst->site[i].off = __atomic_load_n(&src->site[i].off, __ATOMIC_ACQUIRE);
        dst->site[i].n = __atomic_load_n(&src->site[i].n, __ATOMIC_ACQUIRE);
    }
}

/* Print what @p name allocated between @p a and @p b; return the count. */
static uint64_t counts_diff(const char *name, const alloc_count_t *a, const alloc_count_t *b,
                            uint64_t steps)
{
    uint64_t d = b->calls - a->calls;
    printf("hot_client: %s made %" PRIu64 " allocations in %" PRIu64 " steps\n", name, d, steps);
    for (int i = 0; d && i < ALLOC_COUNT_SITES && b->site[i].off; i++) {
        uint64_t before = a->site[i].off == b->site[i].off ? a->site[i].n : 0;
        if (b->site[i].n > before)
            printf("hot_client:   %s at return address +0x%" PRIx64 " (addr2line -e): %" PRIu64
                   "\n",
                   name, b->site[i].off, b->site[i].n - before);
    }
    if (d && b->overflow > a->overflow)
        printf("hot_client:   %s at sites past the table: %" PRIu64 "\n", name,
               b->overflow - a->overflow);
    return d;
}

/* One bsp step of both tensors; 0, or 1 with a message. */
static int step(ps_client_t *c, const uint32_t id[2], float *const g[2], float *const got[2],
                ps_batch_info_t *b, uint64_t k)
{
    ps_batch_info_t prev = *b;
    int rc = ps_client_next_batch(c, 1ull << 40, k ? &prev : NULL, b); /* a set never used up */
    if (rc || b->finished || b->step != k) {
        printf("hot_client: batch %" PRIu64 ": %s\n", k,
               rc ? ps_client_error(c) : "not the step wanted");
        return 1;
    }
    for (int t = 0; t < 2; t++) g[t][k % 64] = (float)k; /* a gradient that changes */
    ps_op_t *op[2];
    for (int pull = 0; pull < 2; pull++) {
        ps_client_group_begin(c);
        for (int t = 0; t < 2 && rc == 0; t++)
            rc = pull ? ps_client_pull(c, id[t], got[t], b->step + 1, &op[t])
                      : ps_client_push(c, id[t], g[t], b->step, &op[t]);
        ps_client_group_end(c);
        uint64_t version = 0;
        for (int t = 0; t < 2 && rc == 0; t++)
            if ((rc = ps_op_wait(op[t], &version)) == 0 && pull && version != b->step + 1) {
                printf("hot_client: step %" PRIu64 ": pulled version %" PRIu64 "\n", k, version);
                return 1;
            }
        if (rc) {
            printf("hot_client: step %" PRIu64 ": %s\n", k, ps_client_error(c));
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 5 || argc - 5 > MAX_COUNTS) {
        fprintf(stderr, "usage: hot_client MANIFEST NUMEL WARM STEPS [COUNTS...] (at most %d)\n",
                MAX_COUNTS);
        return 2;
    }
    uint64_t n = strtoull(argv[2], NULL, 10), warm = strtoull(argv[3], NULL, 10),
             steps = strtoull(argv[4], NULL, 10);
    int ncounts = argc - 5 + 1; /* [0]: this process's libps */
    const char *own = getenv("ALLOC_COUNT_FILE");
    if (n < 64 || n > (1u << 24) || steps == 0 || own == NULL) {
        fprintf(stderr, "hot_client: NUMEL in [64, 2^24], STEPS >= 1, ALLOC_COUNT_FILE set\n");
        return 2;
    }
    const alloc_count_t *cnt[MAX_COUNTS + 1];
    const char *names[MAX_COUNTS + 1] = {"libps"};
    cnt[0] = counts_map(own);
    for (int i = 1; i < ncounts; i++) {
        cnt[i] = counts_map(argv[4 + i]);
        names[i] = argv[4 + i];
    }
    for (int i = 0; i < ncounts; i++)
        if (cnt[i] == NULL) return 1;

    char err[512];
    ps_client_t *c;
    if (ps_client_create(argv[1], NULL, &c, err, sizeof err)) {
        printf("hot_client: join: %s\n", err);
        return 1;
    }
    ps_tensor_desc_t d[2] = {{.name = "hot.big", .shape = {(uint32_t)n}, .ndim = 1},
                             {.name = "hot.small", .shape = {64}, .ndim = 1}};
    uint32_t id[2];
    float *g[2] = {calloc(n, 4), calloc(64, 4)}, *got[2] = {calloc(n, 4), calloc(64, 4)};
    int bad = !g[0] || !g[1] || !got[0] || !got[1];
    for (int t = 0; t < 2 && !bad; t++)
        if (ps_client_declare(c, &d[t], &id[t])) {
            printf("hot_client: declare: %s\n", ps_client_error(c));
            bad = 1;
        }
    /* HOT_CODEC: the big tensor's pushes in that codec with error feedback and its pulls in
     * bf16, the small one's pushes in int8. */
    const char *codec = getenv("HOT_CODEC");
    if (!bad && codec && *codec) {
        ps_compression_t big = {.codec = codec, .error_feedback = 1, .pull = "bf16"},
                         small = {.codec = "int8"};
        if (ps_client_set_compression(c, id[0], &big) ||
            ps_client_set_compression(c, id[1], &small)) {
            printf("hot_client: compression: %s\n", ps_client_error(c));
            bad = 1;
        }
    }
    ps_batch_info_t b = {0};
    alloc_count_t before[MAX_COUNTS + 1], after[MAX_COUNTS + 1];
    for (uint64_t k = 0; k < warm + steps && !bad; k++) {
        if (k == warm)
            for (int i = 0; i < ncounts; i++) counts_copy(&before[i], cnt[i]);
        bad = step(c, id, g, got, &b, k);
    }
    if (!bad && codec && *codec) { /* the settings took: bf16 pulls end in 16 zero bits */
        uint64_t wide = 0, nonzero = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &got[0][i], 4);
            wide += (u & 0xffffu) != 0;
            nonzero += got[0][i] != 0.0f;
        }
        printf("hot_client: %" PRIu64 " of hot.big's pulled values are not bf16\n", wide);
        if (wide) bad = 1;
        if (nonzero == 0) {
            printf("hot_client: hot.big pulled all zeros: the steps changed nothing\n");
            bad = 1;
        }
    }
    uint64_t total = 0;
    for (int i = 0; i < ncounts && !bad; i++)
        if (before[i].calls == 0) { /* both allocate as they start: is anything counted? */
            printf("hot_client: %s counted no allocation before the steps: not counting\n",
                   names[i]);
            bad = 1;
        }
    if (!bad) {
        for (int i = 0; i < ncounts; i++) counts_copy(&after[i], cnt[i]);
        for (int i = 0; i < ncounts; i++)
            total += counts_diff(names[i], &before[i], &after[i], steps);
    }
    fflush(stdout);
    ps_client_destroy(c);
    for (int t = 0; t < 2; t++) {
        free(g[t]);
        free(got[t]);
    }
    return bad ? 1 : total ? 3 : 0;
}
