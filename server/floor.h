/* floor.h: the next shard's floor, a ring of checks against a store gone back to an older copy
 * of itself (session 68).
 *
 * A worker that ran through a shard's restart tells a store gone back by its own record of
 * what that shard told it (libps's seen_max, worker/shardloss.c). One that joins after every
 * such worker stopped has no record: under asp / ssp the updates since the copy were lost
 * unnoticed, and under bsp a shard other than 0 failed only at the first push. So each member's
 * heartbeat and leave to shard i carry its seen_max of the next shard (i + 1; the last shard's:
 * shard 0) with that shard's run, and shard i keeps the highest (its "floor" of the next shard,
 * in its store: "Mfloor", written at a cron tick and at the stop). A joiner reads every shard's
 * floor in its hello reply and refuses a next shard of that run whose highest chunk version is
 * below it (join_floor_check, worker/client_api.c). A shard of another run (restored, replaced)
 * is not compared: the run checks tell those; nor is one that does not say PS_FLAG_FLOOR (an
 * older psd: its drops lower its step_max). psd --forget-floor drops the floor (the loss taken).
 *
 * A tensor dropped with its trained values (psctl forget --trained) may have held the shard's
 * highest version, and a later model's chunks start at version 0: floors are keyed by the
 * shard's floor key, its run mixed with the number of such drops it made ("Mdropgen",
 * psd_floor_key), which its hello says; a drop makes the floors kept of it until then match
 * nothing. (A first cut kept the highest version a drop took away and counted it in step_max:
 * the workers' own record of the shard then sat at it, and a copy put back while a new model's
 * chunks were below it passed every check: a probe, session 68.)
 */
#ifndef PSD_FLOOR_H
#define PSD_FLOOR_H

#include <stdbool.h>
#include <stdint.h>

#include "wire.h"

typedef struct psd_server_s psd_server_t;
typedef struct psd_conn_s psd_conn_t;

#define PSD_FLOOR_BLOB "floor"     /* "Mfloor": psd_floor_rec_t, host byte order */
#define PSD_DROPGEN_BLOB "dropgen" /* "Mdropgen": a uint64_t, the trained drops made here */

typedef struct {
    uint64_t run;   /* the next shard's floor key the floor is of (0: none) */
    uint64_t floor; /* the highest chunk version of it a member said it was told of */
} psd_floor_rec_t;

/** @brief Read the floor and the dropped maximum from the store (none: zeros). Loop thread,
 *  once the store is loaded, before any store job. */
void psd_floor_load(psd_server_t *srv);

/** @brief A heartbeat or a leave @p msg on @p c: a member's (rank set) floor of the next shard
 *  raises this shard's (or replaces it, of another run). Kept in memory; psd_floor_cron
 *  writes it, and psd_floor_flush at the stop. */
void psd_floor_told(psd_server_t *srv, const psd_conn_t *c, const ps_msg_t *msg);

/** @brief At the stop, once no store job or slot work runs and no connection is left: write a
 *  floor raised since the last write, on the loop thread. */
void psd_floor_flush(psd_server_t *srv);

/** @brief psd --forget-floor: drop the floor this shard keeps of the next shard, in memory and
 *  in the store (logged). Loop thread, after psd_floor_load, before any store job.
 *  @return 0, or PS_E* (the store's error). */
int psd_floor_forget(psd_server_t *srv);

/** @brief Each cron tick: a floor raised since it was last written is written, between store
 *  jobs (slot work), one write at a time. */
void psd_floor_cron(psd_server_t *srv);

/** @brief This shard's floor key: its run, mixed with the number of trained tensors' drops it
 *  made (none: the run itself). Never 0. */
uint64_t psd_floor_key(const psd_server_t *srv);

/** @brief Fill a hello reply's floor and floor_run (0: no member told of one) and floor_key
 *  (every reply says PS_FLAG_FLOOR, PSD_HELLO_FLAGS). */
void psd_floor_hello(const psd_server_t *srv, ps_msg_t *reply);

#endif
