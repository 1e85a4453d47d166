/* durable.h: putting a finished file in place so that a crash of the OS or a power loss keeps
 * either the old state or the whole new file. */
#ifndef PS_DURABLE_H
#define PS_DURABLE_H

/**
 * @brief Rename @p tmp (written and fsynced by the caller) to @p path, then fsync the directory
 *  that holds @p path, so that the rename itself reaches the disk before anything that trusts
 *  it (a later prune of older files, a restart).
 * @return 0, or -errno of the rename or of the directory's open or fsync (the rename may then
 *  have happened but not be durable).
 * @note Both paths are only read; they must name the same directory.
 */
int ps_rename_durable(const char *tmp, const char *path);

/** @brief fsync directory @p dir (its entries: a rename, an unlink, a new file in it).
 *  @return 0 or -errno. */
int ps_fsync_dir(const char *dir);

/**
 * @brief mkdir -p @p dir (mode 0700), fsyncing the parent of every directory it creates, so
 *  that a new path (a checkpoint's directories, a data_dir) survives a power loss along with
 *  the files later made durable in it.
 * @return 0 (also when all of it was there), or -errno (-ENAMETOOLONG past PATH_MAX).
 * @note @p dir is only read.
 */
int ps_mkdir_durable(const char *dir);

/**
 * @brief Check @p path as the name of an output file that a write-then-rename replaces (psctl
 *  export --out, psworker --params-out): absent, or a regular file. A symlink to a regular file
 *  resolves to that file (the link stays, the file it names is replaced). Anything else (a
 *  device, a FIFO, a socket, a directory, a symlink to one or to nothing) is refused: a rename
 *  replaces the node itself (as root, `--out /dev/null` made /dev/null a regular file). So is
 *  a path in an LMDB store's directory (one holding data.mdb: a psd data_dir, a checkpoint's
 *  part) or named data.mdb or lock.mdb, and one whose directory is not there (or not one).
 * @param out receives the path to write beside and rename to (@p path, or the link's target).
 * @return 0, or -errno (-EEXIST: a node that is not a regular file) with @p err saying what
 *  is wrong, naming @p path.
 * @note @p path is only read; @p out and @p err are the caller's buffers.
 */
int ps_out_file_check(const char *path, char *out, size_t outcap, char *err, size_t errlen);

/**
 * @brief Check that ps_mkdir_durable(@p dir) could make @p dir here, or that it is there: the
 *  nearest of it and its ancestors that exists is a directory this process may write in (one
 *  that exists must also be searchable). Nothing is made.
 * @return 0, or -errno (-ENOTDIR: @p dir or an ancestor is not a directory; -EACCES: the
 *  nearest existing one cannot be written in) with @p err saying which path and why.
 * @note @p dir is only read; @p err is the caller's buffer.
 */
int ps_dir_makeable(const char *dir, char *err, size_t errlen);

#endif
