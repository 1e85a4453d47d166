/* tracefile.h: a timeline file in the Chrome trace event format (chrome://tracing,
 * ui.perfetto.dev), written by one thread at a time of one process: psd's --trace (server/trace.c) and
 * libps's PS_TRACE (worker/client.c).
 *
 * The file is a JSON array with one event per line: first the process's and its lanes' names
 * ("ph" M), then the caller's spans and instants. Chrome accepts it without the closing
 * "]", so a process killed mid-run leaves a readable trace up to its last flushed event (the
 * buffer is flushed every PS_TRACE_FLUSH events and at close). After PS_TRACE_MAX_EVENTS
 * events it stops, saying so in the log, so a long run cannot fill the disk. Timestamps are
 * CLOCK_MONOTONIC (callers pass ps_trace_now's nanoseconds; the file holds microseconds), so the
 * traces of one host's processes line up: bench/trace_merge.sh joins them into one view.
 *
 * Not thread-safe: one thread at a time uses a ps_trace_t from open to close (its owner
 * serializes them: libps's loop_mu; ps_trace_now excepted). */
#ifndef PS_TRACEFILE_H
#define PS_TRACEFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PS_TRACE_MAX_EVENTS 1000000u
#define PS_TRACE_FLUSH 4096u

typedef struct ps_trace_s ps_trace_t;

/** @brief Create (truncate) @p path and write the names of process @p pid ("pid" of every
 *  event) and of its @p nlanes lanes ("tid" 1..nlanes; @p lanes[0] names lane 1). A "%p" in
 *  @p path becomes this process's id, so processes started alike write apart.
 *  @return 0 and *out (owned by the caller: ps_trace_close), or PS_EIO (PS_ENOMEM) with @p err
 *  naming the path and the reason. */
int ps_trace_open(ps_trace_t **out, const char *path, uint32_t pid, const char *process,
                  const char *const *lanes, int nlanes, char *err, size_t errlen);

/** @brief Close the array, flush, and free @p t (NULL: nothing). A write that failed during
 *  the run (a full disk) is reported in the log here. */
void ps_trace_close(ps_trace_t *t);

/* The events a trace holds, each on lane @p lane ("tid") of the process, named @p name (no
 * characters that need escaping in JSON), with @p args the text of a JSON object or NULL. Each
 * does nothing when @p t is NULL or full. */

/** @brief A span that may overlap others on its lane (an async "b" / "e" pair of category
 *  @p cat with an id of this process's, Chrome's "id2" local: equal ids of other processes in
 *  a merged trace do not pair with it). @p args go on its beginning. */
void ps_trace_span(ps_trace_t *t, int lane, const char *cat, const char *name,
                   uint64_t begin_ns, uint64_t end_ns, const char *args);

/** @brief A span that nests with the others of its lane ("ph" X): one at a time there. */
void ps_trace_complete(ps_trace_t *t, int lane, const char *name, uint64_t begin_ns,
                       uint64_t end_ns, const char *args);

/** @brief A moment ("ph" i, thread-scoped). */
void ps_trace_instant(ps_trace_t *t, int lane, const char *name, uint64_t ns, const char *args);

/** @brief CLOCK_MONOTONIC in nanoseconds (any thread). */
uint64_t ps_trace_now(void);

#endif
