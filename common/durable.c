/* durable.c: see durable.h. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
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
