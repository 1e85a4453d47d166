/* place.c: chunk -> shard placement (see place.h for the rule and why). */
#include "place.h"

uint32_t ps_place_shard(uint64_t ordinal, uint32_t nshards)
{
    return nshards ? (uint32_t)(ordinal % nshards) : 0;
}
