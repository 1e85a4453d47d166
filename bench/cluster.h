/* cluster.h: a psbench cluster on 127.0.0.1: a manifest in the temp directory, S psd shards
 * with their data_dirs under it, and W client processes (psbench --client, see client.h) that
 * run the cases psbench asks for. */
#ifndef PB_CLUSTER_H
#define PB_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "cpustat.h"
#include "proc.h"

#define PB_MAX_SHARDS 16
#define PB_MAX_WORKERS 16
#define PB_MAX_SIZES 16

typedef struct {
    int shards, workers;
    const char *consistency; /* "asp" | "bsp" */
    const char *optimizer;   /* "sgd" | "momentum" | "adam" | "adamw" | "adagrad" | "mean" */
    const char *transport;   /* "shm" (UCX defaults, as psd sets them) | "tcp" (UCX_TLS=tcp), both
                                with PS_DIRECT_PULL=0 | "direct" (shm, pulls read from the store)
                                | "ucx" (shm's settings, for shards on other hosts) */
    uint64_t chunk_bytes;
    uint64_t map_size_mb;         /* at least (0: computed from the sizes and the optimizer) */
    uint64_t sizes[PB_MAX_SIZES]; /* one tensor "psbench.SIZE" per size */
    int nsizes;
    const char *psd;  /* path of the psd binary */
    const char *trace_dir; /* psd --trace into DIR/cID-SxW-TRANSPORT-shardN.json and the
                              clients' PS_TRACE into ...-clientN.json, or NULL */
    const char *self; /* path of psbench (for the client role) */
} pb_cluster_conf_t;

typedef struct {
    pb_cluster_conf_t conf;
    bool attached; /* pb_cluster_attach: the shards are someone else's (psd[] stays NULL) */
    char dir[PB_PATH - 64];
    char manifest[PB_PATH];
    uint16_t port[PB_MAX_SHARDS];
    pb_proc_t *psd[PB_MAX_SHARDS];
    pb_proc_t *cli[PB_MAX_WORKERS];
    char lanes[512]; /* client 0's "shard 0 over sysv,cma + direct ...; shard 1 over ..." */
} pb_cluster_t;

typedef struct {
    uint64_t iters; /* per worker */
    double seconds; /* first start to last end over every worker */
    double *lat_us; /* [iters * workers] every sample (malloc'd: pb_case_free) */
    uint64_t nlat;
    int ncpu;                      /* CPUs in cpu_busy; 0: not measured */
    float cpu_busy[PB_MAX_CPUS];   /* each CPU's busy fraction over the timed iterations */
} pb_case_t;

/** @brief Start the shards and the clients; returns when every client is ready. Dies on failure
 *  (with the failing process's log). @p id makes the directory and names unique. */
void pb_cluster_start(pb_cluster_t *cl, const pb_cluster_conf_t *conf, int id);

/**
 * @brief Attach to running shards: start only the W clients (conf->workers), with the
 *  transport's environment, on @p manifest (the cluster's own; psbench writes no manifest and
 *  starts no psd). conf->shards must be the manifest's server count; conf->psd is not used.
 *  Returns when every client is ready; dies on failure (with the client's log).
 * @note pb_cluster_stop() then lets the clients leave and leaves the shards running.
 */
void pb_cluster_attach(pb_cluster_t *cl, const pb_cluster_conf_t *conf, const char *manifest,
                       int id);

/**
 * @brief Run @p op on the tensor of @p size on every client at once: @p warm untimed iterations,
 *  then as many timed ones as fit in @p target_s (judged from the warm-up), within
 *  [min_iters, max_iters]; every client runs the same count (BSP needs them all).
 */
void pb_cluster_case(pb_cluster_t *cl, const char *op, uint64_t size, uint64_t warm,
                     double target_s, uint64_t min_iters, uint64_t max_iters, pb_case_t *out);
void pb_case_free(pb_case_t *c);

/** @brief Let the clients leave, stop the shards (SIGTERM, then SIGKILL), remove the data;
 *  an attached cluster's shards and data are left as they are. A process that had to be
 *  killed is said on stderr; one that exited with a status other than 0 (or by a signal) is
 *  said with its log's end and counted in pb_failed_procs. */
void pb_cluster_stop(pb_cluster_t *cl);

/** Processes pb_cluster_stop found failed so far (psbench then exits 1). */
extern int pb_failed_procs;

/** @brief The UCX environment of @p transport ("NAME=VALUE" strings, NULL-terminated, static). */
char *const *pb_transport_env(const char *transport);
/** @brief The UCX transport whose ucx_perftest limits apply to @p transport ("direct", "ucx":
 *  "shm"). */
const char *pb_transport_ucx(const char *transport);

#endif
