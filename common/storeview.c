/* storeview.c: read-only same-host view of a shard's store (storeview.h). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "chunkrec.h"
#include "crc32c.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "storeview.h"

/* This boot of this host's kernel (/proc/sys/kernel/random/boot_id: processes on one host share
 * it, another host has another) and this process's pid namespace (LMDB tells live readers from
 * dead ones by pid, which only works within one namespace), hashed; 0 if the boot cannot be
 * read: the pid namespace alone is the same on every host (the initial one's inode is a kernel
 * constant), so two such hosts would take each other for one (a review, session 72). */
uint64_t ps_storeview_host_id(void)
{
    static uint64_t cached; /* computed once (UINT64_MAX: unknown); a race computes it twice */
    uint64_t h = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (h) return h == UINT64_MAX ? 0 : h;
    char b[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (fgets(b, sizeof b, f) == NULL) b[0] = '\0';
        fclose(f);
    }
    if (strlen(b) < 16) { /* no boot id */
        __atomic_store_n(&cached, UINT64_MAX, __ATOMIC_RELAXED);
        return 0;
    }
    h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = b; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    struct stat ns;
    if (stat("/proc/self/ns/pid", &ns) == 0)
        h = (h ^ (uint64_t)ns.st_ino) * 0x100000001b3ull;
    if (h == 0 || h == UINT64_MAX) h = 1;
    __atomic_store_n(&cached, h, __ATOMIC_RELAXED);
    return h;
}

uint64_t ps_storeview_stat_id(const struct stat *st)
{
    uint64_t id = ((uint64_t)st->st_dev * 0x9e3779b97f4a7c15ull ^ (uint64_t)st->st_ino) *
                      0xff51afd7ed558ccdull ^
                  ps_storeview_host_id();
    return id ? id : 1;
}

uint64_t ps_storeview_file_id(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 ? ps_storeview_stat_id(&st) : 0;
}

/* ---- the process's environments ------------------------------------------------------ */

/* One per store open in this process (LMDB: "do not have open an LMDB database twice in the
 * same process at the same time"; closing one copy clears every reader slot of the process,
 * mdb_env_close0, and closing its lock file drops the process's locks on it, by which psd
 * tells a live reader: psd_direct_reap). */
struct ps_storeenv_s {
    MDB_env *env;
    MDB_dbi dbi;
    uint64_t id;              /* the data file's identity */
    pid_t pid;                /* the process that opened it (a forked child opens its own) */
    int dead;                 /* a grown map could not be adopted (LMDB left no map): under
                                 remap, every read of it fails */
    uint32_t refs;            /* views on it; under g_envs_mu */
    pthread_rwlock_t remap;   /* reads hold it shared; adopting a grown map, exclusively (LMDB:
                                 only with no transaction active in the process) */
    struct ps_storeenv_s *next;
};

static pthread_mutex_t g_envs_mu = PTHREAD_MUTEX_INITIALIZER;
static ps_storeenv_t *g_envs;
static pthread_once_t g_envs_once = PTHREAD_ONCE_INIT;

/* A child forked while another thread held the list's lock would wait for it for good (a
 * python program that forks beside a client): fork takes it first. */
static void envs_lock(void) { pthread_mutex_lock(&g_envs_mu); }
static void envs_unlock(void) { pthread_mutex_unlock(&g_envs_mu); }
static void envs_at_fork(void) { pthread_atfork(envs_lock, envs_unlock, envs_unlock); }

/* The environment of store @p id in @p dir, taken (refs + 1): this process's, or opened now.
 * @return 0, or an LMDB error code / -errno with @p err set. */
static int env_take(const char *dir, uint64_t id, ps_storeenv_t **out, char *err, size_t errlen)
{
    pthread_once(&g_envs_once, envs_at_fork);
    pid_t me = getpid();
    pthread_mutex_lock(&g_envs_mu);
    for (ps_storeenv_t *e = g_envs; e; e = e->next)
        if (e->id == id && e->pid == me) {
            e->refs++;
            *out = e;
            pthread_mutex_unlock(&g_envs_mu);
            return 0;
        }
    ps_storeenv_t *e = calloc(1, sizeof *e);
    int rc = e ? mdb_env_create(&e->env) : ENOMEM;
    if (rc == 0) rc = mdb_env_set_maxreaders(e->env, 1024); /* as psd, if this opens it first */
    if (rc == 0) rc = mdb_env_open(e->env, dir, MDB_RDONLY | MDB_NOTLS | MDB_NORDAHEAD, 0600);
    MDB_txn *txn = NULL;
    if (rc == 0 && (rc = mdb_txn_begin(e->env, NULL, MDB_RDONLY, &txn)) == 0) {
        rc = mdb_dbi_open(txn, NULL, 0, &e->dbi);
        mdb_txn_abort(txn);
    }
    int fd;
    uint64_t got = rc == 0 && mdb_env_get_fd(e->env, &fd) == 0 ? ps_storeview_file_id(fd) : 0;
    if (rc == 0 && got != id) {
        snprintf(err, errlen, "%s: not the shard's store (identity %016llx, the shard's %016llx)",
                 dir, (unsigned long long)got, (unsigned long long)id);
        rc = -1;
    } else if (rc) {
        snprintf(err, errlen, "%s: cannot open the shard store read-only: %s", dir,
                 mdb_strerror(rc));
    }
    if (rc) {
        if (e && e->env) mdb_env_close(e->env);
        free(e);
        pthread_mutex_unlock(&g_envs_mu);
        return rc;
    }
    pthread_rwlockattr_t ra; /* a steady stream of reads must not keep a remap waiting */
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&e->remap, &ra);
    pthread_rwlockattr_destroy(&ra);
    e->id = id;
    e->pid = me;
    e->refs = 1;
    e->next = g_envs;
    g_envs = e;
    *out = e;
    pthread_mutex_unlock(&g_envs_mu);
    return 0;
}

/* Give back a view's hold of @p e; the last closes it. */
static void env_drop(ps_storeenv_t *e)
{
    pthread_mutex_lock(&g_envs_mu);
    if (--e->refs == 0) {
        for (ps_storeenv_t **pp = &g_envs; *pp; pp = &(*pp)->next)
            if (*pp == e) {
                *pp = e->next;
                break;
            }
        mdb_env_close(e->env);
        pthread_rwlock_destroy(&e->remap);
        free(e);
    }
    pthread_mutex_unlock(&g_envs_mu);
}

/* ---- views ------------------------------------------------------------------------------- */

int ps_storeview_open(ps_storeview_t *v, const char *dir, uint64_t want_id, char *err,
                      size_t errlen)
{
    memset(v, 0, sizeof *v);
    /* Checked before LMDB opens anything: opening creates lock.mdb and takes locks, which must
     * not happen in a directory that is not the shard's (or in one this process has open). */
    char path[1100];
    struct stat st;
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    if (stat(path, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    if (ps_storeview_stat_id(&st) != want_id) {
        snprintf(err, errlen, "%s: not the shard's store (another file, host or pid namespace)",
                 dir);
        return PS_ESTALE;
    }
    /* On a read-only mount LMDB reads without a reader slot (it cannot open lock.mdb for
     * writing and goes on without it): psd could then reuse pages under a read. */
    struct statvfs fs;
    if (statvfs(dir, &fs) == 0 && (fs.f_flag & ST_RDONLY)) {
        snprintf(err, errlen, "%s: mounted read-only here: reads would not be protected", dir);
        return PS_ESTALE;
    }
    int rc = env_take(dir, want_id, &v->env, err, errlen);
    if (rc == -1) return PS_ESTALE; /* another identity, said */
    if (rc) return rc > 0 && rc < 4096 ? -rc : PS_ESTORE;
    v->id = want_id;
    return 0; /* its read transaction begins with its first read, under the remap lock */
}

/* Begin (the first read) or renew the view's read transaction. */
static int txn_start(ps_storeview_t *v)
{
    if (v->env->dead) return MDB_PANIC;
    return v->txn ? mdb_txn_renew(v->txn) : mdb_txn_begin(v->env->env, NULL, MDB_RDONLY, &v->txn);
}

/* Start the view's read transaction, holding its environment's remap lock shared (released by
 * view_end); a map the shard has grown since (also since another view opened the shared
 * environment: a shard restarted with a larger map_size_mb) is adopted first, exclusively. */
static int view_renew(ps_storeview_t *v)
{
    ps_storeenv_t *e = v->env;
    pthread_rwlock_rdlock(&e->remap);
    int rc = txn_start(v);
    if (rc == MDB_MAP_RESIZED) { /* the transaction was ended: none of ours is active */
        pthread_rwlock_unlock(&e->remap);
        pthread_rwlock_wrlock(&e->remap);
        /* Another view's may have adopted it meanwhile: harmless. LMDB unmaps, then maps: a
         * failure leaves no map, so every view of it fails from now on. */
        if (!e->dead && mdb_env_set_mapsize(e->env, 0) != 0) e->dead = 1;
        pthread_rwlock_unlock(&e->remap);
        pthread_rwlock_rdlock(&e->remap);
        rc = txn_start(v);
    }
    if (rc) {
        pthread_rwlock_unlock(&e->remap);
        return PS_ESTORE;
    }
    return 0;
}

static void view_end(ps_storeview_t *v)
{
    mdb_txn_reset(v->txn);
    pthread_rwlock_unlock(&v->env->remap);
}

/* PS_TEST_DIRECT_STOP=N (tests only): the process's Nth read stops it (SIGSTOP) inside its read
 * transaction, as a worker stopped (a signal, a debugger, a frozen container) at that point is:
 * its snapshot stays, and the shard's store cannot reuse the pages written after it. */
static void test_stop_here(void)
{
    static int at = -1; /* set once: the first read of the process (racing readers agree) */
    static uint32_t reads;
    if (__atomic_load_n(&at, __ATOMIC_RELAXED) < 0) {
        const char *e = getenv("PS_TEST_DIRECT_STOP");
        __atomic_store_n(&at, e && atoi(e) > 0 ? atoi(e) : 0, __ATOMIC_RELAXED);
    }
    int n = __atomic_load_n(&at, __ATOMIC_RELAXED);
    if (n == 0 || __atomic_add_fetch(&reads, 1, __ATOMIC_RELAXED) != (uint32_t)n) return;
    PS_LOG(PS_LOG_WARN, "libps", "PS_TEST_DIRECT_STOP=%d: stops inside direct read %d, holding "
           "its snapshot (a test hook)", n, n);
    raise(SIGSTOP);
}

int ps_storeview_read(ps_storeview_t *v, uint32_t t, uint32_t c, uint64_t min_version,
                      float *dst, uint32_t n, uint64_t *version, uint32_t *crc)
{
    int rc = view_renew(v);
    if (rc) return rc;
    test_stop_here();
    uint8_t kb[PS_CHUNK_KEY_LEN];
    ps_chunk_key(kb, t, c);
    MDB_val k = {sizeof kb, kb}, val;
    int mrc = mdb_get(v->txn, v->env->dbi, &k, &val);
    /* The header copied out: a small record sits inside an LMDB page at an odd address (a
     * strict-alignment CPU would trap on it in place; UBSan reports it). */
    ps_chunk_hdr_t h;
    if (mrc == 0 && val.mv_size >= sizeof h) memcpy(&h, val.mv_data, sizeof h);
    if (mrc == MDB_NOTFOUND)
        rc = PS_ENOENT;
    else if (mrc || val.mv_size < sizeof h || val.mv_size != ps_chunk_rec_bytes(h.n, h.nstate) ||
             h.format != PS_CHUNK_FORMAT || h.n != n)
        rc = PS_ESTORE;
    else if (h.version < min_version)
        rc = PS_ESTALE;
    if (rc == 0) {
        /* Copied and checksummed in one pass (the CRC is folded from the copy's registers). */
        const uint8_t *params = (const uint8_t *)val.mv_data + sizeof h;
        if (ps_crc32c_copy(0, dst, params, (size_t)n * 4) != h.crc32c) rc = PS_ECRC;
        if (version) *version = h.version;
        if (crc) *crc = h.crc32c;
    }
    view_end(v);
    return rc;
}

void ps_storeview_close(ps_storeview_t *v)
{
    if (v->txn) mdb_txn_abort(v->txn); /* MDB_NOTLS: frees its own reader slot only */
    if (v->env) env_drop(v->env);
    memset(v, 0, sizeof *v);
}
