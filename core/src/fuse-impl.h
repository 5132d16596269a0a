/* When the graph fuses a batchnorm and the relu after it into one
 * batchnorm_relu node per pass (bp_plan_options.fuse_bn_relu; docs/plan.md,
 * "Fusion"). Not installed. */
#ifndef BLUEPRINT_FUSE_IMPL_H
#define BLUEPRINT_FUSE_IMPL_H

#include <stddef.h>

#include "blueprint/registry.h"

/* The default of bp_compile_options_from_model: 0, unless the environment
 * variable BP_FUSE is set to anything but "" or "0" (opt-in: the fused
 * plan packs features differently, so its checkpoints load only into
 * fused plans; docs/plan.md, "Fusion"). */
int bp_fuse_bn_relu_default(void);

/* 1 when a run on `device` with `pins` may fuse: the registry serves all
 * three batchnorm_relu ops there, a pin that applies to one of them names
 * an impl that has it, and no pin names an unfused batchnorm or relu op
 * without also naming the fused ones (a pin must never be silently
 * ignored). Else 0, with the reason in why. */
int bp_fuse_bn_relu_allowed(const bp_registry *registry, const char *device, const char *pins,
                            char *why, size_t why_size);

#endif
