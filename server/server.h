/* server.h: the psd daemon's state, shared by its modules.
 *
 * server.c owns the loop, the UCX listener, connections and message dispatch;
 * a shard's data path (the tensor table, declarations, pushes and their aggregation, the
 * store jobs and the pull snapshots) is shard.c and the modules shard_internal.h lists.
 * Everything here is touched only on the loop thread, except
 * the buffers a running job has been handed (see psd_job_t). */
#ifndef PSD_SERVER_H
#define PSD_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "auth.h"
#include "batches.h"
#include "codec.h"
#include "floor.h"
#include "init.h"
#include "optim.h"
#include "prom.h"
#include "ucxprobe.h"
#include "manifest.h"
#include "memberviews.h"
#include "merkle.h"
#include "fanout.h"
#include "store.h"
#include "run.h"
#include "trace.h"
#include "ucx_loop.h"
#include "wire.h"

typedef struct psd_server_s psd_server_t;
typedef struct psd_chunk_s psd_chunk_t;

typedef struct psd_area_s psd_area_t; /* pushshm.c */

/* How many connections without a rank (no hello yet: joining workers, operators, launchers,
 * and, with a secret, the ones that have not proved it) may be open at once (server.c). Each
 * holds file descriptors: a peer opening them without end made psd run out, its workers' own
 * connections failed, and UCX lost its TCP listener for good (a helper's probe, session 59:
 * before, only a cluster with a secret had this bound). */
#define PSD_PENDING_MAX 256

typedef struct psd_conn_s {
    psd_server_t *srv;
    psd_area_t *area;                /* its push area (direct pushes), from its hello; or NULL */
    ucp_ep_h ep;
    ucp_conn_request_h conn_request; /* until the endpoint is created */
    int32_t rank;                    /* -1 until hello */
    uint32_t pid;
    uint64_t host_id;                /* from its hello (store_id): its host and pid namespace */
    int refs;                        /* pending acks, pulls and sends that name this conn */
    bool dead;                       /* endpoint failed or closed: send nothing more */
    uint64_t last_seen_ms;           /* any message from it (heartbeats included) */
    bool close_queued;
    bool silent;                     /* dropped for missed heartbeats */
    bool late;                       /* dropped for not pushing the open bsp step within
                                        job.step_timeout_ms of the first member (coord.c) */
    char peer[64];
    char lanes[64];                  /* transports of the endpoint, found at its hello */
    bool want_lanes;                 /* hello seen: find the lanes outside UCX callbacks */
    uint32_t eager_below;            /* data messages under this size go eagerly
                                        (ps_ucx_eager_below of lanes) */
    bool peer_reads;                 /* lanes name cma: the peer copies a rendezvous send's
                                        data itself (ps_ucx_lanes_peer_reads) */
    uint64_t join_serial;            /* the join (shard 0's serial; the others have it from the
                                        hello) this rank is held by */
    bool fuses;                      /* it sent a bundle: its small replies may be bundled */
    bool authed;                     /* it proved the cluster secret (only looked at when the
                                        cluster has one) */
    bool auth_warned;                /* its refusal was logged and answered: what it sends from
                                        then on, before a good proof, is dropped unanswered */
    uint64_t born_ms;                /* its connection request came (psd_now_ms) */
    bool spoke;                      /* a message from it was decoded (server.c
                                        quiet_deadline_ms) */
    char auth_why[200];              /* why its proof was refused ("": none came) */
    uint8_t session[PS_AUTH_SESSION]; /* authed: the token every later header must carry */
    bool forged_warned;              /* a header without that token was logged */
    bool bad_warned;                 /* a malformed message of it was logged (bad_input_log) */
    struct psd_send_s *outbox;       /* outbox.c: the bundle being filled for it */
    bool in_outbox_list;
    struct psd_conn_s *outbox_next;  /* srv->outbox_conns */
    struct psd_conn_s *next;
} psd_conn_t;

/* A request that waits: a pull for a version not reached yet, or a declare
 * waiting for the tensor's creation to commit. */
typedef struct psd_wait_s {
    psd_conn_t *conn;
    uint64_t req_id;
    uint64_t min_version;
    uint32_t codec;            /* pulls: the reply's encoding (none, fp16, bf16) */
    struct psd_wait_s *next;
    uint32_t flags;            /* pulls: PS_FLAG_DIRECT (the worker reads the store itself) */
    uint64_t asked_ns;         /* pulls, with --trace: when the request came (else 0) */
} psd_wait_t;

enum { SLOT_EMPTY = 0, SLOT_RECEIVING, SLOT_FULL, SLOT_APPLYING };

/* One join of one process: its host and pid namespace (a container's pid alone is often 1
 * everywhere), its pid, and shard 0's serial of the join (a second client of the process, or a
 * restarted container that reuses both, joins anew). A reconnect keeps all three. */
static inline uint64_t psd_conn_who(const psd_conn_t *c)
{
    return (c->host_id * 0x9E3779B97F4A7C15ull ^ c->pid) * 0xBF58476D1CE4E5B9ull ^ c->join_serial;
}

/* The push whose update a rank's slot of a chunk last committed: its sender and request, and the
 * batch it was for (ps_batch_key; 0: none said), so that a batch handed out again after its
 * worker died is not applied twice where it was (asp / ssp; push.c batch_applied_here). */
typedef struct {
    uint64_t who;
    uint64_t req;
    uint64_t batch;
} psd_done_t;

/* What a hello reply says this psd knows (shard 0's coordinator and the other shards alike):
 * PS_MSG_VALUES and PS_MSG_FORGET; it leaves a push holding a NaN or an infinity out; it
 * answers heartbeats that ask (PS_FLAG_ANSWER); its `count` is the tensors in its table
 * (PS_FLAG_TENSORS, psd_shard_tensors: libps tells a shard that lost its store by it); it
 * says its store's run (PS_FLAG_RUN, psd_hello_run: libps tells a shard restored alone by it);
 * shard 0 takes a batch done reported alone (PS_FLAG_REPORT); `step_max` is its highest chunk
 * version (PS_FLAG_STEPMAX, psd_hello_run: libps tells a store gone back to an older copy).
 * It keeps a floor of the next shard and says its own floor key (PS_FLAG_FLOOR, floor.h). */
#define PSD_HELLO_FLAGS \
    (PS_FLAG_VALUES | PS_FLAG_NONFINITE | PS_FLAG_ANSWER | PS_FLAG_TENSORS | PS_FLAG_RUN | \
     PS_FLAG_REPORT | PS_FLAG_STEPMAX | PS_FLAG_FLOOR)

/* asp / ssp: a chunk remembers the batch of the last push of each process whose rank another
 * process took (it left or died) for this many such changes: a replay of a dead worker's batch
 * that comes after its rank changed hands (even several times) is still known. */
#define PSD_ORPHAN_RING 64

/* A chunk's applied-push record as stored (key 'D'; asp / ssp): by rank, then the ring. */
typedef struct {
    psd_done_t done[PS_MAX_RANKS];
    uint64_t orphan[PSD_ORPHAN_RING]; /* batch keys, 0: empty */
    uint64_t orphan_next;             /* where the next one goes, mod PSD_ORPHAN_RING */
} psd_applied_t;



/* A slot filled by a direct push: its data is in the pusher's area (pushshm.c), referenced. */
typedef struct {
    const uint8_t *data;
    psd_area_t *area;
} psd_slot_ext_t;

/* One rank's slot of a chunk: the push it holds and what psd must know of it. Slots come in
 * groups of PSD_SLOT_GROUP ranks, allocated at the first push of any rank of the group to the
 * chunk and freed with the chunk: a slot's address is the receive callbacks' context, so it
 * never moves. Only the loop thread writes a slot; an apply job reads the slots of the ranks it
 * applies (psd_chunk_s applying_mask, sum_members), which the loop leaves alone meanwhile. */
typedef struct {
    psd_chunk_t *chunk;
    uint32_t rank;
    uint8_t state;             /* SLOT_* */
    bool map_failed;           /* ucp_mem_map of buf failed: not tried again for this buf */
    uint32_t crc;              /* the push header's CRC-32C of its payload */
    psk_codec_t codec;         /* payload encoding (PSK_CODEC_NONE: raw fp32) */
    uint8_t *buf;              /* push payload (raw fp32 or a codec's), allocated on first use */
    size_t cap;                /* bytes allocated */
    size_t len;                /* bytes received */
    ucp_mem_h memh;            /* buf registered with UCX at its first rendezvous receive
                                  (NULL: not registered: only eager pushes filled it) */
    psd_slot_ext_t ext;        /* a direct push's data instead (slot_data()); never written */
    uint64_t req;              /* req_id to acknowledge */
    uint64_t step;             /* the step the push is for */
    uint64_t who;              /* who pushed it: psd_conn_who() */
    uint64_t batch;            /* asp / ssp: the batch it is for (ps_batch_key; 0: none said) */
    uint64_t progress;         /* asp / ssp: samples applied before its batch was handed out,
                                  the lr schedule's position (UINT64_MAX: none said) */
    psd_conn_t *conn;          /* who to acknowledge */
    uint64_t arrived_ns;       /* with --trace: when the push's header came (else 0) */
} psd_slot_t;

#define PSD_SLOT_GROUP 4

/* bsp: steps back a chunk remembers whose batches each apply had, so that a batch handed out
 * again after its worker left mid-step is not applied twice (psd_shard_on_push). Re-handed
 * batches go first, but after many departures at once (the queue is first in, first out, one
 * batch per worker and step) one can wait many steps: 64 steps, 512 bytes a chunk. */
#define PSD_SUMMED_RING 64

/* asp / ssp: batches handed out again (tagged pushes) a chunk remembers taking, so that the
 * late push of one from the worker that held it before is known (psd_shard_on_push). */
#define PSD_AGAIN_RING 16

struct psd_chunk_s {
    uint32_t tensor, chunk;
    uint32_t n;                /* values */
    uint64_t version;          /* steps applied (committed) */
    uint64_t skipped;          /* bsp: of those, steps without an update (no member had a
                                  gradient, or every push replayed a batch the chunk had): the
                                  optimizer's update number is version - skipped + 1, as torch
                                  counts only the steps with a gradient. Read by jobs, written
                                  by the loop after them; kept in the 'D' record */
    uint64_t total_steps;      /* the tensor's planned steps (lr schedule); read by jobs */
    bool mean;                 /* its tensor's values are the mean of each step's pushes
                                  (PS_DECL_MEAN): no optimizer; read by jobs */
    psd_slot_t *slot_group[PS_MAX_RANKS / PSD_SLOT_GROUP]; /* ranks' slots by group of
                                  PSD_SLOT_GROUP (NULL: none of them pushed here yet) */
    float *agg;                /* [n] decode-and-sum buffer, allocated on the first compressed push */
    psd_applied_t *applied;    /* asp / ssp (NULL under bsp): by rank, the last push applied (a
                                  resend of it is acknowledged, not applied again), and the
                                  orphaned batches */
    uint32_t nfull;            /* slots in SLOT_FULL */
    uint64_t full_mask;        /* bit r: slot r is SLOT_FULL */
    uint64_t sum_members;      /* bsp: the step's members whose pushes the running job sums
                                  (skip_mask and nograd_mask left out; the job's thread takes
                                  out those holding a NaN or an infinity: apply_item) */
    uint64_t applying_mask;    /* bit r: slot r is one the running job applies (SLOT_APPLYING
                                  when the job was formed). The job's thread reads this, not
                                  slot_state, which the loop thread changes for other ranks
                                  meanwhile */
    uint32_t mean_of;          /* bsp: the running job's mean divides by this many members (those
                                  whose push is not a replay), set when the job was formed (a
                                  mean tensor's: again when apply_item leaves a push out) */
    uint64_t skip_mask;        /* bsp: bit r: rank r's push of this step replays a batch this
                                  chunk applied already (psd_shard_on_push): acknowledged, not
                                  summed */
    uint64_t nograd_mask;      /* bsp: bit r: rank r's push of this step has no gradient
                                  (PS_FLAG_NOGRAD): a zero in the mean, no data */
    uint64_t step_members;     /* bsp: the members of the step the running job applies */
    uint64_t stale_lack;       /* bsp: bit r: slot r's push came while a job applied its step
                                  without rank r, and that apply lacks its batch: if the step
                                  passes, it is acknowledged with PS_FLAG_STALE */
    bool applying;             /* a job holds this chunk (step_members is its members) */
    uint64_t summed[PSD_SUMMED_RING]; /* bsp: the members of step v's apply, at [v % ring]: whose
                                  batches the chunk has after it (summed then, or skipped as
                                  a replay of one it had) */
    uint64_t summed_from;      /* the first step whose summed entry is known (written by this
                                  psd, or loaded: run_apply stores changes of the members) */
    uint64_t progress;         /* bsp: samples applied before this step (0: use the version) */
    bool has_progress;
    bool queued;               /* on the ready list or in the running job */
    bool hash_checked;         /* its stored record matched its hash once since this psd
                                  loaded it: the first apply job checks (run_apply), so that a
                                  record damaged at rest is not sealed again with a fresh hash
                                  (relaxed atomics: jobs of one chunk run one at a time) */
    bool params_checked;       /* loop thread: a pull found its stored params matching their
                                  CRC-32C since this psd loaded it (params_damaged) */
    bool damage_logged;        /* loop thread: a pull found them damaged, and psd said so */
    bool params_odd;           /* loop thread: the last update here that wrote it left a
                                  parameter that is a NaN or an infinity with no such push (the
                                  optimizer overflowed, or it was so already); not known for a
                                  record loaded at start until an update writes it */
    bool read_by_peer;         /* a worker's CPU read its record out of the store since its
                                  last update (a direct pull, or a rendezvous reply the worker
                                  copied by cma): the next update streams its params to memory
                                  (store.h) and clears it; relaxed atomics (set on the loop,
                                  taken by apply jobs) */
    psd_wait_t *pulls;         /* pulls waiting for a higher version */
    uint64_t hash;             /* the committed record's XXH3-64 (integrity.c) */
    uint32_t leaf;             /* its leaf in the shard's Merkle tree */
    psd_chunk_t *next_ready;
    uint64_t again_key[PSD_AGAIN_RING];   /* asp / ssp: batches taken from tagged pushes (a
                                             batch handed out again; 0: empty), in memory only */
    uint64_t again_ranks[PSD_AGAIN_RING]; /* the ranks their tags named (bit r) */
    uint32_t again_next;                  /* where the next goes, mod PSD_AGAIN_RING */
};

/* A tensor created from the values its declarer sends (PSK_INIT_VALUES, declare.c): them as they
 * arrive, until its create job writes them. */
typedef struct {
    psd_conn_t *giver;         /* the declarer sending them (a reference; NULL once all came) */
    uint64_t gen;              /* bumped when another declarer takes over: a receive of the
                                  one before is dropped when it lands */
    uint32_t missing;          /* this shard's chunks not received yet */
    uint64_t last_ms;          /* psd_now_ms() of the ask or of the last chunk received: a giver
                                  that sends none for job.heartbeat_timeout_ms is passed over
                                  (psd_shard_values_cron) */
    float **buf;               /* [nchunks]: a chunk's values (malloc'd), NULL until received */
} psd_values_t;

typedef struct {
    bool present, ready;
    ps_decl_t decl;
    uint64_t numel;
    uint32_t nchunks;
    psd_chunk_t **chunks;      /* [nchunks]; NULL where another shard owns the chunk */
    psd_wait_t *declares;      /* declare replies waiting for creation to commit */
    uint64_t declared_ranks;   /* shard 0: bit r: rank r declared it since psd started (forget.c) */
    bool dropping;             /* a JOB_DROP deletes it (forget.c); declarations are refused */
    bool dropping_trained;     /* ... for psctl forget --trained (a checkpoint under way here
                                  fails: storejob.c drop_done) */
    psd_wait_t *forgets;       /* forget replies waiting for that job to commit */
    const psd_conn_t *forget_holder; /* shard 0: the forget whose check passed (forget.c):
                                  declarations of it by others are refused (PS_EBUSY) until its
                                  drop here, its connection closes, or forget_hold_until */
    uint64_t forget_hold_until; /* psd_now_ms() */
    psd_values_t *values;      /* init PSK_INIT_VALUES, until created: the values sent */
    bool steps_said;           /* shard 0: a declaration with another schedule length was said */
} psd_tensor_t;

/* A pull reply in flight: pins the snapshot its data lives in. */
typedef struct psd_snap_s {
    MDB_txn *txn;
    int refs;
    bool stale;
    struct psd_snap_s *next_free; /* retired snapshots keep their reset txn for reuse */
} psd_snap_t;

/* One send with the header bytes UCX 1.13 reads until completion. */
typedef struct psd_send_s {
    psd_server_t *srv;
    psd_conn_t *conn;
    psd_snap_t *snap;
    uint8_t *payload;          /* encoded pull reply (compressed pulls), kept with the struct */
    size_t payload_cap;
    size_t len;                /* outbox bundles: bytes of payload in use */
    uint32_t count;            /* outbox bundles: entries */
    uint8_t hdr[PS_WIRE_HDR_MAX];
    struct psd_send_s *next_free;
    /* Pull replies, with --trace: what psd_trace_pull says when the transfer ends. */
    uint32_t tensor, chunk;
    uint64_t version, asked_ns, answered_ns;
} psd_send_t;

/* A store job: create tensors' chunks, or apply a batch of ready chunks. Runs on
 * the libuv thread pool, one at a time (LMDB has one writer). */
typedef struct {
    uv_work_t work;
    psd_server_t *srv;
    int kind;                  /* JOB_CREATE, JOB_APPLY or JOB_DROP */
    uint32_t tensor;           /* JOB_CREATE, JOB_DROP */
    ps_decl_t decl;            /* JOB_CREATE, JOB_DROP: a copy the thread may read */
    uint64_t coord_step;       /* JOB_APPLY with coord_len: the state's open step (bsp) */
    uint64_t drop_gen;         /* JOB_DROP of a trained tensor: the shard's drop_gen it makes,
                                  written with it ("Mdropgen", floor.h); 0: none */
    psk_init_t init;           /* JOB_CREATE: its initializer (run_create) */
    uint64_t start_ns;         /* JOB_CREATE: when it was started (uv_hrtime), for the log */
    uint64_t begin_ns, end_ns; /* JOB_APPLY with --trace: its work (ps_trace_now), else 0 */
    psd_chunk_t **chunks;      /* JOB_CREATE: the tensor's chunk table (fixed while it runs) */
    float *const *values;      /* JOB_CREATE: the chunks' values sent (psd_values_t.buf), or
                                  NULL: the initializer makes them */
    uint32_t nchunks;
    psd_chunk_t **items;       /* JOB_APPLY: chunks whose SLOT_APPLYING slots to apply */
    uint32_t nitems;
    void *coord_state;         /* JOB_APPLY on shard 0: the coordinator's state to commit */
    size_t coord_len;
    void *coord_rec;           /* and its recovery state when it changed (psd_coord_rec) */
    size_t coord_rec_len;      /* 0: unchanged, not written */
    bool pooled;               /* runs on the libuv pool (not inline on the loop) */
    bool slow;                 /* PS_TEST_SLOW_APPLY (tests only): takes 2 s longer */
    uint64_t *hashes;          /* [nitems or nchunks] the records' new hashes, for job_done */
    uint64_t *bad;             /* [nitems] ranks whose raw push failed its CRC-32C (checked in
                                  the apply pass): that push, or under bsp the whole chunk's
                                  step, was not applied */
    uint64_t *nonfinite;       /* [nitems] ranks whose push held a NaN or an infinity: left out
                                  (bsp: as a push without a gradient; asp / ssp: an update
                                  that changed nothing), acknowledged PS_FLAG_NONFINITE */
    uint8_t *params_odd;       /* [nitems] what the update wrote: PSD_PARAMS_FINITE, _ODD (a
                                  NaN or an infinity though every push applied was finite), or
                                  _KEPT (no update: the record as it was) */
    const psd_chunk_hdr_t **olds; /* [nitems] JOB_APPLY: old records (read snapshot) */
    psd_chunk_hdr_t **recs;    /* [nitems] JOB_APPLY: their reserved new records;
                                  [nchunks] JOB_CREATE: the deferred chunks' records */
    uint32_t *deferred;        /* items (chunks) whose update runs on the fan-out */
    uint32_t cap_hashes;       /* capacity of hashes, bad, nonfinite, params_odd, olds, recs,
                                  deferred */
    int rc;
    char err[256];
} psd_job_t;

enum { JOB_CREATE = 1, JOB_APPLY = 2, JOB_DROP = 3 };
enum { PSD_PARAMS_FINITE = 0, PSD_PARAMS_ODD = 1, PSD_PARAMS_KEPT = 2 }; /* psd_job_t.params_odd */
/* A create_queue entry with this bit set: drop (JOB_DROP) the tensor, not create it. */
#define PSD_QUEUE_DROP 0x80000000u

#define PSD_MAX_TENSORS 65536 /* tensors per cluster */
#define PSD_INLINE_APPLY_BYTES (64u << 10) /* apply jobs up to this size run on the loop */
#define PSD_INLINE_RECORD_BYTES (8u << 20) /* and those of one record up to this size */
#define PSD_JOB_MAX_BYTES (8u << 20)      /* records one apply job takes at most, per thread
                                             of the fan-out */

typedef struct psd_coord_s psd_coord_t;

/* Work that must run alone in the store-job slot (checkpoint snapshots, chunk repairs):
 * queued with psd_shard_slot_queue(), it runs on the pool after the store job in progress and
 * before any other store job. The caller owns the struct; it must live until done ran. */
typedef struct psd_slot_work_s psd_slot_work_t;
typedef void (*psd_slot_work_cb)(psd_slot_work_t *w);
struct psd_slot_work_s {
    uv_work_t work;
    psd_server_t *srv;
    psd_slot_work_cb run;      /* on a pool thread, while no store job runs */
    psd_slot_work_cb done;     /* on the loop thread, after run */
    psd_slot_work_t *next;
};

struct psd_server_s {
    ps_manifest_t m;
    uint32_t shard, nshards;
    uint64_t chunk_elems;
    psk_optim_kind_t optim;
    uint32_t nstate;
    uv_loop_t *loop;
    ps_ucx_t ucx;
    ps_ucxprobe_t probe;         /* of ucx's shared-memory FIFOs, made at the first busy spell
                                    or failed connection (listen.c, psd_transport_check;
                                    closed: n 0) */
    bool probe_off;              /* it could not be made (logged): until the transport restarts */
    uint64_t probe_suspect_ns;   /* a peer that may have written into those FIFOs failed then
                                    (conn.c): probed while the worker is idle too (0: none) */
    ucp_listener_h listener;
    psd_store_t store;
    psd_run_t run;             /* the store's run (run.h), read once it is loaded */
    uint64_t joined_runs;      /* the runs digest of the last join a worker told of (its
                                  heartbeats: ps_runs_digest), or the restore's mark; 0: none */
    uint64_t joined_stored;    /* the one in the store */
    uint64_t joined_saving;    /* the digest joined_save is writing (0: none queued) */
    int joined_save_rc;        /* its result (written on the pool, read in its done) */
    psd_slot_work_t joined_save; /* writes joined_runs to the store (server.c) */
    psd_floor_rec_t floor;        /* the next shard's floor members told of (floor.c) */
    psd_floor_rec_t floor_stored; /* the one in the store */
    psd_floor_rec_t floor_saving; /* the one floor_save writes (run 0: none queued) */
    int floor_save_rc;            /* its result (written on the pool, read in its done) */
    psd_slot_work_t floor_save;   /* writes floor_saving to the store */
    uint64_t drop_gen;            /* trained tensors' drops made here ("Mdropgen", floor.h) */
    char store_path[256];      /* the store's absolute directory, told to workers for direct
                                  pulls (storeview.h); "" when PS_DIRECT_PULL=0 or too long */
    uint64_t store_id;         /* ps_storeview_file_id of its data file */
    psd_fanout_t fanout;       /* apply jobs' record updates run on its threads (run_apply) */
    psd_conn_t *conns;
    psd_conn_t **rank_owner;   /* [PS_MAX_RANKS] shards > 0: the connection of each rank */
    uint64_t silent_join[PS_MAX_RANKS]; /* asp / ssp, shards > 0: the join (serial) of each
                                   rank this shard last dropped as silent (0: none); a hello
                                   claiming it again is refused (server.c) */
    psd_coord_t *coord;        /* shard 0: membership, steps and batches (coord*.c) */
    psd_views_t views;         /* known membership epochs (memberviews.h) */

    psd_tensor_t *tensors;     /* [cap_tensors], indexed by id */
    uint32_t cap_tensors, ntensors; /* ntensors: 1 + highest present id */
    uint32_t *names;           /* [names_cap] the table's name index (psd_shard_tensor_named):
                                  id + 1 by name hash, linear probing; 0 empty; an entry whose
                                  tensor is absent or renamed is skipped */
    uint32_t names_cap, names_used;
    uint64_t next_chunk;       /* coordinator: first_chunk of the next new tensor */
    uint64_t area_need;        /* the push area bytes a worker's places of this shard's chunks
                                  take (each page-rounded, as libps places them): a direct
                                  push beyond is refused (psd_area_data) */
    uint64_t decl_bytes[PS_MAX_SERVERS]; /* by shard: the map bytes the present tensors'
                                  records take there (a lower bound, declare_too_big); the
                                  coordinator holds every tensor, so it knows every shard's */
    psd_chunk_t *ready_head, *ready_tail;
    uint64_t values_gen;       /* the last psd_values_t.gen handed out (declare.c) */
    uint32_t *create_queue;    /* tensor ids waiting for a JOB_CREATE (| PSD_QUEUE_DROP: a
                                  JOB_DROP) */
    uint32_t ncreate, cap_create;
    psd_job_t job;
    uint32_t cap_items;        /* capacity of job.items */
    bool job_running;
    bool job_inline;           /* a small apply job runs on the loop thread right now */
    psd_slot_work_t *slot_head, *slot_tail; /* psd_shard_slot_queue: waiting for the slot */
    bool slot_running;
    struct psd_ckpt_s *ckpt;   /* checkpoint and repair state (checkpoint.c), NULL until used */
    struct {                   /* this shard's parts of checkpoints since it started (copy_done):
                                  the metrics' psd_checkpoint_* */
        uint64_t copies, failed, cancelled;
        uint64_t last_step, last_bytes, last_ms; /* the last completed copy's */
        double last_unix;      /* when it completed (0: none yet) */
    } ckpt_stats;
    psd_snap_t *snap;          /* current pull snapshot, NULL until needed */
    ps_merkle_t merkle;        /* over the chunk hashes (integrity.c) */
    bool merkle_stale;         /* tensors created since it was laid out (integrity.c) */
    struct psd_export_s *xp;   /* export sessions and verify jobs (export.c), NULL until used */
    struct {                   /* sync.c: mdb_env_sync every m.sync_interval_s */
        uv_work_t work;
        bool running;
        int rc;
        uint64_t opened_ms, started_ms, last_ms; /* loop time; last_ms 0: not yet */
    } sync;
    struct {                   /* follower.c: shard 0's psctl checkpoint --follow child */
        pid_t pid;             /* 0: none running */
        uint64_t started_ms;   /* loop time of the last start */
        uint32_t starts;
        bool done;             /* it finished (the job is complete) or cannot run */
    } follower;
    psd_snap_t *free_snaps;
    psd_send_t *free_sends;
    psd_wait_t *free_waits;
    ps_trace_t *trace;        /* psd --trace FILE, or NULL */
    int bundling;              /* outbox.c: depth of psd_outbox_begin */
    psd_conn_t *outbox_conns;  /* connections with a bundle being filled */
    uint64_t bundles_sent, bundles_received;

    uv_signal_t sigint, sigterm, sighup;
    uv_timer_t cron;           /* heartbeat checks */
    bool stopping;
    bool stop_said;            /* psd_server_maybe_stop stopped the loop (once) */
    bool restarting;           /* transport_restart drains the listener: requests refused */
    uint64_t last_cron_ms;     /* psd_now_ms() of the last heartbeat check */
    void *echo_buf;            /* MSG_ECHO's landing place (contents dropped) */
    size_t echo_cap;
    uint32_t echo_busy;        /* receives landing in echo_buf now: it must not move */
    uint64_t applied_updates, pushes, pulls, direct_pulls, direct_pushes;
    /* The learning rate of the last update applied: 1 << 32 | its float's bits (apply threads
     * write it; 0: none yet). psd_last_lr reads it. */
    uint64_t last_lr;
    bool push_direct;          /* workers here may push through areas (PS_DIRECT_PUSH is not 0) */
    uint64_t crc_errors;       /* pushes rejected for a checksum mismatch */
    uint64_t nonfinite_pushes; /* pushes holding a NaN or an infinity, left out (apply_item) */
    uint32_t nonfinite_rank, nonfinite_tensor; /* the last such push's */
    uint64_t nonfinite_params; /* times an update with finite pushes left a chunk's parameters
                                  not finite (it was finite before, or not known: params_odd) */
    uint64_t f16_overflow_pulls; /* fp16 pull replies holding an infinity made of finite
                                    parameters (|x| >= 65520: pull.c) */
    uint64_t transport_restarts; /* times UCX was left stuck and started again (on_cron) */
    uint64_t conn_requests;      /* connection requests UCX delivered (on_conn_request) */
    char fatal[256];           /* why this shard stopped on its own ("": it did not) */
    char store_failing[300];   /* why a store job failed, until one of the same kind on the
                                  same tensor and chunk commits ("": none failing): /healthz
                                  503 with it (a full map applies nothing) */
    uint32_t failing_kind, failing_tensor, failing_chunk; /* that job's, with store_failing */
    uint64_t pinned_since_ms;  /* updates wait: the map filled while a reader held an old
                                  snapshot (storejob.c, store_pinned); 0: they do not */
    bool pinned_retry;         /* the cron's next tick tries them again (psd_store_pin_cron) */
    bool pinned_said;          /* the holder below was named stuck (logged once) */
    int pinned_pid, pinned_rank; /* the holder of the oldest snapshot at the last check, and its
                                  rank then (-1: none known) */
    uint64_t pinned_txnid;     /* its snapshot's */
    uint32_t pinned_changes;   /* checks in a row that found another holder */
    uint64_t store_failures;   /* store jobs that failed since psd started */
    struct psd_httpd_s *httpd; /* metrics.c: /metrics, /healthz, /status; NULL when off */
    const ps_auth_t *auth;     /* the cluster secret (main.c's); auth->on: every connection
                                  must prove it first (on_auth) */
    ps_auth_seen_t auth_seen;  /* proofs accepted, for replay refusal */
    uint64_t auth_refused;     /* connections whose proof was refused or missing */
    uint64_t conns_refused;    /* connection requests refused: PSD_PENDING_MAX were open */
    uint64_t bad_headers;      /* messages and bundle entries that did not decode (logged once
                                  per connection: bad_input_log) */
    uint64_t auth_forged;      /* headers on a proven connection without its session token
                                  (or not decodable): dropped */
    bool test_bad_seal;        /* PS_TEST_BAD_SEAL: seal with a wrong token (libps must drop) */
    bool test_no_floor;        /* PS_TEST_NO_FLOOR: answer as a psd before session 68 does (no
                                  PS_FLAG_FLOOR, no floor, drops not kept: floor.c) */
    uint32_t test_confused;    /* PS_TEST_CONFUSED: 1 shard 0 answers a new declaration with
                                  its first dimension doubled, 2 a pull of a chunk 0 is first
                                  answered by a declare reply, 3 a pull reply of a chunk 0 names
                                  the version before its chunk's (libps must refuse, or
                                  ignore) */
    double started_unix;       /* time() at the start, for psd_start_time_seconds */
    uint64_t replays_skipped;  /* bsp: pushes of a batch handed out again that a chunk had
                                  applied already (acknowledged, not applied again) */
    uint64_t stale_acks;       /* bsp: pushes of a step a chunk had passed without their batch
                                  (acknowledged with PS_FLAG_STALE, not applied) */
    uint64_t replay_warned;    /* the replay tag + 1 last logged as not remembered */
    uint64_t sp_step;          /* bsp: the highest step a member pushed a chunk here for, */
    uint64_t sp_mask;          /* the ranks that pushed one of it here, */
    uint64_t sp_first_ms;      /* and when the first did (uv_now): job.step_timeout_ms */
    uint64_t late_drops;       /* members dropped for holding the others (shard 0) */
    uint64_t late_floor_ms;    /* a late cron's time (uv_now): no member is late before
                                  step_timeout_ms after it (coord.c) */
    uint32_t test_corrupt_pull; /* PS_TEST_CORRUPT_PULL (tests only): corrupt every Nth pull reply */
    uint32_t test_clock_ahead_s; /* PS_TEST_CLOCK_AHEAD_S (tests only): proofs checked as if
                                    this shard's clock ran that far ahead */
    uint64_t test_pull_count;
    uint32_t test_crash_after_apply; /* PS_TEST_CRASH_AFTER_APPLY (tests only): SIGKILL itself
                                        after the Nth apply job commits, before its acks */
    uint32_t test_crash_after_batch; /* PS_TEST_CRASH_AFTER_BATCH (tests only): SIGKILL itself
                                        at the first push received after the Nth batch handed
                                        out (test_crash_armed: that batch was handed out) */
    bool test_crash_armed;
    uint32_t test_crash_finish_save; /* PS_TEST_CRASH_FINISH_SAVE (tests only): SIGKILL itself
                                        in the save of the Nth asp / ssp answer that ends a
                                        worker's run (the job complete, or its max_steps) */
    uint32_t test_crash_close_save; /* PS_TEST_CRASH_CLOSE_SAVE (tests only): SIGKILL itself in
                                   the write of the coordinator's state that holds the last report
                                   of a step handed out again (coord.c), once */
    uint32_t test_crash_join_save; /* PS_TEST_CRASH_JOIN_SAVE (tests only): SIGKILL itself in the
                                   write of the coordinator's state that holds the Nth bsp
                                   hand-out bringing in a member the step before lacked */
    uint32_t test_fail_create; /* PS_TEST_FAIL_CREATE (tests only): the Nth tensor creation
                                  fails (its transaction is not committed); read and counted
                                  down by the create job only */
    uint32_t test_fail_handout_save; /* PS_TEST_FAIL_HANDOUT_SAVE (tests only): the write of the
                                   coordinator's state that holds the Nth asp / ssp hand-out
                                   fails (as if the store refused it), once */
    uint32_t test_slow_apply;   /* PS_TEST_SLOW_APPLY (tests only): step + 1 whose first bsp
                                   apply job runs on the pool and takes 2 s longer (0: none) */
    const char *test_slow_apply_hold; /* PS_TEST_SLOW_APPLY_HOLD=FILE (tests only): that apply
                                   job waits while FILE exists (up to 60 s) instead of 2 s, so
                                   that a test releases it after what it waits for, not on a
                                   clock a loaded host can miss (NULL: 2 s) */
    uint32_t test_lose_ack;     /* PS_TEST_LOSE_ACK (tests only): the Nth push acknowledgement
                                   is not sent and its connection is closed */
    uint32_t test_ckpt_hold_ms; /* PS_TEST_CKPT_HOLD_MS (tests only): a checkpoint's hold ends
                                   after this many ms instead of 10 s (0: 10 s) */
    uint32_t test_slow_copy_ms; /* PS_TEST_SLOW_COPY_MS (tests only): each checkpoint copy
                                   takes this many ms longer (at most 60000; 0: none) */
    uint32_t test_copy_read_fail; /* PS_TEST_COPY_READ_FAIL (tests only): the next checkpoint
                                     copy's Nth read of the store fails (MDB_CORRUPTED) */
    uint32_t test_refuse_push;  /* PS_TEST_REFUSE_PUSH (tests only): the Nth compressed push
                                   chunk is refused (PS_ENOMEM, naming the chunk) */
    uint32_t test_late_rndv;    /* PS_TEST_LATE_RNDV (tests only): the Nth rendezvous push's
                                   connection is closed while it lands, and its receive's end
                                   is seen 3 s late (test_late_*) */
    psd_slot_t *test_late_ref;  /* that receive, until psd_shard_test_tick passes its end on */
    uint64_t test_late_due_ms;  /* psd_now_ms() from when (0: it has not ended yet) */
    uint64_t test_late_req;     /* its push's request id */
    ucs_status_t test_late_status;
    uint32_t test_drop_hello;   /* PS_TEST_DROP_HELLO (tests only): workers (by pid) whose
                                   first hello is still to drop unanswered */
    uint32_t test_dropped_pid[8]; /* the workers whose hello was dropped */
};

/** @brief The buffer size psd_status_json needs at most. */
size_t psd_status_cap(void);
/**
 * @brief This shard's status as one JSON object (what `psctl status --json` shows of it):
 *  counters, store, integrity, sync, and shard 0's job and members.
 * @param out  the caller's buffer of @p cap bytes (psd_status_cap()); NUL-terminated.
 * @return its length (at most cap - 1: cut short when it did not fit).
 */
size_t psd_status_json(psd_server_t *srv, char *out, size_t cap);

/** @brief The learning rate of the last update this shard applied (the job's schedule at that
 *  update's position; not of a mean tensor) into *@p lr. @return false (none yet) before the
 *  first. Any thread (apply.c). */
bool psd_last_lr(const psd_server_t *srv, double *lr);

/** @brief Milliseconds of a monotonic clock read now (not the loop's cached time). */
static inline uint64_t psd_now_ms(void) { return uv_hrtime() / 1000000u; }

/* outbox.c */
/** @brief From now until the matching psd_outbox_end, small messages to workers that fuse are
 *  collected per connection (nests). */
void psd_outbox_begin(psd_server_t *srv);
/** @brief End one psd_outbox_begin; the outermost sends every collected bundle. */
void psd_outbox_end(psd_server_t *srv);
/**
 * @brief Append @p msg (and @p dlen bytes of @p data, copied) to @p conn's bundle.
 * @return 0 when it is queued; otherwise nothing was queued and the caller sends it alone
 *         (not inside begin/end, fusion off, the peer does not fuse, or too large).
 */
int psd_outbox_add(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg, const void *data,
                   size_t dlen);
/** @brief Send @p conn's collected bundle now (before a message that must follow it). */
void psd_outbox_flush(psd_server_t *srv, psd_conn_t *conn);

/* storejob.c */
/** @brief The cron's tick: updates that wait for a reader's old snapshot (an apply job failed
 *  with the map full while one pinned it) are tried again. */
void psd_store_pin_cron(psd_server_t *srv);

/** @brief ps_strerror(@p rc), but for a full store while updates wait for an old snapshot:
 *  then that (not "raise map_size_mb"). A static string. */
const char *psd_store_strerror(const psd_server_t *srv, int rc);

/* direct.c */
/** @brief Decide whether workers may read this shard's store in @p data_dir directly (not when
 *  PS_DIRECT_PULL=0): sets store_path and store_id. Call once the store is open. */
void psd_direct_init(psd_server_t *srv, const char *data_dir);
/** @brief Fill a hello reply's store and store_id, for a worker on this host (@p hello's
 *  store_id is its ps_storeview_host_id); nothing when direct pulls are off. */
void psd_hello_store(const psd_server_t *srv, const ps_msg_t *hello, ps_msg_t *reply);
/** @brief The highest version of any chunk here (0 when none): one walk of the chunks. */
uint64_t psd_shard_step_max(const psd_server_t *srv);
/** @brief Fill a hello reply's run, run_origin and run_base from the store's run (run.h),
 *  joined_runs, step_max (the highest chunk version here: one walk of the chunks), the next
 *  shard's floor and this shard's floor key (floor.h). */
static inline void psd_hello_run(const psd_server_t *srv, ps_msg_t *reply)
{
    reply->run = srv->run.id;
    reply->run_origin = srv->run.origin;
    reply->run_base = srv->run.base_step;
    reply->joined_runs = srv->joined_runs;
    reply->step_max = psd_shard_step_max(srv);
    psd_floor_hello(srv, reply);
}
/** @brief Free the LMDB read slots of processes that exited while reading the store (a worker
 *  killed during a direct pull would otherwise keep old pages from reuse). Loop thread: on
 *  every dropped connection and every cron tick. */
void psd_direct_reap(psd_server_t *srv);

/* pushshm.c */
/** @brief Whether direct pushes are allowed here (PS_DIRECT_PUSH is not "0"). */
bool psd_push_direct_enabled(void);
/** @brief For a worker on this host (@p hello's store_id is its ps_storeview_host_id): give
 *  @p c a push area if it has none (when srv->push_direct) and name it in the hello @p reply
 *  (pid, area_fd, area_id, area_size); nothing when none could be made. */
void psd_hello_area(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *hello, ps_msg_t *reply);
/** @brief @p len bytes at @p offset of @p c's area, or NULL (with *@p why) when it has none, the
 *  offset is not 64-byte aligned or the bytes are not all inside its first @p need bytes (what
 *  a worker's places of this shard's chunks take: srv->area_need). *@p area: the area. */
const uint8_t *psd_area_data(psd_conn_t *c, uint64_t offset, uint64_t len, uint64_t need,
                             psd_area_t **area, const char **why);
/** @brief Take a reference on @p a (a slot that points into it holds one until psd__slot_empty);
 *  loop thread only, like psd_area_unref. */
void psd_area_ref(psd_area_t *a);
/** @brief Drop a reference; the last one unmaps and closes it. NULL is ignored. */
void psd_area_unref(psd_area_t *a);

/* server.c */
/** @brief UCX send callback of a psd_send_t without a snapshot (a header, a bundle): drops its
 *  connection reference and returns it to srv->free_sends (its payload buffer kept). */
void psd_send_done(void *request, ucs_status_t status, void *user_data);
/** @brief Send a reply header (no data) to @p conn; drops it if the conn is dead. */
/**
 * @brief Pack @p msg for @p conn into @p buf (@p cap bytes): sealed with the connection's
 *  session token when it proved the cluster secret (libps drops a message from a shard
 *  without its connection's token). Every header psd sends goes through here.
 * @return 0, or PS_EINVAL when it does not fit.
 */
int psd_encode(const psd_server_t *srv, const psd_conn_t *conn, const ps_msg_t *msg,
               uint8_t *buf, size_t cap, size_t *len);
void psd_send_msg(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg);
/** @brief Send MSG_ERROR for request @p req_id. */
void psd_send_error(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, int status,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/** @brief psd_send_error for a request about chunk (@p tensor, @p chunk) of a push: the reply
 *  names the chunk (PS_FLAG_CHUNK), and says psd holds nothing of that push. */
void psd_send_chunk_error(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, uint32_t tensor,
                          uint32_t chunk, int status, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/** @brief Send MSG_ERROR with status PS_ECRC naming chunk (@p tensor, @p chunk), so the peer
 *  can tell which part of request @p req_id to send again; @p what is "push" or the like. */
void psd_send_crc_error(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, uint32_t tensor,
                        uint32_t chunk, const char *what);

/* ---- conn.c: the connections --------------------------------------------- */

/** @brief Take a reference to @p c (a send or receive in flight): it is freed only once
 *  closed (dead, no endpoint) and every reference is given back. */
void psd_conn_ref(psd_conn_t *c);
/** @brief Give back a reference taken by psd_conn_ref; frees @p c when it was the last one
 *  and @p c is closed. */
void psd_conn_unref(psd_conn_t *c);
/** @brief Free @p c (unlink it, drop its push area) when it is closed and unreferenced. */
void psd_conn_free_if_done(psd_conn_t *c);
/** @brief @p c's rank is free again (the coordinator is told on shard 0): @p why for the log,
 *  @p may_return whether the same worker may come back for it (a lost connection). */
void psd_conn_release_rank(psd_server_t *srv, psd_conn_t *c, const char *why, bool may_return);
/** @brief UCX's connection handler of the listener (@p arg the server): a new connection,
 *  or the request refused when stopping or PSD_PENDING_MAX without a rank are open and none
 *  has been idle long enough to close. Its endpoint is made by psd_conns_deferred. */
void psd_conn_on_request(ucp_conn_request_h req, void *arg);
/** @brief The loop's deferred hook (outside UCX callbacks): endpoints for new connections,
 *  lanes logged after a hello, queued closes. Nonzero when it did something. */
int psd_conns_deferred(ps_ucx_t *u);
/** @brief The live connection whose endpoint is @p ep, or NULL. */
psd_conn_t *psd_conn_by_ep(psd_server_t *srv, ucp_ep_h ep);
/** @brief Close every connection with an endpoint (the stop, a transport restart); their
 *  ranks may come back as after any lost connection. */
void psd_conns_close_all(psd_server_t *srv);
/** @brief The cron's deadlines at @p now (psd_now_ms): a connection without a rank that gave
 *  no proof of the secret or said nothing in time, a member silent past
 *  job.heartbeat_timeout_ms, queued for closing. @return whether any was. */
int psd_conns_cron(psd_server_t *srv, uint64_t now);

/* ---- listen.c: the listener ---------------------------------------------- */

/** @brief Whether this shard's and its metrics' addresses can be listened on, before psd
 *  makes anything on disk: 0, or PS_ETRANSPORT / PS_ECONFIG with @p err said. */
int psd_listen_probe(psd_server_t *srv, char *err, size_t errlen);
/** @brief Listen on this shard's address with the current UCP worker (srv->listener): 0, or
 *  PS_ECONFIG / PS_ETRANSPORT with @p err said. */
int psd_listen_start(psd_server_t *srv, char *err, size_t errlen);
/** @brief At a stop, before the listener goes: let UCX deliver (and this shard refuse) the
 *  connection requests it is reading, until none came for 30 ms (at most 1 s). */
void psd_listen_drain(psd_server_t *srv);
/** @brief From the cron: start the transport again (every connection closed, a new UCP worker,
 *  the same address) when UCX has been stuck past a third of the heartbeat timeout. */
void psd_transport_check(psd_server_t *srv);

/** @brief Refuse operator request @p msg (PS_ECONFIG to @p c, naming both clusters) when it
 *  names another cluster than this shard's; with @p none_ok one naming none passes (an older
 *  psctl's: before session 42 only scale and launch named theirs). Returns whether it refused.
 *  Before, export, verify and checkpoint with another cluster's manifest went through. */
bool psd_refuse_other_cluster(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg,
                              bool none_ok);
/** @brief The shutdown check: called when the store goes idle. */
void psd_server_maybe_stop(psd_server_t *srv);

/* a shard's data path: shard.c, declare.c, pull.c, push.c, storejob.c */
/** @brief Load the tensor table and chunk versions from the store. */
int psd_shard_load(psd_server_t *srv);
/** @brief bsp: the ranks whose pushes the apply of step @p step summed, by a chunk's stored
 *  applied record (@p val, @p len bytes; key 'D', any form psd wrote) on a chunk at
 *  @p version, into @p members. Returns false when the record does not tell (an asp record,
 *  another form, a step it does not cover); reads @p val only. */
bool psd_shard_summed_members(const void *val, size_t len, uint64_t version, uint64_t step,
                              uint64_t *members);
/** @brief Free the in-memory tensor table and chunk buffers. */
void psd_shard_free(psd_server_t *srv);
void psd_shard_on_declare(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg);
/** @brief Handle MSG_PUSH; returns the status the AM handler returns to UCX. */
ucs_status_t psd_shard_on_push(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg,
                               void *data, size_t length, const ucp_am_recv_param_t *param);
void psd_shard_on_pull(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg);
/** @brief Forget @p conn in waiting lists (it died). */
void psd_shard_drop_conn(psd_server_t *srv, psd_conn_t *conn);

/** @brief After ps_ucx_restart: every push whose rendezvous receive the old worker held and
 *  never finished is failed (its slot is free again; the worker sends it again once it has
 *  reconnected). Loop thread. */
void psd_shard_receives_lost(psd_server_t *srv);
/** @brief From the cron: PS_TEST_LATE_RNDV's receive, whose end is due now, is passed on. */
void psd_shard_test_tick(psd_server_t *srv);
/** @brief A declarer asked for a tensor's values that sent none for job.heartbeat_timeout_ms
 *  (its connection up: a stuck or hostile peer) is passed over, as one that left: the next
 *  declarer waiting is asked (or psd initializes the tensor). Loop thread, from the cron. */
void psd_shard_values_cron(psd_server_t *srv, uint64_t now_ms);
/**
 * @brief Queue @p w for the store-job slot (see psd_slot_work_t); w->srv, run and done must be
 *  set. @note @p w is borrowed until its done callback has run.
 */
void psd_shard_slot_queue(psd_server_t *srv, psd_slot_work_t *w);
/** @brief Release the UCX registrations of the push slots (before the UCX context goes). */
void psd_shard_unregister(psd_server_t *srv);
/** @brief Start the next store job if none runs (chunks made ready inside a bundle wait for
 *  this, so that they are applied in one transaction). */
void psd_shard_kick(psd_server_t *srv);

/** @brief True when no store job runs or waits. */
bool psd_shard_idle(psd_server_t *srv);
/* What this shard holds (psd_shard_totals): status and /metrics. */
typedef struct {
    uint32_t tensors;
    uint64_t chunks, state_bytes; /* state_bytes: params + optimizer state + record headers */
    uint64_t version_min, version_max; /* 0 with no chunks */
    uint32_t untrained;       /* bsp, once a chunk here passed step 1: tensors with chunks here
                                 that no push reached (psd_shard_tensor_used): no member has
                                 them, and they hold this shard's step at 0 (psctl forget) */
    uint32_t untrained_first; /* the first of them (its id), when untrained > 0 */
    uint32_t behind;          /* bsp: tensors a push reached whose chunks here are all
                                 PSD_BEHIND_STEPS or more behind the step (shard 0: the
                                 coordinator's; else the highest chunk version here): no
                                 member pushes them (a model that lost them), and they hold the
                                 shard's step back (psctl forget --trained) */
    uint32_t behind_first;    /* the first of them (its id), when behind > 0 */
    uint64_t behind_first_step; /* its lowest chunk version here */
    uint64_t odd_chunks;      /* chunks whose last update left a parameter not finite with
                                  finite pushes (psd_chunk_t.params_odd) */
    uint32_t odd_first;       /* the first tensor holding one (its id), when odd_chunks > 0 */
} psd_shard_totals_t;
/* Steps a trained tensor's chunks lag the job's before psd_shard_totals names them: under bsp a
 * member pulls every tensor it pushes at the next step, so one it pushes is never 2 behind. */
#define PSD_BEHIND_STEPS 2
/** @brief Count this shard's tensors, chunks and state bytes into @p t (one walk of them). */
void psd_shard_totals(const psd_server_t *srv, psd_shard_totals_t *t);
/** @brief Append this shard's tensors and chunks as JSON members to @p out (status). */
void psd_shard_status_json(psd_server_t *srv, char *out, size_t cap, size_t *len);
/** @brief Lowest chunk version of this shard (its step), or 0 with no chunks. */
uint64_t psd_shard_step(psd_server_t *srv);
/** @brief bsp: the lowest version of this shard's chunks at @p from or past it (@p from when
 *  none is): with @p from a committed open step, the chunks below it are tensors no member
 *  pushes (every member's pushes of step @p from - 1 were acknowledged here before it opened),
 *  which say nothing of what the members' step applied (psd_coord_create). */
uint64_t psd_shard_step_from(psd_server_t *srv, uint64_t from);
/** @brief How many tensors this shard's table holds (every shard holds the cluster's). */
uint32_t psd_shard_tensors(const psd_server_t *srv);
/** @brief Learn membership epoch @p epoch (members from @p from_step on; @p closed: of step
 *  @p from_step only, which the coordinator closed, PS_FLAG_CLOSED); chunks that became
 *  complete under it are applied. Known epochs only lower an open view's from_step. */
void psd_shard_learn_view(psd_server_t *srv, uint64_t epoch, uint64_t from_step, uint64_t members,
                          bool closed);
/** @brief The members of bsp step @p step as this shard knows them (0: none known). */
uint64_t psd_shard_members(const psd_server_t *srv, uint64_t step, uint64_t *epoch);
/** @brief Highest membership epoch this shard knows (0: none). */
uint64_t psd_shard_epoch(const psd_server_t *srv);

/** @brief The present tensor named @p name here, or NULL. */
psd_tensor_t *psd_shard_tensor_named(psd_server_t *srv, const char *name);
/** @brief Whether any push ever reached a chunk of @p t on this shard since it was created
 *  (a version above 0, a rank's slot, a queued or running apply, a pull waiting for a later
 *  version); if so, one line naming the chunk in @p why. */
bool psd_shard_tensor_used(const psd_server_t *srv, const psd_tensor_t *t, char *why, size_t len);
/** @brief psd_shard_tensor_used() but for the updates applied: whether pushes, an apply or a
 *  pull of @p t are under way here (psctl forget --trained waits for them). */
bool psd_shard_tensor_busy(const psd_server_t *srv, const psd_tensor_t *t, char *why, size_t len);
/** @brief Drop tensor @p id (ready; not used, psd_shard_tensor_used, or for psctl forget
 *  --trained not busy, psd_shard_tensor_busy) from this shard: a store job deletes its
 *  records, then it leaves the table (its id and chunk ordinals are not handed out again
 *  while psd runs) and @p conn gets PS_MSG_FORGET_REPLY (PS_FLAG_DONE) for
 *  @p req_id, or the error. Declarations of its name are refused meanwhile. A reference to
 *  @p conn is taken. @return 0 or PS_ENOMEM (nothing queued, nothing answered). */
int psd_shard_drop(psd_server_t *srv, uint32_t id, psd_conn_t *conn, uint64_t req_id);

/**
 * @brief PS_MSG_VALUES: the values of a chunk of a tensor whose declaration by @p conn creates
 *  it here (init PSK_INIT_VALUES). Received (@p data, @p length: an Active Message's, eager or
 *  rendezvous) into a buffer of their own and answered (PS_MSG_VALUES_REPLY or the error);
 *  once every chunk of this shard came, the tensor's create job writes them.
 */
ucs_status_t psd_shard_on_values(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg,
                                 void *data, size_t length, const ucp_am_recv_param_t *param);

/* forget.c */
/** @brief PS_MSG_FORGET: drop a tensor never pushed (see forget.c); answers @p msg. */
void psd_forget_on_msg(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg);
/** @brief Whether shard 0 holds @p t for a forget other than @p conn's (its check passed and
 *  its drop has not come yet): a declaration of @p t from @p conn is refused meanwhile. */
bool psd_forget_held(const psd_tensor_t *t, const psd_conn_t *conn);

/* the coordinator (shard 0 only): coord.c and the modules coord_internal.h lists */
/** @brief Create the coordinator; restores its state from @p saved (NULL: a fresh job) and
 *  what failures had left to settle from @p rec (key "jobrec"; NULL: nothing). Both are
 *  copied, and must be aligned for uint64_t (older forms are read in place). @return 0 or
 *  PS_ENOMEM. */
int psd_coord_create(psd_server_t *srv, const void *saved, size_t saved_len, const void *rec,
                     size_t rec_len);
void psd_coord_free(psd_server_t *srv);
/** @brief A worker said hello: admit it (a new rank) or take it back (its rank, after a
 *  restart of this shard). Sends the reply or an error. */
void psd_coord_on_hello(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg);
void psd_coord_on_batch(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg);
/** @brief bsp: the open step, 0 until the job's first step was applied; asp / ssp: 0. */
uint64_t psd_coord_bsp_step(const psd_server_t *srv);
/** @brief The job's members now (ranks that hold a place in it). */
uint32_t psd_coord_members(const psd_server_t *srv);
/** @brief The workers the job wants (job.workers, then psctl scale's, kept with the job); the
 *  manifest's job.workers on a shard other than 0. */
uint32_t psd_coord_desired(const psd_server_t *srv);
/** @brief A member's leave that carries its last batch done (PS_FLAG_DONE, as a batch request
 *  would): count it before the member goes. Shard 0 only; answers nothing. */
void psd_coord_on_leave_done(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg);
void psd_coord_on_scale(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg);
void psd_coord_on_launch(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg);
/** @brief @p c left (leave), died or fell silent: its rank leaves the job. With
 *  @p may_return (its connection closed; it did not say leave nor fall silent) a member whose
 *  process may still run keeps its rank for heartbeat_timeout_ms, for that process to say
 *  hello again. */
void psd_coord_on_gone(psd_server_t *srv, psd_conn_t *c, const char *why, bool may_return);
/** @brief Every cron tick: members that did not come back after a restart of this shard or
 *  after their connection closed (or whose process ended since), launch grants. */
void psd_coord_tick(psd_server_t *srv);
/** @brief The cron found this loop stalled (a SIGSTOP, a descheduled host): members whose
 *  connection closed get their whole grace again from now, as silent ones get a period. */
void psd_coord_stalled(psd_server_t *srv);
/** @brief Append the coordinator's members, epoch, step and batches as JSON members. */
void psd_coord_status_json(psd_server_t *srv, char *out, size_t cap, size_t *len);
/** @brief Append the job's metrics (membership, workers, samples applied...) to @p p. */
void psd_coord_metrics(psd_server_t *srv, psd_prom_t *p);
/**
 * @brief psctl checkpoint: pick the checkpoint's step and hold the hand-out of later steps until
 *  psd_coord_ckpt_release() (or CKPT_HOLD_MS), so that every shard learns the step before any
 *  of its chunks can pass it. bsp: the open step + 1 while it has members, else the open step
 *  (nothing is being applied); @p flags and @p pending 0; checkpoint @p id (0: none) is a
 *  user of the hold, as under asp / ssp, so that a second checkpoint asked for meanwhile (by
 *  hand beside psd's follower) shares it.
 *  asp / ssp: UINT64_MAX (no common step: each shard now); no batch is handed out while the
 *  hold lasts, and while batches handed out before are not reported yet (*@p pending of them)
 *  @p flags gets PS_FLAG_PENDING: ask again (each ask keeps the hold), and arm the shards only
 *  once none is, so that the shards' snapshots hold the same batches (a cut). That answer makes
 *  checkpoint @p id (psctl's random number; asked again, the same one) a user of the hold until
 *  its psd_coord_ckpt_release_until(), or CKPT_HOLD_MS after its last ask.
 *  @p conn: the connection the ask came on (not kept beyond psd_coord_drop_conn of it): a user
 *  is dropped when it closes (its psctl died), and a hold nobody uses or asks for then ends.
 */
uint64_t psd_coord_ckpt_hold(psd_server_t *srv, uint64_t id, const psd_conn_t *conn,
                             uint32_t *flags, uint32_t *pending);
/** @brief Release the hold of psd_coord_ckpt_hold() (a no-op without one), and a hold ahead. */
void psd_coord_ckpt_release(psd_server_t *srv);
/** @brief Connection @p c closes. @p peer_gone (its peer died or closed it: a psctl that ended
 *  or died): the checkpoints that asked over it and have not sent their GO stop using the
 *  hold, a hold ahead it asked for is forgotten, and a hold (or a hold ahead) that no
 *  checkpoint uses or asks for any more ends now instead of at its CKPT_HOLD_MS lapse. Not
 *  @p peer_gone (this shard closes every connection: its transport started again, or it
 *  stops): its psctl may live and connect again, so its checkpoints keep the hold until their
 *  GO or lapse, as before; only the pointer to @p c goes. Shard 0 only (a no-op elsewhere);
 *  loop thread. */
void psd_coord_drop_conn(psd_server_t *srv, const psd_conn_t *c, bool peer_gone);
/**
 * @brief bsp: a checkpoint at @p step (psctl checkpoint --follow). At the natural step, as
 *  psd_coord_ckpt_hold(); later, a hold ahead: the hand-out of @p step waits when the job gets
 *  there (the CKPT_HOLD_MS limit runs from then), and @p flags gets PS_FLAG_PENDING (ask again);
 *  the job finished before it: PS_FLAG_FINISHED, nothing held. @p conn as for
 *  psd_coord_ckpt_hold() (a hold ahead ends when the connection that asked for it closes).
 * @return 0; PS_ECONFLICT when the job is past @p step, PS_EINVAL under asp / ssp (@p err).
 */
int psd_coord_ckpt_hold_at(psd_server_t *srv, uint64_t step, uint64_t id,
                           const psd_conn_t *conn, uint32_t *flags, char *err, size_t errlen);
/** @brief psd_coord_ckpt_release(), then a hold ahead at step @p next when it is > 0 and not
 *  reached yet (so the job cannot pass the follower's next checkpoint unnoticed). Checkpoint
 *  @p id stops using the hold, which ends only once no checkpoint told to arm under it is left
 *  (one that gave up waiting or arming ends no other one's hold; bsp: @p next is then held
 *  ahead once the hold ends).
 * @return asp / ssp: true when @p id was a user of the hold until now, i.e. no batch was handed
 *  out since its drained answer and the shards it armed meanwhile hold a cut; false when the
 *  hold lapsed for it (CKPT_HOLD_MS without an ask, pushed out, or shard 0 started again since).
 *  bsp: true. @p conn: the GO's connection, which asked for the hold ahead at @p next (it
 *  ends when that connection closes, psd_coord_drop_conn). */
bool psd_coord_ckpt_release_until(psd_server_t *srv, uint64_t next, uint64_t id,
                                  const psd_conn_t *conn);
/* The most bytes psd_coord_state_pack and psd_coord_rec give, and a stored state can hold. */
#define PSD_COORD_STATE_MAX 65536
#define PSD_COORD_REC_MAX 16384
/** @brief The coordinator's state as the store keeps it (key "job", written with each apply),
 *  copied into @p out, which the caller owns (PSD_COORD_STATE_MAX bytes; fewer are written:
 *  the members of ranks that joined and the batches waiting to go out again).
 *  @return the bytes written. Loop thread. */
size_t psd_coord_state_pack(psd_server_t *srv, void *out);
/** @brief Its recovery state (key "jobrec") when it changed since a save took it, else NULL:
 *  the caller's apply job writes it with the state; the bytes stay the coordinator's (copy
 *  them now). */
const void *psd_coord_rec(psd_server_t *srv, size_t *len);
/** @brief The apply job that took psd_coord_rec's copy failed: the next one takes it again. */
void psd_coord_rec_unsaved(psd_server_t *srv);
/** @brief bsp: an apply job that wrote the coordinator's state of open step @p step committed
 *  here: a restart derives that step's close from this shard's chunks (psd__close_step). */
void psd_coord_state_committed(psd_server_t *srv, uint64_t step);

#endif
