/* regfile.c: see regfile.h. */
#include "regfile.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int ps_open_regular(const char *path, int flags, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | flags);
    if (fd < 0) return -errno;
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return -EINVAL;
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
