/* Sessions: the one pipeline from a model to the kernels bound to a rank's
 * arena, which training, evaluation, predict and validate --model share:
 *
 *   compile (plan.h: every variant's tensors)
 *     -> graph (graph.h: the nodes of every segment, built once)
 *     -> liveness packing (docs/plan.md: feature and gradient slots whose
 *        live ranges never meet share bytes; the ranges come from that
 *        graph, which then moves its spans with the plan, bp_node_tensor)
 *     -> select and bind, per rank (exec.h; bp_session_bind).
 *
 * Fusion is an option of the session: compile.fuse_bn_relu asks for it,
 * and with a registry the session fuses only where bp_fuse_bn_relu_allowed
 * says the run's device and pins have the fused kernels (model.h).
 *
 * A session's plan and graph are exactly what bp_model_compile and
 * bp_graph_build give for the same options (tests/test_session.c); the
 * session builds the graph once instead of twice. */
#ifndef BLUEPRINT_SESSION_H
#define BLUEPRINT_SESSION_H

#include "blueprint/exec.h"
#include "blueprint/graph.h"
#include "blueprint/model.h"
#include "blueprint/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

struct bp_registry;

typedef struct bp_session_options {
  bp_compile_options compile; /* the plan: batches, variants, AMP, EMA, optimizer, reuse,
                                 fusion (fuse_bn_relu) */
  bp_graph_options graph;     /* the step: optimizer hyper-parameters, EMA evaluation,
                                 update sharding, loss scaling. Its world, global batch
                                 and train size are taken from `compile` */
  const struct bp_registry *registry; /* (optional, borrowed) fuse only where it has the
                                         fused kernels for `device` and `pins` */
  const char *device; /* the kernel kind the run binds; NULL: "cpu" */
  const char *pins;   /* the run's kernel pins (registry.h); NULL: none */
} bp_session_options;

/* compile from the model's own settings (bp_compile_options_from_model),
 * graph defaults (bp_graph_options_init), no registry. */
void bp_session_options_init(bp_session_options *options, const bp_model *model);

typedef struct bp_session bp_session; /* opaque */

/* Compiles `model` (borrowed: it must outlive the session), builds its
 * graph and packs the plan. The errors are bp_model_compile's and
 * bp_graph_build's. *session_out is written only on success. */
bp_status bp_session_create(const bp_model *model, const bp_session_options *options,
                            bp_session **session_out);
void bp_session_destroy(bp_session *session); /* NULL is a no-op */

/* Borrowed from the session. */
const bp_plan *bp_session_plan(const bp_session *session);
const bp_graph *bp_session_graph(const bp_session *session);
/* 1 when batchnorm + relu run fused in this session's graph. */
int bp_session_fused(const bp_session *session);

/* Selects and binds the kernels of every variant for one rank whose arena
 * starts at `arena_base` (bp_exec_create, exec.h). */
bp_status bp_session_bind(const bp_session *session, struct bp_registry *registry,
                          void *arena_base, const bp_exec_options *options, bp_exec **exec_out);

#ifdef __cplusplus
}
#endif
#endif
