/* ps_error.h: error codes shared by libps, psd and the tools.
 *
 * Fallible functions return 0 or a negative PS_E* code. System errors are
 * -errno, so libuv results pass through unchanged. */
#ifndef PS_ERROR_H
#define PS_ERROR_H

#include <errno.h>

#define PS_ERRNO_MAP(XX)                                                    \
    XX(EINVAL, -EINVAL, "invalid argument")                                 \
    XX(ENOMEM, -ENOMEM, "out of memory")                                    \
    XX(EIO, -EIO, "input/output error")                                     \
    XX(EBUSY, -EBUSY, "resource busy")                                      \
    XX(ENOENT, -ENOENT, "no such file or object")                           \
    XX(ETIMEDOUT, -ETIMEDOUT, "timed out")                                  \
    XX(ECANCELED, -ECANCELED, "canceled")                                   \
    XX(ENOSPC, -ENOSPC, "no space left on the disk under the shard's data_dir") \
    XX(ENOTSUP, -ENOTSUP, "not supported by this build or this device")   \
    XX(EPROTO, -10001, "protocol error: malformed or unexpected message")   \
    XX(ECONFLICT, -10002, "declaration conflicts with the existing tensor") \
    XX(ETRANSPORT, -10003, "transport error")                               \
    XX(ESTORE, -10004, "shard store error")                                 \
    XX(ECONFIG, -10005, "invalid configuration")                            \
    XX(ESTALE, -10006, "step does not match the chunk's version")           \
    XX(EFULL, -10007, "no free worker rank")                                \
    XX(EDATA, -10008, "invalid dataset file")                               \
    XX(ECRC, -10009, "checksum mismatch: data corrupted in transit")                          \
    XX(ESTOREFULL, -10010, "the shard store is full: raise map_size_mb")    \
    XX(ECORRUPT, -10011, "stored data does not match its hash (corrupted at rest): "      \
                         "psctl verify names it, psctl repair rewrites it")               \
    XX(EAUTH, -10012, "authentication refused: the peers do not share the cluster's secret")  \
    XX(ENOTMEMBER, -10020, "this worker was removed from the job; join again")

enum {
#define XX(name, val, msg) PS_##name = (val),
    PS_ERRNO_MAP(XX)
#undef XX
};

/** @brief Human-readable text for a PS_E* or -errno code (static storage). */
const char *ps_strerror(int err);
/** @brief Symbolic name ("EPROTO") for a PS_E* code, errno's own ("EACCES") for a -errno
 *  code, or "UNKNOWN" (static storage). */
const char *ps_err_name(int err);

#endif
