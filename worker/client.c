/* client.c: libps. A communication thread runs the UCP worker and a libuv loop;
 * the caller's thread submits operations through a locked queue (and an async
 * handle when the comm thread sleeps) and waits on a condition variable, or, for
 * a small operation, drives the worker itself meanwhile (op_wait_done). What the
 * sections below call "comm thread" code runs under loop_mu: on the comm thread,
 * or on a caller driving the worker. */
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

/* Why a push's part waits in start_op (part_t.held). */
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
        uint8_t went_direct; /* PS_TRACE: done directly (part_done: direct as it was then) */
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
    uint64_t numel;
    uint32_t nchunks;
    uint64_t first_chunk;
    psk_codec_t codec;      /* pushes */
    int error_feedback;
    float *residual;        /* [numel] error feedback, with a lossy codec */
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
                          while the join waits for other shards (on_heartbeat) */
    int losing;        /* shard_lost is running: an op it fails must not call it again */
    struct bundle_s *open; /* the bundle being filled for this shard (on_deferred) */
    char lanes[64];    /* the transports the endpoint uses ("sysv,cma", "tcp", "rc_mlx5") */
    int want_lanes;    /* the first hello was answered: find and log the lanes */
    int windowed;      /* its lanes interleave rendezvous transfers (not cma): PS_PUSH_WINDOW */
    uint32_t eager_below; /* data messages under this size go eagerly (ps_ucx_eager_below) */
    uint32_t in_window; /* start_op's count of an op's pushes in flight to this shard */
    uint8_t hb_hdr[64];
    ps_ucx_token_t tok; /* the endpoint's session token, carried by every header sent on it */
    int answers_hb;     /* its hello reply said PS_FLAG_ANSWER: it answers heartbeats */
    uint64_t heard_ms;  /* the comm loop's clock (uv_now: no clock read per message) at the
                           last message from it, or at the connect */
    int silent;         /* lost because it answered nothing (shard_silent): its reconnect's
                           unanswered hello is tried again, not taken for a wedged transport */
    uint64_t run;       /* its store's run as the join's hello reply said (PS_FLAG_RUN; 0: an
                           older psd): a hello after a reconnect that says another is refused
                           (atomic: the join writes it, on_rehello reads it, and writes it
                           when the join's psd said none) */
    uint64_t run_origin, run_base; /* the checkpoint its store was restored from (0: none), at
                                      which step (join_run_check) */
    uint64_t joined_runs; /* the runs digest it keeps (its hello reply; join_runs_check) */
    /* Its address, resolved by ps_client_create (the caller's thread) or in the background
     * (uv_getaddrinfo): a name lookup on the comm thread stalled every shard's heartbeats for
     * as long as DNS did not answer (see connect_shard). */
    struct sockaddr_storage addr;
    socklen_t addrlen;    /* 0: not resolved yet */
    uv_getaddrinfo_t gai;
    int resolving;        /* gai is in flight */
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
    int ucx_refs;      /* UCX requests still referencing this op */
    int status;
    int done;
    int waited;        /* ps_op_wait returned it (kept for reuse): a second wait is refused */
    int slow_said;     /* ops_overdue said it waits long (once per op) */
    uint64_t submit_ns, done_ns; /* CLOCK_MONOTONIC when handed to the comm thread, and at done
                                    (op_wait_done times pushes and pulls with them) */
    uint64_t min_version;
    /* push: its batch and replay tags, as the comm thread knew them when it started the op
     * (start_op), so that a part sent again later carries the same ones */
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
    int rank;
    uint32_t workers;
    uint64_t join_step;         /* the coordinator's step at the join */
    uint64_t runs_digest;       /* every shard's run at the join (ps_runs_digest; 0: a shard did
                                   not say), which heartbeats carry (atomic: the comm thread) */
    int64_t join_tensors;       /* shard 0's tensors then (its hello reply's count; -1: its psd
                                   did not say); written by the joining thread before the join
                                   returns, read by the comm thread in on_rehello after it */
    uint64_t join_serial;       /* shard 0's serial of this join: hellos to the others carry it */
    uint64_t next_req;

    pthread_t thread;
    uv_loop_t loop;
    uv_async_t wake;
    ps_ucx_t ucx;
    cshard_t *shards;
    ps_op_t *inflight;          /* comm thread only */
    ps_op_t *ctrl_spare;        /* a finished one-part control op kept for reuse (caller's
                                   thread): a training loop's ps_client_next_batch allocates
                                   nothing */
    uv_timer_t heartbeat;       /* tells every shard this worker is alive */
    uv_timer_t leave_timer;     /* a leave unanswered for leave_wait_ms ends anyway */
    uv_timer_t behind_timer;    /* push parts ahead of their chunks go again (on_behind_timer) */
    uv_timer_t interrupt_timer; /* sends UCX still holds leave_wait_ms after an interrupt:
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
    int said_no_values;         /* warned once: shard 0 takes no values (an older psd) */
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
                                   the worker to the callers (comm_driven) */
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
    int unsealed_said;          /* a message without its connection's token was dropped and
                                   said (from_shard); the rest are dropped quietly */
    uint32_t test_corrupt_push; /* PS_TEST_CORRUPT_PUSH=N (tests only): corrupt every Nth push */
    uint32_t test_push_count;   /* comm thread */
    int direct;                 /* direct pulls allowed (PS_DIRECT_PULL is not "0") */
    int direct_push;            /* direct pushes allowed (PS_DIRECT_PUSH is not "0") */
    uint32_t test_direct_fail;  /* PS_TEST_DIRECT_FAIL=N (tests only): the Nth direct read fails */
    uint32_t test_direct_count; /* comm thread */

    ctensor_t **tensors;        /* [PS_CLIENT_MAX_TENSORS] by id; entries never move, so the
                                   comm thread may read them while the caller declares more */
    ps_client_stats_t stats;
    ps_trace_t *trace;          /* PS_TRACE: the comm thread's timeline (trace_op), or NULL */
    char err[512];
};

/* CLOCK_MONOTONIC in nanoseconds: the clock of ops' times and of the PS_TRACE timeline. */
static uint64_t mono_ns(void) { return ps_trace_now(); }

/* This worker's rank, read on the comm thread: the caller's thread sets it at a join (a
 * re-hello in ps_client_create) while the comm thread runs (ThreadSanitizer, session 51). */
static inline int rank_now(const ps_client_t *c)
{
    return __atomic_load_n(&c->rank, __ATOMIC_RELAXED);
}

/* ---- comm thread: the timeline (PS_TRACE) ---------------------------------- */

/* Lanes of a libps trace: what an op moves. */
enum { TLANE_PUSH = 1, TLANE_PULL = 2, TLANE_CTRL = 3 };

static const char *op_name(int type)
{
    static const char *const names[] = {"?",     "hello", "declare", "push",   "pull", "leave",
                                        "shutdown", "batch", "echo", "forget", "values"};
    return type > 0 && type <= OP_VALUES ? names[type] : "?";
}

static int op_lane(int type)
{
    return type == OP_PUSH ? TLANE_PUSH : type == OP_PULL ? TLANE_PULL : TLANE_CTRL;
}

/* The op's span, from the hand-over to the comm thread to now (its completion): written before
 * the caller may free it. Pushes and pulls name their tensor and step and count their chunks
 * and the chunks that went directly (through the shard's shared memory). */
static void trace_op(ps_client_t *c, const ps_op_t *op)
{
    uint64_t now = mono_ns();
    uint32_t direct = 0;
    char name[32], args[96];
    if (op->type == OP_PUSH || op->type == OP_PULL)
        snprintf(name, sizeof name, "%s %u", op_name(op->type), op->tensor);
    else
        snprintf(name, sizeof name, "%s", op_name(op->type));
    for (uint32_t i = 0; i < op->nparts; i++) direct += op->parts[i].ck.went_direct;
    snprintf(args, sizeof args, "{\"step\":%" PRIu64 ",\"chunks\":%u,\"direct\":%u,\"ok\":%s}",
             op->step, op->nparts, direct, op->status == 0 ? "true" : "false");
    ps_trace_span(c->trace, op_lane(op->type), "op", name,
                  op->submit_ns && op->submit_ns <= now ? op->submit_ns : now, now, args);
}

/* ---- comm thread: completion ---------------------------------------------- */

/* Set op->done (release: the caller may read the op's results without the lock once it sees
 * it) and wake the caller if it sleeps; a caller still spinning in op_wait_done needs no
 * futex wake. */
static void op_publish_done(ps_op_t *op)
{
    ps_client_t *c = op->c;
    op->done_ns = mono_ns();
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&op->done, 1, __ATOMIC_RELEASE);
    if (c->sleepers) pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Completion is the last thing the comm thread does with an op: once done is
 * set, the caller's thread may free it. So op_fail and part_done only record,
 * and every comm-thread entry point calls op_maybe_complete as its final use. */
static void op_maybe_complete(ps_op_t *op)
{
    if (op->remaining > 0 || op->ucx_refs > 0 || op->done) return;
    ps_client_t *c = op->c;
    for (ps_op_t **pp = &c->inflight; *pp; pp = &(*pp)->next)
        if (*pp == op) {
            *pp = op->next;
            break;
        }
    if (c->trace && op->type != OP_SHUTDOWN) trace_op(c, op);
    if (op->on_done) {
        op->done = 1;
        op->on_done(op);
        free(op);
        return;
    }
    op_publish_done(op);
}

static void op_fail(ps_op_t *op, int status, const char *fmt, ...)
{
    if (op->status == 0) {
        op->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(op->err, sizeof op->err, fmt, ap);
        va_end(ap);
    }
    for (uint32_t i = 0; i < op->nparts; i++)
        if (op->parts[i].pending) {
            op->parts[i].pending = 0;
            op->remaining--;
        }
}

/* An instant on @p p's op's lane of the timeline (PS_TRACE): "WHAT T/C" with @p args (JSON). */
static void trace_chunk(ps_client_t *c, const part_t *p, const char *what, const char *args)
{
    char name[40];
    snprintf(name, sizeof name, "%s %u/%u", what, p->op->tensor, p->chunk);
    ps_trace_instant(c->trace, op_lane(p->op->type), name, mono_ns(), args);
}

static void part_done(part_t *p)
{
    if (!p->pending) return;
    p->pending = 0;
    p->op->remaining--;
    p->ck.went_direct = p->ck.direct;
    ps_client_t *c = p->op->c;
    if (c->trace && (p->op->type == OP_PUSH || p->op->type == OP_PULL)) {
        /* A push's chunk acknowledged, a pull's chunk here. */
        char args[64];
        snprintf(args, sizeof args, "{\"shard\":%u,\"direct\":%s,\"ok\":%s}", p->shard,
                 p->ck.direct ? "true" : "false", p->op->status == 0 ? "true" : "false");
        trace_chunk(c, p, p->op->type == OP_PUSH ? "acked" : "landed", args);
    }
}

/* Every part of @p op bound for shard @p shard is done (a leave's answer). */
static void parts_done_on_shard(ps_op_t *op, uint32_t shard)
{
    for (uint32_t i = 0; i < op->nparts; i++)
        if (op->parts[i].shard == shard) part_done(&op->parts[i]);
}

static void shard_lost(ps_client_t *c, uint32_t i);

static void part_send_again(ps_client_t *c, ps_op_t *op, part_t *p);

/* A part whose transport failed waits for its shard to come back, once the client has
 * joined, if it is a push, a pull, a batch request or a declaration (psd takes a tensor's
 * second declaration as the first, so sending one again is safe); anything else fails.
 * @p gen is the connection (cshard_t.ep_gen) the failed request was on: a connection's that
 * was replaced since (its close left to finish in the background) says nothing of the new
 * one, which took the part already (on_rehello) or takes it now (ck.again: on_rehello left it
 * to the old request's end). Returns 1 if the part will be sent again. */
static int part_defer(ps_client_t *c, part_t *p, uint32_t gen)
{
    if (!__atomic_load_n(&c->joined, __ATOMIC_ACQUIRE) || !p->pending ||
        c->shards[p->shard].gone ||
        (p->op->type != OP_PUSH && p->op->type != OP_PULL && p->op->type != OP_BATCH &&
         p->op->type != OP_DECLARE))
        return 0;
    cshard_t *s = &c->shards[p->shard];
    if (gen != s->ep_gen && s->ep && !s->down && !s->dead) {
        if (p->ck.again && !p->ck.sending) {
            p->ck.again = 0;
            part_send_again(c, p->op, p);
        }
        return 1;
    }
    p->resend = 1;
    if (!s->down && !s->dead) { /* the endpoint broke before UCX told us */
        s->dead = 1;
        s->close_queued = 1;
    }
    return 1;
}

/* A part whose send failed or whose shard was lost, unless it fails its op: a leave's part is
 * done (that shard drops this worker when the connection closes; the leave's other shards still
 * get theirs), and one that can wait for its shard waits (part_defer), unless @p give_up.
 * Returns 1 if the op goes on without failing. */
static int part_spared(ps_client_t *c, part_t *p, int give_up, uint32_t gen)
{
    if (p->op->type == OP_LEAVE) {
        part_done(p);
        return 1;
    }
    return !give_up && part_defer(c, p, gen);
}

static void send_data_part(ps_client_t *c, ps_op_t *op, part_t *p);
static void send_part(ps_client_t *c, part_t *p, const ps_msg_t *m, const void *data, size_t len,
                      unsigned am_id);
static uint64_t area_place(cshard_t *s, ctensor_t *t, uint32_t chunk, uint64_t len);

/* Send part @p p of @p op again: a control op's request as it was, a push or pull as
 * send_data_part builds it. */
static void part_send_again(ps_client_t *c, ps_op_t *op, part_t *p)
{
    if (op->type == OP_BATCH || op->type == OP_DECLARE || op->type == OP_LEAVE ||
        op->type == OP_FORGET)
        send_part(c, p, &op->req, NULL, 0, PS_AM_CTRL);
    else
        send_data_part(c, op, p);
}

/* A send of @p p completed (in its callback, or at once): its header (and test copy) are free
 * again; a resend that waited for that goes now, and so does the push window's next chunk to
 * the same shard. */
static void part_sent(ps_client_t *c, part_t *p)
{
    ps_op_t *op = p->op;
    p->ck.sending = 0;
    free(p->ck.copy);
    p->ck.copy = NULL;
    if (p->ck.again && p->pending) {
        p->ck.again = 0;
        part_send_again(c, op, p);
    }
    /* Held parts follow every sent one of their shard (start_op holds in index order). */
    if (op->type != OP_PUSH || op->status != 0 || !c->shards[p->shard].windowed) return;
    for (uint32_t i = (uint32_t)(p - op->parts) + 1; i < op->nparts; i++)
        if (op->parts[i].held == HELD_WINDOW && op->parts[i].shard == p->shard) {
            send_data_part(c, op, &op->parts[i]);
            break;
        }
}

/* Part @p p arrived corrupted (the shard answered PS_ECRC, or a pull reply's CRC-32C did not
 * match): send it again, at most PS_CRC_TRIES times in a row, then fail the op. */
static void part_crc_retry(ps_client_t *c, ps_op_t *op, part_t *p, const char *what)
{
    if (++p->ck.tries > PS_CRC_TRIES) {
        op_fail(op, PS_ECRC, "%s of chunk %u of tensor %u (shard %u): CRC-32C mismatch %d times "
                "in a row; giving up", what, p->chunk, op->tensor, p->shard, p->ck.tries);
        return;
    }
    PS_LOG(PS_LOG_WARN, "libps", "%s of chunk %u of tensor %u (shard %u): CRC-32C mismatch, "
           "sending again (%d of %d)", what, p->chunk, op->tensor, p->shard, p->ck.tries,
           PS_CRC_TRIES);
    if (p->ck.sending)
        p->ck.again = 1;
    else
        send_data_part(c, op, p);
}

/* PS_BEHIND_RETRY_MS after a refusal as ahead of its chunk: each such part is sent again. */
static void on_behind_timer(uv_timer_t *t)
{
    ps_client_t *c = t->data;
    for (ps_op_t *op = c->inflight, *nx; op; op = nx) {
        nx = op->next;
        int touched = 0;
        for (uint32_t i = 0; op->type == OP_PUSH && i < op->nparts; i++) {
            part_t *p = &op->parts[i];
            if (!p->ck.behind) continue;
            p->ck.behind = 0;
            touched = 1;
            if (!p->pending || p->resend) continue; /* done, failed, or waiting for its shard */
            if (p->ck.sending)
                p->ck.again = 1;
            else
                send_data_part(c, op, p);
        }
        if (touched) op_maybe_complete(op); /* a send that failed it */
    }
}

/* Push part @p p was refused because its chunk has not reached the push's step (PS_FLAG_BEHIND:
 * the shard is still at the step before, waiting for a view or for the pushes of members of a
 * step a restarted shard 0 closed): sent again PS_BEHIND_RETRY_MS after each refusal until
 * twice heartbeat_timeout_ms has passed since the first (the shard may wait that long for the
 * coordinator to drop a dead member), then the op fails with @p why. */
static void part_behind_retry(ps_client_t *c, ps_op_t *op, part_t *p, const char *why)
{
    uint64_t now = uv_now(&c->loop) + 1; /* never 0 */
    if (p->ck.behind_ms == 0) {
        p->ck.behind_ms = now;
        PS_LOG(PS_LOG_INFO, "libps", "shard %u: %s: sending it again until it gets there",
               p->shard, why);
    } else if (now - p->ck.behind_ms > 2 * c->m.job.heartbeat_timeout_ms) {
        op_fail(op, PS_ESTALE, "shard %u: %s (for %llu ms)", p->shard, why,
                (unsigned long long)(now - p->ck.behind_ms));
        return;
    }
    p->ck.behind = 1;
    if (!uv_is_active((uv_handle_t *)&c->behind_timer))
        uv_timer_start(&c->behind_timer, on_behind_timer, PS_BEHIND_RETRY_MS, 0);
}

static void on_sent(void *request, ucs_status_t status, void *user_data)
{
    part_t *p = user_data;
    ps_op_t *op = p->op;
    uint32_t gen = p->ck.ep_gen; /* this send's connection, before part_sent sends it again */
    op->ucx_refs--;
    part_sent(op->c, p); /* a part on_rehello left to this completion (ck.again) goes now */
    if (status != UCS_OK && p->pending && !part_spared(op->c, p, 0, gen))
        op_fail(op, ps_ucx_err(status), "send to shard %u failed: %s%s", p->shard,
                ucs_status_string(status), ps_ucx_down_hint(status));
    if (request) ucp_request_free(request);
    op_maybe_complete(op);
}

/* Compressed parameters: dst = decode(payload). */
static int pull_decode(ps_client_t *c, ps_op_t *op, uint32_t chunk, const uint8_t *payload,
                       size_t len)
{
    const ctensor_t *t = c->tensors[op->tensor];
    size_t n = ps_chunk_len(t->numel, c->chunk_elems, chunk);
    float *dst = op->buf + (uint64_t)chunk * c->chunk_elems;
    if (psk_codec_check(payload, len, n, &t->pull_codec)) return PS_EPROTO;
    memset(dst, 0, n * 4);
    psk_codec_decode_add_cpu(dst, n, payload, len, &t->pull_codec, 1.0f);
    return 0;
}

static void on_pull_recv(void *request, ucs_status_t status, size_t length, void *user_data)
{
    part_t *p = user_data;
    ps_op_t *op = p->op;
    ps_client_t *c = op->c;
    const ctensor_t *t = c->tensors[op->tensor];
    op->ucx_refs--;
    p->ck.receiving = 0;
    ps_tcpguard_done(p->ck.landing);
    if (status == UCS_OK) /* heard (shard_silent): a long transfer delays its heartbeat answers */
        c->shards[p->shard].heard_ms = uv_now(&c->loop);
    if (status != UCS_OK) {
        if (!part_defer(c, p, p->ck.ep_gen))
            op_fail(op, ps_ucx_err(status), "pull data from shard %u lost: %s", p->shard,
                    ucs_status_string(status));
    }
    else if (ps_crc32c(0, t->pull_codec.kind != PSK_CODEC_NONE
                              ? (const void *)(t->pull_buf + p->chunk * t->pull_cap)
                              : (const void *)(op->buf + (uint64_t)p->chunk * c->chunk_elems),
                          length) != p->ck.crc)
        part_crc_retry(c, op, p, "pull");
    else if (t->pull_codec.kind != PSK_CODEC_NONE &&
             pull_decode(c, op, p->chunk, t->pull_buf + p->chunk * t->pull_cap, length))
        op_fail(op, PS_EPROTO, "shard %u sent malformed parameters for chunk %u", p->shard,
                p->chunk);
    else {
        __atomic_add_fetch(&op->c->stats.bytes_pulled, length, __ATOMIC_RELAXED);
        part_done(p);
    }
    if (request) ucp_request_free(request);
    op_maybe_complete(op);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    cshard_t *s = arg;
    s->dead = 1;
    s->close_queued = 1;
}

/* ---- comm thread: sending -------------------------------------------------- */

static void bundle_flush(ps_client_t *c, uint32_t i);

static void send_part(ps_client_t *c, part_t *p, const ps_msg_t *m, const void *data, size_t len,
                      unsigned am_id)
{
    ps_op_t *op = p->op;
    cshard_t *s = &c->shards[p->shard];
    if (s->ep == NULL || s->dead || (s->down && op->type != OP_HELLO)) {
        if (part_spared(c, p, 0, s->ep_gen)) return;
        op_fail(op, PS_ETRANSPORT, "shard %u (%s:%u) is not connected", p->shard,
                c->m.servers[p->shard].host, c->m.servers[p->shard].port);
        return;
    }
    if (s->open) bundle_flush(c, p->shard); /* what was bundled for the shard goes first */
    size_t hlen;
    if (ps_msg_encode_sealed(m, s->tok.b, s->tok.len, p->hdr, sizeof p->hdr, &hlen)) {
        op_fail(op, PS_EINVAL, "request header too large");
        return;
    }
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA |
                                               UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_REPLY |
                                        ps_ucx_eager_flag(s->eager_below, len),
                               .cb.send = on_sent, .user_data = p};
    op->ucx_refs++;
    p->ck.sending = 1;
    p->ck.ep_gen = s->ep_gen;
    void *req = ucp_am_send_nbx(s->ep, am_id, p->hdr, hlen, data, len, &prm);
    if (req == NULL || UCS_PTR_IS_ERR(req)) {
        ucs_status_t st = req ? UCS_PTR_STATUS(req) : UCS_OK;
        op->ucx_refs--;
        part_sent(c, p);
        if (st != UCS_OK && p->pending && !part_spared(c, p, 0, s->ep_gen))
            op_fail(op, ps_ucx_err(st), "send to shard %u failed: %s%s", p->shard,
                    ucs_status_string(st), ps_ucx_down_hint(st));
    }
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    cshard_t *s = req->data;
    s->resolving = 0;
    if (status == 0 && res && res->ai_addrlen <= sizeof s->addr) {
        if (s->addrlen && (s->addrlen != res->ai_addrlen ||
                           memcmp(&s->addr, res->ai_addr, res->ai_addrlen) != 0)) {
            PS_LOG(PS_LOG_INFO, "libps", "shard %u (%s:%u) is at another address now", s->index,
                   s->c->m.servers[s->index].host, s->c->m.servers[s->index].port);
            s->moved = 1; /* hello_overdue: a hello to the old one fails, no transport restart */
        }
        memcpy(&s->addr, res->ai_addr, res->ai_addrlen);
        s->addrlen = res->ai_addrlen;
    } else if (status != 0) {
        PS_LOG(PS_LOG_DEBUG, "libps", "shard %u: cannot resolve %s: %s", s->index,
               s->c->m.servers[s->index].host, uv_strerror(status));
    }
    if (res) uv_freeaddrinfo(res);
}

/* The signals the client's own threads block (ps_client_create, resolve_start). */
static void client_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGQUIT);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
}

/* Look shard @p s's name up in the background (libuv's thread pool); on_resolved keeps it. */
static void resolve_start(ps_client_t *c, cshard_t *s)
{
    if (s->resolving) return;
    const ps_server_conf_t *sc = &c->m.servers[s->index];
    char port[8];
    snprintf(port, sizeof port, "%u", sc->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    s->gai.data = s;
    /* libuv's first lookup starts its thread pool, whose threads keep this thread's signal
     * mask: blocked as on the comm thread, also where a caller driving the worker runs this. */
    sigset_t block, was;
    client_signals(&block);
    pthread_sigmask(SIG_BLOCK, &block, &was);
    s->resolving = uv_getaddrinfo(&c->loop, &s->gai, on_resolved, sc->host, port, &hints) == 0;
    pthread_sigmask(SIG_SETMASK, &was, NULL);
}

/* Connect to shard @p i at its address known already: the comm thread never waits for a
 * name lookup (with DNS unreachable, getaddrinfo takes seconds, in which no heartbeat went to
 * any shard and the healthy ones dropped this worker). Each attempt looks the name up again
 * in the background (one lookup at a time; the join's and the reconnect's backoff set the
 * pace), so a shard started again elsewhere under its name is reached at a later attempt; a
 * name that did not resolve yet fails the attempt (PS_ECONFIG: the join and the reconnect try
 * again). */
static int connect_shard(ps_client_t *c, uint32_t i)
{
    cshard_t *s = &c->shards[i];
    if (s->ep && !s->dead) return 0;
    const ps_server_conf_t *sc = &c->m.servers[i];
    resolve_start(c, s);
    if (s->addrlen == 0) return PS_ECONFIG;
    s->moved = 0;
    int rc = ps_ucx_connect_addr(&c->ucx, (const struct sockaddr *)&s->addr, s->addrlen,
                                 sc->host, sc->port, on_ep_error, s, &s->ep, &s->tok);
    if (rc == 0) {
        s->dead = 0;
        s->ep_gen++;
        s->heard_ms = uv_now(&c->loop); /* a new connection is not silent yet (shard_silent) */
        /* A heartbeat of the old endpoint whose close was left to finish in the background
         * (ps_ucx_ep_close) may never complete: the new one must not wait for it, or this
         * shard would hear nothing more and drop the worker as silent. */
        s->hb_inflight = 0;
    }
    return rc;
}

/* The PS_TEST_CORRUPT_PUSH hook: every Nth push leaves as a copy with one byte flipped (after
 * its CRC was computed; the caller's data stays intact for the resend). A resend is not
 * corrupted (but with N = 1, every push is): with a few pushes cycling through the counter, the
 * same one could otherwise be hit every time until it gave up (seen once under asp, N = 3). */
static const void *test_corrupt_push(ps_client_t *c, part_t *p)
{
    if (c->test_corrupt_push == 0 || p->len == 0 || p->ck.copy != NULL ||
        (p->ck.tries > 0 && c->test_corrupt_push > 1) ||
        ++c->test_push_count % c->test_corrupt_push != 0 || (p->ck.copy = malloc(p->len)) == NULL)
        return p->data;
    memcpy(p->ck.copy, p->data, p->len);
    ((uint8_t *)p->ck.copy)[p->len / 2] ^= 0x10;
    return p->ck.copy;
}

/* ---- comm thread: fusion --------------------------------------------------------- */

/* Put bundle @p b on, or take it off, c->flying. */
static void bundle_fly(ps_client_t *c, bundle_t *b, int on)
{
    if (on) {
        b->fly_prev = NULL;
        b->fly_next = c->flying;
        if (c->flying) c->flying->fly_prev = b;
        c->flying = b;
    } else {
        if (b->fly_prev)
            b->fly_prev->fly_next = b->fly_next;
        else
            c->flying = b->fly_next;
        if (b->fly_next) b->fly_next->fly_prev = b->fly_prev;
    }
    b->flying = (uint8_t)on;
}

static void on_bundle_sent(void *request, ucs_status_t status, void *user_data)
{
    bundle_t *b = user_data;
    ps_client_t *c = b->c;
    if (b->flying) bundle_fly(c, b, 0);
    uint32_t n = b->count;
    b->count = 0;
    b->len = 0;
    b->next_free = c->free_bundles; /* reusable now: the parts' data was copied */
    c->free_bundles = b;
    for (uint32_t i = 0; i < n; i++) {
        part_t *p = b->parts[i];
        ps_op_t *op = p->op;
        op->ucx_refs--;
        if (status != UCS_OK && p->pending && !part_defer(c, p, b->ep_gen))
            op_fail(op, ps_ucx_err(status), "send to shard %u failed: %s%s", p->shard,
                    ucs_status_string(status), ps_ucx_down_hint(status));
        op_maybe_complete(op); /* the last use of op: it may be freed from here on */
    }
    if (request) ucp_request_free(request);
}

/* Send shard @p i's open bundle. */
static void bundle_flush(ps_client_t *c, uint32_t i)
{
    cshard_t *s = &c->shards[i];
    bundle_t *b = s->open;
    if (b == NULL) return;
    s->open = NULL;
    ps_msg_t m = {.type = PS_MSG_BUNDLE, .rank = rank_now(c), .count = b->count, .length = b->len};
    size_t hlen;
    ucs_status_t st = UCS_ERR_NOT_CONNECTED;
    void *req = NULL;
    if (s->ep && !s->dead && !s->down &&
        ps_msg_encode_sealed(&m, s->tok.b, s->tok.len, b->hdr, sizeof b->hdr, &hlen) == 0) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                   UCP_OP_ATTR_FIELD_USER_DATA |
                                                   UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                                   .cb.send = on_bundle_sent, .user_data = b};
        b->ep_gen = s->ep_gen;
        req = ucp_am_send_nbx(s->ep, PS_AM_DATA, b->hdr, hlen, b->buf, b->len, &prm);
        st = req == NULL ? UCS_OK : UCS_PTR_IS_ERR(req) ? UCS_PTR_STATUS(req) : UCS_INPROGRESS;
    }
    if (st != UCS_INPROGRESS)
        on_bundle_sent(NULL, st, b);
    else
        bundle_fly(c, b, 1);
}

/* Inside on_deferred, put a small part into its shard's bundle instead of sending it alone.
 * @return 0 when it is in a bundle; otherwise the caller sends it alone. */
static int bundle_part(ps_client_t *c, part_t *p, const ps_msg_t *m, const void *data, size_t len)
{
    cshard_t *s = &c->shards[p->shard];
    size_t cap = __atomic_load_n(&c->fusion_bytes, __ATOMIC_RELAXED);
    if (!c->fusing || cap == 0 || len > PS_BUNDLE_PART_MAX || s->ep == NULL || s->dead ||
        s->down || ps_bundle_entry_bytes(sizeof p->hdr, len) > cap)
        return -1;
    for (int tries = 0; tries < 2; tries++) {
        bundle_t *b = s->open;
        if (b == NULL) {
            if ((b = c->free_bundles) != NULL)
                c->free_bundles = b->next_free;
            else if ((b = calloc(1, sizeof *b)) == NULL)
                return -1;
            if (b->cap < cap) {
                uint8_t *nb = realloc(b->buf, cap);
                if (nb == NULL) {
                    b->next_free = c->free_bundles;
                    c->free_bundles = b;
                    return -1;
                }
                b->buf = nb;
                b->cap = cap;
            }
            b->c = c;
            b->shard = p->shard;
            b->len = 0;
            b->count = 0;
            s->open = b;
        }
        if (b->count == b->cap_parts) {
            uint32_t nc = b->cap_parts ? 2 * b->cap_parts : 64;
            part_t **np = realloc(b->parts, nc * sizeof *np);
            if (np == NULL) {
                if (b->count == 0) { /* nothing in it: back to the free list, not sent */
                    s->open = NULL;
                    b->next_free = c->free_bundles;
                    c->free_bundles = b;
                }
                return -1;
            }
            b->parts = np;
            b->cap_parts = nc;
        }
        if (b->count < PS_BUNDLE_MAX_ENTRIES &&
            ps_bundle_add(b->buf, b->cap, &b->len, m, data, len) == 0) {
            b->parts[b->count++] = p;
            p->op->ucx_refs++;
            return 0;
        }
        if (b->count == 0) return -1;
        bundle_flush(c, p->shard); /* full: send it and start the next */
    }
    return -1;
}

/* Send (or send again) one chunk of a push or pull. */
static void send_data_part(ps_client_t *c, ps_op_t *op, part_t *p)
{
    const ctensor_t *t = c->tensors[op->tensor];
    uint64_t len = ps_chunk_len(t->numel, c->chunk_elems, p->chunk);
    if (c->trace) {
        /* The comm thread takes the chunk (before its CRC or copy): the op's hand-over from
         * the caller ends at the first of these (bench/round_timeline.py). */
        char args[48];
        snprintf(args, sizeof args, "{\"op\":\"%s\",\"shard\":%u}",
                 op->type == OP_PUSH ? "push" : "pull", p->shard);
        trace_chunk(c, p, "took", args);
    }
    ps_msg_t m = {.req_id = op->req_id, .rank = rank_now(c), .tensor = t->id, .chunk = p->chunk,
                  .step = op->step};
    p->resend = 0;
    p->held = 0;
    if (op->type == OP_PUSH) {
        m.type = PS_MSG_PUSH;
        m.length = p->len;
        if (!p->raw) {
            m.codec = t->codec.kind;
            m.codec_fraction = t->codec.fraction;
            m.codec_block = t->codec.block;
            m.codec_flags = t->codec.fp16_values ? 1 : 0;
        }
        /* The members of its step: the newest view that covers that step. A later step's view
         * may have come already, even before the first send (a restarted coordinator's hello
         * reply names the step after the one this worker still pushes): a shard takes a push's
         * view as starting at the push's step, so such a view never goes on it. None known
         * (all older ones left the ring): the last one it carried, or none. */
        const ps_view_t *v = ps_views_for_step(&c->views, op->step);
        if (v) {
            op->view_epoch = v->epoch;
            op->view_members = v->members;
        }
        m.epoch = op->view_epoch;
        m.members = op->view_members;
        if (op->has_progress) { /* a resend carries its batch's, not a newer one's */
            m.samples = op->progress;
            m.flags |= PS_FLAG_PROGRESS;
        }
        if (op->batch_stamp) { /* asp / ssp: no step tells a batch's pushes */
            m.flags |= PS_FLAG_BATCH;
            m.data_epoch = op->batch_pass;
            m.batch_offset = op->batch_offset;
        }
        m.nreplay = op->nreplay;
        memcpy(m.replay, op->replay, op->nreplay * sizeof *m.replay);
        if (op->nograd) { /* no data: counted as this member's push, summed as nothing */
            m.flags |= PS_FLAG_NOGRAD;
            m.length = 0;
            m.codec = PSK_CODEC_NONE;
            m.codec_fraction = 0;
            m.codec_block = 0;
            m.codec_flags = 0;
            __atomic_add_fetch(&c->stats.pushes, 1, __ATOMIC_RELAXED);
            if (bundle_part(c, p, &m, NULL, 0) == 0) return;
            send_part(c, p, &m, NULL, 0, PS_AM_CTRL);
            return;
        }
        __atomic_add_fetch(&c->stats.bytes_pushed, p->len, __ATOMIC_RELAXED);
        __atomic_add_fetch(&c->stats.bytes_pushed_raw, len * 4, __ATOMIC_RELAXED);
        __atomic_add_fetch(&c->stats.pushes, 1, __ATOMIC_RELAXED);
        p->ck.direct = 0;
        uint64_t off = p->ck.have_crc || t->codec.kind != PSK_CODEC_NONE || p->raw
                           ? UINT64_MAX
                           : area_place(&c->shards[p->shard], (ctensor_t *)t, p->chunk, p->len);
        if (off != UINT64_MAX) {
            /* A first send to a shard whose area is mapped here: the gradient is written into
             * it with its CRC folded into the copy, and only the header travels. Resends go
             * over the transport. Streaming stores: psd reads the chunk next, on another CPU,
             * and this copy's lines would otherwise first be taken from that CPU's cache
             * (where psd read the last step's) and then be taken back (ps_crc32c_copy_nt). */
            uint8_t *dst = c->shards[p->shard].area + off;
            p->ck.crc = ps_crc32c_copy_nt(0, dst, p->data, p->len);
            p->ck.have_crc = 1;
            p->ck.direct = 1;
            t->places[p->chunk].busy = 1;
            t->places[p->chunk].req = op->req_id;
            if (c->test_corrupt_push && p->len && ++c->test_push_count % c->test_corrupt_push == 0)
                dst[p->len / 2] ^= 0x10; /* the test hook, after the CRC */
            m.flags |= PS_FLAG_DIRECT;
            m.area_offset = off;
            m.crc32c = p->ck.crc;
            __atomic_add_fetch(&c->stats.bytes_pushed_direct, p->len, __ATOMIC_RELAXED);
            /* Only a small gradient's header waits in a bundle: a large one's goes now, so psd
             * applies this chunk while the next one is copied (a bundle leaves at the end of
             * the batch, after every chunk's copy). send_part sends the shard's open bundle
             * first, so the shard still sees this connection's messages in order. */
            if (p->len <= PS_BUNDLE_PART_MAX && bundle_part(c, p, &m, NULL, 0) == 0) return;
            send_part(c, p, &m, NULL, 0, PS_AM_CTRL);
            return;
        }
        if (!p->ck.have_crc) {
            /* Here, just before the chunk's first send, rather than for every chunk on the
             * caller's thread before the op is submitted: the first chunk leaves at once and
             * the later chunks' checksums overlap the earlier ones' transfers. A resend
             * carries the same bytes, so the same CRC. */
            p->ck.crc = ps_crc32c(0, p->data, p->len);
            p->ck.have_crc = 1;
        }
        m.crc32c = p->ck.crc;
        const void *data = test_corrupt_push(c, p);
        if (bundle_part(c, p, &m, data, p->len) == 0) {
            free(p->ck.copy); /* the bundle has its own copy */
            p->ck.copy = NULL;
            return;
        }
        send_part(c, p, &m, data, p->len, PS_AM_DATA);
    } else {
        m.type = PS_MSG_PULL;
        m.codec = t->pull_codec.kind;
        if (c->shards[p->shard].view_open && m.codec == PSK_CODEC_NONE) m.flags |= PS_FLAG_DIRECT;
        p->ck.direct = (m.flags & PS_FLAG_DIRECT) != 0;
        __atomic_add_fetch(&c->stats.pulls, 1, __ATOMIC_RELAXED);
        if (bundle_part(c, p, &m, NULL, 0) == 0) return;
        send_part(c, p, &m, NULL, 0, PS_AM_CTRL);
    }
}

static void on_leave_timer(uv_timer_t *h);

/* How long a leave waits for the shards' answers: the hello deadline (a shard busy for a moment
 * still answers), at most PS_LEAVE_WAIT_MS. */
#define PS_LEAVE_WAIT_MS 5000u
static uint32_t leave_wait_ms(const ps_client_t *c)
{
    return c->hello_deadline_ms < PS_LEAVE_WAIT_MS ? c->hello_deadline_ms : PS_LEAVE_WAIT_MS;
}

static void on_rehello(ps_op_t *op);

/* A reconnect's hello to shard @p i is on its way. */
static int rehello_pending(const ps_client_t *c, uint32_t i)
{
    for (const ps_op_t *op = c->inflight; op; op = op->next)
        if (op->on_done == on_rehello && op->parts[0].shard == i && op->parts[0].pending) return 1;
    return 0;
}

static void start_op(ps_client_t *c, ps_op_t *op)
{
    op->next = c->inflight;
    c->inflight = op;
    op->ucx_refs++; /* held until the end: nothing completes the op halfway */
    if (__atomic_load_n(&c->interrupted, __ATOMIC_ACQUIRE) && op->type != OP_LEAVE &&
        op->on_done == NULL) {
        op_fail(op, PS_ECANCELED, "interrupted");
        goto done;
    }
    if (c->removed && op->type != OP_LEAVE && op->on_done == NULL) {
        op_fail(op, PS_ENOTMEMBER, "this worker was removed from the job");
        goto done;
    }
    switch (op->type) {
    case OP_ECHO:
    case OP_VALUES:
        send_part(c, &op->parts[0], &op->req, op->buf, op->req.length, PS_AM_DATA);
        break;
    case OP_HELLO:
    case OP_BATCH:
    case OP_FORGET:
    case OP_DECLARE: {
        part_t *p = &op->parts[0];
        if (op->type == OP_HELLO && connect_shard(c, p->shard))
            op_fail(op, PS_ETRANSPORT, "cannot reach shard %u", p->shard);
        else
            send_part(c, p, &op->req, NULL, 0, PS_AM_CTRL);
        break;
    }
    case OP_LEAVE: {
        /* Done when each shard has answered (MSG_LEAVE_REPLY), or was not reachable (its
         * part is done: part_spared), or after leave_wait_ms (on_leave_timer). The caller
         * closes the connections only then: a close that overtook the leave would make shard 0
         * hold the rank for a process that may come back (up to 15 s for one on another host).
         * No heartbeat follows a leave: a shard that took it would refuse one. */
        op->req.type = PS_MSG_LEAVE; /* flags and step: a batch done (ps_client_batch_done) */
        op->req.req_id = op->req_id;
        op->req.rank = rank_now(c);
        c->leaving = 1;
        for (uint32_t i = 0; i < c->nshards; i++) /* no reconnect either (shard_lost) */
            uv_timer_stop(&c->shards[i].timer);
        for (uint32_t i = 0; i < op->nparts; i++) {
            part_t *p = &op->parts[i];
            if (c->shards[p->shard].down && rehello_pending(c, p->shard))
                p->resend = 1; /* its answer takes the rank back: the leave follows it */
            else
                send_part(c, p, &op->req, NULL, 0, PS_AM_CTRL);
        }
        if (op->remaining > 0)
            uv_timer_start(&c->leave_timer, on_leave_timer, leave_wait_ms(c), 0);
        break;
    }
    case OP_PUSH:
    case OP_PULL: {
        int copied = 0, later = 0;
        if (op->type == OP_PUSH) { /* the batch it is for: the current one (bsp: of its step) */
            op->batch_stamp = c->batch_stamp;
            op->batch_pass = c->batch_pass;
            op->batch_offset = c->batch_offset;
            op->has_progress = c->has_progress;
            op->progress = c->progress;
            op->nreplay = c->nreplay && (c->batch_stamp || op->step == c->replay_step)
                              ? c->nreplay
                              : 0;
            memcpy(op->replay, c->replay, op->nreplay * sizeof *op->replay);
        }
        for (uint32_t i = 0; i < op->nparts; i++) c->shards[op->parts[i].shard].in_window = 0;
        for (uint32_t i = 0; i < op->nparts && op->status == 0; i++) {
            part_t *p = &op->parts[i];
            cshard_t *s = &c->shards[p->shard];
            if (op->type == OP_PUSH && s->windowed && p->len > PS_BUNDLE_PART_MAX &&
                s->in_window >= PS_PUSH_WINDOW) {
                p->held = HELD_WINDOW; /* sent when an earlier one's send completes (part_sent) */
                continue;
            }
            if (op->type == OP_PUSH && copied && p->len > PS_BUNDLE_PART_MAX && s->area) {
                /* A later large chunk bound for a mapped area: copied on a later turn of the
                 * loop (copy_turn). One for a shard without (another host's) goes now, under
                 * the push window where that applies. */
                p->held = HELD_COPY;
                later = 1;
                continue;
            }
            send_data_part(c, op, p);
            copied |= p->ck.direct && p->len > PS_BUNDLE_PART_MAX;
            /* Not completed at once (eager); a direct push's header holds no data. */
            if (p->ck.sending && !p->ck.direct) s->in_window++;
        }
        if (later) {
            op->ucx_refs++; /* released by copy_turn once every held part went */
            op->copy_at = 0;
            op->copy_next = NULL;
            if (c->copy_tail)
                c->copy_tail->copy_next = op;
            else
                c->copy_head = op;
            c->copy_tail = op;
        }
        break;
    }
    }
done:
    op->ucx_refs--;
    op_maybe_complete(op);
}

/* ---- comm thread: losing and regaining a shard ----------------------------------- */

static uint64_t now_ms(void) { return mono_ns() / 1000000; }

/* Fail (give_up) or keep for resending every pending part on shard i. */
static void parts_on_shard(ps_client_t *c, uint32_t i, int give_up)
{
again:
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        int hit = 0;
        for (uint32_t k = 0; k < op->nparts; k++) {
            part_t *p = &op->parts[k];
            if (!p->pending || p->shard != i) continue;
            hit |= op->type == OP_LEAVE; /* done (part_spared): it may complete the op */
            if (!part_spared(c, p, give_up, c->shards[i].ep_gen)) {
                const cshard_t *s = &c->shards[i];
                if (s->gone && s->gone_why[0]) /* the caller's last line says why */
                    op_fail(op, PS_ETRANSPORT, "shard %u (%s:%u) %s", i, c->m.servers[i].host,
                            c->m.servers[i].port, s->gone_why);
                else
                    op_fail(op, PS_ETRANSPORT, "lost the connection to shard %u (%s:%u)", i,
                            c->m.servers[i].host, c->m.servers[i].port);
                hit = 1;
                break;
            }
        }
        if (!hit) continue;
        /* The op may be gone after this, and its completion may have run others (a re-hello's
         * on_done): the list is walked again from its head. A part handled here is no longer
         * pending (or waits with resend set, without completing anything), so this ends. */
        op_maybe_complete(op);
        goto again;
    }
}

static void on_reconnect_timer(uv_timer_t *h);

/* A leave some shard did not answer within leave_wait_ms (a stopped or hung psd): it ends
 * anyway; that shard drops this worker when the connection closes, or by its heartbeat
 * timeout. Its endpoint is closed now (on_deferred), so that a send UCX still holds (a full
 * socket towards a stopped process) completes, canceled, and cannot hold the op. */
static void on_leave_timer(uv_timer_t *h)
{
    ps_client_t *c = h->data;
again:
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        if (op->type != OP_LEAVE || op->remaining == 0) continue;
        for (uint32_t i = 0; i < op->nparts; i++)
            if (op->parts[i].pending) {
                uint32_t s = op->parts[i].shard;
                PS_LOG(PS_LOG_WARN, "libps", "shard %u (%s:%u) did not answer the leave in %u ms",
                       s, c->m.servers[s].host, c->m.servers[s].port, leave_wait_ms(c));
                part_done(&op->parts[i]);
                if (c->shards[s].ep && !c->shards[s].dead)
                    c->shards[s].dead = c->shards[s].close_queued = 1;
            }
        op_maybe_complete(op); /* the op may be gone after this */
        goto again;
    }
}

/* A view message on its way (forward_msg): its header, which UCX reads until the send
 * completes, on c->forwards until then, so that a transport restart or the comm thread's end,
 * after which no completion comes, frees what is left (forwards_free). */
typedef struct fwd_s {
    ps_client_t *c;
    struct fwd_s *prev, *next;
    uint8_t hdr[128];
} fwd_t;

static void fwd_unlink(fwd_t *f)
{
    if (f->prev) f->prev->next = f->next;
    else f->c->forwards = f->next;
    if (f->next) f->next->prev = f->prev;
}

static void on_forward_sent(void *request, ucs_status_t status, void *user_data)
{
    fwd_t *f = user_data;
    fwd_unlink(f);
    free(f);
    if (request) ucp_request_free(request);
}

/* Free the headers of view messages whose sends will never complete: call only once the UCX
 * worker that held them is gone (transport_restart, the comm thread's end). */
static void forwards_free(ps_client_t *c)
{
    while (c->forwards) {
        fwd_t *f = c->forwards;
        fwd_unlink(f);
        free(f);
    }
}

/* Tell shard i the membership this worker knows (MSG_EPOCH, fire and forget). */
static void forward_msg(ps_client_t *c, uint32_t i, const ps_msg_t *view);

static void forward_view(ps_client_t *c, uint32_t i)
{
    const ps_view_t *v = ps_views_newest(&c->views);
    if (v == NULL) return;
    ps_msg_t m = {.type = PS_MSG_EPOCH, .epoch = v->epoch, .step = v->from,
                  .members = v->members, .rank = rank_now(c)};
    forward_msg(c, i, &m);
}

/* Send view message @p view to shard @p i (when it is connected). */
static void forward_msg(ps_client_t *c, uint32_t i, const ps_msg_t *view)
{
    cshard_t *s = &c->shards[i];
    if (s->ep == NULL || s->dead || s->down) return;
    fwd_t *f = malloc(sizeof *f);
    size_t len;
    if (f == NULL ||
        ps_msg_encode_sealed(view, s->tok.b, s->tok.len, f->hdr, sizeof f->hdr, &len)) {
        free(f);
        return;
    }
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA |
                                               UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_REPLY,
                               .cb.send = on_forward_sent, .user_data = f};
    void *req = ucp_am_send_nbx(s->ep, PS_AM_CTRL, f->hdr, len, NULL, 0, &prm);
    if (req == NULL || UCS_PTR_IS_ERR(req)) {
        free(f);
        return;
    }
    /* In flight (its completion comes from a later progress call, never from this one): */
    f->c = c;
    f->prev = NULL;
    f->next = c->forwards;
    if (c->forwards) c->forwards->prev = f;
    c->forwards = f;
}

/* Adopt a newer membership (from a batch reply or MSG_EPOCH); @p forward: tell the others. */
static void learn_view(ps_client_t *c, uint64_t epoch, uint64_t from, uint64_t members, int forward)
{
    if (!ps_views_learn(&c->views, epoch, from, members)) return;
    if (forward)
        for (uint32_t i = 1; i < c->nshards; i++) forward_view(c, i);
}

/* The coordinator no longer counts this worker as a member: fail everything now, and
 * every later operation, with PS_ENOTMEMBER (the caller joins again with a new client). */
static void mark_removed(ps_client_t *c)
{
    if (c->removed) return;
    c->removed = 1;
    PS_LOG(PS_LOG_WARN, "libps", "rank %d was removed from the job", rank_now(c));
    for (ps_op_t *op = c->inflight, *nx; op; op = nx) {
        nx = op->next;
        if (op->on_done) continue;
        op_fail(op, PS_ENOTMEMBER, "this worker (rank %d) was removed from the job", rank_now(c));
        op_maybe_complete(op);
    }
}

/* What a shard that lost its store is told with, and the remedy (on_rehello, join_store_check,
 * join_run_check). */
#define STORE_REMEDY "start every shard from one checkpoint (psctl restore D prints the commands)"
#define STORE_LOST "store was lost or replaced (an empty or another data_dir); " STORE_REMEDY

/* What a hello reply's run says of a store's history, into @p buf: "restored from checkpoint
 * ID at step N" (ID as psd --restore recorded it: meta.json's "checkpoint"; for a checkpoint
 * without one, its step + 1 with bit 63 set), or "never restored". */
static void run_said(char *buf, size_t len, uint64_t origin, uint64_t base)
{
    if (origin == 0)
        snprintf(buf, len, "never restored");
    else
        snprintf(buf, len, "restored from checkpoint %016llx at step %llu",
                 (unsigned long long)origin, (unsigned long long)base);
}

static void on_rehello(ps_op_t *op)
{
    ps_client_t *c = op->c;
    uint32_t i = op->parts[0].shard;
    cshard_t *s = &c->shards[i];
    if (op->status == PS_ENOTMEMBER) {
        PS_LOG(PS_LOG_WARN, "libps", "shard %u: %s", i, op->err);
        mark_removed(c);
        if (c->leaving) parts_on_shard(c, i, 1); /* a leave waiting for this hello: not a member */
        return;
    }
    if (op->status == 0 && (op->reply.flags & PS_FLAG_TENSORS) && op->reply.count == 0 &&
        (__atomic_load_n(&c->had_batch, __ATOMIC_ACQUIRE) ||
         (c->join_tensors > 0 && c->join_step > 0))) {
        /* It came back with an empty table after this worker trained, or joined a job past
         * step 0 with tensors: its store was lost (an empty or another data_dir). Its pushes would fail with "no tensor with id", and a
         * worker joining next would make it create the tensors again from their initial
         * values (found by a probe, session 40). */
        op->status = PS_ECONFIG;
        snprintf(op->err, sizeof op->err, "it came back without the model (no tensors) after "
                 "this worker trained: its " STORE_LOST);
    }
    uint64_t run = __atomic_load_n(&s->run, __ATOMIC_RELAXED);
    if (op->status == 0 && (op->reply.flags & PS_FLAG_RUN) && run != 0 && op->reply.run != run) {
        /* Its store is another than at the join: restored from a checkpoint (or replaced) while
         * this worker trained. Its steps went back to the checkpoint's; under asp the updates
         * since then were lost while counted as applied (a probe, session 40). */
        char was[96];
        run_said(was, sizeof was, op->reply.run_origin, op->reply.run_base);
        op->status = PS_ECONFIG;
        snprintf(op->err, sizeof op->err, "it came back as another store (%.72s) than this "
                 "worker joined: " STORE_REMEDY, was);
    }
    if (op->status == 0 && (op->reply.flags & PS_FLAG_RUN) && run == 0)
        __atomic_store_n(&s->run, op->reply.run, __ATOMIC_RELAXED); /* the join's psd said none */
    if (op->status == PS_ECONFIG || op->status == PS_EAUTH) {
        /* The shard came back under another configuration (a restore onto another manifest,
         * another secret): this worker's manifest no longer fits it, and asking again cannot
         * change that. */
        PS_LOG(PS_LOG_ERROR, "libps", "shard %u refused this worker back: %s", i, op->err);
        snprintf(s->gone_why, sizeof s->gone_why, "refused this worker back: %.450s", op->err);
        s->gone = 1;
        if (s->ep && !s->dead) s->dead = s->close_queued = 1;
        parts_on_shard(c, i, 1);
        return;
    }
    if (op->status == 0 && op->reply.rank != rank_now(c)) {
        PS_LOG(PS_LOG_ERROR, "libps", "shard %u gave rank %d back, not %d", i, op->reply.rank,
               rank_now(c));
        s->gone = 1;
        op->status = PS_EPROTO;
    }
    if (op->status == 0) {
        PS_LOG(PS_LOG_INFO, "libps", "shard %u (%s:%u) is back after %llu ms", i,
               c->m.servers[i].host, c->m.servers[i].port,
               (unsigned long long)(now_ms() - s->down_since_ms));
        s->down = 0;
        s->silent = 0;
        if (i > 0) forward_view(c, i); /* a restarted shard learns the step's members */
        else if (op->reply.members) /* the coordinator's current membership, missed while away */
            learn_view(c, op->reply.epoch, op->reply.step, op->reply.members, 1);
        /* Send again whatever it had not answered: a push it already applied is acked
         * and dropped, so every step is applied exactly once. */
        for (ps_op_t *o = c->inflight, *nx; o; o = nx) {
            nx = o->next;
            int sent = 0;
            for (uint32_t k = 0; k < o->nparts; k++)
                if (o->parts[k].resend && o->parts[k].shard == i && o->parts[k].pending) {
                    part_t *p = &o->parts[k];
                    p->resend = 0;
                    PS_LOG(PS_LOG_DEBUG, "libps", "shard %u: sends again part %u of op type %d "
                           "(step %llu)", i, k, o->type, (unsigned long long)o->step);
                    if (p->ck.sending || p->ck.receiving) {
                        /* The old connection's send still holds its header, or its reply
                         * still lands in the part's buffer: the part goes once that request
                         * ends (part_sent; on_pull_recv's failure, part_defer), not now. */
                        p->ck.again = 1;
                        continue;
                    }
                    part_send_again(c, o, p);
                    sent = 1;
                }
            if (sent) op_maybe_complete(o); /* a resend that failed at once may finish it */
        }
        return;
    }
    /* Refused or unreachable: close this endpoint (from the deferred hook, never from
     * inside a UCX callback); shard_lost then schedules the next attempt. Without an
     * endpoint (the address did not resolve), schedule it here. */
    if (s->ep && !s->dead) {
        s->dead = 1;
        s->close_queued = 1;
    } else if (s->ep == NULL) {
        shard_lost(c, i);
    }
}

/* What a hello says of this worker's manifest (PS_FLAG_CONF), for shard @p i to check. */
static void hello_conf(const ps_client_t *c, ps_msg_t *m, uint32_t i)
{
    m->flags |= PS_FLAG_CONF;
    m->length = c->m.chunk_bytes;
    m->consistency = (uint32_t)c->m.job.consistency;
    m->shard = i;
    m->count = c->nshards;
}

static void on_reconnect_timer(uv_timer_t *h)
{
    cshard_t *s = h->data;
    ps_client_t *c = s->c;
    ps_op_t *op = calloc(1, sizeof *op + sizeof(part_t));
    if (op == NULL) {
        uv_timer_start(&s->timer, on_reconnect_timer, 1000, 0); /* try again later */
        return;
    }
    op->c = c;
    op->type = OP_HELLO;
    op->req_id = __atomic_add_fetch(&c->next_req, 1, __ATOMIC_RELAXED);
    op->nparts = op->remaining = 1;
    op->min_version = UINT64_MAX;
    op->on_done = on_rehello;
    op->submit_ns = mono_ns(); /* hello_overdue: unanswered for hello_deadline_ms */
    op->parts[0] = (part_t){.op = op, .shard = s->index, .pending = 1};
    op->req = (ps_msg_t){.type = PS_MSG_HELLO, .rank = rank_now(c), .pid = (uint32_t)getpid(),
                         .samples = c->join_serial, .store_id = ps_storeview_host_id()};
    hello_conf(c, &op->req, s->index);
    snprintf(op->req.cluster, sizeof op->req.cluster, "%s", c->m.cluster);
    op->req.req_id = op->req_id;
    start_op(c, op);
    ps_ucx_progress(&c->ucx);
}

static void shard_lost_now(ps_client_t *c, uint32_t i);

/* Shard i's endpoint is gone. Before the join that is an error; after it, pushes and
 * pulls wait while the client reconnects with capped backoff (50 ms doubling to 1 s)
 * until the connect timeout, then they fail. */
static void shard_lost(ps_client_t *c, uint32_t i)
{
    cshard_t *s = &c->shards[i];
    s->dead = 0;
    if (s->losing) return; /* a re-hello failed by the parts_on_shard below: handled there */
    s->losing = 1;
    shard_lost_now(c, i);
    s->losing = 0;
}

static void shard_lost_now(ps_client_t *c, uint32_t i)
{
    cshard_t *s = &c->shards[i];
    /* Leaving: no reconnect, whose hello would take the rank back at shard 0 just before the
     * connection closes for good. */
    if (!__atomic_load_n(&c->joined, __ATOMIC_ACQUIRE) || s->gone || c->leaving) {
        parts_on_shard(c, i, 1);
        return;
    }
    if (!s->down) {
        PS_LOG(PS_LOG_WARN, "libps", "lost shard %u (%s:%u); reconnecting", i,
               c->m.servers[i].host, c->m.servers[i].port);
        s->down = 1;
        s->down_since_ms = now_ms();
        s->backoff_ms = 50;
    } else if (now_ms() - s->down_since_ms >= c->reconnect_ms) {
        /* Checked as an attempt fails, so the time said is the time it took (a little more
         * than the timeout: an attempt's hello waits up to hello_deadline_ms). */
        /* Its parts fail saying so too: a program sees it in its error, not only in the log
         * (psd.torch's PsError said "lost the connection to shard 1"; a helper's probe). */
        snprintf(s->gone_why, sizeof s->gone_why, "did not come back in %llu ms (the reconnect "
                 "timeout is %u ms)", (unsigned long long)(now_ms() - s->down_since_ms),
                 c->reconnect_ms);
        PS_LOG(PS_LOG_ERROR, "libps", "shard %u (%s:%u) %s", i, c->m.servers[i].host,
               c->m.servers[i].port, s->gone_why);
        s->gone = 1;
        parts_on_shard(c, i, 1);
        return;
    } else {
        s->backoff_ms = s->backoff_ms * 2 > 1000 ? 1000 : s->backoff_ms * 2;
    }
    uv_timer_start(&s->timer, on_reconnect_timer, s->backoff_ms, 0);
    parts_on_shard(c, i, 0);
}

/* Start this worker's transport again (ps_ucx_restart) and reconnect every shard: what was
 * pending on any of them waits and is sent again, as after a lost shard. For a worker whose
 * UCX was left wedged by a shard killed mid-send (see hello_overdue). */
static void transport_restart(ps_client_t *c)
{
    for (uint32_t i = 0; i < c->nshards; i++) /* their requests complete now, canceled */
        ps_ucx_ep_close(&c->ucx, &c->shards[i].ep, 1);
    /* The reconnects' hellos went out on the old endpoints: each fails, and its on_rehello
     * (no endpoint now) schedules the next attempt. Completing one may complete others: the
     * walk starts again from the head each time. */
again:
    for (ps_op_t *op = c->inflight; op; op = op->next)
        if (op->type == OP_HELLO && op->on_done && op->parts[0].pending) {
            op_fail(op, PS_ETIMEDOUT, "the transport was started again");
            op_maybe_complete(op);
            goto again;
        }
    int rc = ps_ucx_restart(&c->ucx);
    /* No callback of the old worker comes any more: what its requests still held (a send a
     * close did not finish, a rendezvous receive, a bundle in flight) is released here;
     * shard_lost below marks every part still waiting to be sent again once its shard is
     * back. */
    while (c->flying) {
        bundle_t *b = c->flying;
        bundle_fly(c, b, 0);
        b->count = 0;
        b->len = 0;
        b->next_free = c->free_bundles;
        c->free_bundles = b;
    }
    c->copy_head = c->copy_tail = NULL; /* their refs go too; shard_lost resends the parts */
    forwards_free(c);
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        op->ucx_refs = 0;
        for (uint32_t k = 0; k < op->nparts; k++) {
            part_t *p = &op->parts[k];
            p->ck.sending = p->ck.receiving = p->ck.again = 0;
            p->held = 0;
        }
    }
    for (uint32_t i = 0; i < c->nshards; i++) {
        cshard_t *s = &c->shards[i];
        s->open = NULL;
        s->dead = s->close_queued = s->hb_inflight = 0;
        s->backoff_ms = 25; /* a shard already down: its next try in 50 ms */
        if (rc) { /* no transport: everything fails from now on */
            s->gone = 1;
            uv_timer_stop(&s->timer);
        }
        shard_lost(c, i);
    }
    if (rc)
        PS_LOG(PS_LOG_ERROR, "libps", "cannot start the transport again: %s", ps_strerror(rc));
again_done:
    for (ps_op_t *op = c->inflight; op; op = op->next)
        if (op->remaining == 0 && !op->done) {
            op_maybe_complete(op);
            goto again_done;
        }
}

/* Hellos unanswered for hello_deadline_ms. A join's fails and is tried again (below). A
 * reconnect's: a restarted psd answers at once; what was seen instead (faults:psd_crash_coordinator, about 1
 * run in 150): a shard killed while it was sending to this worker over shared memory left
 * UCX 1.13's transport here wedged (ucp_worker_arm busy for good, and the new shard's answer
 * never came), and after heartbeat_timeout_ms the shard dropped this worker. So the worker's
 * transport starts again (transport_restart), well before that. */
static void hello_overdue(ps_client_t *c)
{
    uint64_t now = mono_ns(), limit = (uint64_t)c->hello_deadline_ms * 1000000u;
again:
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        if (op->type != OP_HELLO || !op->parts[0].pending || now - op->submit_ns < limit)
            continue;
        uint32_t i = op->parts[0].shard;
        const ps_server_conf_t *sc = &c->m.servers[i];
        cshard_t *s = &c->shards[i];
        /* A join's hello fails (join() tries again until its timeout), and so does a
         * reconnect's to a shard lost because it fell silent (shard_silent), or whose name
         * resolved to another address since (the next attempt goes there), while this
         * worker's transport is not stuck: that shard is down or stopped, and on_rehello tries
         * again (a transport restart would reset every other shard's connection each time).
         * Its endpoint is closed, which also ends a send UCX holds for it, so that a shard that
         * took the connection but never answers cannot hold the op for good. */
        if (op->on_done == NULL ||
            ((s->silent || s->moved) && !c->leaving && ps_ucx_stuck_ns(&c->ucx) == 0)) {
            op_fail(op, PS_ETIMEDOUT, "shard %u (%s:%u) did not answer its hello in %u ms", i,
                    sc->host, sc->port, c->hello_deadline_ms);
            if (s->ep && !s->dead) s->dead = s->close_queued = 1;
            op_maybe_complete(op);
            goto again;
        }
        if (c->leaving) continue; /* no reconnect any more (shard_lost) */
        PS_LOG(PS_LOG_WARN, "libps", "shard %u (%s:%u) did not answer the hello of a reconnect "
               "in %u ms: starting this worker's transport again and reconnecting every shard",
               i, sc->host, sc->port, c->hello_deadline_ms);
        transport_restart(c);
        return;
    }
}

/* How long the UCX worker may stay unarmable (ucp_worker_arm busy, nothing progressing) while
 * this client has nothing in flight, before its transport starts again. */
#define UNARMABLE_NS (2000ull * 1000000u)

/* A shard killed and started again several times in a row (a probe, session 45: shard 0 three
 * times 0.5 s apart, 5 runs of 5) can leave UCX 1.13's worker busy for good though everything
 * else works: the loop never sleeps (ucx_loop.c keeps polling it), and four such workers on two
 * CPUs ran every step ~4x slower until the job's end. Nothing in flight, a healthy worker arms
 * at once; busy for UNARMABLE_NS so is the wedge: its transport starts again (as for an
 * overdue hello), which drops what the old UCP worker held. At most once a minute. */
static void unarmable(ps_client_t *c)
{
    uint64_t now = mono_ns(), since = c->ucx.busy_since_ns;
    if (since == 0 || now - since < UNARMABLE_NS) return;
    /* Nothing in flight now, or seen busy while it had nothing in flight within the last 2 s
     * (ucx_loop.c's idle_busy_ns): a worker that always has a step's op out at a tick
     * (psworker's run left one at no tick of a 9 s run, 1 run in 4) is still seen. */
    uint64_t seen = c->ucx.idle_busy_ns;
    if (c->inflight != NULL && (seen == 0 || now - seen >= UNARMABLE_NS)) return;
    if (c->unarmable_restart_ns && now - c->unarmable_restart_ns < 60ull * 1000000000u) return;
    c->unarmable_restart_ns = now;
    PS_LOG(PS_LOG_WARN, "libps", "the UCX worker could not be put to sleep for %.1f s, busy "
           "also with nothing in flight (UCX left busy by a shard that went away): starting this "
           "worker's transport again and reconnecting every shard", (double)(now - since) / 1e9);
    transport_restart(c);
}

/* ps_ucx_t's owner_idle: whether this client waits for nothing (comm thread). */
static int waits_for_nothing(void *arg)
{
    const ps_client_t *c = arg;
    return c->inflight == NULL;
}

static void on_heartbeat_sent(void *request, ucs_status_t status, void *user_data)
{
    cshard_t *s = user_data;
    s->hb_inflight = 0;
    if (request) ucp_request_free(request);
}

/* The caller's ops (pushes, pulls, batch requests, declarations) that have waited for a shard
 * longer than 4 heartbeat timeouts (at least 5 s) are said once each, naming the shard: a
 * stopped or hung coordinator, or a step waiting for a member that does not push, would
 * otherwise leave the worker silent (it waits, as it should, until the shard answers or is
 * given up). */
static void ops_overdue(ps_client_t *c)
{
    uint64_t now = mono_ns(), limit = (uint64_t)c->m.job.heartbeat_timeout_ms * 4000000u;
    if (limit < 5000000000ull) limit = 5000000000ull;
    for (uint32_t i = 0; i < c->nshards; i++) {
        /* One line per shard for the ops that passed the limit since the last tick (a step's
         * pushes wait together: each said its own line before, a probe found). */
        const ps_op_t *first = NULL;
        uint32_t more = 0;
        for (ps_op_t *op = c->inflight; op; op = op->next) {
            if (op->on_done || op->slow_said || op->done || op->submit_ns == 0 ||
                now - op->submit_ns < limit)
                continue;
            uint32_t k = 0;
            while (k < op->nparts && !op->parts[k].pending) k++;
            if (k == op->nparts || op->parts[k].shard != i) continue; /* said for its own */
            op->slow_said = 1;
            if (first == NULL)
                first = op;
            else
                more++;
        }
        if (first == NULL) continue;
        char also[48] = "";
        if (more) snprintf(also, sizeof also, " (and %u more operations)", more);
        PS_LOG(PS_LOG_WARN, "libps", "a %s has waited %llu s for shard %u (%s:%u)%s%s; still "
               "waiting", op_name(first->type),
               (unsigned long long)((now - first->submit_ns) / 1000000000u), i,
               c->m.servers[i].host, c->m.servers[i].port, also,
               i == 0 && first->type == OP_BATCH
                   ? " (the coordinator: its step waits for other members, or it is stopped "
                     "or overloaded)"
                   : "");
    }
}

/* A shard that answers heartbeats (PS_FLAG_ANSWER) and that nothing came from for
 * silent_ms (2 heartbeat timeouts, at least 2 s) while connected: a dead host, a cut network
 * or a stopped psd, which UCX alone would notice only when TCP gives up (about 15 minutes,
 * tcp_retries2) or never (a stopped process keeps its sockets). Its connection is closed and
 * it is reconnected as a lost shard: what waits on it is sent again if it comes back within
 * the reconnect timeout, and fails after it. Before, such a shard was waited on without a
 * bound (found by a review, session 39). */
static void shard_silent(ps_client_t *c, cshard_t *s)
{
    uint64_t now = uv_now(&c->loop); /* a timer callback's: fresh */
    if (!s->answers_hb || s->ep == NULL || s->dead || s->down || s->gone || c->leaving ||
        now - s->heard_ms < c->silent_ms)
        return;
    uint32_t i = (uint32_t)(s - c->shards);
    PS_LOG(PS_LOG_WARN, "libps", "shard %u (%s:%u) answered nothing for %llu ms, heartbeats "
           "included (a dead host, a cut network or a stopped psd): closing its connection",
           i, c->m.servers[i].host, c->m.servers[i].port,
           (unsigned long long)(now - s->heard_ms));
    s->silent = 1;
    s->dead = s->close_queued = 1; /* on_deferred closes it and calls shard_lost */
}

/* Every heartbeat_timeout_ms / 4, from the comm thread, so a worker busy computing is
 * still heard; a hung (stopped) process falls silent and its shards drop it. During the join,
 * to the shards that answered its hello already: a join that waits for a shard starting late
 * must not fall silent at shard 0, which would drop it as hung and give its rank away (the
 * worker learnt at its first step that it was removed). */
static void on_heartbeat(uv_timer_t *h)
{
    ps_client_t *c = h->data;
    hello_overdue(c);
    ops_overdue(c);
    if (c->leaving) return;
    int joined = __atomic_load_n(&c->joined, __ATOMIC_ACQUIRE);
    if (joined) {
        ps_ucx_check_armable(&c->ucx); /* while callers drive it: is it wedged? */
        unarmable(c);
    }
    for (uint32_t i = 0; i < c->nshards; i++) {
        cshard_t *s = &c->shards[i];
        if (joined) shard_silent(c, s);
        if (s->ep == NULL || s->dead || s->down || s->hb_inflight || !(joined || s->greeted))
            continue;
        /* The rank is shard 0's answer, set by the joining thread; shards read none here. */
        ps_msg_t m = {.type = PS_MSG_HEARTBEAT,
                      .rank = rank_now(c),
                      .flags = s->answers_hb ? PS_FLAG_ANSWER : 0,
                      .joined_runs = __atomic_load_n(&c->runs_digest, __ATOMIC_RELAXED)};
        size_t len;
        if (ps_msg_encode_sealed(&m, s->tok.b, s->tok.len, s->hb_hdr, sizeof s->hb_hdr, &len))
            continue;
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                   UCP_OP_ATTR_FIELD_USER_DATA |
                                                   UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_AM_SEND_FLAG_REPLY,
                                   .cb.send = on_heartbeat_sent, .user_data = s};
        void *req = ucp_am_send_nbx(s->ep, PS_AM_CTRL, s->hb_hdr, len, NULL, 0, &prm);
        s->hb_inflight = req != NULL && !UCS_PTR_IS_ERR(req);
    }
    ps_ucx_progress(&c->ucx);
}

/* Open the view of shard @p s's store that its hello reply offered, or close one it no longer
 * offers (a restarted shard names its store again: a new file is opened anew). */
static void view_update(ps_client_t *c, cshard_t *s)
{
    if (s->view.env && (!s->view_open || s->view.id != s->store_id)) {
        ps_storeview_close(&s->view);
        __atomic_store_n(&s->view_open, 0, __ATOMIC_RELAXED); /* ps_client_direct */
    }
    if (s->view_open || !c->direct || s->store_id == 0 || s->view_tried == s->store_id) return;
    s->view_tried = s->store_id;
    char err[512];
    uint32_t i = (uint32_t)(s - c->shards);
    if (ps_storeview_open(&s->view, s->store, s->store_id, err, sizeof err) == 0) {
        __atomic_store_n(&s->view_open, 1, __ATOMIC_RELAXED);
        PS_LOG(PS_LOG_INFO, "libps", "shard %u: pulls read its store %s directly", i, s->store);
    } else {
        /* Expected when the shard runs on another host. */
        PS_LOG(PS_LOG_DEBUG, "libps", "shard %u: pulls over the transport (%s)", i, err);
    }
}

static void area_unmap(cshard_t *s)
{
    if (s->area) munmap(s->area, s->area_size);
    __atomic_store_n(&s->area, NULL, __ATOMIC_RELAXED); /* ps_client_direct reads it */
    s->area_size = 0;
    s->area_id = 0;
}

/* Map the push area shard @p s offered (its own connection's: /proc/<psd pid>/fd/<fd>), if its
 * identity is the one offered. */
static void area_update(ps_client_t *c, cshard_t *s)
{
    if (s->area || !c->direct_push || s->area_offer_id == 0 || s->area_tried == s->area_offer_id)
        return;
    s->area_tried = s->area_offer_id;
    uint32_t i = (uint32_t)(s - c->shards);
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%u", s->area_pid, s->area_fd);
    /* What the path names is checked before it is opened: a regular file (a memfd) with the
     * identity offered, never some other process's device or pipe. */
    struct stat st;
    void *a = MAP_FAILED;
    int fd = -1;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
        ps_storeview_stat_id(&st) == s->area_offer_id &&
        (fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY)) >= 0 &&
        ps_storeview_file_id(fd) == s->area_offer_id && fstat(fd, &st) == 0 &&
        (uint64_t)st.st_size >= s->area_offer_size && s->area_offer_size > 0)
        a = mmap(NULL, s->area_offer_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                 fd, 0);
    if (fd >= 0) close(fd);
    if (a == MAP_FAILED) {
        PS_LOG(PS_LOG_DEBUG, "libps", "shard %u: pushes over the transport (no push area at %s)",
               i, path);
        return;
    }
    __atomic_store_n(&s->area, a, __ATOMIC_RELAXED);
    s->area_size = s->area_offer_size;
    s->area_id = s->area_offer_id;
    s->area_next = 0;
    s->area_gen++;
    PS_LOG(PS_LOG_INFO, "libps", "shard %u: pushes write into its shared memory directly", i);
}

/* Where chunk @p chunk of @p t (@p len bytes) goes in shard @p s's area, or UINT64_MAX when it
 * cannot go there now (no area, full, or its place may still be read by psd). */
static uint64_t area_place(cshard_t *s, ctensor_t *t, uint32_t chunk, uint64_t len)
{
    if (s->area == NULL || t->places == NULL) return UINT64_MAX;
    area_place_t *pl = &t->places[chunk];
    if (pl->gen != s->area_gen) {
        uint64_t need = (len + 4095) & ~(uint64_t)4095; /* page-aligned places */
        if (need > s->area_size - s->area_next) return UINT64_MAX;
        *pl = (area_place_t){.off = s->area_next, .gen = s->area_gen};
        s->area_next += need;
    }
    return pl->busy ? UINT64_MAX : pl->off;
}

/* A direct pull's reply: copy version >= m->step of the chunk from the shard's store. The record
 * read must be the one psd named (its CRC) when it is at that version. */
static void direct_pull(ps_client_t *c, ps_op_t *op, part_t *p, const ps_msg_t *m, uint64_t n)
{
    cshard_t *s = &c->shards[p->shard];
    int rc = PS_EPROTO;
    uint64_t version = 0;
    uint32_t crc = 0;
    if (s->view_open && s->view.id == s->store_id && m->length == 0)
        rc = ps_storeview_read(&s->view, m->tensor, m->chunk, m->step,
                               op->buf + (uint64_t)m->chunk * c->chunk_elems, (uint32_t)n,
                               &version, &crc);
    if (rc == 0 && version == m->step && crc != m->crc32c) rc = PS_ESTALE;
    if (rc == 0 && c->test_direct_fail && ++c->test_direct_count == c->test_direct_fail)
        rc = PS_ESTORE; /* the test hook: as if the store could not be read */
    if (rc == 0) {
        if (version < op->min_version) op->min_version = version;
        __atomic_add_fetch(&c->stats.bytes_pulled, n * 4, __ATOMIC_RELAXED);
        __atomic_add_fetch(&c->stats.bytes_pulled_direct, n * 4, __ATOMIC_RELAXED);
        part_done(p);
        return;
    }
    /* The view no longer serves this shard, or the reply was not one it could use (a record
     * that fails its CRC included: the transport's own check then decides): pull this part,
     * and the rest from now on, over the transport. */
    if (s->view_open) {
        PS_LOG(PS_LOG_WARN, "libps", "shard %u: reading chunk %u of tensor %u from its store "
               "failed (%s); pulling over the transport from now on", p->shard, m->chunk,
               m->tensor, ps_strerror(rc));
        ps_storeview_close(&s->view);
        __atomic_store_n(&s->view_open, 0, __ATOMIC_RELAXED); /* ps_client_direct */
    }
    if (p->ck.sending)
        p->ck.again = 1;
    else
        send_data_part(c, op, p);
}

/*
 * One turn of the direct pushes' copies: the next HELD_COPY part of the first push on the list
 * goes (send_data_part copies it into its shard's area, or sends it over the transport if the
 * area cannot take it now). Once a push's large chunk was written directly, its later large
 * chunks bound for a mapped area are left to these turns, one per turn of the comm thread's
 * loop, so that what arrives meanwhile is handled between two copies instead of after all of
 * them: the replies of the pulls started with the push (each read from the store as soon as
 * psd applied its chunk), acknowledgements, control messages. A part that is no longer held
 * (sent again after its shard came back) or no longer pending (its op failed) is skipped; a
 * push with nothing left leaves the list and releases its ref (which may complete it).
 * Returns 1 if a part went.
 */
static int copy_turn(ps_client_t *c)
{
    while (c->copy_head) {
        ps_op_t *op = c->copy_head;
        while (op->copy_at < op->nparts && op->status == 0) {
            part_t *p = &op->parts[op->copy_at++];
            if (p->held == HELD_COPY && p->pending && !p->resend) {
                send_data_part(c, op, p);
                return 1;
            }
        }
        c->copy_head = op->copy_next;
        if (c->copy_head == NULL) c->copy_tail = NULL;
        op->ucx_refs--;
        op_maybe_complete(op);
    }
    return 0;
}

/* Deferred hook: take submitted ops, close failed endpoints (outside UCX callbacks). */
static int on_deferred(ps_ucx_t *u)
{
    ps_client_t *c = u->data;
    int did = 0;
    for (uint32_t i = 0; i < c->nshards; i++) {
        cshard_t *s = &c->shards[i];
        if (s->want_lanes && s->ep && !s->dead) {
            /* Which transports the connection ended up on: said when first found or when a
             * reconnect changed them, so that a cluster that fell back to TCP is seen at
             * once. */
            s->want_lanes = 0;
            char lanes[sizeof s->lanes];
            ps_ucx_ep_lanes(s->ep, lanes, sizeof lanes);
            if (strcmp(lanes, s->lanes) != 0)
                PS_LOG(PS_LOG_INFO, "libps", "shard %u (%s:%u) over %s", i,
                       c->m.servers[i].host, c->m.servers[i].port, lanes);
            pthread_mutex_lock(&c->mu); /* ps_client_lanes reads it from any thread */
            memcpy(s->lanes, lanes, sizeof s->lanes);
            pthread_mutex_unlock(&c->mu);
            s->windowed = strstr(s->lanes, "cma") == NULL;
            s->eager_below = ps_ucx_eager_below(&c->ucx, s->lanes);
        }
        view_update(c, s);
        area_update(c, s);
        if (!s->close_queued) continue;
        s->close_queued = 0;
        did = 1;
        ps_ucx_ep_close(&c->ucx, &s->ep, 1);
        shard_lost(c, i);
    }
    pthread_mutex_lock(&c->mu);
    ps_op_t *list = c->submit_head;
    c->submit_head = c->submit_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    c->fusing = list != NULL;
    while (list) {
        ps_op_t *op = list;
        list = op->next;
        did = 1;
        if (op->type == OP_SHUTDOWN) {
            for (uint32_t i = 0; i < c->nshards; i++) bundle_flush(c, i);
            for (uint32_t i = 0; i < c->nshards; i++) ps_ucx_ep_close(&c->ucx, &c->shards[i].ep, 0);
            /* comm_run ends at its next turn (no uv_stop: run on a caller's thread, outside
             * uv_run, it would stay set and keep the closing uv_run from running at all). */
            __atomic_store_n(&c->loop_stop, 1, __ATOMIC_RELEASE);
            uv_async_send(&c->wake); /* a caller that drives ran this: the comm thread sees it */
            op_publish_done(op);
            continue;
        }
        start_op(c, op);
    }
    c->fusing = 0;
    for (uint32_t i = 0; i < c->nshards; i++) bundle_flush(c, i);
    did |= copy_turn(c);
    return did;
}

/* Close shard @p i's connection: it still holds a request of an interrupted op. */
static void interrupt_close(ps_client_t *c, uint32_t i)
{
    cshard_t *s = &c->shards[i];
    if (s->ep == NULL || s->dead) return;
    PS_LOG(PS_LOG_WARN, "libps", "shard %u (%s:%u) still holds a request %u ms after the "
           "interrupt: closing its connection", i, c->m.servers[i].host, c->m.servers[i].port,
           leave_wait_ms(c));
    s->dead = s->close_queued = 1;
}

/* An interrupted op that UCX still holds (a rendezvous push to a shard that is stopped or
 * cut off never completes): each shard that holds one of its requests (a part's send or
 * rendezvous receive, a bundle carrying one of its parts) gets its connection closed, which
 * cancels them, so the caller's wait ends. Healthy shards finished theirs long before: their
 * connections stay for the leave. */
static void on_interrupt_timer(uv_timer_t *h)
{
    ps_client_t *c = h->data;
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        if (op->on_done || op->type == OP_LEAVE || op->done || op->ucx_refs == 0) continue;
        for (uint32_t i = 0; i < op->nparts; i++)
            if (op->parts[i].ck.sending || op->parts[i].ck.receiving)
                interrupt_close(c, op->parts[i].shard);
        for (bundle_t *b = c->flying; b; b = b->fly_next)
            for (uint32_t k = 0; k < b->count; k++)
                if (b->parts[k]->op == op) interrupt_close(c, b->shard);
    }
}

static void on_wake(uv_async_t *h)
{
    ps_ucx_t *u = h->data;
    ps_client_t *c = u->data;
    if (__atomic_load_n(&c->interrupted, __ATOMIC_ACQUIRE)) {
        /* Everything in flight fails now (start_op fails what comes later). */
        int held = 0;
        for (ps_op_t *op = c->inflight, *nx; op; op = nx) {
            nx = op->next;
            if (op->on_done || op->type == OP_LEAVE) continue; /* a leave is how it ends */
            op_fail(op, PS_ECANCELED, "interrupted");
            held |= op->ucx_refs > 0;
            op_maybe_complete(op);
        }
        if (held && !uv_is_active((uv_handle_t *)&c->interrupt_timer))
            uv_timer_start(&c->interrupt_timer, on_interrupt_timer, leave_wait_ms(c), 0);
    }
    ps_ucx_progress(u);
}

/* ---- comm thread: receiving ------------------------------------------------- */

static ps_op_t *find_op(ps_client_t *c, uint64_t req_id)
{
    for (ps_op_t *op = c->inflight; op; op = op->next)
        if (op->req_id == req_id) return op;
    return NULL;
}

/* One message from a shard (alone, or an entry of a bundle with @p param saying eager). */
static ucs_status_t handle_msg(ps_client_t *c, const ps_msg_t *mp, void *data, size_t length,
                               const ucp_am_recv_param_t *param)
{
    ps_msg_t m = *mp;
    if (m.shard < c->nshards) c->shards[m.shard].heard_ms = uv_now(&c->loop); /* shard_silent */
    if (m.type == PS_MSG_HEARTBEAT) return UCS_OK; /* an answer: heard, nothing else */
    if (m.type == PS_MSG_EPOCH) {
        if (m.shard == 0 && (m.flags & PS_FLAG_CLOSED)) {
            /* A closed step's members, for the shards that may still be at it: forwarded,
             * not this worker's view (it never stands for a later step). */
            ps_msg_t f = {.type = PS_MSG_EPOCH, .epoch = m.epoch, .step = m.step,
                          .members = m.members, .rank = rank_now(c), .flags = PS_FLAG_CLOSED};
            for (uint32_t i = 1; i < c->nshards; i++) forward_msg(c, i, &f);
        } else if (m.shard == 0) {
            learn_view(c, m.epoch, m.step, m.members, 1);
        }
        return UCS_OK;
    }
    if ((m.type == PS_MSG_PUSH_ACK || (m.type == PS_MSG_ERROR && (m.flags & PS_FLAG_CHUNK))) &&
        m.tensor < PS_CLIENT_MAX_TENSORS) {
        /* Whoever the ack (or the refusal naming the chunk) is for now, also one whose op has
         * failed meanwhile: psd holds nothing of that push, so its place is free again. */
        ctensor_t *t = c->tensors[m.tensor];
        if (t && t->places && m.chunk < t->nchunks && t->places[m.chunk].req == m.req_id)
            t->places[m.chunk].busy = 0;
    }
    ps_op_t *op = find_op(c, m.req_id);
    if (op == NULL) {
        if (m.type == PS_MSG_ERROR)
            PS_LOG(PS_LOG_WARN, "libps", "shard %u: %s", m.shard, m.error);
        return UCS_OK;
    }
    if (op->type == OP_LEAVE) { /* a refusal answers a leave too */
        if (m.type == PS_MSG_LEAVE_REPLY || m.type == PS_MSG_ERROR)
            parts_done_on_shard(op, m.shard);
        op_maybe_complete(op);
        return UCS_OK;
    }
    switch (m.type) {
    case PS_MSG_ERROR: {
        part_t *p = NULL;
        int behind = (m.flags & PS_FLAG_BEHIND) != 0;
        for (uint32_t i = 0; (m.status == PS_ECRC || behind) && op->type == OP_PUSH &&
                             i < op->nparts; i++)
            if (op->parts[i].chunk == m.chunk && op->parts[i].shard == m.shard &&
                op->parts[i].pending && m.tensor == c->tensors[op->tensor]->id)
                p = &op->parts[i];
        /* bsp: a push refused as not of a member of its step, by a worker that never was one
         * (no view learnt: no batch taken yet), is its caller's mistake, not a removal. */
        bool never = m.status == PS_ENOTMEMBER && op->type == OP_PUSH && c->views.n == 0 &&
                     c->m.job.consistency == PS_CONSIST_BSP;
        if (p && behind)
            part_behind_retry(c, op, p, m.error);
        else if (p)
            part_crc_retry(c, op, p, "push");
        else if (never)
            op_fail(op, PS_EINVAL, "shard %u: %s (this worker holds no batch of that step: "
                    "ps_client_next_batch hands them out)", m.shard, m.error);
        else
            op_fail(op, m.status < 0 ? m.status : PS_EPROTO, "shard %u: %s", m.shard, m.error);
        if (m.status == PS_ENOTMEMBER && !never) {
            op_maybe_complete(op);
            mark_removed(c);
            return UCS_OK;
        }
        break;
    }
    case PS_MSG_ECHO_REPLY:
        if (op->type != OP_ECHO || op->parts[0].shard != m.shard) return UCS_OK;
        if (m.status) op_fail(op, m.status, "shard %u: echo failed", m.shard);
        part_done(&op->parts[0]);
        break;
    case PS_MSG_BATCH_REPLY:
        if (op->type != OP_BATCH || m.shard != 0) return UCS_OK;
        op->reply = m;
        c->batch_stamp = (m.flags & (PS_FLAG_BATCH | PS_FLAG_FINISHED)) == PS_FLAG_BATCH;
        c->batch_pass = m.data_epoch;
        c->batch_offset = m.batch_offset;
        if (!(m.flags & PS_FLAG_FINISHED)) {
            learn_view(c, m.epoch, m.step, m.members, 0);
            c->progress = m.samples;
            c->has_progress = 1;
            c->replay_step = m.step;
            c->nreplay = m.nreplay;
            memcpy(c->replay, m.replay, sizeof c->replay);
        }
        part_done(&op->parts[0]);
        break;
    case PS_MSG_VALUES_REPLY:
        if (op->type != OP_VALUES || op->parts[0].shard != m.shard) return UCS_OK;
        part_done(&op->parts[0]);
        break;
    case PS_MSG_FORGET_REPLY:
        if (op->type != OP_FORGET || op->parts[0].shard != m.shard) return UCS_OK;
        op->reply = m;
        part_done(&op->parts[0]);
        break;
    case PS_MSG_HELLO_REPLY:
    case PS_MSG_DECLARE_REPLY:
        if ((op->type == OP_HELLO) != (m.type == PS_MSG_HELLO_REPLY) || op->parts[0].shard != m.shard)
            return UCS_OK;
        if (op->type == OP_HELLO) /* a new endpoint after a reconnect may use others */
            c->shards[m.shard].want_lanes = 1; /* found in on_deferred, outside UCX callbacks */
        if (op->type == OP_HELLO) {
            cshard_t *s = &c->shards[m.shard];
            s->greeted = 1;
            __atomic_store_n(&s->knows_values, (m.flags & PS_FLAG_VALUES) != 0,
                             __ATOMIC_RELEASE);
            __atomic_store_n(&s->leaves_nonfinite, (m.flags & PS_FLAG_NONFINITE) != 0,
                             __ATOMIC_RELEASE);
            s->answers_hb = (m.flags & PS_FLAG_ANSWER) != 0;
            memcpy(s->store, m.store, sizeof s->store);
            s->store_id = m.store[0] ? m.store_id : 0; /* opened in on_deferred (view_update) */
            /* Another store (a restored shard): no pull may read the old one from now on, not
             * even those resent before on_deferred closes it. */
            if (s->view_open && s->view.id != s->store_id)
                __atomic_store_n(&s->view_open, 0, __ATOMIC_RELAXED); /* ps_client_direct */
            s->area_pid = m.pid;
            s->area_fd = m.area_fd;
            s->area_offer_id = m.area_id; /* 0: none offered */
            s->area_offer_size = m.area_size;
            if (s->area && s->area_id != s->area_offer_id) area_unmap(s); /* another connection */
        }
        op->reply = m;
        part_done(&op->parts[0]);
        break;
    case PS_MSG_PUSH_ACK:
    case PS_MSG_PULL_REPLY: {
        int is_pull = m.type == PS_MSG_PULL_REPLY;
        if (op->type != (is_pull ? OP_PULL : OP_PUSH) || m.tensor != c->tensors[op->tensor]->id)
            return UCS_OK;
        const ctensor_t *t = c->tensors[op->tensor];
        part_t *p = NULL;
        for (uint32_t i = 0; i < op->nparts; i++)
            if (op->parts[i].chunk == m.chunk && op->parts[i].pending) p = &op->parts[i];
        if (p == NULL || p->shard != m.shard) return UCS_OK;
        if (is_pull && (m.flags & PS_FLAG_DIRECT)) {
            /* Only a pull that asked for it gets a direct reply: one that did not would be
             * sent again and again. direct_pull records the version it reads. */
            if (!p->ck.direct || length != 0 || t->pull_codec.kind != PSK_CODEC_NONE) {
                op_fail(op, PS_EPROTO, "shard %u answered the pull of chunk %u of tensor %u "
                        "with a direct reply it was not asked for", m.shard, m.chunk, m.tensor);
                break;
            }
            direct_pull(c, op, p, &m, ps_chunk_len(t->numel, c->chunk_elems, m.chunk));
            break;
        }
        if (m.step < op->min_version) op->min_version = m.step;
        if (!is_pull)
            PS_LOG(PS_LOG_DEBUG, "libps", "shard %u acks the push of chunk %u of tensor %u for "
                   "step %llu (chunk at %llu, flags %#x)", m.shard, m.chunk, m.tensor,
                   (unsigned long long)op->step, (unsigned long long)m.step, m.flags);
        if (!is_pull && (m.flags & PS_FLAG_STALE)) {
            PS_LOG(PS_LOG_INFO, "libps", "shard %u passed step %llu without this worker's batch "
                   "(chunk %u of tensor %u): reported with the batch, which goes out again",
                   m.shard, (unsigned long long)op->step, m.chunk, m.tensor);
            __atomic_store_n(&c->stale_step1, op->step + 1, __ATOMIC_RELEASE);
        }
        if (!is_pull && (m.flags & PS_FLAG_NONFINITE)) {
            uint64_t n = __atomic_add_fetch(&c->nonfinite_pushes, 1, __ATOMIC_RELAXED);
            if ((n & (n - 1)) == 0) /* the 1st, 2nd, 4th, 8th ... */
                PS_LOG(PS_LOG_WARN, "libps", "shard %u left this worker's push of chunk %u of "
                       "tensor %u out of its update: the gradient held a NaN or an infinity "
                       "(%llu so far)", m.shard, m.chunk, m.tensor,
                       (unsigned long long)n);
        }
        if (!is_pull) {
            part_done(p);
            if (p->ck.direct) {
                c->tensors[op->tensor]->places[m.chunk].busy = 0; /* psd is done with it */
                p->ck.direct = 0;
            }
            break;
        }
        p->ck.direct = 0; /* asked for a direct reply or not, this one came over UCX */
        uint64_t n = ps_chunk_len(t->numel, c->chunk_elems, m.chunk);
        uint64_t want = t->pull_codec.kind == PSK_CODEC_NONE ? n * 4
                                                             : psk_codec_max_bytes(&t->pull_codec, n);
        if (length != want || m.length != want || m.codec != t->pull_codec.kind) {
            op_fail(op, PS_EPROTO, "shard %u sent %zu bytes for chunk %u of tensor %u, expected %llu",
                    m.shard, length, m.chunk, m.tensor, (unsigned long long)want);
            break;
        }
        void *dst = op->buf + (uint64_t)m.chunk * c->chunk_elems;
        if (t->pull_codec.kind != PSK_CODEC_NONE) dst = t->pull_buf + m.chunk * t->pull_cap;
        p->ck.crc = m.crc32c;
        if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
            /* Eager: raw parameters are copied into the caller's buffer with their CRC folded
             * into the copy (a mismatch asks again, and the answer overwrites them). */
            uint32_t crc = t->pull_codec.kind == PSK_CODEC_NONE
                               ? ps_crc32c_copy(0, dst, data, length)
                               : ps_crc32c(0, data, length);
            if (crc != m.crc32c) {
                part_crc_retry(c, op, p, "pull");
                break;
            }
            if (t->pull_codec.kind != PSK_CODEC_NONE) {
                if (pull_decode(c, op, m.chunk, data, length))
                    op_fail(op, PS_EPROTO, "shard %u sent malformed parameters for chunk %u",
                            m.shard, m.chunk);
                else
                    part_done(p);
                break;
            }
            __atomic_add_fetch(&c->stats.bytes_pulled, length, __ATOMIC_RELAXED);
            part_done(p);
            break;
        }
        /* Rendezvous: the parameters land directly in the caller's buffer. */
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                   UCP_OP_ATTR_FIELD_USER_DATA,
                                   .cb.recv_am = on_pull_recv, .user_data = p};
        op->ucx_refs++;
        p->ck.receiving = 1;
        p->ck.ep_gen = c->shards[p->shard].ep_gen; /* the reply's connection */
        p->ck.landing = dst;
        ps_tcpguard_expect(dst, length); /* psd's put over TCP lands there (tcpguard.c) */
        void *req = ucp_am_recv_data_nbx(c->ucx.worker, data, dst, length, &prm);
        if (req == NULL)
            on_pull_recv(NULL, UCS_OK, length, p); /* completes the op if it was the last */
        else if (UCS_PTR_IS_ERR(req))
            on_pull_recv(NULL, UCS_PTR_STATUS(req), 0, p);
        return UCS_OK;
    }
    default:
        return UCS_OK;
    }
    op_maybe_complete(op);
    return UCS_OK;
}

/* With a secret_file, whether @p m carries the session token of this worker's connection to
 * the shard it names (psd_encode seals all it sends): a message that does not is not that
 * shard's. This worker's UCP worker takes connections from any peer (UCX's TCP transport
 * listens on every worker), and requests are answered by id, so a peer without the secret
 * could otherwise send a pull reply for a guessed request id and have its values trained on.
 * A message from a connection closed since (its old token) is dropped too: what it answered
 * is sent again on the new one. */
static bool from_shard(const ps_client_t *c, const ps_msg_t *m)
{
    static const ps_ucx_token_t none; /* a shard index it does not have: only an auth refusal */
    return ps_auth_from_shard(&c->auth, m->shard < c->nshards ? &c->shards[m->shard].tok : &none,
                              m);
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    ps_client_t *c = arg;
    ps_msg_t m;
    char err[256];
    if (ps_msg_decode(&m, header, header_length, err, sizeof err)) {
        PS_LOG(PS_LOG_WARN, "libps", "dropped a message: %s", err);
        return UCS_OK;
    }
    if (!from_shard(c, &m)) { /* its data, if any, is dropped unread */
        if (!c->unsealed_said++)
            PS_LOG(PS_LOG_WARN, "libps", "dropped a %s said to be from shard %u without this "
                   "worker's session token for it (a peer without the secret, or a connection "
                   "closed since); more are dropped without a word", ps_msg_type_name(m.type),
                   m.shard);
        return UCS_OK;
    }
    if (m.type != PS_MSG_BUNDLE) return handle_msg(c, &m, data, length, param);
    /* A shard's replies fused into one message (proto/bundle.h): one at a time. */
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || m.length != length ||
        m.count == 0 || m.count > PS_BUNDLE_MAX_ENTRIES) {
        PS_LOG(PS_LOG_WARN, "libps", "dropped a malformed bundle from shard %u (%llu entries, "
               "%zu bytes)", m.shard, (unsigned long long)m.count, length);
        return UCS_OK;
    }
    ps_bundle_iter_t it;
    ps_bundle_iter_init(&it, data, length, (uint32_t)m.count);
    ucp_am_recv_param_t eager = {.recv_attr = 0};
    ps_msg_t e;
    const void *d;
    size_t dlen;
    int rc;
    while ((rc = ps_bundle_next(&it, &e, &d, &dlen, err, sizeof err)) != 0) {
        if (rc > 0)
            handle_msg(c, &e, (void *)d, dlen, &eager);
        else
            PS_LOG(PS_LOG_WARN, "libps", "shard %u: %s", m.shard, err);
    }
    return UCS_OK;
}

/* ps_ucx_t.driven: a caller drives the worker now, or did within the busy-poll window (it is
 * likely to wait again soon: a training step's ops come in a burst). */
static int comm_driven(ps_ucx_t *u)
{
    ps_client_t *c = u->data;
    if (__atomic_load_n(&c->drivers, __ATOMIC_ACQUIRE) > 0) return 1;
    uint64_t at = __atomic_load_n(&c->drove_ns, __ATOMIC_ACQUIRE);
    return at && mono_ns() - at < u->spin_ns;
}

/* The comm thread's loop, with loop_mu held (uv_run(UV_RUN_DEFAULT) but for that): each turn
 * runs what is due without blocking, then waits for the loop's next event (its backend fd)
 * with loop_mu released, so that a caller may drive the worker meanwhile. While the worker is
 * left to callers the wait is bounded (ps_ucx_wait_ms, PS_UCX_ASIDE_MS): a later turn takes
 * it back (progresses and arms) once none has driven it for the busy-poll window. Until the
 * shutdown (loop_stop). */
static void comm_run(ps_client_t *c)
{
    struct pollfd pfd = {.fd = uv_backend_fd(&c->loop), .events = POLLIN};
    while (!c->loop_stop) {
        uv_run(&c->loop, UV_RUN_NOWAIT);
        if (c->loop_stop) break;
        int timeout = ps_ucx_wait_ms(&c->ucx, uv_backend_timeout(&c->loop));
        pthread_mutex_unlock(&c->loop_mu);
        if (timeout != 0) poll(&pfd, 1, timeout);
        pthread_mutex_lock(&c->loop_mu);
    }
}

static void *comm_main(void *arg)
{
    ps_client_t *c = arg;
    pthread_mutex_lock(&c->loop_mu); /* held but while comm_run waits, until the end */
    int rc = uv_loop_init(&c->loop);
    if (rc == 0) rc = ps_ucx_init_serialized(&c->ucx, &c->loop);
    if (rc == 0) {
        c->ucx.deferred = on_deferred;
        c->ucx.driven = comm_driven;
        ps_auth_attach(&c->ucx, &c->auth);
        ps_ucx_set_spin(&c->ucx, c->m.spin_us);
        c->ucx.data = c;
        c->ucx.owner_idle = waits_for_nothing;
        c->ucx.owner_idle_arg = c;
        ps_ucx_set_am_handler(&c->ucx, on_am, c);
        for (uint32_t i = 0; i < c->nshards; i++) {
            c->shards[i].c = c;
            c->shards[i].index = i;
            uv_timer_init(&c->loop, &c->shards[i].timer);
            c->shards[i].timer.data = &c->shards[i];
        }
        uint64_t tick = c->m.job.heartbeat_timeout_ms / 4;
        uv_timer_init(&c->loop, &c->heartbeat);
        c->heartbeat.data = c;
        uv_timer_start(&c->heartbeat, on_heartbeat, tick, tick);
        uv_timer_init(&c->loop, &c->leave_timer);
        c->leave_timer.data = c;
        uv_timer_init(&c->loop, &c->interrupt_timer);
        c->interrupt_timer.data = c;
        uv_timer_init(&c->loop, &c->behind_timer);
        c->behind_timer.data = c;
        uv_async_init(&c->loop, &c->wake, on_wake);
        c->wake.data = &c->ucx;
    }
    pthread_mutex_lock(&c->mu);
    c->started = 1;
    c->start_rc = rc;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        __atomic_store_n(&c->loop_stop, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&c->loop_mu);
        return NULL;
    }
    comm_run(c);
    for (uint32_t i = 0; i < c->nshards; i++) /* a lookup not started yet; one running ends */
        if (c->shards[i].resolving) uv_cancel((uv_req_t *)&c->shards[i].gai);
    uv_close((uv_handle_t *)&c->wake, NULL);
    for (uint32_t i = 0; i < c->nshards; i++) uv_close((uv_handle_t *)&c->shards[i].timer, NULL);
    uv_close((uv_handle_t *)&c->heartbeat, NULL);
    uv_close((uv_handle_t *)&c->leave_timer, NULL);
    uv_close((uv_handle_t *)&c->interrupt_timer, NULL);
    uv_close((uv_handle_t *)&c->behind_timer, NULL);
    ps_ucx_close(&c->ucx);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    /* No UCX completion comes any more: what only this thread owned and was still waiting for
     * one is freed (a view message whose close was left to finish in the background; a
     * reconnect's hello the shutdown overtook). The callers' ops are theirs. */
    forwards_free(c);
    for (ps_op_t **pp = &c->inflight; *pp;) {
        ps_op_t *op = *pp;
        if (op->on_done == NULL) {
            pp = &op->next;
            continue;
        }
        *pp = op->next;
        free(op);
    }
    pthread_mutex_unlock(&c->loop_mu);
    return NULL;
}

/* ---- caller's thread ------------------------------------------------------ */

static ps_op_t *op_init(ps_op_t *op, ps_client_t *c, int type, uint32_t nparts)
{
    memset(op, 0, sizeof *op); /* each part's state is reset below (the caller sets the rest) */
    op->c = c;
    op->type = type;
    op->req_id = __atomic_add_fetch(&c->next_req, 1, __ATOMIC_RELAXED);
    op->nparts = op->remaining = nparts;
    op->min_version = UINT64_MAX;
    for (uint32_t i = 0; i < nparts; i++) {
        op->parts[i].op = op;
        op->parts[i].pending = 1;
        op->parts[i].resend = 0; /* malloc'd or a spare: never stale */
        op->parts[i].held = 0;
        op->parts[i].data = NULL;
        op->parts[i].len = 0;
        memset(&op->parts[i].ck, 0, sizeof op->parts[i].ck);
    }
    return op;
}

static ps_op_t *op_new(ps_client_t *c, int type, uint32_t nparts)
{
    ps_op_t *op = malloc(sizeof *op + nparts * sizeof(part_t));
    return op ? op_init(op, c, type, nparts) : NULL;
}

/* The op kept in @p spare (ps_op_wait keeps finished ones there; it has room for @p nparts),
 * taken out and reset, else a new one; NULL when out of memory. Caller's thread. */
static ps_op_t *op_reuse(ps_client_t *c, ps_op_t **spare, int type, uint32_t nparts)
{
    ps_op_t *op = *spare;
    if (op == NULL) return op_new(c, type, nparts);
    *spare = NULL;
    return op_init(op, c, type, nparts);
}

/* Whether every part of push or pull @p op is small enough to travel in a bundle. */
static int op_fusable(const ps_client_t *c, const ps_op_t *op)
{
    if (op->type != OP_PUSH && op->type != OP_PULL) return 0;
    const ctensor_t *t = c->tensors[op->tensor];
    for (uint32_t i = 0; i < op->nparts; i++) {
        size_t len = op->type == OP_PUSH ? op->parts[i].len
                                         : ps_chunk_len(t->numel, c->chunk_elems, i) * 4;
        if (len > PS_BUNDLE_PART_MAX) return 0;
    }
    return 1;
}

/* A push or pull of a tensor of at least this many bytes whose ops take longer than the
 * busy-poll window waits asleep at once (op_wait_done). */
#define PS_WAIT_SLEEP_BYTES (256u << 10)

/* Whether @p op is small: not a push or pull of a tensor of PS_WAIT_SLEEP_BYTES or more. */
static int op_small(const ps_client_t *c, const ps_op_t *op)
{
    return (op->type != OP_PUSH && op->type != OP_PULL) ||
           c->tensors[op->tensor]->numel * 4 < PS_WAIT_SLEEP_BYTES;
}

/* After the caller queued ops (submit_head): while callers drive the worker (comm_driven) and
 * the comm thread left it to them (unarmed, in its bounded wait), small ops wait in the queue
 * for the next caller that waits, which starts them with everything queued beside them in one
 * batch (on_deferred), or for the comm thread's next bounded turn (within PS_UCX_ASIDE_MS: it
 * runs the deferred hook as it stands aside): no wake-up. Else the comm thread is woken
 * unless it busy-polls (@p spinning) and will find them anyway; a large tensor's op also ends
 * the callers' turn, so that the comm thread copies and sends its chunks at once. */
static void hand_over(ps_client_t *c, int spinning, int small)
{
    if (small && comm_driven(&c->ucx) && __atomic_load_n(&c->ucx.unarmed, __ATOMIC_RELAXED))
        return;
    if (!small) __atomic_store_n(&c->drove_ns, 0, __ATOMIC_RELEASE);
    if (!spinning || !small) uv_async_send(&c->wake);
}

static void submit(ps_client_t *c, ps_op_t *op)
{
    op->next = NULL;
    op->submit_ns = mono_ns();
    if (c->grouping && op_fusable(c, op)) {
        /* Held until ps_client_group_end hands the group over at once. */
        if (c->group_tail)
            c->group_tail->next = op;
        else
            c->group_head = op;
        c->group_tail = op;
        return;
    }
    int small = op_small(c, op); /* (read before the comm thread may take it) */
    pthread_mutex_lock(&c->mu);
    if (c->submit_tail)
        c->submit_tail->next = op;
    else
        c->submit_head = op;
    c->submit_tail = op;
    /* A comm thread busy-polling runs on_deferred again before it sleeps (ucx_loop.h). */
    int spinning = __atomic_load_n(&c->ucx.spinning, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&c->mu);
    hand_over(c, spinning, small);
}

/* End the callers' turn at the worker (drove_ns cleared) and wake the comm thread to take it
 * back, under loop_mu (its shutdown holds it, so c->wake is still open; nothing is sent once
 * the loop stopped). When the comm thread holds loop_mu it is in its turn: it sees the turn
 * ended at its next ps_ucx_progress, within PS_UCX_ASIDE_MS, without the wake-up. */
static void hand_back(ps_client_t *c)
{
    __atomic_store_n(&c->drove_ns, 0, __ATOMIC_SEQ_CST);
    if (pthread_mutex_trylock(&c->loop_mu) != 0) return;
    if (!c->loop_stop) uv_async_send(&c->wake);
    pthread_mutex_unlock(&c->loop_mu);
}

/* Under loop_mu, for a caller that drove the worker while it waited for @p mine: whether
 * something in flight needs the comm thread as soon as no caller drives: a push whose parts
 * are still to be copied, an op of the comm thread's own (on_done), or a push or pull of a
 * large tensor (its rendezvous transfers progress with the worker). Small ops, whose
 * replies only complete them, can wait for the next caller that waits or the comm thread's
 * bounded wait. */
static int loop_needs_comm(const ps_client_t *c, const ps_op_t *mine)
{
    if (c->copy_head) return 1;
    for (const ps_op_t *op = c->inflight; op; op = op->next)
        if (op != mine && (op->on_done || !op_small(c, op))) return 1;
    return 0;
}

/* Wait for the comm thread to complete op: spin for the loop's busy-poll window first (a
 * small op completes within tens of microseconds, less than a wake-up costs on a VM), then
 * sleep on the condition variable. A push or pull of a large tensor whose ops take longer than
 * the window sleeps at once: spinning would only take CPU time from the comm thread, which
 * copies and sends the op's data meanwhile, and from psd (on a 2-CPU host, a push's copy then
 * ran at half speed beside the spinning caller while the other CPU idled). Small tensors' ops
 * keep the spin even when a batch of them takes longer than the window: there the comm thread
 * has little to copy, and psbench's rounds of 32 unfused 1 KiB tensors ran at half the rate
 * without it. */
static void op_wait_done(ps_client_t *c, ps_op_t *op)
{
    uint64_t *took = NULL;
    if (!op_small(c, op)) took = &c->tensors[op->tensor]->took_ns[op->type == OP_PULL];
    if (c->ucx.spin_ns && !__atomic_load_n(&op->done, __ATOMIC_ACQUIRE) &&
        (took == NULL || *took <= c->ucx.spin_ns)) {
        uint64_t t0 = mono_ns();
        /* A small op's wait drives the worker itself; a large tensor's leaves it to the comm
         * thread, which copies and sends its chunks meanwhile (a driving caller and the comm
         * thread took turns at them: 1 MiB direct pulls ran at 0.6x). */
        int drive = took == NULL;
        int handed = 0; /* work is left that no waiting caller drives */
        int told = 0;   /* the comm thread was told to stand aside (it waited, armed) */
        if (drive)
            __atomic_add_fetch(&c->drivers, 1, __ATOMIC_ACQ_REL);
        else if (__atomic_load_n(&c->drove_ns, __ATOMIC_ACQUIRE) != 0)
            hand_back(c); /* the callers' turn ends: the comm thread copies and sends it */
        for (;;) {
            /* Drive the worker here when the comm thread is not at it (it waits for events,
             * or it saw drivers and stopped its own busy-poll): the reply is taken on this
             * thread, with no hand-over through the comm thread. */
            if (drive && pthread_mutex_trylock(&c->loop_mu) == 0) {
                if (!c->loop_stop) {
                    /* A comm thread asleep with the worker armed would stay so while this
                     * thread takes the events (a TCP socket drained here wakes no one), its
                     * timers' deadlines as they were: woken, it stands aside in its bounded
                     * wait (PS_UCX_ASIDE_MS), which sees timers started here. */
                    if (!told && !__atomic_load_n(&c->ucx.unarmed, __ATOMIC_SEQ_CST) &&
                        !__atomic_load_n(&c->ucx.spinning, __ATOMIC_SEQ_CST))
                        uv_async_send(&c->wake);
                    told = 1;
                    ps_ucx_poll(&c->ucx);
                    /* Asked once the op is done (done here, mostly): not each turn. */
                    if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE))
                        handed = loop_needs_comm(c, op);
                }
                __atomic_store_n(&c->drove_ns, mono_ns(), __ATOMIC_RELEASE);
                pthread_mutex_unlock(&c->loop_mu);
            }
            if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) break;
            sched_yield();
            if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) break;
            if (mono_ns() - t0 >= c->ucx.spin_ns) break;
        }
        int done = __atomic_load_n(&op->done, __ATOMIC_ACQUIRE);
        /* The last driver to leave hands the worker back at once where the comm thread's
         * bounded wait (PS_UCX_ASIDE_MS) would hold something up: this op, still waited for
         * (asleep below), or a transfer no caller waits for. */
        if (drive && __atomic_sub_fetch(&c->drivers, 1, __ATOMIC_ACQ_REL) == 0 &&
            (!done || handed))
            hand_back(c);
        if (done) goto done;
    }
    pthread_mutex_lock(&c->mu);
    c->sleepers++;
    while (!op->done) pthread_cond_wait(&c->cv, &c->mu);
    c->sleepers--;
    pthread_mutex_unlock(&c->mu);
done:
    /* The op's own time, hand-over to done: the caller's wake-up is not in it, so a tensor
     * whose ops got fast again is spun for again. */
    if (took && op->done_ns > op->submit_ns) {
        /* Capped, so that one slow op (a reconnect, a resend, a bsp pull waiting for the
         * step) does not keep a tensor's waits from spinning for long. */
        uint64_t ns = op->done_ns - op->submit_ns, cap = 4 * c->ucx.spin_ns;
        if (ns > cap) ns = cap;
        *took = *took ? (3 * *took + ns) / 4 : ns;
    }
}

void ps_client_group_begin(ps_client_t *c) { c->grouping++; }

/* Hand over what a group holds now (a wait inside the group would wait for ever). */
static void ps_client_group_end_all(ps_client_t *c)
{
    int depth = c->grouping;
    c->grouping = 1;
    ps_client_group_end(c);
    c->grouping = depth;
}

void ps_client_group_end(ps_client_t *c)
{
    if (c->grouping == 0 || --c->grouping > 0 || c->group_head == NULL) return;
    uint64_t now = mono_ns(); /* handed over now: the time held is the caller's, not the op's */
    int small = 1; /* (read before the comm thread may take them) */
    for (ps_op_t *op = c->group_head; op; op = op->next) {
        op->submit_ns = now;
        small &= op_small(c, op);
    }
    pthread_mutex_lock(&c->mu);
    if (c->submit_tail)
        c->submit_tail->next = c->group_head;
    else
        c->submit_head = c->group_head;
    c->submit_tail = c->group_tail;
    int spinning = __atomic_load_n(&c->ucx.spinning, __ATOMIC_SEQ_CST); /* as in submit() */
    pthread_mutex_unlock(&c->mu);
    c->group_head = c->group_tail = NULL;
    hand_over(c, spinning, small);
}

void ps_client_set_fusion(ps_client_t *c, uint64_t bytes)
{
    __atomic_store_n(&c->fusion_bytes, bytes, __ATOMIC_RELAXED);
}

int ps_op_wait(ps_op_t *op, uint64_t *version)
{
    if (op == NULL) return PS_EINVAL;
    ps_client_t *c = op->c;
    if (op->waited) { /* kept for reuse after its wait (below), not handed out again yet */
        snprintf(c->err, sizeof c->err, "this %s was waited for already", op_name(op->type));
        return PS_EINVAL;
    }
    if (c->grouping && c->group_head) ps_client_group_end_all(c); /* never wait on a held op */
    op_wait_done(c, op);
    int rc = op->status;
    if (rc) snprintf(c->err, sizeof c->err, "%s", op->err);
    if (version) *version = op->min_version == UINT64_MAX ? 0 : op->min_version;
    /* Keep one push and one pull op per tensor, and one control op (a batch request, a
     * declaration): steady training allocates nothing. */
    ps_op_t **spare = NULL;
    if (op->type == OP_PUSH || op->type == OP_PULL) {
        ctensor_t *t = c->tensors[op->tensor];
        t->busy[op->type == OP_PULL]--;
        spare = &t->spare[op->type == OP_PULL];
    }
    else if (op->nparts == 1)
        spare = &c->ctrl_spare;
    op->waited = 1;
    if (spare && *spare == NULL)
        *spare = op;
    else
        free(op);
    return rc;
}

/* Send one control request to one shard and wait for its reply. */
static int ctrl_call(ps_client_t *c, int type, uint32_t shard, ps_msg_t *req, ps_msg_t *reply)
{
    if (c->group_head) ps_client_group_end_all(c); /* held pushes and pulls go first */
    ps_op_t *op = op_reuse(c, &c->ctrl_spare, type, 1); /* ps_op_wait below keeps it again */
    if (op == NULL) return PS_ENOMEM;
    op->parts[0].shard = shard;
    req->req_id = op->req_id;
    op->req = *req;
    submit(c, op);
    op_wait_done(c, op);
    *reply = op->reply;
    return ps_op_wait(op, NULL);
}

/* Sleep @p ms, in steps of 10 ms at most; returns 1 as soon as *@p cancel is set. */
static int nap_or_cancel(uint32_t ms, const volatile sig_atomic_t *cancel)
{
    for (uint32_t slept = 0; slept < ms; slept += 10) {
        if (cancel && *cancel) return 1;
        usleep((ms - slept < 10 ? ms - slept : 10) * 1000);
    }
    return cancel && *cancel;
}

/* How long a join waits for a shard before it says so (and goes on waiting). */
#define JOIN_SAY_MS 2000
/* At a join, shard @p i's hello reply @p rep against shard 0's table (@p t0 tensors; -1 when
 * its psd did not say): a shard that lost its store (started again from an empty or another
 * data_dir) while the others kept theirs. Every shard holds the cluster's whole tensor table
 * once the declarations completed (while they run, a shard may hold a tensor shard 0 has not
 * committed yet), so shard 0 without tensors while another holds trained ones (its lowest
 * chunk version past 0) lost its store: its job would start again at step 0 and, under bsp,
 * the other shards acknowledge the pushes of the steps they applied as applied and drop them,
 * silently (found by a review, session 39). The other way, a shard without tensors once the
 * job is past step 0 would create them again from their initial values at the declarations,
 * silently under asp (a probe, session 40). (Comparing steps alone was tried first: clients
 * that push without batch requests, psbench, advance chunk versions without the
 * coordinator's step.) @return 0, or PS_ECONFIG with c->err said. */
static int join_store_check(ps_client_t *c, uint32_t i, const ps_msg_t *rep, int64_t t0)
{
    if (!(rep->flags & PS_FLAG_TENSORS) || t0 < 0) return 0;
    uint32_t lost;
    if (t0 == 0 && rep->count > 0 && rep->step > 0)
        lost = 0;
    else if (t0 > 0 && rep->count == 0 && c->join_step > 0)
        lost = i;
    else
        return 0;
    snprintf(c->err, sizeof c->err, "shard %u (%.64s:%u) holds %llu tensors at step %llu, shard 0 "
             "%lld tensors at step %llu: shard %u's " STORE_LOST " or every one empty", i,
             c->m.servers[i].host, c->m.servers[i].port,
             (unsigned long long)rep->count, (unsigned long long)rep->step, (long long)t0,
             (unsigned long long)c->join_step, lost);
    return PS_ECONFIG;
}

/* At a join, shard @p i's hello reply @p rep against shard 0's: stores restored from different
 * checkpoints, or one restored and the other not. A shard restored alone from a checkpoint
 * while the others kept their newer stores goes back to the checkpoint's steps: under bsp the
 * workers failed at once with "the chunk is at 278" (nothing named the cause), under asp they
 * trained on and that shard's updates since the checkpoint were lost while counted as applied
 * (a probe, session 40). Every shard restored from one checkpoint has its id as the origin of
 * its run (psd --restore, server/run.h). Records the run (@p i's cshard). @return 0, or
 * PS_ECONFIG with c->err said. */
static int join_run_check(ps_client_t *c, uint32_t i, const ps_msg_t *rep)
{
    cshard_t *s = &c->shards[i], *s0 = &c->shards[0];
    if (!(rep->flags & PS_FLAG_RUN)) return 0; /* an older psd: it does not say */
    __atomic_store_n(&s->run, rep->run, __ATOMIC_RELAXED);
    s->run_origin = rep->run_origin;
    s->run_base = rep->run_base;
    s->joined_runs = rep->joined_runs;
    if (i == 0 || __atomic_load_n(&s0->run, __ATOMIC_RELAXED) == 0 ||
        s->run_origin == s0->run_origin)
        return 0;
    char mine[96], zero[96];
    run_said(mine, sizeof mine, s->run_origin, s->run_base);
    run_said(zero, sizeof zero, s0->run_origin, s0->run_base);
    snprintf(c->err, sizeof c->err, "shard %u (%.64s:%u) holds a store %s, shard 0 one %s: a "
             "shard restored alone loses the updates the others kept since; " STORE_REMEDY, i,
             c->m.servers[i].host, c->m.servers[i].port, mine, zero);
    return PS_ECONFIG;
}

/* Once every shard answered the join: the runs digest each keeps (of the last join a worker told
 * it of by its heartbeats, or its restore's mark) against this join's (ps_runs_digest). A
 * shard restored alone from the checkpoint the whole cluster was restored from before has the
 * same origin as the others (join_run_check passes it), but the others keep the digest of the
 * runs they were joined with since, which its new run changed: under asp its updates since
 * were lost while counted applied, and a shard 0 so restored applied batches twice (a probe,
 * session 41). A shard that kept none (0: never joined, a store older than session 41) or its
 * restore's mark fits any. Sets c->runs_digest. @return 0, or PS_ECONFIG with c->err said. */
static int join_runs_check(ps_client_t *c)
{
    uint64_t runs[PS_MAX_SERVERS];
    for (uint32_t i = 0; i < c->nshards; i++)
        if ((runs[i] = __atomic_load_n(&c->shards[i].run, __ATOMIC_RELAXED)) == 0)
            return 0; /* an older psd: it does not say */
    uint64_t h = ps_runs_digest(runs, c->nshards);
    for (uint32_t i = 0; i < c->nshards; i++) {
        const cshard_t *s = &c->shards[i];
        if (s->joined_runs == 0 || s->joined_runs == h ||
            s->joined_runs == ps_run_restored_mark(s->run_origin))
            continue;
        snprintf(c->err, sizeof c->err, "shard %u (%.64s:%u) last served beside other stores "
                 "than these shards hold now: a shard was restored or replaced alone since, and "
                 "its updates would be lost or applied twice; " STORE_REMEDY, i,
                 c->m.servers[i].host, c->m.servers[i].port);
        return PS_ECONFIG;
    }
    __atomic_store_n(&c->runs_digest, h, __ATOMIC_RELAXED);
    return 0;
}

static int join(ps_client_t *c, uint32_t timeout_ms, const volatile sig_atomic_t *cancel)
{
    uint64_t start = now_ms(), deadline = start + timeout_ms;
    uint32_t backoff = 50;
    bool asked_again = false; /* shard 0, once more, after join_store_check blamed it */
    for (uint32_t i = 0; i < c->nshards; i++) {
        bool said = false;
        for (;;) {
            ps_msg_t req = {.type = PS_MSG_HELLO, .rank = c->rank, .pid = (uint32_t)getpid(),
                            .samples = c->join_serial, .store_id = ps_storeview_host_id()}, rep;
            hello_conf(c, &req, i);
            snprintf(req.cluster, sizeof req.cluster, "%s", c->m.cluster);
            gethostname(req.host, sizeof req.host - 1);
            int rc = ctrl_call(c, OP_HELLO, i, &req, &rep);
            if (rc == 0) {
                if (i == 0) {
                    __atomic_store_n(&c->rank, rep.rank, __ATOMIC_RELAXED); /* on_heartbeat */
                    c->workers = rep.workers;
                    c->join_step = rep.step;
                    c->join_serial = rep.samples;
                    c->join_tensors = rep.flags & PS_FLAG_TENSORS ? (int64_t)rep.count : -1;
                    /* PS_TEST_JOIN_HOLD=FILE (tests only): wait here while FILE exists (up to
                     * 60 s), so that another worker declares and pushes before the other
                     * shards answer. */
                    const char *hold = asked_again ? NULL : getenv("PS_TEST_JOIN_HOLD");
                    for (int t = 0; hold && access(hold, F_OK) == 0 && t < 6000; t++)
                        if (nap_or_cancel(10, cancel)) {
                            snprintf(c->err, sizeof c->err, "the join was canceled");
                            return PS_ECANCELED;
                        }
                } else if (join_store_check(c, i, &rep, c->join_tensors)) {
                    if (c->join_tensors != 0 || asked_again) return PS_ECONFIG;
                    /* Shard 0 had no tensors when it answered, shard i has them at a step past
                     * 0: lost, or another worker declared and pushed between the two answers
                     * (seen with the suites run two at a time: a worker joining beside the
                     * first one was refused). Shard 0 is asked once more, now with the rank
                     * and join serial it gave (the coordinator keeps them, on this connection
                     * or another), and so are the shards after it. */
                    PS_LOG(PS_LOG_INFO, "libps", "shard %u holds %llu tensors at step %llu, shard "
                           "0 held none when it answered: asking shard 0 again (another worker "
                           "may have declared them meanwhile)", i, (unsigned long long)rep.count,
                           (unsigned long long)rep.step);
                    asked_again = true;
                    i = 0;
                    continue;
                }
                if (join_run_check(c, i, &rep)) return PS_ECONFIG;
                break;
            }
            /* PS_EBUSY: a shard shutting down, or shard 0's free ranks held until its open
             * step closes: for a while, as an unreachable shard. */
            bool again = rc == PS_ETRANSPORT || rc == PS_ETIMEDOUT || rc == PS_EBUSY;
            if (!again || now_ms() >= deadline) {
                char why[256], took[96] = "";
                snprintf(why, sizeof why, "%.200s", c->err);
                /* Out of time: say how long it tried, as a reconnect that gives up does (a
                 * worker that lost a shard can be dropped by shard 0 meanwhile and end here,
                 * in its join again, instead: faults:silent_shard_lost, CI of session 47). */
                if (again)
                    snprintf(took, sizeof took, " in %llu ms (the reconnect timeout is %u ms)",
                             (unsigned long long)(now_ms() - start), timeout_ms);
                snprintf(c->err, sizeof c->err, "cannot join shard %u (%.64s:%u)%s: %s", i,
                         c->m.servers[i].host, c->m.servers[i].port, took, why);
                return rc;
            }
            /* Not at once: a psd still starting is usual. But a wait of up to timeout_ms
             * (30 s by default) in silence looked hung. */
            if (!said && now_ms() - start >= JOIN_SAY_MS) {
                said = true;
                PS_LOG(PS_LOG_WARN, "libps", "cannot join shard %u (%s:%u) yet: %s; trying "
                       "again for up to %u ms in all", i, c->m.servers[i].host,
                       c->m.servers[i].port, c->err, timeout_ms);
            }
            if (nap_or_cancel(backoff, cancel)) {
                snprintf(c->err, sizeof c->err, "the join was canceled while shard %u (%.64s:%u) "
                         "did not answer: %.200s", i, c->m.servers[i].host, c->m.servers[i].port,
                         ps_strerror(rc));
                return PS_ECANCELED;
            }
            backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
        }
    }
    return join_runs_check(c);
}

void ps_client_job(const ps_client_t *c, ps_job_info_t *out)
{
    out->consistency = (int)c->m.job.consistency;
    out->seed = c->m.job.seed;
    out->batch_size = c->m.job.batch_size;
    out->epochs = c->m.job.epochs;
    out->max_steps = c->m.job.max_steps;
    out->workers = c->m.job.workers;
}

/* ps_manifest_cluster and ps_manifest_optimizer: the manifest at @p path's cluster name, or
 * with @p optimizer its job's optimizer's name, into @p out. */
static int manifest_name(const char *path, bool optimizer, char *out, size_t outlen, char *err,
                         size_t errlen)
{
    ps_manifest_t *m = malloc(sizeof *m);
    if (m == NULL) return PS_ENOMEM;
    int rc = ps_manifest_load(m, path, err, errlen);
    const char *name = rc ? "" : optimizer ? ps_optim_name(m->job.optimizer.name) : m->cluster;
    if (rc == 0 && (size_t)snprintf(out, outlen, "%s", name) >= outlen) rc = PS_EINVAL;
    free(m);
    return rc;
}

int ps_manifest_cluster(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    return manifest_name(path, false, out, outlen, err, errlen);
}

int ps_manifest_optimizer(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    return manifest_name(path, true, out, outlen, err, errlen);
}

int ps_client_create(const char *manifest_path, const ps_client_opts_t *opts, ps_client_t **out,
                     char *err, size_t errlen)
{
    *out = NULL;
    /* UCX's TCP frames checked in this process (python with psd.torch, a user's program),
     * before any UCX socket (common/sockhooks.c). */
    ps_sockhooks_got_install();
    ps_client_t *c = calloc(1, sizeof *c);
    if (c == NULL) return PS_ENOMEM;
    char e[1024] = "";
    int rc = ps_manifest_load(&c->m, manifest_path, e, sizeof e);
    if (rc == 0) rc = ps_auth_load(&c->auth, &c->m, e, sizeof e);
    if (rc) {
        if (err) snprintf(err, errlen, "%s", e);
        free(c);
        return rc;
    }
    c->nshards = (uint32_t)c->m.nservers;
    c->chunk_elems = c->m.chunk_bytes / 4;
    c->fusion_bytes = c->m.fusion_bytes;
    c->rank = -1;
    const char *dp = getenv("PS_DIRECT_PULL");
    c->direct = !(dp && strcmp(dp, "0") == 0);
    const char *dq = getenv("PS_DIRECT_PUSH");
    c->direct_push = !(dq && strcmp(dq, "0") == 0);
    const char *tf = getenv("PS_TEST_DIRECT_FAIL");
    if (tf && atoi(tf) > 0) {
        c->test_direct_fail = (uint32_t)atoi(tf);
        PS_LOG(PS_LOG_WARN, "libps", "PS_TEST_DIRECT_FAIL=%u: direct read %u fails on purpose "
               "(a test hook)", c->test_direct_fail, c->test_direct_fail);
    }
    const char *tc = getenv("PS_TEST_CORRUPT_PUSH");
    if (tc && atoi(tc) > 0) {
        c->test_corrupt_push = (uint32_t)atoi(tc);
        PS_LOG(PS_LOG_WARN, "libps", "PS_TEST_CORRUPT_PUSH=%u: every %uth push is corrupted on "
               "purpose (a test hook)", c->test_corrupt_push, c->test_corrupt_push);
    }
    const char *tr = getenv("PS_TRACE");
    if (tr && *tr) {
        /* A process's later clients (a worker that joins again) write FILE.2, FILE.3, ...:
         * the trace up to the rejoin is what one wants to read. */
        static int clients;
        int n = __atomic_add_fetch(&clients, 1, __ATOMIC_RELAXED);
        static const char *const lanes[] = {"pushes", "pulls", "control"};
        char process[48], path[1024];
        snprintf(process, sizeof process, "libps pid %ld", (long)getpid());
        if (n > 1)
            snprintf(path, sizeof path, "%s.%d", tr, n);
        else
            snprintf(path, sizeof path, "%s", tr);
        rc = ps_trace_open(&c->trace, path, (uint32_t)getpid(), process, lanes, 3, e, sizeof e);
        if (rc) {
            if (err) snprintf(err, errlen, "PS_TRACE: %s", e);
            free(c);
            return rc;
        }
    }
    /* Set before the comm thread starts, which reads them. */
    uint32_t timeout = c->m.job.reconnect_timeout_ms;
    if (opts && (opts->field_mask & PS_CLIENT_OPT_CONNECT_TIMEOUT)) timeout = opts->connect_timeout_ms;
    c->reconnect_ms = timeout;
    /* A third of the heartbeat timeout: the shard must hear from the restarted transport
     * before it drops this worker as silent. At least 1 s: with a short heartbeat timeout
     * (elastic:sigstop_rejoins has 500 ms) a shard busy for a moment would otherwise make
     * hellos time out again and again, each a transport restart; there the shard drops the
     * worker first and it joins again. */
    c->hello_deadline_ms = c->m.job.heartbeat_timeout_ms / 3;
    if (c->hello_deadline_ms < 1000) c->hello_deadline_ms = 1000;
    c->silent_ms = 2 * c->m.job.heartbeat_timeout_ms; /* shard_silent */
    if (c->silent_ms < 2000) c->silent_ms = 2000;
    c->shards = calloc(c->nshards, sizeof *c->shards);
    c->tensors = calloc(PS_CLIENT_MAX_TENSORS, sizeof *c->tensors);
    /* The shards' addresses, here on the caller's thread (a name that does not resolve yet is
     * looked up again in the background by the comm thread: connect_shard). */
    for (uint32_t i = 0; c->shards && i < c->nshards; i++)
        if (ps_sockaddr_resolve(c->m.servers[i].host, c->m.servers[i].port,
                                &c->shards[i].addr, &c->shards[i].addrlen))
            c->shards[i].addrlen = 0;
    pthread_mutex_init(&c->loop_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    /* The comm thread (and UCX's async thread, which it starts) block the signals that end or
     * interrupt a process, so they reach the application's threads: a handler that calls
     * ps_client_interrupt, or destroys the client, never runs on a thread of the client. */
    sigset_t block, was;
    client_signals(&block);
    pthread_sigmask(SIG_BLOCK, &block, &was);
    int started = c->shards && c->tensors && pthread_create(&c->thread, NULL, comm_main, c) == 0;
    pthread_sigmask(SIG_SETMASK, &was, NULL);
    if (!started) {
        free(c->shards);
        free(c->tensors);
        ps_trace_close(c->trace);
        free(c);
        return PS_ENOMEM;
    }
    pthread_mutex_lock(&c->mu);
    while (!c->started) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    if (c->start_rc) {
        rc = c->start_rc;
        pthread_join(c->thread, NULL);
        if (err) snprintf(err, errlen, "cannot start the UCX transport: %s", ps_strerror(rc));
        free(c->shards);
        free(c->tensors);
        ps_trace_close(c->trace);
        free(c);
        return rc;
    }
    rc = join(c, timeout, opts && (opts->field_mask & PS_CLIENT_OPT_CANCEL) ? opts->cancel : NULL);
    if (rc) {
        if (err) snprintf(err, errlen, "%s", c->err);
        ps_client_destroy(c);
        return rc;
    }
    __atomic_store_n(&c->joined, 1, __ATOMIC_RELEASE);
    *out = c;
    return 0;
}

/* PS_FLAG_STALE when a push of step @p step was acknowledged as not applied, else 0. */
static uint32_t stale_flag(ps_client_t *c, uint64_t step)
{
    return __atomic_load_n(&c->stale_step1, __ATOMIC_ACQUIRE) == step + 1 ? PS_FLAG_STALE : 0;
}

void ps_client_destroy(ps_client_t *c)
{
    if (c == NULL) return;
    if (c->group_head) ps_client_group_end_all(c); /* nothing held is left unsent */
    if (c->rank >= 0) {
        ps_op_t *op = op_new(c, OP_LEAVE, c->nshards);
        if (op) {
            for (uint32_t i = 0; i < c->nshards; i++) op->parts[i].shard = i;
            if (c->has_leave_done) { /* the coordinator counts the batch before the leave */
                op->req.flags = PS_FLAG_DONE | stale_flag(c, c->leave_done.step);
                op->req.step = c->leave_done.step;
                op->req.samples = c->batch_samples;
                op->req.data_epoch = c->leave_done.pass;
                op->req.batch_offset = c->leave_done.offset;
                op->req.batch_count = c->leave_done.count;
            }
            submit(c, op);
            ps_op_wait(op, NULL);
        }
    }
    /* On the stack (it has no parts): a shutdown that failed to allocate would leave the join
     * below waiting for a comm thread nobody stops. */
    ps_op_t stop;
    pthread_mutex_lock(&c->loop_mu); /* the comm thread cannot end (close c->wake) meanwhile */
    submit(c, op_init(&stop, c, OP_SHUTDOWN, 0));
    pthread_mutex_unlock(&c->loop_mu);
    op_wait_done(c, &stop);
    pthread_join(c->thread, NULL);
    ps_trace_close(c->trace); /* its writers (under loop_mu) are done: the comm thread ended */
    pthread_mutex_destroy(&c->loop_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    for (uint32_t i = 0; c->tensors && i < PS_CLIENT_MAX_TENSORS; i++) {
        ctensor_t *t = c->tensors[i];
        if (t == NULL) continue;
        free(t->residual);
        ps_buffer_free(t->payload, t->chunk_cap * t->nchunks);
        free(t->scratch);
        free(t->pull_buf);
        free(t->spare[0]);
        free(t->spare[1]);
        free(t->places);
        free(t);
    }
    free(c->tensors);
    free(c->ctrl_spare);
    for (uint32_t i = 0; c->shards && i < c->nshards; i++) {
        ps_storeview_close(&c->shards[i].view);
        area_unmap(&c->shards[i]);
    }
    free(c->shards);
    while (c->flying) { /* none: closing the endpoints completed every send */
        bundle_t *b = c->flying;
        bundle_fly(c, b, 0);
        b->next_free = c->free_bundles;
        c->free_bundles = b;
    }
    for (bundle_t *b = c->free_bundles, *nx; b; b = nx) {
        nx = b->next_free;
        free(b->buf);
        free(b->parts);
        free(b);
    }
    ps_auth_wipe(&c->auth); /* the comm thread has ended: nothing reads it any more */
    free(c);
}

void ps_client_interrupt(ps_client_t *c)
{
    if (c == NULL) return;
    __atomic_store_n(&c->interrupted, 1, __ATOMIC_RELEASE);
    uv_async_send(&c->wake); /* async-signal-safe */
}

int ps_client_direct(const ps_client_t *c, uint32_t shard)
{
    if (shard >= c->nshards) return 0;
    const cshard_t *s = &c->shards[shard];
    return (__atomic_load_n(&s->view_open, __ATOMIC_RELAXED) ? PS_DIRECT_PULLS : 0) |
           (__atomic_load_n(&s->area, __ATOMIC_RELAXED) ? PS_DIRECT_PUSHES : 0);
}

int ps_client_rank(const ps_client_t *c) { return c->rank; }
uint32_t ps_client_workers(const ps_client_t *c) { return c->workers; }
uint64_t ps_client_join_step(const ps_client_t *c) { return c->join_step; }
uint32_t ps_client_shards(const ps_client_t *c) { return c->nshards; }
const char *ps_client_error(const ps_client_t *c) { return c ? c->err : "no client (NULL)"; }

void ps_client_stats(const ps_client_t *c, ps_client_stats_t *out)
{
    out->bytes_pushed = __atomic_load_n(&c->stats.bytes_pushed, __ATOMIC_RELAXED);
    out->bytes_pulled = __atomic_load_n(&c->stats.bytes_pulled, __ATOMIC_RELAXED);
    out->bytes_pushed_raw = __atomic_load_n(&c->stats.bytes_pushed_raw, __ATOMIC_RELAXED);
    out->pushes = __atomic_load_n(&c->stats.pushes, __ATOMIC_RELAXED);
    out->pulls = __atomic_load_n(&c->stats.pulls, __ATOMIC_RELAXED);
    out->bytes_pulled_direct = __atomic_load_n(&c->stats.bytes_pulled_direct, __ATOMIC_RELAXED);
    out->bytes_pushed_direct = __atomic_load_n(&c->stats.bytes_pushed_direct, __ATOMIC_RELAXED);
}

uint64_t ps_client_nonfinite_pushes(const ps_client_t *c)
{
    return __atomic_load_n(&c->nonfinite_pushes, __ATOMIC_RELAXED);
}

/* Send the values of tensor @p req's chunks placed on shard @p shard, which its declaration
 * there creates (the reply's PS_FLAG_VALUES), one chunk at a time, each answered on receipt. */
static int send_values(ps_client_t *c, uint32_t shard, const ps_decl_t *d, const float *values)
{
    uint64_t numel = ps_decl_numel(d);
    uint32_t nchunks = ps_chunk_count(numel, c->chunk_elems);
    for (uint32_t ch = 0; ch < nchunks; ch++) {
        if (ps_place_shard(d->first_chunk + ch, c->nshards) != shard) continue;
        const float *v = values + (uint64_t)ch * c->chunk_elems;
        size_t bytes = (size_t)ps_chunk_len(numel, c->chunk_elems, ch) * sizeof(float);
        ps_op_t *op = op_reuse(c, &c->ctrl_spare, OP_VALUES, 1);
        if (op == NULL) return PS_ENOMEM;
        op->parts[0].shard = shard;
        op->buf = (float *)v; /* only read: sent as it is */
        op->req = (ps_msg_t){.type = PS_MSG_VALUES, .req_id = op->req_id, .rank = c->rank,
                             .tensor = d->id, .chunk = ch, .length = bytes,
                             .crc32c = ps_crc32c(0, v, bytes)};
        submit(c, op);
        int rc = ps_op_wait(op, NULL);
        if (rc) return rc;
    }
    return 0;
}

/* Test hooks when a shard asks for values (tests only): PS_TEST_VALUES_MARK=path creates the
 * file, then PS_TEST_VALUES_STOP stops this process, PS_TEST_VALUES_SLEEP=ms sleeps. */
static void test_values_asked(void)
{
    const char *mark = getenv("PS_TEST_VALUES_MARK"), *nap = getenv("PS_TEST_VALUES_SLEEP");
    if (mark) {
        int fd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) close(fd);
    }
    if (getenv("PS_TEST_VALUES_STOP")) raise(SIGSTOP);
    if (nap) usleep((useconds_t)atoi(nap) * 1000);
}

/* Whether every shard leaves a push holding a NaN or an infinity out (its hello reply said
 * PS_FLAG_NONFINITE): only then may a chunk int8 or sign cannot encode go as fp32. */
static int all_leave_nonfinite(const ps_client_t *c)
{
    for (uint32_t sh = 0; sh < c->nshards; sh++)
        if (!__atomic_load_n(&c->shards[sh].leaves_nonfinite, __ATOMIC_ACQUIRE)) return 0;
    return 1;
}

/* Declare @p req on shard @p shard into @p rep; with @p values, send them where the
 * declaration creates the tensor and declare again (answered once it is created). A worker
 * that took over from one gone is asked again: bounded, as each ask is a creation's. */
static int declare_on(ps_client_t *c, uint32_t shard, ps_msg_t *req, ps_msg_t *rep,
                      const float *values, int *asked)
{
    int rc = ctrl_call(c, OP_DECLARE, shard, req, rep);
    *asked = rc == 0 && (rep->flags & PS_FLAG_VALUES);
    for (int asks = 0; rc == 0 && (rep->flags & PS_FLAG_VALUES); asks++) {
        if (values == NULL || !rep->has_decl || !rep->decl.assigned || asks == 8) {
            snprintf(c->err, sizeof c->err, "shard %u asked for the values of tensor '%s' %s",
                     shard, req->decl.name, values ? "again and again" : "it was not sent");
            return PS_EPROTO;
        }
        test_values_asked();
        req->decl.id = rep->decl.id; /* shard 0 numbered it */
        req->decl.first_chunk = rep->decl.first_chunk;
        req->decl.assigned = 1;
        rc = send_values(c, shard, &req->decl, values);
        if (rc == PS_ECRC) rc = 0; /* corrupted on the way: the shard asks again, and gets all */
        if (rc == 0) rc = ctrl_call(c, OP_DECLARE, shard, req, rep);
    }
    return rc;
}

static int declare(ps_client_t *c, const ps_tensor_desc_t *desc, const float *values,
                   uint32_t *id, int *own);
_Static_assert(PS_TENSOR_MEAN == PS_DECL_MEAN, "the public flag is the wire's");

int ps_client_declare(ps_client_t *c, const ps_tensor_desc_t *desc, uint32_t *id)
{
    return declare(c, desc, NULL, id, NULL);
}

int ps_client_declare_values(ps_client_t *c, const ps_tensor_desc_t *desc, const float *values,
                             uint32_t *id, int *own)
{
    if (own) *own = 0;
    if (c == NULL) return PS_EINVAL;
    if (values == NULL) {
        snprintf(c->err, sizeof c->err, "declare: the values are NULL");
        return PS_EINVAL;
    }
    if (!__atomic_load_n(&c->shards[0].knows_values, __ATOMIC_ACQUIRE)) {
        if (!c->said_no_values)
            PS_LOG(PS_LOG_WARN, "libps", "shard 0 is a psd older than session 36: it takes no "
                   "values with a declaration; tensors it creates start from the shards' "
                   "initializer");
        c->said_no_values = 1;
        return declare(c, desc, NULL, id, NULL);
    }
    return declare(c, desc, values, id, own);
}

static int declare(ps_client_t *c, const ps_tensor_desc_t *desc, const float *values,
                   uint32_t *id, int *own)
{
    if (c == NULL) return PS_EINVAL;
    if (desc == NULL || id == NULL || desc->name == NULL) {
        snprintf(c->err, sizeof c->err, "declare: %s is NULL",
                 desc == NULL ? "the description" : id == NULL ? "id" : "the name");
        return PS_EINVAL;
    }
    if (strlen(desc->name) >= PS_NAME_MAX) {
        snprintf(c->err, sizeof c->err, "declare: tensor name longer than %d bytes",
                 PS_NAME_MAX - 1);
        return PS_EINVAL;
    }
    ps_msg_t req = {.type = PS_MSG_DECLARE, .rank = c->rank, .has_decl = 1}, rep;
    snprintf(req.decl.name, sizeof req.decl.name, "%s", desc->name);
    memcpy(req.decl.shape, desc->shape, sizeof req.decl.shape);
    req.decl.ndim = desc->ndim;
    req.decl.init = (uint32_t)desc->init;
    req.decl.init_arg = desc->init_arg;
    req.decl.seed = desc->seed;
    req.decl.total_steps = desc->total_steps;
    /* With values, the initializer is "the values sent" (the mean flag kept). */
    uint32_t init = values ? PSK_INIT_VALUES | (req.decl.init & PS_DECL_MEAN) : req.decl.init;
    float init_arg = values ? 0.0f : desc->init_arg;
    req.decl.init = init;
    req.decl.init_arg = init_arg;
    /* The shards refuse what this refuses; checked here, the caller learns why at once. */
    char why[256];
    if (ps_decl_check(&req.decl, why, sizeof why)) {
        snprintf(c->err, sizeof c->err, "declare: %s", why);
        return PS_EINVAL;
    }
    if (!isfinite(req.decl.init_arg)) { /* its initializer would make every value NaN or inf */
        snprintf(c->err, sizeof c->err, "declare: tensor '%s' has a non-finite init_arg",
                 desc->name);
        return PS_EINVAL;
    }
    if (values && !psk_all_finite(values, ps_decl_numel(&req.decl))) {
        snprintf(c->err, sizeof c->err, "declare: the values of tensor '%s' hold a NaN or an "
                 "infinity", desc->name);
        return PS_EINVAL;
    }
    /* Shard 0 numbers the tensor; the others create their chunks with that numbering. */
    int asked, parts = 0, mine = 0; /* shards holding chunks of it; those that asked */
    int rc = declare_on(c, 0, &req, &rep, values, &asked);
    if (rc) return rc;
    if (!rep.has_decl || !rep.decl.assigned) {
        snprintf(c->err, sizeof c->err, "shard 0 answered a declaration without an id");
        return PS_EPROTO;
    }
    req.decl = rep.decl;
    /* A part another shard lacks is created as this caller asks: from its values, or its
     * initializer where shard 0's creator sent values (else shard 0's initializer). */
    if (values || ps_decl_init_kind(&req.decl) == PSK_INIT_VALUES) {
        req.decl.init = init;
        req.decl.init_arg = init_arg;
    }
    uint64_t numel = ps_decl_numel(&req.decl);
    uint32_t nchunks = ps_chunk_count(numel, c->chunk_elems);
    for (uint32_t i = 0; i < c->nshards; i++) {
        ps_msg_t r2;
        if (i > 0 && (rc = declare_on(c, i, &req, &r2, values, &asked)) != 0) return rc;
        bool holds = false;
        for (uint32_t ch = 0; ch < nchunks && !holds; ch++)
            holds = ps_place_shard(req.decl.first_chunk + ch, c->nshards) == i;
        parts += holds;
        mine += holds && asked;
    }
    if (own) *own = parts > 0 && mine == parts;
    uint32_t tid = rep.decl.id;
    if (tid >= PS_CLIENT_MAX_TENSORS) {
        snprintf(c->err, sizeof c->err, "tensor id %u out of range", tid);
        return PS_EPROTO;
    }
    if (c->tensors[tid] == NULL && (c->tensors[tid] = calloc(1, sizeof(ctensor_t))) == NULL)
        return PS_ENOMEM;
    ctensor_t *t = c->tensors[tid];
    if (t->nchunks == 0) { /* new to this client (declared again: counted once) */
        c->tensor_set += psk_mix64(tid + 1); /* a sum: the order of declarations is free */
        c->ntensor_set++;
    }
    t->id = tid;
    t->numel = ps_decl_numel(&rep.decl);
    t->nchunks = ps_chunk_count(t->numel, c->chunk_elems);
    t->first_chunk = rep.decl.first_chunk;
    if (t->places == NULL && t->nchunks) /* NULL when out of memory: no direct pushes */
        t->places = calloc(t->nchunks, sizeof *t->places); /* read by the comm thread only
                                                              after this declare returns */
    *id = tid;
    return 0;
}

static int data_op(ps_client_t *c, int type, uint32_t id, float *buf, uint64_t step,
                   ps_push_encoder_t enc, void *enc_arg, ps_op_t **out)
{
    if (c == NULL) return PS_EINVAL;
    bool nograd = type == OP_PUSH_NONE;
    if (nograd) {
        type = OP_PUSH;
        if (c->m.job.consistency != PS_CONSIST_BSP) {
            snprintf(c->err, sizeof c->err, "push_none of tensor %u: only under bsp (where a "
                     "step waits for every member's push); under asp / ssp push nothing", id);
            return PS_EINVAL;
        }
    }
    if ((buf == NULL && !nograd && enc == NULL) || out == NULL) {
        snprintf(c->err, sizeof c->err, "%s of tensor %u: %s is NULL", op_name(type), id,
                 buf == NULL ? (type == OP_PUSH ? "the gradient" : "the destination") : "op");
        return PS_EINVAL;
    }
    if (id >= PS_CLIENT_MAX_TENSORS || c->tensors[id] == NULL || c->tensors[id]->nchunks == 0) {
        snprintf(c->err, sizeof c->err, "tensor %u was not declared by this client", id);
        return PS_EINVAL;
    }
    ctensor_t *t = c->tensors[id];
    if (enc != NULL && t->codec.kind == PSK_CODEC_NONE) {
        snprintf(c->err, sizeof c->err, "encoded push of tensor %u: it has no codec (push the "
                 "gradient itself)", id);
        return PS_EINVAL;
    }
    if (type == OP_PUSH && t->busy[0]) {
        snprintf(c->err, sizeof c->err, "tensor %u: a push of it is in flight; wait for it "
                 "before pushing it again", id);
        return PS_EBUSY;
    }
    if (type == OP_PULL && t->busy[1] && t->pull_codec.kind != PSK_CODEC_NONE) {
        snprintf(c->err, sizeof c->err, "tensor %u: a compressed pull of it is in flight (they "
                 "land in one buffer); wait for it first", id);
        return PS_EBUSY;
    }
    ps_op_t *op = op_reuse(c, &t->spare[type == OP_PULL], type, t->nchunks);
    if (op == NULL) return PS_ENOMEM;
    op->tensor = id;
    op->buf = buf;
    op->step = step;
    op->nograd = nograd;
    /* A NaN or an infinity int8 or sign cannot encode: a chunk holding one goes as fp32 where
     * every shard leaves such a push out (below); else the push is refused whole. */
    if (type == OP_PUSH && !nograd && enc == NULL && t->error_feedback &&
        psk_codec_needs_finite(&t->codec) && !all_leave_nonfinite(c) &&
        !psk_all_finite(buf, t->numel)) {
        /* Checked whole before any chunk is encoded: an encoded chunk's residual already
         * counts its payload as sent. */
        snprintf(c->err, sizeof c->err, "tensor %u: the gradient holds a NaN or an infinity, "
                 "which its codec cannot encode: push refused (nothing sent; the error-feedback "
                 "residual unchanged)", id);
        free(op);
        return PS_EINVAL;
    }
    for (uint32_t i = 0; i < t->nchunks; i++) {
        part_t *p = &op->parts[i];
        p->chunk = i;
        p->shard = ps_place_shard(t->first_chunk + i, c->nshards);
        p->raw = 0;
        if (type != OP_PUSH || nograd) continue; /* nograd: no data, len 0 */
        size_t n = ps_chunk_len(t->numel, c->chunk_elems, i);
        const float *g = enc == NULL ? buf + (uint64_t)i * c->chunk_elems : NULL;
        if (t->codec.kind == PSK_CODEC_NONE) {
            p->data = g;
            p->len = n * 4; /* its CRC-32C: at its first send (send_data_part) */
            continue;
        }
        /* Compress on the caller's thread, before the gradient leaves. */
        psk_codec_t cc = t->codec;
        cc.seed = psk_codec_push_seed(step, id, i);
        uint8_t *out = t->payload + (size_t)i * t->chunk_cap;
        int rc;
        if (enc != NULL) {
            /* The caller's encoder (a device's), checked as psd will check it. */
            p->len = 0;
            rc = enc(enc_arg, id, i, (uint64_t)i * c->chunk_elems, n, &cc, t->error_feedback,
                     out, t->chunk_cap, &p->len);
            if (rc == 0 && (p->len > t->chunk_cap || psk_codec_check(out, p->len, n, &cc))) {
                snprintf(c->err, sizeof c->err, "chunk %u of tensor %u: the encoder's payload "
                         "is not a valid one of its codec (a NaN or an infinity that int8 or "
                         "sign cannot encode?)", i, id);
                free(op);
                return PS_EINVAL;
            }
        } else {
            rc = t->error_feedback
                     ? psk_codec_encode_ef_cpu(out, t->chunk_cap, &p->len, g,
                                               t->residual + (uint64_t)i * c->chunk_elems, n, &cc,
                                               t->scratch)
                     : psk_codec_encode_cpu(out, t->chunk_cap, &p->len, g, n, &cc, t->scratch);
            if (rc == PS_EINVAL && psk_codec_needs_finite(&cc) && all_leave_nonfinite(c) &&
                !psk_all_finite(g, n)) {
                /* Refused with the residual as it was: the chunk goes as fp32, and the shard
                 * leaves it out (acknowledged PS_FLAG_NONFINITE). */
                p->raw = 1;
                p->data = g;
                p->len = n * 4;
                continue;
            }
        }
        if (rc) {
            snprintf(c->err, sizeof c->err, "cannot encode chunk %u of tensor %u: %s", i, id,
                     ps_strerror(rc));
            free(op);
            return rc;
        }
        p->data = out;
    }
    t->busy[type == OP_PULL]++;
    submit(c, op);
    *out = op;
    return 0;
}

int ps_client_set_compression(ps_client_t *c, uint32_t id, const ps_compression_t *cfg)
{
    const char *codec = cfg->codec, *pull_codec = cfg->pull;
    int error_feedback = cfg->error_feedback;
    if (id >= PS_CLIENT_MAX_TENSORS || c->tensors[id] == NULL || c->tensors[id]->nchunks == 0) {
        snprintf(c->err, sizeof c->err, "tensor %u was not declared by this client", id);
        return PS_EINVAL;
    }
    ctensor_t *t = c->tensors[id];
    if (t->busy[0] || t->busy[1]) {
        snprintf(c->err, sizeof c->err, "tensor %u: a push or pull of it is in flight; wait for "
                 "it before changing its compression", id);
        return PS_EBUSY;
    }
    psk_codec_t pc, pl;
    if (psk_codec_parse(&pc, codec ? codec : "none")) {
        snprintf(c->err, sizeof c->err, "unknown codec '%s'", codec);
        return PS_EINVAL;
    }
    if (cfg->field_mask & PS_COMPRESSION_BLOCK) {
        if (cfg->block == 0) {
            snprintf(c->err, sizeof c->err, "codec block size must be at least 1");
            return PS_EINVAL;
        }
        pc.block = cfg->block;
    }
    if (cfg->field_mask & PS_COMPRESSION_STOCHASTIC) pc.stochastic = cfg->stochastic != 0;
    if (cfg->field_mask & PS_COMPRESSION_FP16_VALUES) pc.fp16_values = cfg->fp16_values != 0;
    if (psk_codec_parse(&pl, pull_codec ? pull_codec : "none") ||
        (pl.kind != PSK_CODEC_NONE && pl.kind != PSK_CODEC_FP16 && pl.kind != PSK_CODEC_BF16)) {
        snprintf(c->err, sizeof c->err, "parameters travel as none, fp16 or bf16, not '%s'",
                 pull_codec);
        return PS_EINVAL;
    }
    /* Every buffer first, then the tensor changes at once: a failed allocation leaves it as
     * it was (a half-changed one pushed with the old codec into the new buffers). */
    size_t n = t->numel < c->chunk_elems ? t->numel : c->chunk_elems; /* the largest chunk */
    bool push = pc.kind != PSK_CODEC_NONE, pull = pl.kind != PSK_CODEC_NONE;
    size_t cap = push ? psk_codec_max_bytes(&pc, n) : 0;
    size_t scr = push ? psk_codec_scratch_bytes(&pc, n) : 0;
    size_t pull_cap = pull ? psk_codec_max_bytes(&pl, n) : 0;
    uint8_t *payload = push ? ps_buffer_alloc(cap * t->nchunks) : NULL; /* read by the shards */
    void *scratch = scr ? malloc(scr) : NULL;
    float *res = push && error_feedback ? calloc(t->numel, sizeof *res) : NULL;
    uint8_t *pull_buf = pull ? malloc(pull_cap * t->nchunks) : NULL;
    if ((push && !payload) || (scr && !scratch) || (push && error_feedback && !res) ||
        (pull && !pull_buf)) {
        ps_buffer_free(payload, cap * t->nchunks);
        free(scratch);
        free(res);
        free(pull_buf);
        snprintf(c->err, sizeof c->err, "tensor %u: out of memory for its compression buffers "
                 "(its compression is unchanged)", id);
        return PS_ENOMEM;
    }
    if (push) {
        ps_buffer_free(t->payload, t->chunk_cap * t->nchunks);
        free(t->scratch);
        free(t->residual);
        t->payload = payload;
        t->scratch = scratch;
        t->residual = res;
        t->chunk_cap = cap;
    }
    if (pull) {
        free(t->pull_buf);
        t->pull_buf = pull_buf;
        t->pull_cap = pull_cap;
    }
    t->codec = pc;
    t->error_feedback = error_feedback && push;
    t->pull_codec = pl;
    return 0;
}

int ps_client_use_job_compression(ps_client_t *c, uint32_t id, const char *name)
{
    if (c == NULL || name == NULL) return PS_EINVAL;
    if (id >= PS_CLIENT_MAX_TENSORS || c->tensors[id] == NULL || c->tensors[id]->nchunks == 0) {
        snprintf(c->err, sizeof c->err, "tensor %u was not declared by this client", id);
        return PS_EINVAL;
    }
    /* As psworker: the first rule matching the name, else none below min_bytes, else the
     * job's codec. */
    const ps_compression_conf_t *cc = &c->m.job.compression;
    ps_compression_t comp = {
        .field_mask = PS_COMPRESSION_BLOCK | PS_COMPRESSION_STOCHASTIC | PS_COMPRESSION_FP16_VALUES,
        .codec = ps_compression_codec_for(cc, name, c->tensors[id]->numel * 4),
        .error_feedback = cc->error_feedback, .pull = cc->pull, .block = cc->block,
        .stochastic = cc->stochastic, .fp16_values = cc->fp16_values};
    return ps_client_set_compression(c, id, &comp);
}

void ps_client_batch_done(ps_client_t *c, const ps_batch_info_t *done)
{
    c->leave_done = *done;
    c->has_leave_done = 1;
}

/* Shard 0 refused this worker's first batch request (another model than the job's, or
 * another training set): give up the tensors it declared. One that only this worker declared
 * was created by its declaration at step 0 and, no member pushing it, would stay there for
 * good under bsp, holding the shards' step and every checkpoint of the job. Shard 0 drops one
 * that no other rank declared and no push reached (server/forget.c); then the other shards
 * theirs. Best effort: the refusal stays this worker's error. */
void ps_client_give_up(ps_client_t *c)
{
    if (c == NULL || !__atomic_load_n(&c->shards[0].knows_values, __ATOMIC_ACQUIRE))
        return; /* an older psd: it would not answer (server/forget.c is of session 36) */
    char err[sizeof c->err];
    memcpy(err, c->err, sizeof err);
    uint32_t dropped = 0, kept = 0;
    for (uint32_t id = 0; id < PS_CLIENT_MAX_TENSORS; id++) {
        if (c->tensors[id] == NULL || c->tensors[id]->nchunks == 0) continue;
        /* Shard 0 is asked whether it would, the others drop their chunks, shard 0 last. */
        ps_msg_t q = {.type = PS_MSG_FORGET, .rank = c->rank, .tensor = id,
                      .flags = PS_FLAG_CHECK}, r;
        if (ctrl_call(c, OP_FORGET, 0, &q, &r) != 0 || !(r.flags & PS_FLAG_DONE)) {
            kept++;
            continue;
        }
        q.flags = 0;
        int rc = 0;
        for (uint32_t i = 1; i < c->nshards && rc == 0; i++) {
            if ((rc = ctrl_call(c, OP_FORGET, i, &q, &r)) != 0 && rc != PS_ENOENT) {
                PS_LOG(PS_LOG_WARN, "libps", "tensor %u not dropped by shard %u: %s", id, i,
                       c->err);
            } else if (rc == 0 && !(r.flags & PS_FLAG_DONE)) {
                /* Kept there: a push reached its chunk. So is the tensor, shard 0's
                 * declaration with it. Before, only an error stopped the drop, and shard 0
                 * (which sees its own chunks only, and a rank, not a process: a worker of
                 * another model given a trained tensor's last declarer's rank) dropped a
                 * trained tensor whose chunks are on other shards; the job's workers were then
                 * refused "declared as id 2 at chunk 2, but it is id 1 at chunk 1" (a helper's
                 * probe, session 48). */
                PS_LOG(PS_LOG_INFO, "libps", "tensor %u kept: shard %u holds pushes of it", id,
                       i);
                rc = PS_EBUSY; /* in use: the loop ends, shard 0 is not asked */
            } else {
                rc = 0;
            }
        }
        if (rc == 0 && ctrl_call(c, OP_FORGET, 0, &q, &r) == 0 && (r.flags & PS_FLAG_DONE))
            dropped++;
        else
            kept++;
    }
    if (dropped)
        PS_LOG(PS_LOG_INFO, "libps", "gave up the tensors this worker declared: %u only it had "
               "declared were dropped, %u kept (the job's)", dropped, kept);
    memcpy(c->err, err, sizeof err);
}

int ps_client_next_batch(ps_client_t *c, uint64_t samples, const ps_batch_info_t *done,
                         ps_batch_info_t *out)
{
    if (c == NULL) return PS_EINVAL;
    if (samples == 0 || out == NULL) {
        snprintf(c->err, sizeof c->err, "next batch: %s", out == NULL ? "out is NULL"
                 : "a training set of 0 samples has no batch");
        return PS_EINVAL;
    }
    /* With the set of tensors declared: under bsp each step waits for every member's push of
     * every tensor a member pulls, so a member with another model would hold the job for good;
     * shard 0 refuses it instead (never 0: 0 is "not sent", from an older libps). */
    ps_msg_t req = {.type = PS_MSG_BATCH, .rank = c->rank, .samples = samples,
                    .tensor_set = psk_mix64(c->tensor_set) | 1, .count = c->ntensor_set}, rep;
    if (done) {
        req.flags = PS_FLAG_DONE | stale_flag(c, done->step);
        req.step = done->step;
        req.data_epoch = done->pass;
        req.batch_offset = done->offset;
        req.batch_count = done->count;
    }
    int rc = ctrl_call(c, OP_BATCH, 0, &req, &rep);
    if (rc == PS_ECONFIG && done == NULL && !c->had_batch) ps_client_give_up(c);
    if (rc) return rc; /* a batch done stays for the leave: reporting it twice is harmless */
    /* Only a request shard 0 took: the leave reports a batch done under the training set's
     * size, and one refused (another size: ECONFIG) would make shard 0 drop that report. */
    c->batch_samples = samples;
    __atomic_store_n(&c->had_batch, 1, __ATOMIC_RELEASE); /* on_rehello reads it */
    c->has_leave_done = 0; /* reported, or superseded by the batch handed out now */
    *out = (ps_batch_info_t){.step = rep.step, .pass = rep.data_epoch,
                             .offset = rep.batch_offset, .count = rep.batch_count,
                             .members = (uint32_t)__builtin_popcountll(rep.members),
                             .epoch = rep.epoch, .finished = (rep.flags & PS_FLAG_FINISHED) != 0};
    if (!out->finished && out->count == 0) {
        snprintf(c->err, sizeof c->err, "shard 0 handed out an empty batch");
        return PS_EPROTO;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ps_client_self_test(ps_client_t *c, uint32_t shard, size_t bytes, int reps, double *gbps,
                        char *lanes, size_t lanes_len)
{
    if (shard >= c->nshards || bytes == 0 || bytes > (64u << 20) || reps < 1 || reps > 1000000) {
        snprintf(c->err, sizeof c->err, "self-test: shard %u, %zu bytes, %d reps: out of range",
                 shard, bytes, reps);
        return PS_EINVAL;
    }
    if (c->group_head) ps_client_group_end_all(c); /* held ops first, as the header says */
    float *buf = calloc(1, bytes);
    if (buf == NULL) return PS_ENOMEM;
    int rc = 0;
    double t0 = 0;
    for (int i = 0; i <= reps && rc == 0; i++) { /* the first one warms the path up */
        if (i == 1) t0 = now_s();
        ps_op_t *op = op_reuse(c, &c->ctrl_spare, OP_ECHO, 1);
        if (op == NULL) {
            rc = PS_ENOMEM;
            break;
        }
        op->parts[0].shard = shard;
        op->buf = buf;
        op->req = (ps_msg_t){.type = PS_MSG_ECHO, .req_id = op->req_id, .rank = c->rank,
                             .length = bytes};
        submit(c, op);
        rc = ps_op_wait(op, NULL);
    }
    double secs = now_s() - t0;
    free(buf);
    if (rc) return rc;
    *gbps = secs > 0 ? (double)bytes * reps / secs / 1e9 : 0;
    if (lanes) ps_client_lanes(c, shard, lanes, lanes_len);
    return 0;
}

int ps_client_lanes(ps_client_t *c, uint32_t shard, char *out, size_t len)
{
    if (out && len) out[0] = '\0';
    if (c == NULL || (out == NULL && len)) return PS_EINVAL;
    if (shard >= c->nshards) {
        snprintf(c->err, sizeof c->err, "lanes: shard %u: the cluster has shards 0..%u", shard,
                 c->nshards - 1);
        return PS_EINVAL;
    }
    pthread_mutex_lock(&c->mu); /* the comm thread rewrites it after a reconnect */
    if (len) snprintf(out, len, "%s", c->shards[shard].lanes);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int ps_client_push(ps_client_t *c, uint32_t id, const float *grad, uint64_t step, ps_op_t **op)
{
    return data_op(c, OP_PUSH, id, (float *)grad, step, NULL, NULL, op); /* only read */
}

int ps_client_push_none(ps_client_t *c, uint32_t id, uint64_t step, ps_op_t **op)
{
    return data_op(c, OP_PUSH_NONE, id, NULL, step, NULL, NULL, op);
}

int ps_client_pull(ps_client_t *c, uint32_t id, float *dst, uint64_t min_version, ps_op_t **op)
{
    return data_op(c, OP_PULL, id, dst, min_version, NULL, NULL, op);
}

/* @p n data ops of @p type (a NULL buffer of a push: its push_none) as one group. */
static int data_many(ps_client_t *c, int type, uint32_t n, const uint32_t *ids,
                     float *const *bufs, uint64_t step, ps_op_t **ops)
{
    if (c == NULL) return PS_EINVAL;
    if (n && (ids == NULL || bufs == NULL || ops == NULL)) {
        snprintf(c->err, sizeof c->err, "%s of %u tensors: %s is NULL", op_name(type), n,
                 ids == NULL ? "ids" : bufs == NULL ? "the buffers" : "ops");
        return PS_EINVAL;
    }
    for (uint32_t i = 0; i < n; i++) ops[i] = NULL;
    int rc = 0;
    ps_client_group_begin(c);
    for (uint32_t i = 0; i < n && rc == 0; i++)
        rc = data_op(c, type == OP_PUSH && bufs[i] == NULL ? OP_PUSH_NONE : type, ids[i],
                     bufs[i], step, NULL, NULL, &ops[i]);
    ps_client_group_end(c);
    return rc;
}

int ps_client_push_many(ps_client_t *c, uint32_t n, const uint32_t *ids,
                        const float *const *bufs, uint64_t step, ps_op_t **ops)
{
    return data_many(c, OP_PUSH, n, ids, (float *const *)bufs, step, ops); /* only read */
}

int ps_client_pull_many(ps_client_t *c, uint32_t n, const uint32_t *ids, float *const *dsts,
                        uint64_t min_version, ps_op_t **ops)
{
    return data_many(c, OP_PULL, n, ids, dsts, min_version, ops);
}

int ps_op_wait_many(uint32_t n, ps_op_t **ops, uint64_t *versions, int *statuses)
{
    if (n && ops == NULL) return PS_EINVAL;
    int first = 0;
    ps_client_t *failed = NULL;
    char err[sizeof failed->err];
    for (uint32_t i = 0; i < n; i++) {
        ps_client_t *c = ops[i] ? ops[i]->c : NULL;
        int rc = ops[i] ? ps_op_wait(ops[i], versions ? &versions[i] : NULL) : 0;
        ops[i] = NULL;
        if (statuses) statuses[i] = rc;
        if (rc && first == 0) {
            first = rc;
            failed = c;
            memcpy(err, c->err, sizeof err);
        }
    }
    if (failed) memcpy(failed->err, err, sizeof err); /* the first failure's reason */
    return first;
}

int ps_client_push_encoded(ps_client_t *c, uint32_t id, uint64_t step, ps_push_encoder_t enc,
                           void *arg, ps_op_t **op)
{
    if (c != NULL && enc == NULL) {
        snprintf(c->err, sizeof c->err, "encoded push of tensor %u: the encoder is NULL", id);
        return PS_EINVAL;
    }
    return data_op(c, OP_PUSH, id, NULL, step, enc, arg, op);
}
