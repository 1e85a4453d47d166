/* gothook.h: point a loaded library's calls of a function elsewhere, by its PLT/GOT slots. */
#ifndef PS_GOTHOOK_H
#define PS_GOTHOOK_H

#include <stddef.h>

/** A function's name and what the calls of it are to reach instead. */
typedef struct {
    const char *name;
    void *fn;
} ps_got_hook_t;

/**
 * @brief In every loaded object whose file name starts (after its directory) with one of
 * @p libs (NULL-ended), set the relocated slots (R_X86_64_JUMP_SLOT, R_X86_64_GLOB_DAT) of
 * each of @p hooks' functions to that hook's @p fn, so that the object's calls of it reach
 * @p fn. Slots in the object's RELRO segment are made writable for the write and read-only
 * again. Objects loaded later are not changed. Call it before other threads call through the
 * slots (a call racing the write goes to either function). x86-64 Linux (glibc) only.
 * @return the number of slots set (0: none of the names is called by those objects, or none of
 * them is loaded), or -1 with the reason in @p err (an object's dynamic section unreadable, an
 * mprotect refused); slots set before a failure stay set.
 */
int ps_got_hook(const char *const *libs, const ps_got_hook_t *hooks, size_t n, char *err,
                size_t errlen);

#endif
