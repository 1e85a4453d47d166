/* export.h: the shard's side of psctl export and psctl verify (MSG_EXPORT_*, MSG_VERIFY).
 *
 * export: a connection opens a read snapshot (MSG_EXPORT_BEGIN), reads the tensor table
 * (MSG_EXPORT_TENSOR) and its chunks' parameters from that one snapshot (MSG_EXPORT_CHUNK:
 * sent straight from the snapshot, which stays pinned while a reply is in flight), and
 * releases it (MSG_EXPORT_END, the end of the connection, or psd_export_cron when it went unused
 * for a minute). Training goes on meanwhile.
 *
 * verify: a pool job opens its own read snapshot, recomputes the XXH3-64 of every chunk
 * record this shard holds and compares it to the hash stored in the record's header; the
 * reply lists every mismatch. Loop thread only, except the job's work function. */
#ifndef PSD_EXPORT_H
#define PSD_EXPORT_H

#include "server.h"

/** @brief Handle one MSG_EXPORT_* or MSG_VERIFY request from @p conn (psctl; no hello). */
void psd_export_on_msg(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg);

/** @brief @p conn is gone: release its export snapshot (once no reply uses it). */
void psd_export_drop_conn(psd_server_t *srv, psd_conn_t *conn);

/** @brief End the export snapshots unused for PS_EXPORT_IDLE_MS (default 60 s) as of @p now_ms
 *  (uv_now): a held snapshot keeps the store from reusing pages. The cron calls it. */
void psd_export_cron(psd_server_t *srv, uint64_t now_ms);

/** @brief True when no verify job runs (the shutdown check waits for it). */
bool psd_export_idle(psd_server_t *srv);

/** @brief True when an export session (its snapshot) or a verify job reads the store. */
bool psd_export_reading(const psd_server_t *srv);

/** @brief Release every export session and snapshot (at exit, after the loop stopped). */
void psd_export_free(psd_server_t *srv);

#endif
