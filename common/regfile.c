/* regfile.c: see regfile.h. */
#include "regfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int ps_open_regular(const char *path, int flags, struct stat *st)
{
    /* Looked at through an O_PATH descriptor first, which opens nothing: a device's open has
     * effects of its own (a watchdog armed, a tape rewound) before any fstat could refuse it
     * (a review, session 71). The regular file is then opened through /proc's link to that
     * descriptor (the same file, whatever the path became meanwhile), or by its path again
     * where /proc is not mounted, and must be the file looked at. */
    int pfd = open(path, O_PATH | O_CLOEXEC | (flags & O_NOFOLLOW));
    if (pfd < 0) return -errno;
    if (fstat(pfd, st) != 0) {
        int e = errno;
        close(pfd);
        return -e;
    }
    if ((flags & O_NOFOLLOW) && S_ISLNK(st->st_mode)) { /* O_PATH opened the link itself */
        close(pfd);
        return -ELOOP;
    }
    if (!S_ISREG(st->st_mode)) {
        close(pfd);
        return -EINVAL;
    }
    char link[32];
    snprintf(link, sizeof link, "/proc/self/fd/%d", pfd);
    int fd = open(link, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (flags & ~O_NOFOLLOW));
    if (fd < 0 && errno == ENOENT) fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | flags);
    int e = errno;
    close(pfd);
    if (fd < 0) return -e;
    struct stat now;
    int bad = fstat(fd, &now) != 0                                           ? -errno
              : now.st_dev != st->st_dev || now.st_ino != st->st_ino ? -EINVAL
                                                                       : 0;
    if (bad) {
        close(fd);
        return bad;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

const char *ps_file_kind(const struct stat *st)
{
    mode_t m = st->st_mode;
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISREG(m)  ? "a regular file"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISLNK(m)  ? "a symlink"
                         : "of an unknown kind";
}
