/* MemoryPlan: every tensor of a run laid out in one arena, before any memory
 * exists.
 *
 * Life cycle: create -> for each variant { begin_variant, semantic allocation
 * calls, end_variant } -> finalize -> (bp_model_compile: liveness packing,
 * docs/plan.md) -> queries -> destroy. Every variant makes
 * the same allocation calls in the same order (the same ids, names, regions
 * and dtypes; parameters with the same shape); only feature shapes differ.
 *
 * Invariants after finalize (bp_plan_check verifies all of them):
 *  1. regions are laid out in enum order: base[r+1] = base[r] + bytes[r];
 *  2. inside a region, tensors sit in allocation order, each at the running
 *     cursor, cursor += slot_bytes; a region's bytes are the sum of its slots;
 *  3. every offset and slot is a multiple of 256;
 *  4. every tensor id has the same offset and slot_bytes in every variant,
 *     and slot_bytes is the max of its shapes' slots across variants;
 *  5. a disabled region (feature off) holds no tensor and zero bytes;
 *  6. each parameter family region mirrors its W region: tensor k of
 *     W_<kind> pairs with tensor k of E/G/M/V_<kind> at the same relative
 *     offset (equal slots) and of A/G16_<kind> at half of it (half slots),
 *     so the W span is exactly twice the A span;
 *  7. each all-reduce bucket is one contiguous span;
 *  8. in a packed plan (liveness packing, docs/plan.md) the F regions
 *     (F32, F16) are the exception to invariant 2: their tensors sit
 *     anywhere inside the region at multiples of 256, the region's bytes
 *     are the highest end of its slots, and two tensors whose live ranges
 *     overlap in any variant share no byte. */
#ifndef BLUEPRINT_PLAN_H
#define BLUEPRINT_PLAN_H

#include <stdint.h>

#include "blueprint/dtensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bp_plan bp_plan; /* opaque */

typedef enum bp_optimizer {
  BP_OPT_SGD = 0, /* momentum in M */
  BP_OPT_ADAMW,   /* M and V */
  BP_OPT_LARS,    /* momentum in M, norms in N */
} bp_optimizer;

const char *bp_optimizer_name(bp_optimizer opt);
int bp_optimizer_from_name(const char *name, bp_optimizer *out); /* 0 on success */

typedef struct bp_plan_options {
  int amp;                /* FP16 working copies, FP16 gradients and features */
  int ema;                /* EMA copies of the weights */
  bp_optimizer optimizer;
} bp_plan_options;

/* One shape configuration of the model. */
typedef struct bp_variant_info {
  char name[BP_NAME_MAX]; /* "train", "train_last", "eval", ... */
  int64_t batch, height, width;
} bp_variant_info;

/* Byte span of the arena: [offset, offset + bytes). */
typedef struct bp_span {
  uint64_t offset;
  uint64_t bytes;
} bp_span;

/* Ids of one parameter's family; -1 where the region is disabled. */
typedef struct bp_param_ids {
  int32_t w, e, a, g, g16, m, v, n;
} bp_param_ids;

/* Live range of a tensor in one variant's step: indices into the
 * variant's nodes of every segment, segments in enum order (graph.h),
 * first..last inclusive. first -1: the step never touches the tensor.
 * last BP_LIVE_END: live to the end of the step (and, with first 0, from
 * the step before: a tensor read before it is written). */
typedef struct bp_live_range {
  int32_t first, last;
} bp_live_range;
#define BP_LIVE_END INT32_MAX

/* Whether two ranges share a node. */
static inline int bp_live_overlap(bp_live_range a, bp_live_range b) {
  return a.first >= 0 && b.first >= 0 && a.first <= b.last && b.first <= a.last;
}

/* Whether liveness packing shares the bytes of `region`'s tensors: the
 * per-step feature and gradient slots, F32 and F16. */
static inline int bp_region_is_packed(bp_region region) {
  return region == BP_REGION_F32 || region == BP_REGION_F16;
}

/* Whether `region` is switched on under `options`. */
int bp_region_enabled(const bp_plan_options *options, bp_region region);

bp_status bp_plan_create(const bp_plan_options *options, bp_plan **plan_out);
void bp_plan_destroy(bp_plan *plan); /* NULL is a no-op */

bp_status bp_plan_begin_variant(bp_plan *plan, const char *name, int64_t batch, int64_t height,
                                int64_t width);
bp_status bp_plan_end_variant(bp_plan *plan);

/* Semantic allocation. Each writes the new id(s) through its last argument.
 *
 * A parameter allocates its whole family at once: W (FP32 master), G, and,
 * as enabled, E, A and G16 (AMP), M and V (optimizer), N (LARS: [1,1,1,2]
 * FP32 holding the weight norm and the gradient norm). */
bp_status bp_plan_alloc_param(bp_plan *plan, bp_param_kind kind, const char *name,
                              bp_shape shape, bp_init init, bp_param_ids *ids_out);
/* BN running statistics in B: [1,1,1,C] mean (init zeros) and var (ones). */
bp_status bp_plan_alloc_bn_stats(bp_plan *plan, const char *name, int64_t channels,
                                 int32_t mean_var_ids_out[2]);
/* A feature or gradient slot: FP32 -> F32, FP16 -> F16 (AMP only). */
bp_status bp_plan_alloc_feature(bp_plan *plan, const char *name, bp_shape shape,
                                bp_dtype dtype, int32_t *id_out);
/* An input or label in both double buffers: ids_out[0] in I_A, [1] in I_B. */
bp_status bp_plan_alloc_input(bp_plan *plan, const char *name, bp_shape shape, bp_dtype dtype,
                              int32_t ids_out[2]);
/* A result (FP32, summed across ranks) in R. */
bp_status bp_plan_alloc_result(bp_plan *plan, const char *name, bp_shape shape,
                               int32_t *id_out);
/* A scalar [1,1,1,1] in S_SCALAR. */
bp_status bp_plan_alloc_scalar(bp_plan *plan, const char *name, bp_dtype dtype, bp_init init,
                               int32_t *id_out);
/* An INT8 mask in S_MASK. */
bp_status bp_plan_alloc_mask(bp_plan *plan, const char *name, bp_shape shape, int32_t *id_out);
/* A temporary or workspace in T. */
bp_status bp_plan_alloc_temp(bp_plan *plan, const char *name, bp_shape shape, bp_dtype dtype,
                             int32_t *id_out);

/* Lays out every region and tensor (invariants above) and runs bp_plan_check. */
bp_status bp_plan_finalize(bp_plan *plan);

/* Queries; valid after finalize unless stated. */
int bp_plan_is_finalized(const bp_plan *plan); /* any time */
const bp_plan_options *bp_plan_get_options(const bp_plan *plan);
int bp_plan_variant_count(const bp_plan *plan);
const bp_variant_info *bp_plan_variant(const bp_plan *plan, int variant);
int bp_plan_find_variant(const bp_plan *plan, const char *name); /* -1 if none */
int32_t bp_plan_tensor_count(const bp_plan *plan);
/* Descriptor of `id` in `variant`; NULL when out of range. Borrowed. */
const bp_dtensor *bp_plan_tensor(const bp_plan *plan, int variant, int32_t id);
int32_t bp_plan_find_tensor(const bp_plan *plan, const char *name); /* -1 if none */
uint64_t bp_plan_total_bytes(const bp_plan *plan);
bp_span bp_plan_region_span(const bp_plan *plan, bp_region region);
int32_t bp_plan_region_tensor_count(const bp_plan *plan, bp_region region);
/* Span from the base of `first` to the end of `last` (first <= last). */
bp_status bp_plan_resolve(const bp_plan *plan, bp_region first, bp_region last, bp_span *out);
/* The contiguous span of all-reduce bucket `bucket` (BP_BUCKET_*); bytes 0
 * when the bucket is empty. */
bp_status bp_plan_bucket_span(const bp_plan *plan, int bucket, bp_span *out);

/* Liveness packing (invariant 8). Whether the plan is packed; the bytes
 * the plan takes without reuse (its total when not packed); the live range
 * of `id` in `variant` the packing used ({-1, -1} when not packed, out of
 * range or not a packed region's tensor). */
int bp_plan_is_packed(const bp_plan *plan);
uint64_t bp_plan_unpacked_bytes(const bp_plan *plan);
bp_live_range bp_plan_live_range(const bp_plan *plan, int variant, int32_t id);

/* Verifies invariants 1-8; BP_ERR_STATE with the broken one named. */
bp_status bp_plan_check(const bp_plan *plan);

#ifdef __cplusplus
}
#endif
#endif
