/* Built against an *installed* blueprint (pkg-config and the CMake package):
 * lays out one FC layer and prints the arena size. */
#include <blueprint/blueprint.h>
#include <stdio.h>

int main(void) {
  bp_plan_options options = {0, 0, BP_OPT_SGD};
  bp_plan *plan = NULL;
  bp_param_ids ids;
  if (bp_plan_create(&options, &plan) != BP_OK ||
      bp_plan_begin_variant(plan, "train", 1, 1, 1) != BP_OK ||
      bp_plan_alloc_param(plan, BP_PARAM_FC_WEIGHT, "fc.w", (bp_shape){1024, 1, 1, 784},
                          (bp_init){BP_INIT_ZEROS, 0, 0, 0}, &ids) != BP_OK ||
      bp_plan_end_variant(plan) != BP_OK || bp_plan_finalize(plan) != BP_OK) {
    fprintf(stderr, "consumer: %s\n", bp_last_error());
    bp_plan_destroy(plan);
    return 1;
  }
  /* W, G and M slots of 3211776 bytes each */
  printf("total_bytes=%llu\n", (unsigned long long)bp_plan_total_bytes(plan));
  bp_plan_destroy(plan);
  return 0;
}
