/* sync.h: the store's fsync cadence (manifest sync_interval_s). The environment is opened
 * NOSYNC, so a committed step survives a crash of psd but not of the machine; every
 * sync_interval_s seconds the cron queues a pool job that calls mdb_env_sync(env, 1), which
 * makes everything committed before it durable against power loss. With 0 (the default) the
 * store is synced only when psd stops cleanly. Loop thread only, except the job. */
#ifndef PSD_SYNC_H
#define PSD_SYNC_H

#include "server.h"

/** @brief From the cron: start a sync job when one is due and none runs. */
void psd_sync_cron(psd_server_t *srv, uint64_t now_ms);

/** @brief True when no sync job runs (the shutdown check waits for it). */
bool psd_sync_idle(psd_server_t *srv);

/** @brief Append `, "sync_interval_s": N, "last_sync_ms_ago": M` (-1: not yet) to @p out. */
void psd_sync_status_json(psd_server_t *srv, char *out, size_t cap, size_t *len);

#endif
