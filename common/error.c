/* error.c: text for PS_E* codes. */
#include <string.h>

#include "ps/ps_error.h"

const char *ps_strerror(int err)
{
    switch (err) {
#define XX(name, val, msg) \
    case PS_##name:        \
        return msg;
        PS_ERRNO_MAP(XX)
#undef XX
    default:
        return err < 0 && err > -4096 ? strerror(-err) : "unknown error";
    }
}

const char *ps_err_name(int err)
{
    switch (err) {
#define XX(name, val, msg) \
    case PS_##name:        \
        return #name;
        PS_ERRNO_MAP(XX)
#undef XX
    default: {
        /* A plain errno (EACCES, ENOTDIR ...: a file's open passes it on): its own name, which
         * bindings branch on (psd.PsError.name); before, "UNKNOWN" (a review, session 71). */
        const char *n = err < 0 && err > -4096 ? strerrorname_np(-err) : NULL;
        return n ? n : "UNKNOWN";
    }
    }
}
