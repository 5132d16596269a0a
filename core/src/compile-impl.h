/* The compiler's half of bp_model_compile (model.h), for the session
 * (session.c), which lays the plan out after its graph is built. Not
 * installed. */
#ifndef BLUEPRINT_COMPILE_IMPL_H
#define BLUEPRINT_COMPILE_IMPL_H

#include "blueprint/model.h"

/* bp_model_compile without liveness packing: every variant laid out and
 * the plan finalized, each slot its own bytes (options->no_reuse is left to
 * the caller). Same errors. */
bp_status bp_compile_plan(const bp_model *model, const bp_compile_options *options,
                          bp_plan **plan_out);

/* Fails with "<model file>: the plan of model 'M' cannot be laid out: <the
 * last error>", returning `st`. */
bp_status bp_compile_layout_fail(const bp_model *model, bp_status st);

#endif
