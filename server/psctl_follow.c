/* psctl_follow.c: `psctl checkpoint --follow`, the periodic checkpoints of the manifest's
 * `checkpoint: {every_steps, every_s, dir, keep}` section. psd shard 0 starts it as a child
 * (server/follower.c); it may also be run by hand.
 *
 * bsp with every_steps N: the checkpoints are at the steps that are multiples of N. The follower
 * asks shard 0 for a checkpoint at the next multiple S (MSG_CKPT_BEGIN with step S); until the
 * job gets there the coordinator answers PS_FLAG_PENDING and holds the hand-out of step S when
 * it is reached, so the job cannot pass S before the follower asked again (every POLL_MS). Then
 * the checkpoint runs as psctl checkpoint's does, and its MSG_CKPT_GO names the next multiple,
 * which is held ahead at once: no multiple is skipped however long a copy takes. A follower
 * that dies leaves at most one hold, which the coordinator ends after CKPT_HOLD_MS.
 * every_s T: a checkpoint at the coordinator's step once T seconds passed since the last one
 * (asp / ssp: also every_steps, counted on shard 0's open_step, at the steps they happen at).
 *
 * After each checkpoint the oldest complete ones beyond `keep` are removed: only directories
 * named step-N or time-N under the checkpoint dir whose every shard-J/meta.json (J < nshards)
 * names this cluster, and in them only the files a checkpoint writes; anything else is left.
 * So are incomplete checkpoints of this cluster that nothing can complete any more (abandoned()),
 * and directories that hold only the marks of cancelled ones (cancelled_only()).
 * Before the first, checkpoints of another run past this run's start (server/run.h: a
 * rollback's abandoned steps) are renamed out of the way (set_aside). */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_meta.h"
#include "jsonfield.h"
#include "ps/ps_error.h"
#include "sigignored.h"
#include "psctl_client.h"

#define POLL_MS 20        /* how often a pending step is asked for again */
#define STATUS_POLL_MS 200 /* how often shard 0's status is read otherwise */

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    g_stop = sig;
}

static void sleep_ms(int ms)
{
    for (; ms > 0 && !g_stop; ms -= 10) usleep(10 * 1000);
}

/* Shard 0's open step and finished, and its run (run.h: *run the 16 hex digits, "" when
 * shard 0 does not say; *run_base its base step), from its status JSON. @p per_step 0 (bsp):
 * the open step is open_step; else (asp / ssp) the planned steps of samples applied, per_step
 * (job.workers x batch_size) samples each, as the learning-rate schedule counts them. Their
 * open_step is the fastest worker's count ever, which stood still for as long as a worker
 * that replaced it after a death or a scale-down took to catch up.
 * @return 0, or -1 (message printed). */
/* A refusal that asking again does not mend: shard 0 serves another cluster (PS_ECONFIG) or
 * refuses this host's proof of the secret (PS_EAUTH). Before, --follow asked again every second
 * for good (a review, session 71); it exits 1 now, as the other verbs do. */
static bool refused_for_good(int rc)
{
    return rc == PS_ECONFIG || rc == PS_EAUTH;
}

/* Shard 0's job (MSG_STATUS): 0; -1 when it did not answer (asked again later); a code of
 * refused_for_good. */
static int job_status(ps_req_t *cl, uint64_t per_step, uint64_t *open_step, int *finished,
                      char run[32], uint64_t *run_base)
{
    char err[512], v[32] = "";
    int called;
    char *json = psctl_status_json(cl, 0, err, sizeof err, &called);
    if (json == NULL) {
        fprintf(stderr, "psctl: follow: status: %s\n", err);
        return refused_for_good(called) ? called : -1;
    }
    int rc = psd_ckpt_meta_field(json, per_step ? "samples_applied" : "open_step", v, sizeof v);
    *open_step = strtoull(v, NULL, 10);
    if (per_step) *open_step /= per_step;
    v[0] = '\0';
    psd_ckpt_meta_field(json, "finished", v, sizeof v);
    *finished = strcmp(v, "true") == 0;
    run[0] = '\0';
    psd_ckpt_meta_field(json, "run", run, 32);
    *run_base = psd_ckpt_meta_u64(json, "run_base_step");
    free(json);
    return rc ? -1 : 0;
}

/* ---- keeping the last K ----------------------------------------------------------------- */

typedef struct {
    char name[64];
    uint64_t step;
    uint32_t nshards;
} kept_t;

static int by_step(const void *a, const void *b)
{
    const kept_t *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Whether @p dir's shard-@p j is a directory (not a symbolic link to one). */
static int part_dir(const char *dir, uint32_t j)
{
    char p[PS_PATH_MAX + 192];
    snprintf(p, sizeof p, "%.1100s/shard-%u", dir, j);
    struct stat st;
    return lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A complete checkpoint of this cluster: every shard's part is a directory (a symbolic link is
 * not a part: pruning removed the files it pointed to; a helper's soak) whose meta.json names
 * it. @return its step (*@p nshards its shard count, when not NULL), or UINT64_MAX when @p dir
 * is not one. */
static uint64_t recognise(const ps_manifest_t *m, const char *dir, uint32_t *nshards)
{
    char *meta = psd_ckpt_meta_read(dir, 0), cl[sizeof m->cluster + 8] = "";
    if (meta == NULL) return UINT64_MAX;
    uint64_t n = psd_ckpt_meta_u64(meta, "nshards"), step = psd_ckpt_meta_u64(meta, "step");
    psd_ckpt_meta_field(meta, "cluster", cl, sizeof cl);
    free(meta);
    if (strcmp(cl, m->cluster) != 0 || n == 0 || n == UINT64_MAX || !part_dir(dir, 0))
        return UINT64_MAX;
    for (uint32_t j = 1; j < n; j++) {
        if (!part_dir(dir, j)) return UINT64_MAX;
        char c2[sizeof cl] = "";
        if ((meta = psd_ckpt_meta_read(dir, j)) == NULL) return UINT64_MAX;
        psd_ckpt_meta_field(meta, "cluster", c2, sizeof c2);
        free(meta);
        if (strcmp(c2, m->cluster) != 0) return UINT64_MAX;
    }
    if (nshards) *nshards = (uint32_t)n;
    return step;
}

/* Whether @p nm is a name the checkpoints take: step-N or time-N. */
static int checkpoint_name(const char *nm)
{
    const char *num = strncmp(nm, "step-", 5) == 0 || strncmp(nm, "time-", 5) == 0 ? nm + 5
                                                                                 : NULL;
    return num && *num && strspn(num, "0123456789") == strlen(num) &&
           strlen(nm) < sizeof(((kept_t *)0)->name);
}

/* Whether entry @p nm of @p base is a checkpoint's directory to look at: a name checkpoints
 * take and a directory, not a symbolic link to one elsewhere (neither set aside, judged nor
 * pruned); its path into @p dir. */
static int checkpoint_entry(const char *base, const char *nm, char *dir, size_t cap)
{
    if (!checkpoint_name(nm)) return 0;
    snprintf(dir, cap, "%s/%.60s", base, nm);
    struct stat st;
    return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Checkpoints of another run past this run's base step (a rollback's abandoned history, or a
 * job that used the directory before this one) are renamed NAME.run-RUN, out of the names
 * checkpoints take: a checkpoint of this run at the same step would be refused (its directory
 * is there), and pruning by step would keep them and remove this run's older ones, the one it
 * was restored from among them. Nothing is removed. @p run: shard 0's (""), @p run_base its
 * base step. */
static void set_aside(const ps_manifest_t *m, const char *base, const char *run,
                      uint64_t run_base)
{
    if (run[0] == '\0') return; /* a shard 0 that does not say: nothing is known */
    DIR *d = opendir(base);
    if (d == NULL) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char dir[PS_PATH_MAX + 128], to[PS_PATH_MAX + 192], theirs[32] = "";
        if (!checkpoint_entry(base, e->d_name, dir, sizeof dir)) continue;
        uint64_t step = recognise(m, dir, NULL);
        char *meta = step == UINT64_MAX ? NULL : psd_ckpt_meta_read(dir, 0);
        if (meta == NULL) continue;
        psd_ckpt_meta_field(meta, "run", theirs, sizeof theirs);
        free(meta);
        if (strcmp(theirs, run) == 0 || step <= run_base) continue; /* this run's history */
        snprintf(to, sizeof to, "%s.run-%s", dir, theirs[0] ? theirs : "unknown");
        if (rename(dir, to) != 0)
            fprintf(stderr, "psctl: follow: cannot set aside %s: %s\n", dir, strerror(errno));
        else
            printf("psctl: follow: set aside checkpoint %s (step %llu of run %s, past step %llu "
                   "where run %s began) as %s\n", dir, (unsigned long long)step,
                   theirs[0] ? theirs : "unknown", (unsigned long long)run_base, run, to);
    }
    closedir(d);
    fflush(stdout);
}

/* How much older than the start of the checkpoint that just completed every file of an
 * incomplete one must be for the prune to remove it (abandoned()): far beyond the ~10 s for
 * which a checkpoint's arming can hold the job (CKPT_HOLD_MS) and any clock skew between the
 * hosts that write the parts onto a shared filesystem. */
#define ABANDONED_S 600

/* Whether @p p is of @p type (S_IFDIR or S_IFREG: a symbolic link is neither) and last
 * changed before @p before (seconds since the epoch); false when it cannot be looked at. */
static int old_entry(const char *p, mode_t type, time_t before)
{
    struct stat st;
    return lstat(p, &st) == 0 && (st.st_mode & S_IFMT) == type && st.st_mtime < before;
}

/* Whether @p nm is a cancel mark's name as psctl writes it: "cancelled-" and 16 hex digits. */
static int cancel_mark_name(const char *nm)
{
    size_t k = strlen(PSD_CKPT_CANCELLED);
    return strncmp(nm, PSD_CKPT_CANCELLED, k) == 0 && strlen(nm + k) == 16 &&
           strspn(nm + k, "0123456789abcdef") == 16;
}

/* J of a part's name "shard-J" (decimal, no leading zero, below PS_MAX_SERVERS), else -1. */
static int part_number(const char *nm)
{
    const char *num = nm + 6;
    size_t len = strncmp(nm, "shard-", 6) == 0 ? strlen(num) : 0;
    if (len == 0 || len > 3 || strspn(num, "0123456789") != len || (num[0] == '0' && len > 1))
        return -1;
    int j = atoi(num);
    return j < PS_MAX_SERVERS ? j : -1;
}

/* Whether part directory @p part holds only files a checkpoint writes there, each a regular
 * file last changed before @p before. */
static int part_files_old(const char *part, time_t before)
{
    static const char *const known[] = {"data.mdb", "lock.mdb", PSD_CKPT_META,
                                        PSD_CKPT_META ".tmp"};
    DIR *d = opendir(part);
    if (d == NULL) return 0;
    int ok = 1;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (e == NULL) {
            ok &= errno == 0;
            break;
        }
        const char *nm = e->d_name;
        if (strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0) continue;
        int is_known = 0;
        for (size_t i = 0; i < sizeof known / sizeof *known; i++)
            is_known |= strcmp(nm, known[i]) == 0;
        char f[PS_PATH_MAX + 320];
        snprintf(f, sizeof f, "%s/%.60s", part, nm);
        if (!is_known || !old_entry(f, S_IFREG, before)) {
            ok = 0;
            break;
        }
    }
    closedir(d);
    return ok;
}

/*
 * Whether @p dir is an incomplete checkpoint of this cluster that nothing will complete: the
 * parts of some of its shards only (what a psctl killed -9 while it armed the shards leaves:
 * the parts of those it had armed), at least one with a meta.json naming this cluster and none
 * another cluster's; nothing in it but shard-J directories holding only the files a checkpoint
 * writes and psctl's cancel marks (no symbolic link, nothing else); every one of them last
 * changed before @p before (the start of the checkpoint that just completed, less ABANDONED_S).
 * Anything unexpected, or that cannot be read, keeps the directory. Only asked when the
 * follower sees every part of the checkpoint it just completed (prune(): on storage that is
 * not shared, every checkpoint looks like this from shard 0's host).
 * Sound because that checkpoint completed: each shard took its arm only while it copied no
 * other checkpoint (psd refuses a second one as busy), so no copy into @p dir ran on any
 * shard when it began, and one into @p dir can only begin again if @p dir's own psctl, still
 * alive, arms another shard after more than ABANDONED_S. It arms them one after the other as
 * soon as the hold is granted, so only one stopped (SIGSTOP) that long could; a killed one
 * cannot. *@p nshards: how many shard-J to remove.
 */
static int abandoned(const ps_manifest_t *m, const char *dir, time_t before, uint32_t *nshards)
{
    if (!old_entry(dir, S_IFDIR, before)) return 0;
    DIR *d = opendir(dir);
    if (d == NULL) return 0;
    int ours = 0, other = 0;
    uint32_t n = 0;
    uint64_t present = 0; /* the shard-J directories there */
    while (!other) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (e == NULL) {
            other = errno != 0;
            break;
        }
        const char *nm = e->d_name;
        if (strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0) continue;
        char sub[PS_PATH_MAX + 256];
        snprintf(sub, sizeof sub, "%s/%.60s", dir, nm);
        if (cancel_mark_name(nm)) {
            other = !old_entry(sub, S_IFREG, before);
            continue;
        }
        int j = part_number(nm);
        if (j < 0 || !old_entry(sub, S_IFDIR, before) || !part_files_old(sub, before)) {
            other = 1; /* not a checkpoint's, or changed lately: left as it is */
            break;
        }
        present |= 1ull << j;
        if ((uint32_t)j + 1 > n) n = (uint32_t)j + 1;
        errno = 0;
        char *meta = psd_ckpt_meta_read(dir, (uint32_t)j), cl[sizeof m->cluster + 8] = "";
        if (meta == NULL) { /* a copy cut short has none; any other failure keeps dir */
            other = errno != ENOENT;
            continue;
        }
        psd_ckpt_meta_field(meta, "cluster", cl, sizeof cl);
        uint32_t mn = psd_ckpt_meta_nshards(meta);
        free(meta);
        if (strcmp(cl, m->cluster) != 0 || mn == 0) other = 1; /* another cluster's */
        ours = 1;
        if (mn > n) n = mn;
    }
    closedir(d);
    uint64_t every = n >= 64 ? ~0ull : (1ull << n) - 1;
    *nshards = n;
    return ours && !other && (present & every) != every; /* some shard's part is missing */
}

/* Whether @p dir holds nothing but psctl's cancel marks (D/cancelled-ID) and shard-J
 * directories, at least one mark: what a checkpoint psctl gave up while a shard did not answer
 * leaves (psctl_checkpoint.c). Each shard-J is empty, or holds only files a checkpoint writes,
 * all last changed before @p before: the part of a shard killed while it copied, which no
 * process will drop (a shard started again does not know of it; a helper's probe, session 58:
 * such a part, ~4x the shard's size, stayed for good, and a later checkpoint at that step, as
 * after a restore, was refused by that shard). A fresh one may be a stopped shard's, which
 * drops it when it resumes. *@p nshards: how many shard-J to remove; *@p parts: whether a
 * shard-J holds files. */
static int cancelled_only(const char *dir, time_t before, uint32_t *nshards, int *parts)
{
    DIR *d = opendir(dir);
    if (d == NULL) return 0;
    *parts = 0;
    int marks = 0, other = 0;
    uint32_t n = 0;
    struct dirent *e;
    while (!other && (e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0) continue;
        if (cancel_mark_name(nm)) {
            marks++;
            continue;
        }
        int j = part_number(nm);
        char sub[PS_PATH_MAX + 256];
        snprintf(sub, sizeof sub, "%s/%.60s", dir, nm);
        struct stat st;
        DIR *sd = j >= 0 && lstat(sub, &st) == 0 && S_ISDIR(st.st_mode) ? opendir(sub) : NULL;
        other = sd == NULL;
        struct dirent *se;
        int files = 0;
        while (sd && (se = readdir(sd)) != NULL)
            files |= strcmp(se->d_name, ".") != 0 && strcmp(se->d_name, "..") != 0;
        if (sd) closedir(sd);
        other |= files && !(old_entry(sub, S_IFDIR, before) && part_files_old(sub, before));
        *parts |= files;
        if ((uint32_t)j + 1 > n) n = (uint32_t)j + 1;
    }
    closedir(d);
    *nshards = n;
    return marks > 0 && !other;
}

/* Remove @p dir, which abandoned() or cancelled_only() found: psctl's cancel marks, then the
 * parts (only the files a checkpoint writes), then @p dir. 0 or -errno (what is left stays). */
static int remove_leftover(const char *dir, uint32_t nshards)
{
    DIR *d = opendir(dir);
    if (d == NULL) return -errno;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!cancel_mark_name(e->d_name)) continue;
        char mark[PS_PATH_MAX + 256];
        snprintf(mark, sizeof mark, "%s/%.60s", dir, e->d_name);
        if (unlink(mark) != 0 && rc == 0) rc = -errno;
    }
    closedir(d);
    return rc ? rc : psctl_checkpoint_remove(dir, nshards);
}

/* Keep the newest @p keep complete checkpoints of this cluster in @p base; remove the rest,
 * the directories of cancelled checkpoints that hold only psctl's marks (cancelled_only), and,
 * when this host sees every part of @p just (the checkpoint that just completed, begun at
 * @p began), incomplete checkpoints of this cluster whose every file predates @p began by
 * ABANDONED_S (abandoned()).
 * Called after a checkpoint completed: every shard took its arm, and a shard's arm drops a
 * cancelled checkpoint it still held (checkpoint.c), so no shard looks for those marks any
 * more; before, such directories piled up while a shard was unreachable, and the parts a
 * psctl killed while it armed the shards left stayed for good. */
static void prune(const ps_manifest_t *m, const char *base, uint32_t keep, const char *just,
                  time_t began)
{
    /* Parts on each host's own disk (not shared storage): shard 0's host sees only its own,
     * and every checkpoint, complete or not, looks incomplete from here. */
    const int sees_all = recognise(m, just, NULL) != UINT64_MAX;
    DIR *d = opendir(base);
    if (d == NULL) return;
    kept_t *all = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        char dir[PS_PATH_MAX + 128];
        if (!checkpoint_entry(base, nm, dir, sizeof dir)) continue;
        uint32_t nsh = 0;
        uint64_t step = recognise(m, dir, &nsh);
        if (step == UINT64_MAX) {
            bool left = sees_all && abandoned(m, dir, began - ABANDONED_S, &nsh);
            int parts = 0;
            if (!left && !cancelled_only(dir, began - ABANDONED_S, &nsh, &parts)) continue;
            char why[320];
            if (left)
                snprintf(why, sizeof why, "an incomplete checkpoint (parts of some of its %u "
                         "shards), untouched for more than %d s before this checkpoint began "
                         "(its psctl was killed while it armed the shards, or a shard's copy "
                         "was cut short)", nsh, ABANDONED_S);
            else if (parts)
                snprintf(why, sizeof why, "a cancelled checkpoint: its marks, and parts "
                         "untouched for more than %d s (a shard's copy cut short)", ABANDONED_S);
            else
                snprintf(why, sizeof why, "only the marks of a cancelled checkpoint were left "
                         "there");
            int rc = remove_leftover(dir, nsh);
            if (rc)
                fprintf(stderr, "psctl: follow: cannot remove %s, %s: %s (what is left of it "
                        "stays)\n", dir, why, strerror(-rc));
            else
                printf("psctl: follow: removed %s: %s\n", dir, why);
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            kept_t *na = realloc(all, cap * sizeof *all);
            if (na == NULL) break;
            all = na;
        }
        snprintf(all[n].name, sizeof all[n].name, "%.60s", nm);
        all[n].nshards = nsh;
        all[n++].step = step;
    }
    closedir(d);
    if (n > keep) qsort(all, n, sizeof *all, by_step);
    for (size_t i = 0; i + keep < n; i++) {
        char dir[PS_PATH_MAX + 128];
        snprintf(dir, sizeof dir, "%s/%s", base, all[i].name);
        int rc = psctl_checkpoint_remove(dir, all[i].nshards);
        if (rc)
            fprintf(stderr, "psctl: follow: cannot remove old checkpoint %s: %s (what is left "
                    "of it stays)\n", dir, strerror(-rc));
        else
            printf("psctl: follow: removed checkpoint %s (step %llu): keeping the newest %u\n",
                   dir, (unsigned long long)all[i].step, keep);
    }
    fflush(stdout);
    free(all);
}

/* ---- the loop ------------------------------------------------------------------------------ */

static uint64_t next_multiple(uint64_t step, uint64_t every)
{
    return (step / every + 1) * every;
}

/* ---- tensors no push reached (bsp) ------------------------------------------------------- */

#define STRAY_CHECK_S 1.0  /* how often the shards are asked for such tensors */
#define STRAY_RETRY_S 10.0 /* the same after a refusal or an error */
#define STRAY_PER_PASS 16  /* tensors dropped per shard and pass at most */
#define PART_DECLARED_S 10.0 /* how long a tensor must stay on some shards only to be dropped */

typedef char stray_name_t[PS_NAME_MAX + 8];

/*
 * Drop the tensors that the shards say no push reached (status `untrained_first`, each shard
 * asked again after a drop) through psctl_forget, whose checks take one only once the job's
 * open step is 2 or more (shard 0) and only where no push reached its chunks (each shard):
 * then every member pushed step 1 of every tensor it has, so one that no push reached is in no
 * member's model (a worker that died between its declarations and its first batch request left
 * it), a later worker that has it is refused (another training set than the job's), and its
 * chunks at step 0 hold each shard's step there, so that every checkpoint of the job failed
 * ("passed step S before its snapshot") and psd's follower went on without one (found in
 * session 56). A refusal (step 1 still open, a push reached it meanwhile) is said once per
 * shard and name (@p said) and tried again later. Ends at a signal (the requests are
 * cancelled). @return the seconds until the next pass.
 */
static double drop_strays(ps_req_t *cl, const ps_manifest_t *m, stray_name_t *said)
{
    double next = STRAY_CHECK_S;
    ps_req_set_cancel(cl, &g_stop);
    for (int i = 0; i < m->nservers && !g_stop; i++) {
        for (int k = 0; k < STRAY_PER_PASS && !g_stop; k++) {
            char err[512], v[32];
            stray_name_t name, shown; /* the name exactly (for the forget), and for a log line */
            char *json = psctl_status_json(cl, (uint32_t)i, err, sizeof err, NULL);
            if (json == NULL) break; /* busy, restarting or stopped: the next shard */
            int have = ps_json_field(json, "untrained_tensors", v, sizeof v) && atoi(v) > 0 &&
                       ps_json_str_field(json, "untrained_first", shown, sizeof shown);
            /* A control byte in a name is escaped in status (\u0001 for byte 1): undone exactly
             * for the forget; the log line keeps the display form (\x01), as a raw control
             * byte could forge a line of psd's log. */
            int exact = have && ps_json_str_exact(json, "untrained_first", name, sizeof name);
            free(json);
            if (!have) {
                said[i][0] = '\0';
                break;
            }
            int dropped = 0, rc = exact ? psctl_forget(cl, m, name, false, &dropped, err, sizeof err)
                                        : PS_EINVAL;
            if (rc == 0) {
                printf("psctl: follow: dropped tensor '%s' from %d shard%s: no push reached "
                       "it, so no worker of the job has it (one that left before its first step "
                       "declared it), and its chunks at step 0 held every checkpoint back\n",
                       shown, dropped, dropped == 1 ? "" : "s");
                fflush(stdout);
                said[i][0] = '\0';
                continue; /* this shard's next one */
            }
            if (!exact) snprintf(err, sizeof err, "its name cannot be read back from shard %d's "
                                 "status", i);
            if (!g_stop && strcmp(said[i], shown) != 0) {
                fprintf(stderr, "psctl: follow: tensor '%s', which no push reached, holds the "
                        "checkpoints back; not dropped (yet): %s\n", shown, err);
                snprintf(said[i], sizeof said[i], "%s", shown);
            }
            next = STRAY_RETRY_S;
            break;
        }
    }
    ps_req_set_cancel(cl, NULL);
    return next;
}

/* The id of a tensor some shard holds and another does not (PS_ENOENT there; one being
 * created answers PS_EBUSY, and a shard that does not answer is not judged), or -1: every
 * shard holds the cluster's whole table. Only looked for where the shards' counts differ
 * (status `tensors`), from the highest id (status `tensor_ids`) down: the last declared is the
 * likeliest. Reads no export snapshot (PS_MSG_EXPORT_BEGIN would hold one of shard 0's store
 * while it is not ended: a review, session 73). @p name (PS_NAME_MAX bytes) gets its name. */
static int64_t table_gap(ps_req_t *cl, const ps_manifest_t *m, char *name)
{
    char err[512], v[32];
    long long count0 = -1, ids = 0;
    bool differ = false;
    for (int i = 0; i < m->nservers && !g_stop; i++) {
        char *json = psctl_status_json(cl, (uint32_t)i, err, sizeof err, NULL);
        long long n = json && ps_json_field(json, "tensors", v, sizeof v) ? atoll(v) : -1;
        long long k = json && ps_json_field(json, "tensor_ids", v, sizeof v) ? atoll(v) : -1;
        free(json);
        if (n < 0 || k < 0) return -1; /* not answering now (or an older psd): not judged */
        if (i == 0) count0 = n;
        differ |= n != count0;
        if (k > ids) ids = k;
    }
    for (long long id = ids - 1; differ && id >= 0 && !g_stop; id--) {
        ps_msg_t q = {.type = PS_MSG_EXPORT_TENSOR, .rank = -1, .tensor = (uint32_t)id}, r;
        bool held = false, absent = false, unsure = false;
        for (int i = 0; i < m->nservers && !unsure; i++) {
            int rc = ps_req_call(cl, (uint32_t)i, &q, &r, NULL, NULL, err, sizeof err);
            if (rc == PS_ENOENT) {
                absent = true;
            } else if (rc == 0 && r.has_decl) {
                if (!held) snprintf(name, PS_NAME_MAX, "%s", r.decl.name);
                held = true;
            } else {
                unsure = true; /* being created there, or no answer: not judged this pass */
            }
        }
        if (held && absent && !unsure) return id;
    }
    return -1;
}

/*
 * Drop a tensor that some shards hold and others do not: its declaration stopped part-way (the
 * declaring worker died between the shards: shard 0 numbers a tensor first; or it was dropped
 * from the job while stopped, and went on after the tensor was forgotten), and no worker can
 * have trained it (a declaration completes on every shard before its first push). It made
 * every checkpoint fail ("holds another tensor table"), and under bsp no stray check found it
 * where its chunks are all on a shard that lacks it (a review, session 73). A gap that every
 * pass found for PART_DECLARED_S is dropped, through psctl_forget's checks (bsp: past step 1,
 * where shard 0 refuses new tensors; asp / ssp: a job with no member): a declaration in flight
 * reaches the next shard in milliseconds, unless that shard stalls. @p seen: the gap of the
 * last pass (-1: none), found since *@p since. @return the seconds until the next pass.
 */
static double drop_part_declared(ps_req_t *cl, const ps_manifest_t *m, int64_t *seen,
                                 double *since)
{
    char name[PS_NAME_MAX] = "", err[512];
    ps_req_set_cancel(cl, &g_stop);
    int64_t gap = table_gap(cl, m, name);
    double next = STRAY_CHECK_S;
    if (gap != *seen) *since = psctl_mono_s();
    if (gap >= 0 && psctl_mono_s() - *since >= PART_DECLARED_S) {
        int dropped = 0;
        char shown[PS_NAME_MAX];
        snprintf(shown, sizeof shown, "%s", name);
        psctl_printable(shown);
        if (psctl_forget(cl, m, name, false, &dropped, err, sizeof err) == 0) {
            printf("psctl: follow: dropped tensor '%s' from %d shard%s: its declaration stopped "
                   "part-way (other shards lack it: a worker that died while declaring it), "
                   "and it held every checkpoint back\n", shown, dropped, dropped == 1 ? "" : "s");
            fflush(stdout);
            gap = -1;
        } else if (!g_stop) {
            static int64_t said = -1; /* said once per tensor */
            if (said != gap)
                fprintf(stderr, "psctl: follow: tensor '%s', declared on some shards only, holds "
                        "the checkpoints back; not dropped (yet): %s\n", shown, err);
            said = gap;
            next = STRAY_RETRY_S;
        }
    }
    *seen = gap;
    ps_req_set_cancel(cl, NULL);
    return next;
}

int psctl_checkpoint_follow(const ps_manifest_t *m, double timeout_s, double wait_s)
{
    const ps_checkpoint_conf_t *ck = &m->checkpoint;
    if (!ck->present) {
        fprintf(stderr, "psctl: checkpoint --follow: %s has no checkpoint section\n", m->path);
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: waits end early */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (!ps_signal_ignored(SIGHUP)) /* its terminal closed; one ignored (nohup) stays so */
        sigaction(SIGHUP, &sa, NULL);
    char base[PS_PATH_MAX + 32], dir[1024], err[512];
    char tmp[PS_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s/../checkpoints", m->servers[0].data_dir);
    if (psctl_absolute(base, sizeof base, ck->dir[0] ? ck->dir : tmp) != 0) {
        fprintf(stderr, "psctl: checkpoint --follow: cannot make '%s' absolute (the working "
                "directory is gone, or its path too long)\n", ck->dir[0] ? ck->dir : tmp);
        return 2;
    }
    ps_req_t *cl;
    /* A secret_file this host refuses is the manifest's (exit 2, as check and status say it). */
    int orc = ps_req_open(m, timeout_s, &cl, err, sizeof err);
    if (orc) {
        fprintf(stderr, "psctl: %s\n", err);
        return orc == PS_ECONFIG ? 2 : 1;
    }
    const int bsp = m->job.consistency == PS_CONSIST_BSP;
    const uint64_t every = ck->every_steps;
    const uint64_t per_step = bsp ? 0 : (uint64_t)m->job.workers * m->job.batch_size; /* >= 1 */
    printf("psctl: follow: checkpoints of cluster '%s' every %llu steps, every %llu s (0: not "
           "by that) into %s, keeping the newest %u\n", m->cluster, (unsigned long long)every,
           (unsigned long long)ck->every_s, base, ck->keep);
    fflush(stdout);
    double last = psctl_mono_s();
    uint64_t target = 0; /* the next multiple of every (0: not known yet) */
    double drain_t0 = 0;  /* asp / ssp: when the batches in flight were first waited for */
    const double drain_s = ck->drain_s; /* asp / ssp: how long a checkpoint waits for them */
    int ret = 0, taken = 0;
    uint64_t id = 0; /* the checkpoint being asked for (psctl_checkpoint_id), 0 before one */
    char seen_run[32] = ""; /* the run set_aside last ran for */
    static stray_name_t stray_said[PS_MAX_SERVERS]; /* drop_strays' refusals, each said once */
    double stray_at = 0; /* drop_strays' next time */
    int64_t gap_seen = -1; /* drop_part_declared's last gap, found since gap_since */
    double gap_since = 0;
    while (!g_stop) {
        if (psctl_mono_s() >= stray_at) {
            double in = bsp ? drop_strays(cl, m, stray_said) : STRAY_CHECK_S;
            double in2 = drop_part_declared(cl, m, &gap_seen, &gap_since);
            stray_at = psctl_mono_s() + (in2 > in ? in2 : in);
            if (g_stop) break;
        }
        uint64_t open = 0, run_base = 0;
        int finished = 0;
        char run[32];
        if (target == 0 || !bsp || every == 0) {
            int js = job_status(cl, per_step, &open, &finished, run, &run_base);
            if (refused_for_good(js)) {
                ret = 1;
                break;
            }
            if (js) {
                sleep_ms(1000); /* shard 0 is busy or restarting: ask again */
                continue;
            }
            /* Shard 0's run changes only when shard 0 starts again (psd's own follower starts
             * with it; one run by hand reconnects and sees the new run here). */
            if (strcmp(run, seen_run) != 0) {
                set_aside(m, base, run, run_base);
                snprintf(seen_run, sizeof seen_run, "%s", run);
                /* A restore may have taken the job back: the next multiple is counted from
                 * where it is now, not where the old run was. */
                target = 0;
            }
            if (finished) break;
            if (every && target == 0) target = next_multiple(open, every);
        }
        int due_time = ck->every_s && psctl_mono_s() - last >= (double)ck->every_s;
        uint64_t want; /* the step asked for: 0 for now */
        if (due_time)
            want = 0;
        else if (every && bsp)
            want = target;
        else if (every && open >= target)
            want = 0; /* asp / ssp: the count passed a multiple */
        else {
            sleep_ms(STATUS_POLL_MS);
            continue;
        }
        double t0 = psctl_mono_s();
        if (id == 0) id = psctl_checkpoint_id(); /* asks again while pending are the same one */
        ps_msg_t q = {.type = PS_MSG_CKPT_BEGIN, .rank = -1, .step = want, .count = id}, r;
        int rc = ps_req_call(cl, 0, &q, &r, NULL, NULL, err, sizeof err);
        if (rc == PS_ECONFLICT) { /* past it (a restarted follower): take the next one */
            printf("psctl: follow: %s; waiting for the next multiple of %llu\n", err,
                   (unsigned long long)every);
            target = 0;
            continue;
        }
        if (rc) {
            fprintf(stderr, "psctl: follow: %s\n", err);
            if (refused_for_good(rc)) {
                ret = 1;
                break;
            }
            sleep_ms(1000);
            continue;
        }
        if (r.flags & PS_FLAG_FINISHED) break;
        if ((r.flags & PS_FLAG_PENDING) && !bsp) {
            /* The coordinator holds the hand-outs until the batches in flight are applied
             * everywhere (the cut). A worker that hangs holding one would hold the job for as
             * long as we ask: past drain_s this checkpoint is skipped and the hold released. */
            if (drain_t0 == 0) drain_t0 = t0;
            if (t0 - drain_t0 > drain_s) {
                fprintf(stderr, "psctl: follow: checkpoint skipped: %u batches still in flight "
                        "after %.0f s (a worker holding one is slow or hung); going on\n",
                        r.workers, drain_s);
                ps_msg_t g = {.type = PS_MSG_CKPT_GO, .rank = -1, .count = id};
                ps_req_call(cl, 0, &g, &r, NULL, NULL, err, sizeof err);
                drain_t0 = 0;
                id = 0;
                last = psctl_mono_s();
                if (every) target = next_multiple(open, every);
                continue;
            }
            sleep_ms(POLL_MS);
            continue;
        }
        drain_t0 = 0;
        if (r.flags & PS_FLAG_PENDING) {
            sleep_ms(POLL_MS);
            continue;
        }
        uint64_t step = r.step;
        if (psctl_checkpoint_dir(m, base, step, dir, sizeof dir)) {
            fprintf(stderr, "psctl: follow: checkpoint directory under %s is too long\n", base);
            ret = 1;
            break;
        }
        uint64_t next = every && bsp && step != UINT64_MAX ? next_multiple(step, every) : 0;
        if (step != UINT64_MAX) /* before it is said: `dir` is the one pruned against */
            psctl_checkpoint_dir_free(m, dir, sizeof dir);
        if (step == UINT64_MAX) /* asp / ssp: no common step; the shards say theirs after */
            printf("psctl: follow: checkpoint into %s\n", dir);
        else
            printf("psctl: follow: checkpoint at step %llu into %s\n", (unsigned long long)step,
                   dir);
        fflush(stdout);
        uint64_t this_id = id;
        id = 0;
        time_t began = time(NULL);
        if (psctl_checkpoint_run(cl, m, step, this_id, dir, next, wait_s, t0, 0) == 0) {
            taken++;
            prune(m, base, ck->keep, dir, began);
        } else {
            fprintf(stderr, "psctl: follow: the checkpoint into %s failed; going on\n", dir);
            stray_at = 0; /* a tensor no push reached may be why: looked for before the next */
        }
        last = psctl_mono_s();
        if (every) target = next ? next : next_multiple(open, every);
    }
    /* A hold ahead must not outlive us (the coordinator would end it after 10 s anyway): one
     * asked for and pending (asp / ssp: keyed by id), or under bsp the next multiple that each
     * checkpoint's GO holds ahead (any GO releases it). A psd that is stopping (it signalled
     * us) answers before it stops (psd_follower_reap): PS_EBUSY, shutting down, and the hold
     * ends with it. */
    if (g_stop && (id != 0 || bsp)) {
        ps_msg_t g = {.type = PS_MSG_CKPT_GO, .rank = -1, .count = id}, r;
        int rc = ps_req_call(cl, 0, &g, &r, NULL, NULL, err, sizeof err);
        if (rc && rc != PS_EBUSY)
            fprintf(stderr, "psctl: follow: releasing the checkpoint hold: %s\n", err);
    }
    printf("psctl: follow: %s after %d %s\n",
           g_stop == SIGTERM  ? "SIGTERM: stopping"
           : g_stop == SIGINT ? "SIGINT: stopping"
           : g_stop           ? "SIGHUP: stopping"
           : ret              ? "stopping at that error" /* not "the job is finished" */
                              : "the job is finished: stopping",
           taken, taken == 1 ? "checkpoint" : "checkpoints");
    ps_req_close(cl);
    return ret;
}
