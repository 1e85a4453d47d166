/* dscache.h: a decoded copy of a dataset split in one file, so that only the first worker on a
 * host pays for gunzip; the others read it in (the training split's gunzip: ~0.3 s of CPU per
 * worker; its 47 MB of pixels from the cache: a few tens of ms). */
#ifndef PS_DSCACHE_H
#define PS_DSCACHE_H

#include "fmnist.h"

/**
 * @brief The cache file for the split whose sources are @p ipath and @p lpath, in the
 * directory $PS_DATASET_CACHE (default $TMPDIR, else /tmp); named by a hash of the file format
 * and of both paths, sizes, modification and change times, inodes and devices, so a changed or
 * replaced source gets a new file, and another version of the format another name.
 * @return 0 with the path in @p out; -1 when caching is off (PS_DATASET_CACHE=off), a source
 *         cannot be stat'ed or the path does not fit.
 */
int ps_dscache_path(const char *ipath, const char *lpath, char *out, size_t len);

/**
 * @brief Remove the cache file of the same sources in the format before session 56 (floats,
 * PSDSC002, named without the format), if it is there, a regular file and this user's: ~220 MB
 * for Fashion-MNIST that no newer psworker reads (a psworker of that version would write it
 * again). Best effort.
 */
void ps_dscache_drop_old(const char *ipath, const char *lpath);

/**
 * @brief Read the cache file at @p path into @p d if it is whole and intact (magic, sizes, and
 * the CRC-32C of its contents, checked on every open), and trusted: a regular file (not a
 * link; a FIFO is not waited on) of this user that no one else may write, whose labels are
 * below the dataset's classes.
 * @return 0 with d->pixels (ps_buffer_alloc) and d->labels (malloc) owned by @p d (release
 *         with ps_dataset_free), or -1 (a miss: @p d untouched).
 * @note The copy is private on purpose: training gathers random rows every step, and page-cache
 *       pages of a shared mapping were evicted and read again on a busy host (8% fewer samples/s
 *       in the demo than from private memory). It is read (pread, 4 MiB at a time, each
 *       block's CRC taken right after it arrives) into 2 MiB pages (ps_buffer_alloc): on the
 *       development VM a 4 KiB page fault costs ~10-15 us, and the training split, when it was
 *       188 MB of floats, took ~0.6-0.75 s through 46 000 of them (mapped, checked, copied
 *       into malloc'd memory), 0.32-0.34 s on 2 MiB pages in a fresh process. Since session
 *       56 the cache holds the pixels' bytes (47 MB), standardized as rows are gathered.
 */
int ps_dscache_load(ps_dataset_t *d, const char *path);

/**
 * @brief Write @p d to @p path (a temporary file "<path>.tmp.<pid>" renamed into place, so
 * readers never see half of it). Best effort: on failure nothing is left behind and 0 is not
 * returned. A temporary file of this pid (a killed writer's: a container's pid 1) is replaced;
 * those of processes that are gone, untouched for 10 minutes, are removed.
 * @return 0 or -1.
 */
int ps_dscache_save(const ps_dataset_t *d, const char *path);

#endif
