/* checkpoint.h: the shard's side of psctl checkpoint and psctl repair (MSG_CKPT_*, MSG_REPAIR).
 *
 * checkpoint: psctl asks shard 0 for a step (MSG_CKPT_BEGIN: the coordinator picks it and holds
 * the hand-out of later steps), tells every shard "checkpoint at step S into D" (MSG_CKPT_ARM),
 * releases the hold (MSG_CKPT_GO) and polls each shard (MSG_CKPT_STATUS) until it is done.
 * A shard takes a read snapshot the moment all its chunks are at version S, in the store-job
 * slot (so no apply of step S + 1 can come first), and a pool thread copies every record of
 * that snapshot into a new compact LMDB environment D/shard-K/ (keys in order, MDB_APPEND)
 * while training goes on; LMDB's MVCC keeps the snapshot as it was. Each chunk's hash is
 * checked while it is copied. Then D/shard-K/meta.json is written (see psd_ckpt_meta_write in
 * checkpoint.c for its fields) and the snapshot released. asp / ssp have no common step: S is
 * UINT64_MAX and each shard snapshots at once (its chunks' versions are in meta.json).
 * A checkpoint psctl gives up is cancelled (MSG_CKPT_CANCEL with its id): armed, it is dropped;
 * copying, the copy stops and removes what it wrote. A shard psctl could not tell finds
 * D/cancelled-ID (ckpt_meta.h) before its snapshot, during its copy, or at the next arm.
 *
 * repair: MSG_REPAIR names a chunk, the version the shard holds, and a checkpoint shard
 * directory; a slot job copies that record from there if it is at the same version and its
 * bytes match its hash. Loop thread only, except the work functions. */
#ifndef PSD_CHECKPOINT_H
#define PSD_CHECKPOINT_H

#include "ckpt_meta.h"
#include "server.h"


/** @brief Handle one MSG_CKPT_* or MSG_REPAIR request from @p conn (psctl; no hello). */
void psd_ckpt_on_msg(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg);

/** @brief A store job just finished (loop thread, before the next one starts): take an armed
 *  checkpoint's snapshot if every chunk has reached its step. */
void psd_ckpt_after_job(psd_server_t *srv);

/** @brief Tensor @p name was dropped here by psctl forget --trained (loop thread): a checkpoint
 *  armed, snapshotting or copying here fails (its parts would not be one state: the tensor in
 *  one shard's, not in another's), so psctl gives it up and removes its parts. */
void psd_ckpt_tensor_dropped(psd_server_t *srv, const char *name);

/** @brief True when no checkpoint copy or repair runs (the shutdown check waits for them). */
bool psd_ckpt_idle(psd_server_t *srv);

/** @brief The directory (D/shard-K) a running checkpoint copy (which holds a snapshot of the
 *  store) writes into, or NULL when none runs (loop thread; the string lives until the copy
 *  ends). */
const char *psd_ckpt_copy_dir(const psd_server_t *srv);

/** @brief Free the state (at exit, once idle). */
void psd_ckpt_free(psd_server_t *srv);

/**
 * @brief With a `checkpoint:` section in @p m, check at start that this host can make the
 *  periodic checkpoints' directory (checkpoint.dir, default servers[0].data_dir/../checkpoints;
 *  every shard writes its part there): ps_dir_makeable. A file in its way would fail every
 *  periodic checkpoint, each only logged.
 * @return 0, or PS_ECONFIG with @p err naming the path and why.
 */
int psd_ckpt_dir_check(const ps_manifest_t *m, char *err, size_t errlen);

/* Metadata key of a restore under way: the checkpoint's path, committed before the fill and
 * deleted by the fill's own transaction. A store that still has it was left by a psd killed
 * during its restore, and psd refuses to serve it. */
#define PSD_RESTORING "restoring"

/**
 * @brief Fill this shard's empty, freshly opened store from checkpoint @p dir (server/restore.c):
 *  the tensor table, every chunk this shard owns under the current manifest (from whichever
 *  checkpoint shard held it) and, on shard 0, the coordinator's blob. One transaction (after
 *  the one that marks the store PSD_RESTORING).
 * @param[out] err  names what is wrong (identity mismatch, missing chunk, bad hash, ...).
 * @return 0, PS_ECONFIG (the checkpoint does not fit this manifest), PS_ESTORE, PS_E*.
 */
int psd_restore_fill(psd_server_t *srv, const char *dir, char *err, size_t errlen);

/**
 * @brief Check, before the store is opened, that @p data_dir is empty or absent and that
 *  checkpoint @p dir fits this manifest (cluster, chunk_bytes, optimizer state).
 * @return 0 or PS_ECONFIG / PS_EEXIST with @p err naming what differs.
 */
int psd_restore_check(const ps_manifest_t *m, const char *data_dir, const char *dir, char *err,
                      size_t errlen);

/** @brief Remove what psd_store_open created in @p data_dir, and the restore's mark (after a
 *  failed restore); what psd_restore_undo_on_fault() named is no longer removed at a fault. */
void psd_restore_undo(const char *data_dir);
/** @brief While @p data_dir is non-NULL, a fault reading a checkpoint (a copy cut short) that
 *  ends psd first removes what psd_restore_undo() would; NULL: no more. */
void psd_restore_undo_on_fault(const char *data_dir);
/** @brief psd_restore_undo_on_fault() for the restore's mark alone: from the mark until the
 *  store is open (what is in the data_dir then may be another psd's that won it). */
void psd_restore_mark_on_fault(const char *data_dir);

/* The file a restore puts in the data_dir before the store exists and removes once its fill
 * committed: a psd killed anywhere in between leaves it, and a start without --restore refuses
 * the store (the "Mrestoring" metadata key covers the same span from inside the store). */
#define PSD_RESTORE_MARK "restoring"

/** @brief Create @p data_dir if needed and put the restore's mark there (durably), naming
 *  checkpoint @p from. @return 0, or -errno with @p err said. */
int psd_restore_mark(const char *data_dir, const char *from, char *err, size_t errlen);

/** @brief 1 when @p data_dir holds a restore's mark (*@p from: the checkpoint it names, cut to
 *  @p cap), else 0. */
int psd_restore_marked(const char *data_dir, char *from, size_t cap);

/** @brief Remove the restore's mark from @p data_dir (durably), once the fill committed. */
void psd_restore_unmark(const char *data_dir);

#endif
