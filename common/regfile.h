/* regfile.h: opening a file that must be a regular one (a manifest, a secret, a dataset, a
 * checkpoint's files) without ever blocking on what stands in its place. */
#ifndef PS_REGFILE_H
#define PS_REGFILE_H

#include <sys/stat.h>

/**
 * @brief Open @p path read-only (O_CLOEXEC, plus @p flags such as O_NOFOLLOW) without blocking
 *  (a FIFO there would hang the open until a writer came), and keep it only if it is a regular
 *  file; the descriptor is made blocking again.
 * @param st filled with the file's stat (also when it is not a regular file: what it is).
 * @return the descriptor (the caller closes it); -errno of open or fstat; -EINVAL when it is not
 *  a regular file (@p st says what it is: ps_file_kind).
 */
int ps_open_regular(const char *path, int flags, struct stat *st);

/** @brief What a file is, for messages: "a directory", "a FIFO", "a regular file", "a character
 *  device", ...; a static string. */
const char *ps_file_kind(const struct stat *st);

#endif
