/* targets.h: psbench's verdict on the fast-path issue's targets (docs/PERFORMANCE.md), read
 * off one run's results: each target with the ratios of the cases it covers, the bar, and
 * whether every case meets it. Only a verdict on what this run measured: a target none of
 * whose cases ran (--only, --sizes, --transports) says so. */
#ifndef PB_TARGETS_H
#define PB_TARGETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "report.h"

/** Bars: a round's transport rate over ucp_am_bw; a 4 KiB round's p50 over UCX's round trip
 *  (psbench's limit, 2 x the busy-polling ucp_am_lat; the event-driven one is in the table's
 *  note); adam through the store (psd's apply threads) over the in-RAM loop (one thread); the
 *  BSP step over psbench's model (docs/PERFORMANCE.md: every worker's bytes over one pair's
 *  ucp_am_bw, the workers of one host sharing it, plus the apply alone). */
#define PB_TARGET_ROUND_BW 0.8
#define PB_TARGET_ROUND_MIN_BYTES (1u << 20)
#define PB_TARGET_SMALL_BYTES 4096u
#define PB_TARGET_SMALL_RTTS 2.0
#define PB_TARGET_ADAM_STORE 0.7
#define PB_TARGET_STEP_MODEL 1.3

/**
 * @brief Print one line per target to @p f (as a Markdown list when @p markdown): the cases
 *  of @p res[@p n] it covers with their figures, then "met", "not met (K of N below)" or
 *  "not measured in this run". Reads @p res only.
 * @return how many targets were measured and not met.
 */
int pb_targets_report(FILE *f, const pb_result_t *res, size_t n, bool markdown);

#endif
