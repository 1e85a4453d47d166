/* tracefile.h: a timeline file in the Chrome trace event format (chrome://tracing,
 * ui.perfetto.dev), written by one thread of one process: psd's --trace (server/trace.c) and
 * libps's PS_TRACE (worker/client.c).
 *
 * The file is a JSON array with one event per line: first the process's and its lanes' names
 * ("ph" M), then what the caller writes (ps_trace_event). Chrome accepts it without the closing
 * "]", so a process killed mid-run leaves a readable trace up to its last flushed event (the
 * buffer is flushed every PS_TRACE_FLUSH events and at close). After PS_TRACE_MAX_EVENTS
 * events it stops, saying so in the log, so a long run cannot fill the disk. Timestamps are
 * CLOCK_MONOTONIC microseconds (ps_trace_us of ps_trace_now), so the traces of the processes of
 * one host line up: concatenate their arrays to see them in one view.
 *
 * Not thread-safe: one thread owns a ps_trace_t from open to close (ps_trace_now excepted). */
#ifndef PS_TRACEFILE_H
#define PS_TRACEFILE_H

#include <inttypes.h>
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

/** @brief Whether @p t takes @p n more events (false for NULL, or once the trace is full:
 *  the first refusal says so in the log). Call before writing an event's lines. */
bool ps_trace_room(ps_trace_t *t, unsigned n);

/** @brief Append one event: the JSON object @p fmt makes (no newline, no comma: the writer
 *  adds them). Its strings must need no escaping (names and numbers the caller makes). */
void ps_trace_event(ps_trace_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** @brief The "pid" given to ps_trace_open. */
uint32_t ps_trace_pid(const ps_trace_t *t);

/** @brief A new id for an async span ("ph" b and e of one "cat" and "name"), written with
 *  PS_TRACE_ID: an id of this process's (Chrome's "id2" local), so that the same ids of other
 *  processes in a merged trace do not pair with it. */
uint64_t ps_trace_next_id(ps_trace_t *t);

/** @brief The format of an async span's id (one uint64_t argument), inside an event. */
#define PS_TRACE_ID "\"id2\":{\"local\":\"0x%" PRIx64 "\"}"

/** @brief CLOCK_MONOTONIC in nanoseconds (any thread). */
uint64_t ps_trace_now(void);

/** @brief Nanoseconds as the format's microseconds. */
static inline double ps_trace_us(uint64_t ns) { return (double)ns / 1000.0; }

#endif
