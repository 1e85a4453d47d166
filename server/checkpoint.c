/* checkpoint.c: consistent checkpoints and chunk repair, the shard's side (see checkpoint.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "checkpoint.h"
#include "run.h"
#include "durable.h"
#include "integrity.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"

#define COPY_COMMIT_BYTES (64u << 20) /* commit the copy every this many bytes */

enum { CK_IDLE = 0, CK_ARMED, CK_SNAP, CK_COPYING, CK_DONE, CK_FAILED };

typedef struct {
    uint32_t t, c;
    uint64_t version, hash;
} ck_chunk_t;

typedef struct {
    uint32_t id;
    ps_decl_t d;
} ck_tensor_t;

struct psd_ckpt_s {
    psd_server_t *srv;
    int state;                 /* CK_* */
    uint64_t step;             /* the version every chunk must reach; UINT64_MAX: now */
    uint64_t id;               /* psctl's checkpoint id (its ARM's `count`; 0: none said) */
    char top[260];             /* D, as the ARM said it (where psctl's cancel mark goes) */
    char dir[1100];            /* D/shard-K */
    int cancel;                /* cancelled during its snapshot or copy: the copy stops at its
                                  next record (the pool thread reads it: __atomic) */
    int marked;                /* snap_run found psctl's mark (set on the pool before the slot
                                  job's completion, read in snap_done) */
    psd_slot_work_t slot;      /* takes the snapshot */
    uv_work_t copy;
    MDB_txn *txn;              /* the snapshot, from the slot job until the copy ends */
    uint64_t t0_ms, ms;        /* arm time; arm to done */
    uint64_t bytes, nchunks, vmin, vmax;
    int rc;
    char err[512];
    int repairing;             /* repair jobs queued or running */
};

typedef struct {
    psd_slot_work_t slot;
    psd_server_t *srv;
    psd_conn_t *conn;
    uint64_t req_id, version, hash;
    uint32_t t, c;
    char from[256];            /* the checkpoint's directory */
    uint32_t from_shard;       /* its shard-J that holds the chunk */
    int rc;
    char err[400];
    psd_ckpt_src_t src;        /* the checkpoint, open while repair_run reads it */
    void *copy;                /* the record read out of it under the fault guard */
} repair_t;

static struct psd_ckpt_s *state(psd_server_t *srv)
{
    if (srv->ckpt == NULL && (srv->ckpt = calloc(1, sizeof *srv->ckpt)) != NULL)
        srv->ckpt->srv = srv;
    return srv->ckpt;
}

bool psd_ckpt_idle(psd_server_t *srv)
{
    struct psd_ckpt_s *ck = srv->ckpt;
    return ck == NULL || ((ck->state != CK_SNAP && ck->state != CK_COPYING) && !ck->repairing);
}

const char *psd_ckpt_copy_dir(const psd_server_t *srv)
{
    /* The state alone (the loop's): ck->txn is cleared by the copy's pool thread as it ends (a
     * TSan run, session 72). */
    const struct psd_ckpt_s *ck = srv->ckpt;
    return ck && ck->state == CK_COPYING ? ck->dir : NULL;
}

void psd_ckpt_free(psd_server_t *srv)
{
    if (srv->ckpt && srv->ckpt->txn) mdb_txn_abort(srv->ckpt->txn);
    free(srv->ckpt);
    srv->ckpt = NULL;
}

static void fail(struct psd_ckpt_s *ck, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(struct psd_ckpt_s *ck, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ck->err, sizeof ck->err, fmt, ap);
    va_end(ap);
    ck->rc = rc;
}

/* psctl gave this checkpoint up while this shard did not answer its cancel (stopped, cut off):
 * it left D/cancelled-ID (ckpt_meta.h). Looked for when the shard is about to take its
 * snapshot, when a new arm finds this one still armed, and by the copy at its commits: a shard
 * that resumes after psctl gave up does not copy a part nobody will use, and its arm does not
 * refuse every later checkpoint as "in progress" until it reaches its step. */
static bool marked_cancelled(const struct psd_ckpt_s *ck)
{
    char mark[400];
    return ck->id != 0 && psd_ckpt_cancel_mark(mark, sizeof mark, ck->top, ck->id) == 0 &&
           access(mark, F_OK) == 0;
}

/* Ends checkpoint @p ck, whose copy has not started (nothing of it was written): psctl told
 * this shard (MSG_CKPT_CANCEL), or left its mark (@p marked). */
static void drop(struct psd_ckpt_s *ck, bool marked)
{
    char mark[400] = "";
    if (marked) psd_ckpt_cancel_mark(mark, sizeof mark, ck->top, ck->id);
    fail(ck, PS_ECANCELED, "checkpoint %016llx into %s was cancelled (psctl gave it up%s%s)",
         (unsigned long long)ck->id, ck->dir, marked ? " while this shard did not answer: " : "",
         mark);
    ck->state = CK_FAILED;
    PS_LOG(PS_LOG_WARN, "ckpt", "%s; nothing of it was written", ck->err);
}

void psd_ckpt_tensor_dropped(psd_server_t *srv, const char *name)
{
    struct psd_ckpt_s *ck = srv->ckpt;
    if (ck == NULL) return;
    if (ck->state == CK_ARMED) {
        fail(ck, PS_ESTALE, "checkpoint %016llx into %s: tensor '%.100s' was dropped here "
             "(psctl forget --trained) before its step: the shards' parts would not be one "
             "state; take it again", (unsigned long long)ck->id, ck->dir, name);
        ck->state = CK_FAILED;
        PS_LOG(PS_LOG_WARN, "ckpt", "%s", ck->err);
    } else if (ck->state == CK_SNAP || ck->state == CK_COPYING) {
        /* It stops at its next record and removes what it wrote, as a cancel does. */
        __atomic_store_n(&ck->cancel, 1, __ATOMIC_RELAXED);
        PS_LOG(PS_LOG_WARN, "ckpt", "checkpoint %016llx into %s: tensor '%.100s' was dropped "
               "here (psctl forget --trained): its copy stops", (unsigned long long)ck->id,
               ck->dir, name);
    }
}

/* "cannot write the copy" with LMDB's reason @p rc; for an I/O error also the free space of
 * the disk holding the copy: LMDB reports a write that found the disk full as EIO ("Input/
 * output error"), which did not say what to fix. */
static void copy_failed(struct psd_ckpt_s *ck, int rc)
{
    struct statvfs fs;
    if ((rc == EIO || rc == ENOSPC) && statvfs(ck->dir, &fs) == 0 &&
        (double)fs.f_bavail * (double)fs.f_frsize < 64.0 * (1 << 20))
        fail(ck, PS_ENOSPC, "%s: cannot write the copy: %s (the disk holding it has %.1f MiB "
             "free: full?)", ck->dir, mdb_strerror(rc),
             (double)fs.f_bavail * (double)fs.f_frsize / (1 << 20));
    else
        fail(ck, PS_ESTORE, "%s: cannot write the copy: %s", ck->dir, mdb_strerror(rc));
}

/* ---- the copy (pool thread) ------------------------------------------------------------ */

/* A failed copy leaves nothing behind: the files it writes in @p dir (DIR/shard-K; meta.json
 * too: its write can fail after the rename, at the directory's fsync), then the directory, so
 * a failing periodic checkpoint (a full disk, a corrupt chunk) does not leave a partial copy of
 * the whole state each time. Anything else in it stays. DIR itself is psctl's to remove once
 * every shard has answered: removed here it could vanish under another shard's mkdir. */
static void remove_partial(const char *dir)
{
    static const char *const files[] = {"data.mdb", "lock.mdb", PSD_CKPT_META ".tmp",
                                        PSD_CKPT_META};
    /* Through the directory itself, never a symbolic link put in its place meanwhile (whose
     * target's files of these names would go: another shard's data_dir, say). */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) return;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) unlinkat(dfd, files[i], 0);
    close(dfd);
    rmdir(dir);
}

typedef struct {
    ck_chunk_t *chunks;
    size_t nchunks, cap;
    ck_tensor_t *tensors;
    size_t ntensors, tcap;
    bool has_job;
    psd_ckpt_others_t others; /* the records other than chunks (meta.json "others_xxh3") */
} inventory_t;

static int grow(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return 0;
    size_t nc = *cap ? 2 * *cap : 256;
    void *q = realloc(*p, nc * elem);
    if (q == NULL) return PS_ENOMEM;
    *p = q;
    *cap = nc;
    return 0;
}

static uint64_t first_chunk_of(const inventory_t *inv, uint32_t t)
{
    for (size_t i = 0; i < inv->ntensors; i++)
        if (inv->tensors[i].id == t) return inv->tensors[i].d.first_chunk;
    return UINT64_MAX;
}

static const inventory_t *sort_inv;
static int by_ordinal(const void *a, const void *b)
{
    const ck_chunk_t *x = a, *y = b;
    uint64_t ox = first_chunk_of(sort_inv, x->t) + x->c, oy = first_chunk_of(sort_inv, y->t) + y->c;
    return ox < oy ? -1 : ox > oy;
}

/* The Merkle root over the inventory's chunk hashes in global ordinal order, as the shard's
 * tree computes it (integrity.c), into *@p root. Sorts inv->chunks. @return 0, or -ENOMEM
 * (before, a root of 0 went into meta.json and the copy counted as done: a review). */
static int inv_root(inventory_t *inv, uint64_t *root)
{
    sort_inv = inv; /* one copy runs at a time per process */
    if (inv->nchunks > 1) /* none: chunks is NULL, which qsort may not take (UBSan) */
        qsort(inv->chunks, inv->nchunks, sizeof *inv->chunks, by_ordinal);
    uint64_t *h = malloc((inv->nchunks ? inv->nchunks : 1) * sizeof *h);
    if (h == NULL) return -ENOMEM;
    for (size_t i = 0; i < inv->nchunks; i++) h[i] = inv->chunks[i].hash;
    *root = ps_merkle_root_of(h, inv->nchunks);
    free(h);
    return 0;
}

static uint64_t file_xxh3(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) return 0;
    XXH3_state_t *s = XXH3_createState();
    if (s == NULL) { /* as a manifest it cannot read */
        fclose(f);
        return 0;
    }
    XXH3_64bits_reset(s);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) XXH3_64bits_update(s, buf, n);
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    fclose(f);
    return h;
}

/* A JSON string body: names are [printable ASCII] in practice; anything else becomes '?'. */
static void json_safe(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 3 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') out[n++] = '\\';
        out[n++] = ch < 0x20 || ch > 0x7e ? '?' : (char)ch;
    }
    out[n] = '\0';
}

/*
 * meta.json: {"format": 1, "step", "step_max" (lowest and highest chunk version: equal under
 * bsp), "consistency", "cluster", "manifest" (its path) and "manifest_xxh3" (of its bytes),
 * "shard", "nshards", "chunk_bytes", "optimizer", "optimizer_state" (floats per parameter),
 * "coordinator" (the job blob is in this copy), "records_bytes", "merkle_root", "run" (the
 * store's run, run.h, as 16 hex digits) and "run_base_step", "checkpoint" (psctl's id of the
 * checkpoint, 16 hex digits: every shard's copy of one checkpoint says the same),
 * "others_xxh3" (psd_ckpt_others_t: every record but the chunks, which have their own hashes),
 * "tensors": [{"id", "name", "shape", "first_chunk"}], "chunks": [[tensor, chunk, version,
 * "xxh3"], ...] one per line, in ordinal order}. Written as meta.json.tmp, fsynced, renamed.
 */
static int meta_write(psd_server_t *srv, struct psd_ckpt_s *ck, inventory_t *inv,
                      uint64_t rec_bytes)
{
    char path[1200], tmp[1210], name[2 * PS_NAME_MAX + 2], cl[300], mp[2100];
    uint64_t root;
    int rr = inv_root(inv, &root);
    if (rr) return rr;
    snprintf(path, sizeof path, "%s/%s", ck->dir, PSD_CKPT_META);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
    if (f == NULL) {
        int e = errno;
        if (fd >= 0) close(fd);
        return -e;
    }
    json_safe(cl, sizeof cl, srv->m.cluster);
    json_safe(mp, sizeof mp, srv->m.path);
    fprintf(f,
            "{\"format\": 1, \"step\": %llu, \"step_max\": %llu, \"consistency\": \"%s\", "
            "\"cluster\": \"%s\", \"manifest\": \"%s\", \"manifest_xxh3\": \"%016llx\", "
            "\"shard\": %u, \"nshards\": %u, \"chunk_bytes\": %llu, \"optimizer\": \"%s\", "
            "\"optimizer_state\": %u, \"coordinator\": %s, \"records_bytes\": %llu, "
            "\"merkle_root\": \"%016llx\", \"run\": \"%016llx\", \"run_base_step\": %llu, "
            "\"checkpoint\": \"%016llx\", \"others_xxh3\": \"%016llx\",\n\"tensors\": [",
            (unsigned long long)ck->vmin, (unsigned long long)ck->vmax,
            ps_consistency_name(srv->m.job.consistency), cl, mp,
            (unsigned long long)file_xxh3(srv->m.path), srv->shard, srv->nshards,
            (unsigned long long)srv->m.chunk_bytes, ps_optim_name(srv->m.job.optimizer.name),
            srv->nstate, inv->has_job ? "true" : "false", (unsigned long long)rec_bytes,
            (unsigned long long)root, (unsigned long long)srv->run.id,
            (unsigned long long)srv->run.base_step, (unsigned long long)ck->id,
            (unsigned long long)psd_ckpt_others_digest(&inv->others));
    for (size_t i = 0; i < inv->ntensors; i++) {
        const ps_decl_t *d = &inv->tensors[i].d;
        json_safe(name, sizeof name, d->name);
        fprintf(f, "%s\n {\"id\": %u, \"name\": \"%s\", \"shape\": [", i ? "," : "", d->id, name);
        for (int k = 0; k < d->ndim; k++) fprintf(f, "%s%u", k ? ", " : "", d->shape[k]);
        fprintf(f, "], \"first_chunk\": %llu}", (unsigned long long)d->first_chunk);
    }
    fprintf(f, "],\n\"chunks\": [");
    for (size_t i = 0; i < inv->nchunks; i++) {
        const ck_chunk_t *c = &inv->chunks[i];
        fprintf(f, "%s\n [%u, %u, %llu, \"%016llx\"]", i ? "," : "", c->t, c->c,
                (unsigned long long)c->version, (unsigned long long)c->hash);
    }
    fprintf(f, "]}\n");
    /* ferror: a write that failed earlier (the disk full for a moment) dropped its buffer and
     * only set the flag, which fflush does not report (a review). */
    int rc = fflush(f) || ferror(f) || fsync(fileno(f)) ? (errno ? -errno : -EIO) : 0;
    if (fclose(f) && rc == 0) rc = -errno;
    if (rc == 0) rc = ps_rename_durable(tmp, path); /* before a prune may remove the last one */
    return rc;
}

/*
 * The copy's file, allocated ahead (session 45). A plain LMDB environment copied each record
 * into a malloc'd page and then into the page cache with writev (perf of an idle 1.1 GB copy:
 * 60% of its time). The copy is now MDB_WRITEMAP, its records written into the file where LMDB
 * places them (copy_put), which needs the file's blocks allocated first: a page of the map the
 * disk cannot back is a SIGBUS, not an error. The size: the snapshot's tree (its branch, leaf
 * and overflow pages: the copy is compact, so no more than that) plus the copy's own commits'
 * pages, a 32nd more and 4 MiB. @return 1: allocated, *@p map its size; 0: this filesystem has
 * no fallocate (the plain copy then); or -errno (ENOSPC: the disk is full).
 */
static int copy_allocate(struct psd_ckpt_s *ck, size_t *map, size_t *psize)
{
    psd_server_t *srv = ck->srv;
    /* The file is made here on every path, never through a link put there since the arm
     * (LMDB's own open follows one): the plain copy then opens it as it is, empty. */
    char path[1200];
    snprintf(path, sizeof path, "%s/data.mdb", ck->dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -errno;
    MDB_stat st;
    int rc = mdb_stat(ck->txn, srv->store.dbi, &st);
    /* The copy's pages are this host's (a new environment's): a store made where pages are
     * another size (a data_dir from a 64 KiB-page host) gets the plain copy, whose offsets
     * and length LMDB computes itself (a review: pwrite offsets and the cut were wrong). */
    long os_page = sysconf(_SC_PAGESIZE);
    if (rc || os_page <= 0 || (size_t)os_page != st.ms_psize) {
        close(fd);
        return rc ? -EIO : 0;
    }
    size_t pages = (size_t)st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages + 2;
    *psize = st.ms_psize;
    *map = (pages + pages / 32) * st.ms_psize + (4u << 20);
    /* KEEP_SIZE: the file stays empty for LMDB (a new environment), which then sets its size
     * to the map's over the blocks allocated here. */
    rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)*map) == 0 ? 1 : -errno;
    close(fd);
    if (rc == -EOPNOTSUPP || rc == -ENOSYS) return 0; /* empty: the plain copy's */
    if (rc < 0) unlink(path); /* a partial allocation goes with it: the free space told right */
    return rc;
}

/* A WRITEMAP copy's file is as long as its map: cut to the @p bytes its pages use (LMDB reads
 * no page past its last one) and made durable. @return 0 or -errno. */
static int trim_copy(const char *dir, size_t bytes)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -errno;
    int rc = ftruncate(fd, (off_t)bytes) == 0 && fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

/*
 * Put @p v under @p k at the end of the copy (its file @p fd; @p psize 0: a plain environment). In a
 * WRITEMAP copy a record on overflow pages (two pages or more) is reserved and its bytes
 * written into the file with pwrite where LMDB placed them: a store through the map had the
 * kernel zero each new page of the file first (38% of an idle copy), a write of whole pages
 * does not. The map is MAP_SHARED, so the page cache is what both see; mdb_env_sync (msync)
 * and trim_copy's fsync write both back.
 */
static int copy_put(int fd, MDB_txn *t, MDB_dbi dbi, MDB_val *k, MDB_val *v, size_t psize)
{
    if (psize == 0 || v->mv_size < 2 * psize) return mdb_put(t, dbi, k, v, MDB_APPEND);
    MDB_val r = {v->mv_size, NULL};
    int rc = mdb_put(t, dbi, k, &r, MDB_APPEND | MDB_RESERVE);
    if (rc) return rc;
    /* Where in the file: the overflow page's header (LMDB 0.9's file format: 16 bytes, the
     * page number first, the flags at byte 10, P_OVERFLOW 0x04) precedes the data. Anything
     * else (not seen) is written through the map as a plain put would. */
    const char *page = (const char *)r.mv_data - 16;
    uint64_t pgno;
    uint16_t flags;
    memcpy(&pgno, page, sizeof pgno);
    memcpy(&flags, page + 10, sizeof flags);
    if ((uintptr_t)page % psize != 0 || !(flags & 0x04)) {
        memcpy(r.mv_data, v->mv_data, v->mv_size);
        return 0;
    }
    off_t at = (off_t)(pgno * psize + 16);
    for (size_t done = 0; done < v->mv_size;) {
        ssize_t n = pwrite(fd, (const char *)v->mv_data + done, v->mv_size - done,
                           at + (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return n < 0 ? errno : EIO;
        done += (size_t)n;
    }
    return 0;
}

static void copy_work(uv_work_t *w)
{
    struct psd_ckpt_s *ck = w->data;
    psd_server_t *srv = ck->srv;
    inventory_t inv = {0};
    psd_ckpt_others_init(&inv.others);
    MDB_env *dst = NULL;
    MDB_txn *dt = NULL;
    MDB_dbi ddbi;
    MDB_cursor *cur = NULL;
    uint64_t rec_bytes = 0, pending = 0;
    bool made = false;
    int rc = psd_store_mkdir_p(ck->dir);
    if (rc) {
        fail(ck, rc, "%s: cannot create it: %s", ck->dir, strerror(-rc));
        goto out;
    }
    struct stat ls;
    if (lstat(ck->dir, &ls) != 0 || !S_ISDIR(ls.st_mode)) { /* a link put there since the arm */
        fail(ck, PS_EINVAL, "%s is not a directory of its own (a symbolic link?): the copy is "
             "not written through it", ck->dir);
        goto out;
    }
    made = true; /* a failure from here on removes what this copy wrote */
    size_t psize = 0, map = 0;
    mdb_filehandle_t dst_fd = -1;
    int direct = copy_allocate(ck, &map, &psize);
    if (direct == -ENOSPC || direct == -EDQUOT) {
        struct statvfs fs;
        double free_mib = statvfs(ck->dir, &fs) == 0
                              ? (double)fs.f_bavail * (double)fs.f_frsize / (1 << 20) : 0;
        fail(ck, PS_ENOSPC, "%s: cannot write the copy: it needs %.1f MiB (the disk holding it "
             "has %.1f MiB free: full?)", ck->dir, (double)map / (1 << 20), free_mib);
        goto out;
    }
    if (direct < 0) {
        copy_failed(ck, -direct);
        goto out;
    }
    if (!direct) { /* no fallocate here: LMDB's own writes, as before session 45 */
        psize = 0;
        map = (size_t)srv->m.map_size_mb << 20;
    }
    if ((rc = mdb_env_create(&dst)) != 0 || (rc = mdb_env_set_mapsize(dst, map)) != 0 ||
        /* NOLOCK: no lock.mdb, a sparse file LMDB writes through a map, which on a disk the
         * allocation above just filled was a SIGBUS (a review); nothing else opens the copy
         * while it is made. */
        (rc = mdb_env_open(dst, ck->dir,
                           MDB_NOSYNC | MDB_NOLOCK | (direct ? MDB_WRITEMAP : 0), 0600)) != 0 ||
        (rc = mdb_txn_begin(dst, NULL, 0, &dt)) != 0 || (rc = mdb_dbi_open(dt, NULL, 0, &ddbi)) != 0 ||
        (rc = mdb_cursor_open(ck->txn, srv->store.dbi, &cur)) != 0 ||
        (rc = mdb_env_get_fd(dst, &dst_fd)) != 0) {
        copy_failed(ck, rc);
        goto out;
    }
    MDB_val k, v;
    ck->vmin = UINT64_MAX;
    ck->vmax = 0;
    for (uint32_t ms = 0; ms < srv->test_slow_copy_ms; ms += 10) /* a slow disk; cancellable */
        if (!__atomic_load_n(&ck->cancel, __ATOMIC_RELAXED)) usleep(10000);
    /* PS_TEST_COPY_READ_FAIL=N (tests only, one copy): the Nth read of the store fails as a
     * damaged page would. */
    uint32_t fail_at = __atomic_exchange_n(&srv->test_copy_read_fail, 0, __ATOMIC_RELAXED);
    size_t nread = 0;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (fail_at && ++nread >= fail_at) {
            rc = MDB_CORRUPTED;
            break;
        }
        if (__atomic_load_n(&ck->cancel, __ATOMIC_RELAXED)) { /* MSG_CKPT_CANCEL, or the mark */
            fail(ck, PS_ECANCELED, "checkpoint %016llx into %s was cancelled (psctl gave it "
                 "up)", (unsigned long long)ck->id, ck->dir);
            goto out;
        }
        const uint8_t *kp = k.mv_data;
        if (k.mv_size == 9 && kp[0] == 'C') {
            const psd_chunk_hdr_t *h = v.mv_data;
            uint32_t t = psd_ckpt_rd32(kp + 1), c = psd_ckpt_rd32(kp + 5);
            if (v.mv_size < sizeof *h || v.mv_size != psd_chunk_bytes(h->n, h->nstate) ||
                h->format != PSD_CHUNK_FORMAT) {
                fail(ck, PS_ESTORE, "chunk %u/%u: malformed record of %zu bytes", t, c, v.mv_size);
                goto out;
            }
            /* Never checkpoint corruption at rest: the bytes must still match their hash,
             * the params their CRC (which restore checks too). */
            uint32_t crc;
            uint64_t hash;
            psd_store_chunk_sums(h, &crc, &hash);
            if (hash != h->hash || crc != h->crc32c) {
                fail(ck, PS_ESTORE, "chunk %u/%u (version %llu): stored bytes do not match "
                     "their hash or CRC-32C; run psctl verify and repair first", t, c,
                     (unsigned long long)h->version);
                goto out;
            }
            if ((rc = grow((void **)&inv.chunks, &inv.cap, inv.nchunks, sizeof *inv.chunks))) {
                fail(ck, rc, "out of memory");
                goto out;
            }
            inv.chunks[inv.nchunks++] = (ck_chunk_t){t, c, h->version, h->hash};
            if (h->version < ck->vmin) ck->vmin = h->version;
            if (h->version > ck->vmax) ck->vmax = h->version;
            rec_bytes += v.mv_size;
        } else if (k.mv_size == 5 && kp[0] == 'T' && v.mv_size == sizeof(ps_decl_t)) {
            if ((rc = grow((void **)&inv.tensors, &inv.tcap, inv.ntensors, sizeof *inv.tensors))) {
                fail(ck, rc, "out of memory");
                goto out;
            }
            ck_tensor_t *tt = &inv.tensors[inv.ntensors++];
            memcpy(&tt->d, v.mv_data, sizeof tt->d);
            tt->id = psd_ckpt_rd32(kp + 1);
        } else if (k.mv_size == 4 && memcmp(kp, "Mjob", 4) == 0) {
            inv.has_job = true;
        }
        psd_run_t part_run;
        if (k.mv_size == 4 && memcmp(kp, "M" PSD_RUN_BLOB, 4) == 0) {
            /* The part carries the run a restore from it starts (restore.c writes its own over
             * it), not the live one: a data_dir made by copying the part's files by hand is
             * then told from the others' stores as psd --restore's is (its origin), and a
             * shard copied back alone is refused, not taken for the store that went on. The
             * chunks ('C' keys) came first: ck->vmin is the part's lowest version. */
            uint64_t base = ck->vmin == UINT64_MAX ? 0 : ck->vmin;
            part_run = (psd_run_t){.id = psd_run_new_id(), .parent = srv->run.id,
                                   .base_step = base, .origin = psd_run_origin(ck->id, base)};
            v = (MDB_val){sizeof part_run, &part_run};
        }
        uint64_t part_joined;
        if (k.mv_size == 1 + strlen(PSD_JOINED_BLOB) && kp[0] == 'M' &&
            memcmp(kp + 1, PSD_JOINED_BLOB, strlen(PSD_JOINED_BLOB)) == 0) {
            /* And the runs digest of that restore (wire.h), not the live one's. */
            part_joined = ps_run_restored_mark(psd_run_origin(ck->id, ck->vmin == UINT64_MAX
                                                                          ? 0 : ck->vmin));
            v = (MDB_val){sizeof part_joined, &part_joined};
        }
        psd_ckpt_others_add(&inv.others, &k, &v);
        if ((rc = copy_put(dst_fd, dt, ddbi, &k, &v, psize)) != 0) {
            copy_failed(ck, rc);
            goto out;
        }
        pending += v.mv_size;
        if (pending >= COPY_COMMIT_BYTES) { /* bounded dirty memory in the copy's writer */
            pending = 0;
            if (marked_cancelled(ck)) __atomic_store_n(&ck->cancel, 1, __ATOMIC_RELAXED);
            if ((rc = mdb_txn_commit(dt)) != 0 || (rc = mdb_txn_begin(dst, NULL, 0, &dt)) != 0) {
                dt = NULL;
                copy_failed(ck, rc);
                goto out;
            }
        }
    }
    /* The walk ends at the store's end (MDB_NOTFOUND) or at an error, a damaged page's: a copy
     * cut short there would be a checkpoint of part of the shard that says it is whole (its
     * meta.json lists what it holds), which verify --against passes and only a restore finds
     * short. Before, the loop's end was not looked at (a review, session 70). */
    if (rc != MDB_NOTFOUND) {
        fail(ck, PS_ESTORE, "the shard's store could not be read to its end (%s, after %zu "
             "chunks): no checkpoint of part of it; run psctl verify", mdb_strerror(rc),
             inv.nchunks);
        goto out;
    }
    if (inv.nchunks == 0) ck->vmin = ck->vmax = ck->step == UINT64_MAX ? 0 : ck->step;
    rc = mdb_txn_commit(dt);
    dt = NULL;
    if (rc == 0) rc = mdb_env_sync(dst, 1);
    MDB_envinfo di;
    if (rc == 0) rc = mdb_env_info(dst, &di);
    if (rc) {
        copy_failed(ck, rc);
        goto out;
    }
    mdb_cursor_close(cur);
    cur = NULL;
    mdb_env_close(dst);
    dst = NULL;
    if (direct && (rc = trim_copy(ck->dir, (di.me_last_pgno + 1) * psize)) != 0) {
        fail(ck, rc, "%s/data.mdb: cannot trim it to its pages: %s", ck->dir, strerror(-rc));
        goto out;
    }
    if (__atomic_load_n(&ck->cancel, __ATOMIC_RELAXED) || marked_cancelled(ck)) {
        /* Not made whole now: psctl removes the others' parts, or has. */
        fail(ck, PS_ECANCELED, "checkpoint %016llx into %s was cancelled (psctl gave it up)",
             (unsigned long long)ck->id, ck->dir);
        goto out;
    }
    if ((rc = meta_write(srv, ck, &inv, rec_bytes)) != 0) {
        fail(ck, rc, "%s/%s: cannot write: %s", ck->dir, PSD_CKPT_META, strerror(-rc));
        goto out;
    }
    char path[1200];
    struct stat st;
    snprintf(path, sizeof path, "%s/data.mdb", ck->dir);
    ck->bytes = stat(path, &st) == 0 ? (uint64_t)st.st_size : rec_bytes;
    ck->nchunks = inv.nchunks;
    ck->rc = 0;
out:
    if (cur) mdb_cursor_close(cur);
    if (dt) mdb_txn_abort(dt);
    if (dst) mdb_env_close(dst);
    if (ck->rc != 0 && made) remove_partial(ck->dir);
    mdb_txn_abort(ck->txn); /* MDB_NOTLS: any thread may end it */
    ck->txn = NULL;
    free(inv.chunks);
    free(inv.tensors);
}

static void copy_done(uv_work_t *w, int status)
{
    struct psd_ckpt_s *ck = w->data;
    psd_server_t *srv = ck->srv;
    ck->ms = uv_now(srv->loop) - ck->t0_ms;
    ck->state = ck->rc ? CK_FAILED : CK_DONE;
    if (ck->rc == PS_ECANCELED) {
        srv->ckpt_stats.cancelled++;
    } else if (ck->rc) {
        srv->ckpt_stats.failed++;
    } else {
        srv->ckpt_stats.copies++;
        srv->ckpt_stats.last_step = ck->vmin;
        srv->ckpt_stats.last_bytes = ck->bytes;
        srv->ckpt_stats.last_ms = ck->ms;
        srv->ckpt_stats.last_unix = (double)time(NULL);
    }
    if (ck->rc == PS_ECANCELED)
        PS_LOG(PS_LOG_WARN, "ckpt", "%s; its copy stopped and what it wrote was removed", ck->err);
    else if (ck->rc)
        PS_LOG(PS_LOG_ERROR, "ckpt", "checkpoint into %s failed: %s", ck->dir, ck->err);
    else
        PS_LOG(PS_LOG_INFO, "ckpt", "checkpoint at step %llu: %llu chunks, %llu bytes in %s "
               "(%llu ms)", (unsigned long long)ck->vmin, (unsigned long long)ck->nchunks,
               (unsigned long long)ck->bytes, ck->dir, (unsigned long long)ck->ms);
    psd_server_maybe_stop(srv);
}

/* ---- the snapshot (store-job slot) ----------------------------------------------------- */

static void snap_run(psd_slot_work_t *w)
{
    struct psd_ckpt_s *ck = (struct psd_ckpt_s *)((char *)w - offsetof(struct psd_ckpt_s, slot));
    /* The mark is looked for here, on the pool, not on the loop: a hung disk under D must not
     * stop the loop's heartbeats. */
    if (marked_cancelled(ck)) {
        ck->marked = 1;
        __atomic_store_n(&ck->cancel, 1, __ATOMIC_RELAXED);
        return;
    }
    ck->rc = psd_store_snapshot(&w->srv->store, &ck->txn);
}

static void snap_done(psd_slot_work_t *w)
{
    struct psd_ckpt_s *ck = (struct psd_ckpt_s *)((char *)w - offsetof(struct psd_ckpt_s, slot));
    psd_server_t *srv = w->srv;
    if (ck->rc) {
        fail(ck, ck->rc, "cannot open a store snapshot: %s", ps_strerror(ck->rc));
        ck->state = CK_FAILED;
        return;
    }
    if (__atomic_load_n(&ck->cancel, __ATOMIC_RELAXED)) { /* cancelled while it was queued */
        if (ck->txn) mdb_txn_abort(ck->txn);
        ck->txn = NULL;
        drop(ck, ck->marked);
        return;
    }
    /* The copy runs on the pool beside the store jobs: training goes on. */
    ck->state = CK_COPYING;
    ck->copy.data = ck;
    int rc = uv_queue_work(srv->loop, &ck->copy, copy_work, copy_done);
    if (rc) {
        mdb_txn_abort(ck->txn);
        ck->txn = NULL;
        fail(ck, PS_EIO, "cannot start the copy: %s", uv_strerror(rc));
        ck->state = CK_FAILED;
    }
}

/* Every chunk of this shard at the armed step: 1; some below: 0; one above: -1. */
static int at_step(psd_server_t *srv, uint64_t step, uint64_t *vmax)
{
    int below = 0;
    *vmax = 0;
    for (uint32_t i = 0; i < srv->ntensors; i++)
        for (uint32_t c = 0; srv->tensors[i].present && c < srv->tensors[i].nchunks; c++) {
            const psd_chunk_t *ch = srv->tensors[i].chunks[c];
            if (ch == NULL) continue;
            if (ch->version > *vmax) *vmax = ch->version;
            if (ch->version > step) return -1;
            below |= ch->version < step;
        }
    return below ? 0 : 1;
}

void psd_ckpt_after_job(psd_server_t *srv)
{
    struct psd_ckpt_s *ck = srv->ckpt;
    if (ck == NULL || ck->state != CK_ARMED) return;
    uint64_t vmax;
    int at = ck->step == UINT64_MAX ? 1 : at_step(srv, ck->step, &vmax);
    if (at < 0) {
        /* Not PS_ECONFLICT: psctl takes that answer to its status as "went on to another
         * checkpoint" and looks for this one's part (a probe, session 64: "not known to be
         * complete" for a checkpoint that wrote nothing). */
        psd_shard_totals_t tot; /* the tensors status names as holding the step back */
        psd_shard_totals(srv, &tot);
        char why[PS_NAME_MAX + 320] = "";
        if (tot.untrained)
            snprintf(why, sizeof why, ": tensor '%s' (no push reached it) stays at step 0, so "
                     "no bsp checkpoint can complete until a worker trains it or psctl forget "
                     "drops it", srv->tensors[tot.untrained_first].decl.name);
        else if (tot.behind)
            snprintf(why, sizeof why, ": tensor '%s' (no member pushes it) stays at step %llu, "
                     "so no bsp checkpoint can complete until psctl forget --trained drops it",
                     srv->tensors[tot.behind_first].decl.name,
                     (unsigned long long)tot.behind_first_step);
        fail(ck, PS_ESTALE, "shard %u passed step %llu (at %llu) before its snapshot%s",
             srv->shard, (unsigned long long)ck->step, (unsigned long long)vmax, why);
        ck->state = CK_FAILED;
    } else if (at > 0) {
        ck->state = CK_SNAP;
        ck->slot.srv = srv;
        ck->slot.run = snap_run;
        ck->slot.done = snap_done;
        psd_shard_slot_queue(srv, &ck->slot); /* before the next store job */
    }
}

/* ---- requests -------------------------------------------------------------------------- */

/* Whether an arm at msg->step into msg->error can be taken here (its shard's directory into
 * @p dir); if not, the error is sent. */
static bool arm_takes(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg, char *dir,
                      size_t cap)
{
    if (msg->error[0] != '/') {
        psd_send_error(srv, conn, msg->req_id, PS_EINVAL, "checkpoint directory '%s' is not an "
                       "absolute path", msg->error);
        return false;
    }
    uint64_t vmax;
    if (msg->step != UINT64_MAX && at_step(srv, msg->step, &vmax) < 0) {
        psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT, "shard %u is already past step %llu "
                       "(at %llu)", srv->shard, (unsigned long long)msg->step,
                       (unsigned long long)vmax);
        return false;
    }
    char probe[1200];
    snprintf(dir, cap, "%s/shard-%u", msg->error, srv->shard);
    snprintf(probe, sizeof probe, "%s/data.mdb", dir);
    /* lstat: a symbolic link is never written through (a link named data.mdb, dangling or not,
     * would have the copy create or overwrite its target; a shard directory that is a link
     * would put the copy, and a failed copy's cleanup, in the target: a review, session 70). */
    struct stat st;
    if (lstat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
        psd_send_error(srv, conn, msg->req_id, PS_EINVAL, "%s is %s, not a directory: no "
                       "checkpoint is written there", dir,
                       S_ISLNK(st.st_mode) ? "a symbolic link" : "a file");
        return false;
    }
    if (lstat(probe, &st) == 0) {
        psd_send_error(srv, conn, msg->req_id, -EEXIST, "%s already holds a checkpoint", dir);
        return false;
    }
    return true;
}

/* MSG_CKPT_ARM: arm checkpoint `count` at `step` into `error`. PS_FLAG_MOVE: psctl moves that
 * checkpoint, armed here and still waiting for its step, to an earlier one (psctl_checkpoint.c,
 * move_earlier: every member of the step before it left, so that step is the job's state).
 * PS_FLAG_CHECK: only whether it would be taken (psctl, before arming or moving any shard). */
static void on_arm(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    bool move = (msg->flags & PS_FLAG_MOVE) != 0;
    struct psd_ckpt_s *ck = move ? srv->ckpt : state(srv);
    if (move && (ck == NULL || ck->state != CK_ARMED || ck->id != msg->count ||
                 msg->count == 0 || ck->step == UINT64_MAX || msg->step == UINT64_MAX)) {
        psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT, "shard %u holds no checkpoint "
                       "%016llx waiting for its step", srv->shard, (unsigned long long)msg->count);
        return;
    }
    if (ck == NULL) {
        psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
        return;
    }
    if (!move && ck->state == CK_ARMED && marked_cancelled(ck))
        drop(ck, true); /* armed still, waiting for a step: it would refuse this one */
    if (!move && (ck->state == CK_ARMED || ck->state == CK_SNAP || ck->state == CK_COPYING)) {
        if (__atomic_load_n(&ck->cancel, __ATOMIC_RELAXED))
            psd_send_error(srv, conn, msg->req_id, PS_EBUSY, "the copy of a cancelled checkpoint "
                           "into %s is stopping here; try again", ck->dir);
        else
            psd_send_error(srv, conn, msg->req_id, PS_EBUSY, "a checkpoint into %s is in "
                           "progress here", ck->dir); /* psctl names the shard */
        return;
    }
    char dir[1100];
    if (!arm_takes(srv, conn, msg, dir, sizeof dir)) return;
    ps_msg_t r = {.type = PS_MSG_CKPT_ARM_REPLY, .req_id = msg->req_id, .shard = srv->shard,
                  .step = msg->step};
    if (msg->flags & PS_FLAG_CHECK) {
        psd_send_msg(srv, conn, &r);
        return;
    }
    if (move)
        PS_LOG(PS_LOG_INFO, "ckpt", "checkpoint %016llx moved: at step %llu (was %llu), into %s",
               (unsigned long long)ck->id, (unsigned long long)msg->step,
               (unsigned long long)ck->step, dir);
    snprintf(ck->dir, sizeof ck->dir, "%s", dir);
    snprintf(ck->top, sizeof ck->top, "%s", msg->error);
    ck->step = msg->step;
    if (!move) {
        ck->id = msg->count;
        ck->cancel = ck->marked = 0;
        ck->state = CK_ARMED;
        ck->rc = 0;
        ck->err[0] = '\0';
        ck->bytes = ck->nchunks = ck->ms = 0;
        ck->t0_ms = uv_now(srv->loop);
        if (msg->step == UINT64_MAX)
            PS_LOG(PS_LOG_INFO, "ckpt", "checkpoint %016llx armed: now, into %s",
                   (unsigned long long)ck->id, ck->dir);
        else
            PS_LOG(PS_LOG_INFO, "ckpt", "checkpoint %016llx armed: at step %llu, into %s",
                   (unsigned long long)ck->id, (unsigned long long)ck->step, ck->dir);
    }
    psd_send_msg(srv, conn, &r);
    if (!srv->job_running) psd_ckpt_after_job(srv); /* else when the running job is done */
}

static void on_status(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    struct psd_ckpt_s *ck = srv->ckpt;
    if (ck == NULL || ck->state == CK_IDLE) {
        psd_send_error(srv, conn, msg->req_id, PS_ENOENT, "shard %u has no checkpoint",
                       srv->shard);
        return;
    }
    if (msg->count && ck->id && msg->count != ck->id) { /* count: the checkpoint asked about */
        psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT, "shard %u went on to another "
                       "checkpoint (%016llx, into %s)", srv->shard, (unsigned long long)ck->id,
                       ck->dir);
        return;
    }
    if (ck->state == CK_FAILED) {
        /* psctl's request client names the shard it asked ("shard N: ..."). */
        psd_send_error(srv, conn, msg->req_id, ck->rc ? ck->rc : PS_EIO, "%s", ck->err);
        return;
    }
    ps_msg_t r = {.type = PS_MSG_CKPT_STATUS_REPLY, .req_id = msg->req_id, .shard = srv->shard};
    if (ck->state == CK_SNAP || ck->state == CK_COPYING)
        r.flags = PS_FLAG_PENDING; /* under way: psctl's --wait running out leaves it be */
    if (ck->state == CK_DONE) { /* before, the pool thread's copy still writes these */
        r.flags = 1;
        r.step = ck->vmin;
        r.step_max = ck->ms;
        r.count = ck->bytes;
        r.chunk = (uint32_t)ck->nchunks;
    }
    psd_send_msg(srv, conn, &r);
}

/* psctl gave checkpoint `count` up (its --wait ran out, a shard refused or failed, the hold
 * lapsed): an armed one is dropped, one whose snapshot is queued is dropped once it is open, a
 * copy under way stops at its next record and removes what it wrote (its source is a read
 * snapshot and its files are its own, so stopping it is what a failed copy does already; left
 * to finish, it would hold the snapshot's pages and write a part psctl then removes, and psctl
 * could not remove files still being written). Another id, or none, changes nothing. */
static void on_cancel(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    struct psd_ckpt_s *ck = srv->ckpt;
    ps_msg_t r = {.type = PS_MSG_CKPT_CANCEL_REPLY, .req_id = msg->req_id, .shard = srv->shard,
                  .flags = PS_FLAG_DONE};
    if (ck && msg->count != 0 && ck->id == msg->count) {
        switch (ck->state) {
        case CK_ARMED: drop(ck, false); break;
        case CK_SNAP: /* its slot job runs anyway; snap_done drops it: stopping, not gone (a
                         new arm meanwhile is refused "stopping here") */
        case CK_COPYING:
            __atomic_store_n(&ck->cancel, 1, __ATOMIC_RELAXED);
            r.flags = PS_FLAG_PENDING;
            break;
        case CK_DONE: r.flags = PS_FLAG_FINISHED; break; /* whole: psctl removes it */
        default: break;                                   /* failed: it removed itself */
        }
    }
    psd_send_msg(srv, conn, &r);
}

/* ---- repair ---------------------------------------------------------------------------- */

static void repair_run(psd_slot_work_t *w)
{
    repair_t *r = (repair_t *)w;
    psd_server_t *srv = w->srv;
    psd_ckpt_src_t *ck = &r->src; /* in *r, not on this frame: the fault's return reads it */
    psd_wtxn_t tx = {0};
    int rc;
    sigjmp_buf fault;
    if (sigsetjmp(fault, 1)) {
        /* A page past the end of that data.mdb (SIGBUS), or a page LMDB asserts on (1, 2:
         * ckpt_meta.c): before, the handler ended this psd, a shard serving its job, for one
         * bad copy. */
        snprintf(r->err, sizeof r->err, "%s/shard-%u/data.mdb: damaged (a page past the end "
                 "of the file, or one LMDB cannot walk: a checkpoint copy cut short or "
                 "damaged): not repaired", r->from, r->from_shard);
        r->rc = PS_EDATA;
        PS_LOG(PS_LOG_WARN, "ckpt", "repair: %s", r->err);
        goto out;
    }
    psd_ckpt_bus_jmp = &fault;
    if ((rc = psd_ckpt_src_open(ck, r->from, r->from_shard, srv->m.map_size_mb)) != 0) {
        snprintf(r->err, sizeof r->err, "%s/shard-%u: cannot open the checkpoint: %s", r->from,
                 r->from_shard, psd_ckpt_src_strerror(rc));
        r->rc = PS_ESTORE;
        goto out;
    }
    uint8_t kb[9] = {'C', (uint8_t)(r->t >> 24), (uint8_t)(r->t >> 16), (uint8_t)(r->t >> 8),
                     (uint8_t)r->t, (uint8_t)(r->c >> 24), (uint8_t)(r->c >> 16),
                     (uint8_t)(r->c >> 8), (uint8_t)r->c};
    MDB_val k = {sizeof kb, kb}, v;
    if ((rc = mdb_get(ck->txn, ck->dbi, &k, &v)) != 0) {
        snprintf(r->err, sizeof r->err, "%s/shard-%u holds no chunk %u/%u", r->from,
                 r->from_shard, r->t, r->c);
        r->rc = PS_ENOENT;
        goto out;
    }
    const psd_chunk_hdr_t *src = v.mv_data;
    if (v.mv_size < sizeof *src || v.mv_size != psd_chunk_bytes(src->n, src->nstate) ||
        src->format != PSD_CHUNK_FORMAT || psd_store_chunk_hash(src) != src->hash) {
        snprintf(r->err, sizeof r->err, "%s/shard-%u: its chunk %u/%u does not match its own "
                 "hash", r->from, r->from_shard, r->t, r->c);
        r->rc = PS_ESTORE;
        goto out;
    }
    /* Copied out while the guard holds: the record's bytes are read once more below, and a
     * file cut short between the hash and that read ended this psd (a review, session 70). */
    if ((r->copy = malloc(v.mv_size)) == NULL) {
        snprintf(r->err, sizeof r->err, "out of memory for chunk %u/%u's record", r->t, r->c);
        r->rc = PS_ENOMEM;
        goto out;
    }
    memcpy(r->copy, v.mv_data, v.mv_size);
    src = r->copy;
    psd_ckpt_bus_jmp = NULL;
    if ((r->rc = psd_store_begin(&srv->store, &tx)) != 0) {
        snprintf(r->err, sizeof r->err, "cannot begin a transaction: %s", ps_strerror(r->rc));
        goto out;
    }
    const psd_chunk_hdr_t *live;
    r->rc = psd_store_chunk_get(&srv->store, tx.r, r->t, r->c, &live);
    if (r->rc == 0 && (live->version != r->version || src->version != r->version ||
                       live->n != src->n || live->nstate != src->nstate)) {
        snprintf(r->err, sizeof r->err, "chunk %u/%u is at version %llu here and %llu in the "
                 "checkpoint (repair asked for %llu): not repaired", r->t, r->c,
                 (unsigned long long)live->version, (unsigned long long)src->version,
                 (unsigned long long)r->version);
        r->rc = PS_ECONFLICT;
    } else if (r->rc == 0 && src->hash != live->hash && src->hash != psd_store_chunk_hash(live)) {
        /* The same version, other values: another run's or cluster's chunk. The committed
         * record's hash (or, its header damaged, its bytes) says what the chunk must hold. */
        snprintf(r->err, sizeof r->err, "chunk %u/%u at version %llu in the checkpoint (hash "
                 "%016llx) is not the one this shard committed (hash %016llx): another run's "
                 "checkpoint? not repaired", r->t, r->c, (unsigned long long)r->version,
                 (unsigned long long)src->hash, (unsigned long long)live->hash);
        r->rc = PS_ECONFLICT;
    } else if (r->rc) {
        snprintf(r->err, sizeof r->err, "chunk %u/%u: %s", r->t, r->c, ps_strerror(r->rc));
    }
    psd_chunk_hdr_t *h;
    if (r->rc == 0) r->rc = psd_store_chunk_reserve(&tx, r->t, r->c, src->n, src->nstate, &h);
    if (r->rc == 0) {
        memcpy(h, src, v.mv_size);
        psd_store_chunk_seal(h);
        r->hash = h->hash;
        r->rc = psd_store_commit(&tx);
        if (r->rc) snprintf(r->err, sizeof r->err, "commit: %s", ps_strerror(r->rc));
    } else {
        psd_store_abort(&tx);
    }
out:
    psd_ckpt_bus_jmp = NULL;
    free(r->copy);
    r->copy = NULL;
    psd_ckpt_src_close(ck);
}

static void repair_done(psd_slot_work_t *w)
{
    repair_t *r = (repair_t *)w;
    psd_server_t *srv = w->srv;
    srv->ckpt->repairing--;
    if (r->rc == 0) {
        psd_tensor_t *t = &srv->tensors[r->t];
        psd_integrity_chunk_hashed(srv, t->chunks[r->c], r->hash);
        PS_LOG(PS_LOG_WARN, "ckpt", "chunk %u/%u repaired at version %llu from %s/shard-%u",
               r->t, r->c, (unsigned long long)r->version, r->from, r->from_shard);
        ps_msg_t a = {.type = PS_MSG_REPAIR_REPLY, .req_id = r->req_id, .shard = srv->shard,
                      .tensor = r->t, .chunk = r->c, .step = r->version};
        psd_send_msg(srv, r->conn, &a);
    } else {
        psd_send_error(srv, r->conn, r->req_id, r->rc, "%s", r->err);
    }
    psd_conn_unref(r->conn);
    free(r);
}

static void on_repair(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (msg->tensor >= srv->ntensors || !srv->tensors[msg->tensor].present ||
        !srv->tensors[msg->tensor].ready || msg->chunk >= srv->tensors[msg->tensor].nchunks ||
        srv->tensors[msg->tensor].chunks[msg->chunk] == NULL) {
        psd_send_error(srv, conn, msg->req_id, PS_ENOENT, "shard %u holds no chunk %u/%u",
                       srv->shard, msg->tensor, msg->chunk);
        return;
    }
    repair_t *r = calloc(1, sizeof *r);
    if (state(srv) == NULL || r == NULL) {
        free(r);
        psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
        return;
    }
    r->srv = srv;
    r->conn = conn;
    r->req_id = msg->req_id;
    r->t = msg->tensor;
    r->c = msg->chunk;
    r->version = msg->step;
    snprintf(r->from, sizeof r->from, "%s", msg->error);
    r->from_shard = msg->workers;
    r->slot.srv = srv;
    r->slot.run = repair_run;
    r->slot.done = repair_done;
    psd_conn_ref(conn);
    srv->ckpt->repairing++;
    psd_shard_slot_queue(srv, &r->slot);
}

void psd_ckpt_on_msg(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (srv->stopping && msg->type != PS_MSG_CKPT_STATUS && msg->type != PS_MSG_CKPT_CANCEL) {
        psd_send_error(srv, conn, msg->req_id, PS_EBUSY, "shard %u is shutting down", srv->shard);
        return;
    }
    if ((msg->type == PS_MSG_CKPT_BEGIN || msg->type == PS_MSG_CKPT_GO) && srv->coord == NULL) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "%s goes to shard 0, not shard %u "
                           "(the manifest lists the servers in another order?)",
                       ps_msg_type_name(msg->type), srv->shard);
        return;
    }
    switch (msg->type) {
    case PS_MSG_CKPT_BEGIN: {
        /* step 0: now; step S > 0: at step S (psctl checkpoint --follow), maybe later. */
        ps_msg_t r = {.type = PS_MSG_CKPT_BEGIN_REPLY, .req_id = msg->req_id, .shard = 0,
                      .step = msg->step, .consistency = (uint32_t)srv->m.job.consistency};
        char why[200];
        int rc = 0;
        if (msg->step == 0)
            r.step = psd_coord_ckpt_hold(srv, msg->count, conn, &r.flags, &r.workers);
        else
            rc = psd_coord_ckpt_hold_at(srv, msg->step, msg->count, conn, &r.flags, why,
                                        sizeof why);
        if (rc)
            psd_send_error(srv, conn, msg->req_id, rc, "%s", why);
        else
            psd_send_msg(srv, conn, &r);
        break;
    }
    case PS_MSG_CKPT_ARM: on_arm(srv, conn, msg); break;
    case PS_MSG_CKPT_GO: {
        /* step: the next checkpoint's, or 0; count: the checkpoint's id. The reply's
         * PS_FLAG_DONE: the hold lasted for it since its drained answer (asp / ssp: a cut). */
        bool held = psd_coord_ckpt_release_until(srv, msg->step, msg->count, conn);
        ps_msg_t r = {.type = PS_MSG_CKPT_GO_REPLY, .req_id = msg->req_id, .shard = 0,
                      .flags = held ? PS_FLAG_DONE : 0};
        psd_send_msg(srv, conn, &r);
        break;
    }
    case PS_MSG_CKPT_STATUS: on_status(srv, conn, msg); break;
    case PS_MSG_CKPT_CANCEL: on_cancel(srv, conn, msg); break;
    case PS_MSG_REPAIR: on_repair(srv, conn, msg); break;
    default:
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "unexpected %s",
                       ps_msg_type_name(msg->type));
    }
}

int psd_ckpt_dir_check(const ps_manifest_t *m, char *err, size_t errlen)
{
    if (!m->checkpoint.present) return 0;
    char dir[PS_PATH_MAX + 32], why[PS_PATH_MAX + 256];
    if (m->checkpoint.dir[0])
        snprintf(dir, sizeof dir, "%s", m->checkpoint.dir);
    else
        snprintf(dir, sizeof dir, "%s/../checkpoints", m->servers[0].data_dir);
    /* Each checkpoint's directory, made absolute as the follower makes it (against this
     * working directory), travels in a wire message: a relative one passed the manifest's
     * length check and then failed every checkpoint, the follower started again each second
     * (a review, session 71). */
    char cwd[PS_PATH_MAX] = "";
    size_t most = strlen(dir) + strlen("/time-18446744073709551615");
    if (dir[0] != '/' && getcwd(cwd, sizeof cwd) != NULL) most += strlen(cwd) + 1;
    if (most >= PS_CKPT_DIR_MAX) {
        snprintf(err, errlen, "%s %s%s%s: each checkpoint's directory (.../time-N) must stay "
                 "under %d bytes, and this one can take %zu: give checkpoint.dir as a shorter "
                 "absolute path", m->checkpoint.dir[0] ? "checkpoint.dir" :
                 "the checkpoints' default directory", dir, dir[0] == '/' ? "" : " from ",
                 dir[0] == '/' ? "" : cwd, PS_CKPT_DIR_MAX, most);
        return PS_ECONFIG;
    }
    if (ps_dir_makeable(dir, why, sizeof why) == 0) return 0;
    snprintf(err, errlen, "%s %s cannot hold the periodic checkpoints: %s",
             m->checkpoint.dir[0] ? "checkpoint.dir" : "the checkpoints' default directory", dir,
             why);
    return PS_ECONFIG;
}
