/* tracefile.c: a Chrome trace event file written by one thread (tracefile.h). */
#include "tracefile.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ps/ps_error.h"
#include "ps/ps_log.h"

struct ps_trace_s {
    FILE *f;
    char path[1024];
    uint32_t pid;
    uint64_t events;
    uint64_t next_id; /* async spans' ids */
    bool full;        /* PS_TRACE_MAX_EVENTS written: nothing more */
};

uint64_t ps_trace_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Room for @p n more events? The first refusal of a full trace says so in the log. */
static bool room(ps_trace_t *t, unsigned n)
{
    if (t == NULL || t->full) return false;
    if (t->events + n <= PS_TRACE_MAX_EVENTS) return true;
    t->full = true;
    fflush(t->f);
    PS_LOG(PS_LOG_WARN, "trace", "%s: stopped after %" PRIu64 " events", t->path, t->events);
    return false;
}

/* Append one event: the JSON object @p fmt makes, after a comma (the first after "["). */
static void event(ps_trace_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void event(ps_trace_t *t, const char *fmt, ...)
{
    va_list ap;
    fputs(t->events ? ",\n" : "[\n", t->f);
    va_start(ap, fmt);
    vfprintf(t->f, fmt, ap);
    va_end(ap);
    if (++t->events % PS_TRACE_FLUSH == 0) fflush(t->f);
}

static double us(uint64_t ns) { return (double)ns / 1000.0; }

/* ",\"args\":{...}" or nothing. */
#define ARGS_FMT "%s%s"
#define ARGS(a) (a) ? ",\"args\":" : "", (a) ? (a) : ""

void ps_trace_span(ps_trace_t *t, int lane, const char *cat, const char *name,
                   uint64_t begin_ns, uint64_t end_ns, const char *args)
{
    if (!room(t, 2)) return;
    uint64_t id = ++t->next_id;
    if (end_ns < begin_ns) end_ns = begin_ns;
    event(t, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"b\",\"id2\":{\"local\":\"0x%" PRIx64
             "\"},\"ts\":%.3f,\"pid\":%u,\"tid\":%d" ARGS_FMT "}",
          name, cat, id, us(begin_ns), t->pid, lane, ARGS(args));
    event(t, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"e\",\"id2\":{\"local\":\"0x%" PRIx64
             "\"},\"ts\":%.3f,\"pid\":%u,\"tid\":%d}",
          name, cat, id, us(end_ns), t->pid, lane);
}

void ps_trace_complete(ps_trace_t *t, int lane, const char *name, uint64_t begin_ns,
                       uint64_t end_ns, const char *args)
{
    if (!room(t, 1)) return;
    event(t, "{\"name\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%u,\"tid\":%d"
             ARGS_FMT "}",
          name, us(begin_ns), us(end_ns > begin_ns ? end_ns - begin_ns : 0), t->pid, lane,
          ARGS(args));
}

void ps_trace_instant(ps_trace_t *t, int lane, const char *name, uint64_t ns, const char *args)
{
    if (!room(t, 1)) return;
    event(t, "{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,\"pid\":%u,\"tid\":%d"
             ARGS_FMT "}",
          name, us(ns), t->pid, lane, ARGS(args));
}

/* @p path with "%p" replaced by this process's id, into @p out. */
static int expand(char *out, size_t cap, const char *path)
{
    size_t n = 0;
    for (const char *p = path; *p; p++) {
        int w = p[0] == '%' && p[1] == 'p'
                    ? snprintf(out + n, cap - n, "%ld", (long)getpid())
                    : snprintf(out + n, cap - n, "%c", *p);
        if (w < 0 || (size_t)w >= cap - n) return -1;
        n += (size_t)w;
        if (p[0] == '%' && p[1] == 'p') p++;
    }
    return 0;
}

int ps_trace_open(ps_trace_t **out, const char *path, uint32_t pid, const char *process,
                  const char *const *lanes, int nlanes, char *err, size_t errlen)
{
    ps_trace_t *t = calloc(1, sizeof *t);
    if (t == NULL) {
        snprintf(err, errlen, "trace %s: out of memory", path);
        return PS_ENOMEM;
    }
    if (expand(t->path, sizeof t->path, path) != 0) {
        snprintf(err, errlen, "trace %s: the path is too long", path);
        free(t);
        return PS_EIO;
    }
    if ((t->f = fopen(t->path, "we")) == NULL) { /* not inherited by a program run later */
        snprintf(err, errlen, "cannot write the trace %s: %s", t->path, strerror(errno));
        free(t);
        return PS_EIO;
    }
    t->pid = pid;
    setvbuf(t->f, NULL, _IOFBF, 1 << 20);
    event(t, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,"
             "\"args\":{\"name\":\"%s\"}}",
          pid, process);
    for (int l = 0; l < nlanes; l++)
        event(t, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":%d,"
                 "\"args\":{\"name\":\"%s\"}}",
              pid, l + 1, lanes[l]);
    if (fflush(t->f) != 0 || ferror(t->f)) {
        snprintf(err, errlen, "cannot write the trace %s: %s", t->path, strerror(errno));
        fclose(t->f);
        free(t);
        return PS_EIO;
    }
    *out = t;
    return 0;
}

void ps_trace_close(ps_trace_t *t)
{
    if (t == NULL) return;
    fputs("\n]\n", t->f);
    bool lost = ferror(t->f) != 0; /* a write that failed during the run */
    if (fclose(t->f) != 0 || lost)
        PS_LOG(PS_LOG_WARN, "trace", "%s: some events were not written: %s", t->path,
               lost ? "a write failed during the run" : strerror(errno));
    free(t);
}
