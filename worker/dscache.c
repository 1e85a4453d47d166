/* dscache.c: see dscache.h. File layout: a 4096-byte header, then n*dim pixel bytes (the IDX
 * file's, row after row), then n label bytes. */
#include "envflag.h"
#include "dscache.h"

#include <dirent.h>
#include <errno.h>
#include <strings.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "fmnist.h"
#include "ps/ps_client.h"
#include "regfile.h"

#define READ_BLOCK ((size_t)4 << 20) /* bytes per read: in cache when its CRC is taken */

#define DSC_MAGIC "PSDSC003" /* 002: the header holds its name's key; 003: pixels as bytes */
#define DSC_HDR 4096

typedef struct {
    char magic[8];
    uint32_t n, dim;
    uint64_t bytes; /* payload after the header */
    uint32_t crc;   /* CRC-32C of the payload */
    uint32_t pad;
    uint64_t key;   /* the sources' key its name was made with (ps_dscache_path) */
} dsc_hdr_t;

/* The key in a cache file's name ("psd-dataset-<16 hex digits>.bin"), or 0. A file holds the
 * key it was written for: one of another split or dataset renamed to this name (by mistake, or
 * by another user in a shared directory without the sticky bit) is a miss, not trained on
 * (found by a review: the test split was trained on silently). */
static uint64_t key_of(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    unsigned long long k = 0;
    int used = 0;
    if (sscanf(b, "psd-dataset-%16llx.bin%n", &k, &used) != 1 || b[used] != '\0') return 0;
    return (uint64_t)k;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The cache file's path for sources @p ipath and @p lpath in the cache directory; @p salted:
 * 2 with the format and this user in the name (this version's), 1 with the format only
 * (sessions 56-70), 0 neither (PSDSC002's, before session 56). The user: another user's copy
 * under the same name is never read (it is not this user's), and its writer's rename over it
 * failed, so a second user decompressed and wrote ~55 MB at every start (a review, session 71).
 * @return 0, or -1 (off, a source not stat'ed, too long). */
static int cache_path(const char *ipath, const char *lpath, int salted, char *out, size_t len)
{
    const char *dir = getenv("PS_DATASET_CACHE");
    if (ps_env_word_off(dir)) return -1; /* "0" was a directory named 0 (an input probe) */
    /* "1", "on", "true", "yes": the default place, as other PS_* switches read them (they
     * were a relative directory of that name; a review, session 71). */
    static const char *const on[] = {"1", "on", "true", "yes"};
    for (size_t i = 0; dir && i < sizeof on / sizeof on[0]; i++)
        if (strcasecmp(dir, on[i]) == 0) dir = NULL;
    if (dir == NULL || *dir == '\0') dir = getenv("TMPDIR");
    if (dir == NULL || *dir == '\0') dir = "/tmp";
    uint64_t h = 0xcbf29ce484222325ull;
    /* The format is in the name: a psd of another version on the same host writes its own
     * file instead of replacing this one at every start. */
    if (salted) h = fnv(h, DSC_MAGIC, sizeof DSC_MAGIC);
    if (salted >= 2) {
        uint64_t uid = (uint64_t)geteuid();
        h = fnv(h, &uid, sizeof uid);
    }
    const char *src[2] = {ipath, lpath};
    for (int i = 0; i < 2; i++) {
        struct stat st;
        if (stat(src[i], &st) != 0) return -1;
        /* The change time and the inode too: a source replaced by one of the same size and
         * modification time (cp -p, rsync -a, images with mtimes set to 0) got the old name,
         * and its stale decoded copy was trained on. */
        int64_t meta[7] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec,
                           (int64_t)st.st_mtim.tv_nsec, (int64_t)st.st_ctim.tv_sec,
                           (int64_t)st.st_ctim.tv_nsec, (int64_t)st.st_ino,
                           (int64_t)st.st_dev};
        h = fnv(h, src[i], strlen(src[i]) + 1);
        h = fnv(h, meta, sizeof meta);
    }
    int n = snprintf(out, len, "%s/psd-dataset-%016llx.bin", dir, (unsigned long long)h);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

int ps_dscache_path(const char *ipath, const char *lpath, char *out, size_t len)
{
    return cache_path(ipath, lpath, 2, out, len);
}

void ps_dscache_drop_old(const char *ipath, const char *lpath)
{
    char old[4200];
    struct stat st;
    for (int salted = 0; salted < 2; salted++) /* the earlier names, this user's */
        if (cache_path(ipath, lpath, salted, old, sizeof old) == 0 && lstat(old, &st) == 0 &&
            S_ISREG(st.st_mode) && st.st_uid == geteuid())
            unlink(old);
}

/* Read @p len bytes at @p off of @p fd into @p dst in blocks, folding each into the CRC right
 * after it arrives (in cache). @return 0, or -1 on a read error or a short file. */
static int read_crc(int fd, void *dst, size_t len, off_t off, uint32_t *crc)
{
    uint8_t *b = dst;
    for (size_t done = 0; done < len;) {
        size_t want = len - done < READ_BLOCK ? len - done : READ_BLOCK;
        ssize_t r = pread(fd, b + done, want, off + (off_t)done);
        if (r <= 0) return -1;
        *crc = ps_crc32c(*crc, b + done, (size_t)r);
        done += (size_t)r;
    }
    return 0;
}

int ps_dscache_load(ps_dataset_t *d, const char *path)
{
    /* Not followed if a link, not waited on if a FIFO (that hung every worker): opened without
     * blocking, and then only a regular file of this user that nobody else may write counts.
     * In a shared directory (/tmp) another user could otherwise plant data the workers train
     * on, or labels that abort them: the CRC guards against accidents, not writers. */
    struct stat st;
    int fd = ps_open_regular(path, O_NOFOLLOW, &st);
    if (fd < 0) return -1;
    dsc_hdr_t h;
    uint8_t *pixels = NULL, *labels = NULL;
    size_t img = 0;
    uint32_t crc = 0;
    if (st.st_uid != geteuid() ||
        (st.st_mode & (S_IWGRP | S_IWOTH)) || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        goto miss;
    uint64_t want; /* images and labels; a product that wraps is no cache of ours */
    if (__builtin_mul_overflow((uint64_t)h.n, (uint64_t)h.dim, &want) ||
        __builtin_add_overflow(want, (uint64_t)h.n, &want) || want > SIZE_MAX / 2)
        goto miss;
    if (memcmp(h.magic, DSC_MAGIC, 8) != 0 || h.n == 0 || h.dim == 0 || h.bytes != want ||
        (uint64_t)st.st_size != DSC_HDR + want || h.key == 0 || h.key != key_of(path))
        goto miss;
    /* Read into private memory on 2 MiB pages (see dscache.h), each block's CRC taken as it
     * arrives. */
    img = (size_t)h.n * h.dim;
    pixels = ps_buffer_alloc(img);
    labels = malloc(h.n);
    if (pixels == NULL || labels == NULL || read_crc(fd, pixels, img, DSC_HDR, &crc) ||
        read_crc(fd, labels, h.n, DSC_HDR + (off_t)img, &crc) || crc != h.crc)
        goto miss;
    for (uint32_t i = 0; i < h.n; i++) /* as load_labels checks the source's */
        if (labels[i] >= PS_FMNIST_CLASSES) goto miss;
    close(fd);
    d->n = h.n;
    d->dim = h.dim;
    d->pixels = pixels;
    d->pixels_bytes = img;
    d->labels = labels;
    return 0;
miss:
    ps_buffer_free(pixels, img);
    free(labels);
    close(fd);
    return -1;
}

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w <= 0) return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Removes the temporary files of @p path that killed writers left ("<path>.tmp.<pid>", last
 * written over 10 minutes ago, by a process that no longer runs): nothing else ever did. */
static void sweep_tmp(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL) return;
    char dir[4200], prefix[512];
    size_t dl = (size_t)(slash - path);
    if (dl >= sizeof dir || snprintf(prefix, sizeof prefix, "%s.tmp.", slash + 1) >=
                                (int)sizeof prefix)
        return;
    memcpy(dir, path, dl);
    dir[dl] = '\0';
    DIR *dp = opendir(dir);
    if (dp == NULL) return;
    size_t pl = strlen(prefix);
    time_t now = time(NULL);
    for (struct dirent *e; (e = readdir(dp)) != NULL;) {
        if (strncmp(e->d_name, prefix, pl) != 0) continue;
        char *end;
        long pid = strtol(e->d_name + pl, &end, 10);
        struct stat st;
        if (*end || pid <= 0 || fstatat(dirfd(dp), e->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
            st.st_uid != geteuid() || now - st.st_mtime < 600)
            continue;
        if (pid != getpid() && (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) continue;
        unlinkat(dirfd(dp), e->d_name, 0);
    }
    closedir(dp);
}

int ps_dscache_save(const ps_dataset_t *d, const char *path)
{
    char tmp[4200];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) return -1;
    sweep_tmp(path);
    size_t img = (size_t)d->n * d->dim;
    uint8_t hdr[DSC_HDR] = {0};
    dsc_hdr_t h = {.n = d->n, .dim = d->dim, .bytes = img + d->n, .key = key_of(path)};
    memcpy(h.magic, DSC_MAGIC, 8);
    h.crc = ps_crc32c(ps_crc32c(0, d->pixels, img), d->labels, d->n);
    memcpy(hdr, &h, sizeof h);
    /* 0600: the decoded pixels of a dataset this user may read, which another user may not
     * (it was 0644 whatever the source's mode; only this user reads it back; a review). */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno == EEXIST && unlink(tmp) == 0) /* our pid's: a dead writer's leftover */
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -1;
    int rc = write_all(fd, hdr, sizeof hdr) || write_all(fd, d->pixels, img) ||
             write_all(fd, d->labels, d->n);
    rc |= close(fd);
    if (rc == 0) rc = rename(tmp, path);
    if (rc != 0) unlink(tmp);
    return rc ? -1 : 0;
}
