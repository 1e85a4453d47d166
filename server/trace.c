/* trace.c: psd --trace FILE, a Chrome trace of the shard's data path (trace.h). */
#include "trace.h"

#include <inttypes.h>
#include <stdio.h>

/* The lanes (Chrome's "tid") of one shard's process ("pid" = the shard). */
enum { LANE_PUSH = 1, LANE_APPLY = 2, LANE_PULL = 3 };

static const char *yes(bool b) { return b ? "true" : "false"; }

int psd_trace_open(ps_trace_t **out, const char *path, uint32_t shard, char *err,
                   size_t errlen)
{
    static const char *const lanes[] = {"pushes landed", "apply jobs", "pulls"};
    char process[32];
    snprintf(process, sizeof process, "psd shard %u", shard);
    return ps_trace_open(out, path, shard, process, lanes, 3, err, errlen);
}

void psd_trace_push(ps_trace_t *t, uint32_t tensor, uint32_t chunk, uint32_t rank,
                    uint64_t step, uint64_t arrived_ns, uint64_t landed_ns, bool direct)
{
    char name[32], args[96];
    snprintf(name, sizeof name, "push %u/%u", tensor, chunk);
    snprintf(args, sizeof args, "{\"rank\":%u,\"step\":%" PRIu64 ",\"direct\":%s}", rank, step,
             yes(direct));
    if (arrived_ns && arrived_ns < landed_ns)
        ps_trace_span(t, LANE_PUSH, "push", name, arrived_ns, landed_ns, args);
    else
        ps_trace_instant(t, LANE_PUSH, name, landed_ns, args);
}

void psd_trace_apply(ps_trace_t *t, uint64_t begin_ns, uint64_t end_ns, uint32_t nitems,
                     uint32_t tensor, uint32_t chunk, uint64_t bytes, bool pooled, bool ok)
{
    char args[128];
    snprintf(args, sizeof args,
             "{\"chunks\":%u,\"first\":\"%u/%u\",\"bytes\":%" PRIu64 ",\"on\":\"%s\",\"ok\":%s}",
             nitems, tensor, chunk, bytes, pooled ? "pool" : "loop", yes(ok));
    ps_trace_complete(t, LANE_APPLY, "apply", begin_ns, end_ns, args);
}

void psd_trace_pull(ps_trace_t *t, uint32_t tensor, uint32_t chunk, uint64_t version,
                    uint64_t asked_ns, uint64_t answered_ns, uint64_t done_ns, bool direct,
                    bool ok)
{
    if (asked_ns == 0 || asked_ns > answered_ns) asked_ns = answered_ns;
    char name[32], args[128];
    snprintf(name, sizeof name, "pull %u/%u", tensor, chunk);
    snprintf(args, sizeof args,
             "{\"version\":%" PRIu64 ",\"waited_us\":%.3f,\"direct\":%s,\"ok\":%s}", version,
             (double)(answered_ns - asked_ns) / 1000.0, yes(direct), yes(ok));
    ps_trace_span(t, LANE_PULL, "pull", name, asked_ns,
                  done_ns > answered_ns ? done_ns : answered_ns, args);
}
