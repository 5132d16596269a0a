/* The autotuner: the registry's tuner (registry.h, bp_select_tuner) that
 * times every kernel supporting a node on the node's real buffers and
 * keeps the fastest, in a cache file reused by later runs. It lives beside
 * validate: before timing, every candidate runs validate's checks on the
 * node's shapes against the reference kernel, and one that fails is never
 * picked (docs/validate.md). The trainer installs it for `train
 * --autotune`, then confirms its picks against the default selection over
 * whole training steps (bp_autotune_keep_tuned below; docs/tuning.md);
 * selection without it never times, forks or writes files. */
#ifndef BLUEPRINT_AUTOTUNE_H
#define BLUEPRINT_AUTOTUNE_H

#include "blueprint/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Installs the autotuner in `registry` (bp_registry_set_tuner); once
 * installed, a second call does nothing. Its cache and verdicts live as
 * long as the registry; ranks sharing the registry share them (one lock). */
bp_status bp_autotune_install(bp_registry *registry);

/* The margin by which a tuned selection's step must beat the default's
 * for the trainer to keep it (docs/tuning.md): 2%. */
#define BP_AUTOTUNE_STEP_MARGIN 0.02

/* The decision over whole steps: 1 when the tuned selection's step time
 * (tuned_ms) is faster than the default selection's (default_ms) by more
 * than `margin` (a fraction: 0.02 is 2%), else 0, and the default stays.
 * Times that are not positive (NaN included) keep the default. Pure. */
int bp_autotune_keep_tuned(double tuned_ms, double default_ms, double margin);

/* What the autotuner recorded for a node of `op` on `device` with the
 * argument block `args` (its signature): the candidates' times when each
 * was timed alone, "impl=ms,impl=ms,..." (the cache's times field), into
 * out; "" when none is known (no autotuner installed, the node not tuned,
 * a cache line of format v1). */
bp_status bp_autotune_node_times(bp_registry *registry, const char *op, const char *device,
                                 const bp_abi_kernel_args *args, char *out, size_t size);
/* 1 when the autotuner's checks excluded kernel `impl` for a node of `op`
 * on `device` with the argument block `args` in this process, else 0 (no
 * autotuner installed, not checked, or passed). */
int bp_autotune_excluded(bp_registry *registry, const char *op, const char *device,
                         const bp_abi_kernel_args *args, const char *impl);

#ifdef __cplusplus
}
#endif
#endif
