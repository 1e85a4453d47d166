/* ckpt_meta.h: reading a checkpoint's files (DIR/shard-J/meta.json and the LMDB environment
 * beside it), shared by psd --restore (restore.c) and psctl (psctl_checkpoint.c). Plain
 * functions on files; no psd state. meta.json is psd's own flat JSON (see checkpoint.c). */
#ifndef PSD_CKPT_META_H
#define PSD_CKPT_META_H

#include <lmdb.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t by value */
#endif
#include <xxhash.h>

#include "manifest.h"

#define PSD_CKPT_META "meta.json"

/** @brief DIR/shard-@p j/meta.json as a NUL-terminated string (malloc'd: the caller frees it),
 *  or NULL with errno set (EINVAL: not a regular file, or over 1 GiB; never blocks on a FIFO). */
char *psd_ckpt_meta_read(const char *dir, uint32_t j);

/** @brief Whether shard-@p k's meta.json @p jk belongs to the checkpoint of shard-0's @p j0
 *  (@p k 0: @p jk == @p j0, its own shard number checked): it names itself shard @p k, the same
 *  number of shards, cluster and checkpoint id, the same tensor table, and under bsp (shard
 *  0's "consistency") the same step unless it holds no records.
 *  @return 0, or -1 with @p err saying which of them differs. */
int psd_ckpt_meta_agree(const char *j0, const char *jk, uint32_t k, char *err, size_t errlen);

/** @brief Whether a checkpoint whose shard-0 meta.json is @p j0 can be restored under manifest
 *  @p m: its cluster, chunk_bytes, the optimizer state it keeps (count and kind) and its
 *  consistency's kind (bsp's steps, or asp's and ssp's batches). psd --restore and psctl
 *  restore ask the same. @return 0, or PS_ECONFIG with @p why (@p len bytes) naming the first
 *  difference. */
int psd_ckpt_meta_fits(const char *j0, const ps_manifest_t *m, char *why, size_t len);

/* The file psctl leaves in a checkpoint's directory DIR when it gave that checkpoint up while
 * a shard did not answer its cancel (MSG_CKPT_CANCEL: stopped, cut off, or a psd that does not
 * know it): DIR/cancelled-ID, ID the checkpoint's id as 16 hex digits, a line of text inside.
 * A shard armed with that id that finds it drops the checkpoint instead of copying (a shard
 * stopped during psctl's try, once it resumes), and a new arm replaces such a checkpoint. */
#define PSD_CKPT_CANCELLED "cancelled-"

/** @brief DIR/cancelled-ID of checkpoint @p id in @p dir, into @p out.
 *  @return 0, or -1 when it does not fit in @p cap. */
int psd_ckpt_cancel_mark(char *out, size_t cap, const char *dir, uint64_t id);

/** @brief The value of top-level "@p key" in @p json (a number, or a string's body) into
 *  @p out. @return 0, or -1 when absent or longer than @p cap - 1. */
int psd_ckpt_meta_field(const char *json, const char *key, char *out, size_t cap);

/** @brief psd_ckpt_meta_field() as an unsigned number; UINT64_MAX when absent. */
uint64_t psd_ckpt_meta_u64(const char *json, const char *key);

/** @brief The checkpoint's number of shards, "nshards" of a meta.json @p json: 1 to
 *  PS_MAX_SERVERS, else 0 (absent, malformed or out of range: not a checkpoint psd took). */
uint32_t psd_ckpt_meta_nshards(const char *json);

/** A read-only view of DIR/shard-J's environment. */
typedef struct {
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    int guarded; /* holds the SIGBUS guard (psd_ckpt_src_open) */
} psd_ckpt_src_t;

/**
 * @brief Open DIR/shard-@p j read-only (MDB_RDONLY | MDB_NOLOCK: nothing is written there)
 *  with one read transaction.
 *  While it is open, a read past the end of a data file cut short (SIGBUS) ends the process
 *  with exit 1 and "DIR/shard-J/data.mdb: a page lies past the end of the file ..." on stderr
 *  instead of a crash (a process-wide SIGBUS handler, the previous one back when the last
 *  source closes).
 *  data.mdb is checked first (a regular file, with LMDB's header): LMDB trusts what it reads
 *  there (a FIFO hung its open, a page size of 0 divided by zero).
 * @return 0, or an LMDB code, an errno or a PSD_CKPT_E* code (psd_ckpt_src_strerror); on
 *  failure nothing is left open.
 * @note Release with psd_ckpt_src_close(); values read stay valid until then.
 */
int psd_ckpt_src_open(psd_ckpt_src_t *s, const char *dir, uint32_t j, uint64_t map_mb);

/* psd_ckpt_src_open's own refusals of a data.mdb (outside LMDB's codes, -30799..-30780). */
#define PSD_CKPT_ENOTREG (-30700) /* not a regular file (a FIFO, a directory, a device) */
#define PSD_CKPT_EEMPTY (-30701)  /* an empty file */
#define PSD_CKPT_EHEADER (-30702) /* not an LMDB 0.9 environment's header */

/** @brief What psd_ckpt_src_open()'s (or LMDB's) code @p rc says; a static string. */
const char *psd_ckpt_src_strerror(int rc);
/** @brief Close what psd_ckpt_src_open() opened; a zeroed @p s is a no-op. */
void psd_ckpt_src_close(psd_ckpt_src_t *s);

/** Where a fault reading a source returns on this thread instead of ending the process: a
 *  serving psd (repair) sets it around its reads (sigsetjmp(buf, 1); NULL again after them),
 *  so that one checkpoint copy cut short does not take the shard down. Taken (set to NULL) by
 *  the fault. NULL: the fault ends the process as psd_ckpt_src_open() says. */
extern __thread sigjmp_buf *psd_ckpt_bus_jmp;

/** Files psd_ckpt_bus_unlink() may name. */
#define PSD_CKPT_BUS_UNLINK 4
/** @brief Have a fault that ends the process (no psd_ckpt_bus_jmp) first remove @p n (at most
 *  PSD_CKPT_BUS_UNLINK) @p files of @p dir: a restore's new store, so that the same command
 *  can run again (its normal failures remove them too). @p dir NULL: none any more. */
void psd_ckpt_bus_unlink(const char *dir, const char *const *files, int n);
/** @brief Remove the files psd_ckpt_bus_unlink() named now, as such a fault would
 *  (async-signal-safe: psd's signal handler before it serves). @return how many were named
 *  (0: none, nothing removed). */
int psd_ckpt_bus_unlink_now(void);

/** The XXH3-64 over a checkpoint copy's records other than chunks ('C' keys): the tensor
 *  table, the coordinator's state, the chunks' applied records... in key order, each as its
 *  key's length and bytes, then its value's length and bytes (meta.json "others_xxh3"). */
typedef struct {
    XXH3_state_t st;
} psd_ckpt_others_t;
/** @brief Start @p o. */
void psd_ckpt_others_init(psd_ckpt_others_t *o);
/** @brief Add record (@p k, @p v) to @p o when it is not a chunk's ('C' + 8 bytes). */
void psd_ckpt_others_add(psd_ckpt_others_t *o, const MDB_val *k, const MDB_val *v);
/** @brief The hash of what @p o was given. */
uint64_t psd_ckpt_others_digest(const psd_ckpt_others_t *o);
/** @brief Whether @p o's hash is the one meta.json @p json records ("others_xxh3"; a meta.json
 *  from before it has none: true). The hash, as 16 hex digits, into @p now. */
bool psd_ckpt_others_match(const psd_ckpt_others_t *o, const char *json, char now[17]);

/** @brief The big-endian u32 at @p p (chunk and tensor keys). */
static inline uint32_t psd_ckpt_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

#endif
