/* trace.c: psd --trace FILE, a Chrome trace of the shard's data path (trace.h). */
#include "trace.h"

#include <inttypes.h>
#include <stdio.h>

/* The lanes (Chrome's "tid") of one shard's process ("pid" = the shard). */
enum { LANE_PUSH = 1, LANE_APPLY = 2, LANE_PULL = 3 };

uint64_t psd_trace_now(void) { return ps_trace_now(); }

int psd_trace_open(psd_trace_t **out, const char *path, uint32_t shard, char *err,
                   size_t errlen)
{
    static const char *const lanes[] = {"pushes landed", "apply jobs", "pulls"};
    char process[32];
    snprintf(process, sizeof process, "psd shard %u", shard);
    return ps_trace_open(out, path, shard, process, lanes, 3, err, errlen);
}

void psd_trace_close(psd_trace_t *t) { ps_trace_close(t); }

void psd_trace_push(psd_trace_t *t, uint32_t tensor, uint32_t chunk, uint32_t rank,
                    uint64_t step, uint64_t arrived_ns, uint64_t landed_ns, bool direct)
{
    if (!ps_trace_room(t, 2)) return;
    uint32_t pid = ps_trace_pid(t);
    if (arrived_ns && arrived_ns < landed_ns) {
        uint64_t id = ps_trace_next_id(t);
        ps_trace_event(t, "{\"name\":\"push %u/%u\",\"cat\":\"push\",\"ph\":\"b\"," PS_TRACE_ID
                          ",\"ts\":%.3f,\"pid\":%u,\"tid\":%d,\"args\":{\"rank\":%u,\"step\":%"
                          PRIu64 ",\"direct\":%s}}",
                       tensor, chunk, id, ps_trace_us(arrived_ns), pid, LANE_PUSH, rank, step,
                       direct ? "true" : "false");
        ps_trace_event(t, "{\"name\":\"push %u/%u\",\"cat\":\"push\",\"ph\":\"e\"," PS_TRACE_ID
                          ",\"ts\":%.3f,\"pid\":%u,\"tid\":%d}",
                       tensor, chunk, id, ps_trace_us(landed_ns), pid, LANE_PUSH);
        return;
    }
    ps_trace_event(t, "{\"name\":\"push %u/%u\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,\"pid\":%u,"
                      "\"tid\":%d,\"args\":{\"rank\":%u,\"step\":%" PRIu64 ",\"direct\":%s}}",
                   tensor, chunk, ps_trace_us(landed_ns), pid, LANE_PUSH, rank, step,
                   direct ? "true" : "false");
}

void psd_trace_apply(psd_trace_t *t, uint64_t begin_ns, uint64_t end_ns, uint32_t nitems,
                     uint32_t tensor, uint32_t chunk, uint64_t bytes, bool pooled, bool ok)
{
    if (!ps_trace_room(t, 1)) return;
    ps_trace_event(t, "{\"name\":\"apply\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%u,"
                      "\"tid\":%d,\"args\":{\"chunks\":%u,\"first\":\"%u/%u\",\"bytes\":%" PRIu64
                      ",\"on\":\"%s\",\"ok\":%s}}",
                   ps_trace_us(begin_ns), ps_trace_us(end_ns > begin_ns ? end_ns - begin_ns : 0),
                   ps_trace_pid(t), LANE_APPLY, nitems, tensor, chunk, bytes,
                   pooled ? "pool" : "loop", ok ? "true" : "false");
}

void psd_trace_pull(psd_trace_t *t, uint32_t tensor, uint32_t chunk, uint64_t version,
                    uint64_t asked_ns, uint64_t answered_ns, uint64_t done_ns, bool direct,
                    bool ok)
{
    if (!ps_trace_room(t, 2)) return;
    if (done_ns < answered_ns) done_ns = answered_ns;
    if (asked_ns == 0 || asked_ns > answered_ns) asked_ns = answered_ns;
    uint64_t id = ps_trace_next_id(t);
    uint32_t pid = ps_trace_pid(t);
    ps_trace_event(t, "{\"name\":\"pull %u/%u\",\"cat\":\"pull\",\"ph\":\"b\"," PS_TRACE_ID
                      ",\"ts\":%.3f,\"pid\":%u,\"tid\":%d,\"args\":{\"version\":%" PRIu64
                      ",\"waited_us\":%.3f,\"direct\":%s,\"ok\":%s}}",
                   tensor, chunk, id, ps_trace_us(asked_ns), pid, LANE_PULL, version,
                   ps_trace_us(answered_ns - asked_ns), direct ? "true" : "false",
                   ok ? "true" : "false");
    ps_trace_event(t, "{\"name\":\"pull %u/%u\",\"cat\":\"pull\",\"ph\":\"e\"," PS_TRACE_ID
                      ",\"ts\":%.3f,\"pid\":%u,\"tid\":%d}",
                   tensor, chunk, id, ps_trace_us(done_ns), pid, LANE_PULL);
}
