/* bounds.c: the limits psbench compares psd with (see bounds.h). */
#include "bounds.h"
#include "crc32c.h"
#include "codec.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fanout.h"
#include "proc.h"
#include "ps/ps_error.h"
#include "report.h"
#include "store.h"

/* ---- ucx_perftest -------------------------------------------------------------------------- */

/* A ucx_perftest command line: the server's, or the client's (@p client) that connects to
 * 127.0.0.1 and prints CSV. Both sides get the same options; -e: endpoints with error handling
 * (PEER), as psd's. */
static void perftest_argv(char *argv[24], bool client, const char *perftest, char *port,
                          const char *test, char *sz, char *n, char *w, char *pct, bool sleep_mode)
{
    int k = 0;
    argv[k++] = (char *)perftest;
    if (client) argv[k++] = "127.0.0.1";
    char *common[] = {"-p", port, "-t", (char *)test, "-s", sz, "-n", n, "-w", w, "-e"};
    for (size_t i = 0; i < sizeof common / sizeof *common; i++)
        argv[k++] = common[i];
    if (sleep_mode) {
        /* Wait on the worker's event fd instead of polling (needs the wakeup feature). */
        argv[k++] = "-E";
        argv[k++] = "sleep";
        argv[k++] = "-I";
    }
    if (client) {
        argv[k++] = "-f";
        argv[k++] = "-v";
        if (strstr(test, "lat")) {
            argv[k++] = "-R";
            argv[k++] = pct;
        }
    }
    argv[k] = NULL;
}

int pb_perftest_pairs(const char *perftest, const char *test, uint64_t size, uint64_t iters,
                      double percentile, bool sleep_mode, double timeout_s, char *const env[],
                      int npairs, double *out, char *err, size_t errlen)
{
    char port[PB_PERFTEST_PAIRS][16], sz[32], n[32], w[32], pct[32];
    bool lat = strstr(test, "lat") != NULL;
    if (npairs < 1 || npairs > PB_PERFTEST_PAIRS || (lat && npairs != 1)) {
        snprintf(err, errlen, "ucx_perftest %s: %d pairs (1..%d, latency 1)", test, npairs,
                 PB_PERFTEST_PAIRS);
        return -1;
    }
    snprintf(sz, sizeof sz, "%llu", (unsigned long long)size);
    snprintf(n, sizeof n, "%llu", (unsigned long long)iters);
    snprintf(w, sizeof w, "%llu", (unsigned long long)(iters / 10 + 1));
    snprintf(pct, sizeof pct, "%g", percentile);
    pb_proc_t *srv[PB_PERFTEST_PAIRS] = {0}, *cli[PB_PERFTEST_PAIRS] = {0};
    int rc = 0;
    /* Every server listens before the first client starts: the pairs run side by side. */
    for (int i = 0; i < npairs && rc == 0; i++) {
        snprintf(port[i], sizeof port[i], "%u", pb_pick_port());
        char *argv[24], name[32];
        perftest_argv(argv, false, perftest, port[i], test, sz, n, w, pct, sleep_mode);
        snprintf(name, sizeof name, npairs == 1 ? "perftest-server" : "perftest-server-%d", i);
        srv[i] = pb_spawn(name, argv, env, false, false);
        double end = pb_now() + 10;
        while (!pb_port_listening((uint16_t)atoi(port[i]))) {
            if (pb_proc_wait(srv[i], 0.005) >= 0 || pb_now() > end) {
                snprintf(err, errlen, "ucx_perftest server did not listen on port %s: %s", port[i],
                         pb_proc_tail(srv[i], 600));
                rc = -1;
                break;
            }
        }
    }
    for (int i = 0; i < npairs && rc == 0; i++) {
        char *argv[24], name[32];
        perftest_argv(argv, true, perftest, port[i], test, sz, n, w, pct, sleep_mode);
        snprintf(name, sizeof name, npairs == 1 ? "perftest-client" : "perftest-client-%d", i);
        cli[i] = pb_spawn(name, argv, env, false, true);
    }
    /* Wait for output from any open client (one poll over them all, no periodic wake-up
     * beside busy-polling pairs), drain the ready ones, and note when each one's output ends:
     * it exits right after its measured run, which began its own duration earlier. */
    char last[PB_PERFTEST_PAIRS][512] = {{0}};
    double ended[PB_PERFTEST_PAIRS] = {0}, end_by = pb_now() + timeout_s;
    for (int open = rc == 0 ? npairs : 0; open > 0;) {
        struct pollfd pf[PB_PERFTEST_PAIRS];
        int who[PB_PERFTEST_PAIRS], np = 0;
        for (int i = 0; i < npairs; i++)
            if (ended[i] == 0) {
                pf[np] = (struct pollfd){.fd = cli[i]->out_fd, .events = POLLIN};
                who[np++] = i;
            }
        int ms = (int)((end_by - pb_now()) * 1000);
        if (ms <= 0) {
            snprintf(err, errlen, "ucx_perftest %s -s %s -n %s: no result within %.0f s", test, sz,
                     n, timeout_s);
            rc = -2;
            break;
        }
        int r = poll(pf, (nfds_t)np, ms);
        if (pb_interrupted) pb_die("interrupted");
        if (r < 0 && errno != EINTR) pb_die("poll: %s", strerror(errno));
        for (int k = 0; k < np && r > 0; k++) {
            if (pf[k].revents == 0) continue;
            int i = who[k];
            char line[512];
            bool to = false;
            while (pb_proc_readline(cli[i], line, sizeof line, 0.005, &to) == 0) {
                const char *l = line + strspn(line, " \t");
                if (*l >= '0' && *l <= '9' && strchr(l, ',')) snprintf(last[i], 512, "%s", l);
            }
            if (!to) {
                ended[i] = pb_now();
                open--;
            }
        }
    }
    /* iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
     * latencies in us (one way for *_lat tests), bandwidths in MB/s of 2^20 bytes. Several
     * pairs: every pair's bytes over the span from the first one's start to the last one's
     * end, so that pairs that did not overlap count for what they are, not as their sum. */
    double first = INFINITY, lastend = 0, bytes = 0;
    for (int i = 0; i < npairs && rc == 0; i++) {
        double it, p50, avg_lat, all_lat, avg_bw, all_bw;
        if (sscanf(last[i], "%lf,%lf,%lf,%lf,%lf,%lf", &it, &p50, &avg_lat, &all_lat, &avg_bw,
                   &all_bw) != 6 ||
            (!lat && !(all_bw > 0))) {
            snprintf(err, errlen, "ucx_perftest %s -s %s: no result line; client log: %s", test, sz,
                     pb_proc_tail(cli[i], 600));
            rc = -1;
        } else if (pb_proc_wait(cli[i], 10) != 0) {
            snprintf(err, errlen, "ucx_perftest client failed: %s", pb_proc_tail(cli[i], 600));
            rc = -1;
        } else if (lat) {
            *out = p50;
        } else {
            double b_i = it * (double)size, took = b_i / (all_bw * 1048576.0);
            bytes += b_i;
            if (ended[i] - took < first) first = ended[i] - took;
            if (ended[i] > lastend) lastend = ended[i];
            if (npairs == 1) *out = all_bw * 1048576.0 / 1e9;
        }
    }
    if (rc == 0 && !lat && npairs > 1) *out = bytes / (lastend - first) / 1e9;
    for (int i = 0; i < npairs; i++) {
        if (srv[i] && rc == 0) pb_proc_wait(srv[i], 5);
        if (cli[i]) pb_proc_free(cli[i]);
        if (srv[i]) pb_proc_free(srv[i]);
    }
    return rc;
}

/* ---- memcpy -------------------------------------------------------------------------------- */

static void *xmalloc_touched(size_t n, int byte)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) pb_die("out of memory (%zu bytes)", n);
    memset(p, byte, n);
    return p;
}

/* Keeps the compiler from dropping copies nobody reads. */
static volatile unsigned char g_sink;

double pb_memcpy_gbps(uint64_t size, double seconds)
{
    unsigned char *src = xmalloc_touched(size, 1), *dst = xmalloc_touched(size, 2);
    /* Batches of copies between clock reads, so that 4 KiB copies are not timed one by one. */
    uint64_t batch = (64u << 20) / size;
    if (batch < 1) batch = 1;
    uint64_t copies = 0;
    double t0 = pb_now(), t;
    do {
        for (uint64_t i = 0; i < batch; i++) {
            memcpy(dst, src, size);
            src[i % size] ^= dst[(i * 7) % size]; /* a dependency: each copy happens */
        }
        copies += batch;
        if (pb_interrupted) pb_die("interrupted");
        t = pb_now();
    } while (t - t0 < seconds || copies < 3);
    g_sink = dst[size / 2];
    free(src);
    free(dst);
    return (double)copies * (double)size / (t - t0) / 1e9;
}

/* ---- optimizers in RAM --------------------------------------------------------------------- */

static psk_optim_t optim_conf(psk_optim_kind_t kind)
{
    return (psk_optim_t){.kind = kind,
                         .lr = 1e-3f,
                         .beta1 = 0.9f,
                         .beta2 = 0.999f,
                         .eps = 1e-8f,
                         .momentum = 0.9f,
                         .weight_decay = kind == PSK_ADAMW ? 0.01f : 0.0f};
}

static float *floats(size_t n, float v)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (p == NULL) pb_die("out of memory (%zu floats)", n);
    for (size_t i = 0; i < n; i++)
        p[i] = v;
    return p;
}

double pb_optim_ram_gbps(psk_optim_kind_t kind, uint64_t size, double seconds, bool out_of_place)
{
    size_t n = size / 4, k = (size_t)psk_optim_state_count(kind);
    float *p[2] = {floats(n, 0.01f), out_of_place ? floats(n, 0.01f) : NULL};
    float *s[2] = {k ? floats(k * n, 0.0f) : NULL, k && out_of_place ? floats(k * n, 0.0f) : NULL};
    float *g = floats(n, 1e-3f);
    psk_optim_t o = optim_conf(kind);
    /* Two untimed steps first, so that every page of both sets is mapped: the compiler may turn
     * a zero fill into calloc, whose pages the kernel maps only on first access, and on a VM
     * where a page fault costs tens of microseconds the quick run's few timed steps read
     * 2-15x slow with them (adam 4.2 and 0.28 GB/s in and out of place, against 8.2 and 6.5). */
    for (int w = 0; w < 2; w++) {
        int a = out_of_place ? w : 0, b = out_of_place ? 1 - a : 0;
        psk_optim_apply_cpu(p[b], s[b], p[a], s[a], g, 1.0f, n, (uint64_t)w + 1, &o);
    }
    uint64_t steps = 0;
    double t0 = pb_now(), t;
    do {
        int a = out_of_place ? (int)(steps & 1) : 0, b = out_of_place ? 1 - a : 0;
        psk_optim_apply_cpu(p[b], s[b], p[a], s[a], g, 1.0f, n, steps + 1, &o);
        steps++;
        if (pb_interrupted) pb_die("interrupted");
        t = pb_now();
    } while (t - t0 < seconds || steps < 3);
    for (int i = 0; i < 2; i++) {
        free(p[i]);
        free(s[i]);
    }
    free(g);
    return (double)steps * (double)size / (t - t0) / 1e9;
}

/* ---- optimizers through the store ---------------------------------------------------------- */

/* One step's updates, as psd's apply job hands them to its fan-out. */
typedef struct {
    const psd_chunk_hdr_t **old;
    psd_chunk_hdr_t **rec;
    const float *g;       /* the whole tensor's gradient: chunk c's at c * chunk_elems */
    uint64_t chunk_elems;
    uint32_t crcs;        /* the pushes' CRCs folded (kept: the pass is not optimised out) */
    psk_optim_t o;
} store_step_t;

static void store_update(void *arg, size_t c)
{
    store_step_t *s = arg;
    psd_chunk_hdr_t *h = s->rec[c];
    *h = *s->old[c];
    /* As psd's asp job does (apply.c): the raw push's CRC-32C checked first (raw_crc_bad),
     * then the update and the record's hashes in one blocked pass, each chunk from its own
     * push. Before session 71 every chunk took one cache-resident gradient and no CRC pass,
     * which made the store's apply look 10-15 % faster than psd's (a review). */
    const float *g = s->g + (uint64_t)c * s->chunk_elems;
    __atomic_fetch_xor(&s->crcs, ps_crc32c(0, g, (size_t)h->n * 4), __ATOMIC_RELAXED);
    psd_store_chunk_update(h, psd_chunk_params((psd_chunk_hdr_t *)s->old[c]),
                           psd_chunk_state((psd_chunk_hdr_t *)s->old[c]), g, 1.0f, &s->o,
                           s->old[c]->version + 1, NULL, NULL, false);
}

int pb_store_apply(const char *dir, psk_optim_kind_t kind, uint64_t size, uint64_t chunk_bytes,
                   unsigned threads, double seconds, pb_store_apply_t *out, char *err,
                   size_t errlen)
{
    uint32_t nstate = (uint32_t)psk_optim_state_count(kind);
    uint64_t numel = size / 4, chunk_elems = chunk_bytes / 4;
    uint32_t nchunks = (uint32_t)((numel + chunk_elems - 1) / chunk_elems);
    /* Copy-on-write keeps about three versions of each record (PLATFORM-NOTES.md section 4). */
    uint64_t map_mb = (size * (1 + nstate) * 4 >> 20) + 64;
    psd_store_t st;
    int rc = psd_store_open(&st, dir, map_mb, "psbench", chunk_bytes, nstate, err, errlen);
    if (rc) return -1;
    psd_fanout_t fan;
    if ((rc = psd_fanout_init(&fan, threads)) != 0) {
        snprintf(err, errlen, "cannot start %u threads: %s", threads, ps_strerror(rc));
        psd_store_close(&st);
        return -1;
    }
    float *g = floats((size_t)nchunks * chunk_elems, 1e-3f);
    store_step_t ss = {.old = calloc(nchunks, sizeof *ss.old),
                       .rec = calloc(nchunks, sizeof *ss.rec),
                       .g = g,
                       .chunk_elems = chunk_elems,
                       .o = optim_conf(kind)};
    if (ss.old == NULL || ss.rec == NULL) pb_die("out of memory");
    psd_wtxn_t tx;
    /* Create the records, as a declaration does. */
    rc = psd_store_begin(&st, &tx);
    for (uint32_t c = 0; rc == 0 && c < nchunks; c++) {
        uint32_t n = (uint32_t)(numel - (uint64_t)c * chunk_elems < chunk_elems
                                    ? numel - (uint64_t)c * chunk_elems
                                    : chunk_elems);
        psd_chunk_hdr_t *h;
        rc = psd_store_chunk_reserve(&tx, 0, c, n, nstate, &h);
        if (rc) break;
        *h = (psd_chunk_hdr_t){.version = 0, .n = n, .nstate = nstate};
        memset(psd_chunk_params(h), 0, (size_t)n * (1 + nstate) * 4);
        psd_store_chunk_seal(h);
    }
    if (rc == 0) rc = psd_store_commit(&tx);
    double *times = NULL;
    size_t ntimes = 0, cap = 0;
    double t_kernel = 0, t_commit = 0, t_total = 0;
    double start = pb_now();
    /* Warm-up steps first: the first steps grow the map (PLATFORM-NOTES.md section 4). */
    const uint64_t warm = 3;
    for (uint64_t step = 0; rc == 0; step++) {
        double t0 = pb_now(), tk = 0;
        rc = psd_store_begin(&st, &tx);
        /* Every record reserved first, then the updates on the fan-out; a record smaller
         * than a page is updated at once, as psd does (psd_store_record_stable). */
        uint32_t ndefer = 0;
        for (uint32_t c = 0; rc == 0 && c < nchunks; c++) {
            rc = psd_store_chunk_get(&st, tx.r, 0, c, &ss.old[ndefer]);
            if (rc == 0)
                rc = psd_store_chunk_reserve(&tx, 0, c, ss.old[ndefer]->n, nstate, &ss.rec[ndefer]);
            if (rc) break;
            double k0 = pb_now();
            if (!psd_store_record_stable(&st, ss.old[ndefer]->n, nstate))
                store_update(&ss, ndefer);
            else
                ndefer++;
            tk += pb_now() - k0;
        }
        if (rc == 0) {
            double k0 = pb_now();
            psd_fanout_run(&fan, ndefer, store_update, &ss);
            tk += pb_now() - k0;
        }
        double c0 = pb_now();
        if (rc == 0)
            rc = psd_store_commit(&tx);
        else
            psd_store_abort(&tx);
        double t1 = pb_now();
        if (rc) break;
        if (step >= warm) {
            if (ntimes == cap) {
                cap = cap ? 2 * cap : 64;
                double *nt = realloc(times, cap * sizeof *nt);
                if (nt == NULL) pb_die("out of memory");
                times = nt;
            }
            times[ntimes++] = t1 - t0;
            t_kernel += tk;
            t_commit += t1 - c0;
            t_total += t1 - t0;
        }
        if (pb_interrupted) pb_die("interrupted");
        if (step >= warm + 2 && t1 - start >= seconds) break;
    }
    if (rc) snprintf(err, errlen, "%s: store apply failed: %s", dir, ps_strerror(rc));
    psd_store_close(&st);
    psd_fanout_close(&fan);
    free(ss.old);
    free(ss.rec);
    free(g);
    if (rc == 0) {
        out->steps = ntimes;
        out->gbps = (double)ntimes * (double)size / t_total / 1e9;
        out->step_us = pb_quantile(times, ntimes, 0.5) * 1e6;
        out->kernel_share = t_kernel / t_total;
        out->commit_share = t_commit / t_total;
    }
    free(times);
    return rc ? -1 : 0;
}

/* ---- codecs ---------------------------------------------------------------------------- */

double pb_codec_gbps(const char *codec, uint64_t size, double seconds, bool decode)
{
    psk_codec_t c;
    if (psk_codec_parse(&c, codec)) pb_die("unknown codec '%s'", codec);
    size_t n = size / 4, cap = psk_codec_max_bytes(&c, n), scr = psk_codec_scratch_bytes(&c, n);
    float *g = floats(n, 0.0f), *res = floats(n, 0.0f), *out = floats(n, 0.0f);
    for (size_t i = 0; i < n; i++)
        g[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    uint8_t *payload = xmalloc_touched(cap ? cap : 1, 0);
    void *scratch = scr ? xmalloc_touched(scr, 0) : NULL;
    size_t len = 0;
    uint64_t reps = 0;
    double t0 = pb_now(), t;
    if (decode && psk_codec_encode_ef_cpu(payload, cap, &len, g, res, n, &c, scratch))
        pb_die("encode %s failed", codec);
    t0 = pb_now();
    do {
        /* Each encode uses the worker's path (error feedback); each decode the shard's
         * (decode-and-add into an aggregation buffer). */
        int rc = decode ? psk_codec_decode_add_cpu(out, n, payload, len, &c, 1.0f)
                        : psk_codec_encode_ef_cpu(payload, cap, &len, g, res, n, &c, scratch);
        if (rc) pb_die("%s %s failed", decode ? "decode" : "encode", codec);
        c.seed++;
        reps++;
        if (pb_interrupted) pb_die("interrupted");
        t = pb_now();
    } while (t - t0 < seconds || reps < 3);
    g_sink = payload[0] ^ (unsigned char)out[n / 2];
    free(g);
    free(res);
    free(out);
    free(payload);
    free(scratch);
    return (double)reps * (double)size / (t - t0) / 1e9;
}
