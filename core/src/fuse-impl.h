/* When the graph fuses a batchnorm and the relu after it into one
 * batchnorm_relu node per pass (bp_plan_options.fuse_bn_relu; docs/plan.md,
 * "Fusion"). Not installed. */
#ifndef BLUEPRINT_FUSE_IMPL_H
#define BLUEPRINT_FUSE_IMPL_H

#include <stddef.h>

#include "blueprint/model.h"
#include "blueprint/registry.h"

/* The default of bp_compile_options_from_model: 1, unless the environment
 * variable BP_FUSE is "0" (the opt-out). Whoever knows the run's device and
 * pins then asks bp_fuse_bn_relu_allowed. Fused and unfused plans read each
 * other's checkpoints (the plan hash leaves the features out; docs/plan.md,
 * "Fusion"). */
int bp_fuse_bn_relu_default(void);

/* bp_fuse_bn_relu_allowed, which says whether a run may fuse, is public:
 * blueprint/model.h. */

#endif
