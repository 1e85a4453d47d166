/* trace.h: a timeline of one shard's data path (psd --trace FILE), in the Chrome trace event
 * format that chrome://tracing and Perfetto (ui.perfetto.dev) open.
 *
 * It shows where a step's time goes on the shard: when each chunk's push landed (a rendezvous
 * receive as a span from its header to its data), each apply job (a span on the loop thread or
 * on the pool, with its chunks and bytes), and each pull from its request to its answer (and,
 * for a reply sent alone over UCX, to the end of its transfer). Timestamps are
 * CLOCK_MONOTONIC microseconds, so the traces of the shards of one host line up.
 *
 * The file's format, flushing and size limit are common/tracefile.h's (ps_trace_t).
 *
 * Called on the loop thread only (ps_trace_now, the clock, on any); each does nothing when @p t
 * is NULL (no --trace), and the callers take no timestamp then. */
#ifndef PSD_TRACE_H
#define PSD_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tracefile.h"

/** @brief Create (truncate) @p path and write the shard's lane names. Called once the shard
 *  holds its data_dir, so that a second psd started by mistake cannot truncate a live trace.
 *  @return 0 and *out (owned by the caller: ps_trace_close), or PS_EIO (PS_ENOMEM) with
 *  @p err naming the path and the reason. */
int psd_trace_open(ps_trace_t **out, const char *path, uint32_t shard, char *err,
                   size_t errlen);

/** @brief A push of chunk @p tensor/@p chunk from @p rank for @p step landed at @p landed_ns.
 *  @p arrived_ns < @p landed_ns (a rendezvous receive) makes it a span from the header's
 *  arrival; otherwise an instant. @p direct: its data was in the pusher's push area. */
void psd_trace_push(ps_trace_t *t, uint32_t tensor, uint32_t chunk, uint32_t rank,
                    uint64_t step, uint64_t arrived_ns, uint64_t landed_ns, bool direct);

/** @brief An apply job ran from @p begin_ns to @p end_ns: @p nitems chunks from
 *  @p tensor/@p chunk (the first), @p bytes of records, on the pool or on the loop thread;
 *  @p ok false: it failed (nothing was committed). */
void psd_trace_apply(ps_trace_t *t, uint64_t begin_ns, uint64_t end_ns, uint32_t nitems,
                     uint32_t tensor, uint32_t chunk, uint64_t bytes, bool pooled, bool ok);

/** @brief A pull of chunk @p tensor/@p chunk asked at @p asked_ns was answered at
 *  @p answered_ns with @p version and done at @p done_ns: when a reply sent alone over UCX
 *  finished its transfer; @p answered_ns for a direct pull (the worker reads the store itself)
 *  and for a small reply copied into a bundle. @p ok false: the reply's send failed. */
void psd_trace_pull(ps_trace_t *t, uint32_t tensor, uint32_t chunk, uint64_t version,
                    uint64_t asked_ns, uint64_t answered_ns, uint64_t done_ns, bool direct,
                    bool ok);

#endif
