/* coord_state.c: the coordinator's stored state ("job", "jobrec") and its older forms,
 * creating the coordinator from it at psd's start, its status and metrics. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_internal.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"

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
size_t psd__state_pack(const coord_saved_t *s, uint32_t nm, void *out)
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

/* Whether stored batch @p b (one a member holds, the re-hand queue's, a recovery's) lies
 * outside cursor @p c: no samples, or past the training set's end once that is known. */
static bool batch_out(const ps_cursor_t *c, const ps_batch_t *b)
{
    return b->count == 0 || b->pass >= c->passes ||
           (c->n && (b->offset >= c->n || b->count > c->n - b->offset));
}

/* What is out of range in the restored cursor, its members' and recovery's batches, into
 * @p why (empty: nothing): a damaged store handed out batches past the training set's end
 * (the workers read past their datasets: SIGSEGV), or never ended the job (a helper's probe of
 * damaged stores, session 61). */
static void cursor_damaged(const coord_saved_t *s, const coord_rec_t *rec, char *why,
                           size_t len)
{
    const ps_cursor_t *c = &s->cur;
    why[0] = '\0';
    if (c->batch == 0 || c->passes == 0 || c->passes > PS_MAX_EPOCHS || c->pass > c->passes ||
        (c->n && c->offset > c->n)) {
        snprintf(why, len, "its cursor is at pass %llu of %llu, sample %llu of %llu, batches of "
                 "%u", (unsigned long long)c->pass, (unsigned long long)c->passes,
                 (unsigned long long)c->offset, (unsigned long long)c->n, c->batch);
        return;
    }
    const ps_batch_t *bad = NULL;
    const char *whose = "";
    for (uint32_t i = 0; i < c->nrehand && !bad; i++)
        if (batch_out(c, &c->rehand[i])) bad = &c->rehand[i], whose = "a batch to hand out again";
    for (uint32_t r = 0; r < PS_MAX_RANKS && !bad; r++) {
        if (s->m[r].batch.count && batch_out(c, &s->m[r].batch))
            bad = &s->m[r].batch, whose = "a member's batch";
        else if (rec->rc_batch[r].count && batch_out(c, &rec->rc_batch[r]))
            bad = &rec->rc_batch[r], whose = "a recovering step's batch";
    }
    if (bad)
        snprintf(why, len, "%s is samples %llu + %u of pass %llu, of %llu samples and %llu "
                 "passes", whose, (unsigned long long)bad->offset, bad->count,
                 (unsigned long long)bad->pass, (unsigned long long)c->n,
                 (unsigned long long)c->passes);
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
    co->chunks_saved_step = UINT64_MAX;
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
        char why[200];
        cursor_damaged(&co->s, &co->rec, why, sizeof why);
        if (why[0]) {
            PS_LOG(PS_LOG_ERROR, "coord", "the stored coordinator state is damaged: %s ("
                   PSD_STORE_DAMAGED_REMEDY ")", why);
            return PS_ESTORE; /* psd_coord_free frees it */
        }
        co->m_hi = members_hi(&co->s, &co->rec); /* the members stored from now on */
        /* The members' host names go into status JSON and logs: kept as a hello's are
         * (host_safe), also from a state some other psd wrote or the disk damaged. */
        for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
            char *h = co->s.m[r].host;
            h[sizeof co->s.m[r].host - 1] = '\0';
            char safe[sizeof co->s.m[r].host] = {0}; /* saved whole: no stray bytes */
            psd__host_safe(safe, sizeof safe, h);
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
        /* A raised job.epochs adds passes, as a raised job.max_steps adds steps (an operator
         * probe, session 61: a job made for 2 epochs stayed finished under a manifest of 4). A
         * lowered one is not taken: batches of the passes past it may be in flight or queued. */
        if (j->epochs > co->s.cur.passes) {
            PS_LOG(PS_LOG_INFO, "coord", "job.epochs raised from %llu to %llu: the job goes on "
                   "for the passes it adds (a tensor's learning-rate schedule keeps the length "
                   "it was declared with)", (unsigned long long)co->s.cur.passes,
                   (unsigned long long)j->epochs);
            co->s.cur.passes = j->epochs;
        }
        if (co->s.finished && (j->max_steps == 0 || j->max_steps > co->s.step) &&
            !ps_cursor_exhausted(&co->s.cur)) {
            /* Ended by a job.max_steps or job.epochs the manifest has raised (or lifted) since:
             * it goes on. */
            PS_LOG(PS_LOG_INFO, "coord", "the job ended at step %llu; job.max_steps is %llu and "
                   "job.epochs %llu now: it goes on", (unsigned long long)co->s.step,
                   (unsigned long long)j->max_steps, (unsigned long long)co->s.cur.passes);
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
        /* The cursor keeps the job as it was made: a manifest edited since is not taken for
         * these two (job.max_steps is, above). Said, as workers of another batch_size are
         * refused (psd_coord_on_batch). */
        if (co->s.cur.batch != j->batch_size || co->s.cur.passes != j->epochs)
            PS_LOG(PS_LOG_WARN, "coord", "the job in this store has job.batch_size %u and "
                   "job.epochs %llu; the manifest says %u and %llu: the job goes on with its "
                   "batch_size and its epochs (a raised job.epochs is taken, a lowered one not), "
                   "and refuses workers of another batch_size (another job needs empty "
                   "data_dirs)", co->s.cur.batch, (unsigned long long)co->s.cur.passes,
                   j->batch_size, (unsigned long long)j->epochs);
        if (is_bsp(srv)) {
            /* A restored open step's members are in the view the pushes are checked with. */
            psd_shard_learn_view(srv, co->s.epoch, co->s.step, co->s.step_members, false);
            co->told_unlearnt = true; /* psd_coord_tick */
            /* The state was saved when the step's apply began (or later); if that apply
             * committed here, every member had pushed the step: it counts, and the next step
             * is open. Another shard may not have applied it yet: rc_step below. Chunks below
             * the open step are of tensors no member pushes (a model's tensors declared by
             * another that left, a head no longer trained): not what the step's apply
             * committed. Their lowest version kept such a step open after it had closed and
             * the next had gone out, so a member that died with this shard had its batch of
             * that next step, applied elsewhere, handed out again untagged and applied twice
             * (a probe, session 68). */
            uint64_t applied = psd_shard_step_from(srv, co->s.step);
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
            while (co->s.step < applied && !co->s.finished) psd__close_step(srv);
            /* The members it had get the open step's batches, as its close would have given
             * them (they are expected back, or handed on when they are removed). */
            if (reopened && co->s.step_members == 0) psd__hand_out(srv);
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
    co->save.len = psd__state_pack(&co->s, co->m_hi, co->save.s); /* no save is queued yet */
    int rc = psd__save_now(&srv->store, co->save.s, co->save.len, &co->rec);
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
    return psd__state_pack(&srv->coord->s, srv->coord->m_hi, out);
}

const void *psd_coord_rec(psd_server_t *srv, size_t *len)
{
    psd_coord_t *co = srv->coord;
    if (!co->rec_dirty) return NULL;
    co->rec_dirty = false;
    *len = sizeof co->rec;
    return &co->rec;
}

void psd_coord_state_committed(psd_server_t *srv, uint64_t step)
{
    if (srv->coord) srv->coord->chunks_saved_step = step;
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
    psd_coord_t *co = srv->coord; /* samples_shown kept up to date here */
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
    /* The net count goes back when a batch counted as applied is handed out again (its worker
     * left before every shard had applied it): a counter must not, or Prometheus takes it for
     * a restart and counts the whole value again (a review, session 71). The highest so far. */
    if (co->s.cur.applied_total > co->samples_shown)
        co->samples_shown = co->s.cur.applied_total;
    psd_prom_u64(p, "psd_job_samples_applied_total", "counter",
                 "Training samples whose batches were applied, over all passes (the most so far "
                 "since psd started: a batch handed out again is not counted twice)",
                 co->samples_shown);
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

