/* Kernel checks at selection: what the registry's checker
 * (bp_select_checker, registry.h) does for the kernels selection picks
 * without timing them (docs/validate.md, "Pinned kernels").
 *
 *  - A pinned kernel (--kernels, BP_KERNELS, a model's `train: kernels:`)
 *    runs validate's checks on the node's own shapes and attributes before
 *    the run starts, as autotune checks a candidate: against the reference
 *    kernel of its op (a module op without one: its conventions and state
 *    across calls only), in scratch buffers of its own that end at guard
 *    pages, one thread. One that fails makes selection fail, naming the
 *    node, the kernel and the reason. Verdicts are remembered per (op,
 *    impl, module build id, node descriptors and attributes) while the
 *    registry lives. Only cpu kernels are checked.
 *  - A kernel picked by priority from a module that does not ship with
 *    blueprint (a --plugin path, BP_PLUGIN_PATH or bp_registry_load; not
 *    the install directory or the one beside the library), over a
 *    kernel of a module that does (the default pick), is timed against
 *    that default pick on the node's shapes (scratch buffers, the node's
 *    threads, best of BP_KERNEL_CHECKS_CALLS calls after a warm-up); when
 *    it takes at least BP_KERNEL_CHECKS_SLOW times as long, a warning
 *    names both, the node and the ratio (bp_kernel_checks_warnings). The
 *    default pick is never timed: a run of shipped modules only pays
 *    nothing. cpu kernels only. */
#ifndef BLUEPRINT_KERNEL_CHECKS_H
#define BLUEPRINT_KERNEL_CHECKS_H

#include "blueprint/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BP_KERNEL_CHECKS_SLOW 3.0 /* a priority pick this many times slower is reported */
#define BP_KERNEL_CHECKS_CALLS 5  /* timed calls per kernel after one warm-up; the best counts */

/* Installs the checks in `registry` (bp_registry_set_checker), replacing
 * a checker installed before. check_pins 0 (--trust-pins): pinned kernels
 * run unchecked; the priority timing runs either way. */
bp_status bp_kernel_checks_install(bp_registry *registry, int check_pins);

/* The priority warnings found so far, one line each ending in '\n' (one
 * per (op, picked impl), its slowest node); "" when none, or when the
 * installed checker is not this one. The text lives until the next
 * selection or the registry's destruction. */
const char *bp_kernel_checks_warnings(const bp_registry *registry);

#ifdef __cplusplus
}
#endif
#endif
