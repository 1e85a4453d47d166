/* ps_client.h: libps, the worker-side client of a psd cluster.
 *
 * A client connects to every shard of a manifest, declares tensors and pushes
 * gradients / pulls parameters asynchronously. Its own thread (the comm thread)
 * runs the UCP worker; calls from the training thread enqueue requests and wait
 * on completion handles. A wait for a small request drives the worker itself for
 * the busy-poll window (spin_us) while the comm thread stands aside, so the
 * reply needs no hand-over between threads; large tensors' requests are left to
 * the comm thread, which copies and sends them while the caller computes.
 *
 * Thread safety: every function may be called from any one thread at a time
 * per client (the training thread); handles may be waited on from that thread.
 *
 * Arguments: ps_client_declare, ps_client_push, ps_client_pull, ps_client_next_batch,
 * ps_client_lanes and ps_op_wait refuse a NULL client, handle, or pointer they need (a
 * description, a buffer, an out parameter) with PS_EINVAL (ps_client_error() names it when the
 * client is not NULL); nothing is sent then. ps_client_destroy(NULL) and
 * ps_client_interrupt(NULL) do nothing, and ps_client_error(NULL) says "no client". Other
 * functions take their pointers as given. */
#ifndef PS_CLIENT_H
#define PS_CLIENT_H

#include <stddef.h>
#include <signal.h>
#include <stdint.h>

#include "ps/ps_error.h"

typedef struct ps_client_s ps_client_t;
typedef struct ps_op_s ps_op_t;

#define PS_CLIENT_OPT_CONNECT_TIMEOUT (1u << 0)
#define PS_CLIENT_OPT_CANCEL (1u << 1)

typedef struct {
    uint64_t field_mask;           /* PS_CLIENT_OPT_* of the fields set below */
    uint32_t connect_timeout_ms;   /* how long to retry unreachable shards (default: the
                                      manifest's job.reconnect_timeout_ms, 30000) */
    /* A flag the join reads between its tries (every 10 ms at most while it waits to try
     * again): nonzero (set by the caller's signal handler, say) gives up the join with
     * PS_ECANCELED. The caller owns it; it must outlive ps_client_create. */
    const volatile sig_atomic_t *cancel;
} ps_client_opts_t;

typedef struct {
    const char *name;        /* unique in the cluster, < 128 bytes */
    uint32_t shape[4];
    int ndim;                /* 1..4 */
    int init;                /* 0 zeros, 1 normal(init_arg = std), 2 uniform(init_arg = a), 3 xavier,
                                4 constant(init_arg = the value); | PS_TENSOR_MEAN */
    float init_arg;
    uint64_t seed;
    uint64_t total_steps;    /* the job's planned steps, for the learning-rate schedule */
} ps_tensor_desc_t;

/* ps_tensor_desc_t.init | PS_TENSOR_MEAN: after each step the tensor holds the mean of the
 * members' pushes of it, no optimizer (the running statistics of a BatchNorm, averaged over
 * the workers: psd.torch). A psd older than session 36 refuses the declaration. */
#define PS_TENSOR_MEAN 0x100

typedef struct {
    uint64_t bytes_pushed, bytes_pulled;   /* payload bytes sent / received */
    uint64_t bytes_pushed_raw;             /* what the pushes would have been as fp32 */
    uint64_t pushes, pulls;                /* chunk messages */
    uint64_t bytes_pulled_direct;          /* of bytes_pulled: read from a shard's store on this
                                              host (direct pulls, PS_DIRECT_PULL) */
    uint64_t bytes_pushed_direct;          /* of bytes_pushed: written into a shard's shared
                                              memory on this host (direct pushes, PS_DIRECT_PUSH) */
} ps_client_stats_t;

/**
 * @brief Connect to every shard of the manifest at @p manifest_path and join.
 * Retries unreachable shards with capped backoff until the connect timeout.
 * @param opts may be NULL (defaults).
 * @param[out] out the client; release with ps_client_destroy.
 * @return 0, PS_ECONFIG (a bad manifest, or one the shards refuse: another cluster,
 *         chunk_bytes, job.consistency, number or order of servers), PS_ETRANSPORT /
 *         PS_ETIMEDOUT (unreachable), PS_ECANCELED (opts->cancel was set while the join
 *         waited), PS_EFULL (no free rank), PS_EBUSY (a shard shutting down, or shard 0's
 *         free ranks held by workers that left its open step, until it closes; either asked
 *         again until the reconnect timeout), PS_EIO (PS_TRACE cannot be written), PS_ENOTSUP (this process
 *         was forked from one with a client open: UCX's state does not survive that; a client
 *         closed before the fork is fine) or another PS_E* with ps_client_error() telling why.
 * @note On failure *out is NULL and nothing is left to release; the reason is
 *       written to @p err (may be NULL).
 * @note With PS_TRACE=FILE in the environment the client writes a timeline of its ops to
 *       FILE ("%p" in it: this process's id; the process's second client FILE.2, ...) in
 *       Chrome's trace format, until ps_client_destroy (docs/DESIGN-NOTES.md, "Timelines").
 */
int ps_client_create(const char *manifest_path, const ps_client_opts_t *opts,
                     ps_client_t **out, char *err, size_t errlen);

/**
 * @brief Start a group: small pushes and pulls (every chunk at most 16 KiB) started until
 * ps_client_group_end are held and then handed to the communication thread together, so that
 * those bound for one shard travel fused in one message (manifest `fusion_bytes`), and their
 * replies come back fused too. A larger push or pull leaves at once, as outside a group (so a
 * backward pass can keep a group open: its large gradients overlap the rest of it). Groups
 * nest; only the outermost end hands the held ones over. Waiting on an op of an open group,
 * a call that asks a shard something (declare, next batch, self-test) and ps_client_destroy
 * hand the group over first, so nothing held runs after them. Nothing is allocated or copied
 * by the caller.
 */
void ps_client_group_begin(ps_client_t *c);
/** @brief End a group begun by ps_client_group_begin (see there). */
void ps_client_group_end(ps_client_t *c);
/** @brief Bundle size for fusing small messages from now on (0: each part alone); the
 *  manifest's `fusion_bytes` is the default. For benchmarks and tuning. */
void ps_client_set_fusion(ps_client_t *c, uint64_t bytes);

/**
 * @brief Fail every operation in flight, and every one started later, with PS_ECANCELED (their
 * waits return at once), e.g. to stop a worker waiting on a cluster that cannot make progress.
 * An operation whose data UCX is still sending (a rendezvous to a shard that is stopped or cut
 * off) ends when the send does, or at the latest a third of job.heartbeat_timeout_ms (1 to 5 s)
 * later, when libps closes the connection that holds it. Safe to call from a signal handler.
 * Afterwards the client is only good for ps_client_destroy (which still says leave).
 */
void ps_client_interrupt(ps_client_t *c);

/**
 * @brief Allocate @p bytes of zeroed memory for a tensor's gradients or parameters. Any memory
 * works for push and pull; this kind is cheaper to move between processes of one host: from
 * 1 MiB up it is mapped alone in whole 2 MiB pages (a 1 MiB buffer takes 2 MiB), 2 MiB-aligned
 * and advised to transparent huge pages (where the kernel's THP setting is "madvise" or
 * "always"), so a same-host transfer (cma), which pins the sending process's pages, pins one
 * page per 2 MiB instead of 512. Below 1 MiB it is plain heap memory.
 * @return the buffer, owned by the caller; release it with ps_buffer_free and the same
 *         @p bytes. NULL when out of memory.
 */
void *ps_buffer_alloc(size_t bytes);
/** @brief Release a buffer from ps_buffer_alloc; @p bytes must be the size it was allocated
 *  with. NULL is a no-op. */
void ps_buffer_free(void *p, size_t bytes);

/** @brief Leave the cluster, close the connections, stop the thread and free the client.
 *  Outstanding handles must have been waited on. NULL is a no-op.
 *  @note The connections close only after every shard answered the leave (or its connection
 *  failed), at most a third of job.heartbeat_timeout_ms (1 to 5 s) for a shard that does not
 *  answer; each close then waits at most 2 s. */
void ps_client_destroy(ps_client_t *c);

/** @brief This worker's rank (from shard 0), the job's members when it joined, the number
 *  of shards and the coordinator's step when this client joined. */
int ps_client_rank(const ps_client_t *c);
/** @brief 1 when the last batch reply said this worker holds the lowest rank among the job's
 *  members (one worker evaluates for the job: psworker's per-pass test accuracy), else 0 (also
 *  against a psd older than session 62, which never says so). Any thread. */
int ps_client_leads(const ps_client_t *c);
/* The manifest's job, as this client read it (for front ends that run their own loop). */
typedef struct {
    int consistency;      /* 0 bsp, 1 asp, 2 ssp */
    uint64_t seed;        /* job.seed: ps_batch_order's */
    uint32_t batch_size;  /* job.batch_size: samples per batch */
    uint32_t epochs;      /* job.epochs: passes over the training set */
    uint64_t max_steps;   /* job.max_steps (0: all epochs) */
    uint32_t workers;     /* job.workers: the workers wanted at the start */
} ps_job_info_t;
/** @brief Fill @p out with the manifest's job settings. */
void ps_client_job(const ps_client_t *c, ps_job_info_t *out);
/**
 * @brief The cluster name of the manifest at @p path, read and checked as a join reads it,
 * without contacting any shard (front ends tell two manifests of one job apart by it).
 * @param out receives the name, NUL-terminated (128 bytes hold any valid one).
 * @return 0, PS_ECONFIG (the manifest is refused) or PS_ENOENT and the like (it cannot be
 *  read), the reason in @p err; PS_EINVAL (@p outlen too small), PS_ENOMEM. Nothing is kept.
 */
int ps_manifest_cluster(const char *path, char *out, size_t outlen, char *err, size_t errlen);
/**
 * @brief The name of the optimizer the job of the manifest at @p path runs on its shards
 * (job.optimizer.name: "sgd", "momentum", "adam", "adamw", "adagrad", or "mean", with which the
 * shards keep each step's mean gradient and no model), read as ps_manifest_cluster reads the
 * cluster name; the same returns and ownership (16 bytes of @p out hold any name).
 */
int ps_manifest_optimizer(const char *path, char *out, size_t outlen, char *err, size_t errlen);
uint32_t ps_client_workers(const ps_client_t *c);
uint32_t ps_client_shards(const ps_client_t *c);
uint64_t ps_client_join_step(const ps_client_t *c);
/**
 * @brief Whether a shard refused this worker back after a reconnect for a reason no restart
 * of the worker mends: its store lost, restored alone, gone back to an older copy of itself,
 * another configuration or secret (the log line "shard N refused this worker back: ..."). The
 * operations on it failed; a program exits as refused (psworker: 2, so that pslaunch starts no
 * worker again: one started now would be refused at its join, or under asp train on a store
 * that lost updates). @return 1 or 0; any thread. NULL: 0.
 */
int ps_client_refused_back(const ps_client_t *c);

/**
 * @brief Declare a tensor on the shards (blocking). The first declaration creates it;
 * a later one must have the same shape.
 * @param[out] id the tensor's id for push and pull.
 * @return 0, PS_ECONFLICT (shape differs; ps_client_error() names both shapes), PS_EINVAL
 *  (a description psd could not hold: an empty, too long or not UTF-8 name, 0 or more than 4
 *  dimensions, a dimension of 0, more than 2^34 values, an initializer outside 0..4, a
 *  non-finite init_arg; ps_client_error() says which, and nothing is sent), PS_E*.
 * @note Under bsp every chunk counts its own steps from 0: a tensor declared after the others
 *  have been pushed for some steps takes pushes (and answers pulls) from step 0, not from the
 *  others' step.
 */
int ps_client_declare(ps_client_t *c, const ps_tensor_desc_t *desc, uint32_t *id);

/**
 * @brief Give up the tensors this client declared: each that no other worker declared since
 *  its shards started and that no push reached is dropped from the shards (psctl forget's
 *  effect); the others are kept. For a worker that stops before training, so that the tensors
 *  its declarations created (with its values) do not stay behind. libps does it by itself when
 *  shard 0 refuses its first batch request (another model). Best effort: nothing is reported;
 *  a psd older than session 36 is not asked.
 */
void ps_client_give_up(ps_client_t *c);

/**
 * @brief ps_client_declare(), but a tensor this declaration creates starts from @p values
 *  (a model's own weights: a pretrained one), not from @p desc's initializer (ignored): on
 *  each shard where it creates the tensor, the values of that shard's chunks are sent before
 *  the declaration returns. A tensor that exists keeps its values (a restarted job resumes),
 *  as does a part another worker's declaration is creating at the same time (every shard's
 *  part comes from one worker; a worker that dies meanwhile is replaced by the next one
 *  waiting).
 * @param values  ps_decl_numel(shape) floats, borrowed until the call returns; all finite.
 * @param[out] own  may be NULL; 1 when every chunk of the tensor was created from @p values,
 *  0 when the shards held some or all of it already (another worker's values, or a store's).
 * @return as ps_client_declare(); PS_EINVAL also for a NaN or an infinity in @p values (nothing
 *  sent). Against a psd older than session 36 (which takes no values), the tensor is declared
 *  without them, from the shards' initializer (said once in the log; *@p own 0).
 */
int ps_client_declare_values(ps_client_t *c, const ps_tensor_desc_t *desc, const float *values,
                             uint32_t *id, int *own);

#define PS_COMPRESSION_BLOCK (1u << 0)
#define PS_COMPRESSION_STOCHASTIC (1u << 1)
#define PS_COMPRESSION_FP16_VALUES (1u << 2)

typedef struct {
    uint64_t field_mask;     /* PS_COMPRESSION_* of the optional fields set below */
    const char *codec;       /* "none", "fp16", "bf16", "int8", "sign", "topk:F", "randomk:F" */
    int error_feedback;      /* keep what the codec dropped and add it to the next push */
    const char *pull;        /* parameters as "none", "fp16" or "bf16" (NULL: none) */
    uint32_t block;          /* int8, sign: values per scale (default 256) */
    int stochastic;          /* int8: stochastic rounding */
    int fp16_values;         /* topk, randomk: values travel as fp16 */
} ps_compression_t;

/**
 * @brief Compress tensor @p id's pushes and pulls as @p cfg says.
 * @return 0 or PS_EINVAL (unknown codec name, block 0, an undeclared tensor, or a codec other
 *         than none, fp16 or bf16, or error feedback, for a PS_TENSOR_MEAN tensor, whose
 *         pushes are values; ps_client_error() says which), PS_ENOMEM, PS_EBUSY (a push or
 *         pull of the tensor has not been waited for).
 * @note With a codec other than none, the encoded chunks live in one buffer per tensor, as
 *       do compressed pulls' landing chunks: ps_client_push refuses a second push of a tensor
 *       before the first was waited for, ps_client_pull a second compressed pull.
 * @note The error-feedback residual is kept while error feedback stays on (whatever else
 *       changes); turned off (codec "none", or error_feedback 0), what it holds is added to
 *       the next push whose sums are all finite (encoded with the new codec), then dropped:
 *       a shard that does not sum that push (a replayed batch's) loses it with the push's
 *       gradient, as it loses an uncompressed push's.
 *       Pushes encoded by the caller (ps_client_push_encoded) keep their own residual.
 *       A tensor pulled as "fp16" whose parameters reach 65520 or more in magnitude reads
 *       them as infinities (psd warns, naming the tensor): pull it as "bf16" or "none".
 */
int ps_client_set_compression(ps_client_t *c, uint32_t id, const ps_compression_t *cfg);

/**
 * @brief Copy tensor @p id's error-feedback residual (what its codec has not sent yet: the sum
 * of its gradients less what its pushes carried) into @p out. A push a shard acknowledged as
 * not summed (its batch applied from another push, or handed out again), or a chunk of a push
 * that failed because its shard refused that chunk (out of memory, a malformed payload), gave
 * its gradient up and its payload back: the residual is what it was before that push, up to
 * float rounding, so pushing the same gradient again counts it once.
 * Pushes encoded by the caller (ps_client_push_encoded) keep their own residual; this one is
 * not theirs.
 * @param[out] out numel floats (the caller's).
 * @return 0; PS_EINVAL (an undeclared tensor, or one without error feedback), PS_EBUSY (a push
 *         of it has not been waited for).
 */
int ps_client_residual(ps_client_t *c, uint32_t id, float *out);

/**
 * @brief An encoder for ps_client_push_encoded: write chunk @p chunk of tensor @p id's
 * gradient (elements [offset, offset + n)) encoded with @p codec into out[cap], and the
 * payload's size into *len.
 * @param codec a `const psk_codec_t *` (kernels/codec.h): the tensor's codec with this push's
 *              and chunk's seed; borrowed for the call.
 * @param error_feedback whether the tensor keeps error feedback: the encoder keeps the
 *              residual (libps's own is not used by encoded pushes).
 * @param out   libps's buffer for the chunk: at most @p cap bytes may be written.
 * @return 0 or a PS_E* code (the push fails with it).
 * @note Called on the thread that calls ps_client_push_encoded, before that returns; @p arg is
 *       only borrowed for that call.
 */
typedef int (*ps_push_encoder_t)(void *arg, uint32_t id, uint32_t chunk, uint64_t offset,
                                 size_t n, const void *codec, int error_feedback, uint8_t *out,
                                 size_t cap, size_t *len);

/**
 * @brief Push tensor @p id for @p step with payloads that @p enc writes, chunk by chunk on the
 * calling thread, e.g. a GPU encoding the gradient where it was computed so that only the
 * compressed bytes cross to the host (psworker --device cuda).
 * A payload whose first byte (the codec's kind) is 0xff is a device's mark of a chunk holding a
 * NaN or an infinity that int8 or sign cannot encode (psk_codec_encode_cuda, its residual left
 * as it was): that chunk goes as float32 NaNs, which every shard leaves out of its update (as a
 * host push of such a chunk does; against a psd older than session 37 the push is refused).
 * @return as ps_client_push; PS_EINVAL also when the tensor has no codec (push the gradient
 *         itself) or a payload is not a valid one of its codec (psk_codec_check): then nothing
 *         is sent, but the encoder's residual already holds the chunks encoded before the bad
 *         one.
 */
int ps_client_push_encoded(ps_client_t *c, uint32_t id, uint64_t step, ps_push_encoder_t enc,
                           void *arg, ps_op_t **op);

/**
 * @brief Called for a chunk of a ps_client_push_encoded push whose shard acknowledged it as not
 * summed (its batch applied from another push, handed out again, or the push left out for a
 * NaN or an infinity), or that its shard refused (the push then fails): an encoder that keeps
 * error feedback takes the push back, residual +=
 * decode(@p payload) - g, as libps does with its own residual (psk_codec_ef_put_back_cpu does
 * it on the host). Called from ps_op_wait (or ps_op_wait_many) of that push, on the caller's
 * thread, before it returns; @p payload (@p len bytes, what the encoder wrote) and @p codec
 * (a `const psk_codec_t *`) are borrowed for the call.
 * @return 0 or a PS_E* code (the wait returns it).
 */
typedef int (*ps_push_put_back_t)(void *arg, uint32_t id, uint32_t chunk, uint64_t offset,
                                  size_t n, const void *codec, const uint8_t *payload,
                                  size_t len);

/**
 * @brief Give tensor @p id's encoded pushes (ps_client_push_encoded) a put-back, @p fn with
 * @p arg (borrowed until the client is destroyed or another is set; NULL: none, the default).
 * @return 0, or PS_EINVAL for an undeclared tensor.
 */
int ps_client_set_put_back(ps_client_t *c, uint32_t id, ps_push_put_back_t fn, void *arg);

/**
 * @brief Compress tensor @p id as the manifest's job.compression says for a tensor named
 * @p name of its size (the first matching rule, else none below min_bytes, else the job's
 * codec), as psworker does for each of its tensors; a PS_TENSOR_MEAN tensor is left
 * uncompressed (its pushes are values).
 * @param name the name @p id was declared with (the rules match names); borrowed.
 * @return as ps_client_set_compression.
 */
int ps_client_use_job_compression(ps_client_t *c, uint32_t id, const char *name);

/**
 * @brief Push the gradient of tensor @p id for @p step (asynchronous). Under asp / ssp @p step
 * only tags the push (each is applied when it lands, whatever its step).
 * @param grad numel floats; borrowed: must stay unchanged until the handle completes.
 * @param[out] op the handle to ps_op_wait on.
 * @return 0; PS_EBUSY while an earlier push of the tensor has not been waited for; PS_EINVAL
 *  (an undeclared tensor; int8 and sign: a NaN or an infinity in @p grad, which they cannot
 *  encode, against a psd older than session 37: refused whole with the residual unchanged; a
 *  newer one is sent each such chunk as fp32, its residual unchanged, and leaves it out:
 *  ps_client_nonfinite_pushes), PS_ENOMEM, or the codec's error. Under bsp a
 *  push for a step of which this worker holds no batch (before its first
 *  ps_client_next_batch) completes with PS_EINVAL, not PS_ENOTMEMBER: it was not removed.
 */
int ps_client_push(ps_client_t *c, uint32_t id, const float *grad, uint64_t step, ps_op_t **op);

/**
 * @brief Under bsp, say that this worker has no gradient of tensor @p id for @p step (its
 * model did not use the tensor in this batch; torch: `.grad` is None), in place of a push.
 * The step counts it as this member's push and as a zero in the mean of the members'
 * gradients; where no member of the step had a gradient, the shards leave the tensor's
 * parameters and optimizer state as they are (no momentum, no weight decay: as a torch
 * optimizer skips a parameter without a gradient). Asynchronous; headers only.
 * @param[out] op the handle to ps_op_wait on.
 * @return 0; PS_EINVAL under asp / ssp (where each push is applied on its own: push nothing
 *  instead) or for an undeclared tensor; PS_EBUSY, PS_ENOMEM as ps_client_push. A tensor's
 *  error-feedback residual is left as it is.
 */
int ps_client_push_none(ps_client_t *c, uint32_t id, uint64_t step, ps_op_t **op);

/**
 * @brief Pull the parameters of tensor @p id once every chunk reached @p min_version
 * (under bsp: the step the caller is about to compute; 0 = whatever is there). Under asp / ssp
 * @p min_version is not waited for (each push is applied on its own, and a chunk's version
 * counts its updates): the pull answers with the parameters as they are.
 * @param dst numel floats; written until the handle completes. Chunks land in it before their
 *  CRC-32C is checked (a mismatch asks again and overwrites them), so after a failed pull
 *  (e.g. PS_ECRC after every retry) @p dst may hold partial or corrupted chunks.
 * @return 0; PS_EBUSY while an earlier compressed pull (fp16, bf16) of the tensor has not been
 *  waited for; PS_EINVAL (an undeclared tensor), PS_ENOMEM.
 */
int ps_client_pull(ps_client_t *c, uint32_t id, float *dst, uint64_t min_version, ps_op_t **op);

/**
 * @brief Wait for @p op to complete and release it.
 * @param[out] version may be NULL; for pulls the lowest chunk version received.
 * @return the operation's status (0 or PS_E*; ps_client_error() says why).
 * @note @p op is gone after this returns: wait for each handle once. A second wait on a
 *  handle the client still keeps for reuse is refused with PS_EINVAL; one it freed or handed
 *  out again is undefined behaviour.
 */
int ps_op_wait(ps_op_t *op, uint64_t *version);

/**
 * @brief ps_client_push() of @p n tensors for @p step in one call, fused as a group
 *  (ps_client_group_begin): ops[i] is tensor ids[i]'s push of bufs[i], or its
 *  ps_client_push_none() where bufs[i] is NULL (bsp only). For a binding that pays per call
 *  (Python: one call instead of n).
 * @param bufs  borrowed until each op is waited for, as ps_client_push()'s.
 * @return 0; or the error of the first push refused, ids[k]'s: ops[0..k-1] were made (wait for
 *  them) and ops[k..n-1] are NULL.
 */
int ps_client_push_many(ps_client_t *c, uint32_t n, const uint32_t *ids,
                        const float *const *bufs, uint64_t step, ps_op_t **ops);

/** @brief ps_client_pull() of @p n tensors into dsts[i] in one call, as ps_client_push_many. */
int ps_client_pull_many(ps_client_t *c, uint32_t n, const uint32_t *ids, float *const *dsts,
                        uint64_t min_version, ps_op_t **ops);

/**
 * @brief ps_op_wait() of each of @p n ops (NULL ones skipped) in one call; versions[i] (may be
 *  NULL) as its @p version, statuses[i] (may be NULL) its status (for a NULL op: 0 and 0).
 * @return 0, or the first failed op's status (ps_client_error() says why). Every op is waited
 *  for, also after a failure.
 */
int ps_op_wait_many(uint32_t n, ps_op_t **ops, uint64_t *versions, int *statuses);

/** @brief The last error text of the client (valid until the next call on it). */
const char *ps_client_error(const ps_client_t *c);

/** @brief Payload traffic so far. */
void ps_client_stats(const ps_client_t *c, ps_client_stats_t *out);

/**
 * @brief Chunk pushes of this client that a shard left out of its update because the gradient
 *  held a NaN or an infinity (their acknowledgement said so; libps also logs the 1st, 2nd, 4th
 *  ... one). Under bsp such a push counts as one without a gradient (a zero in the step's mean),
 *  under asp / ssp as an update that changed nothing. The op itself succeeds. With libps's
 *  error feedback, the push is given back: its gradient dropped, the residual as before it.
 * @note Any thread; 0 against a psd older than session 37 (it applies them as they are).
 */
uint64_t ps_client_nonfinite_pushes(const ps_client_t *c);

/**
 * @brief Measure the path to shard @p shard: @p reps messages (1 to 1000000) of @p bytes (at most
 * 64 MiB), each sent after the shard acknowledged the previous one (after one unmeasured
 * warm-up). An open group (ps_client_group_begin) is handed over first.
 * @param[out] gbps  payload bytes per second / 1e9
 * @param[out] lanes the transports of the connection ("sysv,cma", "tcp", ...); may be NULL
 * @return 0, PS_EINVAL, PS_ENOMEM or the transport's error.
 */
int ps_client_self_test(ps_client_t *c, uint32_t shard, size_t bytes, int reps, double *gbps,
                        char *lanes, size_t lanes_len);

enum { PS_DIRECT_PULLS = 1, PS_DIRECT_PUSHES = 2 };

/**
 * @brief Which direct paths to shard @p shard are in use now: PS_DIRECT_PULLS (pulls read its
 *  store), PS_DIRECT_PUSHES (pushes are written into its shared memory); 0 when it is on another
 *  host, when they are off (PS_DIRECT_PULL=0, PS_DIRECT_PUSH=0) or could not be opened.
 * @note Any thread; a snapshot (a reconnect may change it).
 */
int ps_client_direct(const ps_client_t *c, uint32_t shard);

/**
 * @brief The transports of the connection to shard @p shard ("sysv,cma", "tcp", "rc_mlx5,...",
 *  as psworker --self-test prints them): found once its first hello was answered (and again
 *  after a reconnect); "" before that.
 * @param[out] out  the caller's buffer: always NUL-terminated, cut to @p len - 1 bytes; may be
 *                  NULL only when @p len is 0.
 * @return 0, or PS_EINVAL for a shard out of range (@p out then "").
 * @note Any thread (it takes the client's lock for the copy); a snapshot (a reconnect may
 *  change it).
 */
int ps_client_lanes(ps_client_t *c, uint32_t shard, char *out, size_t len);

/* A batch of the training set, as the coordinator hands it out: positions
 * [offset, offset + count) of pass `pass`'s permutation, to be computed as step `step`. */
typedef struct {
    uint64_t step;           /* the step to push for (bsp: the cluster's step) */
    uint64_t pass, offset;
    uint32_t count;          /* samples */
    uint32_t members;        /* workers in this step (bsp), or in the job */
    uint64_t epoch;          /* membership epoch */
    int finished;            /* the job is complete: step = the final step; no batch (pass:
                                the job's last pass that handed out samples; 0 from a psd
                                before session 63) */
} ps_batch_info_t;

/**
 * @brief Say that @p done's pushes were all acknowledged (its step is applied everywhere). If
 * the client leaves (ps_client_destroy) before a later ps_client_next_batch reports it, the
 * leave carries it, so the coordinator counts the batch instead of handing it to another
 * worker (whose gradient of it would then be applied a second time). Caller's thread; @p done
 * is copied. Works after ps_client_interrupt too (the leave still goes out). A @p done that
 * ps_client_next_batch would refuse (not the batch held; under bsp none of its pushes
 * acknowledged) is not reported by the leave (it says so in the log): its batch goes to another
 * worker.
 */
void ps_client_batch_done(ps_client_t *c, const ps_batch_info_t *done);

/**
 * @brief Report @p done (its pushes all acknowledged) to the coordinator now, without asking
 * for the next batch: for a worker that does something else before its next request
 * (evaluates, saves). Until a batch is reported, an asp / ssp checkpoint waits for it (it is
 * "in flight") and holds every other worker's hand-out meanwhile, and under ssp the members
 * ahead wait for this worker's count. The next ps_client_next_batch(@p done) and the leave
 * then leave it out (reported once). Blocks for a round trip to shard 0 (answered once shard 0
 * committed it). Caller's thread. Against a psd older than session 64 it only keeps @p done
 * for the next request or the leave (ps_client_batch_done) and returns 0.
 * @param samples the training set's size, as ps_client_next_batch's.
 * @return 0, PS_EINVAL (@p done is not the batch this client was handed last, or under bsp no
 *         push of it was acknowledged: as ps_client_next_batch), PS_ENOTMEMBER, PS_ECONFIG,
 *         PS_ECANCELED, PS_E*; on an error @p done stays kept for the next request or the leave.
 */
int ps_client_report_done(ps_client_t *c, uint64_t samples, const ps_batch_info_t *done);

/**
 * @brief Ask the coordinator for the next batch (blocking until it is this worker's turn:
 * under bsp the next step, under ssp within the staleness bound).
 * @param samples the training set's size, > 0 (the coordinator checks every worker agrees).
 * @param done    the batch this worker just finished (its pushes all acknowledged), or NULL.
 * @param[out] out the batch, or out->finished.
 * @return 0, PS_EINVAL (@p done is not the batch this client was handed last, or under bsp no
 *         push of this client was acknowledged since it was handed out: a report closes the
 *         step for every member, so one without pushes would close a step no shard applied;
 *         nothing is sent), PS_ENOTMEMBER (this worker was removed from the job, e.g. after
 *         missing heartbeats: create a new client to join again), PS_ECONFIG (@p samples differs from
 *         the job's; or under bsp, at this client's first batch, the tensors it declared are
 *         not the set the other members declared: destroy it, as it holds their steps while it
 *         stays), PS_EPROTO (shard 0 answered an empty batch or one past the training set's
 *         end: its job state is damaged), PS_ECANCELED, PS_E*.
 * @note Pushes sent after this call carry the returned membership epoch. Under bsp declare
 *       every tensor before the first call: each step waits for every member's push of each.
 */
int ps_client_next_batch(ps_client_t *c, uint64_t samples, const ps_batch_info_t *done,
                         ps_batch_info_t *out);

/**
 * @brief The order of the training set in pass @p pass: perm[0..n-1] = a permutation of
 * 0..n-1 fixed by (@p seed = the manifest's job.seed, @p pass); a batch's samples are
 * perm[offset .. offset + count - 1] (ps_batch_info_t). Fisher-Yates driven by splitmix64,
 * integer arithmetic only: every worker computes the same one. @p perm is the caller's, n
 * entries (none when @p n is 0).
 */
void ps_batch_order(uint32_t *perm, uint32_t n, uint64_t seed, uint32_t pass);

#endif
