// abi/bp_abi_sdk.h included from C++ (tests/CMakeLists.txt compiles this
// with -fsyntax-only where a C++ compiler is found): module authors may
// write their kernels in C++.
#include "bp_abi_sdk.h"

int sdk_cxx_check(const bp_abi_kernel_args *args, char *reason, size_t reason_size);

int sdk_cxx_check(const bp_abi_kernel_args *args, char *reason, size_t reason_size) {
  bp_elementwise_attrs a;
  if (!bp_sdk_read_attrs(args, &a, sizeof a, reason, reason_size) ||
      !bp_sdk_check_args(args, 1, 1, reason, reason_size) ||
      !bp_sdk_check_tensor(bp_sdk_input(args, 0), "x", BP_ABI_DTYPE_FP32, reason, reason_size))
    return 0;
  float sum = 0.0f;
  const bp_abi_tensor *t = bp_sdk_input(args, 0);
  if (args->input_ptrs)
    BP_SDK_FOR_EACH_NHWC(t, n, h, w, c) sum += bp_sdk_input_f32(args, 0)[bp_sdk_offset(t, n, h, w, c)];
  bp_sdk_set_reason(args, "sum %g, generation %llu, %d threads", (double)sum,
                    (unsigned long long)bp_sdk_args_generation(args), bp_sdk_args_thread_count(args));
  return bp_sdk_fp16_to_fp32(bp_sdk_fp32_to_fp16(1.0f)) == bp_sdk_bf16_to_fp32(bp_sdk_fp32_to_bf16(1.0f)) &&
         bp_sdk_check_ptrs(args, nullptr, nullptr, 0, reason, reason_size) && bp_sdk_args_state(args) == nullptr;
}
