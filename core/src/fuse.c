/* Whether a run fuses batchnorm + relu (fuse-impl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuse-impl.h"
#include "registry-impl.h"

static const char *const fused_ops[] = {"batchnorm_relu.fwd_train", "batchnorm_relu.fwd_eval",
                                        "batchnorm_relu.bwd"};
static const char *const unfused_ops[] = {"batchnorm.fwd_train", "batchnorm.fwd_eval",
                                          "batchnorm.bwd", "relu.fwd", "relu.bwd"};

/* The impl pinned for op on device, or NULL (a malformed list counts as
 * none: its own check reports it). */
static const char *pinned(const char *pins, const char *op, const char *device, char *impl) {
  char text[BP_PIN_MAX], err[8];
  return pins && pins[0] && bp_pins_find(pins, op, device, impl, text, err, sizeof err) == 1
             ? impl
             : NULL;
}

static int has_impl(const bp_registry *r, const char *op, const char *device, const char *impl) {
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(r, i)->kernel;
    if (!strcmp(k->op, op) && !strcmp(k->device, device) && !strcmp(k->impl, impl)) return 1;
  }
  return 0;
}

int bp_fuse_bn_relu_allowed(const bp_registry *r, const char *device, const char *pins,
                            char *why, size_t why_size) {
  char impl[64];
  for (size_t i = 0; i < sizeof fused_ops / sizeof fused_ops[0]; i++) {
    if (!bp_registry_default_kernel(r, fused_ops[i], device)) {
      snprintf(why, why_size, "no kernel for %s on %s", fused_ops[i], device);
      return 0;
    }
    if (pinned(pins, fused_ops[i], device, impl) && !has_impl(r, fused_ops[i], device, impl)) {
      snprintf(why, why_size, "a kernel pin names %s, which has no %s kernel", impl,
               fused_ops[i]);
      return 0;
    }
  }
  int fused_pinned = 1;
  for (size_t i = 0; i < sizeof fused_ops / sizeof fused_ops[0]; i++)
    fused_pinned = fused_pinned && pinned(pins, fused_ops[i], device, impl);
  for (size_t i = 0; i < sizeof unfused_ops / sizeof unfused_ops[0] && !fused_pinned; i++)
    if (pinned(pins, unfused_ops[i], device, impl)) {
      snprintf(why, why_size, "a kernel pin names %s", unfused_ops[i]);
      return 0;
    }
  return 1;
}
