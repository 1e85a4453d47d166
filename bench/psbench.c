/* psbench.c: psd's benchmark. Starts its own psd shards and client processes on 127.0.0.1 and
 * measures push, pull and the BSP round (push + pull) of one dense tensor split over the
 * shards, the optimizers' apply, and a full BSP step with adam; the same run measures the
 * limits they are compared with (ucx_perftest with psd's UCX settings, memcpy, the optimizers
 * in RAM). Prints a table and optionally writes JSON. See docs/PERFORMANCE.md. */
#include <errno.h>
#include <getopt.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bounds.h"
#include "client.h"
#include "cluster.h"
#include "fanout.h"
#include "jsonfield.h"
#include "manifest.h"
#include "proc.h"
#include "report.h"
#include "targets.h"

#ifndef PSBENCH_PSD
#define PSBENCH_PSD "psd"
#endif

#define MIB (1024u * 1024u)
#define PB_MAX_TRIALS 9 /* --trials */

static const char *const optim_names[] = {"sgd", "momentum", "adam", "adamw", "adagrad", "mean"};
_Static_assert(sizeof optim_names / sizeof *optim_names == PSK_OPTIM_KINDS,
               "optim_names follows psk_optim_kind_t");

enum { PART_LIMITS = 1, PART_OPS = 2, PART_APPLY = 4, PART_STEP = 8, PART_CODECS = 16,
       PART_STORE = 32, PART_ALL = 63 };

typedef struct {
    bool quick;
    bool asp_push; /* push under asp (default), or bsp steps without pulls (--bsp-push) */
    unsigned only; /* PART_* bits to run */
    uint64_t sizes[PB_MAX_SIZES];
    int nsizes;
    int layouts[4][2]; /* shards, workers */
    int nlayouts;
    const char *transports[4];
    int ntransports;
    uint64_t chunk_bytes, map_size_mb;
    const char *json, *markdown, *psd, *perftest, *trace_dir;
    const char *round_optim; /* the rounds' bsp cluster (--round-optimizer; default mean) */
    const char *push_optim;  /* the asp pushes' optimizer (sgd; an attached cluster's own) */
    /* --attach: the running cluster of the manifest, as `psctl status` described it. */
    const char *attach;      /* its manifest, or NULL: psbench starts its own clusters */
    int attach_shards;
    bool attach_local;       /* every shard on this host: the limits apply */
    char attach_cluster[128], attach_consistency[8], attach_optimizer[16];
    char self[PB_PATH];
    /* Timing. */
    double case_s; /* target time of one timed case */
    int trials;    /* push, pull and round cases run this often; the median one counts */
    uint64_t min_iters, max_iters;
    double limit_s;          /* memcpy / in-RAM loops per measurement */
    uint64_t perftest_bytes; /* ucp_am_bw: bytes per run (ucp_am_lat: 1/16 of it) */
    uint64_t apply_size;     /* the tensor of the apply measurements */
    uint64_t step_size;      /* the BSP step's model */
    int cluster_id;
    /* Each psd case's three results (throughput, p50, p99): their limits are set at the end,
     * once every reading of the limits is in (assign_limits). */
    pb_result_t *cases[PB_MAX_RESULTS / 3][3];
    int ncases;
} bench_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psbench [--manifest FILE | --shards S --workers W] [--sizes LIST]\n"
            "               [--transports shm,tcp,direct,ucx] [--json FILE] [--markdown FILE] [--quick]\n"
            "               [--bsp-push] [--only limits,ops,apply,step,codecs,store] [--psd PATH]\n"
            "               [--perftest PATH] [--trials N] [--trace DIR]\n"
            "               [--round-optimizer NAME]\n"
            "       psbench --attach --manifest FILE [--workers W] [--sizes LIST] [--transports LIST]\n"
            "               [--only limits,ops] [--json FILE] [--markdown FILE] [--quick] [--trials N]\n"
            "Starts psd shards and client processes on 127.0.0.1 (data under /dev/shm) and\n"
            "measures push, pull and push+pull rounds of one dense tensor, the optimizers'\n"
            "apply and a BSP step with adam, and each gradient codec's encode and decode, beside\n"
            "ucx_perftest, memcpy and the optimizers in RAM measured in the same run. LIST: sizes like 4K,64K,1M (bytes, multiples of 4).\n"
            "Without --manifest/--shards the layouts are 1x1, 2x2, 4x4 (shards x workers).\n"
            "--manifest takes its shards, job.workers, chunk_bytes and map_size_mb (psbench\n"
            "still starts its own processes, on its own ports and data_dirs).\n"
            "--attach: measure the running shards of --manifest instead (a cluster no job uses:\n"
            "psbench checks with psctl status that it has no workers and no job's training set).\n"
            "W clients (default job.workers) on this host join it and declare tensors psbench.*,\n"
            "which stay in its store. Push and pull under the cluster's consistency and optimizer;\n"
            "rounds when it is bsp. Limits only when every shard is on this host.\n"
            "Transports: shm (UCX's own choice, on one host shared memory), tcp (UCX_TLS=tcp),\n"
            "direct (shm plus psd's direct pulls and pushes on one host), ucx (as shm, the name\n"
            "for shards on other hosts: RDMA or tcp, as UCX picks).\n"
            "--quick: sizes up to 16 MiB, layouts 1x1 and 2x2, fewer iterations (~2 min on\n"
            "  2 idle CPUs, more on a loaded machine).\n"
            "--bsp-push: measure push (and pull) in a bsp cluster, steps without pulls, instead\n"
            "of asp (each push applied on arrival).\n"
            "--only: run some parts (default all); ratios need the limits part (store: the\n"
            "optimizers in RAM and through psd's store alone, part of limits). The limits are\n"
            "read before the cases and again after them; each keeps the better reading.\n"
            "--trials N: run each push, pull and round case N times (1..%d, default 1) and\n"
            "report the one with the median throughput (the note gives the range).\n"
            "--trace DIR: each psd writes its timeline (psd --trace: pushes landing, apply jobs,\n"
            "pulls) to DIR/cID-SxW-TRANSPORT-shardN.json, each client its own (libps's PS_TRACE:\n"
            "ops and their chunks) to ...-clientN.json, for chrome://tracing or Perfetto\n"
            "(tracing costs some speed: compare figures only between runs without it).\n"
            "--round-optimizer NAME: psd's optimizer in the rounds' bsp cluster (with --bsp-push\n"
            "in the pushes' too): mean (default; the server sums, no optimizer), sgd, momentum,\n"
            "adam, adamw or adagrad.\n",
            PB_MAX_TRIALS);
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    uint64_t mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mult = MIB, end++;
    else if (*end == 'G' || *end == 'g')
        mult = 1024u * MIB, end++;
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    uint64_t b = (uint64_t)(v * (double)mult);
    if (end == s || *end != '\0' || b < 4 || b % 4 != 0 || b > 1024u * MIB)
        pb_die("bad size '%s': bytes (K, M suffixes), a multiple of 4, at most 1 GiB", s);
    return b;
}

static uint64_t clampu(uint64_t v, uint64_t lo, uint64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- limits -------------------------------------------------------------------------------- */

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...)
{
    static double t0;
    if (t0 == 0) t0 = pb_now();
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "psbench: [%5.1fs] ", pb_now() - t0);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* One ucx_perftest measurement with @p npairs pairs. A busy-polling ping-pong crawls when the
 * host is busy (each side waits for a scheduler slice), so a run that overstays its time is
 * retried with an eighth of the iterations (*@p iters), twice at most. 0, or pb_perftest_pairs'
 * error. */
static int perftest_try(bench_t *b, const char *test, uint64_t size, uint64_t *iters, double pct,
                        bool sleep_mode, char *const env[], int npairs, double *out, char *err,
                        size_t errlen)
{
    for (int attempt = 0;; attempt++) {
        int rc = pb_perftest_pairs(b->perftest, test, size, *iters, pct, sleep_mode,
                                   b->quick ? 5 : 30, env, npairs, out, err, errlen);
        if (rc != -2 || attempt == 2) return rc;
        progress("%s; again with fewer iterations", err);
        *iters = *iters / 8 > 5 ? *iters / 8 : 5;
    }
}

/* One pair's measurement, or psbench dies: every limit needs it. */
static double perftest(bench_t *b, const char *test, uint64_t size, uint64_t *iters, double pct,
                       bool sleep_mode, char *const env[])
{
    char err[2048];
    double v;
    if (perftest_try(b, test, size, iters, pct, sleep_mode, env, 1, &v, err, sizeof err))
        pb_die("%s", err);
    return v;
}

static double perftest_value(const char *op, pb_metric_t m, uint64_t size, const char *tr)
{
    pb_result_t *r = pb_result_find(op, m, size, tr, NULL);
    return r ? r->value : -1;
}

/* Processes of an SxW layout, in ucx_perftest pairs (2x2: 2 pairs); 1 for 1x1. */
static int layout_pairs(int shards, int workers)
{
    int p = (shards + workers + 1) / 2;
    return p < PB_PERFTEST_PAIRS ? p : PB_PERFTEST_PAIRS;
}

/* The size the concurrent pairs run at: psd's chunk, what it sends a large tensor as, or the
 * largest size measured when every size is smaller. */
static uint64_t pairs_size(const bench_t *b)
{
    uint64_t s = b->sizes[b->nsizes - 1];
    return s < b->chunk_bytes ? s : b->chunk_bytes;
}

/* Context for the layouts with more than one pair of processes: ucp_am_bw with that many
 * pairs side by side on transport @p tr, at pairs_size, as ucp_am_bw_pairs with shards =
 * workers = pairs (pb_perftest_pairs: their bytes over the span they ran). On the 2-vCPU VM,
 * two pairs over tcp move ~0.7 of what one pair moves: four busy processes share two CPUs.
 * The target's limit stays the single pair; this says how much of the gap the transport
 * itself has. Each run lasts ~0.3 s at one pair's rate, so that the pairs overlap and their
 * exits, timed to a few ms, weigh little. A failed run is skipped: this is context only. */
static void measure_pairs(bench_t *b, const char *tr, char *const env[])
{
    uint64_t s = pairs_size(b);
    double one = perftest_value("ucp_am_bw", PB_THROUGHPUT, s, tr);
    for (int l = 0; l < b->nlayouts; l++) {
        int p = layout_pairs(b->layouts[l][0], b->layouts[l][1]);
        bool seen = p < 2;
        for (int k = 0; k < l; k++)
            seen |= layout_pairs(b->layouts[k][0], b->layouts[k][1]) == p;
        if (seen) continue;
        uint64_t n0 = one > 0 ? (uint64_t)(0.3 * one * 1e9 / (double)s) : b->perftest_bytes / s;
        n0 = clampu(n0, 20, 50000);
        int reps = b->quick ? 1 : 3, ran[2] = {0, 0};
        double bw = 0;
        uint64_t best_n = n0;
        char err[2048];
        for (int mode = 0; mode < 2; mode++) /* busy polling, then sleeping */
            for (int rep = 0; rep < reps; rep++) {
                uint64_t n = n0;
                double v = 0;
                if (perftest_try(b, "ucp_am_bw", s, &n, 50, mode == 1, env, p, &v, err,
                                 sizeof err)) {
                    progress("ucx_perftest %d pairs on %s skipped: %s", p, tr, err);
                    continue;
                }
                ran[mode]++;
                if (v > bw) {
                    bw = v;
                    best_n = n;
                }
            }
        if (bw <= 0) continue;
        pb_result_t *r = pb_result_add("ucp_am_bw_pairs", PB_THROUGHPUT, s, p, p, tr, bw);
        r->iters = best_n;
        snprintf(r->note, sizeof r->note,
                 "%d ucx_perftest -t ucp_am_bw -e pairs side by side (%d processes; the %dx%d "
                 "layout has %d): all their bytes over the span they ran, best of %d runs "
                 "polling and %d sleeping; context, not the target's limit",
                 p, 2 * p, b->layouts[l][0], b->layouts[l][1],
                 b->layouts[l][0] + b->layouts[l][1], ran[0], ran[1]);
    }
}

/* A limit read again after the cases (limits_again): @p r keeps the better of its two readings,
 * and its note names both. This VM's speed swings for tens of seconds at a time (memcpy and
 * ucp_am_bw at half their rate, then back), so a limit read only before the cases could judge
 * them against a slow spell of its own. */
static void reading_again(pb_result_t *r, double v)
{
    if (r == NULL || !(v > 0)) return;
    double first = r->value;
    if (r->metric == PB_THROUGHPUT ? v > first : v < first) r->value = v;
    size_t used = strlen(r->note);
    snprintf(r->note + used, sizeof r->note - used,
             "%sread before and after the cases: %.4g and %.4g %s, the better kept",
             used ? "; " : "", first, v, pb_unit(r->metric));
}

/* The limits: memcpy, and ucx_perftest on each UCX transport at every size. @p again: read
 * them once more after the cases (fewer runs, no context), each keeping the better reading. */
static void measure_limits(bench_t *b, bool again)
{
    for (int i = 0; i < b->nsizes; i++) {
        uint64_t s = b->sizes[i];
        double v = pb_memcpy_gbps(s, b->limit_s / 2);
        if (again) {
            reading_again(pb_result_find("memcpy", PB_THROUGHPUT, s, "ram", NULL), v);
            continue;
        }
        pb_result_t *r = pb_result_add("memcpy", PB_THROUGHPUT, s, 0, 0, "ram", v);
        snprintf(r->note, sizeof r->note, "one thread, bytes copied per second");
    }
    progress("memcpy%s done", again ? " again" : "");
    for (int t = 0; t < b->ntransports; t++) {
        /* The UCX transports' limits, once each ("direct" is judged against shm's). */
        const char *tr = pb_transport_ucx(b->transports[t]);
        bool seen = false;
        for (int u = 0; u < t; u++) seen |= strcmp(pb_transport_ucx(b->transports[u]), tr) == 0;
        if (seen) continue;
        char *const *env = pb_transport_env(tr);
        for (int i = 0; i < b->nsizes; i++) {
            uint64_t s = b->sizes[i];
            double bw, p50, p99;
            uint64_t n_bw = clampu(b->perftest_bytes / s, 20, b->quick ? 10000 : 50000);
            /* At least 200 samples: a p99 of 10-16 (1 MiB and up) was their maximum (a review,
             * session 71). */
            uint64_t n_lat = clampu(b->perftest_bytes / 16 / s, 200, b->quick ? 1000 : 10000);
            /* A limit is the best the transport does: the best of a few runs (this host is
             * shared; one run can be several times slower than the next). Busy-polling
             * ping-pongs slow down badly when the two processes do not get a CPU each, hence
             * the modest latency iteration counts. */
            int reps = again ? 1 : b->quick ? 2 : 3;
            bw = 0;
            p50 = p99 = INFINITY;
            for (int rep = 0; rep < reps; rep++) {
                /* Polling and sleeping both: with two vCPUs, polling TCP peers starve the
                 * kernel's loopback processing and swing from 0.3 to 5.5 GB/s run to run. */
                double v = perftest(b, "ucp_am_bw", s, &n_bw, 50, false, env);
                if (v > bw) bw = v;
                v = perftest(b, "ucp_am_bw", s, &n_bw, 50, true, env);
                if (v > bw) bw = v;
                v = perftest(b, "ucp_am_lat", s, &n_lat, 50, false, env);
                if (v < p50) p50 = v;
                v = perftest(b, "ucp_am_lat", s, &n_lat, 99, false, env);
                if (v < p99) p99 = v;
            }
            if (again) {
                reading_again(pb_result_find("ucp_am_bw", PB_THROUGHPUT, s, tr, NULL), bw);
                reading_again(pb_result_find("ucp_am_lat", PB_P50, s, tr, NULL), p50);
                reading_again(pb_result_find("ucp_am_lat", PB_P99, s, tr, NULL), p99);
                continue;
            }
            pb_result_t *r = pb_result_add("ucp_am_bw", PB_THROUGHPUT, s, 0, 0, tr, bw);
            r->iters = n_bw;
            snprintf(
                r->note, sizeof r->note,
                "ucx_perftest -t ucp_am_bw -e, best of %d runs polling and %d sleeping, one pair",
                reps, reps);
            r = pb_result_add("ucp_am_lat", PB_P50, s, 0, 0, tr, p50);
            r->iters = n_lat;
            snprintf(r->note, sizeof r->note,
                     "ucx_perftest -t ucp_am_lat -e (busy polling): one way (half a round trip), "
                     "best of %d runs",
                     reps);
            r = pb_result_add("ucp_am_lat", PB_P99, s, 0, 0, tr, p99);
            r->iters = n_lat;
            if (i == 0) {
                /* Context: the same ping-pong when both sides sleep on the worker's event fd,
                 * as psd and libps do. Not used as a limit. The median of three runs, not the
                 * best: now and then a run's two processes never get to sleep (0.3 us one way
                 * on shm, the busy-polling figure), which is not what this reads. */
                double w50[3], w99[3];
                uint64_t n_w = n_lat;
                for (int rep = 0; rep < 3; rep++) {
                    w50[rep] = perftest(b, "ucp_am_lat", s, &n_w, 50, true, env);
                    w99[rep] = perftest(b, "ucp_am_lat", s, &n_w, 99, true, env);
                }
                double v50 = pb_quantile(w50, 3, 0.5), v99 = pb_quantile(w99, 3, 0.5);
                r = pb_result_add("ucp_am_lat_wakeup", PB_P50, s, 0, 0, tr, v50);
                r->iters = n_w;
                snprintf(r->note, sizeof r->note,
                         "ucx_perftest -t ucp_am_lat -e -E sleep -I: one way, sleeping on the "
                         "event fd as psd does; median of 3 runs (sorted: %.3g, %.3g, %.3g us); "
                         "context, not a limit%s",
                         w50[0], w50[1], w50[2],
                         v50 < p50 + 1 ? "; within 1 us of busy polling: the runs did not sleep"
                                       : "");
                r = pb_result_add("ucp_am_lat_wakeup", PB_P99, s, 0, 0, tr, v99);
                r->iters = n_w;
            }
        }
        if (!again) measure_pairs(b, tr, env);
        progress("ucx_perftest %s%s done", tr, again ? " again" : "");
    }
    if (again) { /* the in-RAM optimizer loops (measure_optimizers' limits) */
        for (int k = 0; k < PSK_OPTIM_KINDS; k++)
            reading_again(pb_result_find("optim_ram", PB_THROUGHPUT, b->apply_size, "ram",
                                         optim_names[k]),
                          pb_optim_ram_gbps((psk_optim_kind_t)k, b->apply_size, b->limit_s,
                                            false));
        pb_result_t *step_adam =
            b->step_size != b->apply_size
                ? pb_result_find("optim_ram", PB_THROUGHPUT, b->step_size, "ram", "adam")
                : NULL;
        if (step_adam)
            reading_again(step_adam, pb_optim_ram_gbps(PSK_ADAM, b->step_size, b->limit_s,
                                                       false));
    }
}

/* The optimizers in RAM and through psd's store in-process (part of the limits, or alone with
 * --only store: no transport, a few seconds). */
static void measure_optimizers(bench_t *b)
{
    char err[2048];
    for (int k = 0; k < PSK_OPTIM_KINDS; k++) {
        double in = pb_optim_ram_gbps((psk_optim_kind_t)k, b->apply_size, b->limit_s, false);
        double out = pb_optim_ram_gbps((psk_optim_kind_t)k, b->apply_size, b->limit_s, true);
        pb_result_t *r = pb_result_add("optim_ram", PB_THROUGHPUT, b->apply_size, 0, 0, "ram", in);
        snprintf(r->optimizer, sizeof r->optimizer, "%s", optim_names[k]);
        snprintf(r->note, sizeof r->note,
                 "psk_optim_apply_cpu in place, one thread, malloc'd arrays");
        r = pb_result_add("optim_ram_oop", PB_THROUGHPUT, b->apply_size, 0, 0, "ram", out);
        snprintf(r->optimizer, sizeof r->optimizer, "%s", optim_names[k]);
        snprintf(r->note, sizeof r->note,
                 "out of place (one fused old -> new pass), as a store step does");
    }
    if (b->step_size != b->apply_size) { /* the BSP step's model: adam on the model's size */
        double in = pb_optim_ram_gbps(PSK_ADAM, b->step_size, b->limit_s, false);
        pb_result_t *r = pb_result_add("optim_ram", PB_THROUGHPUT, b->step_size, 0, 0, "ram", in);
        snprintf(r->optimizer, sizeof r->optimizer, "adam");
        snprintf(r->note, sizeof r->note, "psk_optim_apply_cpu in place, one thread, on the BSP "
                 "step's model size (its model's apply term)");
    }
    progress("optimizers in RAM done");
    /* As psd runs it (PS_APPLY_THREADS, else the online CPUs up to 8), and for adam on one
     * thread too, the limit's own terms. */
    unsigned threads;
    if (psd_fanout_threads_env(0, &threads, err, sizeof err)) pb_die("%s", err);
    threads = psd_fanout_threads(threads);
    for (int k = 0; k <= PSK_OPTIM_KINDS; k++) {
        bool one = k == PSK_OPTIM_KINDS; /* last: adam on one thread */
        int kind = one ? PSK_ADAM : k;
        unsigned nt = one ? 1 : threads;
        if (one && threads == 1) break;
        char dir[PB_PATH];
        snprintf(dir, sizeof dir, "%s/store-%s", pb_tmpdir(), optim_names[kind]);
        pb_store_apply_t a;
        if (pb_store_apply(dir, (psk_optim_kind_t)kind, b->apply_size, b->chunk_bytes, nt,
                           b->limit_s * 2, &a, err, sizeof err))
            pb_die("%s", err);
        pb_rm_rf(dir);
        pb_result_t *r = pb_result_add(one ? "apply_store_1t" : "apply_store", PB_THROUGHPUT,
                                       b->apply_size, 1, 1, "ram", a.gbps);
        snprintf(r->optimizer, sizeof r->optimizer, "%s", optim_names[kind]);
        r->iters = a.steps;
        snprintf(r->note, sizeof r->note,
                 "psd's store in-process, one txn per step, %s chunks updated on %u thread%s: "
                 "updates %.0f%%, commit %.0f%%, step %.0f us",
                 pb_size_str(b->chunk_bytes), nt, nt == 1 ? "" : "s", 100 * a.kernel_share,
                 100 * a.commit_share, a.step_us);
    }
    progress("optimizers through the store done");
}

/* ---- psd cases ----------------------------------------------------------------------------- */

/* Record a case: throughput of tensor bytes over every worker, p50 and p99 of one iteration
 * (their limits come at the end: assign_limits). */
static void record(bench_t *b, const char *op, const pb_cluster_t *cl, uint64_t size, pb_case_t *c,
                   const char *optimizer, const char *note)
{
    int w = cl->conf.workers, s = cl->conf.shards;
    const char *label = cl->conf.transport;
    double tensor_bytes = (double)size * (double)c->iters * (double)w;
    double gbps = tensor_bytes / c->seconds / 1e9;
    double p50 = pb_quantile(c->lat_us, c->nlat, 0.50);
    double p99 = pb_quantile(c->lat_us, c->nlat, 0.99);
    pb_result_t *rt = pb_result_add(op, PB_THROUGHPUT, size, s, w, label, gbps);
    pb_result_t *r5 = pb_result_add(op, PB_P50, size, s, w, label, p50);
    pb_result_t *r9 = pb_result_add(op, PB_P99, size, s, w, label, p99);
    pb_result_t *all[3] = {rt, r5, r9};
    for (int i = 0; i < 3; i++) {
        all[i]->iters = c->nlat;
        if (optimizer) snprintf(all[i]->optimizer, sizeof all[i]->optimizer, "%s", optimizer);
        if (note) snprintf(all[i]->note, sizeof all[i]->note, "%s", note);
        pb_result_cpu(all[i], c->cpu_busy, c->ncpu);
    }
    if (strcmp(op, "round") == 0) rt->extra = 2 * gbps;
    if (b->ncases == PB_MAX_RESULTS / 3) pb_die("too many cases");
    b->cases[b->ncases][0] = rt;
    b->cases[b->ncases][1] = r5;
    b->cases[b->ncases++][2] = r9;
}

/* The limits of a psd case's results @p rt, @p r5, @p r9 (its throughput, p50 and p99). */
static void case_limits(bench_t *b, pb_result_t *rt, pb_result_t *r5, pb_result_t *r9)
{
    const char *op = rt->op, *tr = pb_transport_ucx(rt->transport);
    uint64_t size = rt->size_bytes;
    int s = rt->shards, w = rt->workers;
    double p50 = r5->value;
    /* Limits: the transport alone, one pair of processes.
     * Bandwidth: ucp_am_bw at the tensor's size, or at psd's chunk size when that is better
     * (psd sends a tensor as chunk_bytes messages, all in flight at once). A round moves the
     * tensor both ways, so its tensor rate is limited to half the bandwidth.
     * Latency: a push or pull sends the data one way and a small message back: the one-way
     * latency at the size plus the one-way latency of the smallest size measured. A round's
     * pull reply can only leave once the push arrived and was applied: two one-way latencies
     * at the size. */
    double bw = perftest_value("ucp_am_bw", PB_THROUGHPUT, size, tr);
    char bw_of[48] = "ucp_am_bw";
    if (size > b->chunk_bytes) {
        double bc = perftest_value("ucp_am_bw", PB_THROUGHPUT, b->chunk_bytes, tr);
        if (bc > bw) {
            bw = bc;
            snprintf(bw_of, sizeof bw_of, "ucp_am_bw(%s)", pb_size_str(b->chunk_bytes));
        }
    }
    /* Context: the same transport with as many busy processes as this layout has. */
    double pairs_bw = -1;
    int np = layout_pairs(s, w);
    if (np > 1 && size >= pairs_size(b)) {
        size_t nres;
        pb_result_t *res = pb_results(&nres);
        for (size_t i = 0; i < nres; i++)
            if (strcmp(res[i].op, "ucp_am_bw_pairs") == 0 && res[i].shards == np &&
                strcmp(res[i].transport, tr) == 0)
                pairs_bw = res[i].value;
    }
    char pairs_of[48];
    snprintf(pairs_of, sizeof pairs_of, "ucp_am_bw_pairs(%d)", np);
    double l50 = perftest_value("ucp_am_lat", PB_P50, size, tr);
    double l99 = perftest_value("ucp_am_lat", PB_P99, size, tr);
    /* The way back (a small message) at 4 KiB, as documented; the smallest size measured
     * where 4 KiB was not (before, always that one: a 16 MiB push's limit took a 1 MiB message
     * back when --sizes began at 1M; a review, session 71). */
    uint64_t back = perftest_value("ucp_am_lat", PB_P50, 4096, tr) > 0 ? 4096 : b->sizes[0];
    double s50 = perftest_value("ucp_am_lat", PB_P50, back, tr);
    double s99 = perftest_value("ucp_am_lat", PB_P99, back, tr);
    bool round = strcmp(op, "round") == 0;
    if (round) {
        char of[64];
        snprintf(of, sizeof of, "%s/2", bw_of);
        pb_result_limit(rt, bw / 2, of);
        snprintf(of, sizeof of, "%s/2", pairs_of);
        pb_result_concurrent(rt, pairs_bw / 2, of);
        pb_result_limit(r5, 2 * l50, "2 x ucp_am_lat p50");
        pb_result_limit(r9, 2 * l99, "2 x ucp_am_lat p99");
        /* psd and libps sleep on the worker's event fd between bursts: against UCX doing the
         * same (ucp_am_lat_wakeup, measured at the smallest size) as a second reading. */
        double w50 = perftest_value("ucp_am_lat_wakeup", PB_P50, size, tr);
        if (w50 > 0 && p50 > 0) {
            size_t used = strlen(r5->note);
            snprintf(r5->note + used, sizeof r5->note - used,
                     "%sevent-driven UCX round trip (2 x ucp_am_lat_wakeup) %.1f us: %.2fx",
                     used ? "; " : "", 2 * w50, p50 / (2 * w50));
        }
    } else if (strcmp(op, "push") == 0 || strcmp(op, "pull") == 0) {
        pb_result_limit(rt, bw, bw_of);
        pb_result_concurrent(rt, pairs_bw, pairs_of);
        char of[64];
        snprintf(of, sizeof of, "ucp_am_lat p50 there+back (%s)", pb_size_str(back));
        if (l50 > 0 && s50 > 0) pb_result_limit(r5, l50 + s50, of);
        snprintf(of, sizeof of, "ucp_am_lat p99 there+back (%s)", pb_size_str(back));
        if (l99 > 0 && s99 > 0) pb_result_limit(r9, l99 + s99, of);
    }
}

static void cluster_conf(bench_t *b, pb_cluster_conf_t *k, int shards, int workers,
                         const char *consistency, const char *optimizer, const char *transport)
{
    memset(k, 0, sizeof *k);
    k->shards = shards;
    k->workers = workers;
    k->consistency = consistency;
    k->optimizer = optimizer;
    k->transport = transport;
    k->chunk_bytes = b->chunk_bytes;
    k->map_size_mb = b->map_size_mb;
    k->psd = b->psd;
    k->trace_dir = b->trace_dir;
    k->self = b->self;
}

static uint64_t warm_iters(bench_t *b, uint64_t size)
{
    return b->quick ? clampu((8u * MIB) / size, 2, 20) : clampu((64u * MIB) / size, 3, 100);
}

/* Run @p op b->trials times and record the trial with the median throughput: this VM's runs
 * swing by up to 2x now and then (a busy-polling process left without a CPU). */
static void run_case(bench_t *b, pb_cluster_t *cl, const char *op, uint64_t size,
                     const char *optimizer, const char *note)
{
    pb_case_t c[PB_MAX_TRIALS];
    double gbps[PB_MAX_TRIALS];
    int order[PB_MAX_TRIALS], n = b->trials;
    for (int t = 0; t < n; t++) {
        pb_cluster_case(cl, op, size, warm_iters(b, size), b->case_s, b->min_iters,
                        b->max_iters, &c[t]);
        gbps[t] = (double)size * (double)c[t].iters * cl->conf.workers / c[t].seconds / 1e9;
        int j = t; /* insertion sort of the trials by throughput */
        for (; j > 0 && gbps[order[j - 1]] > gbps[t]; j--) order[j] = order[j - 1];
        order[j] = t;
        progress("%-5s %dx%d %s %-8s %d x %" PRIu64 " iterations in %.2f s", op, cl->conf.shards,
                 cl->conf.workers, cl->conf.transport, pb_size_str(size), cl->conf.workers,
                 c[t].iters, c[t].seconds);
    }
    char full[640];
    if (n > 1)
        snprintf(full, sizeof full, "%s; median of %d trials (%.3g-%.3g GB/s)", note, n,
                 gbps[order[0]], gbps[order[n - 1]]);
    else
        snprintf(full, sizeof full, "%s", note);
    record(b, op, cl, size, &c[order[(n - 1) / 2]], optimizer, full); /* the lower median */
    for (int t = 0; t < n; t++) pb_case_free(&c[t]);
}

#define MANY 32 /* bench/client.c: the many_* ops' tensors per step */

/* A BSP step of 32 small tensors (biases, norms): fused into one message per shard (and the
 * replies too), against the same step with one message per tensor, in the same cluster. */
static void run_many(bench_t *b, pb_cluster_t *cl, uint64_t size)
{
    const char *ops[2] = {"round_many_single", "round_many"};
    double p50[2] = {0, 0};
    pb_result_t *r[2][2] = {{0}};
    for (int i = 0; i < 2; i++) {
        pb_case_t c;
        pb_cluster_case(cl, ops[i], size, 20, b->case_s, b->min_iters, b->max_iters, &c);
        int w = cl->conf.workers, s = cl->conf.shards;
        double bytes = (double)size * MANY * (double)c.iters * w;
        p50[i] = pb_quantile(c.lat_us, c.nlat, 0.5);
        r[i][0] = pb_result_add(ops[i], PB_THROUGHPUT, size, s, w, cl->conf.transport,
                                bytes / c.seconds / 1e9);
        r[i][1] = pb_result_add(ops[i], PB_P50, size, s, w, cl->conf.transport, p50[i]);
        pb_result_t *r9 = pb_result_add(ops[i], PB_P99, size, s, w, cl->conf.transport,
                                        pb_quantile(c.lat_us, c.nlat, 0.99));
        pb_result_t *all[3] = {r[i][0], r[i][1], r9};
        for (int j = 0; j < 3; j++) {
            all[j]->iters = c.nlat;
            pb_result_cpu(all[j], c.cpu_busy, c.ncpu);
            snprintf(all[j]->optimizer, sizeof all[j]->optimizer, "%s", cl->conf.optimizer);
            snprintf(all[j]->note, sizeof all[j]->note, "bsp step of %d tensors of this size: %s",
                     MANY, i ? "fused (one message per shard each way)"
                             : "one message per tensor each way");
        }
        progress("%-17s %dx%d %s %-8s %d x %" PRIu64 " iterations in %.2f s", ops[i], s, w,
                 cl->conf.transport, pb_size_str(size), w, c.iters, c.seconds);
        pb_case_free(&c);
    }
    /* The unfused step is the baseline: ratio > 1 is the gain of fusion. */
    pb_result_limit(r[1][0], r[0][0]->value, "round_many_single");
    pb_result_limit(r[1][1], p50[0], "round_many_single");
}

static void measure_psd(bench_t *b)
{
    for (int l = 0; l < b->nlayouts; l++)
        for (int t = 0; t < b->ntransports; t++) {
            int s = b->layouts[l][0], w = b->layouts[l][1];
            const char *tr = b->transports[t];
            pb_cluster_conf_t k;
            pb_cluster_t cl;
            /* Pushes and pulls in an asp cluster with sgd (the cheapest optimizer): each push
             * is applied on arrival and acked once committed; pull(min_version 0) never waits.
             * Rounds in a bsp cluster with --round-optimizer, by default mean: the BSP step
             * without an optimizer, the server sums (and scales by 1/W). With --bsp-push, one
             * bsp cluster for all three: a push is acked once every worker pushed the step and
             * its update is committed. */
            const char *popt = b->asp_push ? "sgd" : b->round_optim;
            char note[160];
            cluster_conf(b, &k, s, w, b->asp_push ? "asp" : "bsp", popt, tr);
            memcpy(k.sizes, b->sizes, sizeof k.sizes);
            k.nsizes = b->nsizes;
            pb_cluster_start(&cl, &k, b->cluster_id++);
            progress("%dx%d %s: %s", s, w, tr, cl.lanes);
            if (b->asp_push)
                snprintf(note, sizeof note, "asp: acked once its sgd apply commits");
            else
                snprintf(note, sizeof note, "bsp: acked once every worker pushed and %s commits",
                         popt);
            for (int i = 0; i < b->nsizes; i++) run_case(b, &cl, "push", b->sizes[i], popt, note);
            for (int i = 0; i < b->nsizes; i++)
                run_case(b, &cl, "pull", b->sizes[i], NULL, "pull(min_version 0)");
            if (b->asp_push) {
                pb_cluster_stop(&cl);
                cluster_conf(b, &k, s, w, "bsp", b->round_optim, tr);
                memcpy(k.sizes, b->sizes, sizeof k.sizes);
                k.nsizes = b->nsizes;
                pb_cluster_start(&cl, &k, b->cluster_id++);
            }
            snprintf(note, sizeof note, "bsp, %s every step: push(s) + pull(min_version s+1)",
                     strcmp(b->round_optim, "mean") == 0 ? "the pushes' mean kept"
                                                          : "the optimizer applied");
            for (int i = 0; i < b->nsizes; i++)
                run_case(b, &cl, "round", b->sizes[i], b->round_optim, note);
            run_many(b, &cl, 1024);
            pb_cluster_stop(&cl);
        }
}

/* ---- --attach: shards someone else started ------------------------------------------------ */

/* Whether @p host names this machine: a loopback address or one of its interfaces'. */
static bool host_is_local(const char *host)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) return false;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) ifs = NULL;
    bool local = false;
    for (struct addrinfo *a = res; a && !local; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            const struct in_addr *in = &((const struct sockaddr_in *)a->ai_addr)->sin_addr;
            if ((ntohl(in->s_addr) >> 24) == 127) local = true;
            for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
                if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                    ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == in->s_addr)
                    local = true;
        } else if (a->ai_family == AF_INET6) {
            const struct in6_addr *in = &((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
            if (IN6_IS_ADDR_LOOPBACK(in)) local = true;
            for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
                if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET6 &&
                    memcmp(&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, in,
                           sizeof *in) == 0)
                    local = true;
        }
    }
    if (ifs) freeifaddrs(ifs);
    freeaddrinfo(res);
    return local;
}

/* The number of "key": N in @p j; -1 when absent. */
static long long json_num(const char *j, const char *key)
{
    char v[32];
    return ps_json_field(j, key, v, sizeof v) ? strtoll(v, NULL, 10) : -1;
}

/* Ask the running cluster of @p manifest (`psctl --manifest M status --json`, psctl beside
 * psd or $PSCTL) what it is, and refuse it unless no job uses it: psbench's clients join the
 * coordinator's step, so a job's workers would wait for their pushes, and a job's training set
 * could not be registered beside psbench's. Fills b->attach_*. Dies with the reason. */
static void attach_check(bench_t *b, const ps_manifest_t *m, const char *manifest)
{
    char psctl[PB_PATH];
    const char *env = getenv("PSCTL");
    if (env && *env) {
        snprintf(psctl, sizeof psctl, "%s", env);
    } else {
        const char *slash = strrchr(b->psd, '/');
        snprintf(psctl, sizeof psctl, "%.*spsctl", slash ? (int)(slash - b->psd + 1) : 0, b->psd);
    }
    if (access(psctl, X_OK) != 0) pb_die("--attach: no psctl at '%s' (PSCTL=PATH)", psctl);
    char *argv[] = {psctl, "--manifest", (char *)manifest, "status", "--json", "--timeout", "15",
                    NULL};
    pb_proc_t *p = pb_spawn("psctl-status", argv, NULL, false, true);
    static char j[262144];
    int rc;
    do /* UCX writes its warnings to stdout too: skip them */
        rc = pb_proc_readline(p, j, sizeof j, 60, NULL);
    while (rc == 0 && j[0] != '[');
    int st = pb_proc_wait(p, 30);
    if (rc != 0 || st != 0) /* a shard's error is in the JSON, anything else in the log */
        pb_die("--attach: psctl --manifest %s status failed (exit %d): %.2000s\n%s", manifest,
               st, rc == 0 ? j : "", pb_proc_tail(p, 2000));
    pb_proc_free(p);
    int n = 0;
    for (const char *q = j; (q = strstr(q, "\"shard\": ")) != NULL; q++) n++;
    if (n != m->nservers)
        pb_die("--attach: %s names %d shards, %d answered psctl status", manifest, m->nservers, n);
    if (!ps_json_field(j, "cluster", b->attach_cluster, sizeof b->attach_cluster) ||
        !ps_json_field(j, "consistency", b->attach_consistency, sizeof b->attach_consistency) ||
        !ps_json_field(j, "optimizer", b->attach_optimizer, sizeof b->attach_optimizer))
        pb_die("--attach: psctl status did not name the cluster, consistency and optimizer");
    long long workers = json_num(j, "actual_workers"), samples = json_num(j, "samples"),
              applied = json_num(j, "samples_applied");
    if (workers < 0 || samples < 0 || applied < 0)
        pb_die("--attach: psctl status did not give the job's workers and samples (%s)",
               psctl);
    if (workers != 0)
        pb_die("--attach: cluster %s has %lld workers in its job: psbench's clients would join "
               "its steps; attach only to shards no job uses",
               b->attach_cluster, workers);
    if (applied > 0 || (samples > 0 && (unsigned long long)samples != PB_CLIENT_SAMPLES))
        pb_die("--attach: cluster %s holds a job (a training set of %lld samples, %lld applied): "
               "attach only to shards no job uses (fresh data_dirs)",
               b->attach_cluster, samples, applied);
    b->attach = manifest;
    b->attach_shards = m->nservers;
    b->attach_local = true;
    for (int i = 0; i < m->nservers; i++) b->attach_local &= host_is_local(m->servers[i].host);
}

/* Push, pull and (under bsp) the round on the attached cluster, once per transport: W clients
 * join, run the cases, leave; the shards keep running. */
static void measure_attached(bench_t *b)
{
    bool bsp = strcmp(b->attach_consistency, "bsp") == 0;
    int w = b->layouts[0][1];
    for (int t = 0; t < b->ntransports; t++) {
        pb_cluster_conf_t k;
        pb_cluster_t cl;
        cluster_conf(b, &k, b->attach_shards, w, b->attach_consistency, b->attach_optimizer,
                     b->transports[t]);
        memcpy(k.sizes, b->sizes, sizeof k.sizes);
        k.nsizes = b->nsizes;
        pb_cluster_attach(&cl, &k, b->attach, b->cluster_id++);
        progress("attached to %s over %s: %s", b->attach_cluster, b->transports[t], cl.lanes);
        char note[1024];
        snprintf(note, sizeof note, "cluster %s (attached), %s: %s; %s", b->attach_cluster,
                 b->attach_consistency,
                 bsp ? "acked once every worker pushed the step and its update commits"
                     : "acked once its update commits",
                 cl.lanes);
        for (int i = 0; i < b->nsizes; i++)
            run_case(b, &cl, "push", b->sizes[i], b->attach_optimizer, note);
        char pull_note[600];
        snprintf(pull_note, sizeof pull_note, "pull(min_version 0); %s", cl.lanes);
        for (int i = 0; i < b->nsizes; i++)
            run_case(b, &cl, "pull", b->sizes[i], NULL, pull_note);
        if (bsp) {
            snprintf(note, sizeof note,
                     "cluster %s (attached), bsp: push(s) + pull(min_version s+1); %s",
                     b->attach_cluster, cl.lanes);
            for (int i = 0; i < b->nsizes; i++)
                run_case(b, &cl, "round", b->sizes[i], b->attach_optimizer, note);
            run_many(b, &cl, 1024);
        } else if (t == 0) {
            progress("no rounds: cluster %s is %s (a round is a bsp step)", b->attach_cluster,
                     b->attach_consistency);
        }
        pb_cluster_stop(&cl);
    }
}

/* Each optimizer applied by psd: asp pushes on 1 shard x 1 worker over shared memory, so each
 * push is received, applied and committed before it is acknowledged (mean, which needs bsp:
 * bsp pushes of the one worker, acknowledged the same way). */
static void measure_apply(bench_t *b)
{
    for (int k = 0; k < PSK_OPTIM_KINDS; k++) {
        pb_cluster_conf_t kc;
        pb_cluster_t cl;
        /* mean needs bsp; with one worker a bsp push is acked once applied too. */
        cluster_conf(b, &kc, 1, 1, k == PSK_MEAN ? "bsp" : "asp", optim_names[k], "shm");
        kc.sizes[0] = b->apply_size;
        kc.nsizes = 1;
        pb_cluster_start(&cl, &kc, b->cluster_id++);
        pb_case_t c;
        pb_cluster_case(&cl, "push", b->apply_size, b->quick ? 3 : 5, b->case_s * 2, b->min_iters,
                        b->max_iters, &c);
        record(b, "apply", &cl, b->apply_size, &c, optim_names[k],
               k == PSK_MEAN ? "bsp push of 1 worker through psd (transfer + apply + commit + ack)"
                             : "asp push through psd (transfer + apply + commit + ack)");
        pb_case_free(&c);
        pb_cluster_stop(&cl);
        progress("apply %s done", optim_names[k]);
    }
}

/* The nearest measured size to @p want (ucp_am_bw at psd's chunk size). */
static uint64_t nearest_size(bench_t *b, uint64_t want)
{
    uint64_t best = b->sizes[0];
    for (int i = 0; i < b->nsizes; i++)
        if (fabs(log((double)b->sizes[i] / (double)want)) < fabs(log((double)best / (double)want)))
            best = b->sizes[i];
    return best;
}

/* A full BSP step with adam: 2 shards x 2 workers, push(s) + pull(s+1) of the whole model. */
static void measure_step_on(bench_t *b, const char *tr)
{
    pb_cluster_conf_t kc;
    pb_cluster_t cl;
    cluster_conf(b, &kc, 2, 2, "bsp", "adam", tr);
    kc.sizes[0] = b->step_size;
    kc.nsizes = 1;
    pb_cluster_start(&cl, &kc, b->cluster_id++);
    pb_case_t c;
    pb_cluster_case(&cl, "round", b->step_size, 3, b->case_s * 4, b->quick ? 5 : 10, b->max_iters,
                    &c);
    double step_us = pb_quantile(c.lat_us, c.nlat, 0.5);
    double m = (double)b->step_size;
    pb_result_t *rt = pb_result_add("bsp_step", PB_THROUGHPUT, b->step_size, 2, 2, tr,
                                    m / (step_us * 1e-6) / 1e9);
    pb_result_t *r5 = pb_result_add("bsp_step", PB_P50, b->step_size, 2, 2, tr, step_us);
    pb_result_t *r9 = pb_result_add("bsp_step", PB_P99, b->step_size, 2, 2, tr,
                                    pb_quantile(c.lat_us, c.nlat, 0.99));
    pb_result_t *all[3] = {rt, r5, r9};
    for (int i = 0; i < 3; i++) {
        snprintf(all[i]->optimizer, sizeof all[i]->optimizer, "adam");
        all[i]->iters = c.nlat;
        pb_result_cpu(all[i], c.cpu_busy, c.ncpu);
    }
    progress("bsp step (%s): p50 %.0f us (%" PRIu64 " steps)", tr, step_us, c.iters);
    pb_case_free(&c);
    pb_cluster_stop(&cl);
}

/* The step over shm alone and with direct pulls (whichever --transports names). */
static void measure_step(bench_t *b)
{
    for (int t = 0; t < b->ntransports; t++)
        if (strcmp(b->transports[t], "tcp") != 0) measure_step_on(b, b->transports[t]);
}

/* ---- limits -------------------------------------------------------------------------------- */

/* The limit of a BSP step's results (@p rt its throughput, @p r5 its p50), its model: every
 * byte the step moves (W pushes and W pulls of the model) at the transport's bandwidth for
 * psd's message size (one chunk), plus the model's adam update at the in-RAM rate of one
 * thread. The shards' applies and the transfers could overlap and run on two cores, so this is
 * not a lower bound on this 2-core host, but the rate a step would have if psd added no cost of
 * its own. */
static void step_limits(bench_t *b, pb_result_t *rt, pb_result_t *r5, pb_result_t *r9)
{
    double m = (double)rt->size_bytes;
    uint64_t cs = nearest_size(b, b->chunk_bytes);
    double bw = perftest_value("ucp_am_bw", PB_THROUGHPUT, cs, "shm");
    /* The model: the bytes each worker moves (its push and its pull of the model, 2M)
     * at UCX's bandwidth, plus the apply measured alone (adam in RAM on the model's size).
     * Before session 71 it charged every worker's bytes (2*W*M) at one pair's bandwidth, W
     * times the transfer term, and adam at the apply size (16 MiB in quick mode): a
     * review found the step's ratio ~1.5x kinder than the issue's. That all-bytes model stays
     * in the note, as context for one host's shared memory bandwidth. */
    pb_result_t *lim = pb_result_find("optim_ram", PB_THROUGHPUT, rt->size_bytes, "ram", "adam");
    if (lim == NULL)
        lim = pb_result_find("optim_ram", PB_THROUGHPUT, b->apply_size, "ram", "adam");
    double t_model = -1, t_all = -1;
    if (bw > 0 && lim) {
        t_model = 2.0 * m / (bw * 1e9) + m / (lim->value * 1e9);
        t_all = 2.0 * rt->workers * m / (bw * 1e9) + m / (lim->value * 1e9);
    }
    pb_result_t *all[3] = {rt, r5, r9};
    for (int i = 0; i < 3 && all[i]; i++)
        snprintf(all[i]->note, sizeof all[i]->note,
                 "model: 2*M / ucp_am_bw(%s) + M / optim_ram(adam, %s) = %.0f us (every "
                 "worker's bytes, 2*W*M, at that bandwidth: %.0f us)", pb_size_str(cs),
                 lim ? pb_size_str(lim->size_bytes) : "?", t_model * 1e6, t_all * 1e6);
    if (t_model > 0) {
        pb_result_limit(rt, m / t_model / 1e9, "model");
        if (r5) pb_result_limit(r5, t_model * 1e6, "model");
    }
}

/* Every result's limit and ratio, from the limits' final readings (measure_limits, and with
 * limits_again the better of two): a run judges every case against the same figures. */
static void assign_limits(bench_t *b)
{
    for (int i = 0; i < b->ncases; i++) case_limits(b, b->cases[i][0], b->cases[i][1],
                                                    b->cases[i][2]);
    size_t n;
    pb_result_t *res = pb_results(&n);
    for (size_t i = 0; i < n; i++) {
        pb_result_t *r = &res[i];
        if (r->metric != PB_THROUGHPUT) continue;
        if (strcmp(r->op, "ucp_am_bw") == 0) {
            pb_result_t *m = pb_result_find("memcpy", PB_THROUGHPUT, r->size_bytes, "ram", NULL);
            if (m) pb_result_limit(r, m->value, "memcpy");
        } else if (strcmp(r->op, "ucp_am_bw_pairs") == 0) {
            pb_result_limit(r, perftest_value("ucp_am_bw", PB_THROUGHPUT, r->size_bytes,
                                              r->transport), "ucp_am_bw (one pair)");
        } else if (strcmp(r->op, "optim_ram_oop") == 0 || strcmp(r->op, "apply_store") == 0 ||
                   strcmp(r->op, "apply_store_1t") == 0 || strcmp(r->op, "apply") == 0) {
            pb_result_t *lim =
                pb_result_find("optim_ram", PB_THROUGHPUT, b->apply_size, "ram", r->optimizer);
            if (lim) pb_result_limit(r, lim->value, "optim_ram");
        } else if (strcmp(r->op, "bsp_step") == 0) {
            step_limits(b, r,
                        pb_result_find("bsp_step", PB_P50, r->size_bytes, r->transport, NULL),
                        pb_result_find("bsp_step", PB_P99, r->size_bytes, r->transport, NULL));
        }
    }
}

/* ---- main ---------------------------------------------------------------------------------- */

/* The 1-minute load average: other work on the host makes every figure noisier. */
static double loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

/* Each codec's encode (worker, with error feedback) and decode-add (shard) on one chunk,
 * against memcpy of the same bytes measured right before. */
static void measure_codecs(bench_t *b)
{
    static const char *codecs[] = {"fp16", "bf16", "int8", "sign", "topk:0.1", "topk:0.01",
                                   "topk:0.001", "randomk:0.01"};
    uint64_t size = b->chunk_bytes;
    double mc = pb_memcpy_gbps(size, b->limit_s);
    pb_result_t *m = pb_result_find("memcpy", PB_THROUGHPUT, size, "ram", NULL);
    if (m == NULL) {
        m = pb_result_add("memcpy", PB_THROUGHPUT, size, 0, 0, "ram", mc);
        snprintf(m->note, sizeof m->note, "one thread, bytes copied per second");
    }
    for (size_t i = 0; i < sizeof codecs / sizeof *codecs; i++)
        for (int d = 0; d < 2; d++) {
            char op[32];
            snprintf(op, sizeof op, "%s:%s", d ? "decode" : "encode", codecs[i]);
            double v = pb_codec_gbps(codecs[i], size, b->limit_s, d);
            pb_result_t *r = pb_result_add(op, PB_THROUGHPUT, size, 0, 0, "ram", v);
            pb_result_limit(r, mc, "memcpy");
            snprintf(r->note, sizeof r->note, "%s", d ? "shard: decode and add into the sum"
                                                      : "worker: encode with error feedback");
        }
    progress("codecs done");
}

static void meta_json(bench_t *b, double load0, double load1, char *out, size_t len)
{
    struct utsname u;
    uname(&u);
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    /* The attached cluster's name as psctl printed it (already JSON, quotes excluded). */
    char attached[160] = "null";
    if (b->attach) snprintf(attached, sizeof attached, "\"%s\"", b->attach_cluster);
    snprintf(out, len,
             "\"tool\": \"psbench\", \"date\": \"%s\", \"host\": \"%s\", \"kernel\": \"%s\", "
             "\"cpus\": %ld, \"loadavg_start\": %.2f, \"loadavg_end\": %.2f, \"quick\": %s, "
             "\"chunk_bytes\": %" PRIu64 ", \"push\": \"%s\", \"round_optimizer\": \"%s\", "
             "\"units\": \"GB/s = 1e9 bytes/s of tensor bytes; us = microseconds\", "
             "\"ratio\": \"value/limit for throughput, limit/value for times: 1 = at the limit\", "
             "\"attached\": %s",
             date, u.nodename, u.release, sysconf(_SC_NPROCESSORS_ONLN), load0, load1,
             b->quick ? "true" : "false", b->chunk_bytes,
             b->attach ? b->attach_consistency : b->asp_push ? "asp" : "bsp", b->round_optim,
             attached);
}

static const char *find_perftest(void)
{
    static char path[PB_PATH];
    const char *env = getenv("PATH");
    char *copy = strdup(env ? env : "/usr/bin:/bin"), *save = NULL;
    for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, sizeof path, "%s/ucx_perftest", d);
        if (access(path, X_OK) == 0) {
            free(copy);
            return path;
        }
    }
    free(copy);
    return "/usr/bin/ucx_perftest";
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--client") == 0) return pb_client_main(argc, argv);

    static const struct option opts[] = {{"manifest", required_argument, 0, 'f'},
                                         {"shards", required_argument, 0, 'S'},
                                         {"workers", required_argument, 0, 'W'},
                                         {"sizes", required_argument, 0, 's'},
                                         {"transports", required_argument, 0, 't'},
                                         {"json", required_argument, 0, 'j'},
                                         {"markdown", required_argument, 0, 'M'},
                                         {"quick", no_argument, 0, 'q'},
                                         {"bsp-push", no_argument, 0, 'a'},
                                         {"only", required_argument, 0, 'o'},
                                         {"psd", required_argument, 0, 'p'},
                                         {"perftest", required_argument, 0, 'P'},
                                         {"trials", required_argument, 0, 'T'},
                                         {"trace", required_argument, 0, 'R'},
                                         {"round-optimizer", required_argument, 0, 'O'},
                                         {"attach", no_argument, 0, 'A'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static bench_t b;
    const char *manifest = NULL, *sizes = NULL, *transports = "shm,tcp,direct";
    bool transports_default = true;
    int shards = 0, workers = 0, o;
    bool attach = false, pick_optim = false; /* --attach; --bsp-push or --round-optimizer */
    b.chunk_bytes = MIB;
    b.asp_push = true;
    b.trials = 1;
    b.round_optim = "mean";
    b.push_optim = "sgd";
    b.psd = getenv("PSD") ? getenv("PSD") : PSBENCH_PSD;
    b.perftest = find_perftest();
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'f':
            manifest = optarg;
            break;
        case 'S':
        case 'W': { /* a count: "1x" was taken as 1 (an input probe, session 63) */
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || v < 1 || v > 1000) {
                fprintf(stderr, "psbench: --%s %s: want a count of 1 or more\n",
                        o == 'S' ? "shards" : "workers", optarg);
                return 2;
            }
            *(o == 'S' ? &shards : &workers) = (int)v;
            break;
        }
        case 's':
            sizes = optarg;
            break;
        case 't':
            transports = optarg;
            transports_default = false;
            break;
        case 'j':
            b.json = optarg;
            break;
        case 'M':
            b.markdown = optarg;
            break;
        case 'q':
            b.quick = true;
            break;
        case 'a':
            b.asp_push = false;
            pick_optim = true;
            break;
        case 'A':
            attach = true;
            break;
        case 'o': {
            char *copy = strdup(optarg), *save = NULL;
            for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (strcmp(t, "limits") == 0)
                    b.only |= PART_LIMITS;
                else if (strcmp(t, "ops") == 0)
                    b.only |= PART_OPS;
                else if (strcmp(t, "apply") == 0)
                    b.only |= PART_APPLY;
                else if (strcmp(t, "step") == 0)
                    b.only |= PART_STEP;
                else if (strcmp(t, "codecs") == 0)
                    b.only |= PART_CODECS;
                else if (strcmp(t, "store") == 0)
                    b.only |= PART_STORE;
                else {
                    fprintf(stderr, "psbench: --only %s: limits, ops, apply, step, codecs, store\n",
                            t);
                    return 2;
                }
            }
            free(copy);
            break;
        }
        case 'p':
            b.psd = optarg;
            break;
        case 'P':
            b.perftest = optarg;
            break;
        case 'R':
            b.trace_dir = optarg;
            if (mkdir(optarg, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "psbench: --trace %s: %s\n", optarg, strerror(errno));
                return 2;
            }
            break;
        case 'O': {
            int k = 0;
            while (k < PSK_OPTIM_KINDS && strcmp(optarg, optim_names[k]) != 0) k++;
            if (k == PSK_OPTIM_KINDS) {
                fprintf(stderr, "psbench: --round-optimizer %s: one of", optarg);
                for (k = 0; k < PSK_OPTIM_KINDS; k++) fprintf(stderr, " %s", optim_names[k]);
                fputc('\n', stderr);
                return 2;
            }
            b.round_optim = optim_names[k];
            pick_optim = true;
            break;
        }
        case 'T': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > PB_MAX_TRIALS) {
                fprintf(stderr, "psbench: --trials %s: a number from 1 to %d\n", optarg,
                        PB_MAX_TRIALS);
                return 2;
            }
            b.trials = (int)v;
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    bool bad = optind != argc;
    if (manifest)
        bad |= shards || (workers && !attach);
    else
        bad |= attach || !shards != !workers;
    if (bad) {
        usage(stderr);
        return 2;
    }
    if (attach && pick_optim) {
        fprintf(stderr, "psbench: --attach measures the cluster as it runs: its consistency and "
                        "optimizer, not --bsp-push or --round-optimizer\n");
        return 2;
    }
    if (shards < 0 || shards > PB_MAX_SHARDS || workers < 0 || workers > PB_MAX_WORKERS) {
        fprintf(stderr, "psbench: at most %d shards and %d workers\n", PB_MAX_SHARDS,
                PB_MAX_WORKERS);
        return 2;
    }
    ssize_t n = readlink("/proc/self/exe", b.self, sizeof b.self - 1);
    if (n <= 0) {
        fprintf(stderr, "psbench: readlink /proc/self/exe: %s\n", strerror(errno));
        return 1;
    }
    b.self[n] = '\0';
    if (!attach && access(b.psd, X_OK) != 0) {
        fprintf(stderr, "psbench: no psd at '%s' (--psd PATH or PSD=PATH)\n", b.psd);
        return 2;
    }

    /* Shard data on tmpfs, as PLATFORM-NOTES.md section 4 recommends. */
    struct stat st;
    pb_proc_init(stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp");

    static ps_manifest_t m;
    if (manifest) {
        char err[1024];
        if (ps_manifest_load(&m, manifest, err, sizeof err)) { /* 2, as every tool's */
            fprintf(stderr, "psbench: %s\n", err);
            pb_proc_cleanup(); /* its directory */
            return 2;
        }
        shards = m.nservers;
        if (workers == 0) workers = m.job.workers ? (int)m.job.workers : 1;
        if (shards > PB_MAX_SHARDS || workers > PB_MAX_WORKERS)
            pb_die("%s: psbench runs at most %d shards and %d workers%s", manifest,
                   PB_MAX_SHARDS, PB_MAX_WORKERS, attach ? " (--workers W)" : "");
        b.chunk_bytes = m.chunk_bytes;
        b.map_size_mb = m.map_size_mb;
    }
    if (shards) {
        b.layouts[0][0] = shards;
        b.layouts[0][1] = workers;
        b.nlayouts = 1;
    } else {
        static const int all[3][2] = {{1, 1}, {2, 2}, {4, 4}};
        b.nlayouts = b.quick ? 2 : 3;
        memcpy(b.layouts, all, sizeof all);
    }
    if (sizes) {
        char *copy = strdup(sizes), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (b.nsizes == PB_MAX_SIZES) pb_die("at most %d sizes", PB_MAX_SIZES);
            b.sizes[b.nsizes++] = parse_size(t);
        }
        free(copy);
    } else {
        static const uint64_t all[] = {4096, 65536, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            if (!b.quick || all[i] <= 16 * MIB) b.sizes[b.nsizes++] = all[i];
    }
    if (b.nsizes == 0) pb_die("no sizes");
    for (int i = 1; i < b.nsizes; i++) /* ascending: sizes[0] is the smallest */
        for (int j = i; j > 0 && b.sizes[j] < b.sizes[j - 1]; j--) {
            uint64_t t = b.sizes[j];
            b.sizes[j] = b.sizes[j - 1];
            b.sizes[j - 1] = t;
        }
    if (attach) {
        attach_check(&b, &m, manifest);
        /* Its own consistency and optimizer; the parts that start clusters of their own or
         * measure only this host's CPU do not apply. */
        bool bsp = strcmp(b.attach_consistency, "bsp") == 0;
        b.asp_push = !bsp;
        b.push_optim = b.round_optim = b.attach_optimizer;
        if (b.only & (PART_APPLY | PART_STEP | PART_CODECS | PART_STORE))
            pb_die("--attach: --only limits,ops (apply, step, codecs and store start clusters of "
                   "their own or measure this host alone)");
        if (b.only == 0) b.only = PART_LIMITS | PART_OPS;
        if ((b.only & PART_LIMITS) && !b.attach_local) {
            progress("limits skipped: shards on other hosts (ucx_perftest runs on this host)");
            b.only &= ~(unsigned)PART_LIMITS;
            if (b.only == 0) pb_die("--attach: nothing to measure (--only ops)");
        }
        if (transports_default) transports = b.attach_local ? "shm,tcp,direct" : "ucx";
    }
    {
        char *copy = strdup(transports), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            static const char *known[] = {"shm", "tcp", "direct", "ucx"};
            int k = 0;
            while (k < 4 && strcmp(t, known[k])) k++;
            if (k == 4) pb_die("transport '%s': shm, tcp, direct or ucx", t);
            if (k == 3 && !b.attach)
                pb_die("transport 'ucx': for --attach to shards on other hosts (here: shm)");
            if (b.attach && !b.attach_local && k != 3 && k != 1)
                pb_die("transport '%s': the shards are not all on this host (ucx or tcp)", t);
            bool dup = false;
            for (int u = 0; u < b.ntransports; u++) dup |= b.transports[u] == known[k];
            if (!dup) b.transports[b.ntransports++] = known[k];
        }
        free(copy);
        if (b.ntransports == 0) pb_die("no transports");
    }
    if (b.only == 0) b.only = PART_ALL;
    if ((b.only & PART_LIMITS) && access(b.perftest, X_OK) != 0) {
        fprintf(stderr, "psbench: no ucx_perftest at '%s' (package ucx-utils; --perftest PATH)\n",
                b.perftest);
        return 2;
    }
    b.case_s = b.quick ? 0.35 : 1.5;
    b.min_iters = b.quick ? 4 : 10;
    b.max_iters = b.quick ? 3000 : 20000;
    b.limit_s = b.quick ? 0.15 : 0.5;
    b.perftest_bytes = b.quick ? 256u * MIB : 2048u * MIB;
    b.apply_size = b.quick ? 16 * MIB : 64 * MIB;
    b.step_size = 64 * MIB;

    double t0 = pb_now(), load0 = loadavg();
    if (b.only & PART_LIMITS) measure_limits(&b, false);
    if ((b.only & PART_STORE) || ((b.only & PART_LIMITS) && !b.attach)) measure_optimizers(&b);
    if (b.only & PART_OPS) {
        if (b.attach)
            measure_attached(&b);
        else
            measure_psd(&b);
    }
    if (b.only & PART_APPLY) measure_apply(&b);
    if (b.only & PART_STEP) measure_step(&b);
    if (b.only & PART_CODECS) measure_codecs(&b);
    /* The limits once more after the cases that are judged against them: each keeps the better
     * reading (reading_again). */
    if ((b.only & PART_LIMITS) && (b.only & (PART_OPS | PART_APPLY | PART_STEP))) {
        measure_limits(&b, true);
        progress("limits read again");
    }
    assign_limits(&b);
    double took = pb_now() - t0, load1 = loadavg();

    /* What push and round mean in this run (an attached asp or ssp cluster has no rounds). */
    const char *cons = b.attach ? b.attach_consistency : b.asp_push ? "asp" : "bsp";
    char push_is[160], round_is[200];
    if (b.asp_push)
        snprintf(push_is, sizeof push_is, "%s, acked after its %s apply commits", cons,
                 b.push_optim);
    else
        snprintf(push_is, sizeof push_is,
                 "bsp without pulls, acked once every worker pushed and its %s update commits",
                 b.round_optim);
    if (b.attach && b.asp_push)
        snprintf(round_is, sizeof round_is, "no rounds: a round is a bsp step, cluster %s is %s",
                 b.attach_cluster, cons);
    else
        snprintf(round_is, sizeof round_is,
                 "round (the BSP step with optimizer %s%s): push(s) + pull(min_version s+1) "
                 "together, the transport moves 2x the tensor bytes (in parentheses)",
                 b.round_optim,
                 strcmp(b.round_optim, "mean") == 0 ? ": no optimizer, the server sums" : "");
    printf("psbench: GB/s = 1e9 tensor bytes/s over all workers; us = microseconds per "
           "operation (p50/p99 over every worker's samples).\n"
           "%s%s%spush: %s; pull: min_version 0; %s.\n"
           "ratio = value/limit (throughput), limit/value (latency): 1.0 = at the limit. "
           "[pairs]: throughput against ucp_am_bw_pairs, the transport with as many busy "
           "processes as the layout (context, not the limit).\n\n",
           b.attach ? "attached to cluster " : "", b.attach ? b.attach_cluster : "",
           b.attach ? " (its own shards; psbench started only the clients).\n" : "", push_is,
           round_is);
    pb_report_table();
    size_t nres;
    pb_result_t *res = pb_results(&nres);
    pb_targets_report(stdout, res, nres, false);
    printf("\n%zu results, %d clusters, %.1f s; load average %.2f at the start, %.2f at the end "
           "(%ld CPUs)\n",
           nres, b.cluster_id, took, load0, load1, sysconf(_SC_NPROCESSORS_ONLN));
    if (b.attach)
        printf("cluster %s keeps psbench's tensors (psbench.*) and its clients' training-set size "
               "in its store: a job needs shards on fresh data_dirs\n",
               b.attach_cluster);
    char meta[1536];
    meta_json(&b, load0, load1, meta, sizeof meta);
    if (b.json) {
        int rc = pb_report_json(b.json, meta);
        if (rc) pb_die("%s: %s", b.json, strerror(-rc));
    }
    if (b.markdown) {
        int rc = pb_report_markdown(b.markdown);
        FILE *f = rc ? NULL : fopen(b.markdown, "a");
        if (f) pb_targets_report(f, res, nres, true);
        if (rc == 0 && f == NULL) rc = -errno;
        if (f && (ferror(f) | fclose(f)) && rc == 0) rc = -EIO;
        if (rc) pb_die("%s: %s", b.markdown, strerror(-rc));
    }
    pb_proc_cleanup();
    if (pb_failed_procs) {
        fprintf(stderr, "psbench: %d of its processes ended badly (above)\n", pb_failed_procs);
        return 1;
    }
    return 0;
}
