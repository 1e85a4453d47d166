/* wire.h: the plain-C form of a psd message header and its (de)serialization.
 *
 * Only wire.c touches protobuf-c. Decoding validates everything a peer could
 * get wrong (version, type, string lengths, shape rank) and fills a fixed-size
 * struct, so no pointer into a receive buffer outlives the call. */
#ifndef PS_WIRE_H
#define PS_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batches.h" /* PS_REPLAY_MAX */

#define PS_WIRE_VERSION 1
#define PS_WIRE_HDR_MAX 1024 /* largest header we send or accept (UCX allows 8100 B) */
#define PS_NAME_MAX 128
#define PS_SESSION_MAX 16 /* a session token's bytes (common/auth.h: PS_AUTH_SESSION) */
#define PS_MAX_DIMS 4
#define PS_MAX_TENSOR_VALUES (1ull << 34) /* per tensor (64 GiB of fp32) */

#define PS_MAX_RANKS 64 /* worker ranks: a step's members travel as a 64-bit bitmap */
#define PS_LAUNCH_MAX 256 /* worker processes one launcher runs at once (PS_MSG_LAUNCH.workers) */

/* Replay tags (ps_msg_t.replay): common/batches.h, PS_REPLAY_TAG and ps_replay_next. */

/* ps_msg_t.flags */
enum {
    PS_FLAG_FINISHED = 1, /* batch reply: the job is complete (step = the final step);
                             checkpoint cancel reply: too late, this shard's part is whole */
    PS_FLAG_DONE = 2,     /* launch: this launcher exits (session 67): its slot is freed and
                             nothing granted; an older psd takes it as a report of 0 running.
                             Batch request: the batch in the message was pushed and acked;
                             checkpoint go: this checkpoint armed the shards (psd reads its
                             id, `count`, instead); go reply: the hold lasted for that id;
                             cancel reply: nothing of that checkpoint is left on this shard;
                             scale reply: no start is granted (asp / ssp: a member did
                             job.max_steps, and a replacement would do as many again) */
    PS_FLAG_REMOVED = 4,  /* error / epoch: this worker is no longer a member */
    PS_FLAG_PROGRESS = 8, /* push: `samples` = samples applied before its step (lr schedule) */
    PS_FLAG_PENDING = 16, /* checkpoint begin reply: the step asked for is not reached yet; it
                             will be held when it is: ask again; cancel reply: its copy is
                             stopping (it removes what it wrote): ask its status */
    PS_FLAG_DIRECT = 32,  /* pull: the worker reads the shard's store itself (the hello reply's
                             store); pull reply: no data, read version `step` from the store;
                             push: no data, the gradient is at area_offset of the push area */
    PS_FLAG_CHUNK = 64,   /* error: about the push (or pull) of (tensor, chunk) of request
                             req_id, of which the shard holds nothing (a push's place may be
                             written again) */
    PS_FLAG_BATCH = 128,  /* asp / ssp batch reply: stamp the pushes of this batch with it;
                             push: data_epoch and batch_offset name the batch it is for */
    PS_FLAG_STALE = 256,  /* bsp push ack: the chunk had applied the push's step without its
                             batch: dropped, not applied; batch request or leave with
                             PS_FLAG_DONE: a push of that batch got such an ack, so the
                             coordinator hands it out again */
    PS_FLAG_BEHIND = 512, /* error (PS_ESTALE) about a bsp push: its chunk is at the step before
                             the push's (the error's `step`: the chunk's), which it has not
                             passed yet; the worker sends the push again a little later */
    PS_FLAG_CLOSED = 1024, /* epoch (bsp): the members of `step` only, a step the coordinator
                             closed (after its restart) that a shard may not have applied yet;
                             members forward it to the other shards and keep their own view */
    PS_FLAG_CONF = 2048,  /* hello: `length` is the worker's chunk_bytes, `consistency` its
                             job.consistency, `count` its number of shards and `shard` the one
                             it means (its manifest's), which the shard checks against its own */
    PS_FLAG_NOGRAD = 4096, /* bsp push: the worker has no gradient of the chunk this step (a
                              parameter its model did not use): no data; counted as its push
                              and as a zero in the step's mean. A step in which no member has
                              one leaves the chunk's parameters and optimizer state as they
                              are (ps_client_push_none) */
    PS_FLAG_FORCE = 8192,  /* forget: an operator's (psctl forget), not a member giving up its
                              declarations */
    PS_FLAG_VALUES = 16384, /* declare reply (init PSK_INIT_VALUES): this declaration creates
                               the tensor here; send the values of this shard's chunks
                               (PS_MSG_VALUES), then declare again (answered once created);
                               hello reply: this psd knows PS_MSG_VALUES and PS_MSG_FORGET
                               (an older one answers them with req_id 0: never matched) */
    PS_FLAG_CHECK = 32768,  /* forget: would it be dropped here? (PS_FLAG_DONE); nothing is:
                               shard 0 is asked first and drops last (forget.c) */
    PS_FLAG_NONFINITE = 65536, /* push ack: the push held a NaN or an infinity and was left
                                  out (bsp: as a push without a gradient; asp / ssp: an update
                                  that changed nothing); an older psd applies it as it is.
                                  hello reply: this psd leaves such pushes out (libps then
                                  sends one its codec cannot encode, int8 or sign, as fp32) */
    PS_FLAG_ANSWER = 131072, /* heartbeat: answer it (the shard sends MSG_HEARTBEAT back with
                                its `shard`); hello reply: this psd answers such heartbeats
                                (session 40), so libps takes one that answers nothing for a
                                while as lost (a dead host, a cut network, a stopped psd) */
    PS_FLAG_TENSORS = 262144, /* hello reply: `count` is the tensors in the shard's table
                                 (session 40): libps tells a shard that lost its store by it */
    PS_FLAG_RUN = 524288, /* hello reply: `run`, `run_origin` and `run_base` are the shard
                             store's run (session 41): libps tells a shard restored alone, or
                             one that came back as another store, by it */
    PS_FLAG_MOVE = 1048576, /* checkpoint arm: move the arm of checkpoint `count`, armed here
                               and waiting for its step, to `step` and directory `error`
                               (session 47); an older psd takes it as a second arm and refuses
                               it (busy). Checkpoint begin reply (bsp): the step is the open
                               one, whose members all left. PS_FLAG_CHECK on an arm, with or
                               without it: would it be taken? nothing is armed or moved */
    PS_FLAG_UNSUMMED = 2097152, /* push ack: the push was not summed, as its batch was had
                                   already (bsp: a replay of a batch handed out again that this
                                   chunk applied from its first holder; asp / ssp: a batch the
                                   chunk applied from another holder); PS_FLAG_STALE acks are not
                                   summed either. libps's error feedback puts such a push's
                                   payload back into its residual (session 60); an older psd
                                   does not say so, an older libps ignores it */
    PS_FLAG_TRAINED = 8388608, /* forget, with PS_FLAG_FORCE (psctl forget --trained): also a
                                  tensor a push reached, its trained values lost; shard 0 takes
                                  it only while the job has no member (session 62); an older
                                  psd ignores it and refuses such a tensor as before */
    PS_FLAG_LEAD = 4194304, /* batch reply: the worker holds the lowest rank of the job's
                               members (session 62): the one that evaluates for the job, as
                               psworker does at each pass; an older psd never says so */
    PS_FLAG_REPORT = 16777216, /* batch request, with PS_FLAG_DONE: report the batch done only,
                                  hand nothing out (ps_client_report_done; the reply says
                                  PS_FLAG_REPORT, once a committed state holds the report);
                                  hello reply: this psd takes such reports (session 64: an
                                  older one would hand out a batch); launch: `count` is this
                                  launcher's workers told to stop that still run, every report
                                  (session 73: shard 0 then takes its word over the stops it
                                  granted; an older pslaunch sets no flag) */
    PS_FLAG_STEPMAX = 33554432, /* hello reply: `step_max` is the highest chunk version in the
                                   shard's store (session 67): libps tells a store that went
                                   back to an older copy of itself by it (a version below one
                                   the shard told it of before); an older psd does not say */
    PS_FLAG_FLOOR = 67108864, /* hello reply: this psd keeps a floor of the next shard, the
                                 highest chunk version of it (of its floor key `floor_run`; 0:
                                 none yet) a member told it of by its heartbeats and its leave,
                                 in `floor` (a joiner tells a next shard whose store went back to
                                 an older copy by it), and says its own floor key in
                                 `floor_key`, which a drop of a trained tensor changes (session
                                 68): floors are told of and compared only for such shards (an
                                 older psd's drops lower its step_max unsaid) */
};

/* UCP Active Message ids. */
enum { PS_AM_CTRL = 1, PS_AM_DATA = 2 };

typedef enum {
    PS_MSG_INVALID = 0,
    PS_MSG_HELLO = 1,
    PS_MSG_HELLO_REPLY = 2,
    PS_MSG_DECLARE = 3,
    PS_MSG_DECLARE_REPLY = 4,
    PS_MSG_PUSH = 5,
    PS_MSG_PUSH_ACK = 6,
    PS_MSG_PULL = 7,
    PS_MSG_PULL_REPLY = 8,
    PS_MSG_ERROR = 9,
    PS_MSG_LEAVE = 10,
    PS_MSG_HEARTBEAT = 11,
    PS_MSG_STATUS = 12,
    PS_MSG_STATUS_REPLY = 13,
    PS_MSG_BATCH = 14,
    PS_MSG_BATCH_REPLY = 15,
    PS_MSG_EPOCH = 16,
    PS_MSG_SCALE = 17,
    PS_MSG_SCALE_REPLY = 18,
    PS_MSG_LAUNCH = 19,
    PS_MSG_LAUNCH_REPLY = 20,
    PS_MSG_ECHO = 21,
    PS_MSG_ECHO_REPLY = 22,
    PS_MSG_BUNDLE = 23, /* proto/bundle.h */
    PS_MSG_LEAVE_REPLY = 24,
    PS_MSG_AUTH = 25, /* client -> shard, first on every connection: `auth` (common/auth.h) */
    PS_MSG_FORGET = 26, /* -> shard: drop a tensor never pushed (server/forget.c) */
    PS_MSG_FORGET_REPLY = 27,
    PS_MSG_VALUES = 28, /* -> shard: the values of (tensor, chunk) its declaration creates */
    PS_MSG_VALUES_REPLY = 29,
    PS_MSG_MAX_ = 30, /* end of the core and membership range */
    /* Durability (psctl -> shard; server/export.c): */
    PS_MSG_EXPORT_BEGIN = 30,
    PS_MSG_EXPORT_BEGIN_REPLY = 31,
    PS_MSG_EXPORT_TENSOR = 32,
    PS_MSG_EXPORT_TENSOR_REPLY = 33,
    PS_MSG_EXPORT_CHUNK = 34,
    PS_MSG_EXPORT_CHUNK_REPLY = 35,
    PS_MSG_EXPORT_END = 36,
    PS_MSG_VERIFY = 37,
    PS_MSG_VERIFY_REPLY = 38,
    PS_MSG_DURABLE_END_ = 39,
    /* Checkpoints and repair (psctl -> shard; server/checkpoint.c): */
    PS_MSG_CKPT_BEGIN = 40,
    PS_MSG_CKPT_BEGIN_REPLY = 41,
    PS_MSG_CKPT_ARM = 42,
    PS_MSG_CKPT_ARM_REPLY = 43,
    PS_MSG_CKPT_GO = 44,
    PS_MSG_CKPT_GO_REPLY = 45,
    PS_MSG_CKPT_STATUS = 46,
    PS_MSG_CKPT_STATUS_REPLY = 47,
    PS_MSG_REPAIR = 48,
    PS_MSG_REPAIR_REPLY = 49,
    PS_MSG_CKPT_CANCEL = 50, /* psctl gave checkpoint `count` up (an older psd refuses it) */
    PS_MSG_CKPT_CANCEL_REPLY = 51,
    PS_MSG_CKPT_END_ = 52
} ps_msg_type_t;

/** @brief Whether @p type is a known message type. */
static inline int ps_msg_type_valid(int type)
{
    return (type > 0 && type < PS_MSG_MAX_) ||
           (type >= PS_MSG_EXPORT_BEGIN && type < PS_MSG_DURABLE_END_) ||
           (type >= PS_MSG_CKPT_BEGIN && type < PS_MSG_CKPT_END_);
}

typedef struct {
    char name[PS_NAME_MAX];
    uint32_t shape[PS_MAX_DIMS];
    int ndim;
    uint32_t init;
    float init_arg;
    uint64_t seed;
    uint32_t id;
    uint64_t first_chunk;
    uint64_t total_steps;
    int assigned;
} ps_decl_t;

typedef struct {
    ps_msg_type_t type;
    uint64_t req_id;
    uint64_t epoch;
    int32_t rank;
    uint32_t tensor;
    uint32_t chunk;
    uint64_t step;
    uint32_t codec;
    uint64_t length;
    uint32_t crc32c;
    int32_t status;
    uint32_t pid;
    uint32_t workers;
    uint32_t shard;
    uint32_t consistency;
    float codec_fraction;
    uint32_t codec_block;
    uint32_t codec_flags;
    uint64_t members;     /* bitmap of ranks (PS_MAX_RANKS = 64) */
    uint64_t data_epoch;
    uint64_t batch_offset;
    uint32_t batch_count;
    uint64_t samples;
    uint32_t flags;       /* PS_FLAG_* */
    char host[64];
    uint64_t step_max;
    uint64_t count;
    uint64_t store_id;
    uint32_t area_fd;
    uint64_t area_id, area_size, area_offset;
    uint64_t tensor_set;  /* batch request: digest of the tensors declared (0: not sent) */
    uint64_t run, run_origin, run_base; /* hello reply (PS_FLAG_RUN): the store's run, the
                                           checkpoint it was restored from (0: none), its step */
    uint64_t joined_runs; /* hello reply (PS_FLAG_RUN): the runs digest the shard keeps;
                             heartbeat: the worker's (ps_runs_digest) */
    uint32_t poll_ms;     /* launch: how often the launcher reports (0: an older one) */
    uint32_t launcher;    /* hello: the pid of the pslaunch that started the worker (0: none) */
    uint64_t job_seed1;   /* batch request: the worker's job.seed + 1 (0: not sent) */
    uint32_t job_batch;   /* batch request: the worker's job.batch_size (0: not sent) */
    uint64_t floor, floor_run; /* heartbeat, leave: the worker's seen_max of the next shard and
                                  that shard's floor key; hello reply (PS_FLAG_FLOOR): the
                                  highest such a member told this shard of (server/floor.c) */
    uint64_t floor_key;   /* hello reply (PS_FLAG_FLOOR): the shard's own floor key */
    uint32_t nreplay;     /* batch reply, push: replay tags in use (PS_REPLAY_MAX at most) */
    uint64_t replay[PS_REPLAY_MAX];
    char store[256];
    char error[256];
    char cluster[128];
    uint32_t auth_len;    /* MSG_AUTH: the proof's bytes */
    uint8_t auth[64];
    uint32_t session_len; /* the connection's session token (PS_SESSION_MAX bytes) or 0 */
    uint8_t session[PS_SESSION_MAX];
    int has_decl;
    ps_decl_t decl;
} ps_msg_t;

/* One step of a 64-bit mix (splitmix64's finalizer). */
static inline uint64_t ps_run_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/** @brief The digest of the runs of every shard of a cluster, @p runs[0..@p n-1] by shard
 *  index (never 0). Each shard keeps the digest of the last join a worker told it of (its
 *  heartbeats carry it): a shard whose store was replaced or restored alone while the others
 *  went on keeps another than theirs. */
static inline uint64_t ps_runs_digest(const uint64_t *runs, uint32_t n)
{
    uint64_t h = ps_run_mix(n);
    for (uint32_t i = 0; i < n; i++) h = ps_run_mix(h ^ runs[i]);
    return h | 1;
}

/** @brief What a store restored from the checkpoint of origin @p origin keeps as its runs
 *  digest until a worker joins (every shard of one restore the same; 0 for origin 0). */
static inline uint64_t ps_run_restored_mark(uint64_t origin)
{
    return origin ? ps_run_mix(origin ^ 0x7265737472656421ull) | 1 : 0;
}

/* ps_decl_t.init: the initializer (psk_init_kind_t, the low byte) and this flag: the tensor's
 * values are the mean of the members' pushes of each step, no optimizer (a BatchNorm's running
 * statistics: psd.torch). Carried in init so that a psd older than session 36 refuses such a
 * declaration ("unknown initializer") instead of training it with the optimizer. */
#define PS_DECL_MEAN 0x100u

/** @brief The initializer of @p d (psk_init_kind_t). */
static inline uint32_t ps_decl_init_kind(const ps_decl_t *d) { return d->init & 0xffu; }

/** @brief The bytes a direct push's chunk of @p len bytes takes in its shard's push area: libps
 *  places each chunk once per area, page-aligned, one after the other (worker/client.c,
 *  area_place), and psd refuses a push beyond what its chunks take so (server/pushshm.c). */
static inline uint64_t ps_area_place_bytes(uint64_t len) { return (len + 4095) & ~4095ull; }
/** @brief Whether @p d's values are the mean of each step's pushes (PS_DECL_MEAN). */
static inline bool ps_decl_mean(const ps_decl_t *d) { return (d->init & PS_DECL_MEAN) != 0; }

/** @brief Product of the decl's dimensions; 0 when ndim is 0. */
uint64_t ps_decl_numel(const ps_decl_t *d);

/**
 * @brief Whether @p d describes a tensor psd can hold: a non-empty name that fits, 1 to
 *  PS_MAX_DIMS dimensions, none 0, at most PS_MAX_TENSOR_VALUES values (no product wraps)
 *  and initializer 0..3.
 * @return 0, or PS_EINVAL with one line naming the tensor and what is wrong in @p err.
 * @note Both ends check: libps before it sends a declaration, ps_msg_decode on receipt.
 */
int ps_decl_check(const ps_decl_t *d, char *err, size_t errlen);
/** @brief ps_decl_check without the name rules that psctl export needs (UTF-8, not
 *  "__metadata__"), which psds before 2026-12-03 and 12-04 did not apply: for a shard's own
 *  stored records (psd's start), which hold what such a psd took. */
int ps_decl_check_stored(const ps_decl_t *d, char *err, size_t errlen);

/** @brief Format a shape as "[784, 256]" into @p buf. */
void ps_shape_str(const uint32_t *shape, int ndim, char *buf, size_t len);

/**
 * @brief Pack @p m into @p buf.
 * @param[out] len bytes written.
 * @return 0, or PS_EINVAL when it does not fit in @p cap. No allocation.
 */
int ps_msg_encode(const ps_msg_t *m, uint8_t *buf, size_t cap, size_t *len);

/**
 * @brief ps_msg_encode, with the connection's session token @p session of @p session_len
 *  bytes (at most PS_SESSION_MAX; 0: none) in place of @p m's own. Every client header after
 *  MSG_AUTH goes out this way (proto/authmsg.h). No allocation.
 */
int ps_msg_encode_sealed(const ps_msg_t *m, const uint8_t *session, size_t session_len,
                         uint8_t *buf, size_t cap, size_t *len);

/**
 * @brief Unpack and validate a header received from a peer.
 * @param[out] m    filled on success (zeroed first).
 * @param[out] err  on failure, what is wrong.
 * @return 0, or PS_EPROTO for truncated, garbage, wrong-version or out-of-range input.
 * @note No allocation outlives the call; @p buf is only read.
 */
int ps_msg_decode(ps_msg_t *m, const void *buf, size_t len, char *err, size_t errlen);

/**
 * @brief For tests and benchmarks: with @p on, pack and unpack every header with protobuf-c's
 *  generic code (the reference), not wire.c's own packing and data-path unpacking, which must
 *  give the same bytes and the same results (tests/unit/test_wire.c).
 * @note Not thread-safe: call it while no other thread packs or unpacks.
 */
void ps_wire_use_protobuf(bool on);

/** @brief Name of a message type, for logs (static storage). */
const char *ps_msg_type_name(int type);

#endif
