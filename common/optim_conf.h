/* optim_conf.h: the manifest's optimizer settings as the kernels take them (psd's applies and
 * psworker --local, the single-process reference, build them the same way). Header-only: it
 * joins common/manifest.h and kernels/optim.h, so only code that links both includes it. */
#ifndef PS_OPTIM_CONF_H
#define PS_OPTIM_CONF_H

#include "manifest.h"
#include "optim.h"

_Static_assert(PS_OPT_SGD == (int)PSK_SGD && PS_OPT_MOMENTUM == (int)PSK_MOMENTUM &&
                   PS_OPT_ADAM == (int)PSK_ADAM && PS_OPT_ADAMW == (int)PSK_ADAMW &&
                   PS_OPT_ADAGRAD == (int)PSK_ADAGRAD && PS_OPT_MEAN == (int)PSK_MEAN &&
                   PSK_OPTIM_KINDS == 6,
               "ps_optim_kind_t and psk_optim_kind_t name the same optimizers");

/** @brief The kernels' settings for manifest optimizer @p o at learning rate @p lr (the
 *  schedule's value for this step). Pure: nothing is kept. */
static inline psk_optim_t ps_optim_kernel_conf(const ps_optim_conf_t *o, float lr)
{
    return (psk_optim_t){.kind = (psk_optim_kind_t)o->name,
                         .lr = lr,
                         .beta1 = o->beta1,
                         .beta2 = o->beta2,
                         .eps = o->eps,
                         .momentum = o->momentum,
                         .nesterov = o->nesterov,
                         .weight_decay = o->weight_decay,
                         .lr_decay = o->lr_decay,
                         .initial_accumulator = o->initial_accumulator_value};
}

#endif
