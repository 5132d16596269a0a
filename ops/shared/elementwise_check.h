/* Argument checks of the element-wise ops (relu, add, gelu, gelu_tanh,
 * pos_embed), shared by the
 * in-tree implementations (ops/reference, ops/cpu), so all accept the same
 * nodes with the same reasons. Header-only (static inline), on the module
 * SDK. */
#ifndef BP_OPS_SHARED_ELEMENTWISE_CHECK_H
#define BP_OPS_SHARED_ELEMENTWISE_CHECK_H

#include "bp_abi_sdk.h"

/* nin inputs and nout outputs, every one a valid FP32 tensor of input 0's
 * shape (each with its own strides); the attribute block, accumulate 0 or
 * 1. Tensors are named "input 0", "output 1", ... in reasons. */
static inline int ops_ew_check(const bp_abi_kernel_args *args, int nin, int nout,
                               bp_elementwise_attrs *a, char *reason, size_t rs) {
  static const char *const names[] = {"input 0", "input 1", "output 0", "output 1"};
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, a, sizeof *a, reason, rs) ||
      !bp_sdk_check_flag(a->accumulate, "accumulate", reason, rs) ||
      !bp_sdk_check_args(args, nin, nout, reason, rs))
    return 0;
  const bp_abi_tensor *first = bp_sdk_input(args, 0);
  for (int i = 0; i < nin + nout; i++) {
    const bp_abi_tensor *t = i < nin ? bp_sdk_input(args, i) : bp_sdk_output(args, i - nin);
    const char *name = names[i < nin ? i : 2 + i - nin];
    if (!bp_sdk_check_tensor(t, name, BP_ABI_DTYPE_FP32, reason, rs) ||
        !bp_sdk_check_shape(t, name, first->shape[0], first->shape[1], first->shape[2],
                            first->shape[3], reason, rs))
      return 0;
  }
  return 1;
}

/* pos_embed.fwd  in: x[N,H,W,C], P[1,H,W,C]   out: y (x's shape)
 * pos_embed.bwd  in: dy[N,H,W,C]              out: dx (dy's shape), dP[1,H,W,C]
 * Every tensor FP32 with its own strides; the attribute block, accumulate
 * 0 or 1. */
static inline int ops_pos_embed_check(const bp_abi_kernel_args *args, int bwd,
                                      bp_elementwise_attrs *a, char *reason, size_t rs) {
  static const char *const fwd_names[] = {"x", "P", "y"}, *const bwd_names[] = {"dy", "dx", "dP"};
  const char *const *names = bwd ? bwd_names : fwd_names;
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, a, sizeof *a, reason, rs) ||
      !bp_sdk_check_flag(a->accumulate, "accumulate", reason, rs) ||
      !bp_sdk_check_args(args, bwd ? 1 : 2, bwd ? 2 : 1, reason, rs))
    return 0;
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  const bp_abi_tensor *const t[3] = {x, bwd ? bp_sdk_output(args, 0) : bp_sdk_input(args, 1),
                                     bwd ? bp_sdk_output(args, 1) : bp_sdk_output(args, 0)};
  for (int i = 0; i < 3; i++) {
    /* the parameter: fwd input 1, bwd output 1 */
    const int param = bwd ? i == 2 : i == 1;
    if (!bp_sdk_check_tensor(t[i], names[i], BP_ABI_DTYPE_FP32, reason, rs) ||
        !bp_sdk_check_shape(t[i], names[i], param ? 1 : x->shape[0], x->shape[1], x->shape[2],
                            x->shape[3], reason, rs))
      return 0;
  }
  return 1;
}

#endif
