/* cpustat.c: per-CPU busy fractions from /proc/stat (see cpustat.h). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cpustat.h"

void pb_cpustat_read(pb_cpustat_t *s)
{
    memset(s, 0, sizeof *s);
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL) return;
    char line[512];
    while (fgets(line, sizeof line, f) && s->ncpu < PB_MAX_CPUS) {
        /* "cpuN user nice system idle iowait irq softirq steal ..."; skip the "cpu " total. */
        int id;
        uint64_t v[8] = {0};
        if (strncmp(line, "cpu", 3) != 0) break; /* the cpu lines come first */
        if (line[3] == ' ') continue;
        if (sscanf(line + 3, "%d %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                             " %" SCNu64 " %" SCNu64 " %" SCNu64,
                   &id, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) < 5)
            break;
        uint64_t busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
        s->busy[s->ncpu] = busy;
        s->total[s->ncpu] = busy + v[3] + v[4];
        s->ncpu++;
    }
    fclose(f);
}

int pb_cpustat_busy(const pb_cpustat_t *a, const pb_cpustat_t *b, float *frac)
{
    if (a->ncpu == 0 || a->ncpu != b->ncpu) return 0;
    for (int i = 0; i < a->ncpu; i++) {
        uint64_t dt = b->total[i] - a->total[i], db = b->busy[i] - a->busy[i];
        if (b->total[i] <= a->total[i]) return 0;
        frac[i] = db > dt ? 1.0f : (float)db / (float)dt;
    }
    return a->ncpu;
}

int pb_cpustat_one_cpu(const float *frac, int ncpu)
{
    float lo = 1, hi = 0;
    for (int i = 0; i < ncpu; i++) {
        if (frac[i] < lo) lo = frac[i];
        if (frac[i] > hi) hi = frac[i];
    }
    return ncpu == 2 && lo <= 0.10f && hi >= 0.50f;
}
