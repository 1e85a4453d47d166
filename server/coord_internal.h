/* coord_internal.h: shard 0's coordinator, its state and what its modules share (psd__;
 * server.h has psd_coord_*, what the rest of psd calls). The modules:
 *   coord.c        members and their requests (hello, batch, leave, the cron's checks),
 *                  saving the state on its own;
 *   coord_steps.c  replies, bsp steps (members, hand-out, close), asp / ssp service;
 *   coord_state.c  the stored state and its older forms, creating the coordinator from it (and
 *                  freeing it), its status and metrics;
 *   coord_ckpt.c   checkpoint holds (psctl checkpoint's cut);
 *   coord_scale.c  psctl scale and pslaunch's launch reports.
 * Everything runs on the loop thread, but what says otherwise (the save's slot work). coord.c's
 * head comment says how the coordinator works. */
#ifndef PSD_COORD_INTERNAL_H
#define PSD_COORD_INTERNAL_H

#include "batches.h"
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

typedef struct {
    psd_conn_t *conn;         /* NULL while a member is expected back: after a restart of
                                 this shard, or after its connection closed (lost_ms) */
    uint64_t lost_ms;         /* when its connection closed (0: it did not) */
    int parked;               /* a batch request waits for an answer */
    uint64_t park_req;        /* its request id (or a report's: reporting) */
    int reporting;            /* a batch done reported alone (PS_FLAG_REPORT) waits for the
                                 save that holds it (report_gen) to be answered */
    uint64_t report_gen;
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
    bool batch_seen;          /* its batch's reply went out (bsp hands a member its next batch
                                 as the step opens, before it asks): ps_batch_t.left counts it.
                                 True after a restart of this shard for a member with a batch */
    bool known;               /* every batch reply it had came from this process (it joined
                                 here, or had one from here since): batch_seen false then means
                                 it never had its batch. False after a restart of this shard: a
                                 batch handed out again here may be one it had before */
    uint32_t launcher;        /* the pid of the pslaunch that started it on its host, as its
                                 hello said (0: none, or an older libps; grants_seen) */
} member_rt_t;

typedef struct {
    char host[64];
    uint32_t pid;
    uint32_t running;
    uint32_t stopping; /* its workers told to stop that still run (0 from an older pslaunch) */
    uint32_t poll_ms;  /* how often it reports (0: an older pslaunch) */
    bool says_stops;   /* `stopping` is its word on every stop it made (PS_FLAG_REPORT) */
    uint64_t last_ms;
} launcher_t;

struct psd_coord_s {
    coord_saved_t s;
    uint32_t m_hi;             /* the members a save keeps: s.m[m_hi..] are zeros, of ranks
                                  that never joined (members_hi, and each join) */
    member_rt_t rt[PS_MAX_RANKS];
    uint64_t samples_shown;    /* psd_job_samples_applied_total's last value: a counter never
                                  goes down while psd runs, though s.cur's net count does when a
                                  counted batch is handed out again (psd_coord_metrics) */
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
    int32_t final_lead;        /* 1 + the rank that evaluates the finished job (the lowest
                                  member when the first finished reply went; 0: none yet): its
                                  later replies do not hand PS_FLAG_LEAD to the next rank when
                                  it leaves first (psd__reply_batch) */
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
    uint64_t chunks_saved_step; /* bsp: the open step of the state the last apply job here
                                  committed (psd_coord_state_committed; UINT64_MAX: none since
                                  this psd started): its close is derived from this shard's
                                  chunks after a restart, any other close is saved first */
    bool creating;             /* psd_coord_create saves once at its end, itself */
    coord_rec_t rec;           /* bsp: what failures leave to settle (saved as "jobrec") */
    bool rec_dirty;            /* rec changed since a save took its copy (rec_changed) */
};

static inline bool is_bsp(const psd_server_t *srv)
{
    return srv->m.job.consistency == PS_CONSIST_BSP;
}

static inline uint32_t popcount(uint64_t x) { return (uint32_t)__builtin_popcountll(x); }

/* ---- saving the state (coord.c) --------------------------------------------------------- */

/* The recovery state changed: the next apply job (psd_coord_rec) or psd__coord_save writes it. */
void psd__rec_changed(psd_coord_t *co);
/* Write state @p s (@p len bytes) and @p rec in one transaction of @p st. 0 or a PS_E* code.
 * Wherever the store may be written: the slot's pool thread (or the loop thread when the pool
 * refused the work), or psd_coord_create. */
int psd__save_now(psd_store_t *st, const void *s, size_t len, const coord_rec_t *rec);
/* Test hooks: the next save queued kills this psd (@p hook named in the log), or fails. */
void psd__crash_in_next_save(psd_coord_t *co, const char *hook);
void psd__fail_next_save(psd_coord_t *co);
/* Save the state on its own (slot work between store jobs); a save while one runs follows it;
 * a failed one is retried by psd_coord_tick. */
void psd__coord_save(psd_server_t *srv);
/* psd__coord_save; @return the number of the save that holds the change (0: none needed). */
uint64_t psd__coord_save_gen(psd_server_t *srv);
/* bsp: save a change a restart could not re-derive, and answer batches only once committed. */
void psd__hold_handouts(psd_server_t *srv);
/* Now on the loop's clock, never 0 (hold_ms 0 means no hold). */
uint64_t psd__hold_now(const psd_server_t *srv);
/* A peer's host name @p s as psd keeps it, into @p out[@p cap]: host name characters, '?' for
 * anything else. */
void psd__host_safe(char *out, size_t cap, const char *s);

/* ---- requests (coord.c) ----------------------------------------------------------------- */

/* Answer the members whose batch request waits and whose batch (or the end) may go now. */
void psd__serve_parked(psd_server_t *srv);

/* ---- steps and batches (coord_steps.c) -------------------------------------------------- */

/* Answer member @p r's parked batch request with its batch (or the end). */
void psd__reply_batch(psd_server_t *srv, uint32_t r);
/* Tell every member the open step's members changed. */
void psd__broadcast_epoch(psd_server_t *srv);
/* Tell the members again the closed views a shard may still wait for (rec.told). */
void psd__tell_closed(psd_server_t *srv);
/* Tag batch @p b with @p tag, saying so when that drops its oldest tag. */
void psd__batch_tag(ps_batch_t *b, uint64_t tag);
/* Give batch @p b back to the cursor tagged @p tag (uncounted first if @p counted). */
void psd__regive(psd_server_t *srv, ps_batch_t b, uint64_t tag, bool counted);
/* Removed rank @p r was a member of the step this shard's restart closed: that step goes on
 * without it, and its batch goes out again tagged. */
void psd__restore_closed_lost(psd_server_t *srv, uint32_t r);
/* bsp: the open step's members are now @p members (a new epoch, told to the members). */
void psd__set_members(psd_server_t *srv, uint64_t members);
/* Hand every member of the job a batch of the open step, in rank order. */
void psd__hand_out(psd_server_t *srv);
/* The open step is applied everywhere: count its batches, advance, hand out the next. */
void psd__close_step(psd_server_t *srv);
/* bsp: close the open step with no member when its deserters hold every free rank. @return
 * whether it closed it. */
bool psd__close_deserted_step(psd_server_t *srv);
/* A step with no members left: hand it out again once workers are there. */
void psd__maybe_restart_step(psd_server_t *srv);
/* asp / ssp: the batches handed out and not reported or given back yet. */
uint32_t psd__in_flight(const psd_coord_t *co);
/* ssp: the slowest member's steps done. */
uint64_t psd__slowest(const psd_coord_t *co);
/* asp / ssp with job.max_steps: the job is complete once every member did its steps. */
void psd__async_maybe_finished(psd_server_t *srv);
/* asp / ssp: serve member @p r's batch request from the cursor, if it may have one now. */
void psd__serve_async(psd_server_t *srv, uint32_t r);

/* ---- the stored state (coord_state.c) --------------------------------------------------- */

/* @p s with members m[0..@p nm) stored, into @p out (PSD_COORD_STATE_MAX bytes). @return its
 * length. */
size_t psd__state_pack(const coord_saved_t *s, uint32_t nm, void *out);

#endif
