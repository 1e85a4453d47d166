/* run.h: a shard store's run, the line of history its steps belong to.
 *
 * A store made empty starts a run at step 0; `psd --restore D` starts a new one at D's step,
 * whose parent is the run D was taken in. Checkpoints carry their shard's run (meta.json
 * "run"), so that `psctl checkpoint --follow` can tell a checkpoint of this run's history from
 * one of a run abandoned by a rollback: same step numbers, another history (psctl_follow.c). */
#ifndef PSD_RUN_H
#define PSD_RUN_H

#include <stdint.h>

#include "store.h"

#define PSD_RUN_BLOB "run" /* metadata key "Mrun": psd_run_t, host byte order */
#define PSD_JOINED_BLOB "joined" /* "Mjoined": the runs digest this shard keeps (ps_runs_digest,
                                    proto/wire.h), a uint64_t; absent: 0 */
/* "Mrapplied" (bsp; shard 0's store, written by psd --restore): the checkpoint's last step
 * (its step - 1) and the ranks whose pushes of it every chunk of the checkpoint applied (by
 * their applied records, every shard's part read). psd_coord_create hands a member's batch of
 * that step out again only when its rank is not among them. Absent: not known (a chunk
 * without a record, an asp job, a checkpoint at step 0). */
#define PSD_RESTORE_APPLIED_BLOB "rapplied"
typedef struct {
    uint64_t step;
    uint64_t members;
} psd_restore_applied_t;

typedef struct {
    uint64_t id;        /* random, never 0 */
    uint64_t parent;    /* the run a restore's checkpoint was taken in (0: none or unknown) */
    uint64_t base_step; /* the step this run started from: 0, the checkpoint's, or (a store
                           older than runs) the highest chunk version it had when it got one,
                           so that every checkpoint it took before counts as its history */
    uint64_t origin;    /* the id of the checkpoint a restore started this run from (every
                           shard's copy of one checkpoint has the same), 0: none (a new store)
                           or a store older than session 41 (24-byte record) */
} psd_run_t;

#define PSD_RUN_V1_BYTES 24 /* the record before `origin` */

/** @brief A new random run id (never 0). */
uint64_t psd_run_new_id(void);

/**
 * @brief The run of @p st: the stored one, or (none stored: a new store, or one made before
 * runs) a new one based at @p step_now (the highest chunk version there), committed in its
 * own transaction. A record without `origin` loads with origin 0. Loop thread, before any
 * store job.
 * @return 0, or PS_E* with @p err said.
 */
int psd_run_load(psd_store_t *st, uint64_t step_now, psd_run_t *out, char *err, size_t errlen);

/** @brief The origin of a run restored from checkpoint @p ckpt_id (meta.json's "checkpoint";
 *  0: a checkpoint without one) at step @p step: the id, or else (@p step + 1) with bit 63 set,
 *  so that every shard restored from one checkpoint has the same (restore.c, and the run record
 *  a checkpoint's part carries, checkpoint.c). */
static inline uint64_t psd_run_origin(uint64_t ckpt_id, uint64_t step)
{
    return ckpt_id ? ckpt_id : (step + 1) | 1ull << 63;
}

/** @brief Store @p r in @p tx (restore.c: the restored store's new run). 0 or PS_E*. */
int psd_run_put(psd_wtxn_t *tx, const psd_run_t *r);

#endif
