/* client_internal.h: libps's state and the functions its modules share (ps__, hidden from
 * libps.so's exports). libps is one client object (ps_client_t) run by a communication thread;
 * its modules:
 *   client.c      the comm thread: completion, sending, fusion into bundles, the direct push
 *                 and pull paths' use, receiving, the thread's loop;
 *   shardloss.c   the comm thread: losing and regaining a shard (reconnects, re-hellos,
 *                 heartbeats, silent shards, transport restarts, membership views);
 *   samehost.c    the comm thread: a same-host shard's store view (direct pulls) and push
 *                 area (direct pushes);
 *   resolve.c     the shards' name lookups, off the comm thread;
 *   client_api.c  the caller's thread: ps_client.h's functions;
 *   declare.c     the caller's thread: declarations (a tensor on every shard, its values).
 * What the comments call "comm thread" code runs under loop_mu (client.c's head comment). */
#ifndef PS_CLIENT_INTERNAL_H
#define PS_CLIENT_INTERNAL_H

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <netdb.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>

#include "bundle.h"
#include "codec.h"
#include "crc32c.h"
#include "hash.h"
#include "init.h"
#include "manifest.h"
#include "place.h"
#include "ps/ps_client.h"
#include "ps/ps_log.h"
#include "storeview.h"
#include "sockhooks.h"
#include "tracefile.h"
#include "tcpguard.h"
#include "ucx_loop.h"
#include "views.h"
#include "authmsg.h"
#include "wire.h"


#define PS_CLIENT_MAX_TENSORS 65536 /* as psd's PSD_MAX_TENSORS */
/* Rendezvous push chunks of one op in flight to one shard at a time, where the transport
 * interleaves concurrent transfers (tcp, RDMA): with all of them in flight every chunk lands at
 * the end, and the shard can apply none of them before the last byte. CMA reads one rendezvous
 * after the other anyway, so a window would only add hand-shakes there. */
#define PS_PUSH_WINDOW 2
#define PS_CRC_TRIES 5              /* a corrupted part is sent again at most this often in a row */
#define PS_BEHIND_RETRY_MS 5        /* a push part ahead of its chunk is sent again this often */

enum { OP_HELLO = 1, OP_DECLARE, OP_PUSH, OP_PULL, OP_LEAVE, OP_SHUTDOWN, OP_BATCH, OP_ECHO,
       OP_FORGET, OP_VALUES };
enum { OP_PUSH_NONE = 100 }; /* data_op's argument only: an OP_PUSH with op->nograd */

/* Why a push's part waits in ps__start_op (part_t.held). */
enum { HELD_WINDOW = 1, HELD_COPY = 2 };

typedef struct {
    ps_op_t *op;
    uint32_t chunk;    /* chunk index within the tensor (or 0 for control ops) */
    uint32_t shard;
    int pending;       /* waiting for its reply */
    int resend;        /* its shard went away: send again once it is back */
    int held;          /* push: waits for an earlier chunk to the same shard (HELD_WINDOW), or
                          for its turn on the comm thread's loop (HELD_COPY) */
    const void *data;  /* push: the payload (raw fp32 slice or encoded chunk) */
    int raw;           /* push of a compressed tensor: this chunk goes as fp32 (a NaN or an
                          infinity its codec cannot encode; the shard leaves it out) */
    int unsummed;      /* push encoded by the caller: acknowledged as not summed (comm thread);
                          ps_op_wait calls the tensor's put-back for it */
    size_t len;
    uint8_t hdr[384];  /* the header bytes UCX reads until the send completes: a hello with a
                          cluster name of 127 bytes and a host name of 63, a declaration with a
                          tensor name of 127, and the session token (19) fit */
    struct {
        uint32_t crc;  /* push: CRC-32C of data; pull: the reply's CRC while its data lands */
        uint8_t have_crc; /* push: crc is computed (at the first send, on the comm thread) */
        uint8_t tries; /* times it came back corrupted */
        uint8_t sending; /* a send of it has not completed: hdr (and copy) are in use */
        uint8_t receiving; /* pull: its reply's rendezvous is landing (on_pull_recv) */
        void *landing;     /* ... there (a shard may put there over TCP: ps_tcpguard_expect) */
        uint8_t again; /* send it again once that send completes */
        uint32_t ep_gen; /* the shard's connection (cshard_t.ep_gen) its last send went on, or
                            its pull's reply came on (while receiving) */
        uint8_t direct; /* its last request was direct (PS_FLAG_DIRECT): a pull asked for a
                           direct reply; a push was written into the shard's area */
        uint8_t went_direct; /* PS_TRACE: done directly (ps__part_done: direct as it was then) */
        uint8_t behind; /* push: refused as ahead of its chunk (PS_FLAG_BEHIND): sent again by
                           on_behind_timer */
        uint64_t behind_ms; /* the first such refusal (comm loop time; 0: none) */
        void *copy;    /* PS_TEST_CORRUPT_PUSH: the corrupted copy on the wire */
    } ck;
} part_t;

/* Where a chunk's direct pushes are written in its shard's push area. */
typedef struct area_place_s {
    uint64_t off;  /* byte offset in the area */
    uint64_t req;  /* the request of the push written there last: its ack, even a late one
                      (its op failed meanwhile), frees the place */
    uint32_t gen;  /* the area (cshard_t.area_gen) off is in; another one: no place yet */
    uint8_t busy;  /* psd may still read it: written again only once that push was
                      acknowledged or refused for its CRC */
} area_place_t;

typedef struct {
    uint32_t id;
    uint32_t seed_key;      /* psk_codec_tensor_key of its name: its pushes' codec seeds */
    uint64_t numel;
    uint32_t nchunks;
    uint64_t first_chunk;
    bool mean;              /* PS_DECL_MEAN: its pushes are values (raw, fp16 or bf16; no error
                               feedback: ps_client_set_compression) */
    psk_codec_t codec;      /* pushes */
    int error_feedback;
    ps_push_put_back_t put_back; /* ps_client_set_put_back: encoded pushes not summed */
    void *put_back_arg;
    float *residual;        /* [numel] error feedback, with a lossy codec */
    int fold;               /* error feedback was turned off (codec none, or error_feedback 0)
                               while residual held what it had not sent: 1, residual is added
                               to the next push whose sums are finite; 2, that push carries it
                               (it reads residual until waited for: then freed, fold_done) */
    uint8_t *payload;       /* [nchunks * chunk_cap] encoded chunks of the push in flight */
    size_t chunk_cap;
    void *scratch;          /* encoder scratch for one chunk */
    psk_codec_t pull_codec; /* pulls: none, fp16 or bf16 */
    struct area_place_s *places; /* [nchunks] direct pushes: each chunk's place in the area of
                                    its shard (NULL: none, pushes over the transport) */
    uint8_t *pull_buf;      /* [nchunks * pull_cap] compressed parameters on their way in */
    size_t pull_cap;
    ps_op_t *spare[2];      /* a finished push and pull op kept for reuse (caller's thread) */
    uint32_t busy[2];       /* pushes, pulls handed over and not yet waited for (caller's
                               thread): a second push, a second compressed pull (one landing
                               buffer) and a change of compression wait for them */
    uint64_t took_ns[2];    /* push, pull: how long its ops take, hand-over to done, a moving
                               average (caller's thread; op_wait_done) */
} ctensor_t;

typedef struct {
    ps_client_t *c;
    uint32_t index;
    ucp_ep_h ep;
    int dead;          /* endpoint failed: close it */
    int close_queued;
    int down;          /* lost after the join: reconnecting, pushes and pulls wait */
    int gone;          /* gave up on it: its parts fail */
    char gone_why[512]; /* why it was given up on ("refused this worker back: ...", "did not
                           come back in ..."; comm thread): its parts fail saying so, not
                           "lost the connection" */
    char refused_why[256]; /* while down: the last refusal of this worker's proof (comm
                              thread; "": none), said when it is given up on */
    uint64_t down_since_ms;
    uint32_t backoff_ms;
    uv_timer_t timer;  /* the next reconnect attempt */
    int hb_inflight;   /* a heartbeat send not completed yet */
    uint32_t ep_gen;   /* bumped at every new endpoint: a send's completion from an older one
                          (a close left to finish in the background) is not this one's */
    int knows_values;  /* its hello reply said PS_FLAG_VALUES: it knows PS_MSG_VALUES and
                          PS_MSG_FORGET (a psd of session 36 or later) */
    int leaves_nonfinite; /* its hello reply said PS_FLAG_NONFINITE: it leaves a push holding
                             a NaN or an infinity out (a psd of session 37 or later) */
    int greeted;       /* comm thread: a hello of the join was answered, so heartbeats go to it
                          while the join waits for other shards (ps__on_heartbeat) */
    int losing;        /* ps__shard_lost is running: an op it fails must not call it again */
    struct bundle_s *open; /* the bundle being filled for this shard (on_deferred) */
    char lanes[64];    /* the transports the endpoint uses ("sysv,cma", "tcp", "rc_mlx5") */
    int want_lanes;    /* the first hello was answered: find and log the lanes */
    int windowed;      /* its lanes interleave rendezvous transfers (not cma): PS_PUSH_WINDOW */
    uint32_t eager_below; /* data messages under this size go eagerly (ps_ucx_eager_below) */
    uint32_t in_window; /* ps__start_op's count of an op's pushes in flight to this shard */
    uint8_t hb_hdr[128]; /* a heartbeat's header: ~90 bytes at most (floors, a token) */
    ps_ucx_token_t tok; /* the endpoint's session token, carried by every header sent on it */
    int answers_hb;     /* its hello reply said PS_FLAG_ANSWER: it answers heartbeats */
    int takes_reports;  /* its hello reply said PS_FLAG_REPORT: a batch done may be reported
                           alone (ps_client_report_done; atomic) */
    uint64_t heard_ms;  /* the comm loop's clock (uv_now: no clock read per message) at the
                           last message from it, or at the connect */
    int silent;         /* lost because it answered nothing (shard_silent): its reconnect's
                           unanswered hello is tried again, not taken for a wedged transport */
    uint64_t run;       /* its store's run as the join's hello reply said (PS_FLAG_RUN; 0: an
                           older psd): a hello after a reconnect that says another is refused
                           (atomic: the join writes it, ps__on_rehello reads it, and writes it
                           when the join's psd said none) */
    uint64_t run_origin, run_base; /* the checkpoint its store was restored from (0: none), at
                                      which step (join_run_check) */
    uint64_t joined_runs; /* the runs digest it keeps (its hello reply; join_runs_check) */
    uint64_t seen_max;    /* the highest chunk version it told this worker of: its hello replies'
                             step_max (PS_FLAG_STEPMAX), push acks, pull replies and direct pulls
                             (ps__seen_version). A re-hello whose step_max is below it comes
                             from a store that went back to an older copy of itself (atomic,
                             relaxed: the join writes it, the comm thread after) */
    uint64_t join_max;    /* its hello reply's step_max at the join (join_floor_check) */
    uint64_t floor_key;   /* its last hello reply's floor key (PS_FLAG_FLOOR; 0: an older
                             psd): floors of it are told of and compared under it (atomic) */
    uint64_t floor, floor_run; /* its hello reply's floor of the next shard and that shard's
                                  run (PS_FLAG_FLOOR; 0: none, or an older psd) */
    /* Its address, resolved by ps_client_create (the caller's thread) or in the background
     * (resolve_start): a name lookup on the comm thread stalled every shard's heartbeats for
     * as long as DNS did not answer (see connect_shard). */
    struct sockaddr_storage addr;
    socklen_t addrlen;    /* 0: not resolved yet */
    struct ps_lookup_s *job;   /* the lookup in flight (resolve.c, lookup.h), or NULL */
    int gai_status;            /* the last lookup's getaddrinfo status (0: it found one) */
    int moved;            /* a lookup since the last connect gave another address */
    /* Direct pulls (storeview.h): the shard's store, as its hello reply named it. */
    char store[256];
    uint64_t store_id;   /* 0: none offered */
    uint64_t view_tried; /* the store_id last tried: a failed open is not tried again */
    int view_open;       /* pulls carry PS_FLAG_DIRECT and read from view */
    ps_storeview_t view; /* comm thread */
    /* Direct pushes (server/pushshm.c): the area the shard's hello reply offered, and ours. */
    uint32_t area_pid, area_fd;          /* offered: /proc/<pid>/fd/<fd> */
    uint64_t area_offer_id, area_offer_size;
    uint8_t *area;                       /* mapped (comm thread), or NULL */
    size_t area_size;
    uint64_t area_id, area_tried;        /* the mapped one; the last one tried */
    uint64_t area_next;                  /* bump allocator of chunk places */
    uint32_t area_gen;                   /* bumped at every mapping */
} cshard_t;

/* Small pushes and pulls to one shard started together, fused into one eager message
 * (proto/bundle.h). It holds a copy of their headers and data, and a reference on each op
 * until its send completes. Reused: steady training allocates none. */
typedef struct bundle_s {
    ps_client_t *c;
    uint32_t shard;
    uint8_t *buf;      /* [fusion_bytes] */
    size_t len, cap;
    uint32_t count;
    part_t **parts;    /* [count] the parts it carries */
    uint32_t cap_parts;
    uint8_t hdr[128];
    struct bundle_s *next_free;
    struct bundle_s *fly_prev, *fly_next; /* on c->flying while its send is in flight */
    uint8_t flying;
    uint32_t ep_gen;   /* the shard's connection (cshard_t.ep_gen) it was sent on */
} bundle_t;

struct ps_op_s {
    ps_client_t *c;
    int type;
    uint64_t req_id;
    uint32_t tensor;
    float *buf;
    uint64_t step;
    int nograd;                 /* push: no gradient (ps_client_push_none): headers only */
    uint32_t nparts, remaining;
    uint32_t held_window; /* push: parts held as HELD_WINDOW (comm thread) */
    int ucx_refs;      /* UCX requests still referencing this op */
    int status;
    int done;
    int waited;        /* ps_op_wait returned it (kept for reuse): a second wait is refused */
    int slow_said;     /* ops_overdue said it waits long (once per op) */
    uint64_t submit_ns, done_ns; /* CLOCK_MONOTONIC when handed to the comm thread, and at done
                                    (op_wait_done times pushes and pulls with them) */
    uint64_t min_version;
    /* push: its batch and replay tags, as the comm thread knew them when it started the op
     * (ps__start_op), so that a part sent again later carries the same ones */
    int batch_stamp;
    uint64_t batch_pass, batch_offset;
    int has_progress;      /* push: the samples applied before its batch (the lr schedule's */
    uint64_t progress;     /* position), taken with the batch tags, not at each send */
    uint32_t nreplay;
    uint64_t replay[PS_REPLAY_MAX];
    uint64_t view_epoch, view_members; /* push: the newest view for its step it was sent with:
                                          a view from a later step never goes on it */
    void (*on_done)(ps_op_t *op); /* internal ops (re-hello): run on the comm thread, then freed */
    ps_msg_t reply;    /* hello / declare: the reply */
    ps_msg_t req;      /* hello / declare: the request */
    char err[512];     /* as the client's: a refusal's remedy fits (a probe: cut at 255) */
    ps_op_t *next;
    ps_op_t *copy_next; /* on c->copy_head's list (copy_turn) */
    uint32_t copy_at;   /* the first of its parts copy_turn has not looked at */
    part_t parts[];
};

struct ps_client_s {
    ps_manifest_t m;
    ps_auth_t auth;             /* m's secret_file: proved first on every connection */
    uint32_t nshards;
    uint64_t chunk_elems;
    float *nan_chunk;           /* chunk_elems NaNs once a device marked a chunk (nan_chunk) */
    int rank;
    uint32_t workers;
    uint64_t join_step;         /* the coordinator's step at the join */
    uint64_t runs_digest;       /* every shard's run at the join (ps_runs_digest; 0: a shard did
                                   not say), which heartbeats carry (atomic: the comm thread) */
    int64_t join_tensors;       /* shard 0's tensors then (its hello reply's count; -1: its psd
                                   did not say); written by the joining thread before the join
                                   returns, read by the comm thread in ps__on_rehello after it */
    uint64_t join_serial;       /* shard 0's serial of this join: hellos to the others carry it */
    uint32_t launcher;          /* PS_LAUNCHER: the pslaunch that started this process (its
                                   pid; 0: none), which hellos carry (server/coord_scale.c,
                                   grants_seen) */
    uint64_t next_req;

    pthread_t thread;
    uv_loop_t loop;
    uv_async_t wake;
    uv_async_t resolved;        /* a shard's name lookup ended (on_resolved) */
    ps_ucx_t ucx;
    cshard_t *shards;
    ps_op_t *inflight;          /* comm thread only */
    ps_op_t *ctrl_spare;        /* a finished one-part control op kept for reuse (caller's
                                   thread): a training loop's ps_client_next_batch allocates
                                   nothing */
    uv_timer_t heartbeat;       /* tells every shard this worker is alive */
    uv_timer_t leave_timer;     /* a leave unanswered for ps__leave_wait_ms ends anyway */
    uv_timer_t behind_timer;    /* push parts ahead of their chunks go again (on_behind_timer) */
    uv_timer_t interrupt_timer; /* sends UCX still holds ps__leave_wait_ms after an interrupt:
                                   their connections are closed (on_interrupt_timer) */
    int leaving;                /* a leave was sent: no more heartbeats or reconnects */
    ps_batch_info_t leave_done; /* caller's thread: a batch whose pushes were all acknowledged */
    int has_leave_done;         /* and not yet reported by a batch request: the leave does */
    uint64_t batch_samples;     /* the training set size the last batch request named */
    uint64_t tensor_set;        /* digest of the tensors declared (ps_client_declare), sent with
                                   each batch request: under bsp shard 0 refuses a worker whose
                                   set differs from the other members' */
    uint32_t ntensor_set;       /* how many: the count sent with it */
    int had_batch;              /* shard 0 handed this worker a batch (or the job's end) */
    ps_batch_info_t held;       /* caller's thread: the batch handed out last (has_held) */
    int has_held;               /* ... and not the job's end: a report of done must name it */
    int held_reported;          /* ps_client_report_done reported it: the next batch request
                                   and the leave do not again */
    ps_msg_t handed;            /* a batch reply that answered a report (has_handed): an older
                                   psd took a report resent to it after a restart for a request
                                   and handed this out; ps_client_next_batch returns it */
    int has_handed;
    uint64_t acked_pushes;      /* caller's thread: pushes waited for with success */
    uint64_t held_acked;        /* acked_pushes when the held batch was handed out */
    int said_no_values;         /* warned once: shard 0 takes no values (an older psd) */
    uint64_t stray_errors;      /* errors for no op in flight (comm thread): the log's count */
    int leads;                  /* the last batch reply said PS_FLAG_LEAD (atomic: comm thread) */
    uint64_t nonfinite_pushes;  /* chunk pushes acknowledged PS_FLAG_NONFINITE (comm thread
                                   writes, any thread reads) */
    uint64_t stale_step1;       /* bsp: step + 1 of a push a shard acknowledged as not applied
                                   (PS_FLAG_STALE; written by the comm thread): the report of
                                   that step's batch says so */

    /* The comm thread's loop and everything it owns (marked "comm thread" here) are used
     * under loop_mu: the comm thread holds it except while it waits for events (comm_run); a
     * caller that waits for a small op takes it (trylock) to drive the UCP worker itself
     * (op_wait_done), so its reply needs no hand-over between threads. Taken before mu. */
    pthread_mutex_t loop_mu;
    int drivers;                /* callers driving the worker now or about to (atomic) */
    uint64_t drove_ns;          /* when a caller last drove it (atomic; 0: handed back):
                                   within the busy-poll window of it the comm thread leaves
                                   the worker to the callers (ps__comm_driven) */
    int loop_stop;              /* the shutdown ended the loop (under loop_mu; read atomically) */
    pthread_mutex_t mu;         /* guards submit queue and op completion */
    pthread_cond_t cv;
    int sleepers;               /* callers in pthread_cond_wait for an op (under mu) */
    ps_op_t *submit_head, *submit_tail;
    ps_op_t *group_head, *group_tail; /* caller's thread: ops held by ps_client_group_begin */
    int grouping;
    uint64_t fusion_bytes;      /* bundle size (0: no fusion); ps_client_set_fusion */
    int fusing;                 /* comm thread: small parts go into bundles now */
    bundle_t *free_bundles;     /* comm thread */
    bundle_t *flying;           /* comm thread: bundles whose send has not completed (a
                                   transport restart takes them back: transport_restart) */
    struct fwd_s *forwards;     /* comm thread: view messages whose send has not completed */
    ps_op_t *copy_head, *copy_tail; /* comm thread: pushes with HELD_COPY parts (copy_turn),
                                       each holding a ucx_ref */
    int started, start_rc;
    int interrupted; /* ps_client_interrupt (any thread, a signal handler): pushes and pulls
                        now fail; atomic (lock-free, so signal-safe) */
    int joined;                 /* past the first hello: lost shards are reconnected */
    uint64_t unarmable_restart_ns; /* the last transport restart of unarmable() (mono_ns) */
    int removed;                /* the coordinator removed this worker: everything fails */
    int refused_back;           /* a shard refused this worker back (ps__on_rehello: its store
                                   or configuration; ps_client_refused_back; atomic) */
    ps_views_t views;           /* comm thread: the last membership views learnt (views.h) */
    uint64_t progress;          /* comm thread: the current batch's samples-applied-before */
    int has_progress;
    uint64_t replay_step;       /* comm thread: the current batch's step and replay tags, */
    uint32_t nreplay;           /* which that step's pushes carry (a batch handed out again) */
    uint64_t replay[PS_REPLAY_MAX];
    int batch_stamp;            /* comm thread: asp / ssp: every push carries the current */
    uint64_t batch_pass, batch_offset; /* batch and its replay tags (PS_FLAG_BATCH) */
    uint32_t reconnect_ms;      /* how long a lost shard may stay away */
    uint32_t hello_deadline_ms; /* a hello unanswered this long: hello_overdue */
    uint32_t silent_ms;         /* a shard that answered nothing this long: shard_silent */
    uint64_t hb_last_ms;        /* the last heartbeat tick, or the timer's start (stopped_gap) */
    int unsealed_said;          /* a message without its connection's token was dropped and
                                   said (from_shard); the rest are dropped quietly */
    uint32_t test_corrupt_push; /* PS_TEST_CORRUPT_PUSH=N (tests only): corrupt every Nth push */
    uint32_t test_push_count;   /* comm thread */
    int direct;                 /* direct pulls allowed (PS_DIRECT_PULL is not "0") */
    int direct_push;            /* direct pushes allowed (PS_DIRECT_PUSH is not "0") */
    uint32_t test_direct_fail;  /* PS_TEST_DIRECT_FAIL=N (tests only): the Nth direct read fails */
    int put_back_said;          /* an encoded push not summed, without a put-back: warned once */
    uint32_t test_direct_count; /* comm thread */

    ctensor_t **tensors;        /* [PS_CLIENT_MAX_TENSORS] by id; entries never move, so the
                                   comm thread may read them while the caller declares more */
    ps_client_stats_t stats;
    ps_trace_t *trace;          /* PS_TRACE: the comm thread's timeline (trace_op), or NULL */
    char err[512];
};

/* What a shard that lost its store is told with, and the remedy (ps__on_rehello, join_store_check,
 * join_run_check). */
#define STORE_REMEDY "start every shard from one checkpoint (psctl restore D prints the commands)"
#define STORE_LOST "store was lost or replaced (an empty or another data_dir); " STORE_REMEDY

/* Into @p m (a heartbeat or a leave to shard @p i): this worker's floor of the next shard (i + 1,
 * the last shard's: shard 0), the highest chunk version it was told of there, and that shard's
 * floor key, which shard i keeps the highest of (server/floor.h); nothing before the join passed its
 * checks (a join refused for a shard of another run would make shard i keep that run's floor
 * and drop the one it had: a review, session 68), when that shard does not keep floors
 * (no PS_FLAG_FLOOR: an older psd's drops lower its step_max unsaid), or it is shard i. */
static inline void ps__floor_of_next(const ps_client_t *c, uint32_t i, ps_msg_t *m)
{
    const cshard_t *n = &c->shards[(i + 1) % c->nshards];
    if (!__atomic_load_n(&c->joined, __ATOMIC_ACQUIRE) || n == &c->shards[i] ||
        (m->floor_run = __atomic_load_n(&n->floor_key, __ATOMIC_ACQUIRE)) == 0)
        return;
    m->floor = __atomic_load_n(&n->seen_max, __ATOMIC_RELAXED);
}

/* Shard @p s told this worker of chunk version @p v (a push ack, a pull reply, a direct pull's
 * record; committed there before it was told): raise its seen_max. One writer at a time (the
 * thread that progresses the client). */
static inline void ps__seen_version(cshard_t *s, uint64_t v)
{
    if (v > __atomic_load_n(&s->seen_max, __ATOMIC_RELAXED))
        __atomic_store_n(&s->seen_max, v, __ATOMIC_RELAXED);
}

/* CLOCK_MONOTONIC in nanoseconds: the clock of ops' times and of the PS_TRACE timeline; and
 * in milliseconds. */
static inline uint64_t mono_ns(void) { return ps_trace_now(); }
static inline uint64_t now_ms(void) { return mono_ns() / 1000000; }

/* This worker's rank, read on the comm thread: the caller's thread sets it at a join (a
 * re-hello in ps_client_create) while the comm thread runs (ThreadSanitizer, session 51). */
static inline int rank_now(const ps_client_t *c)
{
    return __atomic_load_n(&c->rank, __ATOMIC_RELAXED);
}


#pragma GCC visibility push(hidden)

/* ---- client.c: the comm thread -------------------------------------------------------- */

/** @brief The name of op type @p type (OP_*), for messages and the timeline. */
const char *ps__op_name(int type);
/** @brief The comm thread's last use of @p op: completes it (the caller may free it then) once
 *  no part and no UCX request holds it. */
void ps__op_maybe_complete(ps_op_t *op);
/** @brief Records @p op's failure (@p status, the message from @p fmt; the first one stays);
 *  completion is left to ps__op_maybe_complete. */
void ps__op_fail(ps_op_t *op, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/** @brief Part @p p's reply came: counts it against its op (completion as above). */
void ps__part_done(part_t *p);
/** @brief Part @p p's send failed or its shard was lost: a leave's part is done, one that may
 *  wait waits (unless @p give_up). @return 1 if its op goes on. */
int ps__part_spared(ps_client_t *c, part_t *p, int give_up, uint32_t gen);
/** @brief Sends part @p p of @p op again as it was (control) or as built anew (push, pull). */
void ps__part_send_again(ps_client_t *c, ps_op_t *op, part_t *p);
/** @brief Starts @p op on the comm thread: its parts sent, fused or held. */
void ps__start_op(ps_client_t *c, ps_op_t *op);
/** @brief How long a leave waits for the shards' answers. */
uint32_t ps__leave_wait_ms(const ps_client_t *c);
/** @brief Puts bundle @p b on (@p on) or takes it off c->flying. */
void ps__bundle_fly(ps_client_t *c, bundle_t *b, int on);
/** @brief PS_TEST_CORRUPT_PUSH: the bytes part @p p leaves with (a corrupted copy every Nth
 *  push, owned by the part; else its data). */
const void *ps__test_corrupt_push(ps_client_t *c, part_t *p);
/** @brief ps_ucx_t's driven hook: a caller drives the worker now or did within the busy-poll
 *  window. */
int ps__comm_driven(ps_ucx_t *u);
/** @brief The signals the client's own threads block, into @p set. */
void ps__client_signals(sigset_t *set);
/** @brief The comm thread (@p arg: the client). */
void *ps__comm_main(void *arg);

/* ---- samehost.c: a same-host shard's store view and push area ----------------------- */

/** @brief Opens the view of shard @p s's store its hello reply offered (direct pulls), or
 *  closes one it no longer offers; a store that cannot be opened (another host's) is tried
 *  once per offer. Comm thread. */
void ps__view_update(ps_client_t *c, cshard_t *s);
/** @brief Maps the push area shard @p s offered (direct pushes) when the file is a memfd
 *  with the identity offered and psd's seals; tried once per offer. Comm thread. */
void ps__area_update(ps_client_t *c, cshard_t *s);
/** @brief Unmaps shard @p s's push area, if mapped. */
void ps__area_unmap(cshard_t *s);
/** @brief The offset of chunk @p chunk of @p t (@p len bytes) in shard @p s's area (placed at
 *  its first use under the area's generation), or UINT64_MAX when it cannot go there now (no
 *  area, full, or psd may still read its place). */
uint64_t ps__area_place(cshard_t *s, ctensor_t *t, uint32_t chunk, uint64_t len);

/* ---- resolve.c: the shards' name lookups ------------------------------------------ */

/** @brief Looks shard @p s's name up on a detached thread (one lookup at a time per shard;
 *  none once the comm thread is ending); ps__on_resolved keeps what it finds. */
void ps__resolve_start(ps_client_t *c, cshard_t *s);
/** @brief c->resolved's callback: each finished lookup's address kept (a changed one marks
 *  the shard moved), its job freed. */
void ps__on_resolved(uv_async_t *h);
/** @brief The comm thread's end: each lookup still running is left to its thread to free. */
void ps__resolve_abandon(ps_client_t *c);

/* ---- shardloss.c: losing and regaining a shard -------------------------------------- */

/** @brief Shard @p i's endpoint is gone: before the join an error; after it, its pushes and
 *  pulls wait while the client reconnects with capped backoff, then fail. */
void ps__shard_lost(ps_client_t *c, uint32_t i);
/** @brief A re-hello's answer (an internal op's on_done, comm thread). */
void ps__on_rehello(ps_op_t *op);
/** @brief The heartbeat timer: tells every shard this worker is alive, and finds silent shards
 *  and overdue ops and hellos. */
void ps__on_heartbeat(uv_timer_t *h);
/** @brief A leave some shard did not answer in time ends anyway. */
void ps__on_leave_timer(uv_timer_t *h);
/** @brief ps_ucx_t's owner_idle hook: whether the client (@p arg) waits for nothing. */
int ps__waits_for_nothing(void *arg);
/** @brief Adopts a newer membership view; @p forward: tells the other shards. */
void ps__learn_view(ps_client_t *c, uint64_t epoch, uint64_t from, uint64_t members, int forward);
/** @brief Sends view message @p view (borrowed; copied) to shard @p i when it is connected. */
void ps__forward_msg(ps_client_t *c, uint32_t i, const ps_msg_t *view);
/** @brief Frees the view messages whose sends will never complete (their UCX worker is gone). */
void ps__forwards_free(ps_client_t *c);
/** @brief The coordinator removed this worker: everything fails with PS_ENOTMEMBER. */
void ps__mark_removed(ps_client_t *c);
/** @brief What a hello says of this worker's manifest (PS_FLAG_CONF), into @p m for shard @p i. */
void ps__hello_conf(const ps_client_t *c, ps_msg_t *m, uint32_t i);
/** @brief What a store's run (@p origin, @p base) says of its history, into @p buf. */
void ps__run_said(char *buf, size_t len, uint64_t origin, uint64_t base);

/* ---- client_api.c: the caller's thread --------------------------------------------- */

/** @brief Push part @p p of @p op was acknowledged as not summed (PS_FLAG_UNSUMMED: its batch
 *  came from another push; PS_FLAG_STALE: its batch goes out again; PS_FLAG_NONFINITE: left
 *  out for a NaN or an infinity, as a push without a gradient): with libps's own error
 *  feedback, its residual takes the part's payload back and gives its gradient up
 *  (psk_codec_ef_put_back_cpu), so the error it carried from earlier steps is not lost (the
 *  gradient is). On the thread that drives libps's worker (the comm thread, or a caller
 *  driving it under loop_mu); the tensor's next push waits for @p op, so nothing else touches
 *  that residual meanwhile. @p op's gradient and payload are still its own (borrowed until it
 *  completes). */
void ps__ef_put_back(ps_client_t *c, ps_op_t *op, part_t *p);
/** @brief The op kept in @p spare (ps_op_wait keeps finished ones there; it has room for
 *  @p nparts), taken out and reset, else a new one (the caller's until it is submitted and
 *  waited for); NULL when out of memory. Caller's thread. */
ps_op_t *ps__op_reuse(ps_client_t *c, ps_op_t **spare, int type, uint32_t nparts);
/** @brief Hands @p op to the comm thread (or to the next caller that drives the worker); the
 *  client owns it until ps_op_wait returns. Caller's thread. */
void ps__submit(ps_client_t *c, ps_op_t *op);
/** @brief One control request @p req (its req_id set here) to shard @p shard, waited for:
 *  the reply into @p reply; 0 or the op's error (c->err says it). Held pushes and pulls of a
 *  group go first. Caller's thread. */
int ps__ctrl_call(ps_client_t *c, int type, uint32_t shard, ps_msg_t *req, ps_msg_t *reply);
/** @brief Frees what tensor @p t (may be NULL) holds sized by its shape, and zeroes it. */
void ps__ctensor_free_bufs(ctensor_t *t);

#pragma GCC visibility pop

#endif
