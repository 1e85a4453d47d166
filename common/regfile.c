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
    return S_ISDIR(st->st_mode)    ? "a directory"
           : S_ISFIFO(st->st_mode) ? "a FIFO"
           : S_ISREG(st->st_mode)  ? "a regular file"
                                   : "a device or socket";
}
