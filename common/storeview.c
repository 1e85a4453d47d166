/* storeview.c: read-only same-host view of a shard's store (storeview.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "chunkrec.h"
#include "crc32c.h"
#include "ps/ps_error.h"
#include "storeview.h"

/* This boot of this host's kernel (/proc/sys/kernel/random/boot_id: processes on one host share
 * it, another host has another) and this process's pid namespace (LMDB tells live readers from
 * dead ones by pid, which only works within one namespace), hashed; 0 if neither is readable. */
uint64_t ps_storeview_host_id(void)
{
    static uint64_t cached; /* computed once; a race computes the same value twice */
    uint64_t h = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (h) return h;
    char b[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (fgets(b, sizeof b, f) == NULL) b[0] = '\0';
        fclose(f);
    }
    h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = b; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    struct stat ns;
    if (stat("/proc/self/ns/pid", &ns) == 0)
        h = (h ^ (uint64_t)ns.st_ino) * 0x100000001b3ull;
    if (h == 0) h = 1;
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
    int rc = mdb_env_create(&v->env);
    if (rc == 0) rc = mdb_env_set_maxreaders(v->env, 1024); /* as psd, if this opens it first */
    if (rc == 0) rc = mdb_env_open(v->env, dir, MDB_RDONLY | MDB_NOTLS | MDB_NORDAHEAD, 0600);
    if (rc) {
        snprintf(err, errlen, "%s: cannot open the shard store read-only: %s", dir,
                 mdb_strerror(rc));
        ps_storeview_close(v);
        return rc > 0 && rc < 4096 ? -rc : PS_ESTORE;
    }
    int fd;
    if (mdb_env_get_fd(v->env, &fd) == 0) v->id = ps_storeview_file_id(fd);
    if (v->id == 0 || v->id != want_id) {
        snprintf(err, errlen, "%s: not the shard's store (identity %016llx, the shard's %016llx)",
                 dir, (unsigned long long)v->id, (unsigned long long)want_id);
        ps_storeview_close(v);
        return PS_ESTALE;
    }
    if ((rc = mdb_txn_begin(v->env, NULL, MDB_RDONLY, &v->txn)) == 0 &&
        (rc = mdb_dbi_open(v->txn, NULL, 0, &v->dbi)) == 0) {
        mdb_txn_reset(v->txn);
        return 0;
    }
    snprintf(err, errlen, "%s: cannot read the shard store: %s", dir, mdb_strerror(rc));
    ps_storeview_close(v);
    return PS_ESTORE;
}

/* Renew the view's read transaction; a map the shard has grown since is adopted first. */
static int view_renew(ps_storeview_t *v)
{
    int rc = mdb_txn_renew(v->txn);
    if (rc == MDB_MAP_RESIZED && mdb_env_set_mapsize(v->env, 0) == 0) rc = mdb_txn_renew(v->txn);
    return rc ? PS_ESTORE : 0;
}

int ps_storeview_read(ps_storeview_t *v, uint32_t t, uint32_t c, uint64_t min_version,
                      float *dst, uint32_t n, uint64_t *version, uint32_t *crc)
{
    int rc = view_renew(v);
    if (rc) return rc;
    uint8_t kb[PS_CHUNK_KEY_LEN];
    ps_chunk_key(kb, t, c);
    MDB_val k = {sizeof kb, kb}, val;
    int mrc = mdb_get(v->txn, v->dbi, &k, &val);
    const ps_chunk_hdr_t *h = val.mv_data;
    if (mrc == MDB_NOTFOUND)
        rc = PS_ENOENT;
    else if (mrc || val.mv_size < sizeof *h || val.mv_size != ps_chunk_rec_bytes(h->n, h->nstate) ||
             h->format != PS_CHUNK_FORMAT || h->n != n)
        rc = PS_ESTORE;
    else if (h->version < min_version)
        rc = PS_ESTALE;
    if (rc == 0) {
        /* Copied and checksummed in one pass (the CRC is folded from the copy's registers). */
        if (ps_crc32c_copy(0, dst, h + 1, (size_t)n * 4) != h->crc32c) rc = PS_ECRC;
        if (version) *version = h->version;
        if (crc) *crc = h->crc32c;
    }
    mdb_txn_reset(v->txn);
    return rc;
}

void ps_storeview_close(ps_storeview_t *v)
{
    if (v->txn) mdb_txn_abort(v->txn);
    if (v->env) mdb_env_close(v->env);
    memset(v, 0, sizeof *v);
}
