/* Plan internals other core files use. Not installed. */
#ifndef BLUEPRINT_PLAN_IMPL_H
#define BLUEPRINT_PLAN_IMPL_H

#include "blueprint/plan.h"

/* What the plan's maker keeps with it for later phases: the compiler's
 * record of each layer's tensor ids (layer-impl.h), read by the graph
 * build. The plan owns `data` from here on and calls free_fn(data) at
 * destroy (or when a later call replaces it). */
void bp_plan_attach(bp_plan *plan, void *data, void (*free_fn)(void *));
/* The attached data, or NULL. */
const void *bp_plan_attachment(const bp_plan *plan);

/* Liveness packing of a finalized plan (invariant 8 of plan.h): moves
 * every tensor of a packed region (bp_region_is_packed) to its region's
 * base + rel_offsets[id] (indexed by id; other ids are ignored), shrinks
 * those regions to the highest end of their slots, lays the other regions
 * out again in enum order, keeps a copy of `live` ([variant * tensor_count
 * + id]) and runs bp_plan_check. Once per plan. On an error the plan is
 * unusable: destroy it. */
bp_status bp_plan_pack(bp_plan *plan, const uint64_t *rel_offsets, const bp_live_range *live);

#endif
