/* psctl_client.h: psctl's synchronous request/reply channel to the shards of a manifest, for
 * the verbs that move data (export, verify). One request at a time; endpoints are made on
 * first use. A test-and-tool helper: every wait is bounded by the timeout given at open. */
#ifndef PSCTL_CLIENT_H
#define PSCTL_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "manifest.h"
#include "wire.h"

typedef struct psctl_client_s psctl_client_t;

/**
 * @brief Start UCX for talking to the shards of @p m (borrowed: it must outlive the client).
 * @param timeout_s  the longest one call may wait for its reply.
 * @return 0, or PS_ETRANSPORT / PS_ENOMEM with @p err set. Release with psctl_client_close().
 */
int psctl_client_open(const ps_manifest_t *m, double timeout_s, psctl_client_t **out, char *err,
                      size_t errlen);

/**
 * @brief Send @p req (req_id set here) to shard @p shard and wait for its reply.
 * @param[out] reply  the reply's header (an MSG_ERROR reply is returned as its status).
 * @param[out] data   when not NULL: the reply's data, malloc'd (the caller frees it; NULL when
 *                    there is none), its size in @p len.
 * @return 0; the shard's negative status for MSG_ERROR (text in @p err); PS_ETIMEDOUT or
 *  PS_ETRANSPORT when no reply came (@p err names the shard).
 */
int psctl_client_call(psctl_client_t *c, uint32_t shard, ps_msg_t *req, ps_msg_t *reply,
                      void **data, size_t *len, char *err, size_t errlen);

/** @brief Close the endpoints and stop UCX. NULL is a no-op. */
void psctl_client_close(psctl_client_t *c);

/**
 * @brief Every tensor's name by id, from shard 0 (psctl_export.c).
 * @param[out] names  malloc'd array of the returned count (the caller frees it); an id whose
 *  creation failed has an empty name.
 * @return the number of ids, or -1 (message printed).
 */
int psctl_tensor_names(psctl_client_t *cl, char (**names)[PS_NAME_MAX]);

/* The verbs (psctl_export.c, psctl_checkpoint.c); each returns psctl's exit status and prints
 * its own errors. */
int psctl_export(const ps_manifest_t *m, const char *out, double timeout_s, double wait_s);
int psctl_verify(const ps_manifest_t *m, double timeout_s);
/** @brief psctl checkpoint [--dir D]: @p dir NULL for the default (see psctl_checkpoint.c). */
int psctl_checkpoint(const ps_manifest_t *m, const char *dir, double timeout_s, double wait_s);
/** @brief psctl checkpoint --follow: periodic checkpoints from the manifest's checkpoint section
 *  until the job is finished or SIGTERM / SIGINT (psctl_follow.c). */
int psctl_checkpoint_follow(const ps_manifest_t *m, double timeout_s, double wait_s);
/**
 * @brief The second half of a checkpoint, once shard 0 picked @p step (MSG_CKPT_BEGIN): arm
 *  every shard for @p step into @p dir, release the hold (MSG_CKPT_GO with @p next: a step to
 *  hold ahead, or 0), wait up to @p wait_s from @p t0 for every shard, print the result.
 * @return psctl's exit status (errors printed).
 */
int psctl_checkpoint_run(psctl_client_t *cl, const ps_manifest_t *m, uint64_t step,
                         const char *dir, uint64_t next, double wait_s, double t0);
/** @brief The absolute directory of a checkpoint at @p step (UINT64_MAX: time-<now>) under
 *  @p base (NULL or "": <shard 0's data_dir>/../checkpoints). @return 0, PS_EINVAL if too long. */
int psctl_checkpoint_dir(const ps_manifest_t *m, const char *base, uint64_t step, char *out,
                         size_t cap);
/** @brief @p dir made absolute against the working directory, into @p out. */
void psctl_absolute(char *out, size_t cap, const char *dir);
/** @brief CLOCK_MONOTONIC in seconds. */
double psctl_mono_s(void);
/** @brief psctl verify --against D: recheck a checkpoint's files here (no shard is asked). */
int psctl_verify_against(const ps_manifest_t *m, const char *dir);
/** @brief psctl repair --from D [--rollback]. */
int psctl_repair(const ps_manifest_t *m, const char *dir, int rollback, double timeout_s);
/** @brief psctl restore D: print the commands that start this manifest's shards from D. */
int psctl_restore(const ps_manifest_t *m, const char *dir);

#endif
