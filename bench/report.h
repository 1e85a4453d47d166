/* report.h: psbench's results: one record per measured case, percentiles, the JSON file and
 * the table on stdout.
 *
 * Units: throughputs in GB/s of tensor bytes (10^9 B/s), latencies and step times in
 * microseconds. Every psd result carries the limit it is compared with and
 * ratio = value / limit for throughputs, limit / value for times, so that 1.0 means "at the
 * limit" and smaller is worse for both. Results that are limits themselves (memcpy, the
 * in-RAM optimizer loops, ucp_am_lat) have no limit (JSON null). */
#ifndef PB_REPORT_H
#define PB_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include "cpustat.h"

typedef enum { PB_THROUGHPUT = 0, PB_P50, PB_P99 } pb_metric_t;

typedef struct {
    char op[32]; /* push | pull | round | apply | apply_store | bsp_step | memcpy |
                    optim_ram | ucp_am_bw | ucp_am_lat */
    pb_metric_t metric;
    uint64_t size_bytes; /* tensor (or message) bytes */
    int shards, workers; /* 0 when not a cluster measurement */
    char transport[8];   /* shm | tcp | ram */
    char optimizer[12];  /* sgd | momentum | adam | adamw | adagrad | mean, or "" */
    double value;
    double limit;      /* < 0: none */
    char limit_of[64]; /* what the limit is, e.g. "ucp_am_bw/2" */
    double ratio;      /* < 0: none */
    /* Context for layouts of more than two processes: the same transport with as many busy
     * processes (ucp_am_bw_pairs), and value / that; < 0: none. */
    double concurrent_limit;
    char concurrent_of[48];
    double concurrent_ratio;
    uint64_t iters; /* samples behind the value (all workers together) */
    double extra;   /* round: transport GB/s (2 x tensor bytes); < 0: none */
    char note[640]; /* attached clusters name every shard's transports here */
    int ncpu;                    /* CPUs in cpu_busy; 0: not measured (limits, in-RAM loops) */
    float cpu_busy[PB_MAX_CPUS]; /* each CPU's busy fraction while the case ran */
} pb_result_t;

#define PB_MAX_RESULTS 4096

/** @brief A new zeroed result appended to the list (limit, ratio, extra and concurrent_* -1);
 *  the pointer stays valid until the process exits. Dies past PB_MAX_RESULTS results. */
pb_result_t *pb_result_add(const char *op, pb_metric_t metric, uint64_t size, int shards,
                           int workers, const char *transport, double value);
/** @brief The results so far; *n gets the count. */
pb_result_t *pb_results(size_t *n);
/** @brief The first result matching every non-NULL / non-negative key, or NULL. */
pb_result_t *pb_result_find(const char *op, pb_metric_t metric, uint64_t size,
                            const char *transport, const char *optimizer);

/** @brief Unit of a metric: "GB/s" for throughput, "us" otherwise. */
const char *pb_unit(pb_metric_t m);
/** @brief Set the limit and the ratio (see the header comment for its direction). */
void pb_result_limit(pb_result_t *r, double limit, const char *limit_of);

/** @brief Set the concurrent limit (context, beside the limit) and ratio = value / limit; does
 *  nothing when @p limit <= 0 or @p r is not a throughput. @p limit_of is copied. */
void pb_result_concurrent(pb_result_t *r, double limit, const char *limit_of);

/** @brief Copy a case's per-CPU busy fractions (@p n of them, at most PB_MAX_CPUS) into @p r. */
void pb_result_cpu(pb_result_t *r, const float *busy, int n);

/** @brief The q-quantile (0..1, nearest rank) of @p v[n]; sorts @p v in place. */
double pb_quantile(double *v, size_t n, double q);

/** @brief Write every result to @p path as JSON: {"meta": {...}, "results": [...]}.
 *  @p meta_json is the inside of the meta object ("\"quick\": true, ..."). 0 or -errno. */
int pb_report_json(const char *path, const char *meta_json);
/** @brief Print the readable table to stdout. */
void pb_report_table(void);
/** @brief Print the table as Markdown to @p path (for docs/PERFORMANCE.md). 0 or -errno. */
int pb_report_markdown(const char *path);

/** @brief "4 KiB", "16 MiB". Static storage rotating over 8 buffers. */
const char *pb_size_str(uint64_t bytes);

#endif
