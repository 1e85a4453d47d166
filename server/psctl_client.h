/* psctl_client.h: psctl's verbs that talk to the shards through proto/reqclient.h (export,
 * verify, checkpoint, repair, restore) and their shared helpers. */
#ifndef PSCTL_CLIENT_H
#define PSCTL_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "manifest.h"
#include "reqclient.h"
#include "wire.h"

/**
 * @brief Every tensor's name by id, from shard 0 (psctl_export.c).
 * @param[out] names  malloc'd array of the returned count (the caller frees it); an id whose
 *  creation failed has an empty name.
 * @return the number of ids, or -1 (message printed).
 */
int psctl_tensor_names(ps_req_t *cl, char (**names)[PS_NAME_MAX]);

/** @brief @p s (the caller's, NUL-terminated) with its control bytes made '?' in place, as
 *  psd's log shows them: a tensor name is the peers' choice, and a newline or an escape in it
 *  would forge a line or drive the terminal (verify and repair printed them raw; a review,
 *  session 71). @return @p s. */
char *psctl_printable(char *s);

/** @brief @p names[@p t] from psctl_tensor_names' table of @p nt, or "?" for an id out of it
 *  (a shard's reply names any id) or one without a name. The pointer is into @p names. */
const char *psctl_tensor_name(char (*names)[PS_NAME_MAX], int nt, unsigned t);

/** @brief What psctl_verify_shard hands on for each chunk a shard found wrong: @p tensor and
 *  @p chunk, and @p rest, the reply line's words after them ("version V stored H bytes H" or
 *  "malformed ..."; NUL-terminated, valid during the call only). */
typedef void psctl_mismatch_fn(void *ctx, int shard, unsigned tensor, unsigned chunk,
                               const char *rest);

/**
 * @brief Asks shard @p shard to recheck every stored chunk (MSG_VERIFY, one snapshot, training
 *  goes on) and calls @p each for each mismatch line of its reply, in order (@p each may call
 *  the shards through @p cl: the reply is psctl's own copy until this returns).
 * @param[in,out] checked  the chunks the shard checked are added to it.
 * @return 0, or -1 with @p err set (no answer, or an answer that is not a verify reply).
 */
int psctl_verify_shard(ps_req_t *cl, int shard, psctl_mismatch_fn *each, void *ctx,
                       uint64_t *checked, char *err, size_t errlen);

/* The verbs (psctl_export.c, psctl_checkpoint.c); each returns psctl's exit status and prints
 * its own errors. */
/** @brief psctl export: @p wait_s how long bsp waits for one step everywhere; @p any_step
 *  (--any-step): none, each chunk as it is. */
int psctl_export(const ps_manifest_t *m, const char *out, double timeout_s, double wait_s,
                 bool any_step);
int psctl_verify(const ps_manifest_t *m, double timeout_s);
/** @brief psctl checkpoint [--dir D]: @p dir NULL for the default (see psctl_checkpoint.c). */
int psctl_checkpoint(const ps_manifest_t *m, const char *dir, double timeout_s, double wait_s);
/** @brief psctl checkpoint --follow: periodic checkpoints from the manifest's checkpoint section
 *  until the job is finished or SIGTERM / SIGINT (psctl_follow.c). */
int psctl_checkpoint_follow(const ps_manifest_t *m, double timeout_s, double wait_s);
/** @brief A new checkpoint's id (random, never 0): its MSG_CKPT_BEGIN asks and its MSG_CKPT_GO
 *  carry it, so that an ask sent again after a lost answer is the same checkpoint to shard 0. */
uint64_t psctl_checkpoint_id(void);
/** @brief When checkpoint directory @p d (@p cap bytes; a step's step-S) holds a shard's part
 *  already, seen from this host (a checkpoint taken at that step before, as the one a job was
 *  restored from, or what a shard killed while it copied left beside psctl's cancel mark),
 *  replaces it with a time-MS directory beside it and says so. Only shard 0's refusal of its
 *  arm (EEXIST) did that before; another shard's failed the checkpoint (a helper's probe,
 *  session 58: every checkpoint at that step after a restore). @return whether it did. */
bool psctl_checkpoint_dir_free(const ps_manifest_t *m, char *d, size_t cap);
/**
 * @brief The second half of checkpoint @p id, once shard 0 picked @p step (MSG_CKPT_BEGIN): arm
 *  every shard for @p step into @p dir, release the hold (MSG_CKPT_GO with @p next: a step to
 *  hold ahead, or 0), wait up to @p wait_s from @p t0 for every shard, print the result. asp /
 *  ssp (@p step UINT64_MAX): when shard 0 does not confirm that its hold lasted for @p id until
 *  the GO, the copies are no cut, and a failure. A failure (that, an arm refused, a shard
 *  failed, @p wait_s run out) cancels the checkpoint on every shard not done with it
 *  (MSG_CKPT_CANCEL) and removes the parts; a shard that does not answer is named, and @p dir
 *  keeps the mark cancelled-ID for it (ckpt_meta.h). @p how: PSCTL_CK_MOVABLE (bsp, a
 *  checkpoint asked for now: it may be moved to the step before @p step when every member of
 *  that step left before any shard applied it), with PSCTL_CK_OWN_DIR when @p dir was given
 *  (kept at a move; otherwise the default directory of the new step) and PSCTL_CK_OPEN_EMPTY
 *  when shard 0 picked the open step because its members all left (PS_FLAG_MOVE in its
 *  answer: if a shard is past it, the checkpoint is at the step after), or 0 (--follow);
 *  PSCTL_CK_BUSY_RETRY: PSCTL_CK_BUSY, not a failure, when a shard refuses its arm as busy
 *  with another checkpoint.
 *  @p dir is copied.
 * @return psctl's exit status (errors printed).
 */
int psctl_checkpoint_run(ps_req_t *cl, const ps_manifest_t *m, uint64_t step, uint64_t id,
                         const char *dir, uint64_t next, double wait_s, double t0, unsigned how);
enum { PSCTL_CK_MOVABLE = 1, PSCTL_CK_OWN_DIR = 2, PSCTL_CK_OPEN_EMPTY = 4, PSCTL_CK_BUSY_RETRY = 8 };
/* psctl_checkpoint_run with PSCTL_CK_BUSY_RETRY: a shard was taking another checkpoint and
 * refused its arm (the hold released, the shards armed before it cancelled): ask again once
 * that one ends. */
#define PSCTL_CK_BUSY 75
/** @brief Remove checkpoint @p dir of @p nshards shards: in each shard-J (J < nshards; one
 *  missing is skipped) only the files a checkpoint writes (data.mdb, lock.mdb, meta.json,
 *  meta.json.tmp), then the directories; anything else in them makes rmdir fail, and it is
 *  left. @p dir or a shard-J that is a symbolic link (or no directory) is left (-ENOTDIR), and
 *  nothing behind it is touched. @return 0 or -errno. */
int psctl_checkpoint_remove(const char *dir, uint32_t nshards);
/** @brief The absolute directory of a checkpoint at @p step (UINT64_MAX: time-<now>) under
 *  @p base (NULL or "": <shard 0's data_dir>/../checkpoints). @return 0, PS_EINVAL if too long. */
int psctl_checkpoint_dir(const ps_manifest_t *m, const char *base, uint64_t step, char *out,
                         size_t cap);
/**
 * @brief Drop tensor @p name, which no push reached, from every shard (psctl_forget.c): shard 0
 *  checks first (PS_FLAG_FORCE: under bsp only once the job's open step is 2 or more, under asp
 *  / ssp only while the job has no member; never a tensor a push reached), then the other
 *  shards drop their chunks, then shard 0 the tensor. A shard that does not hold it is passed.
 * @param trained  also a tensor a push reached (PS_FLAG_TRAINED: psctl forget --trained), its
 *  trained values lost: shard 0 takes it only while the job has no member (any consistency)
 * @param[out] dropped  the shards besides 0 that dropped it before a refusal, or all that did
 * @return 0 when some shard dropped it and none refused; the first refusal's PS_E* code (its
 *  message in @p err: shard 0's declaration is kept), or PS_ENOENT when no shard holds it.
 */
int psctl_forget(ps_req_t *cl, const ps_manifest_t *m, const char *name, bool trained,
                 int *dropped, char *err, size_t errlen);
/** @brief @p dir made absolute against the working directory, into @p out (@p cap bytes).
 *  @return 0; PS_EINVAL when the working directory is unknown (gone, or a path longer than
 *  PATH_MAX) or the result does not fit (then @p out is not to be used). */
int psctl_absolute(char *out, size_t cap, const char *dir);
/** @brief Shard @p i's status (MSG_STATUS) as a NUL-terminated JSON text, which the caller
 *  frees; NULL with the reason in @p err when it did not answer or memory ran out, and then
 *  ps_req_call's code (PS_ENOMEM) in *@p rc (NULL: not wanted). */
char *psctl_status_json(ps_req_t *cl, uint32_t i, char *err, size_t errlen, int *rc);
/** @brief CLOCK_MONOTONIC in seconds. */
double psctl_mono_s(void);
/** @brief psctl verify --against D: recheck a checkpoint's files here (no shard is asked). */
int psctl_verify_against(const ps_manifest_t *m, const char *dir);
/** @brief psctl repair --from D [--rollback]. */
int psctl_repair(const ps_manifest_t *m, const char *dir, int rollback, double timeout_s);
/** @brief psctl restore D: print the commands that start this manifest's shards from D. */
int psctl_restore(const ps_manifest_t *m, const char *dir);

#endif
