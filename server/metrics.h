/* metrics.h: psd's HTTP endpoint for monitoring (servers[].metrics_port; off when 0):
 *   GET /metrics  Prometheus text: counters (pushes, pulls, updates, CRC errors...), the store's
 *                 size, connections, and on shard 0 the job (epoch, workers, samples applied);
 *   GET /healthz  200 "ok" while the shard serves workers, else 503 and why;
 *   GET /status   this shard's JSON, as `psctl status --json` shows it. */
#ifndef PSD_METRICS_H
#define PSD_METRICS_H

#include <stddef.h>

typedef struct psd_server_s psd_server_t;

/**
 * @brief Listen on the shard's metrics_host:metrics_port (nothing when the port is 0).
 * @return 0, or PS_ECONFIG with @p err naming the address and the reason.
 */
int psd_metrics_start(psd_server_t *srv, char *err, size_t errlen);

/** @brief Stop listening and close its connections (freed at the next loop run). */
void psd_metrics_close(psd_server_t *srv);

#endif
