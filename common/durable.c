/* durable.c: see durable.h. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "durable.h"

int ps_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

int ps_mkdir_durable(const char *dir)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) return -ENAMETOOLONG;
    size_t len = strlen(tmp);
    if (len == 0) return -ENOENT;
    while (len > 1 && tmp[len - 1] == '/') tmp[--len] = '\0';
    for (char *p = tmp + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(tmp, 0700) == 0) {
            /* A new entry: its parent is synced, so the path survives a power loss. */
            char *slash = strrchr(tmp, '/');
            int rc;
            if (slash == NULL) {
                rc = ps_fsync_dir(".");
            } else if (slash == tmp) {
                rc = ps_fsync_dir("/");
            } else {
                *slash = '\0';
                rc = ps_fsync_dir(tmp);
                *slash = '/';
            }
            if (rc) return rc;
        } else if (errno != EEXIST) {
            return -errno;
        } else {
            struct stat st;
            if (stat(tmp, &st) != 0) return -errno;
            if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
        }
        *p = c;
        if (c == '\0') break;
    }
    return 0;
}

int ps_rename_durable(const char *tmp, const char *path)
{
    if (rename(tmp, path)) return -errno;
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else
        return -ENAMETOOLONG;
    return ps_fsync_dir(dir);
}

static const char *node_kind(mode_t m)
{
    return S_ISDIR(m)    ? "a directory"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
                         : "not a regular file";
}

int ps_out_file_check(const char *path, char *out, size_t outcap, char *err, size_t errlen)
{
    struct stat l, st;
    int rc = 0;
    if (lstat(path, &l) != 0) {
        if (errno != ENOENT) {
            rc = -errno;
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return rc;
        }
        l.st_mode = S_IFREG; /* absent: made */
    }
    if (S_ISLNK(l.st_mode)) {
        char *target = NULL;
        if (stat(path, &st) != 0) {
            rc = -errno;
            if (errno == ENOENT)
                snprintf(err, errlen, "%s is a symlink to nothing: give the path of a file", path);
            else
                snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return rc;
        }
        if (!S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "%s is a symlink to %s, not to a regular file: a file renamed "
                     "there would replace it; give the path of a file", path,
                     node_kind(st.st_mode));
            return -EEXIST;
        }
        if ((target = realpath(path, NULL)) == NULL) {
            rc = -errno;
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return rc;
        }
        if (strlen(target) >= outcap) rc = -ENAMETOOLONG;
        else snprintf(out, outcap, "%s", target);
        free(target);
        if (rc) snprintf(err, errlen, "%s: the file it links to has too long a path", path);
        return rc;
    }
    if (!S_ISREG(l.st_mode)) {
        snprintf(err, errlen, "%s is %s, not a regular file: a file renamed there would replace "
                 "it; give the path of a file", path, node_kind(l.st_mode));
        return -EEXIST;
    }
    if (strlen(path) >= outcap) {
        snprintf(err, errlen, "%s: path too long", path);
        return -ENAMETOOLONG;
    }
    snprintf(out, outcap, "%s", path);
    return 0;
}
