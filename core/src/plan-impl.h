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

#endif
