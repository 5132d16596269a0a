/* Liveness packing of the feature and gradient slots (docs/plan.md,
 * "Liveness packing"; invariant 8 of plan.h). Not installed. */
#ifndef BLUEPRINT_LIVENESS_IMPL_H
#define BLUEPRINT_LIVENESS_IMPL_H

#include "blueprint/graph.h"
#include "blueprint/model.h"

/* Packing takes time quadratic in the packed slots: a plan of more than
 * this many feature and gradient slots (about 2000 layers) is left as it
 * is (session.c runs the pass over the graph it builds). */
#define BP_LIVENESS_MAX_TENSORS 4096

/* The live range of every tensor of `plan` (not packed) in every variant of
 * `graph`, [variant * tensor_count + id]; only the packed regions' tensors
 * are filled, the others are {-1, -1}. A tensor some variant reads before
 * writing it (data from an earlier step) is live everywhere, and the
 * model's logits (read by the host after a step: predict) live to the end
 * of every step that writes them. *out is malloc'ed; the caller frees it. */
bp_status bp_liveness_ranges(const bp_plan *plan, const bp_graph *graph, int32_t logits,
                             bp_live_range **out);

/* Region-relative offsets of the packed regions' tensors ([id]; others 0):
 * by slot size, largest first, each at the lowest multiple of 256 where it
 * overlaps no placed tensor whose range meets its own in some variant. */
bp_status bp_liveness_offsets(const bp_plan *plan, const bp_live_range *live, uint64_t **out);

/* For a packed plan, that every node of `graph` touches a packed region
 * only inside tensors live at that node (by the ranges the plan keeps):
 * with invariant 8 no node then reaches the bytes of another live tensor.
 * BP_OK for a plan that is not packed; BP_ERR_STATE naming the node. */
bp_status bp_liveness_check_graph(const bp_plan *plan, const bp_graph *graph);

#endif
