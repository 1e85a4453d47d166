/* hashbench.c: the cost of psd's checksums against memcpy, in one run on one buffer.
 *
 *   hashbench [--mib N] [--reps R]
 *
 * For a chunk-sized buffer (1 MiB, what one push or pull carries with the default chunk_bytes,
 * cache-resident) and a large one (--mib, default 256, memory-bound) it times memcpy, CRC-32C
 * (the implementation ps_crc32c() picked, and the portable slicing-by-8 one), XXH3-64 (the
 * library's one-shot call, built for SSE2, and a record's hash as psd computes it: psd_rechash,
 * block by block through the run-time dispatched update where libxxhash has it), a copy
 * with its CRC (memcpy then ps_crc32c per 64 KiB block, the fused ps_crc32c_copy, and the
 * streamed ps_crc32c_copy_nt, also as it runs on a CPU without the folding copy), and
 * prints one JSON object per size: GB/s of each and each checksum's speed as a fraction of
 * memcpy's. A third object compares what psd's apply job does per chunk: the fused Adam kernel
 * (old record -> new record, 1 MiB of parameters) and psd_store_chunk_seal() on the new record
 * (CRC-32C of the params + XXH3-64 of params and state). Best of R repetitions. Not a test:
 * nothing asserts a figure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "crc32c.h"
#include "optim.h"
#include "store.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static volatile uint64_t sink;

/* Best GB/s of @p reps runs of op over @p len bytes, each run repeating it until ~50 ms. */
static double rate(int op, uint8_t *dst, const uint8_t *src, size_t len, int reps)
{
    double best = 0;
    for (int r = 0; r < reps; r++) {
        size_t iters = 0;
        double t0 = now(), t;
        do {
            switch (op) {
            case 0: memcpy(dst, src, len); sink += dst[len / 3]; break;
            case 1: sink += ps_crc32c(0, src, len); break;
            case 2: sink += ps_crc32c_sw(0, src, len); break;
            case 3: sink += XXH3_64bits(src, len); break;
            case 6: sink += psd_rechash((const float *)src, (uint32_t)(len / 4), 0); break;
            case 4: /* a copy, then the CRC of each 64 KiB block right after it is copied */
                for (size_t off = 0, b; off < len; off += b) {
                    b = len - off < 65536 ? len - off : 65536;
                    memcpy(dst + off, src + off, b);
                    sink += ps_crc32c(0, dst + off, b);
                }
                break;
            case 5: sink += ps_crc32c_copy(0, dst, src, len); break;
            case 7: sink += ps_crc32c_copy_nt(0, dst, src, len); break;
            }
            iters++;
        } while ((t = now() - t0) < 0.05);
        double gbs = (double)len * (double)iters / t / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

int main(int argc, char **argv)
{
    size_t mib = 256;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
            mib = (size_t)atol(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            int help = strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
            fprintf(help ? stdout : stderr, "usage: hashbench [--mib N] [--reps R]\n");
            return help ? 0 : 2;
        }
    }
    if (mib == 0 || reps <= 0) {
        fprintf(stderr, "hashbench: --mib and --reps must be positive\n");
        return 2;
    }
    size_t sizes[2] = {1u << 20, mib << 20};
    uint8_t *src = malloc(sizes[1]), *dst = malloc(sizes[1]);
    if (src == NULL || dst == NULL) {
        fprintf(stderr, "hashbench: cannot allocate 2 x %zu MiB\n", mib);
        return 1;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizes[1]; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        src[i] = (uint8_t)x;
    }
    memset(dst, 1, sizes[1]);
    for (int s = 0; s < 2; s++) {
        size_t len = sizes[s];
        double mc = rate(0, dst, src, len, reps), crc = rate(1, dst, src, len, reps);
        double sw = rate(2, dst, src, len, reps), xx = rate(3, dst, src, len, reps);
        double cc = rate(4, dst, src, len, reps), fused = rate(5, dst, src, len, reps);
        double rh = rate(6, dst, src, len, reps), nt = rate(7, dst, src, len, reps);
        /* The streamed copy where the CPU has no folding copy: the CRC of the source, then
         * ps_memcpy_nt (-1 where this CPU lacks sse4.2). */
        double nt42 = -1;
        if (ps_crc32c_use("sse4.2") == 0) {
            nt42 = rate(7, dst, src, len, reps);
            ps_crc32c_use(NULL);
        }
        printf("{\"bytes\": %zu, \"memcpy_GBps\": %.2f, \"crc32c_impl\": \"%s\", "
               "\"crc32c_GBps\": %.2f, \"crc32c_vs_memcpy\": %.2f, \"crc32c_sw_GBps\": %.2f, "
               "\"xxh3_GBps\": %.2f, \"xxh3_vs_memcpy\": %.2f, \"rechash_GBps\": %.2f, "
               "\"rechash_vs_memcpy\": %.2f, \"copy_then_crc_GBps\": %.2f, "
               "\"crc32c_copy_GBps\": %.2f, \"crc32c_copy_vs_memcpy\": %.2f, "
               "\"crc32c_copy_nt_GBps\": %.2f, \"crc32c_copy_nt_sse42_GBps\": %.2f}\n",
               len, mc, ps_crc32c_impl(), crc, crc / mc, sw, xx, xx / mc, rh, rh / mc, cc, fused,
               fused / mc, nt, nt42);
    }
    /* One Adam chunk: params + m + v, as psd's records hold them. */
    uint32_t n = 1u << 18;
    size_t rec = psd_chunk_bytes(n, 2);
    psd_chunk_hdr_t *a = calloc(1, rec), *b = calloc(1, rec);
    float *g = malloc((size_t)n * 4);
    for (uint32_t i = 0; i < n; i++) g[i] = (float)((int)(i % 97) - 48) * 1e-3f;
    *a = (psd_chunk_hdr_t){.n = n, .nstate = 2};
    *b = *a;
    psk_optim_t o = {.kind = PSK_ADAM, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,
                     .eps = 1e-8f};
    double best_apply = 1e9, best_seal = 1e9;
    for (int r = 0; r < reps * 4; r++) {
        double t0 = now();
        psk_optim_apply_cpu(psd_chunk_params(b), psd_chunk_state(b), psd_chunk_params(a),
                            psd_chunk_state(a), g, 1.0f, n, (uint64_t)r + 1, &o);
        double t1 = now();
        psd_store_chunk_seal(b);
        double t2 = now();
        if (t1 - t0 < best_apply) best_apply = t1 - t0;
        if (t2 - t1 < best_seal) best_seal = t2 - t1;
        psd_chunk_hdr_t *t = a;
        a = b;
        b = t;
    }
    printf("{\"chunk_values\": %u, \"record_bytes\": %zu, \"adam_apply_us\": %.1f, "
           "\"seal_us\": %.1f, \"seal_vs_apply\": %.2f}\n",
           n, rec, best_apply * 1e6, best_seal * 1e6, best_seal / best_apply);
    free(a);
    free(b);
    free(g);
    free(src);
    free(dst);
    return 0;
}
