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
    default:
        return "UNKNOWN";
    }
}
