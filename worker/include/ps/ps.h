/* ps.h: the umbrella header of libps. */
#ifndef PS_H
#define PS_H
#include "ps/ps_client.h"
#include "ps/ps_error.h"
#endif
