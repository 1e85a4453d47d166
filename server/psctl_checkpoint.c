/* psctl_checkpoint.c: `psctl checkpoint [--dir D]` (and the half of --follow's checkpoints that
 * arms and waits: psctl_checkpoint_run). verify --against, repair and restore: psctl_repair.c.
 *
 * checkpoint: shard 0 picks the step (MSG_CKPT_BEGIN; bsp: the step after the open one, whose
 * hand-out it holds; asp / ssp: it holds every hand-out, and answers "pending", asked again
 * every 20 ms, until the batches in flight are applied everywhere), every shard is told to
 * checkpoint at that step into D/shard-K (MSG_CKPT_ARM), the hold is released (MSG_CKPT_GO),
 * and each shard is asked every 20 ms how it is going (MSG_CKPT_STATUS) until all are done or
 * --wait seconds passed. Under bsp a checkpoint waiting for the step after an open step whose
 * members all left moves to the open step when no shard applied any of it (move_earlier). D
 * defaults to <parent of shard 0's data_dir>/checkpoints/step-S (asp / ssp, or step-S holding a
 * checkpoint already: time-<unix time in ms>); a relative D is made absolute here, since psd
 * runs elsewhere. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_meta.h"
#include "jsonfield.h"
#include "ps/ps_error.h"
#include "sigignored.h"
#include "psctl_client.h"

double psctl_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int psctl_absolute(char *out, size_t cap, const char *dir)
{
    /* Before, the working directory's path was cut at 500 bytes (from a deeper one a relative
     * D named another place) and a failed getcwd left D relative (a review, session 71). */
    char cwd[PATH_MAX];
    size_t ld = strlen(dir), lc = 0;
    if (dir[0] != '/') {
        if (getcwd(cwd, sizeof cwd) == NULL) return PS_EINVAL;
        lc = strlen(cwd) + 1; /* and its '/' */
    }
    if (lc + ld >= cap) return PS_EINVAL;
    if (lc) {
        memcpy(out, cwd, lc - 1);
        out[lc - 1] = '/';
    }
    memcpy(out + lc, dir, ld + 1);
    return 0;
}

char *psctl_status_json(ps_req_t *cl, uint32_t i, char *err, size_t errlen, int *rc)
{
    ps_msg_t q = {.type = PS_MSG_STATUS, .rank = -1}, r;
    void *data = NULL;
    size_t len = 0;
    int called = ps_req_call(cl, i, &q, &r, &data, &len, err, errlen);
    if (rc) *rc = called ? called : PS_ENOMEM;
    if (called) return NULL;
    char *json = calloc(1, len + 1);
    if (json == NULL) snprintf(err, errlen, "out of memory");
    else if (data) memcpy(json, data, len);
    free(data);
    return json;
}

/* ---- checkpoint ------------------------------------------------------------------------ */

int psctl_checkpoint_dir(const ps_manifest_t *m, const char *base_in, uint64_t step, char *out,
                         size_t cap)
{
    char tmp[PS_PATH_MAX + 64], base[PS_PATH_MAX + 32];
    if (base_in && base_in[0])
        snprintf(base, sizeof base, "%s", base_in);
    else
        snprintf(base, sizeof base, "%s/../checkpoints", m->servers[0].data_dir);
    if (step == UINT64_MAX) { /* in ms: two in one second (a fast job's every_steps) collided,
                                 and the second failed as "already holds a checkpoint" */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(tmp, sizeof tmp, "%s/time-%lld", base,
                 (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
    }
    else
        snprintf(tmp, sizeof tmp, "%s/step-%llu", base, (unsigned long long)step);
    if (psctl_absolute(out, cap, tmp)) return PS_EINVAL;
    return strlen(out) < PS_CKPT_DIR_MAX ? 0 : PS_EINVAL;
}

/* Shard @p j's part of checkpoint @p dir: only the files a checkpoint writes, then shard-J
 * (anything else in it makes its removal fail, and it stays). shard-J is opened without
 * following a symbolic link and its files are removed through that descriptor, so nothing
 * behind a link is touched, also if one is put there meanwhile: a shard-J that is not a
 * directory is left, -ENOTDIR. @return 0 (also when there is none, or @p dir lies under a
 * file), or -errno. */
static int remove_part(const char *dir, uint32_t j)
{
    static const char *const files[] = {"data.mdb", "lock.mdb", PSD_CKPT_META, PSD_CKPT_META ".tmp"};
    char name[24];
    snprintf(name, sizeof name, "shard-%u", j);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
    int rc = 0, pfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0) { /* never made, or its shard removed it; ELOOP: a symbolic link */
        rc = errno == ENOENT ? 0 : errno == ELOOP || errno == ENOTDIR ? -ENOTDIR : -errno;
    } else {
        for (size_t f = 0; f < sizeof files / sizeof *files && rc == 0; f++)
            if (unlinkat(pfd, files[f], 0) != 0 && errno != ENOENT) rc = -errno;
        close(pfd);
        if (rc == 0 && unlinkat(dfd, name, AT_REMOVEDIR) != 0) rc = -errno;
    }
    close(dfd);
    return rc;
}

int psctl_checkpoint_remove(const char *dir, uint32_t nshards)
{
    struct stat st; /* nothing is removed through a symbolic link to a directory elsewhere */
    if (lstat(dir, &st) != 0) return -errno;
    if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
    for (uint32_t j = 0; j < nshards; j++) {
        int rc = remove_part(dir, j);
        if (rc) return rc;
    }
    return rmdir(dir) != 0 ? -errno : 0;
}

/* Status polls of one shard in a row that may go unanswered (a lost connection: a shard whose
 * transport was started again answers the next) before its checkpoint counts as failed. */
#define STATUS_MISSES 5

/* How long a given-up checkpoint's copies that were told to stop may take to stop (each stops
 * at its next record and removes what it wrote). */
#define CANCEL_STOP_S 5.0

uint64_t psctl_checkpoint_id(void)
{
    uint64_t id = 0;
    while (id == 0)
        if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) /* no entropy yet: still unique */
            id = ((uint64_t)getpid() << 32) ^ (uint64_t)(psctl_mono_s() * 1e9);
    return id;
}

/* psctl checkpoint by hand: a SIGINT, SIGTERM or SIGHUP (its terminal closed) while it arms or
 * waits gives the checkpoint up as --wait running out does (cancelled on every shard, the parts
 * removed), and psctl exits 128 + the signal. The handler is one-shot (SA_RESETHAND): a second
 * signal ends psctl at once. Before, the signal killed psctl and its armed shards stayed armed
 * until they reached the step: every later checkpoint was refused "in progress" meanwhile, and
 * their parts then stayed. Not installed by --follow (psctl_follow.c handles its signals), nor for
 * a signal ignored when psctl started (a background job's SIGINT). */
static volatile sig_atomic_t g_interrupt; /* stays 0 without interrupt_catch (--follow) */

static void on_interrupt(int sig) { g_interrupt = sig; }

static void interrupt_catch(void)
{
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++) {
        struct sigaction sa = {.sa_handler = on_interrupt, .sa_flags = SA_RESETHAND};
        sigemptyset(&sa.sa_mask);
        if (!ps_signal_ignored(sigs[i]))
            sigaction(sigs[i], &sa, NULL); /* no SA_RESTART: the waits end early */
    }
}

static const char *interrupt_name(void)
{
    return g_interrupt == SIGINT ? "SIGINT" : g_interrupt == SIGHUP ? "SIGHUP" : "SIGTERM";
}

/* What becomes of each shard's part of a checkpoint given up. */
enum {
    PART_TELL = 0, /* not finished: told to drop it (MSG_CKPT_CANCEL) */
    PART_STOPPING, /* its copy was told to stop */
    PART_GONE,     /* nothing of it left there, or a whole part: psctl removes it */
    PART_LEFT,     /* its shard went on to another checkpoint: left as it is (already said) */
    PART_UNTOLD,   /* no answer: the shard may still make it */
};

/* The cancel's mark in @p d (ckpt_meta.h), written before the shards are told: one that does not
 * answer may be armed still, and finds it when it resumes. D is made if missing, its parent not
 * (psctl may not see the shards' disks). @return 0 with the path in @p mark, or -errno. */
static int mark_write(const char *d, uint64_t id, const char *why, char *mark, size_t cap)
{
    if (psd_ckpt_cancel_mark(mark, cap, d, id)) return -ENAMETOOLONG;
    if (mkdir(d, 0700) != 0 && errno != EEXIST) return -errno;
    FILE *f = fopen(mark, "w");
    if (f == NULL) return -errno;
    time_t now = time(NULL);
    char when[64] = "";
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %z", localtime(&now));
    fprintf(f, "checkpoint %016llx into %s: given up by psctl at %s (%s); this is no checkpoint. "
            "A shard armed with it that finds this file drops it (at its step, or when the next "
            "checkpoint arms it) and logs 'checkpoint %016llx ... was cancelled'.\n",
            (unsigned long long)id, d, when, why, (unsigned long long)id);
    return fclose(f) != 0 ? -errno : 0;
}

/* The marks of checkpoints given up earlier in @p d, once a checkpoint into @p d is complete:
 * every shard took its arm, which a shard still armed with one of them refuses unless it found
 * its mark and dropped it, so none holds them any more. */
static void marks_remove(const char *d)
{
    DIR *dir = opendir(d);
    char path[PS_PATH_MAX + 64];
    for (struct dirent *e; dir && (e = readdir(dir)) != NULL;)
        if (strncmp(e->d_name, PSD_CKPT_CANCELLED, strlen(PSD_CKPT_CANCELLED)) == 0 &&
            snprintf(path, sizeof path, "%s/%s", d, e->d_name) < (int)sizeof path)
            unlink(path);
    if (dir) closedir(dir);
}

/*
 * Checkpoint @p id into @p d is given up (@p reason: its --wait ran out, a shard refused its arm
 * or failed, the hold lapsed; @p why: "incomplete" or "inconsistent", for the message): shards
 * 0..@p n-1 whose part is PART_TELL in @p fate are told to drop it (MSG_CKPT_CANCEL: armed,
 * nothing is written; copying, the copy stops and removes what it wrote), the parts of every
 * shard that answered are removed, and D when all did. Before, the armed shards stayed armed:
 * each later checkpoint was refused "in progress" until they reached the step, and then wrote
 * parts that stayed for good (a probe, session 40). A shard that does not answer (stopped, cut
 * off, or a psd older than this psctl, which does not know the cancel: a wait bounded by
 * --timeout) is named, and D keeps the mark (mark_write) for it. @p miss[i]: psctl's last
 * request to shard i went unanswered (0: it answered, so a cancel it does not answer points to
 * an older psd). @p refused: an arm was refused (the refusing shard, @p n, is not touched).
 */
static void give_up(ps_req_t *cl, const char *d, uint64_t id, int n, char *fate, const int *miss,
                    const char *reason, const char *why, bool refused)
{
    char err[512], mark[PS_PATH_MAX + 64] = "";
    int mark_rc = -ENOENT, untold = 0, left = 0, kept = 0;
    bool tell = false;
    for (int i = 0; i < n; i++) tell |= fate[i] == PART_TELL;
    if (tell) mark_rc = mark_write(d, id, reason, mark, sizeof mark);
    for (int i = 0; i < n; i++) {
        if (fate[i] != PART_TELL) continue;
        ps_msg_t q = {.type = PS_MSG_CKPT_CANCEL, .rank = -1, .count = id}, r;
        int rc = ps_req_call(cl, (uint32_t)i, &q, &r, NULL, NULL, err, sizeof err);
        if (rc == 0) {
            fate[i] = r.flags & PS_FLAG_PENDING ? PART_STOPPING : PART_GONE;
            continue;
        }
        fate[i] = PART_UNTOLD;
        bool lost = rc == PS_ETIMEDOUT || rc == PS_ETRANSPORT;
        fprintf(stderr, "psctl: checkpoint: shard %d was not told to drop it: %s%s\n", i, err,
                !lost     ? ""
                : miss[i] ? " (stopped or cut off: it may still make its part; one that is not "
                            "running makes none, nor does a psd started again)"
                          : " (it answered before: a psd older than this psctl, which does not "
                            "know the cancel, makes its part when it reaches the step; or it "
                            "stopped just now)");
    }
    double t1 = psctl_mono_s();
    for (bool waiting = true; waiting;) {
        waiting = false;
        for (int i = 0; i < n; i++) {
            if (fate[i] != PART_STOPPING) continue;
            ps_msg_t s = {.type = PS_MSG_CKPT_STATUS, .rank = -1, .count = id}, r;
            int rc = ps_req_call(cl, (uint32_t)i, &s, &r, NULL, NULL, err, sizeof err);
            if ((rc == 0 && !(r.flags & 1)) || rc == PS_ETIMEDOUT || rc == PS_ETRANSPORT)
                waiting = true; /* still copying, or not heard */
            else /* stopped (its error says it was cancelled), or done just before */
                fate[i] = rc == PS_ECONFLICT ? PART_LEFT : PART_GONE;
        }
        if (waiting && psctl_mono_s() - t1 > CANCEL_STOP_S) {
            for (int i = 0; i < n; i++)
                if (fate[i] == PART_STOPPING) {
                    fate[i] = PART_UNTOLD;
                    fprintf(stderr, "psctl: checkpoint: shard %d was told to drop it, but its "
                            "copy did not stop within %g s: it removes its part when it does\n",
                            i, CANCEL_STOP_S);
                }
            break;
        }
        if (waiting) usleep(20 * 1000);
    }
    for (int i = 0; i < n; i++) {
        untold += fate[i] == PART_UNTOLD;
        left += fate[i] == PART_LEFT;
        int rc = fate[i] == PART_GONE ? remove_part(d, (uint32_t)i) : 0;
        if (rc) {
            kept++;
            fprintf(stderr, "psctl: checkpoint: cannot remove shard %d's part %s/shard-%d: %s "
                    "(left as it is)\n", i, d, i, strerror(-rc));
        }
    }
    if (untold) {
        if (mark_rc == 0)
            fprintf(stderr, "psctl: checkpoint: %s stays, holding %s: no checkpoint; a shard "
                    "named above drops its part when it finds that file (a psd as new as this "
                    "psctl), but not one that was restarted meanwhile: remove the directory "
                    "once each has logged 'checkpoint %016llx ... was cancelled', was "
                    "restarted, or answers again with no 'checkpoint %016llx armed' in its log "
                    "(the arm never reached it: it logs nothing of it) (periodic checkpoints "
                    "into its parent directory remove it once its files are 600 s old)\n", d,
                    mark + strlen(d) + 1, (unsigned long long)id, (unsigned long long)id);
        else
            fprintf(stderr, "psctl: checkpoint: cannot leave %sID in %s: %s; a part the %d "
                    "shard(s) named above make there is no checkpoint\n", PSD_CKPT_CANCELLED, d,
                    strerror(-mark_rc), untold);
        return;
    }
    if (mark_rc == 0) unlink(mark);
    if (left || kept) return; /* said above */
    int rc = rmdir(d) != 0 ? -errno : 0;
    struct stat dst;
    if (rc == -ENOTDIR && lstat(d, &dst) != 0) /* under a file: never made (a probe: it said */
        rc = -ENOENT;                          /* "cannot remove D: Not a directory") */
    if (refused) {
        if (rc == 0 || rc == -ENOTEMPTY || rc == -EEXIST || rc == -ENOENT)
            fprintf(stderr, "psctl: checkpoint: cancelled it and removed the parts of the %d "
                    "shard(s) armed (or asked without an answer) before the refusal from %s\n",
                    n, d);
        else
            fprintf(stderr, "psctl: checkpoint: cannot remove %s: %s (left as it is)\n", d,
                    strerror(-rc));
    } else if (rc == 0 || rc == -ENOENT) {
        fprintf(stderr, "psctl: checkpoint: cancelled it and removed the %s checkpoint %s\n", why,
                d);
    } else {
        fprintf(stderr, "psctl: checkpoint: cannot remove the %s checkpoint %s: %s (left as it "
                "is)\n", why, d, strerror(-rc));
    }
}

/* A bsp checkpoint not done this long after it began is asked why (held_back), and again
 * every as long (the job may finish meanwhile). */
#define HELD_BACK_CHECK_S 3.0

/* Whether a tensor no push reached holds a bsp checkpoint's step back: its chunks stay at step
 * 0, so the step is never reached everywhere (DESIGN-NOTES, "Dropping a tensor no push
 * reached"). Asks every shard's status; names the tensor on stderr unless *@p said, and sets it.
 * @return true when the job is finished besides (nothing will train it: give up), false
 * otherwise (also when a shard does not answer, or none holds such a tensor). */
static bool held_back(ps_req_t *cl, const ps_manifest_t *m, bool *said)
{
    bool finished = false, found = false;
    char err[512], v[32], name[160];
    for (int i = 0; i < m->nservers; i++) {
        char *json = psctl_status_json(cl, (uint32_t)i, err, sizeof err, NULL);
        if (json == NULL) continue;
        if (i == 0 && ps_json_field(json, "finished", v, sizeof v)) finished = !strcmp(v, "true");
        /* A tensor no push reached, or a trained one no member pushes (behind): its count,
         * its first one, what its chunks do and how it is dropped. */
        static const char *const kinds[2][4] = {
            {"untrained_tensors", "untrained_first", "that no push reached",
             "its chunks stay at step 0, which holds the step back everywhere until a worker "
             "trains it or `psctl forget NAME` drops it"},
            {"behind_tensors", "behind_first", "a push reached that stay behind the job's step",
             "no member pushes it, so the step is never reached everywhere; with the workers "
             "stopped, `psctl forget NAME --trained` drops it"}};
        for (int k = 0; k < 2 && !found; k++) {
            if (!ps_json_field(json, kinds[k][0], v, sizeof v) || atoi(v) <= 0 ||
                !ps_json_str_field(json, kinds[k][1], name, sizeof name))
                continue;
            found = true;
            if (!*said)
                fprintf(stderr, "psctl: checkpoint: shard %d holds %d tensor%s %s (the first: "
                        "'%s'): %s\n", i, atoi(v), atoi(v) == 1 ? "" : "s", kinds[k][2], name,
                        kinds[k][3]);
            *said = true;
        }
        free(json);
    }
    if (found && finished)
        fprintf(stderr, "psctl: checkpoint: the job is finished: nothing will train it\n");
    return found && finished;
}

/* MSG_CKPT_ARM of checkpoint @p id at @p step into @p dir to shard @p i, with @p flags
 * (PS_FLAG_CHECK: would it be taken? PS_FLAG_MOVE: move its arm there). @return 0 or the
 * error, its message in @p err. */
static int arm_call(ps_req_t *cl, int i, uint64_t id, uint64_t step, const char *dir,
                    uint32_t flags, char *err, size_t errlen)
{
    ps_msg_t a = {.type = PS_MSG_CKPT_ARM, .rank = -1, .step = step, .count = id,
                  .flags = flags}, r;
    snprintf(a.error, sizeof a.error, "%.255s", dir);
    return ps_req_call(cl, (uint32_t)i, &a, &r, NULL, NULL, err, errlen);
}

/* The default directory of a checkpoint at @p step (psctl_checkpoint_dir), or @p d itself with
 * PSCTL_CK_OWN_DIR in @p how, into @p out. @return 0, PS_EINVAL if too long (said). */
static int step_dir(const ps_manifest_t *m, unsigned how, const char *d, uint64_t step,
                    char *out, size_t cap)
{
    if (how & PSCTL_CK_OWN_DIR) {
        snprintf(out, cap, "%s", d);
        return 0;
    }
    if (psctl_checkpoint_dir(m, NULL, step, out, cap) == 0) return 0;
    fprintf(stderr, "psctl: checkpoint: the directory of a checkpoint at step %llu is too long\n",
            (unsigned long long)step);
    return PS_EINVAL;
}

/* The message of a checkpoint that waits for @p step because the open step before it was
 * applied in part by workers that left (@p why: the evidence). */
static void say_partly_applied(uint64_t step, const char *why)
{
    printf("psctl: checkpoint: the workers of step %llu left after part of it was applied (%s): "
           "the checkpoint waits for step %llu, which new workers make\n",
           (unsigned long long)step - 1, why, (unsigned long long)step);
    fflush(stdout);
}

/* How often a movable bsp checkpoint still waiting for its step asks whether the open step
 * before it lost every member (move_earlier). */
#define MOVE_CHECK_S 1.0

/*
 * A bsp checkpoint asked for now waits for step @p *step, the one after the step open when it
 * began. When every member of that open step left since (a restore, or a restart of the shards
 * whose workers did not come back, keeps the members it restored in the open step until their
 * grace ends), @p *step comes only once new workers finish the open step. If no shard applied
 * any of it either, the job's state is the open step everywhere: shard 0 holds that step's
 * hand-out (MSG_CKPT_BEGIN picks it, as it has no members, and says so with PS_FLAG_MOVE), every
 * shard still armed is asked whether it would move there, then moved; a shard that took its
 * part already because it holds no chunk (@p st[i]: its status, `chunk` 0) has that part
 * removed and is armed again there. Then the hold is released. Before (session 46's probe),
 * such a checkpoint waited until --wait ran out. @p d: the checkpoint's directory (@p dcap
 * bytes), the new step's default one after a move unless PSCTL_CK_OWN_DIR is in @p how.
 * @return 1 moved (@p *step, @p d and @p st updated), 0 not now (asked again later), -1 not
 * at all (said), -2 the move failed part-way (said): give the checkpoint up.
 */
static int move_earlier(ps_req_t *cl, const ps_manifest_t *m, uint64_t id, uint64_t *step,
                        char *d, size_t dcap, unsigned how, ps_msg_t *st)
{
    char err[512], v[32];
    int n = m->nservers;
    ps_msg_t r;
    char *json = psctl_status_json(cl, 0, err, sizeof err, NULL);
    if (json == NULL) return 0;
    uint64_t open = UINT64_MAX, members = 1;
    bool finished = true;
    if (ps_json_field(json, "open_step", v, sizeof v)) open = strtoull(v, NULL, 10);
    if (ps_json_field(json, "open_step_members", v, sizeof v)) members = strtoull(v, NULL, 10);
    if (ps_json_field(json, "finished", v, sizeof v)) finished = strcmp(v, "false") != 0;
    free(json);
    if (finished || members != 0 || open + 1 != *step) return 0;
    for (int i = 0; i < n; i++)
        if ((st[i].flags & 1) && st[i].chunk > 0) { /* it applied the open step */
            char why[64];
            snprintf(why, sizeof why, "shard %d took its part at step %llu", i,
                     (unsigned long long)*step);
            say_partly_applied(*step, why);
            return -1;
        }
    ps_req_set_cancel(cl, NULL); /* the hold taken below is released whatever happens */
    int ret = 0;
    ps_msg_t b = {.type = PS_MSG_CKPT_BEGIN, .rank = -1, .count = id};
    int rc = ps_req_call(cl, 0, &b, &r, NULL, NULL, err, sizeof err);
    char nd[PS_PATH_MAX + 64], od[PS_PATH_MAX + 64];
    snprintf(od, sizeof od, "%s", d);
    if (rc || !(r.flags & PS_FLAG_MOVE) || r.step != open) goto release; /* a worker came */
    if (step_dir(m, how, d, open, nd, sizeof nd)) {
        ret = -1;
        goto release;
    }
    for (int i = 0, renamed = 0; i < n && ret == 0; i++) {
        if (st[i].flags & 1) continue; /* no chunk here: armed again below */
        rc = arm_call(cl, i, id, open, nd, PS_FLAG_MOVE | PS_FLAG_CHECK, err, sizeof err);
        if (rc == -EEXIST && !(how & PSCTL_CK_OWN_DIR) && !renamed++ &&
            psctl_checkpoint_dir(m, NULL, UINT64_MAX, nd, sizeof nd) == 0) {
            i = -1; /* step-S holds a checkpoint of this state (the one restored): time-MS */
            continue;
        }
        if (rc) ret = -1;
    }
    if (ret) {
        if (rc == PS_ECONFLICT && strstr(err, "already past"))
            say_partly_applied(*step, err);
        else if (rc == -EEXIST)
            printf("psctl: checkpoint: the job's state is step %llu (every member of it left "
                   "before any shard applied it), and %s is there already (%s): this "
                   "checkpoint waits for step %llu, which new workers make; with --dir it is "
                   "taken now\n", (unsigned long long)open, nd, err,
                   (unsigned long long)*step);
        else
            printf("psctl: checkpoint: cannot move it to step %llu, the job's state (every "
                   "member of it left before any shard applied it): %s; it waits for step "
                   "%llu, which new workers make\n", (unsigned long long)open, err,
                   (unsigned long long)*step);
        fflush(stdout);
        goto release;
    }
    snprintf(d, dcap, "%s", nd); /* a give-up from here on cancels the parts there */
    for (int i = 0; i < n && ret == 0; i++) {
        if (!(st[i].flags & 1)) {
            rc = arm_call(cl, i, id, open, nd, PS_FLAG_MOVE, err, sizeof err);
        } else { /* its part holds no chunk: removed, and armed again at the open step */
            ps_msg_t c = {.type = PS_MSG_CKPT_CANCEL, .rank = -1, .count = id}, cr;
            rc = ps_req_call(cl, (uint32_t)i, &c, &cr, NULL, NULL, err, sizeof err);
            if (rc == 0 && (rc = -remove_part(od, (uint32_t)i)) != 0)
                snprintf(err, sizeof err, "cannot remove %.300s/shard-%d: %s", od, i, strerror(rc));
            if (rc == 0) rc = arm_call(cl, i, id, open, nd, 0, err, sizeof err);
            if (rc == 0) st[i] = (ps_msg_t){0}; /* asked again */
        }
        if (rc) {
            fprintf(stderr, "psctl: checkpoint: moving it to step %llu: shard %d: %s\n",
                    (unsigned long long)open, i, err);
            ret = -2;
        }
    }
    if (ret == 0) {
        printf("psctl: checkpoint: every member of step %llu left before any shard applied it: "
               "the checkpoint is taken at step %llu, the job's state, instead of %llu\n",
               (unsigned long long)open, (unsigned long long)open, (unsigned long long)*step);
        fflush(stdout);
        *step = open;
        ret = 1;
    }
release:;
    ps_msg_t g = {.type = PS_MSG_CKPT_GO, .rank = -1, .count = id}; /* ends the hold */
    ps_req_call(cl, 0, &g, &r, NULL, NULL, err, sizeof err);
    ps_req_set_cancel(cl, &g_interrupt);
    return ret;
}

_Static_assert(PS_MAX_SERVERS <= 64, "psctl_checkpoint_run keeps a bit per shard in one word");

/* Checkpoint directory @p d (@p cap bytes), a step's step-S, holds a checkpoint already: replaced
 * with a time-MS one beside it, said. @return whether it was (else @p d stays). */
static bool to_time_dir(const ps_manifest_t *m, char *d, size_t cap)
{
    char old[PS_PATH_MAX + 64], base[PS_PATH_MAX + 64];
    snprintf(old, sizeof old, "%s", d);
    snprintf(base, sizeof base, "%s", d);
    char *slash = strrchr(base, '/');
    if (slash == NULL) return false;
    slash[slash == base] = '\0'; /* "/step-S": the root */
    if (psctl_checkpoint_dir(m, base, UINT64_MAX, d, cap) != 0) {
        fprintf(stderr, "psctl: checkpoint: %s holds a checkpoint already, and a time-MS "
                "directory beside it would be too long (a shorter checkpoint.dir)\n", old);
        snprintf(d, cap, "%s", old);
        return false;
    }
    printf("psctl: checkpoint: %s holds a checkpoint already; this one goes into %s\n", old, d);
    fflush(stdout);
    return true;
}

/* Whether checkpoint directory @p d holds shard J's data.mdb for some J < @p n, seen from here
 * (what makes psd refuse that shard's arm: checkpoint.c, arm_takes). */
static bool part_taken(const char *d, int n)
{
    for (int j = 0; j < n; j++) {
        char f[PS_PATH_MAX + 96];
        snprintf(f, sizeof f, "%s/shard-%d/data.mdb", d, j);
        struct stat st;
        if (stat(f, &st) == 0) return true;
    }
    return false;
}

bool psctl_checkpoint_dir_free(const ps_manifest_t *m, char *d, size_t cap)
{
    return part_taken(d, m->nservers) && to_time_dir(m, d, cap);
}

/* The chunks a checkpoint part's meta.json lists ("chunks": [[t, c, version, hash], ...]). */
static uint32_t meta_chunks(const char *mj)
{
    const char *p = strstr(mj, "\"chunks\": [");
    uint32_t n = 0;
    for (p = p ? p + strlen("\"chunks\": [") : ""; *p && *p != ']'; p++)
        if (*p == '[') {
            n++;
            if ((p = strchr(p, ']')) == NULL) break;
        }
    return n;
}

int psctl_checkpoint_run(ps_req_t *cl, const ps_manifest_t *m, uint64_t step, uint64_t id,
                         const char *dir, uint64_t next, double wait_s, double t0,
                         unsigned how)
{
    int ret = 1, n = m->nservers, narmed = 0, unanswered = -1, renamed = 0;
    bool busy = false; /* a shard refused its arm: it takes another checkpoint */
    char err[512], d[PS_PATH_MAX + 64];
    ps_msg_t r;
    bool movable = (how & PSCTL_CK_MOVABLE) && m->job.consistency == PS_CONSIST_BSP &&
                   step != UINT64_MAX;
    snprintf(d, sizeof d, "%s", dir);
    if (movable && (how & PSCTL_CK_OPEN_EMPTY)) {
        /* The step picked is the open one, whose members all left: if they left after part of
         * it was applied, a shard is past it, and the checkpoint waits for the step after,
         * which new workers make. Asked of every shard before any is armed (one armed at the
         * open step takes its part at once). A signal ends these waits too (before, a
         * stopped shard held the Ctrl-C for the whole timeout; a review, session 71). */
        ps_req_set_cancel(cl, &g_interrupt);
        for (int i = 0; i < n; i++) {
            int rc = arm_call(cl, i, id, step, d, PS_FLAG_CHECK, err, sizeof err);
            if (rc == PS_ECONFLICT && strstr(err, "already past")) {
                movable = false;
                if (step_dir(m, how, dir, step + 1, d, sizeof d)) return 1;
                say_partly_applied(++step, err);
                break;
            }
            if (rc && rc != -EEXIST) break; /* the arm below says it (EEXIST: renamed there) */
        }
    }
    if ((how & PSCTL_CK_MOVABLE) && !(how & PSCTL_CK_OWN_DIR))
        renamed = psctl_checkpoint_dir_free(m, d, sizeof d);
    int armed = strlen(d) < PS_CKPT_DIR_MAX;
    if (!armed) fprintf(stderr, "psctl: checkpoint: directory '%s' is longer than 199 bytes\n", d);
    /* PS_TEST_ARM_GAP_MS (tests only): a pause between two shards' arms, as a slow network
     * makes, during which training must not move (the hold keeps it still). */
    const char *gap_env = getenv("PS_TEST_ARM_GAP_MS");
    int gap_ms = gap_env ? atoi(gap_env) : 0;
    ps_req_set_cancel(cl, &g_interrupt); /* the waits below end at a signal */
    for (int i = 0; i < n && armed; i++) {
        if (i && gap_ms > 0) usleep((useconds_t)gap_ms * 1000);
        if (g_interrupt) break;
        ps_msg_t a = {.type = PS_MSG_CKPT_ARM, .rank = -1, .step = step, .count = id};
        snprintf(a.error, sizeof a.error, "%.255s", d);
        int rc = ps_req_call(cl, (uint32_t)i, &a, &r, NULL, NULL, err, sizeof err);
        if (rc == -EEXIST && i == 0 && (how & PSCTL_CK_MOVABLE) && !(how & PSCTL_CK_OWN_DIR) &&
            !renamed++) {
            /* The default directory of this step holds a checkpoint (one taken at this step
             * before, or the one this job was restored from), on shard 0's host only. */
            if (to_time_dir(m, d, sizeof d)) {
                i--;
                continue;
            }
        }
        if (rc == PS_EBUSY && (how & PSCTL_CK_BUSY_RETRY) && !strstr(err, "shutting down")) {
            /* Another checkpoint (psd's periodic one, another psctl's) is under way there: this
             * one is given up (the shards armed before it cancelled, below) and asked again
             * once that one ends (psctl_checkpoint). Before, this exited 1 (a helper's probe:
             * hand checkpoints beside `every_steps: 40`, 4 of 15 under bsp). */
            printf("psctl: checkpoint: %s: waiting for it to end\n", err);
            fflush(stdout);
            busy = true;
            armed = 0;
            break;
        }
        if (rc) {
            if (rc != PS_ECANCELED) fprintf(stderr, "psctl: checkpoint: %s\n", err);
            armed = 0;
            /* Unanswered, it may have taken effect: cancelled and removed with the others (a
             * cancel or status names the id, so another checkpoint's is not taken for it). */
            if (rc == PS_ETRANSPORT || rc == PS_ETIMEDOUT || rc == PS_ECANCELED)
                unanswered = narmed++;
        } else {
            narmed++;
        }
    }
    ps_req_set_cancel(cl, NULL); /* the GO and a give-up's cancels are waited for */
    /* Release the hold (and, for --follow, hold the next checkpoint's step ahead). asp / ssp:
     * the shards' snapshots are a cut only if no batch was handed out between the drained
     * answer and the last arm, which the coordinator confirms (PS_FLAG_DONE) only when its
     * hold lasted for this checkpoint all along. */
    ps_msg_t g = {.type = PS_MSG_CKPT_GO, .rank = -1, .step = next, .flags = PS_FLAG_DONE,
                  .count = id};
    bool cut = true;
    if (ps_req_call(cl, 0, &g, &r, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "psctl: checkpoint: releasing the hold: %s\n", err);
        cut = step != UINT64_MAX;
    } else if (step == UINT64_MAX && !(r.flags & PS_FLAG_DONE)) {
        cut = false;
    }
    if (!cut && armed)
        fprintf(stderr, "psctl: checkpoint: the coordinator's hold of the hand-outs lapsed before "
                "every shard was armed (shard 0 started again, or arming took over 10 s): the "
                "shards' copies may not hold the same batches, so this is no checkpoint\n");
    bool stopped = g_interrupt != 0; /* interrupt_catch: given up like --wait run out */
    if (stopped) {
        fprintf(stderr, "psctl: checkpoint: %s: giving it up\n", interrupt_name());
        if (narmed == 0) return 128 + g_interrupt;
    }
    if (!armed && narmed == 0) return busy ? PSCTL_CK_BUSY : 1;
    /* An arm refused part-way: the shards armed before it would copy all the same, and their
     * parts would stay behind (never complete, never pruned): they are cancelled below. */
    if (!armed || stopped) n = narmed;
    /* Each shard copies on its own; wait for all of them, unless this is no checkpoint
     * already. One that fails, or --wait running out, gives the checkpoint up. */
    uint64_t total = 0;
    ps_msg_t *st = calloc((size_t)n, sizeof *st);
    int *miss = calloc((size_t)n, sizeof *miss); /* status polls in a row without an answer */
    char *fate = calloc((size_t)n, 1);
    int done = 0, failed = 0;
    uint64_t from_meta = 0; /* bit i: shard i's figures read from its meta.json (n <= 64) */
    bool late = false;    /* --wait ran out */
    bool stuck = false;   /* held_back: a finished job's tensor no push reached */
    bool said = false;    /* held_back named the tensor */
    bool bsp = m->job.consistency == PS_CONSIST_BSP;
    double ask_at = HELD_BACK_CHECK_S; /* held_back's next time (s since t0; bsp only) */
    double move_at = MOVE_CHECK_S;     /* move_earlier's next time (s since t0) */
    if (st == NULL || miss == NULL || fate == NULL) {
        fprintf(stderr, "psctl: checkpoint: out of memory\n");
        goto out;
    }
    if (unanswered >= 0) miss[unanswered] = 1;
    ps_req_set_cancel(cl, &g_interrupt);
    while (armed && cut && !stopped && done + failed < n) {
        done = failed = 0;
        for (int i = 0; i < n; i++) {
            if (st[i].flags & 1 || st[i].status) {
                done += !st[i].status;
                failed += st[i].status != 0;
                continue;
            }
            ps_msg_t s = {.type = PS_MSG_CKPT_STATUS, .rank = -1, .count = id};
            int rc = ps_req_call(cl, (uint32_t)i, &s, &st[i], NULL, NULL, err, sizeof err);
            if (rc == PS_ECANCELED) { /* a signal: its copy is not known, nor failed */
                st[i] = (ps_msg_t){0};
                miss[i] = 1;
                break;
            }
            if (rc == PS_ECONFLICT) {
                /* Armed again by another checkpoint, so this one's copy had ended there: its
                 * meta.json (written last) says whether it completed, where psctl can see it. */
                char *mj = psd_ckpt_meta_read(d, (uint32_t)i), want[20], got[24] = "";
                snprintf(want, sizeof want, "%016llx", (unsigned long long)id);
                st[i] = (ps_msg_t){.flags = 1};
                if (mj) {
                    psd_ckpt_meta_field(mj, "checkpoint", got, sizeof got);
                    st[i].step = psd_ckpt_meta_u64(mj, "step");
                    st[i].count = psd_ckpt_meta_u64(mj, "records_bytes");
                    st[i].chunk = meta_chunks(mj);
                    from_meta |= 1ull << i;
                    free(mj);
                }
                if (strcmp(got, want) == 0) continue; /* done */
                st[i].status = rc;
                fprintf(stderr, "psctl: checkpoint: %s, and its copy of this one is not at hand "
                        "here: not known to be complete\n", err);
                failed++;
                fate[i] = PART_LEFT;
                continue;
            }
            bool lost = rc == PS_ETRANSPORT || rc == PS_ETIMEDOUT; /* no answer: not known */
            if (!lost) miss[i] = 0;
            if (lost && ++miss[i] < STATUS_MISSES) { /* the next call connects again */
                st[i] = (ps_msg_t){0};
                continue;
            }
            if (rc) {
                fprintf(stderr, "psctl: checkpoint: %s\n", err);
                st[i].status = rc;
                failed++;
                if (!lost) fate[i] = PART_GONE; /* its copy failed and removed itself */
            } else if (st[i].flags & 1) {
                done++;
            }
        }
        if (done + failed == n || failed) break; /* one failed: the others are cancelled */
        if (movable && psctl_mono_s() - t0 > move_at) {
            move_at = psctl_mono_s() - t0 + MOVE_CHECK_S;
            bool waiting = true; /* every shard armed or done, none copying (all answered) */
            for (int i = 0; i < n; i++)
                waiting &= !miss[i] && !(st[i].flags & PS_FLAG_PENDING) && !st[i].status;
            int mv = waiting ? move_earlier(cl, m, id, &step, d, sizeof d, how, st) : 0;
            if (mv < 0) movable = false;
            if (mv == -2) {
                failed = 1;
                break;
            }
            if (mv == 1) movable = false;
        }
        if (bsp && psctl_mono_s() - t0 > ask_at) {
            ask_at = psctl_mono_s() - t0 + HELD_BACK_CHECK_S;
            if ((stuck = held_back(cl, m, &said))) break;
        }
        if (psctl_mono_s() - t0 > wait_s) {
            /* Every shard not done copying (each answered, its copy under way: a large store
             * on a slow disk): not given up, they go on and make the checkpoint, as before
             * the cancel (psd's follower, which has no --wait, recognises it later). */
            bool copying = true;
            for (int i = 0; i < n; i++)
                if (!(st[i].flags & 1) && (miss[i] || !(st[i].flags & PS_FLAG_PENDING)))
                    copying = false;
            if (copying) {
                fprintf(stderr, "psctl: checkpoint: %d of %d shards still copying after %g s: "
                        "not waited for; they go on and complete it in %s (a copy that fails "
                        "now leaves it incomplete, said in that shard's log: `psctl verify "
                        "--against %s` tells whether it is whole)\n", n - done, n, wait_s, d, d);
                goto out;
            }
            /* Which of them did not answer their last status call: stopped or cut off (a
             * probe, session 40: the message asked whether training ran). */
            char silent[256] = "";
            size_t sl = 0;
            for (int i = 0; i < n && sl < sizeof silent - 16; i++)
                if (miss[i] && !(st[i].flags & 1) && st[i].status == 0)
                    sl += (size_t)snprintf(silent + sl, sizeof silent - sl, "%s%d",
                                           sl ? ", " : "", i);
            if (sl)
                fprintf(stderr, "psctl: checkpoint: %d of %d shards not done within %g s; shard "
                        "%s did not answer (stopped or unreachable?)\n", n - done - failed, n,
                        wait_s, silent);
            else
                fprintf(stderr, "psctl: checkpoint: %d of %d shards not done within %g s (bsp: "
                        "the step must be reached first; is training running? psctl status "
                        "names a tensor no worker trains, which holds the step back)\n",
                        n - done - failed, n, wait_s);
            late = true;
            break;
        }
        if (!g_interrupt) usleep(20 * 1000);
        if (g_interrupt) {
            stopped = true;
            fprintf(stderr, "psctl: checkpoint: %s: giving it up\n", interrupt_name());
        }
    }
    ps_req_set_cancel(cl, NULL);
    /* Every part whole: are they one state? Their tensor tables differ when a declaration or
     * a forget came between two shards' snapshots (a review, session 63: reported complete,
     * verified, and unrestorable). Parts psctl cannot see (another host's) are not compared. */
    char mixed[400] = "";
    if (armed && cut && !failed && !late && !stopped && !stuck) {
        char *j0 = psd_ckpt_meta_read(d, 0);
        for (int i = 1; j0 && i < n && !mixed[0]; i++) {
            char *ji = psd_ckpt_meta_read(d, (uint32_t)i);
            if (ji && psd_ckpt_meta_agree(j0, ji, (uint32_t)i, mixed, sizeof mixed) != 0) {
                fprintf(stderr, "psctl: checkpoint: %s\n", mixed);
                if (strstr(mixed, "another tensor table"))
                    fprintf(stderr, "psctl: checkpoint: when no worker declares tensors now and "
                            "this repeats, that tensor's declaration stopped part-way (a worker "
                            "killed while declaring it): psctl forget NAME drops it (psd's "
                            "checkpoint follower does so itself)\n");
            }
            free(ji);
        }
        free(j0);
    }
    if (!armed || !cut || failed || late || stopped || stuck || mixed[0]) {
        for (int i = 0; i < n; i++)
            if ((st[i].flags & 1) && st[i].status == 0) fate[i] = PART_GONE; /* whole, removed */
        char intr[32];
        snprintf(intr, sizeof intr, "interrupted (%s)", interrupt_name());
        const char *reason = stopped  ? intr
                             : !armed ? "a shard refused its arm or did not answer it"
                             : !cut   ? "the coordinator's hold lapsed: no cut"
                             : late   ? "--wait ran out"
                             : stuck  ? "a tensor no push reached holds its step back for good"
                             : mixed[0] ? "its parts are not one state (a tensor was declared "
                                          "or dropped between two shards' snapshots)"
                                      : "a shard failed";
        give_up(cl, d, id, n, fate, miss, reason,
                !armed || failed || late || stopped || stuck ? "incomplete" : "inconsistent",
                !armed && !stopped);
        if (stopped)
            ret = 128 + g_interrupt;
        else if (busy)
            ret = PSCTL_CK_BUSY; /* the refusal was another checkpoint's: asked again */
        goto out;
    }
    for (int i = 0; i < n; i++) {
        char took[48];
        if (from_meta >> i & 1) /* its status was gone: its meta.json's count of record bytes */
            snprintf(took, sizeof took, " of records (from its meta.json)");
        else
            snprintf(took, sizeof took, ", %llu ms", (unsigned long long)st[i].step_max);
        printf("shard %d: step %llu, %u chunks, %llu bytes%s: %s/shard-%d\n", i,
               (unsigned long long)st[i].step, st[i].chunk, (unsigned long long)st[i].count,
               took, d, i);
        total += st[i].count;
    }
    if (step == UINT64_MAX) step = st[0].step;
    marks_remove(d);
    printf("psctl: checkpoint at step %llu in %s: %llu bytes on %d shards in %.3f s\n",
           (unsigned long long)step, d, (unsigned long long)total, n, psctl_mono_s() - t0);
    fflush(stdout);
    ret = 0;
out:
    free(st);
    free(miss);
    free(fate);
    return ret;
}

/* Wait until none of the @p n shards is taking a checkpoint (MSG_CKPT_STATUS of any: one armed,
 * or copying; psctl_checkpoint_run found one), for up to @p wait_s from @p t0. A shard that
 * does not answer is left to the next arm to name. @return 0, or psctl's exit status (said). */
static int wait_others(ps_req_t *cl, int n, double t0, double wait_s)
{
    char err[512];
    ps_req_set_cancel(cl, &g_interrupt);
    for (int i = 0; i < n;) {
        if (psctl_mono_s() - t0 > wait_s) {
            fprintf(stderr, "psctl: checkpoint: shard %d was still taking another checkpoint "
                    "after %g s: no checkpoint\n", i, wait_s);
            return 1;
        }
        ps_msg_t s = {.type = PS_MSG_CKPT_STATUS, .rank = -1}, r;
        int rc = ps_req_call(cl, (uint32_t)i, &s, &r, NULL, NULL, err, sizeof err);
        if (g_interrupt) {
            fprintf(stderr, "psctl: checkpoint: %s: no checkpoint\n", interrupt_name());
            return 128 + g_interrupt;
        }
        if (rc || (r.flags & 1)) /* none there, done, failed or not answering */
            i++;
        else
            usleep(50 * 1000);
    }
    return 0;
}

int psctl_checkpoint(const ps_manifest_t *m, const char *dir, double timeout_s, double wait_s)
{
    ps_req_t *cl;
    char err[512], d[1024];
    /* A secret_file this host refuses is the manifest's (exit 2, as check and status say it). */
    int orc = ps_req_open(m, timeout_s, &cl, err, sizeof err);
    if (orc) {
        fprintf(stderr, "psctl: %s\n", err);
        return orc == PS_ECONFIG ? 2 : 1;
    }
    int ret = 1;
    struct stat sd;
    if (dir && stat(dir, &sd) == 0 && !S_ISDIR(sd.st_mode)) { /* a shard would fail to make it */
        fprintf(stderr, "psctl: checkpoint: %s exists and is not a directory\n", dir);
        ps_req_close(cl);
        return 2; /* an argument refused, as export's --out (a probe, session 50: exit 1) */
    }
    if (dir) { /* and one too long for the arms, before any hold (found after it, exit 1) */
        if (psctl_absolute(d, sizeof d, dir) != 0) {
            fprintf(stderr, "psctl: checkpoint: cannot make '%s' absolute (the working "
                    "directory is gone, or its path too long): give an absolute one\n", dir);
            ps_req_close(cl);
            return 2;
        }
        if (strlen(d) >= PS_CKPT_DIR_MAX) {
            fprintf(stderr, "psctl: checkpoint: directory '%s' is longer than %d bytes\n", d,
                    PS_CKPT_DIR_MAX - 1);
            ps_req_close(cl);
            return 2;
        }
    }
    double t0 = psctl_mono_s();
    interrupt_catch();
again:;
    uint64_t id = psctl_checkpoint_id();
    ps_msg_t q = {.type = PS_MSG_CKPT_BEGIN, .rank = -1, .count = id}, r;
    ps_req_set_cancel(cl, &g_interrupt);
    for (int said = 0;; said = 1) {
        int rc = ps_req_call(cl, 0, &q, &r, NULL, NULL, err, sizeof err);
        if (rc == PS_ECANCELED) { /* it may have begun: the GO below ends its hold */
            r.workers = 0;
        } else if (rc) {
            fprintf(stderr, "psctl: checkpoint: %s\n", err);
            goto out;
        }
        if (rc == 0 && !(r.flags & PS_FLAG_PENDING)) break;
        /* asp / ssp: no batch is handed out now, and the checkpoint waits for the ones in
         * flight to be applied everywhere (each ask keeps the coordinator's hold). */
        if (!said && rc == 0)
            printf("psctl: checkpoint: waiting for %u batches in flight to be applied\n",
                   r.workers);
        if (psctl_mono_s() - t0 > wait_s || g_interrupt) {
            if (g_interrupt)
                fprintf(stderr, "psctl: checkpoint: %s: no checkpoint\n", interrupt_name());
            else
                fprintf(stderr, "psctl: checkpoint: %u batches still in flight after %g s (a "
                        "worker holding one is slow or hung): no checkpoint\n", r.workers,
                        wait_s);
            ps_msg_t g = {.type = PS_MSG_CKPT_GO, .rank = -1, .count = id}; /* ends the hold */
            ps_req_set_cancel(cl, NULL);
            ps_req_call(cl, 0, &g, &r, NULL, NULL, err, sizeof err);
            if (g_interrupt) ret = 128 + g_interrupt;
            goto out;
        }
        fflush(stdout);
        usleep(20 * 1000);
    }
    ps_req_set_cancel(cl, NULL); /* psctl_checkpoint_run sets it where it waits */
    if (dir)
        (void)psctl_absolute(d, sizeof d, dir); /* checked above */
    else
        psctl_checkpoint_dir(m, NULL, r.step, d, sizeof d);
    ret = psctl_checkpoint_run(cl, m, r.step, id, d, 0, wait_s, t0,
                               PSCTL_CK_MOVABLE | PSCTL_CK_BUSY_RETRY |
                                   (dir ? PSCTL_CK_OWN_DIR : 0) |
                                   (r.flags & PS_FLAG_MOVE ? PSCTL_CK_OPEN_EMPTY : 0));
    if (ret == PSCTL_CK_BUSY) {
        ret = wait_others(cl, m->nservers, t0, wait_s);
        if (ret == 0) goto again;
    }
out:
    ps_req_close(cl);
    return ret;
}

