/* optim_avx2.c: the optimizer loops of optim_body.h built with -mavx2 (kernels/meson.build, x86-64
 * only; no FMA, -ffp-contract=off), 8 floats per instruction instead of SSE's 4. Only
 * psk_optim_apply_strided_cpu() calls it, after __builtin_cpu_supports("avx2"); nothing else
 * belongs in this file, since the compiler may use AVX2 anywhere in it. */
#define PSK_OPTIM_SUFFIX avx2
#include "optim_body.h"
