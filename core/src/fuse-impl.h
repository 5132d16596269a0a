/* When the graph fuses a batchnorm and the relu after it into one
 * batchnorm_relu node per pass (bp_plan_options.fuse_bn_relu; docs/plan.md,
 * "Fusion"). Not installed. */
#ifndef BLUEPRINT_FUSE_IMPL_H
#define BLUEPRINT_FUSE_IMPL_H

#include <stddef.h>

#include "blueprint/model.h"
#include "blueprint/registry.h"

/* bp_fuse_bn_relu_allowed, which says whether a run may fuse, is public:
 * blueprint/model.h. */

#endif
