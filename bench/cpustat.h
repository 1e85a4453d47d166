/* cpustat.h: how busy each CPU was over a measurement, from /proc/stat.
 *
 * psbench's figures depend on both vCPUs being there. Some hosts park a guest's vCPU when
 * they are short of CPUs themselves (the guest's scheduler then packs every thread onto the
 * other one); a case measured then runs on one CPU and reads 2-3x slower. Each cluster case
 * records the busy fraction of every CPU, so a reader sees which figures were measured on
 * one CPU. */
#ifndef PB_CPUSTAT_H
#define PB_CPUSTAT_H

#include <stdint.h>

#define PB_MAX_CPUS 8

typedef struct {
    int ncpu;                      /* CPUs read (the first PB_MAX_CPUS "cpuN" lines); 0: none */
    uint64_t busy[PB_MAX_CPUS];    /* user + nice + system + irq + softirq + steal, in ticks */
    uint64_t total[PB_MAX_CPUS];   /* busy + idle + iowait */
} pb_cpustat_t;

/** @brief Read /proc/stat into @p s. On any failure s->ncpu is 0 (no figures, no error). */
void pb_cpustat_read(pb_cpustat_t *s);

/**
 * @brief Busy fraction (0..1) of each CPU between snapshots @p a and @p b into @p frac
 *  (PB_MAX_CPUS entries). @return the number of CPUs, 0 if the snapshots do not match or
 *  no tick passed on some CPU (a window too short to say).
 */
int pb_cpustat_busy(const pb_cpustat_t *a, const pb_cpustat_t *b, float *frac);

/**
 * @brief Whether a window with these busy fractions looks like one parked vCPU: on a host of
 *  two CPUs (the development VM's shape, where a local cluster keeps both partly busy), one
 *  at most 10% busy while the other is at least 50% busy. Always 0 on other hosts, where
 *  idle CPUs are expected.
 */
int pb_cpustat_one_cpu(const float *frac, int ncpu);

#endif
