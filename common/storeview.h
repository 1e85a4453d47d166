/* storeview.h: a read-only view of a psd shard's LMDB store from another process on the same
 * host, for libps's direct pulls.
 *
 * A worker on the host of a shard reads the parameters it pulls straight from the shard's
 * committed records: it opens the shard's environment MDB_RDONLY and, per pull, takes a read
 * transaction (LMDB's multi-process readers: a snapshot the writer never overwrites), copies the
 * chunk's parameters out with their CRC-32C folded in, and ends the transaction. No transport
 * copy, no pinning of the shard's pages, no rendezvous. psd still answers every pull (with the
 * version to read), so BSP waits and membership stay where they are; a view that fails a check
 * is closed and the worker pulls over the transport again (client.c). */
#ifndef PS_STOREVIEW_H
#define PS_STOREVIEW_H

#include <lmdb.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* The process's one LMDB environment of a store, shared by its views (storeview.c). */
typedef struct ps_storeenv_s ps_storeenv_t;

typedef struct {
    ps_storeenv_t *env; /* shared: LMDB allows one environment of a store per process */
    MDB_txn *txn;       /* this view's own (a reader slot of its own), reset between reads,
                           renewed by the next one */
    uint64_t id;        /* ps_storeview_file_id of the data file it maps */
} ps_storeview_t;

/**
 * @brief The identity of the LMDB data file open on @p fd: its device and inode, this host's
 *  boot id and this process's pid namespace, mixed into one value (0 if fstat fails). psd sends
 *  it with its store's path; a view opens only a store with the same identity, so a same-named
 *  directory on another host (a shared filesystem included: LMDB's locks and map do not work
 *  across hosts), a replaced file, or a process in another pid namespace (LMDB tells dead
 *  readers by pid) never passes.
 */
uint64_t ps_storeview_file_id(int fd);

/** @brief The same identity from a stat() of the file (0 never: 1 stands in). */
uint64_t ps_storeview_stat_id(const struct stat *st);

/** @brief This host's boot and this process's pid namespace, hashed: equal for two processes
 *  exactly when they may share a store or a push area (workers send it in their hello, and a
 *  shard offers both only to a worker whose value is its own). 0 when this host's boot id
 *  cannot be read (no /proc): such a process is offered, and offers, neither. */
uint64_t ps_storeview_host_id(void);

/**
 * @brief Open the store in @p dir read-only, if its data file's identity is @p want_id (checked
 *  before LMDB touches the directory) and the directory is not on a read-only mount here (LMDB
 *  would read there without a reader slot, unprotected from page reuse).
 * @param[out] err one line naming the directory and the problem.
 * @return 0, PS_ESTALE (another store, host or pid namespace, or a read-only mount), PS_ESTORE
 *  or -errno (cannot open).
 * @note On failure nothing is left open; on success release with ps_storeview_close. The view
 *  is used by one thread at a time (any thread: the environment is MDB_NOTLS). Views of one
 *  store in one process (two clients) share its environment, opened once and closed with the
 *  last of them: LMDB forbids opening one twice in a process, and closing the second copy
 *  cleared every reader slot of the process and dropped its locks, so the other view's reads
 *  failed, or went unprotected from page reuse. Thread-safe.
 */
int ps_storeview_open(ps_storeview_t *v, const char *dir, uint64_t want_id, char *err,
                      size_t errlen);

/**
 * @brief Copy the parameters of chunk (@p t, @p c), which must hold @p n of them at a version of
 *  at least @p min_version, into @p dst, and check them against the record's CRC-32C.
 * @param[out] version the record's version; @param[out] crc its CRC-32C (either may be NULL).
 * @return 0; PS_ENOENT (no such record); PS_ESTALE (older than @p min_version); PS_ESTORE (the
 *  record is malformed, of another length, or LMDB failed); PS_ECRC (the bytes copied do not
 *  match the record's CRC). On an error @p dst may hold part of a copy.
 * @note Takes and ends one read transaction; allocates nothing.
 */
int ps_storeview_read(ps_storeview_t *v, uint32_t t, uint32_t c, uint64_t min_version,
                      float *dst, uint32_t n, uint64_t *version, uint32_t *crc);

/** @brief Close the view (a zeroed or already closed one too). */
void ps_storeview_close(ps_storeview_t *v);

#endif
