/* coord.c: shard 0's coordinator: the job's members, membership epochs, the bsp
 * step and the hand-out of the training set in batches.
 *
 * bsp: the open step has a member set (a bitmap of ranks). At the step's close —
 * the first member that reports its batch done, which it does only once every
 * shard acknowledged its pushes, so the step is applied everywhere — every
 * member's batch counts as applied, the step advances, and every member of the
 * job (joiners included) gets the next batch, in rank order. A member that goes
 * away (leave, missed heartbeats, its process gone; a connection that closes while
 * the process may live keeps the rank for heartbeat_timeout_ms, at most 15 s, for
 * the same process to come back) is taken out of the open step in a new epoch; its
 * batch is given back and handed out again; the shards learn
 * the epoch from the remaining members (MSG_EPOCH, forwarded by libps), so the
 * step completes without it. When no member is left, the step waits for the
 * next worker.
 * asp / ssp: each request is served from the cursor at once (ssp: not more than
 * `staleness` steps ahead of the slowest member).
 *
 * The persistent part (coord_saved_t) is written by every apply job on shard 0,
 * so a restarted coordinator resumes the open step, its batches and the cursor. */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batches.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "server.h"

#define COORD_MAGIC 0x35445243u /* "CRD5": the stored form below (state_pack) */
#define GAP_RING 4096
#define MAX_LAUNCHERS 32
#define GRANT_TTL_MS 15000
#define CKPT_HOLD_MS 10000 /* a checkpoint's hold of the next step ends by itself after this */
#define POISON_LEFT 3       /* a batch that this many workers left with is named (WARN) */
#define CKPT_USERS_MAX 8    /* asp / ssp: checkpoints sharing one hold at most (a ninth pushes
                               out the oldest, whose GO then hears that its hold lapsed) */

typedef struct {
    uint32_t pid;
    char host[64];
    uint8_t has_batch;
    ps_batch_t batch;
    uint64_t batch_step;      /* bsp: the step of the batch; asp/ssp: the member's step */
    uint64_t steps_done;
    uint64_t progress;        /* samples applied before the batch's step (lr schedule) */
    uint64_t join_serial;     /* orders claims of one rank on the other shards */
} saved_member_t;

typedef struct {
    uint32_t magic;
    uint32_t desired;
    uint64_t epoch;
    uint64_t step;            /* bsp: the open step */
    uint64_t step_members;    /* bsp: members of the open step */
    uint64_t active;          /* ranks in the job */
    uint64_t final_step;
    uint8_t finished;
    uint8_t started;          /* asp / ssp: the first batches went out */
    uint64_t joins;           /* join serials handed out (each new member gets the next) */
    saved_member_t m[PS_MAX_RANKS];
    ps_cursor_t cur;
} coord_saved_t;

/* bsp: what member departures and restarts of this shard leave to settle across steps. It
 * changes only then, so it is saved on its own ("jobrec", COORD_REC_MAGIC), with the next
 * apply job or by coord_save when it changed (rec_changed), not with every step; a restart reads
 * it back (a store without it: zeros, as before it was saved). */
#define COORD_REC_MAGIC 0x33434552u /* "REC3" */
#define COORD_TOLD 4
typedef struct {
    uint32_t magic;
    uint64_t removed_in_step;  /* ranks not handed out again before the next close (they were
                                  members of the open step and left after a batch reply) */
    /* After a restart of this shard that closed the saved open step because its apply had
     * committed here (psd_coord_create): that step, rc_step, may still be unapplied on other
     * shards. rc_pending: its members with a batch, until any report of rc_step or a later
     * step shows it applied everywhere; rc_view: its members still counted as such; rc_batch:
     * their batches. A member removed while pending: restore_closed_lost. */
    uint64_t rc_step, rc_pending, rc_view;
    ps_batch_t rc_batch[PS_MAX_RANKS];
    /* rc_step had gone out again after every member left (emptied_step1): a chunk past it may
     * have dropped a member's push without its batch, which another member's report does not
     * show. The members whose own report (or removal) has not settled their rc_batch yet.
     * Set by psds of session 24 only (a restart now keeps such a step open); still settled
     * when a store they wrote is read. */
    uint64_t rc_unsettled;
    /* Closed views of such steps that went out (restore_closed_lost), and of steps closed
     * with no member (close_deserted_step): until a report of a later step shows every shard
     * past that step, told again with each hand-out and cron tick (tell_closed), since no
     * member may have been there to forward them. */
    struct { uint64_t epoch, step, members; } told[COORD_TOLD];
    uint64_t emptied_step1;    /* the open step + 1 when every member left it (hand_out;
                                  DESIGN-NOTES, Membership, "A step every member left") */
    /* The open step went out again after every member left it (emptied_step1), so chunks that
     * had applied it drop its pushes: it closes once every member reported it (or left), and
     * a member whose report says a push was acknowledged as not applied (PS_FLAG_STALE) has
     * its batch given back tagged (step, rank) instead of counted (close_step). */
    uint64_t again_reported, again_stale;
} coord_rec_t;

/* A write of the state on its own (coord_save), as slot work between store jobs. */
typedef struct {
    psd_slot_work_t slot;
    /* the state written (state_pack), taken on the loop thread when queued */
    _Alignas(uint64_t) uint8_t s[PSD_COORD_STATE_MAX];
    size_t len;
    coord_rec_t rec;          /* and of the recovery state (written with it) */
    uint64_t gen;             /* its number (coord_save_gen) */
    int rc;
} coord_save_t;

/* Earlier forms of the stored state, read and converted (state_from_old), so that a psd
 * upgraded on a running job's data_dir resumes its cursor, steps and what failures left to
 * settle instead of starting the training set and the schedule over: "CRD2", before replay
 * tags (batches without them), and "CRD3" / "REC2", with 4 tag words a batch (PS_REPLAY_MAX
 * before session 50) and the whole re-hand queue in the middle of the cursor. A member's
 * fields before and after its batch sit where they do now (checked below), copied as bytes. */
#define COORD_MAGIC_V2 0x32445243u
#define COORD_MAGIC_V3 0x33445243u
/* "CRD4" (sessions 50-53): coord_saved_t itself up to its queued batches, all 64 members (17.5
 * KB for any job), written with every apply job of shard 0. */
#define COORD_MAGIC_V4 0x34445243u
#define COORD_REC_MAGIC_V2 0x32434552u
typedef struct {
    uint64_t pass, offset;
    uint32_t count;
} batch_v2_t;
typedef struct {
    uint64_t pass, offset;
    uint32_t count, nreplay;
    uint64_t replay[4];
} batch_v3_t;
typedef struct { /* the old cursors' fields before and after their re-hand queue */
    uint64_t n;
    uint32_t batch;
    uint64_t passes, pass, offset;
} cursor_head_t;
typedef struct {
    uint32_t nrehand;
    uint64_t applied[PS_PASS_RING], applied_total, handed_again;
} cursor_tail_t;
typedef struct {
    uint32_t pid;
    char host[64];
    uint8_t has_batch;
    batch_v2_t batch;
    uint64_t batch_step, steps_done, progress, join_serial;
} member_v2_t;
typedef struct {
    uint32_t magic, desired;
    uint64_t epoch, step, step_members, active, final_step;
    uint8_t finished, started;
    uint64_t joins;
    member_v2_t m[PS_MAX_RANKS];
    cursor_head_t cur;
    batch_v2_t rehand[PS_REHAND_MAX];
    cursor_tail_t cur_tail;
} saved_v2_t;
typedef struct {
    uint32_t pid;
    char host[64];
    uint8_t has_batch;
    batch_v3_t batch;
    uint64_t batch_step, steps_done, progress, join_serial;
} member_v3_t;
typedef struct {
    uint32_t magic, desired;
    uint64_t epoch, step, step_members, active, final_step;
    uint8_t finished, started;
    uint64_t joins;
    member_v3_t m[PS_MAX_RANKS];
    cursor_head_t cur;
    batch_v3_t rehand[PS_REHAND_MAX];
    cursor_tail_t cur_tail;
} saved_v3_t;
/* REC2: the recovery state with CRD3's batches. */
typedef struct {
    uint32_t magic;
    uint64_t removed_in_step, rc_step, rc_pending, rc_view;
    batch_v3_t rc_batch[PS_MAX_RANKS];
    uint64_t rc_unsettled;
    struct { uint64_t epoch, step, members; } told[4];
    uint64_t emptied_step1, again_reported, again_stale;
} rec_v2_t;

/* What state_from_old and rec_from_v2 copy as bytes lies where it does in the current form. */
#define SAME_AT(T, U, f) (offsetof(T, f) == offsetof(U, f))
_Static_assert(SAME_AT(saved_member_t, member_v3_t, batch) &&
               SAME_AT(saved_member_t, member_v2_t, batch) &&
               SAME_AT(coord_saved_t, saved_v3_t, m) && SAME_AT(coord_saved_t, saved_v2_t, m) &&
               SAME_AT(coord_rec_t, rec_v2_t, rc_batch) &&
               sizeof(((coord_rec_t *)0)->told) == sizeof(((rec_v2_t *)0)->told),
               "the stored forms' fields around their batches moved");
#undef SAME_AT
_Static_assert(sizeof(coord_saved_t) <= PSD_COORD_STATE_MAX &&
                   sizeof(saved_v3_t) <= PSD_COORD_STATE_MAX &&
                   sizeof(coord_rec_t) <= PSD_COORD_REC_MAX,
               "a stored coordinator state outgrew what psd reads back (server.h)");

/* An old form's batch: CRD2's (@p v2) or CRD3's (@p v3, its tag words kept). */
static ps_batch_t batch_from_old(const batch_v2_t *v2, const batch_v3_t *v3)
{
    if (v2) return (ps_batch_t){.pass = v2->pass, .offset = v2->offset, .count = v2->count};
    ps_batch_t b = {.pass = v3->pass, .offset = v3->offset, .count = v3->count,
                    .nreplay = v3->nreplay < 4 ? v3->nreplay : 4};
    memcpy(b.replay, v3->replay, sizeof v3->replay);
    return b;
}

/* A CRD2 (@p v2) or CRD3 (@p v3) state into @p s. */
static void state_from_old(coord_saved_t *s, const saved_v2_t *v2, const saved_v3_t *v3)
{
    memset(s, 0, sizeof *s);
    memcpy(s, v2 ? (const void *)v2 : (const void *)v3, offsetof(coord_saved_t, m));
    s->magic = COORD_MAGIC;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        saved_member_t *m = &s->m[r];
        memcpy(m, v2 ? (const void *)&v2->m[r] : (const void *)&v3->m[r],
               offsetof(saved_member_t, batch));
        m->batch = batch_from_old(v2 ? &v2->m[r].batch : NULL, v2 ? NULL : &v3->m[r].batch);
        memcpy(&m->batch_step, v2 ? &v2->m[r].batch_step : &v3->m[r].batch_step,
               4 * sizeof(uint64_t));
    }
    const cursor_head_t *h = v2 ? &v2->cur : &v3->cur;
    const cursor_tail_t *t = v2 ? &v2->cur_tail : &v3->cur_tail;
    ps_cursor_t *c = &s->cur;
    *c = (ps_cursor_t){.n = h->n, .batch = h->batch, .passes = h->passes, .pass = h->pass,
                       .offset = h->offset, .applied_total = t->applied_total,
                       .handed_again = t->handed_again,
                       .nrehand = t->nrehand < PS_REHAND_MAX ? t->nrehand : PS_REHAND_MAX};
    memcpy(c->applied, t->applied, sizeof c->applied);
    for (uint32_t i = 0; i < c->nrehand; i++)
        c->rehand[i] = batch_from_old(v2 ? &v2->rehand[i] : NULL, v2 ? NULL : &v3->rehand[i]);
}

/* The stored form ("CRD5", key "job"): coord_saved_t's fields before its members, a uint64_t
 * count nm, the members m[0..nm) (those past it are zeros: ranks that never joined), then the
 * cursor up to its queued batches (the re-hand queue's empty places left out). A job of two
 * workers stores 1176 bytes instead of CRD4's 17 536: shard 0 writes it with every apply job,
 * and the bigger one cost ~1 us of each step there (its copy, and the five LMDB overflow pages
 * its put and commit took; DESIGN-NOTES, Membership, "Persistence"). */
#define STATE_HEAD offsetof(coord_saved_t, m)
#define STATE_CUR_HEAD offsetof(ps_cursor_t, rehand)

/* @p s with members m[0..@p nm) stored, into @p out (PSD_COORD_STATE_MAX bytes). @return its
 * length. */
static size_t state_pack(const coord_saved_t *s, uint32_t nm, void *out)
{
    uint8_t *o = out;
    uint64_t n = nm;
    size_t cur = STATE_CUR_HEAD + s->cur.nrehand * sizeof(ps_batch_t);
    memcpy(o, s, STATE_HEAD);
    memcpy(o + STATE_HEAD, &n, sizeof n);
    memcpy(o + STATE_HEAD + sizeof n, s->m, nm * sizeof *s->m);
    memcpy(o + STATE_HEAD + sizeof n + nm * sizeof *s->m, &s->cur, cur);
    return STATE_HEAD + sizeof n + nm * sizeof *s->m + cur;
}
_Static_assert(offsetof(coord_saved_t, m) + sizeof(uint64_t) +
                       PS_MAX_RANKS * sizeof(saved_member_t) + sizeof(ps_cursor_t) <=
                   PSD_COORD_STATE_MAX,
               "a stored coordinator state outgrew what psd reads back (server.h)");

/* A stored CRD5 state @p in of @p len bytes into @p s (zeroed first). @return false when its
 * lengths and counts do not fit together (@p s then holds nothing to use). */
static bool state_unpack(coord_saved_t *s, const void *in, size_t len)
{
    const uint8_t *b = in;
    uint64_t nm;
    uint32_t queued;
    memset(s, 0, sizeof *s);
    if (len < STATE_HEAD + sizeof nm) return false;
    memcpy(&nm, b + STATE_HEAD, sizeof nm);
    if (nm > PS_MAX_RANKS) return false;
    size_t cur = STATE_HEAD + sizeof nm + nm * sizeof *s->m;
    if (len < cur + STATE_CUR_HEAD) return false;
    memcpy(&queued, b + cur + offsetof(ps_cursor_t, nrehand), sizeof queued);
    if (queued > PS_REHAND_MAX || len != cur + STATE_CUR_HEAD + queued * sizeof(ps_batch_t))
        return false;
    memcpy(s, b, STATE_HEAD);
    memcpy(s->m, b + STATE_HEAD + sizeof nm, nm * sizeof *s->m);
    memcpy(&s->cur, b + cur, len - cur);
    return true;
}

/* 1 + the highest rank a save must keep (0: none): its member is not all zeros, or a bitmap of
 * @p s or @p rec names it (a damaged or hand-made state could name one whose bytes are zeros:
 * what that rank is handed next must not be left out of the save after it). */
static uint32_t members_hi(const coord_saved_t *s, const coord_rec_t *rec)
{
    static const saved_member_t zero;
    uint64_t named = s->active | s->step_members | rec->removed_in_step | rec->rc_pending |
                     rec->rc_view | rec->rc_unsettled;
    uint32_t hi = PS_MAX_RANKS;
    while (hi > 0 && !(named >> (hi - 1) & 1) && memcmp(&s->m[hi - 1], &zero, sizeof zero) == 0)
        hi--;
    return hi;
}

/* A REC2 recovery state @p o into @p rec. */
static void rec_from_v2(coord_rec_t *rec, const rec_v2_t *o)
{
    memset(rec, 0, sizeof *rec);
    memcpy(rec, o, offsetof(coord_rec_t, rc_batch));
    rec->magic = COORD_REC_MAGIC;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        rec->rc_batch[r] = batch_from_old(NULL, &o->rc_batch[r]);
    rec->rc_unsettled = o->rc_unsettled;
    memcpy(rec->told, o->told, sizeof rec->told);
    rec->emptied_step1 = o->emptied_step1;
    rec->again_reported = o->again_reported;
    rec->again_stale = o->again_stale;
}

typedef struct {
    psd_conn_t *conn;         /* NULL while a member is expected back: after a restart of
                                 this shard, or after its connection closed (lost_ms) */
    uint64_t lost_ms;         /* when its connection closed (0: it did not) */
    int parked;               /* a batch request waits for an answer */
    uint64_t park_req;
    uint64_t joined_ms, last_done_ms;
    uint64_t late_from_ms;    /* its step_timeout_ms deadline runs from here at the earliest:
                                 it became a member of the open step (bsp), its connection
                                 came back, or its batch request was answered (late_members,
                                 late_slowest) */
    uint64_t steps_at_join;   /* its steps_done when joined_ms was set (an ssp joiner's clock,
                                 a member restored by a restart of this shard): steps_per_s
                                 counts only the steps since */
    uint64_t batch_gen;       /* asp / ssp: the state save that holds its batch's hand-out
                                 (coord_save_gen): answered once that one is committed */
    uint64_t end_gen;         /* asp / ssp: the same for an answer that ends its run (0: none
                                 pending; end_committed) */
    uint64_t tensor_set;      /* bsp: the digest of the tensors it declared, as its first batch
                                 request said (0: none said yet); tensor_count: how many */
    uint64_t tensor_count;
    bool no_batch_yet;        /* no batch reply has gone to it since it joined (it has not
                                 asked): it cannot have pushed a step (libps pushes a batch's).
                                 False after a restart of this shard (not known). */
    bool batch_seen;          /* its batch's reply went out (bsp hands a member its next batch
                                 as the step opens, before it asks): ps_batch_t.left counts it.
                                 True after a restart of this shard for a member with a batch */
    uint32_t launcher;        /* the pid of the pslaunch that started it on its host, as its
                                 hello said (0: none, or an older libps; grants_seen) */
} member_rt_t;

typedef struct {
    char host[64];
    uint32_t pid;
    uint32_t running;
    uint32_t poll_ms; /* how often it reports (0: an older pslaunch) */
    uint64_t last_ms;
} launcher_t;

struct psd_coord_s {
    coord_saved_t s;
    uint32_t m_hi;             /* the members a save keeps: s.m[m_hi..] are zeros, of ranks
                                  that never joined (members_hi, and each join) */
    member_rt_t rt[PS_MAX_RANKS];
    uint64_t started_ms;       /* this process's start: members of a restored state must
                                  come back within heartbeat_timeout_ms */
    uint64_t waiting_since_ms; /* bsp: members wait for a step with no members (0: none) */
    uint64_t gaps[GAP_RING];   /* close-to-close times in ms */
    uint64_t ngaps, last_close_ms;
    uint64_t deserted;         /* bsp: steps closed with no member (close_deserted_step) */
    uint64_t suspect;          /* batches POISON_LEFT workers in turn left with, since start */
    bool told_unlearnt;        /* bsp, after a restart: rec.told not learnt here yet (tick) */
    struct { uint64_t ms, step; } top[16]; /* the longest gaps and the step that took them */
    launcher_t launchers[MAX_LAUNCHERS];
    int32_t grant_start, grant_stop; /* launches granted and not seen yet */
    uint64_t grant_ms;
    uint64_t hold_step;        /* psctl checkpoint: steps >= this are not handed out ... */
    uint64_t hold_ms;          /* ... since this loop time (0: no hold) */
    bool held;                 /* a hand-out waits for the hold to end */
    bool hold_ahead;           /* a hold at a step not reached yet (psctl checkpoint --follow):
                                  hold_ms is set when the job gets there */
    uint64_t ahead_after;      /* bsp: a hold ahead asked for while a checkpoint held an earlier
                                  step, held ahead once that hold ends (0: none) */
    struct {
        uint64_t id, ms;
        const psd_conn_t *conn;
    } hold_user[CKPT_USERS_MAX]; /* the checkpoints told to arm under the hold (bsp: a BEGIN;
                                  asp / ssp: a drained answer) whose MSG_CKPT_GO has not come
                                  yet, by psctl's id, with the loop time and the connection of
                                  their last ask (each goes CKPT_HOLD_MS after it, or when that
                                  connection closes: psd_coord_drop_conn) */
    uint32_t hold_users;
    const psd_conn_t *hold_asker; /* the connection of the last ask that holds without being a
                                  user (asp / ssp: batches still in flight; bsp: a hold ahead
                                  until its step's BEGIN), or NULL */
    const psd_conn_t *ahead_asker; /* the connection that asked for ahead_after, or NULL */
    char set_by[96];           /* who named the training set's size (cur.n) since this psd
                                  started: "rank R (pid P on HOST)"; "" when it came stored */
    bool capped;               /* asp / ssp: a member did its job.max_steps: pslaunch gets no
                                  more starts (a replacement would do max_steps more), so the
                                  job ends with the members it has */
    coord_save_t save;         /* coord_save's slot work */
    bool save_busy, save_again;
    uint64_t save_gen;         /* saves queued so far (the copy of the last: save.gen) */
    uint64_t saved_gen;        /* the last save that committed (a later save holds all an
                                  earlier one did: it copies the whole state) */
    bool save_retry;           /* a save failed: psd_coord_tick saves again */
    uint32_t save_failures;    /* saves failed in a row (0 after one commits) */
    uint64_t save_failures_total; /* saves failed since this psd started */
    uint64_t crash_gen;        /* PS_TEST_CRASH_*_SAVE: the save that kills this psd ... */
    const char *crash_hook;    /* ... and the hook's name, for the log */
    uint64_t fail_gen;         /* PS_TEST_FAIL_HANDOUT_SAVE: the save that fails (0: none) */
    uint64_t handout_gen;      /* bsp: the save that holds the last change a restart could not
                                  re-derive (the close of a step handed out again, a change of
                                  the step's members, a batch given back; coord_save_gen; 0:
                                  none): batches and the end are answered once it is committed
                                  (serve_parked; a failed save is retried: save_done) */
    bool creating;             /* psd_coord_create saves once at its end, itself */
    coord_rec_t rec;           /* bsp: what failures leave to settle (saved as "jobrec") */
    bool rec_dirty;            /* rec changed since a save took its copy (rec_changed) */
};

static bool is_bsp(const psd_server_t *srv) { return srv->m.job.consistency == PS_CONSIST_BSP; }

/* ---- saving the state on its own --------------------------------------------------- */

/* Every apply job commits the state with its updates. Changes that come without one (a new
 * epoch, psctl scale, the epoch bump of a restart) are committed on their own, so that a
 * restart of this shard does not take them back: a desired count would return to its old
 * value, and an epoch number handed out since would be handed out again with other members
 * (libps and the shards ignore an epoch no newer than one they know). The write is slot work:
 * the loop thread never waits for the store's one writer. A slot runs only between store
 * jobs, and a job copies the state when it starts, so the stored state never goes back. */
/* The recovery state changed: the next apply job (psd_coord_rec) or coord_save writes it. */
static void rec_changed(psd_coord_t *co) { co->rec_dirty = true; }

static int save_now(psd_store_t *st, const void *s, size_t len, const coord_rec_t *rec)
{
    psd_wtxn_t tx;
    int rc = psd_store_begin(st, &tx);
    if (rc) return rc;
    rc = psd_store_put_blob(&tx, "job", s, len);
    if (rc == 0) rc = psd_store_put_blob(&tx, "jobrec", rec, sizeof *rec);
    if (rc) {
        psd_store_abort(&tx);
        return rc;
    }
    return psd_store_commit(&tx);
}

static void save_run(psd_slot_work_t *w)
{
    coord_save_t *sv = (coord_save_t *)w;
    /* The test hooks' numbers are set by the loop thread for a later save while this one runs
     * (atomics: ThreadSanitizer, session 51). */
    psd_coord_t *co = w->srv->coord;
    if (__atomic_load_n(&co->crash_gen, __ATOMIC_ACQUIRE) == sv->gen) { /* a test hook */
        usleep(200 * 1000); /* whatever the loop sends meanwhile leaves */
        PS_LOG(PS_LOG_WARN, "coord", "killed in a save of the coordinator's state (%s)",
               __atomic_load_n(&co->crash_hook, __ATOMIC_RELAXED));
        raise(SIGKILL);
    }
    if (__atomic_load_n(&co->fail_gen, __ATOMIC_RELAXED) == sv->gen) {
        /* a test hook: as if the store refused it */
        PS_LOG(PS_LOG_WARN, "coord", "the save of a hand-out fails (PS_TEST_FAIL_HANDOUT_SAVE)");
        sv->rc = PS_ESTORE;
        return;
    }
    sv->rc = save_now(&w->srv->store, sv->s, sv->len, &sv->rec);
}

static void coord_save(psd_server_t *srv);

static void serve_parked(psd_server_t *srv);

/* A test hook (PS_TEST_CRASH_*_SAVE): the next save queued (now, or after the busy one) kills
 * this psd in save_run, logging @p hook. */
static void crash_in_next_save(psd_coord_t *co, const char *hook)
{
    __atomic_store_n(&co->crash_hook, hook, __ATOMIC_RELAXED);
    __atomic_store_n(&co->crash_gen, co->save_gen + 1, __ATOMIC_RELEASE); /* after the name */
}

/* A test hook (PS_TEST_FAIL_HANDOUT_SAVE): the next save queued fails in save_run, as if the
 * store refused it. Named before the save is queued: a pool thread may run it at once. */
static void fail_next_save(psd_coord_t *co)
{
    __atomic_store_n(&co->fail_gen, co->save_gen + 1, __ATOMIC_RELAXED);
}

static void save_done(psd_slot_work_t *w)
{
    psd_server_t *srv = w->srv;
    psd_coord_t *co = srv->coord;
    co->save_busy = false;
    if (co->save.rc) {
        /* Not committed: what waits for this save (hand-outs, the end, a step's batches) keeps
         * waiting, and psd_coord_tick saves again. Answered before a committed state held
         * them, a restart would hand out the same samples again, or count a batch a chunk
         * never had: a store that commits nothing holds the job instead (pushes cannot commit
         * either then). */
        co->save_failures_total++;
        if (co->save_failures++ % 16 == 0)
            PS_LOG(PS_LOG_ERROR, "coord", "cannot save the coordinator's state: %s (%u time%s in "
                   "a row); batches wait until a save commits, tried again at every cron tick",
                   ps_strerror(co->save.rc), co->save_failures, co->save_failures > 1 ? "s" : "");
        co->rec_dirty = true;
        co->save_retry = true;
        co->save_again = false; /* the retry copies the whole state, this change with it */
        return;
    }
    if (co->save_failures) {
        PS_LOG(PS_LOG_INFO, "coord", "the coordinator's state is saved again (after %u failed "
               "save%s)", co->save_failures, co->save_failures > 1 ? "s" : "");
        co->save_failures = 0;
    }
    co->saved_gen = co->save.gen;
    if (co->save_again) {
        co->save_again = false;
        coord_save(srv);
    }
    serve_parked(srv); /* the hand-outs this save holds */
}

static void coord_save(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    if (co->creating) return;
    if (co->save_busy) { /* its copy is taken: this change goes in the next write */
        co->save_again = true;
        return;
    }
    co->save_busy = true;
    co->save_retry = false;
    co->save.len = state_pack(&co->s, co->m_hi, co->save.s); /* what save_now writes */
    co->save.rec = co->rec;
    co->rec_dirty = false;
    co->save.gen = ++co->save_gen;
    co->save.slot.srv = srv;
    co->save.slot.run = save_run;
    co->save.slot.done = save_done;
    psd_shard_slot_queue(srv, &co->save.slot);
}

/* Save the state with a change just made; returns the number of the save that holds it (0: none
 * needed, while psd_coord_create runs: it saves at its end, before any answer). */
static uint64_t coord_save_gen(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    if (co->creating) return 0;
    bool busy = co->save_busy; /* then the change goes into the next save */
    coord_save(srv);
    return busy ? co->save_gen + 1 : co->save_gen;
}

/* bsp: a change a restart could not re-derive from the chunks and the last committed state (a
 * step's members, a batch given back to the cursor): save it, and answer batches (and the end)
 * only once that save is committed (handout_gen, serve_parked). */
static void hold_handouts(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint64_t gen = coord_save_gen(srv);
    if (gen > co->handout_gen) co->handout_gen = gen;
}

/* How long a member whose connection closed keeps its rank (psd_coord_on_gone): the heartbeat
 * timeout, but no longer than launch grants live, so scaling never counts a member that is
 * away past its grants. */
static uint64_t grace_ms(const psd_server_t *srv)
{
    uint64_t hb = srv->m.job.heartbeat_timeout_ms;
    return hb < GRANT_TTL_MS ? hb : GRANT_TTL_MS;
}
static uint32_t popcount(uint64_t x) { return (uint32_t)__builtin_popcountll(x); }

/* Now on the loop's clock, never 0 (hold_ms 0 means no hold). */
static uint64_t hold_now(const psd_server_t *srv)
{
    uint64_t now = uv_now(srv->loop);
    return now ? now : 1;
}

/* A peer's host name as psd keeps it: what a host name or address may hold ([A-Za-z0-9.:_-],
 * brackets) and '?' for anything else, so that a hostile hello cannot write JSON (status) or
 * control bytes (logs, psctl) through it. */
static void host_safe(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 1 < cap; s++) {
        char ch = *s;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  strchr(".:_-[]", ch) != NULL;
        out[n++] = ok ? ch : '?';
    }
    out[n] = '\0';
}

/* ---- replies ----------------------------------------------------------------- */

static void reply_batch(psd_server_t *srv, uint32_t r)
{
    psd_coord_t *co = srv->coord;
    member_rt_t *rt = &co->rt[r];
    saved_member_t *m = &co->s.m[r];
    rt->parked = 0;
    rt->end_gen = 0;
    if (rt->conn == NULL) return;
    rt->late_from_ms = uv_now(srv->loop); /* it could not go on before: step_timeout_ms */
    ps_msg_t a = {.type = PS_MSG_BATCH_REPLY, .req_id = rt->park_req, .shard = 0, .rank = (int32_t)r,
                  .epoch = co->s.epoch, .workers = popcount(co->s.active)};
    if (!m->has_batch) {
        a.flags = PS_FLAG_FINISHED;
        a.step = is_bsp(srv) ? co->s.final_step : m->steps_done;
    } else {
        a.step = m->batch_step;
        a.members = is_bsp(srv) ? co->s.step_members : 1ull << r;
        a.data_epoch = m->batch.pass;
        a.batch_offset = m->batch.offset;
        a.batch_count = m->batch.count;
        a.samples = m->progress;
        a.nreplay = m->batch.nreplay; /* handed out before: where it may be applied already */
        if (!is_bsp(srv)) a.flags = PS_FLAG_BATCH; /* pushes carry the batch (push.c) */
        if (srv->test_crash_after_batch && --srv->test_crash_after_batch == 0)
            srv->test_crash_armed = true; /* psd_shard_on_push */
        memcpy(a.replay, m->batch.replay, sizeof a.replay);
        rt->no_batch_yet = false;
        rt->batch_seen = true;
    }
    psd_send_msg(srv, rt->conn, &a);
}

/* Tell every member view (@p epoch, @p step, @p members; @p flags: PS_FLAG_CLOSED for a closed
 * step's); libps forwards it to the other shards. */
static void send_view(psd_server_t *srv, uint64_t epoch, uint64_t step, uint64_t members,
                      uint32_t flags)
{
    psd_coord_t *co = srv->coord;
    ps_msg_t e = {.type = PS_MSG_EPOCH, .epoch = epoch, .step = step, .members = members,
                  .shard = 0, .flags = flags};
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        if ((co->s.active >> r & 1) && co->rt[r].conn) psd_send_msg(srv, co->rt[r].conn, &e);
}

/* Tell every member the open step's members changed. */
static void broadcast_epoch(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    send_view(srv, co->s.epoch, co->s.step, co->s.step_members, 0);
}

/* Tell the members again the closed views a shard may still wait for (rec.told). */
static void tell_closed(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    for (int i = 0; i < COORD_TOLD; i++)
        if (co->rec.told[i].epoch)
            send_view(srv, co->rec.told[i].epoch, co->rec.told[i].step, co->rec.told[i].members,
                      PS_FLAG_CLOSED);
}

/* Tag batch @p b with @p tag (ps_batch_tag), saying so when that drops its oldest tag. */
static void batch_tag(ps_batch_t *b, uint64_t tag)
{
    if (ps_batch_tag(b, tag))
        PS_LOG(PS_LOG_WARN, "coord", "batch of pass %llu at %llu left mid-step at more steps "
               "than its replay tags hold: its oldest replay tag dropped (a chunk that applied "
               "it then applies it again)", (unsigned long long)b->pass,
               (unsigned long long)b->offset);
}

/* Batch @p b was not applied on every chunk: give it back tagged @p tag (the step and rank
 * that had it; uncounted first if @p counted), so that a chunk that applied that step with that
 * rank's push does not apply it again (replay_had in push.c) and the others do. */
static void regive(psd_server_t *srv, ps_batch_t b, uint64_t tag, bool counted)
{
    psd_coord_t *co = srv->coord;
    if (counted) ps_cursor_unapplied(&co->s.cur, &b);
    batch_tag(&b, tag);
    if (ps_cursor_give_back(&co->s.cur, &b))
        PS_LOG(PS_LOG_ERROR, "coord", "re-hand queue full: batch of pass %llu at %llu lost",
               (unsigned long long)b.pass, (unsigned long long)b.offset);
    hold_handouts(srv); /* the next hand-out may take it, even with the same members */
    /* A close that counted it may have ended the job (no batch left): this one is left now. */
    uint64_t max = srv->m.job.max_steps;
    if (counted && co->s.finished && !(max && co->s.step >= max)) {
        co->s.finished = 0;
        PS_LOG(PS_LOG_INFO, "coord", "the job goes on for that batch");
    }
}

/* A closed view of step @p step with @p members (PS_FLAG_CLOSED: it covers that step only),
 * told to the members, who forward it to the other shards, and kept in rec.told (told again
 * with every hand-out and cron tick, tell_closed) until a report of a later step shows every
 * shard past it. The epoch after it is the open step's: no ordinary view may carry the closed
 * one's number (batch and hello replies hand out the current epoch). @return its epoch. */
static uint64_t close_view(psd_server_t *srv, uint64_t step, uint64_t members)
{
    psd_coord_t *co = srv->coord;
    rec_changed(co);
    uint64_t epoch = ++co->s.epoch;
    PS_LOG(PS_LOG_INFO, "coord", "epoch %llu: closed step %llu has %u members (%#llx)",
           (unsigned long long)epoch, (unsigned long long)step, popcount(members),
           (unsigned long long)members);
    int slot = 0;
    for (int i = 0; i < COORD_TOLD; i++) {
        if (co->rec.told[i].step == step && co->rec.told[i].epoch) {
            slot = i;
            break;
        }
        if (co->rec.told[i].epoch < co->rec.told[slot].epoch) slot = i; /* free or oldest */
    }
    co->rec.told[slot].epoch = epoch;
    co->rec.told[slot].step = step;
    co->rec.told[slot].members = members;
    send_view(srv, epoch, step, members, PS_FLAG_CLOSED);
    co->s.epoch++;
    return epoch;
}

/* Rank @p r (removed: no longer active) was a member of rc_step, which this shard's restart
 * closed, and no report showed its batch of that step applied everywhere: another shard may
 * wait for its push of that step for good. That step goes on without it there (a view of it
 * without r; a shard past it ignores it), and its batch, counted at the restart, is uncounted
 * and handed to another worker tagged with (rc_step, r): a chunk that applied the step with
 * r's push does not apply it again (replay_had), one that applied it without does. The view
 * is a closed one (PS_FLAG_CLOSED), for that step only: it never stands for a later step. */
static void restore_closed_lost(psd_server_t *srv, uint32_t r)
{
    psd_coord_t *co = srv->coord;
    rec_changed(co);
    co->rec.rc_pending &= ~(1ull << r);
    co->rec.rc_view &= ~(1ull << r);
    regive(srv, co->rec.rc_batch[r], PS_REPLAY_TAG(co->rec.rc_step, r), true);
    PS_LOG(PS_LOG_WARN, "coord", "rank %u left before any report showed step %llu applied "
           "everywhere (this shard closed it when it started again): the step goes on without "
           "it where it waits, and its batch goes to another worker", r,
           (unsigned long long)co->rec.rc_step);
    /* Not learnt here, where every chunk is past that step. */
    close_view(srv, co->rec.rc_step, co->rec.rc_view);
    coord_save(srv);
    psd_shard_learn_view(srv, co->s.epoch, co->s.step, co->s.step_members, false);
    broadcast_epoch(srv);
}

/* ---- bsp steps ------------------------------------------------------------------ */

static bool can_start(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint32_t n = popcount(co->s.active);
    if (n == 0) return false;
    if (n >= co->s.desired) return true;
    /* Fewer than desired: start after a grace period rather than wait forever. */
    uint32_t grace = srv->m.job.start_wait_ms ? srv->m.job.start_wait_ms
                                              : srv->m.job.heartbeat_timeout_ms;
    return co->waiting_since_ms && uv_now(srv->loop) - co->waiting_since_ms >= grace;
}

static void set_members(psd_server_t *srv, uint64_t members)
{
    psd_coord_t *co = srv->coord;
    if (members != co->s.step_members || co->s.epoch == 0) {
        if ((members & ~co->s.step_members) && srv->test_crash_join_save &&
            srv->test_crash_join_save-- == 1)
            crash_in_next_save(co, "PS_TEST_CRASH_JOIN_SAVE"); /* hold_handouts' save below */
        uint64_t now = uv_now(srv->loop);
        for (uint32_t r = 0; r < PS_MAX_RANKS; r++) /* new members' deadlines start now */
            if ((members & ~co->s.step_members) >> r & 1) co->rt[r].late_from_ms = now;
        co->s.epoch++;
        co->s.step_members = members;
        PS_LOG(PS_LOG_INFO, "coord", "epoch %llu: step %llu has %u members (%#llx)",
               (unsigned long long)co->s.epoch, (unsigned long long)co->s.step, popcount(members),
               (unsigned long long)members);
        /* The batches of a step whose members changed (a hand-out, or a removal mid-step) are
         * answered once a committed state holds them. A restart re-derives an unchanged step's
         * hand-out from its chunks and its saved members, in rank order from the saved cursor,
         * but not a changed one: a join it never saw (the join writes nothing) lost its batch
         * to another member, after a shard had applied it with the joiner's push. */
        hold_handouts(srv);
    }
    psd_shard_learn_view(srv, co->s.epoch, co->s.step, members, false);
}

static void serve_parked(psd_server_t *srv);

/* Hand every member of the job a batch of the open step, in rank order. */
static void hand_out(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    if ((co->hold_ms || co->hold_ahead) && co->s.step >= co->hold_step) {
        co->held = true; /* every shard must know the checkpoint's step first */
        if (co->hold_ahead) { /* the 10 s limit runs from here */
            co->hold_ahead = false;
            co->hold_ms = hold_now(srv);
            PS_LOG(PS_LOG_INFO, "coord", "step %llu reached: held for its checkpoint",
                   (unsigned long long)co->s.step);
        }
        return;
    }
    uint64_t members = 0;
    uint64_t max = srv->m.job.max_steps;
    for (uint32_t r = 0; r < PS_MAX_RANKS && !(max && co->s.step >= max); r++) {
        saved_member_t *m = &co->s.m[r];
        if (!(co->s.active >> r & 1) || (co->rec.removed_in_step >> r & 1)) continue;
        if (!m->has_batch) {
            if (!ps_cursor_take(&co->s.cur, &m->batch)) break;
            co->rt[r].batch_seen = false;
        }
        if (!(co->s.step_members >> r & 1) && m->steps_done == 0)
            PS_LOG(PS_LOG_INFO, "coord", "rank %u takes part from step %llu", r,
                   (unsigned long long)co->s.step);
        m->has_batch = 1;
        m->batch_step = co->s.step;
        m->progress = co->s.cur.applied_total;
        members |= 1ull << r;
    }
    /* Every batch counted is not yet every batch applied: one that a restart of this shard
     * counted with its step (rc_pending, rc_unsettled) goes out again if a shard turns out to
     * lack it, so the job waits for those reports (or removals) before it is complete; a worker
     * that asks meanwhile waits, rather than hear of an end that is taken back. */
    bool unsettled = is_bsp(srv) && (co->rec.rc_pending || co->rec.rc_unsettled);
    if (members == 0 && !co->s.finished &&
        ((ps_cursor_exhausted(&co->s.cur) && !unsettled) || (max && co->s.step >= max))) {
        co->s.finished = 1;
        co->s.final_step = co->s.step;
        memset(co->rec.told, 0, sizeof co->rec.told); /* no step is reported any more */
        rec_changed(co);
        PS_LOG(PS_LOG_INFO, "coord", "job complete at step %llu: %llu samples applied",
               (unsigned long long)co->s.step, (unsigned long long)co->s.cur.applied_total);
    }
    if (members) tell_closed(srv); /* before the batches, which lead to pushes */
    set_members(srv, members);
    co->waiting_since_ms = 0;
    serve_parked(srv);
}

/* The open step is applied everywhere: count its batches, advance, hand out the next. */
static void close_step(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    bool again = co->rec.emptied_step1 == co->s.step + 1; /* chunks may have passed it before */
    if (again || co->rec.removed_in_step || co->rec.emptied_step1) rec_changed(co);
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        saved_member_t *m = &co->s.m[r];
        /* A member that reported a step handed out again keeps its batch in m->batch with
         * has_batch cleared (so that it is not handed the same batch again meanwhile). */
        bool reported = again && (co->rec.again_reported >> r & 1);
        if (!(co->s.step_members >> r & 1) ||
            (!reported && (!m->has_batch || m->batch_step != co->s.step)))
            continue;
        if (reported && (co->rec.again_stale >> r & 1)) {
            /* A chunk that had passed the step dropped its push without having its batch. */
            regive(srv, m->batch, PS_REPLAY_TAG(co->s.step, r), false);
            PS_LOG(PS_LOG_INFO, "coord", "rank %u's batch of step %llu (pass %llu at %llu), a "
                   "step handed out again after its members left: a shard had passed the step "
                   "without it; it goes to another worker", r, (unsigned long long)co->s.step,
                   (unsigned long long)m->batch.pass, (unsigned long long)m->batch.offset);
        } else {
            ps_cursor_applied(&co->s.cur, &m->batch);
        }
        m->has_batch = 0;
        m->steps_done++;
        co->rt[r].last_done_ms = uv_now(srv->loop);
    }
    co->s.step++;
    co->rec.removed_in_step = 0;
    co->rec.emptied_step1 = 0;
    co->rec.again_reported = co->rec.again_stale = 0;
    uint64_t now = uv_now(srv->loop);
    if (co->last_close_ms) {
        uint64_t g = now - co->last_close_ms;
        co->gaps[co->ngaps++ % GAP_RING] = g;
        int low = 0; /* replace the smallest of the top gaps */
        for (int i = 1; i < 16; i++)
            if (co->top[i].ms < co->top[low].ms) low = i;
        if (g > co->top[low].ms) {
            co->top[low].ms = g;
            co->top[low].step = co->s.step - 1; /* the step that took this long */
        }
    }
    co->last_close_ms = now;
    if (!again) {
        hand_out(srv);
        return;
    }
    /* The close of a step handed out again follows its members' reports, not an apply on this
     * shard: a restart could not derive it from this shard's chunks, so the next step's batches
     * are answered only once a committed state holds the close and the hand-out. Before that,
     * a restart saw the step open, and a member handed the next step's batch with its report
     * of this one lost made the two states differ: batches went uncounted or twice. */
    co->handout_gen = UINT64_MAX; /* hand_out's serve_parked answers nothing yet */
    hand_out(srv);
    co->handout_gen = coord_save_gen(srv);
    serve_parked(srv); /* answers now only when no save was needed (psd_coord_create) */
}

/* bsp: open step s has no member (every member left it) and the ranks of those who left are
 * held until it closes (removed_in_step), so that no joiner's push of s is taken for theirs:
 * when they are all the ranks a joiner could get (64 deaths in one step after their batch
 * replies, such as workers killed over and over while they compute), s closes with no member
 * instead. A chunk still at s passes it as it is (a closed view with none, as
 * restore_closed_lost's: one update fewer there); a chunk that applied s with a push of a
 * member that then left keeps it, and that member's batch, given back tagged (s, rank), is
 * not applied there again. Before, no worker could join again, also after a restart (the held
 * ranks are saved). @return whether it closed s. */
static bool close_deserted_step(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint64_t s = co->s.step, left = co->rec.removed_in_step & ~co->s.active;
    /* Not under a checkpoint's hold of this step (it ends within CKPT_HOLD_MS); one asked for
     * a later step (psd's follower asks for its next one all the time) is held as before. */
    if (!is_bsp(srv) || co->s.finished || co->s.step_members != 0 || left == 0 ||
        co->hold_ms || (co->hold_ahead && co->hold_step <= s))
        return false;
    PS_LOG(PS_LOG_WARN, "coord", "step %llu: every member left it, and the %u ranks they held "
           "until it closes are all a worker could join with: it closes with no member (its "
           "chunks not past it pass it without an update; the batches of those who left go to "
           "other workers)", (unsigned long long)s, popcount(left));
    uint64_t epoch = close_view(srv, s, 0);
    psd_shard_learn_view(srv, epoch, s, 0, true); /* this shard's chunks at s pass it */
    co->deserted++;
    close_step(srv); /* frees the ranks (removed_in_step); its hand-out waits for its save */
    coord_save(srv);
    return true;
}

/* A step with no members left: hand it out again once workers are there. */
static void maybe_restart_step(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    if (!is_bsp(srv) || co->s.step_members != 0 || co->s.finished) return;
    if (popcount(co->s.active) > 0 && co->waiting_since_ms == 0)
        co->waiting_since_ms = uv_now(srv->loop);
    /* Nothing left to hand out: the end needs no worker (the last report that settled a batch
     * a restart counted may come with a leave). */
    bool done = ps_cursor_exhausted(&co->s.cur) && !co->rec.rc_pending && !co->rec.rc_unsettled;
    if (!can_start(srv) && !done) return;
    /* removed_in_step stays: slots may still hold pushes of the ranks that left this step. */
    hand_out(srv);
}

/* ---- asp / ssp ------------------------------------------------------------------- */

static uint64_t slowest(const psd_coord_t *co)
{
    uint64_t low = UINT64_MAX;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        if ((co->s.active >> r & 1) && co->s.m[r].steps_done < low) low = co->s.m[r].steps_done;
    return low == UINT64_MAX ? 0 : low;
}

/* asp / ssp: the batches handed out and not yet reported (their pushes may be part-way). */
static uint32_t in_flight(const psd_coord_t *co)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        n += (co->s.active >> r & 1) && co->s.m[r].has_batch;
    return n;
}

/* asp / ssp with job.max_steps (a cap on each worker's steps): once every member has done its
 * steps, the job is complete, so that pslaunch --follow stops starting workers and status says
 * so. A worker that joins later is told the job is finished. */
static void async_maybe_finished(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint64_t max = srv->m.job.max_steps;
    if (is_bsp(srv) || max == 0 || co->s.finished) return;
    if (co->s.active == 0) {
        /* No member left, and since one did its steps no start is granted (capped): nobody
         * would ever come, so the job is over. Before, it waited for good with no worker. */
        if (!co->capped) return; /* none joined yet, or pslaunch replaces one that died */
        co->s.finished = 1;
        PS_LOG(PS_LOG_INFO, "coord", "job complete: every worker did its %llu steps or left "
               "(%llu samples applied)", (unsigned long long)max,
               (unsigned long long)co->s.cur.applied_total);
        coord_save(srv);
        return;
    }
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        if ((co->s.active >> r & 1) && (co->s.m[r].steps_done < max || co->s.m[r].has_batch))
            return;
    co->s.finished = 1;
    PS_LOG(PS_LOG_INFO, "coord", "job complete: every worker did its %llu steps (%llu samples "
           "applied)", (unsigned long long)max, (unsigned long long)co->s.cur.applied_total);
}

/* asp / ssp: whether an answer that ends member @p r's run (the job is complete, or it did its
 * job.max_steps) may go: once a committed state holds what it follows from (the last reports,
 * the end), as a hand-out waits for one. Before (a probe, session 47), shard 0 answered at
 * once; killed before its next save, it came back without the last reports, with every worker
 * gone, and the job stayed unfinished for good. The first call queues the save. */
static bool end_committed(psd_server_t *srv, uint32_t r)
{
    psd_coord_t *co = srv->coord;
    member_rt_t *rt = &co->rt[r];
    if (rt->end_gen == 0) {
        rt->end_gen = UINT64_MAX; /* a save_done run inside coord_save must not answer */
        if (srv->test_crash_finish_save && srv->test_crash_finish_save-- == 1)
            crash_in_next_save(co, "PS_TEST_CRASH_FINISH_SAVE"); /* the save queued here */
        rt->end_gen = coord_save_gen(srv);
        if (rt->end_gen == 0) return true; /* psd_coord_create saves before any answer */
    }
    return rt->end_gen <= co->saved_gen;
}

static void serve_async(psd_server_t *srv, uint32_t r)
{
    psd_coord_t *co = srv->coord;
    saved_member_t *m = &co->s.m[r];
    if (!co->s.started) {
        /* As under bsp, the job starts with job.workers workers (or, with fewer, after one
         * heartbeat timeout), so the first worker does not run away with the first batches. */
        if (co->waiting_since_ms == 0) co->waiting_since_ms = uv_now(srv->loop);
        if (!can_start(srv)) return;
        co->s.started = 1;
        co->waiting_since_ms = 0;
    }
    if (!m->has_batch) {
        uint64_t max = srv->m.job.max_steps, total = co->s.cur.applied_total;
        if (max && m->steps_done >= max) {
            co->capped = true;
            async_maybe_finished(srv);
            if (end_committed(srv, r)) /* else save_done answers */
                reply_batch(srv, r);   /* asp / ssp: job.max_steps caps each worker's steps */
            return;
        }
        if (max && co->s.finished) {
            if (end_committed(srv, r)) /* joined after every member did its steps */
                reply_batch(srv, r);
            return;
        }
        if (srv->m.job.consistency == PS_CONSIST_SSP &&
            m->steps_done > slowest(co) + srv->m.job.staleness)
            return; /* too far ahead: wait for the slowest */
        if (co->hold_ms) return; /* a checkpoint drains the batches in flight (hold_async) */
        if (!ps_cursor_take(&co->s.cur, &m->batch)) {
            if (in_flight(co) > 0) return; /* may be handed out again */
            if (!co->s.finished) {
                co->s.finished = 1;
                PS_LOG(PS_LOG_INFO, "coord", "job complete: %llu samples applied",
                       (unsigned long long)total);
            }
            if (end_committed(srv, r)) reply_batch(srv, r); /* finished */
            return;
        }
        co->rt[r].batch_seen = false;
        m->has_batch = 1;
        m->batch_step = m->steps_done;
        m->progress = co->s.cur.applied_total;
        /* Answered once a committed state holds the hand-out: a restart of this shard before
         * that would hand the same samples out again (and its worker the batch before), and
         * they would be applied twice. Apply jobs copy the state when they start, so this
         * save. */
        co->rt[r].batch_gen = UINT64_MAX; /* a save_done run inside coord_save must not answer */
        if (srv->test_fail_handout_save && srv->test_fail_handout_save-- == 1)
            fail_next_save(co); /* the save coord_save_gen queues */
        co->rt[r].batch_gen = coord_save_gen(srv);
    }
    if (co->rt[r].batch_gen > co->saved_gen) return; /* save_done answers */
    reply_batch(srv, r);
}

/* ---- requests ----------------------------------------------------------------------- */

static void serve_parked(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        member_rt_t *rt = &co->rt[r];
        if (!rt->parked || !(co->s.active >> r & 1)) continue;
        if (!is_bsp(srv)) {
            serve_async(srv, r);
        } else if (co->handout_gen <= co->saved_gen &&
                   ((co->s.m[r].has_batch && co->s.m[r].batch_step == co->s.step) ||
                    co->s.finished)) {
            reply_batch(srv, r);
        }
    }
}

static int member_of(psd_server_t *srv, psd_conn_t *c)
{
    psd_coord_t *co = srv->coord;
    int r = c->rank;
    if (r < 0 || r >= PS_MAX_RANKS || !(co->s.active >> r & 1) || co->rt[r].conn != c) return -1;
    return r;
}

void psd_coord_on_hello(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    int32_t rank = -1;
    if (c->rank >= 0 && (co->s.active >> c->rank & 1) && co->rt[c->rank].conn == c) {
        rank = c->rank; /* a second hello on the same connection */
    } else if (msg->rank >= 0) {
        /* A worker whose connection to this shard broke (or that this shard lost in a
         * restart) asks for its rank back: only the same process gets it, known by its pid and
         * the join serial its hello reply gave it (libps sends it in every hello after). The
         * pid alone named another process: in containers every worker may be pid 1, and a
         * worker dropped past the grace period took back the rank of the one that joined as
         * it with the same pid, when its network healed (a helper's probe, session 59: any
         * peer that read a pid in psctl status took a member's rank and made it leave). The
         * serial is a counter: against a hostile peer, only a secret_file holds. */
        int32_t r = msg->rank;
        if (r >= PS_MAX_RANKS || !(co->s.active >> r & 1) || co->s.m[r].pid != msg->pid ||
            co->s.m[r].join_serial != msg->samples) {
            if (r < PS_MAX_RANKS && (co->s.active >> r & 1) && co->s.m[r].pid == msg->pid &&
                !c->bad_warned) {
                c->bad_warned = true; /* once per connection: one guessing serials floods not */
                PS_LOG(PS_LOG_WARN, "coord", "%s asks for rank %d as pid %u with join serial "
                       "%llu, but that member joined as serial %llu (another process with the "
                       "same pid): refused", c->peer, r, msg->pid,
                       (unsigned long long)msg->samples,
                       (unsigned long long)co->s.m[r].join_serial);
            }
            psd_send_error(srv, c, msg->req_id, PS_ENOTMEMBER,
                           "rank %d (pid %u, join %llu) is not a member of the job any more "
                           "(epoch %llu): join again", r, msg->pid,
                           (unsigned long long)msg->samples, (unsigned long long)co->s.epoch);
            return;
        }
        psd_conn_t *old = co->rt[r].conn;
        if (old && old != c && !old->dead) {
            PS_LOG(PS_LOG_INFO, "coord", "rank %d (pid %u) says hello again from %s: its "
                   "connection from %s is closed", r, msg->pid, c->peer, old->peer);
            old->rank = -1; /* replaced: its death must not remove the member */
            old->dead = true;
            old->close_queued = true;
        }
        if (co->rt[r].lost_ms)
            PS_LOG(PS_LOG_INFO, "coord", "rank %d (pid %u) is back after %llu ms", r, msg->pid,
                   (unsigned long long)(uv_now(srv->loop) - co->rt[r].lost_ms));
        rank = r;
        co->rt[r].conn = c;
        co->rt[r].parked = 0;
        co->rt[r].lost_ms = 0;
        co->rt[r].late_from_ms = uv_now(srv->loop); /* its resent pushes get their time */
        co->rt[r].launcher = msg->launcher;
        if (co->rt[r].joined_ms == 0) { /* restored by a restart of this shard: from now */
            co->rt[r].joined_ms = uv_now(srv->loop);
            co->rt[r].steps_at_join = co->s.m[r].steps_done;
        }
    } else {
        uint64_t taken = co->s.active | co->rec.removed_in_step | co->s.step_members;
        if (taken == ~0ull && close_deserted_step(srv))
            taken = co->s.active | co->rec.removed_in_step | co->s.step_members;
        for (uint32_t r = 0; r < PS_MAX_RANKS && rank < 0; r++)
            if (!(taken >> r & 1)) rank = (int32_t)r;
        if (rank < 0) {
            /* Ranks that left the open step stay taken until it closes (their pushes of it
             * may sit in the shards' slots): with members still in it, they are free once
             * those finish it (close_deserted_step closes one without members). */
            /* Held ranks free up when the step closes: PS_EBUSY, which libps's join asks
             * again for until its reconnect timeout (a step without members closes at a join
             * once a checkpoint's hold of it ends; before, the join failed: a helper's probe,
             * a worker exited 1 while a stopped shard made the hold last 5 s). */
            uint32_t left = popcount(co->rec.removed_in_step & ~co->s.active);
            const char *why = co->s.step_members == 0
                                  ? " (by members that left the open step, which has none: it "
                                    "closes without them at a join once the checkpoint that "
                                    "holds it ends)"
                                  : " (some by members that left the open step, until it closes)";
            if (left)
                PS_LOG(PS_LOG_WARN, "coord", "a worker cannot join yet: %u of the %d ranks are "
                       "held by members that left open step %llu, until it closes%s, and the "
                       "others are members", left, PS_MAX_RANKS, (unsigned long long)co->s.step,
                       co->s.step_members == 0 ? " (a checkpoint holds it)" : "");
            psd_send_error(srv, c, msg->req_id, left ? PS_EBUSY : PS_EFULL,
                           "all %d worker ranks are taken%s", PS_MAX_RANKS, left ? why : "");
            return;
        }
        /* ssp: a newcomer starts at the slowest member's clock; from 0 it would hold every
         * other member back until it had done as many batches on its own. */
        uint64_t clock = srv->m.job.consistency == PS_CONSIST_SSP && co->s.active ? slowest(co)
                                                                                 : 0;
        saved_member_t *m = &co->s.m[rank];
        memset(m, 0, sizeof *m);
        if ((uint32_t)rank >= co->m_hi) co->m_hi = (uint32_t)rank + 1; /* stored from now on */
        m->pid = msg->pid;
        m->steps_done = clock;
        if (clock)
            PS_LOG(PS_LOG_INFO, "coord", "rank %d starts at clock %llu, the slowest member's "
                   "(ssp)", rank, (unsigned long long)clock);
        m->join_serial = ++co->s.joins;
        host_safe(m->host, sizeof m->host, msg->host[0] ? msg->host : c->peer);
        co->rt[rank] = (member_rt_t){.conn = c, .joined_ms = uv_now(srv->loop),
                                     .steps_at_join = clock, .no_batch_yet = true,
                                     .launcher = msg->launcher};
        co->s.active |= 1ull << rank;
        if (co->grant_start > 0) co->grant_start--;
        PS_LOG(PS_LOG_INFO, "coord", "worker pid %u from %s joins as rank %d at step %llu "
               "(%u members)", msg->pid, c->peer, rank, (unsigned long long)co->s.step,
               popcount(co->s.active));
    }
    c->rank = rank;
    c->pid = msg->pid;
    c->host_id = msg->store_id;
    c->join_serial = co->s.m[rank].join_serial;
    ps_msg_t r = {.type = PS_MSG_HELLO_REPLY, .req_id = msg->req_id, .rank = rank,
                  .workers = popcount(co->s.active), .epoch = co->s.epoch, .shard = 0,
                  .consistency = (uint32_t)srv->m.job.consistency, .step = co->s.step,
                  .members = co->s.step_members, .samples = co->s.m[rank].join_serial,
                  .count = psd_shard_tensors(srv), .flags = PSD_HELLO_FLAGS};
    psd_hello_store(srv, msg, &r);
    psd_hello_run(srv, &r);
    psd_hello_area(srv, c, msg, &r);
    psd_send_msg(srv, c, &r);
}

/* A member's report that the batch of msg->step was applied everywhere (its pushes were all
 * acknowledged): count it and, under bsp, close the steps up to it. A batch request or a leave
 * carries it (PS_FLAG_DONE). Returns 0, or the error to answer. */
static int batch_done(psd_server_t *srv, uint32_t r, const ps_msg_t *msg, char *err,
                      size_t errlen)
{
    psd_coord_t *co = srv->coord;
    saved_member_t *m = &co->s.m[r];
    if (is_bsp(srv) && msg->step > co->s.step + 1) {
        /* Nothing has handed out that step: closing steps up to it would count batches no
         * shard applied (and, held for a checkpoint, never end). */
        snprintf(err, errlen, "rank %u reports step %llu done, but the open step is %llu", r,
                 (unsigned long long)msg->step, (unsigned long long)co->s.step);
        return PS_EPROTO;
    }
    PS_LOG(PS_LOG_DEBUG, "coord", "rank %u reports step %llu done%s (open step %llu)", r,
           (unsigned long long)msg->step, msg->flags & PS_FLAG_STALE ? ", stale" : "",
           (unsigned long long)co->s.step);
    bool settled = false; /* a stale report taken care of here */
    if (is_bsp(srv) && (co->rec.rc_unsettled >> r & 1) && msg->step >= co->rec.rc_step) {
        /* Its own report of the restarted step rc_step settles its batch: a later step's
         * (that report lost) cannot tell, and gives it back too. */
        rec_changed(co);
        co->rec.rc_unsettled &= ~(1ull << r);
        if ((msg->flags & PS_FLAG_STALE) || msg->step > co->rec.rc_step) {
            regive(srv, co->rec.rc_batch[r], PS_REPLAY_TAG(co->rec.rc_step, r), true);
            PS_LOG(PS_LOG_INFO, "coord", "rank %u's batch of step %llu, a step handed out again "
                   "after its members left: %s; it goes to another worker", r,
                   (unsigned long long)co->rec.rc_step,
                   msg->step > co->rec.rc_step ? "its report was lost"
                                               : "a shard had passed the step without it");
        }
        settled = true;
    }
    if (is_bsp(srv) && msg->step >= co->rec.rc_step) {
        /* Every shard acknowledged r's pushes of rc_step (or a later step): they ack a push at
         * its step's apply, so rc_step is applied on every chunk, with whoever it had. */
        if (co->rec.rc_pending) rec_changed(co);
        co->rec.rc_pending = 0;
    }
    for (int i = 0; is_bsp(srv) && i < COORD_TOLD; i++)
        if (co->rec.told[i].epoch && msg->step > co->rec.told[i].step) {
            /* r's pushes of a later step were acknowledged everywhere: no shard is at it. */
            rec_changed(co);
            co->rec.told[i].epoch = 0;
        }
    bool again = is_bsp(srv) && co->rec.emptied_step1 == co->s.step + 1 &&
                 msg->step == co->s.step && (co->s.step_members >> r & 1) &&
                 ((m->has_batch && m->batch_step == msg->step) ||
                  (co->rec.again_reported >> r & 1));
    if (again) {
        /* A step handed out again after every member left: a chunk that had passed it
         * acknowledges pushes without applying them, so one report does not show it applied
         * everywhere. It closes once every member reported it (or left). */
        rec_changed(co);
        co->rec.again_reported |= 1ull << r;
        if (msg->flags & PS_FLAG_STALE) co->rec.again_stale |= 1ull << r;
        m->has_batch = 0; /* kept in m->batch for the close; not handed again meanwhile */
        /* No apply job may come before the close (every chunk may be past the step): saved
         * now, so that a restart of this shard meanwhile still knows the report. */
        bool last = (co->s.step_members & ~co->rec.again_reported) == 0;
        if (last && srv->test_crash_close_save && srv->test_crash_close_save-- == 1)
            crash_in_next_save(co, "PS_TEST_CRASH_CLOSE_SAVE"); /* the coord_save below */
        coord_save(srv);
        if (!co->s.finished && (co->s.step_members & ~co->rec.again_reported) == 0)
            close_step(srv);
    } else if (is_bsp(srv)) {
        if (co->rec.emptied_step1 == co->s.step + 1 && msg->step > co->s.step &&
            (co->s.step_members >> r & 1) && !(co->rec.again_reported >> r & 1))
            /* Not expected: the next step's batches are answered only once the close of a step
             * handed out again is committed (close_step). Closed here, its batch counts. */
            PS_LOG(PS_LOG_WARN, "coord", "rank %u reports step %llu while step %llu, handed out "
                   "again, still waits for its report", r, (unsigned long long)msg->step,
                   (unsigned long long)co->s.step);
        /* Its pushes of that step were acknowledged by every shard: the step is applied
         * everywhere. (After a restart of this shard a report may be one step ahead.) */
        while (!co->s.finished && co->s.step <= msg->step && (co->s.step_members >> r & 1))
            close_step(srv);
        if ((msg->flags & PS_FLAG_STALE) && !settled)
            PS_LOG(PS_LOG_WARN, "coord", "rank %u reports its batch of step %llu (pass %llu at "
                   "%llu) dropped unapplied by a shard that had passed the step, which was not "
                   "handed out again after its members left: counted as applied", r,
                   (unsigned long long)msg->step, (unsigned long long)msg->data_epoch,
                   (unsigned long long)msg->batch_offset);
    } else if (m->has_batch && m->batch_step == msg->step) {
        ps_cursor_applied(&co->s.cur, &m->batch);
        m->has_batch = 0;
        m->steps_done++;
        co->rt[r].last_done_ms = uv_now(srv->loop);
        if (co->s.step < m->steps_done) co->s.step = m->steps_done; /* the fastest */
    }
    return 0;
}

void psd_coord_on_leave_done(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    int r = member_of(srv, c);
    char err[160];
    if (r < 0 || msg->samples != co->s.cur.n) return; /* not a member, or not this job's set */
    if (batch_done(srv, (uint32_t)r, msg, err, sizeof err))
        PS_LOG(PS_LOG_WARN, "coord", "leave: %s", err);
    else
        PS_LOG(PS_LOG_INFO, "coord", "rank %d (pid %u) leaves with its batch of step %llu done",
               r, c->pid, (unsigned long long)msg->step);
}

/* bsp: a chunk's step waits for every member's push, so a member that declared other tensors
 * than the rest (another model) would hold every step of the tensors it lacks for good, and
 * its own of the tensors only it has. Its first batch request is refused instead (PS_ECONFIG,
 * naming both counts), so it leaves and the others go on. Only the first: a set that grows
 * mid-job (every worker declaring one more tensor) is the program's business. A request
 * without a set (an older libps) is not checked. Whether @p msg was refused. */
static bool tensor_set_differs(psd_server_t *srv, psd_conn_t *c, uint32_t r, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    if (!is_bsp(srv) || msg->tensor_set == 0) return false;
    member_rt_t *me = &co->rt[r];
    for (uint32_t o = 0; me->tensor_set == 0 && o < PS_MAX_RANKS; o++) {
        const member_rt_t *other = &co->rt[o];
        if (o == r || !(co->s.active >> o & 1) || other->tensor_set == 0 ||
            other->tensor_set == msg->tensor_set)
            continue;
        PS_LOG(PS_LOG_WARN, "coord", "rank %u (pid %u) refused: it declared %llu tensors, rank "
               "%u %llu, not the same set", r, c->pid, (unsigned long long)msg->count, o,
               (unsigned long long)other->tensor_count);
        psd_send_error(srv, c, msg->req_id, PS_ECONFIG,
                       "this worker declared %llu tensors and rank %u of the job %llu%s: under "
                       "bsp every worker must declare the same tensors (the same model), since "
                       "each step waits for every member's push of each",
                       (unsigned long long)msg->count, o, (unsigned long long)other->tensor_count,
                       msg->count == other->tensor_count ? ", but not the same ones" : "");
        return true;
    }
    me->tensor_set = msg->tensor_set;
    me->tensor_count = msg->count;
    return false;
}

uint64_t psd_coord_bsp_step(const psd_server_t *srv)
{
    return srv->coord && is_bsp(srv) ? srv->coord->s.step : 0;
}

uint32_t psd_coord_members(const psd_server_t *srv)
{
    return srv->coord ? popcount(srv->coord->s.active) : 0;
}

void psd_coord_on_batch(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    int r = member_of(srv, c);
    if (r < 0) {
        psd_send_error(srv, c, msg->req_id, PS_ENOTMEMBER,
                       "rank %d is not a member of the job (epoch %llu): join again", c->rank,
                       (unsigned long long)co->s.epoch);
        return;
    }
    if (msg->samples == 0) { /* libps refuses it first; a raw peer may not */
        psd_send_error(srv, c, msg->req_id, PS_ECONFIG,
                       "a batch request names a training set of 0 samples");
        return;
    }
    if (co->s.cur.n == 0) {
        co->s.cur.n = msg->samples;
        snprintf(co->set_by, sizeof co->set_by, "rank %d (pid %u on %s)", r, co->s.m[r].pid,
                 co->s.m[r].host);
    } else if (msg->samples != co->s.cur.n) {
        /* Fixed for the job by its first batch request: the cursor's batches are ranges of it.
         * Who named it is said, so that a worker started with the wrong data is found (a
         * helper's probe, session 59: one that asked first locked every other out). */
        psd_send_error(srv, c, msg->req_id, PS_ECONFIG,
                       "this worker's training set has %llu samples, the job's has %llu (named "
                       "by %s; every worker of a job trains on one set: a new set is a new job, "
                       "in an empty data_dir)",
                       (unsigned long long)msg->samples, (unsigned long long)co->s.cur.n,
                       co->set_by[0] ? co->set_by : "its first batch request, stored with the job");
        return;
    }
    if (tensor_set_differs(srv, c, (uint32_t)r, msg)) return;
    char err[160];
    if ((msg->flags & PS_FLAG_DONE) && batch_done(srv, (uint32_t)r, msg, err, sizeof err)) {
        psd_send_error(srv, c, msg->req_id, PS_EPROTO, "%s", err);
        return;
    }
    co->rt[r].parked = 1;
    co->rt[r].park_req = msg->req_id;
    if (is_bsp(srv)) maybe_restart_step(srv);
    serve_parked(srv);
}

static void member_remove(psd_server_t *srv, uint32_t r, const char *why)
{
    psd_coord_t *co = srv->coord;
    saved_member_t *m = &co->s.m[r];
    /* bsp: a member that never had a batch reply (handed its first batch by a tick or another's
     * request before it asked: a joiner that died, or gave up on another shard, first) cannot
     * have pushed the open step: its rank is free at once, and its batch goes back without a
     * replay tag of it. Before, each such member held its rank until the step closed and added
     * a tag, so a batch passed among such joiners lost the tag of the member that had pushed it
     * (PS_REPLAY_MAX) and was applied twice there. */
    bool unsent = is_bsp(srv) && co->rt[r].no_batch_yet && m->has_batch &&
                  m->batch_step == co->s.step;
    co->s.active &= ~(1ull << r);
    rec_changed(co);
    if ((co->s.step_members >> r & 1) && !unsent)
        co->rec.removed_in_step |= 1ull << r; /* its pushes of this step may sit in slots */
    co->rt[r].parked = 0;
    co->rt[r].conn = NULL;
    co->rt[r].lost_ms = 0;
    if (co->grant_stop > 0) co->grant_stop--;
    bool again = is_bsp(srv) && co->rec.emptied_step1 == co->s.step + 1;
    if (again && (co->rec.again_reported >> r & 1)) { /* its report settled its batch */
        if (co->rec.again_stale >> r & 1)
            regive(srv, m->batch, PS_REPLAY_TAG(co->s.step, r), false);
        else
            ps_cursor_applied(&co->s.cur, &m->batch);
    }
    co->rec.again_reported &= ~(1ull << r);
    co->rec.again_stale &= ~(1ull << r);
    bool rc_lost = is_bsp(srv) && (co->rec.rc_pending >> r & 1);
    if (is_bsp(srv) && (co->rec.rc_unsettled >> r & 1)) {
        co->rec.rc_unsettled &= ~(1ull << r);
        if (!rc_lost) /* else restore_closed_lost gives it back */
            regive(srv, co->rec.rc_batch[r], PS_REPLAY_TAG(co->rec.rc_step, r), true);
    }
    if (rc_lost) restore_closed_lost(srv, r);
    bool given_back = false;
    if (m->has_batch) {
        /* Not applied (bsp: its step is still open): someone else takes it. Some of its pushes
         * may have been applied (bsp: a chunk applies the step once every member's push of it
         * is there; asp / ssp: each push on arrival): the batch carries this step and rank
         * (asp / ssp: the rank), so those chunks do not apply it again (replay_had and
         * batch_applied_here in push.c). A member that never had a batch reply pushed
         * nothing: no tag, and nothing for a restart to hold its rank for. */
        bool tag = is_bsp(srv) ? m->batch_step == co->s.step &&
                                     (co->s.step_members >> r & 1) && !unsent
                               : true;
        /* asp / ssp: step 0 (only the rank counts there), so that its tags merge into one. */
        if (tag) batch_tag(&m->batch, PS_REPLAY_TAG(is_bsp(srv) ? m->batch_step : 0, r));
        if (co->rt[r].batch_seen && ++m->batch.left >= POISON_LEFT) {
            co->suspect += m->batch.left == POISON_LEFT; /* counted once, said each time */
            PS_LOG(PS_LOG_WARN, "coord", "the batch of pass %llu at %llu (%u samples: positions "
                   "%llu to %llu of that pass's order) went to %u workers that each left with it, "
                   "the last rank %u (pid %u): are its samples what makes workers fail?",
                   (unsigned long long)m->batch.pass, (unsigned long long)m->batch.offset,
                   m->batch.count, (unsigned long long)m->batch.offset,
                   (unsigned long long)(m->batch.offset + m->batch.count - 1), m->batch.left, r,
                   m->pid);
        }
        if (ps_cursor_give_back(&co->s.cur, &m->batch))
            PS_LOG(PS_LOG_ERROR, "coord", "re-hand queue full: batch of pass %llu at %llu lost",
                   (unsigned long long)m->batch.pass, (unsigned long long)m->batch.offset);
        m->has_batch = 0;
        if (unsent) m->batch.count = 0; /* psd_coord_create's rebuild of removed_in_step */
        given_back = true;
        if (co->s.finished && !is_bsp(srv)) co->s.finished = 0;
    }
    char gone[96] = "";
    if (given_back)
        snprintf(gone, sizeof gone, "; its batch (pass %llu at %llu) goes to another worker",
                 (unsigned long long)m->batch.pass, (unsigned long long)m->batch.offset);
    PS_LOG(PS_LOG_INFO, "coord", "rank %u (pid %u) left at step %llu: %s%s (%u members)", r,
           m->pid, (unsigned long long)co->s.step, why, gone, popcount(co->s.active));
    if (is_bsp(srv) && (co->s.step_members >> r & 1)) {
        uint64_t left = co->s.step_members & ~(1ull << r);
        if (left == 0) co->rec.emptied_step1 = co->s.step + 1; /* hand_out; saved with: */
        set_members(srv, left);
        broadcast_epoch(srv);
        if (again && left && (left & ~co->rec.again_reported) == 0)
            close_step(srv); /* every member left reported the step handed out again */
        maybe_restart_step(srv);
    } else {
        maybe_restart_step(srv);
    }
    async_maybe_finished(srv); /* the others may all have done their steps */
    /* Committed now, not with the next update: after the job's last one there is none, and a
     * restart showed (and waited for) members that had left long before. */
    coord_save(srv);
    serve_parked(srv);
}

/* Whether a member's process may still run: 0 only when it ran on this host (by name) and
 * /proc shows its pid gone or a zombie. Elsewhere (or in another pid namespace that shares
 * the host name: then this may err either way) it cannot be told. */
static int may_live(const saved_member_t *m)
{
    char host[sizeof m->host];
    if (gethostname(host, sizeof host) != 0 || strncmp(host, m->host, sizeof host) != 0) return 1;
    char path[64], stat[256];
    snprintf(path, sizeof path, "/proc/%u/stat", m->pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *paren = strrchr(stat, ')'); /* "pid (comm) S ...": comm may hold spaces */
    return !(paren && paren[1] == ' ' && paren[2] == 'Z');
}

void psd_coord_on_gone(psd_server_t *srv, psd_conn_t *c, const char *why, bool may_return)
{
    psd_coord_t *co = srv->coord;
    int r = member_of(srv, c);
    if (r < 0) return;
    /* A connection that closed while its process may live (its transport was started again,
     * the network broke): the same process gets its rank back if it says hello within
     * grace_ms (psd_coord_tick). Meanwhile the open step waits for it. */
    if (may_return && may_live(&co->s.m[r])) {
        co->rt[r].conn = NULL;
        co->rt[r].parked = 0; /* that request went with the connection: it asks again */
        /* The time now, not the loop's cached one: after a stall of this process (a SIGSTOP),
         * closes are seen before the loop reads the clock again, and a stamp from before the
         * stall had the grace used up at the next tick (a probe, session 40: every member of
         * a coordinator stopped for 4 s was dropped when it resumed). */
        uv_update_time(srv->loop);
        co->rt[r].lost_ms = uv_now(srv->loop);
        PS_LOG(PS_LOG_INFO, "coord", "rank %d (pid %u): %s; its rank waits %llu ms for it to "
               "come back", r, co->s.m[r].pid, why, (unsigned long long)grace_ms(srv));
        return;
    }
    member_remove(srv, (uint32_t)r, why);
}

/* Close member @p r's connection here as a silent one's (conn_close_ep: member_remove with
 * "it held the others past job.step_timeout_ms"). */
static void drop_late(psd_server_t *srv, uint32_t r)
{
    psd_conn_t *c = srv->coord->rt[r].conn;
    srv->late_drops++;
    c->dead = c->late = c->close_queued = true; /* closed from the deferred hook */
}

/*
 * bsp with job.step_timeout_ms: a member of the open step none of whose pushes of it reached
 * this shard job.step_timeout_ms after the first member's did holds every other one for as
 * long as it stays (a worker hung in its training loop while libps's thread heartbeats). It is
 * dropped as a silent one is: its connection here closes (conn_close_ep: member_remove, the
 * step goes on without it), and if it goes on it learns it was removed and joins again. Only
 * this shard's chunks are watched (a member's pushes of a step leave together: the hang comes
 * between steps); with no chunk here nothing is dropped.
 */
static void late_members(psd_server_t *srv, uint64_t now)
{
    psd_coord_t *co = srv->coord;
    uint64_t limit = srv->m.job.step_timeout_ms;
    uint64_t late = co->s.step_members & ~srv->sp_mask;
    if (co->s.finished || srv->sp_step != co->s.step || srv->sp_mask == 0 || late == 0 ||
        now - srv->sp_first_ms <= limit)
        return;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        psd_conn_t *c = co->rt[r].conn;
        /* One whose connection closed has its grace to come back (psd_coord_tick); one that
         * became a member of the step, or came back, later than the first push has its own
         * deadline (a step handed out again after its members left keeps sp_first_ms). */
        if (!(late >> r & 1) || !(co->s.active >> r & 1) || c == NULL || c->dead ||
            co->rt[r].parked) /* it waits for its batch's answer from us: not hung */
            continue;
        uint64_t from = co->rt[r].late_from_ms > srv->sp_first_ms ? co->rt[r].late_from_ms
                                                                   : srv->sp_first_ms;
        if (srv->late_floor_ms > from) from = srv->late_floor_ms;
        if (now - from <= limit) continue;
        PS_LOG(PS_LOG_WARN, "coord", "rank %u (pid %u) has not pushed step %llu %llu ms after "
               "the first member did (job.step_timeout_ms %llu): dropping it", r,
               co->s.m[r].pid, (unsigned long long)co->s.step,
               (unsigned long long)(now - srv->sp_first_ms), (unsigned long long)limit);
        drop_late(srv, r);
    }
}

/*
 * ssp with job.step_timeout_ms: while a member waits because it is more than job.staleness
 * batches ahead of the slowest (job.staleness + 1 done), a slowest member that reported no
 * batch for job.step_timeout_ms (nor joined or came back within it) is dropped as
 * late_members drops one under bsp.
 */
static void late_slowest(psd_server_t *srv, uint64_t now)
{
    psd_coord_t *co = srv->coord;
    uint64_t low = slowest(co), limit = srv->m.job.step_timeout_ms;
    bool waits = false;
    if (co->s.finished) return; /* a member parked then waits for nothing (the end) */
    for (uint32_t r = 0; r < PS_MAX_RANKS && !waits; r++)
        waits = (co->s.active >> r & 1) && co->rt[r].parked && !co->s.m[r].has_batch &&
                co->s.m[r].steps_done > low + srv->m.job.staleness;
    for (uint32_t r = 0; waits && r < PS_MAX_RANKS; r++) {
        const member_rt_t *rt = &co->rt[r];
        if (!(co->s.active >> r & 1) || co->s.m[r].steps_done != low || rt->conn == NULL ||
            rt->conn->dead || rt->parked) /* waiting for our answer (a checkpoint's hold) */
            continue;
        uint64_t from = rt->last_done_ms;
        if (rt->joined_ms > from) from = rt->joined_ms;
        if (rt->late_from_ms > from) from = rt->late_from_ms; /* its last batch's answer */
        if (srv->late_floor_ms > from) from = srv->late_floor_ms;
        if (now - from <= limit) continue;
        PS_LOG(PS_LOG_WARN, "coord", "rank %u (pid %u) reported no batch for %llu ms while a "
               "member waits for it, %u batches ahead (job.step_timeout_ms %llu): dropping it",
               r, co->s.m[r].pid, (unsigned long long)(now - from),
               (unsigned)srv->m.job.staleness + 1, (unsigned long long)limit);
        drop_late(srv, r);
    }
}

void psd_coord_stalled(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint64_t now = uv_now(srv->loop);
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        if ((co->s.active >> r & 1) && co->rt[r].conn == NULL && co->rt[r].lost_ms)
            co->rt[r].lost_ms = now ? now : 1;
}

void psd_coord_tick(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint64_t now = uv_now(srv->loop);
    uint64_t limit = srv->m.job.heartbeat_timeout_ms;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(co->s.active >> r & 1) || co->rt[r].conn != NULL) continue;
        if (co->rt[r].lost_ms && !may_live(&co->s.m[r])) /* exited since */
            member_remove(srv, r, "its connection closed and its process ended");
        else if (co->rt[r].lost_ms && now - co->rt[r].lost_ms > grace_ms(srv))
            member_remove(srv, r, "its connection closed and it did not come back");
        else if (co->rt[r].lost_ms == 0 && now - co->started_ms > limit)
            member_remove(srv, r, "did not come back after the coordinator restarted");
    }
    if (co->save_retry && !co->save_busy) coord_save(srv); /* a save failed (save_done) */
    if (co->grant_ms && now - co->grant_ms > GRANT_TTL_MS) {
        co->grant_start = co->grant_stop = 0; /* launches that never showed up */
        co->grant_ms = 0;
    }
    const uint64_t hold_limit = srv->test_ckpt_hold_ms ? srv->test_ckpt_hold_ms : CKPT_HOLD_MS;
    bool lapsed = false;
    for (uint32_t u = 0; u < co->hold_users;) {
        if (now - co->hold_user[u].ms <= hold_limit) {
            u++;
            continue;
        }
        /* Its BEGIN answer was lost, or its psctl died: its GO will hear that the hold lapsed. */
        PS_LOG(PS_LOG_WARN, "coord", "checkpoint %016llx: no GO within %llu ms of its last ask: "
               "the hand-outs are no longer held for it", (unsigned long long)co->hold_user[u].id,
               (unsigned long long)hold_limit);
        co->hold_user[u] = co->hold_user[--co->hold_users];
        lapsed = true;
    }
    if (lapsed && is_bsp(srv) && co->hold_ms && co->hold_users == 0) {
        /* bsp: the last checkpoint using the hold lapsed (its psctl died after its BEGIN, and
         * the others' GOs kept the hold for it): the hold ends now, not at its own lapse,
         * which a later BEGIN had put off (a review, session 50: training stood 11 s). */
        PS_LOG(PS_LOG_WARN, "coord", "checkpoint hold of step %llu: no checkpoint uses it any "
               "more: releasing it", (unsigned long long)co->hold_step);
        psd_coord_ckpt_release(srv);
    }
    if (co->hold_ms && now - co->hold_ms > hold_limit) {
        if (is_bsp(srv))
            PS_LOG(PS_LOG_WARN, "coord", "checkpoint hold of step %llu not released within %llu "
                   "ms: releasing it", (unsigned long long)co->hold_step,
                   (unsigned long long)hold_limit);
        else
            PS_LOG(PS_LOG_WARN, "coord", "checkpoint hold of the hand-outs not released or asked "
                   "for again within %llu ms: releasing it", (unsigned long long)hold_limit);
        psd_coord_ckpt_release(srv);
    }
    if (is_bsp(srv) && srv->m.job.step_timeout_ms) late_members(srv, now);
    if (srv->m.job.consistency == PS_CONSIST_SSP && srv->m.job.step_timeout_ms)
        late_slowest(srv, now);
    if (is_bsp(srv)) {
        if (co->told_unlearnt) {
            /* After a restart: the closed views kept (rec.told) pass this shard's chunks still
             * at their steps (a step closed with no member, whose save committed before this
             * shard's pass of it). Not in psd_coord_create: such a view makes a chunk ready
             * without a push, and an apply job must not start before the loop does. */
            co->told_unlearnt = false;
            for (int i = 0; i < COORD_TOLD; i++)
                if (co->rec.told[i].epoch)
                    psd_shard_learn_view(srv, co->rec.told[i].epoch, co->rec.told[i].step,
                                         co->rec.told[i].members, true);
        }
        tell_closed(srv); /* a shard that missed them, or restarted since */
        maybe_restart_step(srv);
    } else if (!co->s.started)
        serve_parked(srv); /* the start's grace may have run out */
}

/* ---- checkpoints ---------------------------------------------------------------- */

/* The step a checkpoint asked for now would have: the steps before the open one are applied
 * everywhere, and the open one is being applied while it has members (unless it is held). */
static uint64_t natural_step(const psd_coord_t *co)
{
    return co->s.step + (co->s.step_members != 0 && !co->s.finished && !co->held ? 1 : 0);
}

static void hold_ahead(psd_server_t *srv, uint64_t step)
{
    psd_coord_t *co = srv->coord;
    co->hold_step = step;
    co->hold_ms = 0;
    co->hold_ahead = true;
    PS_LOG(PS_LOG_INFO, "coord", "checkpoint at step %llu requested: the step will be held "
           "when reached", (unsigned long long)step);
}

/* The index of checkpoint @p id among the hold's users, or -1. */
static int hold_user(const psd_coord_t *co, uint64_t id)
{
    for (uint32_t u = 0; u < co->hold_users; u++)
        if (co->hold_user[u].id == id) return (int)u;
    return -1;
}

/* Checkpoint @p id arms the shards under the hold: until its GO, CKPT_HOLD_MS after this, or
 * until @p conn closes. Asked again (its answer was lost, and psctl asked once more, maybe over
 * a new connection) it is the same user. */
static void hold_user_add(psd_coord_t *co, uint64_t id, uint64_t now, const psd_conn_t *conn)
{
    int u = hold_user(co, id);
    if (u < 0 && co->hold_users == CKPT_USERS_MAX) { /* the oldest one gives way */
        uint32_t old = 0;
        for (uint32_t i = 1; i < co->hold_users; i++)
            if (co->hold_user[i].ms < co->hold_user[old].ms) old = i;
        co->hold_user[old] = co->hold_user[--co->hold_users];
    }
    if (u < 0) {
        u = (int)co->hold_users++;
        co->hold_user[u].id = id;
    }
    co->hold_user[u].ms = now;
    co->hold_user[u].conn = conn;
    if (co->hold_asker == conn) co->hold_asker = NULL; /* its ask is a user's now */
}

/* asp / ssp: no common step, so the cut is made by holding every new hand-out and waiting until
 * each batch handed out was reported (its pushes acknowledged, i.e. committed, on every shard)
 * or went back with its member. Then no push is in flight and none can start before the hold
 * ends, and each shard's snapshot, taken whenever it is told, holds the same batches. Asked
 * again while batches are in flight (PS_FLAG_PENDING): each ask keeps the hold alive, so a
 * psctl that died ends it CKPT_HOLD_MS after its last ask. A drained answer makes checkpoint
 * @p id a user of the hold: its GO learns whether the hold lasted for it (a cut) or lapsed. */
static uint64_t hold_async(psd_server_t *srv, uint64_t id, const psd_conn_t *conn,
                           uint32_t *flags, uint32_t *pending)
{
    psd_coord_t *co = srv->coord;
    bool was = co->hold_ms != 0;
    co->hold_step = UINT64_MAX;
    co->hold_ahead = false;
    co->hold_ms = hold_now(srv);
    *pending = in_flight(co);
    *flags = *pending ? PS_FLAG_PENDING : 0;
    if (*pending == 0)
        hold_user_add(co, id, co->hold_ms, conn);
    else
        co->hold_asker = conn;
    if (!was)
        PS_LOG(PS_LOG_INFO, "coord", "checkpoint: no batch handed out until it is taken; %u "
               "in flight", *pending);
    return UINT64_MAX;
}

uint64_t psd_coord_ckpt_hold(psd_server_t *srv, uint64_t id, const psd_conn_t *conn,
                             uint32_t *flags, uint32_t *pending)
{
    psd_coord_t *co = srv->coord;
    *flags = *pending = 0;
    if (!is_bsp(srv)) return hold_async(srv, id, conn, flags, pending);
    /* Holding the hand-out of the natural step keeps every chunk at or below it. The open
     * step itself when its members all left: said (PS_FLAG_MOVE), as workers that left after
     * part of it was applied may have moved a shard past it (psctl then waits for the next). */
    uint64_t step = natural_step(co);
    if (co->s.step_members == 0 && !co->s.finished) *flags |= PS_FLAG_MOVE;
    if (co->hold_ahead && co->hold_step > step) {
        co->ahead_after = co->hold_step; /* the follower's next: held ahead again after this */
        co->ahead_asker = co->hold_asker;
        co->hold_asker = NULL; /* its ask holds nothing now */
    }
    co->hold_step = step;
    co->hold_ahead = false;
    co->hold_ms = hold_now(srv);
    if (id) hold_user_add(co, id, co->hold_ms, conn);
    PS_LOG(PS_LOG_INFO, "coord", "checkpoint at step %llu: holding later steps until every "
           "shard knows it", (unsigned long long)step);
    return step;
}

int psd_coord_ckpt_hold_at(psd_server_t *srv, uint64_t step, uint64_t id,
                           const psd_conn_t *conn, uint32_t *flags, char *err, size_t errlen)
{
    psd_coord_t *co = srv->coord;
    *flags = 0;
    if (!is_bsp(srv)) {
        snprintf(err, errlen, "a checkpoint at a given step needs bsp (this job is %s)",
                 ps_consistency_name(srv->m.job.consistency));
        return PS_EINVAL;
    }
    uint64_t now = natural_step(co);
    if (step < now) {
        snprintf(err, errlen, "the job is past step %llu (a checkpoint now would be at step "
                 "%llu)", (unsigned long long)step, (unsigned long long)now);
        return PS_ECONFLICT;
    }
    if (step == now) {
        uint32_t pending;
        psd_coord_ckpt_hold(srv, id, conn, flags, &pending);
        return 0;
    }
    if (co->s.finished) { /* it will never get there */
        *flags = PS_FLAG_FINISHED;
        return 0;
    }
    if (co->hold_ms && co->hold_step < step) {
        /* A checkpoint holds an earlier step now (one taken by hand beside psd's follower):
         * its hold stays, and this one is held ahead when it ends (psd_coord_ckpt_release).
         * Before, this request ended it, and that checkpoint failed ("shard 1 is already past
         * step 5"; session 49). */
        co->ahead_after = step;
        co->ahead_asker = conn;
        *flags = PS_FLAG_PENDING;
        return 0;
    }
    if (!co->hold_ahead || co->hold_step != step) hold_ahead(srv, step);
    co->hold_asker = conn;
    *flags = PS_FLAG_PENDING;
    return 0;
}

/* bsp: hold ahead the step a request asked for while another checkpoint's hold lasted. */
static void hold_ahead_after(psd_server_t *srv, uint64_t step)
{
    psd_coord_t *co = srv->coord;
    if (step && is_bsp(srv) && !co->s.finished && !co->hold_ms && !co->hold_ahead &&
        step > natural_step(co))
        hold_ahead(srv, step);
}

void psd_coord_ckpt_release(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    if (co == NULL) return;
    co->hold_ahead = false;
    co->hold_users = 0;
    co->hold_asker = NULL;
    uint64_t after = co->ahead_after;
    const psd_conn_t *after_asker = co->ahead_asker;
    co->ahead_after = 0;
    co->ahead_asker = NULL;
    if (co->hold_ms) {
        PS_LOG(PS_LOG_INFO, "coord", "checkpoint: the hold ends after %llu ms; later steps go on",
               (unsigned long long)(hold_now(srv) - co->hold_ms));
        co->hold_ms = 0;
        if (!is_bsp(srv)) {
            serve_parked(srv); /* the batch requests the hold kept waiting */
        } else if (co->held) {
            co->held = false;
            hand_out(srv);
        }
    }
    hold_ahead_after(srv, after);
    if (co->hold_ahead) co->hold_asker = after_asker;
}

bool psd_coord_ckpt_release_until(psd_server_t *srv, uint64_t next, uint64_t id,
                                  const psd_conn_t *conn)
{
    psd_coord_t *co = srv->coord;
    bool held = true;
    if (co) {
        /* Two checkpoints at once (psctl by hand beside psd's follower) share the hold: the
         * first one's end must not let the job on while the other is still arming shards. A
         * GO from one that never armed (it gave up waiting, or found a shard busy with the
         * other) ends nothing of theirs. bsp: before session 50 any GO ended the hold, and
         * the other checkpoint failed ("shard 1 is already past step 7"). */
        int u = hold_user(co, id);
        if (!is_bsp(srv)) held = u >= 0 && co->hold_ms;
        if (u >= 0) co->hold_user[u] = co->hold_user[--co->hold_users];
        if (co->hold_ms && co->hold_users > 0) {
            if (!is_bsp(srv))
                co->hold_ms = hold_now(srv);
            else if (next && next > co->hold_step) {
                co->ahead_after = next; /* held ahead once the others' hold ends */
                co->ahead_asker = conn;
            }
            return held;
        }
    }
    psd_coord_ckpt_release(srv);
    if (co && next && is_bsp(srv) && !co->s.finished && next > natural_step(co)) {
        hold_ahead(srv, next);
        co->hold_asker = conn;
    }
    return held;
}

void psd_coord_drop_conn(psd_server_t *srv, const psd_conn_t *c, bool peer_gone)
{
    psd_coord_t *co = srv->coord;
    if (co == NULL) return;
    if (!peer_gone) {
        /* This shard closed it (its transport started again): the psctl may live and ask over a
         * new connection, so its checkpoints keep the hold until their GO or CKPT_HOLD_MS, as
         * before. Releasing here failed a live psctl's checkpoint (a review: "shard 1 is
         * already past step 7"). */
        for (uint32_t u = 0; u < co->hold_users; u++)
            if (co->hold_user[u].conn == c) co->hold_user[u].conn = NULL;
        if (co->hold_asker == c) co->hold_asker = NULL;
        if (co->ahead_asker == c) co->ahead_asker = NULL;
        return;
    }
    if (co->ahead_asker == c) { /* its follower died; started again, it asks for its own next */
        co->ahead_asker = NULL;
        co->ahead_after = 0;
    }
    bool dropped = false, asker = co->hold_asker == c;
    for (uint32_t u = 0; u < co->hold_users;) {
        if (co->hold_user[u].conn != c) {
            u++;
            continue;
        }
        PS_LOG(PS_LOG_WARN, "coord", "checkpoint %016llx: the connection of its psctl closed "
               "before its GO: the hand-outs are no longer held for it",
               (unsigned long long)co->hold_user[u].id);
        co->hold_user[u] = co->hold_user[--co->hold_users];
        dropped = true;
    }
    if (asker) co->hold_asker = NULL;
    /* The hold ends now when nobody is left to use it or to ask for it again, not at its
     * lapse: before, a psctl killed after its BEGIN held a bsp job for CKPT_HOLD_MS. */
    if ((dropped || asker) && co->hold_users == 0 && co->hold_asker == NULL &&
        (co->hold_ms || co->hold_ahead)) {
        PS_LOG(PS_LOG_WARN, "coord", "checkpoint hold%s: the psctl that asked for it is gone "
               "(its connection closed): releasing it", co->hold_ahead ? " ahead" : "");
        psd_coord_ckpt_release(srv);
    }
}

/* ---- scaling -------------------------------------------------------------------- */

void psd_coord_on_scale(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    if (msg->workers > PS_MAX_RANKS) {
        psd_send_error(srv, c, msg->req_id, PS_EINVAL, "cannot scale to %u workers (at most %d)",
                       msg->workers, PS_MAX_RANKS);
        return;
    }
    PS_LOG(PS_LOG_INFO, "coord", "desired workers %u -> %u", co->s.desired, msg->workers);
    co->s.desired = msg->workers;
    coord_save(srv);
    /* Starts granted and not joined yet are workers on their way: still counted (zeroed, a
     * scale from 2 to 3 while 2 were starting had 3 more started). Stops are asked anew. */
    co->grant_stop = 0;
    ps_msg_t a = {.type = PS_MSG_SCALE_REPLY, .req_id = msg->req_id, .shard = 0,
                  .workers = popcount(co->s.active),
                  .flags = co->s.finished ? PS_FLAG_FINISHED : 0};
    psd_send_msg(srv, c, &a);
    if (is_bsp(srv)) maybe_restart_step(srv);
}

/* A launcher reports its running workers; the answer says how many to start (> 0) or to
 * stop (< 0). Grants are counted until the workers join or leave, so several launchers
 * asking at once share the difference instead of each filling it. */
/* A launcher heard from within GRANT_TTL_MS (a slot in use). */
static bool launcher_fresh(const launcher_t *x, uint64_t now)
{
    return x->pid != 0 && now - x->last_ms <= GRANT_TTL_MS;
}

/* Starts granted whose workers died before they joined. Once every launcher heard from has
 * reported after the last grant (pslaunch starts its workers on the answer, so each count
 * holds them), the grants still on their way are at most the workers the launchers run that
 * are not members yet (the members whose hello named one of them: PS_LAUNCHER). Before, such a
 * grant counted until GRANT_TTL_MS: with the started workers dead, the job waited ~15 s with
 * none. And before session 58 the members counted were those on a launcher's host: one that
 * no live launcher ran (a worker started by hand, or the workers of a pslaunch stopped for
 * over GRANT_TTL_MS) cut the count, and workers still starting were started again, over the
 * desired number (a helper's probe). */
static void grants_seen(psd_server_t *srv, uint64_t now)
{
    psd_coord_t *co = srv->coord;
    if (co->grant_start <= 0) return;
    int32_t running = 0, here = 0;
    bool any = false;
    for (int i = 0; i < MAX_LAUNCHERS; i++) {
        const launcher_t *x = &co->launchers[i];
        if (!launcher_fresh(x, now)) continue;
        if (x->last_ms <= co->grant_ms) return; /* it may not have started them yet */
        any = true;
        running += (int32_t)x->running;
    }
    if (!any) return;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(co->s.active >> r & 1) || co->rt[r].launcher == 0) continue;
        for (int i = 0; i < MAX_LAUNCHERS; i++) {
            const launcher_t *x = &co->launchers[i];
            if (launcher_fresh(x, now) && x->pid == co->rt[r].launcher &&
                strcmp(x->host, co->s.m[r].host) == 0) {
                here++;
                break;
            }
        }
    }
    int32_t pending = running > here ? running - here : 0;
    if (co->grant_start > pending) {
        PS_LOG(PS_LOG_INFO, "coord", "%d worker(s) started for the job never joined (the "
               "launchers run %d, %d of them members): started again", co->grant_start - pending,
               running, here);
        co->grant_start = pending;
    }
}

void psd_coord_on_launch(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    uint64_t now = uv_now(srv->loop);
    if (msg->workers > PS_LAUNCH_MAX) {
        /* Summed as signed counts below: 0xffffffff was -1, and answered a scale-down with a
         * start (a helper's probe, session 59). */
        psd_send_error(srv, c, msg->req_id, PS_EINVAL, "a launcher that runs %u workers: at "
                       "most %d run at once", msg->workers, PS_LAUNCH_MAX);
        return;
    }
    launcher_t *l = NULL, *free_l = NULL;
    char host[sizeof l->host];
    host_safe(host, sizeof host, msg->host);
    for (int i = 0; i < MAX_LAUNCHERS; i++) {
        launcher_t *x = &co->launchers[i];
        if (x->pid == msg->pid && strcmp(x->host, host) == 0) l = x;
        if (free_l == NULL && !launcher_fresh(x, now)) free_l = x;
    }
    if (l == NULL && (l = free_l) != NULL) {
        memset(l, 0, sizeof *l);
        snprintf(l->host, sizeof l->host, "%s", host);
        l->pid = msg->pid;
    }
    if (l) {
        l->running = msg->workers;
        l->poll_ms = msg->poll_ms;
        l->last_ms = now;
    }
    int32_t actual = (int32_t)popcount(co->s.active), want = (int32_t)co->s.desired, delta = 0;
    grants_seen(srv, now);
    /* Right after this shard started, the grants it made before are forgotten, but the
     * workers the launchers run (members and ones still starting) are on their way: counted.
     * Not later: a hung worker dropped as silent still runs, and must be replaced. Only a
     * launcher still reporting: one that exited or died (its workers with it) counted for
     * GRANT_TTL_MS, and the job sat with no worker for up to 15 s (a probe, session 46). */
    int32_t running = 0, have = actual + co->grant_start;
    if (now - co->started_ms <= GRANT_TTL_MS)
        for (int i = 0; i < MAX_LAUNCHERS; i++) {
            const launcher_t *x = &co->launchers[i];
            if (launcher_fresh(x, now) && (x->poll_ms == 0 || now - x->last_ms <=
                                                                  3ull * x->poll_ms + 1000))
                running += (int32_t)x->running;
        }
    if (running > have) have = running;
    if (!co->s.finished && !co->capped) {
        if (want > have) {
            delta = want - have;
            co->grant_start += delta;
            co->grant_ms = now;
        } else if (want < actual - co->grant_stop && msg->workers > 0) {
            delta = actual - co->grant_stop - want;
            if (delta > (int32_t)msg->workers) delta = (int32_t)msg->workers;
            co->grant_stop += delta;
            co->grant_ms = now;
            delta = -delta;
        }
    }
    ps_msg_t a = {.type = PS_MSG_LAUNCH_REPLY, .req_id = msg->req_id, .shard = 0,
                  .status = delta, .workers = co->s.desired, .count = (uint64_t)actual,
                  .flags = co->s.finished ? PS_FLAG_FINISHED : 0};
    psd_send_msg(srv, c, &a);
}

/* ---- state ---------------------------------------------------------------------- */

/* The first start after psd --restore of a bsp checkpoint whose saved state has its last step
 * open (rc_step = the checkpoint's step - 1): the ranks every chunk applied that step with
 * (PSD_RESTORE_APPLIED_BLOB, from every part's applied records) are settled, not pending.
 * Before, each of the checkpoint's members counted as possibly not applied everywhere; none
 * comes back after a restore, so each removal handed its batch out again as a replay that
 * every chunk then skipped: a step of batches spent for nothing, and with two or more workers
 * one update split in two (a restore lost a step of job.max_steps). */
static void restored_applied(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    psd_restore_applied_t ra;
    size_t len = 0;
    if (co->rec.rc_pending == 0 || co->rec.rc_step + 1 != srv->run.base_step ||
        psd_store_get_blob(&srv->store, PSD_RESTORE_APPLIED_BLOB, &ra, sizeof ra, &len) != 0 ||
        len != sizeof ra || ra.step != co->rec.rc_step)
        return;
    uint64_t done = co->rec.rc_pending & ra.members;
    co->rec.rc_pending &= ~done;
    PS_LOG(PS_LOG_INFO, "coord", "restored: step %llu was applied with the pushes of %u of its "
           "%u members on every chunk; %u batch(es) of it go out again if their ranks do not "
           "come back", (unsigned long long)ra.step, popcount(done), popcount(co->rec.rc_view),
           popcount(co->rec.rc_pending));
}

/* A stored batch's tag count cut to PS_REPLAY_MAX: @return 1 when it was beyond. */
static uint32_t clamp_tags(ps_batch_t *b)
{
    if (b->nreplay <= PS_REPLAY_MAX) return 0;
    b->nreplay = PS_REPLAY_MAX;
    return 1;
}

int psd_coord_create(psd_server_t *srv, const void *saved, size_t saved_len, const void *rec,
                     size_t rec_len)
{
    psd_coord_t *co = calloc(1, sizeof *co);
    if (co == NULL) return PS_ENOMEM;
    srv->coord = co;
    co->rec.magic = COORD_REC_MAGIC;
    co->started_ms = uv_now(srv->loop);
    co->creating = true;
    const ps_job_conf_t *j = &srv->m.job;
    uint32_t magic = 0;
    if (saved && saved_len >= sizeof magic) memcpy(&magic, saved, sizeof magic);
    bool v2 = magic == COORD_MAGIC_V2 && saved_len == sizeof(saved_v2_t);
    bool v3 = magic == COORD_MAGIC_V3 && saved_len == sizeof(saved_v3_t);
    /* CRD4: coord_saved_t itself, up to the queued batches of its re-hand queue. */
    size_t head = offsetof(coord_saved_t, cur.rehand);
    uint32_t queued = UINT32_MAX; /* the batches its re-hand queue says it holds */
    if (saved && saved_len >= head)
        memcpy(&queued, (const char *)saved + offsetof(coord_saved_t, cur.nrehand), sizeof queued);
    bool v4 = saved && magic == COORD_MAGIC_V4 && saved_len >= head &&
              queued <= PS_REHAND_MAX && saved_len == head + queued * sizeof(ps_batch_t);
    bool cur = saved && magic == COORD_MAGIC && state_unpack(&co->s, saved, saved_len);
    if (saved && !v2 && !v3 && !v4 && !cur)
        PS_LOG(PS_LOG_WARN, "coord", "the stored coordinator state (%zu bytes, magic %#x) is not "
               "one this psd reads: the job's steps and batches start over", saved_len, magic);
    if (v2 || v3 || v4 || cur) {
        if (v4) {
            memcpy(&co->s, saved, saved_len); /* the rest stays zero (calloc) */
            co->s.magic = COORD_MAGIC;
            PS_LOG(PS_LOG_INFO, "coord", "the stored coordinator state is an older psd's "
                   "(CRD4, %zu bytes): converted", saved_len);
        } else if (!cur) { /* @p saved is aligned for them (server.h) */
            state_from_old(&co->s, v2 ? saved : NULL, v2 ? NULL : saved);
            PS_LOG(PS_LOG_INFO, "coord", "the stored coordinator state is an older psd's "
                   "(%s): converted", v2 ? "CRD2" : "CRD3");
        }
        /* What failures had left to settle, as last saved (with this state or before it). */
        uint32_t rec_magic = 0;
        if (rec && rec_len >= sizeof rec_magic) memcpy(&rec_magic, rec, sizeof rec_magic);
        bool rec_v2 = rec_magic == COORD_REC_MAGIC_V2 && rec_len == sizeof(rec_v2_t);
        bool rec_read = rec && (rec_v2 || rec_len == sizeof co->rec);
        if (rec && !rec_read)
            PS_LOG(PS_LOG_WARN, "coord", "the stored recovery state (%zu bytes) is not one this "
                   "psd reads: left out", rec_len);
        if (rec_v2) {
            rec_from_v2(&co->rec, rec);
            PS_LOG(PS_LOG_INFO, "coord", "the stored recovery state is an older psd's (REC2): "
                   "converted");
        } else if (rec_read) {
            memcpy(&co->rec, rec, sizeof co->rec);
            if (co->rec.magic != COORD_REC_MAGIC) {
                PS_LOG(PS_LOG_WARN, "coord", "the stored recovery state (magic %#x) is not one "
                       "this psd reads: left out", co->rec.magic);
                memset(&co->rec, 0, sizeof co->rec);
                co->rec.magic = COORD_REC_MAGIC;
                rec_read = false;
            }
        }
        /* Counts that index arrays, as a damaged store or another psd could hold them: a
         * batch's tag words (the words beyond are dropped; the re-hand queue's count was
         * checked against the stored length, or cut by state_from_old). */
        uint32_t clamped = 0;
        for (uint32_t i = 0; i < co->s.cur.nrehand; i++)
            clamped += clamp_tags(&co->s.cur.rehand[i]);
        for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
            clamped += clamp_tags(&co->s.m[r].batch) + clamp_tags(&co->rec.rc_batch[r]);
            co->rt[r].batch_seen = co->s.m[r].has_batch; /* it may have had the reply */
        }
        if (clamped)
            PS_LOG(PS_LOG_WARN, "coord", "the stored coordinator state had %u counts out of range "
                   "(re-hand queue, replay tags): cut to their limits", clamped);
        co->m_hi = members_hi(&co->s, &co->rec); /* the members stored from now on */
        /* The members' host names go into status JSON and logs: kept as a hello's are
         * (host_safe), also from a state some other psd wrote or the disk damaged. */
        for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
            char *h = co->s.m[r].host;
            h[sizeof co->s.m[r].host - 1] = '\0';
            char safe[sizeof co->s.m[r].host] = {0}; /* saved whole: no stray bytes */
            host_safe(safe, sizeof safe, h);
            memcpy(h, safe, sizeof safe);
        }
        /* Epochs made after the save (joins, removals) are lost with the crash, but the
         * other shards know them: jump past anything that can have been handed out. */
        co->s.epoch = (co->s.epoch | 0xFFFFFull) + 1;
        /* Join serials likewise: a serial handed out after the save went to a worker the other
         * shards may have seen (and dropped as silent: server.c refuses that join there), so
         * a new worker must never get it again. */
        co->s.joins = (co->s.joins | 0xFFFFFull) + 1;
        bool reopened = false;
        if (co->s.finished && (j->max_steps == 0 || j->max_steps > co->s.step) &&
            !ps_cursor_exhausted(&co->s.cur)) {
            /* Ended by a job.max_steps the manifest has raised (or lifted) since: it goes on. */
            PS_LOG(PS_LOG_INFO, "coord", "the job ended at step %llu; job.max_steps is %llu now: "
                   "it goes on", (unsigned long long)co->s.step,
                   (unsigned long long)j->max_steps);
            co->s.finished = 0;
            reopened = true;
        }
        /* asp / ssp: a member that did its job.max_steps means no start is granted (capped), as
         * before the restart; its saved slot keeps its count until a newcomer takes the rank.
         * Before, a restart forgot it, and pslaunch --follow started workers that did
         * max_steps more. */
        if (!is_bsp(srv) && j->max_steps && !co->s.finished)
            for (uint32_t r = 0; r < PS_MAX_RANKS && !co->capped; r++)
                co->capped = co->s.m[r].join_serial && co->s.m[r].steps_done >= j->max_steps;
        /* Members are expected back (libps reconnects with their rank). */
        uint32_t words = 0;
        for (uint32_t i = 0; i < co->s.cur.nrehand; i++) words += co->s.cur.rehand[i].nreplay;
        PS_LOG(PS_LOG_INFO, "coord", "restored: epoch %llu, step %llu, %u members, %llu samples "
               "applied, %u batches to hand out again (%u replay tag words)",
               (unsigned long long)co->s.epoch, (unsigned long long)co->s.step,
               popcount(co->s.active), (unsigned long long)co->s.cur.applied_total,
               co->s.cur.nrehand, words);
        if (is_bsp(srv)) {
            /* A restored open step's members are in the view the pushes are checked with. */
            psd_shard_learn_view(srv, co->s.epoch, co->s.step, co->s.step_members, false);
            co->told_unlearnt = true; /* psd_coord_tick */
            /* The state was saved when the step's apply began (or later); if that apply
             * committed here, every member had pushed the step: it counts, and the next step
             * is open. Another shard may not have applied it yet: rc_step below. */
            uint64_t applied = psd_shard_step(srv);
            /* The ranks that had a batch of the open step and left it (their batch_step and
             * batch stay): no joiner gets one before the step closes, since a chunk's apply of
             * the step may name them (replay_had in push.c). */
            for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
                const saved_member_t *m = &co->s.m[r];
                if (!(co->s.active >> r & 1) && m->batch.count && m->batch_step == co->s.step)
                    co->rec.removed_in_step |= 1ull << r;
            }
            /* A step every member left goes out again (below); one with members gone may have
             * gone out again already, which the saved emptied_step1 tells, and only a store
             * without jobrec cannot: then it closes only once every member reported it
             * (again_reported), so that a stale batch goes out again. */
            bool emptied = co->s.step_members == 0 && co->rec.removed_in_step;
            if (!co->s.finished && (emptied || (!rec_read && co->rec.removed_in_step)))
                co->rec.emptied_step1 = co->s.step + 1;
            if (co->s.step_members == 0 && co->rec.removed_in_step && !co->s.finished) {
                /* Every member left the open step: a chunk may have applied it (here or on
                 * another shard) while the others wait for it. It goes out again, as when
                 * that happens while this shard runs (member_remove). */
                PS_LOG(PS_LOG_INFO, "coord", "step %llu: every member had left it (applied "
                       "here: %s); it goes out again", (unsigned long long)co->s.step,
                       applied > co->s.step ? "yes" : "no");
                applied = co->s.step; /* not closed */
            } else if (co->rec.emptied_step1 == co->s.step + 1 && !co->s.finished &&
                       applied > co->s.step) {
                /* A step handed out again after every member left it: this shard's chunks
                 * passed it before, which says nothing of its members' pushes now (one may not
                 * even have had its batch's reply). It closes as while this shard ran: once
                 * every member reported it or left (again_reported, saved with each report).
                 * Closed here, a member that never had its batch went on to the next step,
                 * and a shard still at this one waited for its push for good. */
                bool all = (co->s.step_members & ~co->rec.again_reported) == 0;
                PS_LOG(PS_LOG_INFO, "coord", "step %llu went out again after its members left: %s",
                       (unsigned long long)co->s.step,
                       all ? "every member had reported it; it closes now"
                           : "it stays open until its members report it");
                /* With every report saved, the close is due (its hand-out was answered only once
                 * committed, so nobody had it: close_step). */
                if (!all) applied = co->s.step;
            }
            /* A step of this run may wait elsewhere for a member that does not come back:
             * remember whose batches it had (restore_closed_lost). So may the last step of the
             * checkpoint a restore started this run from (base_step - 1): a member may have
             * left it part-way, its pushes applied on some chunks only (their records of whose
             * pushes they applied came with them). The steps before are applied everywhere. */
            if (applied == co->s.step + 1 && co->s.step + 1 >= srv->run.base_step &&
                !co->s.finished) {
                co->rec.rc_step = co->s.step;
                co->rec.rc_view = co->s.step_members;
                co->rec.rc_unsettled = co->rec.rc_pending = 0;
                for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
                    const saved_member_t *m = &co->s.m[r];
                    if ((co->s.step_members >> r & 1) && m->has_batch &&
                        m->batch_step == co->s.step) {
                        co->rec.rc_batch[r] = m->batch;
                        co->rec.rc_pending |= 1ull << r;
                    }
                }
                restored_applied(srv);
            }
            while (co->s.step < applied && !co->s.finished) close_step(srv);
            /* The members it had get the open step's batches, as its close would have given
             * them (they are expected back, or handed on when they are removed). */
            if (reopened && co->s.step_members == 0) hand_out(srv);
        }
    } else {
        co->s.magic = COORD_MAGIC;
        co->s.desired = j->workers;
        co->s.step = psd_shard_step(srv);
        ps_cursor_init(&co->s.cur, 0, j->batch_size, j->epochs);
    }
    /* Saved before anything is handed out: a second restart bumps the epoch past this one's
     * (no store job runs yet: the loop has not started). */
    co->creating = false;
    co->rec.magic = COORD_REC_MAGIC;
    co->save.len = state_pack(&co->s, co->m_hi, co->save.s); /* no save is queued yet */
    int rc = save_now(&srv->store, co->save.s, co->save.len, &co->rec);
    if (rc) {
        co->rec_dirty = true; /* the next apply job writes it */
        co->save_retry = true; /* and psd_coord_tick tries again; bsp's batches and end wait */
        co->handout_gen = co->save_gen + 1; /* for that save (what create decided is in it) */
        PS_LOG(PS_LOG_ERROR, "coord", "cannot save the coordinator's state: %s (a restart "
               "before the next step may reuse epoch numbers)", ps_strerror(rc));
    }
    return 0;
}

void psd_coord_free(psd_server_t *srv)
{
    free(srv->coord);
    srv->coord = NULL;
}

size_t psd_coord_state_pack(psd_server_t *srv, void *out)
{
    return state_pack(&srv->coord->s, srv->coord->m_hi, out);
}

const void *psd_coord_rec(psd_server_t *srv, size_t *len)
{
    psd_coord_t *co = srv->coord;
    if (!co->rec_dirty) return NULL;
    co->rec_dirty = false;
    *len = sizeof co->rec;
    return &co->rec;
}

void psd_coord_rec_unsaved(psd_server_t *srv)
{
    if (srv->coord) srv->coord->rec_dirty = true;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

#define OUT(...)                                                                      \
    do {                                                                              \
        int n_ = snprintf(out + *len, cap - *len, __VA_ARGS__);                       \
        if (n_ > 0) *len = *len + (size_t)n_ < cap ? *len + (size_t)n_ : cap - 1;     \
    } while (0)

void psd_coord_metrics(psd_server_t *srv, psd_prom_t *p)
{
    const psd_coord_t *co = srv->coord;
    uint64_t n = co->ngaps < GAP_RING ? co->ngaps : GAP_RING, gmax = 0;
    for (uint64_t i = 0; i < n; i++)
        if (co->gaps[i] > gmax) gmax = co->gaps[i];
    psd_prom_u64(p, "psd_job_membership_epoch", "gauge",
                 "Membership epoch of the bsp steps: grows when a step's members differ from "
                 "the step before's (the next multiple of 2^20 after a restart of shard 0); asp / "
                 "ssp: 0",
                 co->s.epoch);
    psd_prom_u64(p, "psd_job_open_step", "gauge", "The step being handed out (bsp) or the "
                 "highest reported (asp / ssp)", co->s.step);
    psd_prom_u64(p, "psd_job_workers_desired", "gauge",
                 "Workers wanted (job.workers, then psctl scale)", co->s.desired);
    psd_prom_u64(p, "psd_job_workers", "gauge", "Workers that are members now",
                 (uint64_t)popcount(co->s.active));
    psd_prom_u64(p, "psd_job_finished", "gauge", "1 once every pass of the training set is "
                 "applied", co->s.finished ? 1 : 0);
    psd_prom_u64(p, "psd_job_samples_applied_total", "counter",
                 "Training samples whose batches were applied, over all passes",
                 co->s.cur.applied_total);
    psd_prom_u64(p, "psd_job_batches_handed_again_total", "counter",
                 "Batches handed out again after their worker left or died",
                 co->s.cur.handed_again);
    psd_prom_u64(p, "psd_job_state_save_failures_total", "counter",
                 "Failed writes of the coordinator's state since this psd started (each is "
                 "retried)", co->save_failures_total);
    psd_prom_u64(p, "psd_job_state_save_failing", "gauge",
                 "Writes of the coordinator's state failed in a row now (0: the last one "
                 "committed)", co->save_failures);
    psd_prom_u64(p, "psd_job_late_members_dropped_total", "counter",
                 "Members dropped for holding the others past job.step_timeout_ms (bsp: no push "
                 "of the open step; ssp: no batch reported while another waits)",
                 srv->late_drops);
    psd_prom_u64(p, "psd_job_steps_closed_without_members_total", "counter",
                 "bsp steps every member had left that were closed with none, since this psd "
                 "started, so that workers could join (their ranks were all held)",
                 co->deserted);
    psd_prom_u64(p, "psd_job_batches_suspect_total", "counter",
                 "Batches that 3 workers in turn had and left with (died, "
                 "dropped, left) since this psd started: samples that may make workers fail "
                 "(shard 0's log names them)", co->suspect);
    psd_prom_f64(p, "psd_job_step_gap_max_seconds",
                 "Longest gap between two consecutive steps among the last 4096 (bsp)",
                 (double)gmax / 1e3);
}

void psd_coord_status_json(psd_server_t *srv, char *out, size_t cap, size_t *len)
{
    psd_coord_t *co = srv->coord;
    uint64_t now = uv_now(srv->loop);
    uint64_t n = co->ngaps < GAP_RING ? co->ngaps : GAP_RING, gmax = 0, gmed = 0;
    static uint64_t sorted[GAP_RING];
    memcpy(sorted, co->gaps, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_u64);
    if (n) {
        gmax = sorted[n - 1];
        gmed = sorted[n / 2];
    }
    OUT("\"epoch\": %llu, \"open_step\": %llu, \"open_step_members\": %u, \"desired_workers\": "
        "%u, \"actual_workers\": %u, \"finished\": %s, \"samples\": %llu, \"samples_applied\": %llu, \"batches_handed_again\": "
        "%llu, \"step_gap_ms_max\": %llu, \"step_gap_ms_median\": %llu, \"step_gaps\": %llu, "
        "\"state_save_failures\": %llu, \"state_save_failing\": %u, \"checkpoint_hold\": %s, "
        "\"checkpoint_hold_users\": %u, \"steps_closed_without_members\": %llu, "
        "\"batches_suspect\": %llu, ",
        (unsigned long long)co->s.epoch, (unsigned long long)co->s.step,
        is_bsp(srv) ? popcount(co->s.step_members) : 0, co->s.desired,
        popcount(co->s.active), co->s.finished ? "true" : "false",
        (unsigned long long)co->s.cur.n, (unsigned long long)co->s.cur.applied_total,
        (unsigned long long)co->s.cur.handed_again, (unsigned long long)gmax,
        (unsigned long long)gmed, (unsigned long long)n,
        (unsigned long long)co->save_failures_total, co->save_failures,
        co->hold_ms ? "true" : "false", co->hold_users, (unsigned long long)co->deserted,
        (unsigned long long)co->suspect);
    OUT("\"step_gaps_top\": [");
    for (int i = 0, f = 1; i < 16; i++)
        if (co->top[i].ms) {
            OUT("%s{\"step\": %llu, \"ms\": %llu}", f ? "" : ", ",
                (unsigned long long)co->top[i].step, (unsigned long long)co->top[i].ms);
            f = 0;
        }
    OUT("], \"passes\": [");
    uint64_t first = co->s.cur.pass >= PS_PASS_RING ? co->s.cur.pass - PS_PASS_RING + 1 : 0;
    for (uint64_t p = first; p <= co->s.cur.pass && p < co->s.cur.passes; p++)
        OUT("%s{\"pass\": %llu, \"applied\": %llu}", p == first ? "" : ", ",
            (unsigned long long)p, (unsigned long long)ps_cursor_pass_applied(&co->s.cur, p));
    OUT("], \"members\": [");
    int firstm = 1;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(co->s.active >> r & 1)) continue;
        const saved_member_t *m = &co->s.m[r];
        const member_rt_t *rt = &co->rt[r];
        double up = (double)(now - rt->joined_ms) / 1000.0;
        uint64_t since = m->steps_done > rt->steps_at_join ? m->steps_done - rt->steps_at_join : 0;
        OUT("%s{\"rank\": %u, \"pid\": %u, \"host\": \"%s\", \"steps\": %llu, "
            "\"steps_per_s\": %.2f, \"last_heard_ms\": %lld, \"in_step\": %s}",
            firstm ? "" : ", ", r, m->pid, m->host, (unsigned long long)m->steps_done,
            rt->joined_ms && up > 0 ? (double)since / up : 0.0,
            rt->conn ? (long long)psd_now_ms() - (long long)rt->conn->last_seen_ms : -1LL,
            (co->s.step_members >> r & 1) ? "true" : "false");
        firstm = 0;
    }
    OUT("]");
}
