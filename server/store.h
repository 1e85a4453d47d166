/* store.h: a shard's state in one LMDB environment under its data_dir.
 *
 * Keys (one unnamed database):
 *   "M" name          metadata: cluster, chunk_bytes, optimizer
 *   "T" be32(id)      a tensor's declaration (ps_decl_t)
 *   "C" be32(t) be32(c)  a chunk record: psd_chunk_hdr_t, params[n], state[nstate * n]
 *
 * Chunk records are format 3 (PSD_CHUNK_FORMAT): the header carries the CRC-32C of the
 * parameters (what a raw pull sends) and the XXH3-64 of parameters and state in blocks
 * (rechash.h), both written in the transaction that writes the record (by the apply pass
 * itself, or psd_store_chunk_seal()). "Mrecord_format" holds the format; a store with chunk
 * records but without that key is format 1 (16-byte header, no hashes), and format 2 hashed
 * params then state in one run: psd_store_open() upgrades either in place, in one transaction.
 *
 * The environment is opened WRITEMAP | NOSYNC | NOTLS: every committed
 * transaction survives a process crash (PLATFORM-NOTES.md section 4); power-loss
 * safety is a later setting. An update never writes through a pointer LMDB
 * handed out for reading: a read transaction supplies the old record and
 * MDB_RESERVE the new one, and the kernel writes old -> new. A data_dir is
 * held by one psd at a time through an flock()ed psd.lock file. */
#ifndef PSD_STORE_H
#define PSD_STORE_H

#include <lmdb.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chunkrec.h"
#include "rechash.h"
#include "optim.h"
#include "wire.h"

#define PSD_CHUNK_FORMAT PS_CHUNK_FORMAT

typedef ps_chunk_hdr_t psd_chunk_hdr_t; /* chunkrec.h: shared with libps's same-host reader */

/** Parameters of a record (follow the header). */
static inline float *psd_chunk_params(psd_chunk_hdr_t *h) { return (float *)(h + 1); }
/** Optimizer state of a record (follows the parameters). */
static inline float *psd_chunk_state(psd_chunk_hdr_t *h) { return (float *)(h + 1) + h->n; }
static inline size_t psd_chunk_bytes(uint32_t n, uint32_t nstate)
{
    return ps_chunk_rec_bytes(n, nstate);
}

typedef struct {
    MDB_env *env;
    MDB_dbi dbi;
    int lockfd;
    MDB_txn *rcache;  /* the write job's read snapshot, reset between jobs (no malloc) */
    size_t psize;     /* LMDB's page size */
    uintptr_t populated; /* end of the map's pages this process has populated (reserve) */
    int fd;           /* the data file's, from LMDB (psd_store_ahead) */
    uint64_t backed;  /* bytes of it allocated from its start (psd_store_ahead) */
    char dir[1024];
} psd_store_t;

/* Bytes psd_store_begin() has allocated on the disk past the store's last page. */
#define PSD_STORE_AHEAD ((uint64_t)64 << 20)

/**
 * @brief Allocate the data file's blocks on its disk up to @p bytes past the store's last page
 *  (at most the map's size), so that the write transactions after it find them: the map is
 *  written in place (MDB_WRITEMAP), and a page the filesystem cannot back faults (SIGBUS: psd
 *  died, and again at every start while the disk stayed full) where a write would fail.
 *  psd_store_begin() calls it with PSD_STORE_AHEAD; a transaction that may write more (a
 *  tensor's creation, a restore) calls it first with what it writes.
 * @return 0 (also where the filesystem cannot allocate ahead: nothing then), PS_ENOSPC.
 */
int psd_store_ahead(psd_store_t *st, uint64_t bytes);

/** The reader that pins the most of the store: its process, and how many commits old its
 *  snapshot is (psd_store_oldest_reader). */
typedef struct {
    int pid;        /* 0: no reader holds a snapshot */
    uint64_t txnid; /* its snapshot's transaction */
    uint64_t lag;   /* commits since its snapshot's (0: the latest) */
} psd_store_reader_t;

/**
 * @brief The reader (of any process: psd's own pull snapshots, workers' direct reads) whose
 *  snapshot is the oldest: LMDB cannot reuse a page freed after it, so a reader that stopped
 *  (SIGSTOP, a debugger, a frozen container) inside its read makes every commit since take new
 *  pages, and the map fills (PS_ESTOREFULL) though the data would fit.
 * @param[out] out filled (pid 0 when no reader holds one).
 * @return 0, or PS_ESTORE when LMDB cannot list its readers. Any thread (LMDB's reader table
 *  is shared memory; what it reads may be a moment old).
 */
int psd_store_oldest_reader(psd_store_t *st, psd_store_reader_t *out);

/**
 * @brief The map's size and its high-water mark: the bytes up to the highest page any commit
 *  used. Pages freed below it are reused; the mark never goes down (a reader that held an old
 *  snapshot while commits went on leaves it high), and an update that finds no free run of
 *  pages once it reaches the size fails (PS_ESTOREFULL).
 * @return 0 with *@p used and *@p size, or PS_ESTORE. Any thread.
 */
int psd_store_map_use(psd_store_t *st, uint64_t *used, uint64_t *size);

/** A write transaction plus the read snapshot that supplies old records. */
typedef struct {
    psd_store_t *st;
    MDB_txn *w;
    MDB_txn *r;
} psd_wtxn_t;

/**
 * @brief Open (creating if needed) the store in @p dir and lock it for this process.
 * @param meta_cluster, meta_chunk_bytes  identity checked against a store made before:
 *        a data_dir of another cluster or chunk size is refused.
 * @param[out] err one line naming the directory and the problem.
 * @return 0, PS_EBUSY (another psd holds it), PS_ECONFIG (identity mismatch), PS_ESTORE, -errno.
 * @note On failure nothing is left open; on success release with psd_store_close.
 */
int psd_store_open(psd_store_t *st, const char *dir, uint64_t map_mb, const char *meta_cluster,
                   uint64_t meta_chunk_bytes, uint32_t nstate, char *err, size_t errlen);

/**
 * @brief Whether a running psd holds the store in @p dir (its psd.lock locked), asked without
 *  making or changing anything there: psd asks it before it tries its port, so that a second
 *  psd on the same data_dir is told that, not that the port is taken.
 * @return 0 (free, or no store there), or PS_EBUSY with @p err as psd_store_open says it.
 */
int psd_store_in_use(const char *dir, char *err, size_t errlen);

/**
 * @brief Check a named identity string of the store against @p value, or record it when the
 *  store has none yet (a new store, or one made before the name was checked): e.g. what the
 *  optimizer's state holds, so a store made with momentum is not opened as adagrad's. A store
 *  made before psd checked @p name takes whatever the first open records.
 * @param name  at most 62 bytes (the key is "M" + name); @p value any string, compared byte
 *              for byte, so a value once recorded must never be reworded.
 * @param[out] err one line naming the directory, the name and the stored value, or the LMDB
 *             error.
 * @return 0, PS_ECONFIG (the store holds another value), or the LMDB error as mdb_err() maps
 *         it (-errno for system errors, PS_ESTORE for LMDB's own).
 * @note Runs its own write transaction; @p name and @p value are only read during the call.
 */
int psd_store_identity(psd_store_t *st, const char *name, const char *value, char *err,
                       size_t errlen);
void psd_store_close(psd_store_t *st);

/** @brief mkdir -p @p dir (mode 0700 for what it creates; ps_mkdir_durable: each new
 *  directory's parent is fsynced). @return 0 or -errno (-ENOTDIR: a file is in the way). */
int psd_store_mkdir_p(const char *dir);

/* A stored tensor record under key id @p key_id (as read: unchecked); nonzero stops the walk
 * and psd_store_load returns it. */
typedef int (*psd_store_tensor_cb)(void *arg, uint32_t key_id, const ps_decl_t *d);
/* A stored chunk record (its size checked against its header's n and nstate); nonzero stops
 * the walk and psd_store_load returns it. */
typedef int (*psd_store_chunk_cb)(void *arg, uint32_t t, uint32_t c, const psd_chunk_hdr_t *h);
typedef void (*psd_store_applied_cb)(void *arg, uint32_t t, uint32_t c, const void *val,
                                     size_t len);

/** @brief Walk every stored tensor, then every chunk header and every chunk's applied-push
 *  record (psd_store_put_applied), in key order (startup). @p val is valid during the call.
 *  @return 0, PS_ESTORE for a record of the wrong size, or what @p on_tensor or @p on_chunk
 *  returned. */
int psd_store_load(psd_store_t *st, psd_store_tensor_cb on_tensor, psd_store_chunk_cb on_chunk,
                   psd_store_applied_cb on_applied, void *arg);

/**
 * @brief Fill the header's crc32c and hash from the record's bytes (params and state as they
 *  are now). Call it after writing the record's data, before the transaction commits.
 * @note Reads n * (1 + nstate) * 4 bytes; runs on the job's thread.
 */
void psd_store_chunk_seal(psd_chunk_hdr_t *h);

/** Values per span of psd_store_chunk_update (8 hash blocks: 128 KiB of each array). */
#define PSD_APPLY_SPAN (8 * PSD_HASH_BLOCK)

/**
 * @brief One optimizer step, the update's 1-based number @p t (psk_optim_apply_cpu's: Adam's
 * bias correction, Adagrad's lr_decay; the chunk's updates, not its steps), on the record @p h
 * (old values @p p_in, @p s_in, e.g. the previous record) in a single pass of spans of
 * PSD_APPLY_SPAN values: the span's gradient is @p g + off,
 * or, with @p before, what before(arg, off, len) returns (it prepares the span's len values,
 * e.g. sums pushes into a buffer that stays in cache, and may ignore @p g); the optimizer writes
 * the span, and the span is folded into the CRC-32C and XXH3-64 right away, while it is in
 * cache. Ends like psd_store_chunk_seal(): version + 1, format, crc32c and hash set.
 * With @p stream, each span's params are written to a buffer of this thread's, hashed there and
 * then copied into the record with streaming stores (ps_crc32c_copy_nt): for a record that a
 * worker on another CPU reads next (direct pulls, pull replies copied by cma), which then reads
 * memory, and whose pages that worker read before are not first taken back from its cache (on
 * the development VM 1 MiB sgd updates took ~110 us in push-only steps and ~250 us when a
 * worker read each record; session 69: a 1 MiB mean update in a UCX round 129 -> 90 us).
 * Same bytes, CRC and hash either way.
 * @return whether every parameter written is finite (each span checked while it is in cache):
 *  false when a gradient held a NaN or an infinity (or the update overflowed); the record is
 *  written and sealed either way; @p p_in / @p s_in, when they are another record's (not an
 *  update in place), are untouched, so the caller may update it again without that gradient.
 * @note @p h must be the writable record (MDB_RESERVE); nothing is allocated. What @p before
 *  returns must stay valid until its next call or the end of this one.
 */
bool psd_store_chunk_update(psd_chunk_hdr_t *h, const float *p_in, const float *s_in,
                            const float *g, float scale, const psk_optim_t *o, uint64_t t,
                            const float *(*before)(void *arg, size_t off, size_t len), void *arg,
                            bool stream);

/** @brief XXH3-64 of a record's params and state as stored now (what seal writes into hash). */
uint64_t psd_store_chunk_hash(const psd_chunk_hdr_t *h);

/** @brief CRC-32C of a record's params as stored now (what seal writes into crc32c, and what
 *  pulls are checked against). */
uint32_t psd_store_params_crc(const psd_chunk_hdr_t *h);

/** @brief psd_store_params_crc(@p h) into *@p crc and psd_store_chunk_hash(@p h) into *@p hash
 *  in one pass over the params (ps_crc32c_xxh3): what seal writes, and what a check of a stored
 *  record (a checkpoint's copy, a restore) compares with its header. */
void psd_store_chunk_sums(const psd_chunk_hdr_t *h, uint32_t *crc, uint64_t *hash);

/* What psd's refusals of a damaged store tell the operator to do. */
#define PSD_STORE_DAMAGED_REMEDY \
    "the data_dir is damaged: restore a checkpoint into empty data_dirs, psd --restore"

typedef int (*psd_store_record_cb)(void *arg, uint32_t t, uint32_t c, const void *val,
                                   size_t len);

/**
 * @brief Call @p cb for every chunk record in @p txn (a read snapshot), in key order, with the
 *  raw record (not yet validated: @p len may not fit its header). Stops at the first nonzero
 *  return of @p cb and returns it.
 * @note @p val is read-only and valid until @p txn ends. Any thread (the env is MDB_NOTLS).
 */
int psd_store_chunks_each(psd_store_t *st, MDB_txn *txn, psd_store_record_cb cb, void *arg);

/** @brief Begin a write transaction and its read snapshot (one writer at a time). */
int psd_store_begin(psd_store_t *st, psd_wtxn_t *tx);
/** @brief Commit; both transactions end whatever the result. */
int psd_store_commit(psd_wtxn_t *tx);
void psd_store_abort(psd_wtxn_t *tx);

/** @brief Store a tensor declaration in @p tx. */
int psd_store_put_tensor(psd_wtxn_t *tx, const ps_decl_t *d);

/** @brief Delete tensor @p t's declaration and the records of its chunks 0..@p nchunks-1 held
 *  here (parameters and state, 'C'; applied pushes, 'D') in @p tx; absent ones are no error.
 *  @return 0 or PS_ESTORE / PS_ESTOREFULL. */
int psd_store_del_tensor(psd_wtxn_t *tx, uint32_t t, uint32_t nchunks);

/**
 * @brief Reserve a new record for chunk (t, c) in @p tx and return where to write it.
 * @note Write every byte of *out. A record for which psd_store_record_stable() holds lives on
 *       overflow pages of its own and *out stays valid until the transaction ends, also across
 *       later puts; a smaller one sits in a leaf page that a later put in @p tx may reorganise,
 *       so it must be written before the next put.
 */
int psd_store_chunk_reserve(psd_wtxn_t *tx, uint32_t t, uint32_t c, uint32_t n, uint32_t nstate,
                            psd_chunk_hdr_t **out);

/** @brief True if a record of @p n params and @p nstate state arrays is stored on overflow pages
 *  (at least one page long), so its reserved space does not move within its transaction. */
static inline bool psd_store_record_stable(const psd_store_t *st, uint32_t n, uint32_t nstate)
{
    return psd_chunk_bytes(n, nstate) >= st->psize;
}

/** @brief A lower bound of the map bytes a record of @p n params and @p nstate state arrays
 *  takes: whole overflow pages (with their 16-byte header) for one of half a page or more, which
 *  LMDB keeps off the leaf pages; its own bytes for a smaller one (leaf pages: keys and slack
 *  not counted). */
static inline uint64_t psd_store_record_footprint(const psd_store_t *st, uint32_t n,
                                                  uint32_t nstate)
{
    uint64_t b = psd_chunk_bytes(n, nstate);
    return b * 2 < st->psize ? b : (b + 16 + st->psize - 1) / st->psize * st->psize;
}

/**
 * @brief The committed record of chunk (t, c) as of @p txn (a read snapshot).
 * @note Read-only; valid until @p txn ends. PS_ENOENT if absent, PS_ESTORE if malformed.
 */
int psd_store_chunk_get(psd_store_t *st, MDB_txn *txn, uint32_t t, uint32_t c,
                        const psd_chunk_hdr_t **out);

/** @brief Begin a read-only snapshot (for pull replies); end it with mdb_txn_abort, or
 *  mdb_txn_reset it and later psd_store_snapshot_renew it to skip LMDB's allocation. */
int psd_store_snapshot(psd_store_t *st, MDB_txn **out);
int psd_store_snapshot_renew(MDB_txn *txn);

/** @brief Store @p len bytes under metadata key "M"@p name in @p tx (copied). */
int psd_store_put_blob(psd_wtxn_t *tx, const char *name, const void *data, size_t len);
/** @brief Store @p len bytes under metadata key "M"@p name in a write transaction of its own,
 *  committed (copied). The caller holds the store's one writer: a slot work, or no store job
 *  running. @return 0 or PS_E*. */
int psd_store_set_blob(psd_store_t *st, const char *name, const void *data, size_t len);
/** @brief Delete metadata key "M"@p name in @p tx (0 also when there was none). */
int psd_store_del_blob(psd_wtxn_t *tx, const char *name);

/** @brief Store chunk (@p t, @p c)'s record of the pushes last applied to it (asp and ssp:
 *  server.h's psd_done_t per rank, so that a restarted shard still knows a resend; bsp: its
 *  apply members where they changed, shard_internal.h's psd_summed_rec_t), @p len
 *  bytes copied from @p val, in @p tx. Key 'D' be32(t) be32(c): chunk walks skip it.
 *  @return 0 or PS_ESTOREFULL / PS_ESTORE. */
int psd_store_put_applied(psd_wtxn_t *tx, uint32_t t, uint32_t c, const void *val, size_t len);
/** @brief Write everything committed to @p st to disk (the store is NOSYNC: psd_store_close
 *  and sync.c's periodic job do otherwise). Blocks: not on psd's loop thread while serving.
 *  @return 0 or PS_E* (-errno for an I/O error). */
int psd_store_sync(psd_store_t *st);

/** @brief Copy the committed blob @p name into @p buf (at most @p cap bytes); *len = its size.
 *  @return 0, PS_ENOENT (never stored), -EOVERFLOW (larger than cap: *len says how large),
 *  PS_ESTORE (the store could not be read), PS_E*. */
int psd_store_get_blob(psd_store_t *st, const char *name, void *buf, size_t cap, size_t *len);

#endif
