/* The autotuner: the registry's tuner (registry.h, bp_select_tuner) that
 * times every kernel supporting a node on the node's real buffers and
 * keeps the fastest, in a cache file reused by later runs. It lives beside
 * validate: before timing, every candidate runs validate's checks on the
 * node's shapes against the reference kernel, and one that fails is never
 * picked (docs/validate.md). The trainer installs it for `train
 * --autotune`; selection without it never times, forks or writes files. */
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

#ifdef __cplusplus
}
#endif
#endif
