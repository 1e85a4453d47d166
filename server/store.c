/* store.c: the shard's LMDB environment (see store.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "rechash.h"

#include "crc32c.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "durable.h"
#include "store.h"

static int mdb_err(int rc)
{
    if (rc == 0) return 0;
    if (rc == MDB_MAP_FULL) return PS_ESTOREFULL;
    if (rc > 0 && rc < 4096) return -rc; /* an errno */
    return PS_ESTORE;
}

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int psd_store_mkdir_p(const char *dir)
{
    return ps_mkdir_durable(dir);
}

/* Metadata "M<name>" of @p txn into @p v: mdb_get's code. */
static int meta_get(psd_store_t *st, MDB_txn *txn, const char *name, MDB_val *v)
{
    char k[64];
    snprintf(k, sizeof k, "M%s", name);
    MDB_val key = {strlen(k), k};
    return mdb_get(txn, st->dbi, &key, v);
}

/* Metadata "M<name>" in @p txn: recorded if absent, else compared with @p val. @p text: the
 * value is a string (named in the error as such), else a binary number. */
static int meta_check(psd_store_t *st, MDB_txn *txn, const char *name, const void *val,
                      size_t len, bool text, char *err, size_t errlen)
{
    char k[64];
    snprintf(k, sizeof k, "M%s", name);
    MDB_val key = {strlen(k), k}, v;
    int rc = meta_get(st, txn, name, &v);
    bool recorded = rc == MDB_NOTFOUND;
    if (recorded) {
        MDB_val nv = {len, (void *)val};
        rc = mdb_put(txn, st->dbi, &key, &nv, 0);
    }
    if (rc) {
        snprintf(err, errlen, "%s: cannot record the store's %s: %s", st->dir, name,
                 mdb_strerror(rc));
        return mdb_err(rc);
    }
    if (recorded) return 0;
    if (v.mv_size != len || memcmp(v.mv_data, val, len) != 0) {
        if (text)
            snprintf(err, errlen, "%s: data_dir was made with another %s (stored '%.*s', this "
                     "manifest has '%.*s')", st->dir, name,
                     (int)(v.mv_size < 200 ? v.mv_size : 200), (const char *)v.mv_data,
                     (int)(len < 200 ? len : 200), (const char *)val);
        else if (len == sizeof(uint64_t) && v.mv_size == sizeof(uint64_t)) {
            uint64_t had, want;
            memcpy(&had, v.mv_data, sizeof had);
            memcpy(&want, val, sizeof want);
            snprintf(err, errlen, "%s: data_dir was made with %s %llu, this manifest has %llu",
                     st->dir, name, (unsigned long long)had, (unsigned long long)want);
        } else
            snprintf(err, errlen, "%s: data_dir was made with another %s (stored value)", st->dir,
                     name);
        return PS_ECONFIG;
    }
    return 0;
}

/* Format 1 records: the same first 16 bytes (version, n, nstate), then the data. */
#define V1_HDR 16

/* Make sure every chunk record is the current format: a store without "Mrecord_format" but
 * with chunks was written by a psd before chunk hashes (format 1), format 2 hashed the record in
 * one run; the records are rewritten with the current header and hash in @p txn, so the
 * upgrade commits whole or not at all. */
static int record_format(psd_store_t *st, MDB_txn *txn, char *err, size_t errlen)
{
    const char *kname = "Mrecord_format";
    MDB_val key = {strlen(kname), (void *)kname}, v;
    uint64_t want = PSD_CHUNK_FORMAT;
    int rc = mdb_get(txn, st->dbi, &key, &v);
    uint64_t have = 1; /* no key: records from before chunk hashes */
    if (rc == 0) {
        have = 0;
        if (v.mv_size == 8) memcpy(&have, v.mv_data, 8);
        if (have == want) return 0;
        if (have != 2) {
            snprintf(err, errlen, "%s: chunk records are format %llu; this psd reads format %llu",
                     st->dir, (unsigned long long)have, (unsigned long long)want);
            return PS_ECONFIG;
        }
    } else if (rc != MDB_NOTFOUND) {
        return mdb_err(rc);
    }
    /* Format 2 records have this header; only their hash runs in another order. */
    const size_t from_hdr = have == 2 ? sizeof(psd_chunk_hdr_t) : V1_HDR;
    /* Collect the format 1 chunk keys first: the cursor must not walk what we rewrite. */
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(txn, st->dbi, &cur)) != 0) return mdb_err(rc);
    uint8_t *keys = NULL;
    size_t nkeys = 0, cap = 0;
    MDB_val k = {1, "C"};
    int ret = 0;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size != 9 || ((const uint8_t *)k.mv_data)[0] != 'C') break;
        if (nkeys == cap) {
            cap = cap ? 2 * cap : 64;
            uint8_t *nk = realloc(keys, cap * 9);
            if (nk == NULL) {
                ret = PS_ENOMEM;
                break;
            }
            keys = nk;
        }
        memcpy(keys + 9 * nkeys++, k.mv_data, 9);
    }
    mdb_cursor_close(cur);
    uint8_t *old = NULL;
    for (size_t i = 0; ret == 0 && i < nkeys; i++) {
        MDB_val ck = {9, keys + 9 * i}, cv;
        if ((rc = mdb_get(txn, st->dbi, &ck, &cv)) != 0) {
            ret = mdb_err(rc);
            break;
        }
        uint32_t n, ns;
        memcpy(&n, (const uint8_t *)cv.mv_data + 8, 4);
        memcpy(&ns, (const uint8_t *)cv.mv_data + 12, 4);
        size_t data = (size_t)n * (1 + (size_t)ns) * 4;
        if (ns > PS_CHUNK_MAX_STATE || cv.mv_size < from_hdr || cv.mv_size != from_hdr + data) {
            snprintf(err, errlen, "%s: chunk record %u/%u is not format %llu (%zu bytes)",
                     st->dir, rd32(keys + 9 * i + 1), rd32(keys + 9 * i + 5),
                     (unsigned long long)have, cv.mv_size);
            ret = PS_ESTORE;
            break;
        }
        /* A format 2 record is checked against its own seal (the CRC-32C of its params, the
         * XXH3-64 of params and state in one run) before it is sealed anew: sealing a damaged
         * one made the damage pass verify for good (a store whose format key was set back to
         * 2 over format 3 records; a helper's probe of damaged stores, session 61). */
        if (have == 2) {
            psd_chunk_hdr_t oh;
            memcpy(&oh, cv.mv_data, sizeof oh);
            const uint8_t *od = (const uint8_t *)cv.mv_data + from_hdr;
            if (oh.format != 2 || ps_crc32c(0, od, (size_t)n * 4) != oh.crc32c ||
                XXH3_64bits(od, data) != oh.hash) {
                snprintf(err, errlen, "%s: chunk record %u/%u does not match its format 2 seal "
                         "(format field %u): damaged, or not a format 2 record", st->dir,
                         rd32(keys + 9 * i + 1), rd32(keys + 9 * i + 5), oh.format);
                ret = PS_ESTORE;
                break;
            }
        }
        free(old); /* a copy: the put below may reuse the old record's pages */
        if ((old = malloc(cv.mv_size)) == NULL) {
            ret = PS_ENOMEM;
            break;
        }
        memcpy(old, cv.mv_data, cv.mv_size);
        MDB_val nv = {psd_chunk_bytes(n, ns), NULL};
        if ((rc = mdb_put(txn, st->dbi, &ck, &nv, MDB_RESERVE)) != 0) {
            ret = mdb_err(rc);
            break;
        }
        psd_chunk_hdr_t *h = nv.mv_data;
        memset(h, 0, sizeof *h);
        memcpy(h, old, V1_HDR); /* version, n, nstate: the same in formats 1 and 2 */
        h->format = PSD_CHUNK_FORMAT;
        memcpy(psd_chunk_params(h), old + from_hdr, data);
        psd_store_chunk_seal(h);
    }
    free(old);
    free(keys);
    if (ret == 0 && nkeys)
        PS_LOG(PS_LOG_INFO, "store", "%s: upgraded %zu chunk records to format %d", st->dir,
               nkeys, PSD_CHUNK_FORMAT);
    if (ret) {
        if (ret != PS_ESTORE) snprintf(err, errlen, "%s: cannot upgrade the chunk records: %s",
                                       st->dir, ps_strerror(ret));
        return ret;
    }
    MDB_val fv = {8, &want};
    return mdb_err(mdb_put(txn, st->dbi, &key, &fv, 0));
}

void psd_store_chunk_seal(psd_chunk_hdr_t *h)
{
    h->format = PSD_CHUNK_FORMAT;
    psd_store_chunk_sums(h, &h->crc32c, &h->hash);
}

/* Hash blocks [off, off + len) of a record of @p n values and @p ns state arrays (@p s) into
 * @p hs in the record's block order, the params' (at @p p, the span's first) folded into @p crc
 * in the same pass (ps_crc32c_xxh3); @return the CRC. */
static uint32_t sum_blocks(XXH3_state_t *hs, uint32_t crc, const float *p, const float *s,
                           uint32_t n, uint32_t ns, size_t off, size_t len, int *odd)
{
    for (size_t b = off; b < off + len; b += PSD_HASH_BLOCK) {
        size_t bl = off + len - b < PSD_HASH_BLOCK ? off + len - b : PSD_HASH_BLOCK;
        crc = ps_crc32c_xxh3(crc, hs, p + (b - off), bl * sizeof(float), odd);
        psd_rechash_block_at(hs, NULL, s + b, n, ns, bl);
    }
    return crc;
}

void psd_store_chunk_sums(const psd_chunk_hdr_t *h, uint32_t *crc, uint64_t *hash)
{
    const float *p = (const float *)(h + 1);
    XXH3_state_t hs;
    XXH3_64bits_reset(&hs);
    *crc = sum_blocks(&hs, 0, p, p + h->n, h->n, h->nstate, 0, h->n, NULL);
    *hash = XXH3_64bits_digest(&hs);
}

uint32_t psd_store_params_crc(const psd_chunk_hdr_t *h)
{
    return ps_crc32c(0, psd_chunk_params((psd_chunk_hdr_t *)h), (size_t)h->n * 4);
}

uint64_t psd_store_chunk_hash(const psd_chunk_hdr_t *h)
{
    return psd_rechash((const float *)(h + 1), h->n, h->nstate);
}

int psd_store_identity(psd_store_t *st, const char *name, const char *value, char *err,
                       size_t errlen)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(st->env, NULL, 0, &txn);
    if (rc == 0) {
        rc = meta_check(st, txn, name, value, strlen(value), true, err, errlen);
        if (rc) {
            mdb_txn_abort(txn);
            return rc;
        }
        rc = mdb_txn_commit(txn);
    }
    if (rc) snprintf(err, errlen, "%s: cannot record the store's %s: %s", st->dir, name,
                     mdb_strerror(rc));
    return mdb_err(rc);
}

/* The readers LMDB's lock file holds (mdb_env_set_maxreaders). */
#define LOCK_READERS 1024

/* Take the disk space of @p dir's LMDB lock file for @p readers readers (64 bytes each, and its
 * header) before LMDB maps it. @return 0, or the errno of posix_fallocate (EOPNOTSUPP where the
 * file system has none). */
static int lock_file_ahead(const char *dir, unsigned readers)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/lock.mdb", dir) >= (int)sizeof path) return ENAMETOOLONG;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    int rc = posix_fallocate(fd, 0, (off_t)readers * 64 + 4096);
    close(fd);
    return rc;
}

/* "DIR: data_dir is in use by another psd (pid N)" into @p err, N read from @p fd's psd.lock. */
static int in_use(int fd, const char *dir, char *err, size_t errlen)
{
    char pid[32] = "?";
    ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 1] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    snprintf(err, errlen, "%s: data_dir is in use by another psd (pid %s); refusing to start", dir,
             pid);
    return PS_EBUSY;
}

int psd_store_in_use(const char *dir, char *err, size_t errlen)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/psd.lock", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), rc = 0;
    if (fd < 0) return 0; /* none (or unreadable: psd_store_open says) */
    if (flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK)
        rc = in_use(fd, dir, err, errlen);
    close(fd); /* releases the shared lock */
    return rc;
}

int psd_store_open(psd_store_t *st, const char *dir, uint64_t map_mb, const char *meta_cluster,
                   uint64_t meta_chunk_bytes, uint32_t nstate, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    st->lockfd = -1;
    st->fd = -1;
    snprintf(st->dir, sizeof st->dir, "%s", dir);
    int rc = psd_store_mkdir_p(dir);
    if (rc) {
        snprintf(err, errlen, "%s: cannot create data_dir: %s", dir, strerror(-rc));
        return rc;
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/psd.lock", dir);
    st->lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (st->lockfd < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return rc;
    }
    if (flock(st->lockfd, LOCK_EX | LOCK_NB) != 0) {
        rc = in_use(st->lockfd, dir, err, errlen);
        close(st->lockfd);
        st->lockfd = -1;
        return rc;
    }
    char pidline[32];
    int pl = snprintf(pidline, sizeof pidline, "%d\n", (int)getpid());
    if (ftruncate(st->lockfd, 0) == 0 && pwrite(st->lockfd, pidline, (size_t)pl, 0) < 0) {
        /* The pid is only informative; a failed write does not matter. */
    }

    /* LMDB makes its lock file's pages through a map (the reader table): on a disk with no
     * page free that map faulted, and psd died of SIGBUS inside mdb_env_open at every start (a
     * review, session 72). Its bytes are taken first; a file system without fallocate is let
     * be. */
    int lrc = lock_file_ahead(dir, LOCK_READERS);
    if (lrc == ENOSPC || lrc == EDQUOT) {
        snprintf(err, errlen, "%s: the disk under data_dir is full: LMDB's lock file cannot be "
                 "made (free some space, or move data_dir)", dir);
        close(st->lockfd);
        st->lockfd = -1;
        return PS_ENOSPC;
    }

    MDB_txn *txn = NULL;
    if ((rc = mdb_env_create(&st->env)) != 0) goto fail;
    mdb_env_set_maxreaders(st->env, LOCK_READERS);
    if ((rc = mdb_env_set_mapsize(st->env, (size_t)map_mb << 20)) != 0) goto fail;
    rc = mdb_env_open(st->env, dir, MDB_WRITEMAP | MDB_NOSYNC | MDB_NOTLS, 0600);
    if (rc) goto fail;
    int dead = 0;
    mdb_reader_check(st->env, &dead);
    MDB_stat stat;
    if ((rc = mdb_env_stat(st->env, &stat)) != 0) goto fail;
    st->psize = stat.ms_psize;
    if (mdb_env_get_fd(st->env, &st->fd) != 0) st->fd = -1;
    if (psd_store_ahead(st, PSD_STORE_AHEAD) != 0) { /* a full disk: refused, not a crash */
        snprintf(err, errlen, "%s: the disk under data_dir is full: the store's next %llu MiB "
                 "cannot be allocated (free some space, or move data_dir)", dir,
                 (unsigned long long)(PSD_STORE_AHEAD >> 20));
        psd_store_close(st);
        return PS_ENOSPC;
    }
    if ((rc = mdb_txn_begin(st->env, NULL, 0, &txn)) != 0) goto fail;
    if ((rc = mdb_dbi_open(txn, NULL, 0, &st->dbi)) != 0) goto fail;
    rc = meta_check(st, txn, "cluster", meta_cluster, strlen(meta_cluster), true, err, errlen);
    if (rc == 0)
        rc = meta_check(st, txn, "chunk_bytes", &meta_chunk_bytes, sizeof meta_chunk_bytes, false,
                        err, errlen);
    uint64_t ns = nstate;
    if (rc == 0) rc = meta_check(st, txn, "optimizer state", &ns, sizeof ns, false, err, errlen);
    if (rc == PS_ECONFIG && strstr(err, "optimizer state")) {
        /* Named by the kind psd records beside the count (server.c), not numbers alone. */
        MDB_val v, c;
        uint64_t had = 0;
        if (meta_get(st, txn, "optimizer state", &c) == 0 && c.mv_size == sizeof had)
            memcpy(&had, c.mv_data, sizeof had);
        bool kind = meta_get(st, txn, "optimizer state kind", &v) == 0 && v.mv_size < 100;
        snprintf(err, errlen, "%s: data_dir was made for an optimizer that keeps %llu state "
                 "arrays per parameter%s%.*s%s, this manifest's keeps %u (adam and adamw 2, "
                 "momentum and adagrad 1, sgd and mean none): start it with the optimizer it "
                 "was made with, or from an empty data_dir", dir, (unsigned long long)had,
                 kind ? " (" : "", kind ? (int)v.mv_size : 0, kind ? (const char *)v.mv_data : "",
                 kind ? ")" : "", nstate);
    }
    if (rc == 0) rc = record_format(st, txn, err, errlen);
    if (rc) {
        mdb_txn_abort(txn);
        psd_store_close(st);
        return rc;
    }
    if ((rc = mdb_txn_commit(txn)) != 0) {
        txn = NULL;
        goto fail;
    }
    return 0;

fail:
    snprintf(err, errlen, "%s: cannot open the shard store: %s", dir, mdb_strerror(rc));
    if (txn) mdb_txn_abort(txn);
    psd_store_close(st);
    return mdb_err(rc);
}

void psd_store_close(psd_store_t *st)
{
    if (st->rcache) {
        mdb_txn_abort(st->rcache);
        st->rcache = NULL;
    }
    if (st->env) {
        int rc = mdb_env_sync(st->env, 1); /* NOSYNC: this is the store's only sync by default */
        if (rc)
            PS_LOG(PS_LOG_ERROR, "store", "%s: writing the store to disk at its close failed: "
                   "%s (what was committed since the last sync may be lost if the host goes "
                   "down)", st->dir, mdb_strerror(rc));
        mdb_env_close(st->env);
        st->env = NULL;
    }
    if (st->lockfd >= 0) {
        close(st->lockfd); /* releases the flock */
        st->lockfd = -1;
    }
}

int psd_store_load(psd_store_t *st, psd_store_tensor_cb on_tensor, psd_store_chunk_cb on_chunk,
                   psd_store_applied_cb on_applied, void *arg)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
    if (rc) return mdb_err(rc);
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(txn, st->dbi, &cur)) != 0) {
        mdb_txn_abort(txn);
        return mdb_err(rc);
    }
    MDB_val k, v;
    int ret = 0;
    /* Two passes: tensors first ('T' keys sort after 'C'), so chunks find their tensor. */
    for (int pass = 0; pass < 2 && ret == 0; pass++)
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        const uint8_t *kp = k.mv_data;
        if (pass == 0) {
            if (k.mv_size != 5 || kp[0] != 'T') continue;
        } else if (kp[0] == 'T') {
            continue;
        }
        if (k.mv_size == 5 && kp[0] == 'T') {
            if (v.mv_size != sizeof(ps_decl_t)) {
                ret = PS_ESTORE;
                break;
            }
            ps_decl_t d;
            memcpy(&d, v.mv_data, sizeof d);
            if ((ret = on_tensor(arg, rd32(kp + 1), &d)) != 0) break;
        } else if (k.mv_size == 9 && kp[0] == 'C') {
            const psd_chunk_hdr_t *h = v.mv_data;
            if (v.mv_size < sizeof *h || v.mv_size != psd_chunk_bytes(h->n, h->nstate)) {
                ret = PS_ESTORE;
                break;
            }
            if ((ret = on_chunk(arg, rd32(kp + 1), rd32(kp + 5), h)) != 0) break;
        } else if (k.mv_size == 9 && kp[0] == 'D') {
            on_applied(arg, rd32(kp + 1), rd32(kp + 5), v.mv_data, v.mv_size);
        }
    }
    if (ret == 0 && rc != MDB_NOTFOUND) ret = mdb_err(rc);
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    return ret;
}

int psd_store_chunks_each(psd_store_t *st, MDB_txn *txn, psd_store_record_cb cb, void *arg)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, st->dbi, &cur);
    if (rc) return mdb_err(rc);
    MDB_val k = {1, "C"}, v;
    int ret = 0;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0 && ret == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        const uint8_t *kp = k.mv_data;
        if (k.mv_size < 1 || kp[0] != 'C') break;
        if (k.mv_size != 9) continue;
        ret = cb(arg, rd32(kp + 1), rd32(kp + 5), v.mv_data, v.mv_size);
    }
    if (ret == 0 && rc != 0 && rc != MDB_NOTFOUND) ret = mdb_err(rc);
    mdb_cursor_close(cur);
    return ret;
}

/* mdb_reader_list's lines: "%10d %zx %llu" (pid, thread, txnid) or "%10d %zx -" (no
 * snapshot), after a header line. */
static int reader_line(const char *msg, void *ctx)
{
    psd_store_reader_t *o = ctx;
    int pid;
    size_t tid;
    unsigned long long txnid;
    if (sscanf(msg, "%d %zx %llu", &pid, &tid, &txnid) == 3 && pid > 0 &&
        (o->pid == 0 || txnid < o->txnid)) {
        o->pid = pid;
        o->txnid = txnid;
    }
    return 0;
}

int psd_store_oldest_reader(psd_store_t *st, psd_store_reader_t *out)
{
    MDB_envinfo info;
    *out = (psd_store_reader_t){0};
    if (mdb_env_info(st->env, &info) != 0 || mdb_reader_list(st->env, reader_line, out) < 0)
        return PS_ESTORE;
    out->lag = out->pid && out->txnid < info.me_last_txnid ? info.me_last_txnid - out->txnid : 0;
    return 0;
}

int psd_store_map_use(psd_store_t *st, uint64_t *used, uint64_t *size)
{
    MDB_envinfo info;
    if (mdb_env_info(st->env, &info) != 0) return PS_ESTORE;
    *used = ((uint64_t)info.me_last_pgno + 1) * st->psize;
    *size = info.me_mapsize;
    return 0;
}

int psd_store_ahead(psd_store_t *st, uint64_t bytes)
{
    MDB_envinfo info;
    if (st->fd < 0 || mdb_env_info(st->env, &info) != 0) return 0;
    uint64_t want = ((uint64_t)info.me_last_pgno + 1) * st->psize + bytes;
    if (want > info.me_mapsize) want = info.me_mapsize;
    if (want <= st->backed) return 0;
    /* In steps of PSD_STORE_AHEAD at least: one call every so many transactions. */
    uint64_t to = want + PSD_STORE_AHEAD < info.me_mapsize ? want + PSD_STORE_AHEAD
                                                            : info.me_mapsize;
    if (fallocate(st->fd, 0, (off_t)st->backed, (off_t)(to - st->backed)) == 0) {
        st->backed = to;
        return 0;
    }
    if (fallocate(st->fd, 0, (off_t)st->backed, (off_t)(want - st->backed)) != 0) {
        if (errno == ENOSPC || errno == EDQUOT) {
            PS_LOG(PS_LOG_ERROR, "store", "%s: the disk is full: %.1f MiB of the store's file "
                   "could not be allocated (map_size_mb %llu; %.1f MiB allocated)", st->dir,
                   (double)(want - st->backed) / (1 << 20),
                   (unsigned long long)(info.me_mapsize >> 20), (double)st->backed / (1 << 20));
            return PS_ENOSPC;
        }
        st->fd = -1; /* not supported here (EOPNOTSUPP): LMDB's writes as before */
        return 0;
    }
    st->backed = want;
    return 0;
}

int psd_store_begin(psd_store_t *st, psd_wtxn_t *tx)
{
    tx->st = st;
    tx->w = tx->r = NULL;
    int rc = psd_store_ahead(st, PSD_STORE_AHEAD);
    if (rc) return rc;
    if (st->rcache) {
        tx->r = st->rcache; /* renewed, not reallocated: one job at a time uses it */
        st->rcache = NULL;
        rc = mdb_txn_renew(tx->r);
        if (rc) {
            mdb_txn_abort(tx->r);
            tx->r = NULL;
        }
    }
    if (tx->r == NULL && (rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &tx->r)) != 0)
        return mdb_err(rc);
    rc = mdb_txn_begin(st->env, NULL, 0, &tx->w);
    if (rc) {
        mdb_txn_abort(tx->r);
        tx->r = NULL;
        return mdb_err(rc);
    }
    return 0;
}

static void release_read(psd_wtxn_t *tx)
{
    if (tx->r == NULL) return;
    mdb_txn_reset(tx->r);
    if (tx->st->rcache == NULL)
        tx->st->rcache = tx->r;
    else
        mdb_txn_abort(tx->r);
    tx->r = NULL;
}

int psd_store_commit(psd_wtxn_t *tx)
{
    int rc = mdb_txn_commit(tx->w);
    release_read(tx);
    tx->w = NULL;
    return mdb_err(rc);
}

void psd_store_abort(psd_wtxn_t *tx)
{
    if (tx->w) mdb_txn_abort(tx->w);
    release_read(tx);
    tx->w = NULL;
}

int psd_store_put_tensor(psd_wtxn_t *tx, const ps_decl_t *d)
{
    uint8_t kb[5] = {'T'};
    be32(kb + 1, d->id);
    MDB_val k = {sizeof kb, kb}, v = {sizeof *d, (void *)d};
    return mdb_err(mdb_put(tx->w, tx->st->dbi, &k, &v, 0));
}

int psd_store_del_tensor(psd_wtxn_t *tx, uint32_t t, uint32_t nchunks)
{
    uint8_t tk[5] = {'T'}, kb[PS_CHUNK_KEY_LEN];
    be32(tk + 1, t);
    MDB_val k = {sizeof tk, tk};
    int rc = mdb_del(tx->w, tx->st->dbi, &k, NULL);
    for (uint32_t c = 0; (rc == 0 || rc == MDB_NOTFOUND) && c < nchunks; c++) {
        ps_chunk_key(kb, t, c);
        for (int d = 0; d < 2 && (rc == 0 || rc == MDB_NOTFOUND); d++) {
            kb[0] = d ? 'D' : 'C'; /* another shard's chunk: neither is here */
            k = (MDB_val){sizeof kb, kb};
            rc = mdb_del(tx->w, tx->st->dbi, &k, NULL);
        }
    }
    return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

/*
 * Map a reserved record's pages past the end of those this process populated before, in one
 * system call (MADV_POPULATE_WRITE, Linux 5.14; elsewhere a no-op) instead of a page fault
 * per 4 KiB page as the update writes them: the map grows at its end (new records and the
 * first versions of copy-on-write), while a freed page LMDB hands out again lies below and is
 * mapped already. On the development VM a fault costs ~10-15 us; writing 128 MiB of fresh
 * tmpfs pages took 380-394 ms faulted in and 194 ms populated first.
 */
static void populate(psd_store_t *st, void *data, size_t len)
{
#ifdef MADV_POPULATE_WRITE
    uintptr_t page = (uintptr_t)st->psize, end = ((uintptr_t)data + len + page - 1) & ~(page - 1);
    if (len < st->psize || end <= st->populated) return;
    uintptr_t from = (uintptr_t)data & ~(page - 1);
    if (from < st->populated) from = st->populated;
    (void)madvise((void *)from, end - from, MADV_POPULATE_WRITE); /* advice: faults serve too */
    st->populated = end;
#else
    (void)st, (void)data, (void)len;
#endif
}

int psd_store_chunk_reserve(psd_wtxn_t *tx, uint32_t t, uint32_t c, uint32_t n, uint32_t nstate,
                            psd_chunk_hdr_t **out)
{
    uint8_t kb[PS_CHUNK_KEY_LEN];
    ps_chunk_key(kb, t, c);
    MDB_val k = {sizeof kb, kb}, v = {psd_chunk_bytes(n, nstate), NULL};
    int rc = mdb_put(tx->w, tx->st->dbi, &k, &v, MDB_RESERVE);
    if (rc) return mdb_err(rc);
    populate(tx->st, v.mv_data, v.mv_size);
    *out = v.mv_data;
    return 0;
}

int psd_store_chunk_get(psd_store_t *st, MDB_txn *txn, uint32_t t, uint32_t c,
                        const psd_chunk_hdr_t **out)
{
    uint8_t kb[PS_CHUNK_KEY_LEN];
    ps_chunk_key(kb, t, c);
    MDB_val k = {sizeof kb, kb}, v;
    int rc = mdb_get(txn, st->dbi, &k, &v);
    if (rc == MDB_NOTFOUND) return PS_ENOENT;
    if (rc) return mdb_err(rc);
    const psd_chunk_hdr_t *h = v.mv_data;
    if (v.mv_size < sizeof *h || v.mv_size != psd_chunk_bytes(h->n, h->nstate) ||
        h->format != PSD_CHUNK_FORMAT)
        return PS_ESTORE;
    *out = h;
    return 0;
}

int psd_store_snapshot(psd_store_t *st, MDB_txn **out)
{
    return mdb_err(mdb_txn_begin(st->env, NULL, MDB_RDONLY, out));
}

int psd_store_snapshot_renew(MDB_txn *txn)
{
    return mdb_err(mdb_txn_renew(txn));
}

int psd_store_put_blob(psd_wtxn_t *tx, const char *name, const void *data, size_t len)
{
    char kb[64];
    snprintf(kb, sizeof kb, "M%s", name);
    MDB_val k = {strlen(kb), kb}, v = {len, (void *)data};
    return mdb_err(mdb_put(tx->w, tx->st->dbi, &k, &v, 0));
}

int psd_store_set_blob(psd_store_t *st, const char *name, const void *data, size_t len)
{
    psd_wtxn_t tx;
    int rc = psd_store_begin(st, &tx);
    if (rc == 0 && (rc = psd_store_put_blob(&tx, name, data, len)) != 0)
        psd_store_abort(&tx);
    else if (rc == 0)
        rc = psd_store_commit(&tx);
    return rc;
}

int psd_store_del_blob(psd_wtxn_t *tx, const char *name)
{
    char kb[64];
    snprintf(kb, sizeof kb, "M%s", name);
    MDB_val k = {strlen(kb), kb};
    int rc = mdb_del(tx->w, tx->st->dbi, &k, NULL);
    return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

int psd_store_put_applied(psd_wtxn_t *tx, uint32_t t, uint32_t c, const void *val, size_t len)
{
    uint8_t kb[PS_CHUNK_KEY_LEN];
    ps_chunk_key(kb, t, c);
    kb[0] = 'D';
    MDB_val k = {sizeof kb, kb}, v = {len, (void *)val};
    return mdb_err(mdb_put(tx->w, tx->st->dbi, &k, &v, 0));
}

int psd_store_sync(psd_store_t *st)
{
    return mdb_err(mdb_env_sync(st->env, 1));
}

int psd_store_get_blob(psd_store_t *st, const char *name, void *buf, size_t cap, size_t *len)
{
    char kb[64];
    snprintf(kb, sizeof kb, "M%s", name);
    MDB_txn *txn;
    int rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
    if (rc) return mdb_err(rc);
    MDB_val k = {strlen(kb), kb}, v;
    rc = mdb_get(txn, st->dbi, &k, &v);
    if (rc == 0) {
        *len = v.mv_size;
        if (v.mv_size <= cap) memcpy(buf, v.mv_data, v.mv_size);
        else rc = -EOVERFLOW;
    }
    mdb_txn_abort(txn);
    /* LMDB's own codes (MDB_CORRUPTED, MDB_PAGE_NOTFOUND ...) are negative too: mapped, not
     * passed on (a review: a caller took them for "absent"). */
    return rc == MDB_NOTFOUND ? PS_ENOENT : rc == -EOVERFLOW ? rc : mdb_err(rc);
}

/*
 * Values per optimizer call in psd_store_chunk_update: 8 hash blocks (128 KiB of each array, so
 * a record's span stays in L2 for its hashing). One call per hash block (16 KiB) was ~20% slower
 * (adam, 1 MiB chunks): each restart of the kernel's streams costs more than the extra cache
 * level the hash reads from.
 */
#define APPLY_SPAN PSD_APPLY_SPAN

/* A span's params on their way into a streamed record (psd_store_chunk_update's @p stream). */
static __thread float span_params[APPLY_SPAN] __attribute__((aligned(64)));

bool psd_store_chunk_update(psd_chunk_hdr_t *h, const float *p_in, const float *s_in,
                            const float *g, float scale, const psk_optim_t *o, uint64_t t,
                            const float *(*before)(void *arg, size_t off, size_t len), void *arg,
                            bool stream)
{
    int odd = 0; /* a parameter written is a NaN or an infinity (checked with the CRC) */
    uint32_t n = h->n, ns = h->nstate;
    float *p = psd_chunk_params(h), *s = psd_chunk_state(h);
    if (o->kind == PSK_MEAN && ns && s != s_in) /* it writes no state: carried through */
        memcpy(s, s_in, (size_t)n * ns * sizeof(float));
    XXH3_state_t hs;
    XXH3_64bits_reset(&hs);
    uint32_t crc = 0;
    for (size_t off = 0; off < n; off += APPLY_SPAN) {
        size_t len = n - off < APPLY_SPAN ? n - off : APPLY_SPAN;
        const float *gs = before ? before(arg, off, len) : g + off;
        /* Streamed: the params span is written into this thread's buffer, streamed into the
         * record with its CRC folded in and hashed from the buffer; the state arrays are
         * written in place either way (no other process reads them). */
        float *po = stream ? span_params : p + off;
        psk_optim_apply_strided_cpu(po, ns ? s + off : NULL, p_in + off, ns ? s_in + off : NULL,
                                    gs, scale, len, n, t, o);
        /* Streamed: the CRC folded into the copy; else the params' CRC and hash in one pass
         * (ps_crc32c_xxh3: the streamed copy with both ran slower on one record here). Then
         * the span's hash blocks in the record's block order, while they are in cache. */
        if (!stream) {
            crc = sum_blocks(&hs, crc, po, s, n, ns, off, len, &odd);
            continue;
        }
        crc = ps_crc32c_copy_nt_floats(crc, p + off, po, len * sizeof(float), &odd);
        for (size_t b = off; b < off + len; b += PSD_HASH_BLOCK)
            psd_rechash_block_at(&hs, po + (b - off), s + b, n, ns,
                                 off + len - b < PSD_HASH_BLOCK ? off + len - b : PSD_HASH_BLOCK);
    }
    h->version++;
    h->format = PSD_CHUNK_FORMAT;
    h->crc32c = crc;
    h->hash = XXH3_64bits_digest(&hs);
    return !odd;
}
