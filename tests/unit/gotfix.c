/* gotfix.c: a shared library for test_gothook.c, built twice (libgotfix_lazy: lazy binding, its
 * PLT slots outside RELRO; libgotfix_now: -z now, every slot in RELRO, as hardened distributions
 * build UCX). GOTFIX names its two functions after the build. */
#include <unistd.h>

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

/** @brief getppid() called through this library's PLT (an R_X86_64_JUMP_SLOT). */
pid_t CAT(GOTFIX, _call)(void) { return getppid(); }

/** @brief getpgrp's address as this library sees it (an R_X86_64_GLOB_DAT slot, in RELRO in
 *  both builds). Another function than the call's: taking getppid's address here would make
 *  its calls go through that one slot too. */
void *CAT(GOTFIX, _addr)(void) { return (void *)&getpgrp; }
