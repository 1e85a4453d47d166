/* restore.c: psd --restore DIR: fill an empty data_dir from a checkpoint (see checkpoint.h).
 *
 * A checkpoint is DIR/shard-J/ (a compact LMDB environment and meta.json) for every shard J of
 * the cluster that took it. Its number of shards may differ from this manifest's: every
 * chunk is placed again with ps_place_shard(first_chunk + c, nshards of this manifest), and
 * each shard reads every DIR/shard-J for the chunks it owns now. The records are copied byte
 * for byte (version, hashes, parameters and optimizer state), each checked against its hash
 * first. Runs on the loop thread before the loop starts. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "durable.h"
#include "ckpt_meta.h"
#include "place.h"
#include "regfile.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"

int psd_restore_check(const ps_manifest_t *m, const char *data_dir, const char *dir, char *err,
                      size_t errlen)
{
    DIR *d = opendir(data_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) break;
        char from[PS_PATH_MAX];
        if (e && psd_restore_marked(data_dir, from, sizeof from)) {
            /* Its own restore, cut short: said as a start without --restore says it (a
             * helper's probe, session 58: only "not empty (it holds 'lock.mdb')"). */
            snprintf(err, errlen, "--restore %s: data_dir %s holds a restore from %s that did "
                     "not finish (psd stopped during it): remove the data_dir and run psd "
                     "--restore again", dir, data_dir, from[0] ? from : "a checkpoint");
            closedir(d);
            return -EEXIST;
        }
        if (e) {
            snprintf(err, errlen, "--restore %s: data_dir %s is not empty (it holds '%s'); a "
                     "restore fills only an empty or missing data_dir", dir, data_dir, e->d_name);
            closedir(d);
            return -EEXIST;
        }
        closedir(d);
    }
    char *j0 = psd_ckpt_meta_read(dir, 0);
    if (j0 == NULL) {
        snprintf(err, errlen, "--restore %s: no checkpoint there (cannot read shard-0/%s: %s)",
                 dir, PSD_CKPT_META, errno == EINVAL ? "not a regular file" : strerror(errno));
        return PS_ECONFIG;
    }
    uint64_t n = psd_ckpt_meta_nshards(j0), step = psd_ckpt_meta_u64(j0, "step");
    char why[512];
    int rc = psd_ckpt_meta_fits(j0, m, why, sizeof why);
    if (rc) snprintf(err, errlen, "--restore %s: %s", dir, why);
    else if (n == 0)
        snprintf(err, errlen, "--restore %s: shard-0/%s has no valid nshards (1 to %d)", dir,
                 PSD_CKPT_META, PS_MAX_SERVERS),
            rc = PS_ECONFIG;
    if (rc == 0 && psd_ckpt_meta_agree(j0, j0, 0, why, sizeof why))
        snprintf(err, errlen, "--restore %s: %s", dir, why), rc = PS_ECONFIG;
    for (uint32_t k = 1; rc == 0 && k < n; k++) {
        char *jk = psd_ckpt_meta_read(dir, k);
        if (jk == NULL)
            snprintf(err, errlen, "--restore %s: cannot read shard-%u/%s (%s; the checkpoint was "
                     "taken on %llu shards): incomplete checkpoint", dir, k, PSD_CKPT_META,
                     errno == EINVAL ? "not a regular file" : strerror(errno),
                     (unsigned long long)n), rc = PS_ECONFIG;
        else if (psd_ckpt_meta_agree(j0, jk, k, why, sizeof why))
            snprintf(err, errlen, "--restore %s: %s", dir, why), rc = PS_ECONFIG;
        else if (m->job.consistency == PS_CONSIST_BSP && psd_ckpt_meta_u64(jk, "step") != step &&
                 psd_ckpt_meta_u64(jk, "records_bytes") != 0) /* an asp one restored as bsp */
            snprintf(err, errlen, "--restore %s: shard-%u is at step %llu, shard-0 at step %llu: "
                     "a bsp job cannot start from it", dir, k,
                     (unsigned long long)psd_ckpt_meta_u64(jk, "step"),
                     (unsigned long long)step), rc = PS_ECONFIG;
        free(jk);
    }
    free(j0);
    return rc;
}

int psd_restore_mark(const char *data_dir, const char *from, char *err, size_t errlen)
{
    char path[1200], tmp[1230];
    int rc = ps_mkdir_durable(data_dir);
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/%s", data_dir, PSD_RESTORE_MARK);
        /* Its own name: two restores of one shard at once renamed each other's (the loser
         * said "cannot mark the restore under way: No such file or directory"; a probe); the
         * store's lock then names the one that lost. */
        snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
        FILE *f = fopen(tmp, "w");
        if (f == NULL) {
            rc = -errno;
        } else {
            fprintf(f, "%s\n", from);
            rc = fflush(f) || fsync(fileno(f)) ? -errno : 0;
            fclose(f);
            if (rc == 0) rc = ps_rename_durable(tmp, path);
            if (rc) unlink(tmp); /* else the next --restore finds the data_dir not empty */
        }
    }
    if (rc) snprintf(err, errlen, "%s: cannot mark the restore under way: %s", data_dir,
                     strerror(-rc));
    return rc;
}

int psd_restore_marked(const char *data_dir, char *from, size_t cap)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", data_dir, PSD_RESTORE_MARK);
    /* Never blocking on what stands there: a FIFO by that name hung every start of psd (a
     * review, session 70). Something not a regular file there marks it too (its origin
     * unknown); a mark that cannot be opened otherwise reads as none, as before. */
    struct stat st;
    int fd = ps_open_regular(path, O_NOFOLLOW, &st);
    if (cap) from[0] = '\0';
    if (fd == -EINVAL || fd == -ELOOP) return 1;
    FILE *f = fd < 0 ? NULL : fdopen(fd, "r");
    if (f == NULL) {
        if (fd >= 0) close(fd);
        return 0;
    }
    if (cap && fgets(from, (int)cap, f) == NULL) from[0] = '\0';
    fclose(f);
    if (cap) from[strcspn(from, "\n")] = '\0';
    return 1;
}

void psd_restore_unmark(const char *data_dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", data_dir, PSD_RESTORE_MARK);
    if (unlink(path) == 0)
        ps_fsync_dir(data_dir); /* a start after a crash must not find a finished restore's mark */
}

/* What a restore made: the store psd_store_open creates, then its mark (last: undo_files + 3). */
static const char *const undo_files[] = {"data.mdb", "lock.mdb", "psd.lock", PSD_RESTORE_MARK};

void psd_restore_undo_on_fault(const char *data_dir)
{
    psd_ckpt_bus_unlink(data_dir, undo_files, (int)(sizeof undo_files / sizeof *undo_files));
}

void psd_restore_mark_on_fault(const char *data_dir)
{
    psd_ckpt_bus_unlink(data_dir, undo_files + 3, 1); /* PSD_RESTORE_MARK alone */
}

void psd_restore_undo(const char *data_dir)
{
    psd_restore_undo_on_fault(NULL); /* removed now: not again at a fault */
    char path[1200];
    for (size_t i = 0; i < sizeof undo_files / sizeof *undo_files; i++) {
        snprintf(path, sizeof path, "%s/%s", data_dir, undo_files[i]);
        unlink(path);
    }
}

/* About the bytes this shard's store takes from checkpoint @p dir of @p nold parts (their
 * meta.json's records_bytes): its own part's on the same layout, else an even share of all
 * with room for an uneven placement; a quarter more for LMDB's pages. */
static uint64_t restore_need(const psd_server_t *srv, const char *dir, uint32_t nold)
{
    uint64_t total = 0, mine = 0;
    for (uint32_t j = 0; j < nold; j++) {
        char *mj = psd_ckpt_meta_read(dir, j);
        uint64_t b = mj ? psd_ckpt_meta_u64(mj, "records_bytes") : 0;
        free(mj);
        if (b == UINT64_MAX || b > (1ull << 50)) b = 0; /* absent (an older psctl's), or odd */
        total += b;
        if (j == srv->shard) mine = b;
    }
    uint64_t share = nold == (uint32_t)srv->m.nservers ? mine
                                                       : total / (uint64_t)srv->m.nservers * 3 / 2;
    if (share > total) share = total;
    return share + share / 4;
}

int psd_restore_fill(psd_server_t *srv, const char *dir, char *err, size_t errlen)
{
    char *j0 = psd_ckpt_meta_read(dir, 0);
    if (j0 == NULL) {
        snprintf(err, errlen, "--restore %s: cannot read shard-0/%s", dir, PSD_CKPT_META);
        return PS_ECONFIG;
    }
    uint32_t nold = (uint32_t)psd_ckpt_meta_u64(j0, "nshards");
    uint64_t step = psd_ckpt_meta_u64(j0, "step");
    char from[32] = "", ckid[32] = "";
    psd_ckpt_meta_field(j0, "run", from, sizeof from); /* absent before runs: parent 0 */
    psd_ckpt_meta_field(j0, "checkpoint", ckid, sizeof ckid); /* absent before ids */
    free(j0);
    /* A new run, from the checkpoint's step: checkpoints the old run took past it belong to
     * another history (psctl_follow.c sets them aside). Its origin, the checkpoint's id, is
     * every shard's restored from it: libps refuses a cluster whose shards' origins differ (a
     * shard restored alone would lose the updates the others kept). A checkpoint without an
     * id (an older psctl) stands by its step. */
    psd_run_t run = {.id = psd_run_new_id(), .parent = strtoull(from, NULL, 16),
                     .base_step = step == UINT64_MAX ? 0 : step,
                     .origin = psd_run_origin(strtoull(ckid, NULL, 16), step)};
    bool bsp = srv->m.job.consistency == PS_CONSIST_BSP;
    ps_decl_t *decl = NULL; /* by id; name[0] == 0: absent */
    uint32_t ndecl = 0;
    uint64_t want = 0, got = 0, bytes = 0;
    /* bsp: the ranks every chunk of the checkpoint (all parts) applied step - 1 with, and how
     * many chunks' records told it, of @c total (PSD_RESTORE_APPLIED_BLOB); @c seen: which
     * chunks did (tensor t's chunk c at cbase[t] + c), so that a chunk with two records counts
     * once. Without the memory for them no blob is written (every rank stays pending). */
    uint64_t all_applied = ~0ull, told = 0, total = 0, *cbase = NULL;
    uint8_t *seen = NULL;
    psd_wtxn_t tx;
    psd_ckpt_src_t s = {0};
    /* Its disk blocks first: the fill writes the records through the map, and a page the disk
     * could not back faulted under the checkpoint reader's guard, which then called a good
     * checkpoint damaged (a review, session 72: "a page lies past the end of the file"). */
    uint64_t need = restore_need(srv, dir, nold);
    if (need > PSD_STORE_AHEAD && psd_store_ahead(&srv->store, need) != 0) {
        snprintf(err, errlen, "--restore %s: the disk under data_dir is full: this shard's part "
                 "of the checkpoint needs about %llu MiB (free some space, or move data_dir)",
                 dir, (unsigned long long)(need >> 20));
        return PS_ENOSPC;
    }
    /* Committed before the fill and deleted in its transaction: a psd killed in between leaves
     * it, and a later start refuses the half-made store (server.c) instead of serving it. */
    int rc = psd_store_set_blob(&srv->store, PSD_RESTORING, dir, strlen(dir)), mrc;
    if (rc == 0) rc = psd_store_begin(&srv->store, &tx);
    if (rc) {
        snprintf(err, errlen, "cannot mark the store as being restored: %s", ps_strerror(rc));
        return rc;
    }
    for (uint32_t j = 0; rc == 0 && j < nold; j++) {
        if ((mrc = psd_ckpt_src_open(&s, dir, j, srv->m.map_size_mb)) != 0) {
            snprintf(err, errlen, "--restore %s: cannot open shard-%u: %s", dir, j,
                     psd_ckpt_src_strerror(mrc));
            rc = PS_ESTORE;
            break;
        }
        MDB_cursor *cur;
        if ((mrc = mdb_cursor_open(s.txn, s.dbi, &cur)) != 0) {
            snprintf(err, errlen, "--restore %s: shard-%u: %s", dir, j, mdb_strerror(mrc));
            rc = PS_ESTORE;
            break;
        }
        MDB_val k, v;
        if (j == 0) { /* the tensor table and the coordinator's blob come from shard 0 */
            for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && mrc == 0;
                 mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
                const uint8_t *kp = k.mv_data;
                if (k.mv_size == 5 && kp[0] == 'T') {
                    /* Checked before any use (its shape drives every size below): a record
                     * damaged in the copy crashed the restore (ndim 0x10000000). */
                    ps_decl_t d;
                    char why[PS_NAME_MAX + 96] = "";
                    if (v.mv_size == sizeof d) memcpy(&d, v.mv_data, sizeof d);
                    if (v.mv_size != sizeof d)
                        snprintf(why, sizeof why, "it is %zu bytes, not %zu", v.mv_size,
                                 sizeof d);
                    else if (d.id != psd_ckpt_rd32(kp + 1) || d.id >= PSD_MAX_TENSORS)
                        snprintf(why, sizeof why, "it says tensor %u", d.id);
                    else
                        ps_decl_check(&d, why, sizeof why);
                    if (why[0]) {
                        snprintf(err, errlen, "--restore %s: shard-0: tensor record %u is "
                                 "malformed: %s", dir, psd_ckpt_rd32(kp + 1), why);
                        rc = PS_ESTORE;
                        break;
                    }
                    if (d.id >= ndecl) {
                        ps_decl_t *nd = realloc(decl, (d.id + 1) * sizeof *nd);
                        if (nd == NULL) {
                            rc = PS_ENOMEM;
                            break;
                        }
                        memset(nd + ndecl, 0, (d.id + 1 - ndecl) * sizeof *nd);
                        decl = nd;
                        ndecl = d.id + 1;
                    }
                    decl[d.id] = d;
                    rc = psd_store_put_tensor(&tx, &d);
                    uint64_t numel = ps_decl_numel(&d);
                    uint32_t nc = ps_chunk_count(numel, srv->chunk_elems);
                    for (uint32_t c = 0; c < nc; c++)
                        want += ps_place_shard(d.first_chunk + c, srv->nshards) == srv->shard;
                    total += nc;
                } else if (srv->shard == 0 && k.mv_size == 4 && memcmp(kp, "Mjob", 4) == 0) {
                    rc = psd_store_put_blob(&tx, "job", v.mv_data, v.mv_size);
                } else if (srv->shard == 0 && k.mv_size == 7 && memcmp(kp, "Mjobrec", 7) == 0) {
                    /* what failures had left to settle when the checkpoint's state was saved */
                    rc = psd_store_put_blob(&tx, "jobrec", v.mv_data, v.mv_size);
                }
            }
            if (rc == 0 && mrc != MDB_NOTFOUND) { /* not the end: a page it could not read */
                snprintf(err, errlen, "--restore %s: shard-0: reading its tensor table stopped: "
                         "%s", dir, mdb_strerror(mrc));
                rc = PS_ESTORE;
            }
            if (rc == 0 && bsp && srv->shard == 0 && total &&
                (cbase = calloc(ndecl, sizeof *cbase)) != NULL &&
                (seen = calloc(total, 1)) != NULL) {
                uint64_t at = 0;
                for (uint32_t t = 0; t < ndecl; t++) {
                    cbase[t] = at;
                    if (decl[t].name[0] != '\0')
                        at += ps_chunk_count(ps_decl_numel(&decl[t]), srv->chunk_elems);
                }
            }
        }
        psd_ckpt_others_t others;
        psd_ckpt_others_init(&others);
        for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && mrc == 0;
             mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            const uint8_t *kp = k.mv_data;
            psd_ckpt_others_add(&others, &k, &v);
            if (k.mv_size == 9 && (kp[0] == 'D' || kp[0] == 'C')) {
                /* A chunk index past its tensor's end: ps_chunk_len() wraps for it, and such a
                 * record counted for a missing one. */
                uint32_t t = psd_ckpt_rd32(kp + 1), c = psd_ckpt_rd32(kp + 5);
                if (t < ndecl && decl[t].name[0] != '\0' &&
                    c >= ps_chunk_count(ps_decl_numel(&decl[t]), srv->chunk_elems)) {
                    snprintf(err, errlen, "--restore %s: shard-%u holds %s of chunk %u of tensor "
                             "'%s', which has %u chunks", dir, j,
                             kp[0] == 'C' ? "a record" : "an applied record", c, decl[t].name,
                             ps_chunk_count(ps_decl_numel(&decl[t]), srv->chunk_elems));
                    rc = PS_ESTORE;
                    break;
                }
            }
            if (k.mv_size == 9 && kp[0] == 'D') {
                /* A chunk's record of whose pushes it applied (bsp: its apply members, asp:
                 * each rank's last push), with the chunk wherever it goes now: a batch handed
                 * out again after the restore is then applied where it was not, and skipped
                 * where it was, as after a restart (push.c, replay_had). Loaded and checked
                 * like any stored one when psd opens the store. */
                uint32_t t = psd_ckpt_rd32(kp + 1), c = psd_ckpt_rd32(kp + 5);
                uint64_t members;
                if (seen && step != UINT64_MAX && step > 0 && t < ndecl &&
                    decl[t].name[0] != '\0' &&
                    psd_shard_summed_members(v.mv_data, v.mv_size, step, step - 1, &members)) {
                    all_applied &= members;
                    told += !seen[cbase[t] + c];
                    seen[cbase[t] + c] = 1;
                }
                if (t < ndecl && decl[t].name[0] != '\0' &&
                    ps_place_shard(decl[t].first_chunk + c, srv->nshards) == srv->shard &&
                    (rc = psd_store_put_applied(&tx, t, c, v.mv_data, v.mv_size)) != 0) {
                    snprintf(err, errlen, "cannot store the applied record of chunk %u/%u: %s", t,
                             c, ps_strerror(rc));
                    break;
                }
                continue;
            }
            if (k.mv_size != 9 || kp[0] != 'C') continue;
            uint32_t t = psd_ckpt_rd32(kp + 1), c = psd_ckpt_rd32(kp + 5);
            const psd_chunk_hdr_t *h = v.mv_data;
            if (t >= ndecl || decl[t].name[0] == '\0') {
                snprintf(err, errlen, "--restore %s: shard-%u holds chunk %u/%u of no tensor", dir,
                         j, t, c);
                rc = PS_ESTORE;
                break;
            }
            if (ps_place_shard(decl[t].first_chunk + c, srv->nshards) != srv->shard) continue;
            uint32_t crc = 0;
            uint64_t hash = 0;
            bool formed = v.mv_size >= sizeof *h &&
                          v.mv_size == psd_chunk_bytes(h->n, h->nstate) &&
                          h->format == PSD_CHUNK_FORMAT && h->nstate == srv->nstate &&
                          h->n == ps_chunk_len(ps_decl_numel(&decl[t]), srv->chunk_elems, c);
            if (formed) psd_store_chunk_sums(h, &crc, &hash);
            if (!formed || hash != h->hash || crc != h->crc32c) {
                /* The CRC too (a review): one damaged at rest made every pull of the restored
                 * chunk fail (PS_ECORRUPT) until psctl repair. */
                snprintf(err, errlen, "--restore %s: shard-%u: tensor '%s' chunk %u is malformed "
                         "or does not match its hash or CRC-32C (psctl verify --against says "
                         "more)", dir, j, decl[t].name, c);
                rc = PS_ESTORE;
                break;
            }
            if (bsp && h->version != step) {
                snprintf(err, errlen, "--restore %s: shard-%u: tensor '%s' chunk %u is at version "
                         "%llu, the checkpoint's step is %llu", dir, j, decl[t].name, c,
                         (unsigned long long)h->version, (unsigned long long)step);
                rc = PS_ESTORE;
                break;
            }
            const psd_chunk_hdr_t *dup;
            if (psd_store_chunk_get(&srv->store, tx.w, t, c, &dup) == 0) {
                /* The store was empty: an earlier shard's copy held this chunk too (a copy
                 * made up of two, counted once for a missing one otherwise). */
                snprintf(err, errlen, "--restore %s: tensor '%s' chunk %u is in shard-%u's copy "
                         "and an earlier one's: not one checkpoint", dir, decl[t].name, c, j);
                rc = PS_ESTORE;
                break;
            }
            psd_chunk_hdr_t *out;
            if ((rc = psd_store_chunk_reserve(&tx, t, c, h->n, h->nstate, &out)) != 0) {
                snprintf(err, errlen, "cannot store chunk %u/%u: %s", t, c, ps_strerror(rc));
                break;
            }
            memcpy(out, h, v.mv_size);
            got++;
            bytes += v.mv_size;
        }
        mdb_cursor_close(cur);
        psd_ckpt_src_close(&s);
        if (rc == 0 && mrc != MDB_NOTFOUND) { /* not the end: a page it could not read */
            snprintf(err, errlen, "--restore %s: shard-%u: reading its store stopped: %s", dir, j,
                     mdb_strerror(mrc));
            rc = PS_ESTORE;
        }
        /* The tensor table, the coordinator's state and the applied records have no hashes of
         * their own: meta.json's one over all of them (absent in older checkpoints). */
        bool read_all = rc == 0 && mrc == MDB_NOTFOUND;
        char *mj = read_all ? psd_ckpt_meta_read(dir, j) : NULL;
        char now_h[17];
        if (read_all && mj == NULL) { /* checked at the start; never taken unchecked */
            snprintf(err, errlen, "--restore %s: shard-%u/%s cannot be read again: %s", dir, j,
                     PSD_CKPT_META, strerror(errno));
            rc = PS_ESTORE;
        } else if (mj && !psd_ckpt_others_match(&others, mj, now_h)) {
            snprintf(err, errlen, "--restore %s: shard-%u: the records other than chunks (tensor "
                     "table, coordinator state, applied records) do not match its %s (psctl "
                     "verify --against says more)", dir, j, PSD_CKPT_META);
            rc = PS_ESTORE;
        }
        free(mj);
    }
    psd_ckpt_src_close(&s);
    if (rc == 0 && got != want) {
        snprintf(err, errlen, "--restore %s: the checkpoint holds %llu of the %llu chunks this "
                 "shard owns: incomplete checkpoint", dir, (unsigned long long)got,
                 (unsigned long long)want);
        rc = PS_ESTORE;
    }
    free(decl);
    free(seen);
    free(cbase);
    uint64_t mark = ps_run_restored_mark(run.origin); /* every shard of this restore's */
    if (rc == 0) rc = psd_run_put(&tx, &run);
    if (rc == 0) rc = psd_store_put_blob(&tx, PSD_JOINED_BLOB, &mark, sizeof mark);
    if (rc == 0 && srv->shard == 0 && told == total && total > 0) {
        /* Every chunk's record told who it applied the checkpoint's last step with: those
         * ranks' batches of it are done everywhere (psd_coord_create). */
        psd_restore_applied_t ra = {.step = step - 1, .members = all_applied};
        rc = psd_store_put_blob(&tx, PSD_RESTORE_APPLIED_BLOB, &ra, sizeof ra);
    }
    if (rc == 0) rc = psd_store_del_blob(&tx, PSD_RESTORING);
    if (rc) {
        psd_store_abort(&tx);
        return rc;
    }
    const char *crash = getenv("PS_TEST_CRASH_IN_RESTORE");
    if (crash && atoi(crash) == 1) {
        PS_LOG(PS_LOG_WARN, "restore", "killed before the restore commits "
               "(PS_TEST_CRASH_IN_RESTORE, a test hook)");
        raise(SIGKILL);
    }
    if ((rc = psd_store_commit(&tx)) != 0) {
        snprintf(err, errlen, "cannot commit the restored store: %s", ps_strerror(rc));
        return rc;
    }
    /* On disk before the mark goes (psd_restore_unmark syncs its removal): the store is
     * NOSYNC, and a power loss after an unsynced fill found no mark over an empty or torn
     * store (a review). */
    if ((rc = psd_store_sync(&srv->store)) != 0) {
        snprintf(err, errlen, "cannot write the restored store to disk: %s", ps_strerror(rc));
        return rc;
    }
    PS_LOG(PS_LOG_INFO, "restore", "shard %u restored from %s (step %llu, taken on %u shards): "
           "%llu chunks, %llu bytes", srv->shard, dir, (unsigned long long)step, nold,
           (unsigned long long)got, (unsigned long long)bytes);
    return 0;
}
