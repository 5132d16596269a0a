/* What a checkpoint saves, shared by the file code (checkpoint.c) and the
 * plan hash (plan_hash.c), which must cover exactly these bytes. Not
 * installed. */
#ifndef BLUEPRINT_CHECKPOINT_IMPL_H
#define BLUEPRINT_CHECKPOINT_IMPL_H

#include "blueprint/region.h"

/* The state spans, in file order, each as its first and last region:
 * B..E_CONV_DEEP (BN statistics, master weights, EMA) and M_BN_BIAS..N
 * (moments, LARS norms). Everything outside them is recomputed. */
#define BP_CHECKPOINT_SECTIONS 2
extern const bp_region bp_checkpoint_sections[BP_CHECKPOINT_SECTIONS][2];

#endif
