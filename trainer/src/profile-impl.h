/* Shared between the profile's data (profile.c) and its yardstick
 * (profile_sgemm.c). */
#ifndef BP_PROFILE_IMPL_H
#define BP_PROFILE_IMPL_H

#include "blueprint/profile.h"

/* Sorts the `count` (> 0) run times at ns, fastest first, and sets s's
 * runs, best_seconds, gflops and median_gflops from them (2 m n k FLOPs a
 * run, s's sizes): one measurement's runs, or a profile's pool of them. */
void bp_profile_sgemm_rates(bp_profile_sgemm *s, uint64_t *ns, int count);

#endif
