/* trace.c: psd --trace FILE, a Chrome trace of the shard's data path (trace.h). */
#include "trace.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps/ps_error.h"
#include "ps/ps_log.h"

/* The lanes (Chrome's "tid") of one shard's process ("pid" = the shard). */
enum { LANE_PUSH = 1, LANE_APPLY = 2, LANE_PULL = 3 };

struct psd_trace_s {
    FILE *f;
    char path[1024];
    uint32_t shard;
    uint64_t events;
    uint64_t next_id; /* async spans' ids */
    bool full;        /* PSD_TRACE_MAX_EVENTS written: nothing more */
};

uint64_t psd_trace_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Room for one more event? Says once in the log when the trace is full. */
static bool room(psd_trace_t *t)
{
    if (t == NULL || t->full) return false;
    if (t->events < PSD_TRACE_MAX_EVENTS) return true;
    t->full = true;
    fflush(t->f);
    PS_LOG(PS_LOG_WARN, "trace", "%s: stopped after %u events", t->path, PSD_TRACE_MAX_EVENTS);
    return false;
}

/* Write one event: the JSON object @p fmt makes, as the array's next element. */
static void event(psd_trace_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void event(psd_trace_t *t, const char *fmt, ...)
{
    va_list ap;
    fputs(",\n", t->f);
    va_start(ap, fmt);
    vfprintf(t->f, fmt, ap);
    va_end(ap);
    if (++t->events % PSD_TRACE_FLUSH == 0) fflush(t->f);
}

static double us(uint64_t ns) { return (double)ns / 1000.0; }

int psd_trace_open(psd_trace_t **out, const char *path, uint32_t shard, char *err,
                   size_t errlen)
{
    psd_trace_t *t = calloc(1, sizeof *t);
    if (t == NULL) {
        snprintf(err, errlen, "trace %s: out of memory", path);
        return PS_ENOMEM;
    }
    if ((t->f = fopen(path, "w")) == NULL) {
        snprintf(err, errlen, "cannot write the trace %s: %s", path, strerror(errno));
        free(t);
        return PS_EIO;
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    t->shard = shard;
    setvbuf(t->f, NULL, _IOFBF, 1 << 20);
    /* The first element has no comma before it: the process name. */
    fprintf(t->f, "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,"
                  "\"args\":{\"name\":\"psd shard %u\"}}",
            shard, shard);
    static const char *lanes[] = {NULL, "pushes landed", "apply jobs", "pulls"};
    for (int l = LANE_PUSH; l <= LANE_PULL; l++)
        event(t, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":%d,"
                 "\"args\":{\"name\":\"%s\"}}",
              shard, l, lanes[l]);
    if (fflush(t->f) != 0 || ferror(t->f)) {
        snprintf(err, errlen, "cannot write the trace %s: %s", path, strerror(errno));
        fclose(t->f);
        free(t);
        return PS_EIO;
    }
    *out = t;
    return 0;
}

void psd_trace_close(psd_trace_t *t)
{
    if (t == NULL) return;
    fputs("\n]\n", t->f);
    bool lost = ferror(t->f) != 0; /* a write that failed during the run */
    if (fclose(t->f) != 0 || lost)
        PS_LOG(PS_LOG_WARN, "trace", "%s: some events were not written: %s", t->path,
               lost ? "a write failed during the run" : strerror(errno));
    free(t);
}

void psd_trace_push(psd_trace_t *t, uint32_t tensor, uint32_t chunk, uint32_t rank,
                    uint64_t step, uint64_t arrived_ns, uint64_t landed_ns, bool direct)
{
    if (!room(t)) return;
    if (arrived_ns && arrived_ns < landed_ns) {
        uint64_t id = ++t->next_id;
        event(t, "{\"name\":\"push %u/%u\",\"cat\":\"push\",\"ph\":\"b\",\"id\":%" PRIu64
                 ",\"ts\":%.3f,\"pid\":%u,\"tid\":%d,\"args\":{\"rank\":%u,\"step\":%" PRIu64
                 ",\"direct\":%s}}",
              tensor, chunk, id, us(arrived_ns), t->shard, LANE_PUSH, rank, step,
              direct ? "true" : "false");
        event(t, "{\"name\":\"push %u/%u\",\"cat\":\"push\",\"ph\":\"e\",\"id\":%" PRIu64
                 ",\"ts\":%.3f,\"pid\":%u,\"tid\":%d}",
              tensor, chunk, id, us(landed_ns), t->shard, LANE_PUSH);
        return;
    }
    event(t, "{\"name\":\"push %u/%u\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,\"pid\":%u,"
             "\"tid\":%d,\"args\":{\"rank\":%u,\"step\":%" PRIu64 ",\"direct\":%s}}",
          tensor, chunk, us(landed_ns), t->shard, LANE_PUSH, rank, step,
          direct ? "true" : "false");
}

void psd_trace_apply(psd_trace_t *t, uint64_t begin_ns, uint64_t end_ns, uint32_t nitems,
                     uint32_t tensor, uint32_t chunk, uint64_t bytes, bool pooled, bool ok)
{
    if (!room(t)) return;
    event(t, "{\"name\":\"apply\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%u,\"tid\":%d,"
             "\"args\":{\"chunks\":%u,\"first\":\"%u/%u\",\"bytes\":%" PRIu64 ",\"on\":\"%s\","
             "\"ok\":%s}}",
          us(begin_ns), us(end_ns > begin_ns ? end_ns - begin_ns : 0), t->shard, LANE_APPLY,
          nitems, tensor, chunk, bytes, pooled ? "pool" : "loop", ok ? "true" : "false");
}

void psd_trace_pull(psd_trace_t *t, uint32_t tensor, uint32_t chunk, uint64_t version,
                    uint64_t asked_ns, uint64_t answered_ns, uint64_t done_ns, bool direct,
                    bool ok)
{
    if (!room(t)) return;
    if (done_ns < answered_ns) done_ns = answered_ns;
    if (asked_ns == 0 || asked_ns > answered_ns) asked_ns = answered_ns;
    uint64_t id = ++t->next_id;
    event(t, "{\"name\":\"pull %u/%u\",\"cat\":\"pull\",\"ph\":\"b\",\"id\":%" PRIu64
             ",\"ts\":%.3f,\"pid\":%u,\"tid\":%d,\"args\":{\"version\":%" PRIu64
             ",\"waited_us\":%.3f,\"direct\":%s,\"ok\":%s}}",
          tensor, chunk, id, us(asked_ns), t->shard, LANE_PULL, version,
          us(answered_ns - asked_ns), direct ? "true" : "false", ok ? "true" : "false");
    event(t, "{\"name\":\"pull %u/%u\",\"cat\":\"pull\",\"ph\":\"e\",\"id\":%" PRIu64
             ",\"ts\":%.3f,\"pid\":%u,\"tid\":%d}",
          tensor, chunk, id, us(done_ns), t->shard, LANE_PULL);
}
