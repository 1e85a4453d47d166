/* bounds.h: what psbench compares psd with, measured in the same run: ucx_perftest on the
 * transport psd uses, memcpy bandwidth, the optimizers' fused loops on one thread in RAM, and
 * the optimizer applied through psd's own LMDB store module in this process (no transport),
 * the way a shard applies a step. */
#ifndef PB_BOUNDS_H
#define PB_BOUNDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "optim.h"

typedef struct {
    double bw_gbps; /* ucp_am_bw: overall bandwidth, 10^9 B/s */
    double lat_p50; /* ucp_am_lat: one-way latency (half a round trip), us */
    double lat_p99;
} pb_perftest_t;

#define PB_PERFTEST_PAIRS 8 /* pb_perftest_pairs runs at most this many pairs at once */

/**
 * @brief Run ucx_perftest for @p test ("ucp_am_bw" or "ucp_am_lat") with @p size byte
 *  messages, error handling PEER (-e) as psd uses, and the UCX environment @p env
 *  ("NAME=VALUE", NULL-terminated): @p npairs pairs (1..PB_PERFTEST_PAIRS; latency tests 1) of
 *  a server and a client on 127.0.0.1, side by side, each on its own port; every server is
 *  started and listening before the first client starts.
 * @param percentile for latency tests: the rank to report (50, 99).
 * @param sleep_mode wait on the event fd (-E sleep -I) instead of busy polling.
 * @param timeout_s how long the run may take; every process is killed after it.
 * @param[out] out latency in us, or bandwidth in GB/s: for one pair its own figure; for
 *  several, every pair's measured bytes over the span from the first pair's measured start
 *  (its exit minus its own run time) to the last pair's exit, what the transport moves with
 *  2 x @p npairs busy processes (pairs that did not overlap count for what they moved, not as
 *  a sum). Give each pair a run of a few hundred ms at least: the exits are timed to a few ms.
 * @note @p env and @p err are borrowed; nothing is kept. Every process is reaped before it
 *  returns.
 * @return 0 (then *@p out is set, and only then), -2 on timeout, or -1 (failed); @p err says
 *  why.
 */
int pb_perftest_pairs(const char *perftest, const char *test, uint64_t size, uint64_t iters,
                      double percentile, bool sleep_mode, double timeout_s, char *const env[],
                      int npairs, double *out, char *err, size_t errlen);

/** @brief memcpy bandwidth (bytes copied per second, 10^9) of @p size byte buffers, for about
 *  @p seconds. */
double pb_memcpy_gbps(uint64_t size, double seconds);

/** @brief Throughput in GB/s of fp32 gradient bytes of one thread encoding @p size bytes with
 *  @p codec and error feedback (@p decode false, the worker's side), or decoding and adding
 *  them into an aggregation buffer (@p decode true, the shard's side), for @p seconds. */
double pb_codec_gbps(const char *codec, uint64_t size, double seconds, bool decode);

/** @brief The fused optimizer loop on malloc'd arrays of @p size parameter bytes, one thread:
 *  parameter bytes per second (10^9). In place, or (@p out_of_place) alternating between two
 *  sets of buffers as a copy-on-write store does. */
double pb_optim_ram_gbps(psk_optim_kind_t kind, uint64_t size, double seconds, bool out_of_place);

typedef struct {
    double gbps;         /* parameter bytes applied per second, the whole step */
    double step_us;      /* median step time */
    double kernel_share; /* fraction of the step spent in the updates (the fan-out's batch) */
    double commit_share; /* fraction spent in mdb_txn_commit */
    uint64_t steps;
} pb_store_apply_t;

/**
 * @brief Apply @p kind to a @p size byte tensor through psd's store (server/store.h) in
 *  @p dir: per step one write transaction; per chunk of @p chunk_bytes the old record from the
 *  read snapshot and a new one from MDB_RESERVE, then the updates old -> new
 *  (psd_store_chunk_update) on a fan-out of @p threads threads (0: psd's default), then
 *  commit. That is what a shard's apply job does for one worker (apply.c run_apply).
 * @return 0, or -1 with @p err filled.
 */
int pb_store_apply(const char *dir, psk_optim_kind_t kind, uint64_t size, uint64_t chunk_bytes,
                   unsigned threads, double seconds, pb_store_apply_t *out, char *err,
                   size_t errlen);

#endif
