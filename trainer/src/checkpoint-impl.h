/* What a checkpoint saves, shared by the file code (checkpoint.c) and the
 * plan hash (plan_hash.c), which must cover exactly these bytes. Not
 * installed. */
#ifndef BLUEPRINT_CHECKPOINT_IMPL_H
#define BLUEPRINT_CHECKPOINT_IMPL_H

#include "blueprint/checkpoint.h"
#include "blueprint/region.h"

/* The state spans, in file order, each as its first and last region:
 * B..E_CONV_DEEP (BN statistics, master weights, EMA) and M_BN_BIAS..N
 * (moments, LARS norms). Everything outside them is recomputed. */
#define BP_CHECKPOINT_SECTIONS 2
extern const bp_region bp_checkpoint_sections[BP_CHECKPOINT_SECTIONS][2];

/* Whether the state a save would write is finite: *tensor_out is the name
 * of the first tensor (arena order) holding a NaN or an infinity among its
 * elements, or NULL when every value is finite. Reads the spans through
 * `arena` one at a time (staged on the host); the load's own check
 * (check 10, docs/checkpoint-format.md) looks at the same values. */
bp_status bp_checkpoint_state_finite(const bp_plan *plan, const bp_arena_access *arena,
                                     const char **tensor_out);

#endif
