/* What the vendor-library modules (ops/cudnn, ops/cublas) share on the C
 * side of conv2d and fc: the argument checks of the reference for FP32 and
 * FP16 calls, environment switches, byte layout of a workspace, and
 * whether a tensor can be handed to the library in place. Header-only
 * (static inline), on the module SDK and ops/shared/weighted_check.h.
 *
 * FP16. The shared checks (weighted_check.h) take FP32 tensors. A call
 * whose tensors are all FP16 is checked on a view of its descriptors with
 * the dtype set to FP32 and slot_bytes doubled (so "needs span * 4 <=
 * slot_bytes" reads "span * 2 <= slot_bytes"): the same shape, stride,
 * attribute and count checks with the reference's reasons. Calls mixing
 * FP32 and FP16 tensors are refused (an AMP plan gives conv2d and fc FP16
 * tensors only). */
#ifndef BP_OPS_SHARED_CUDA_WEIGHTED_H
#define BP_OPS_SHARED_CUDA_WEIGHTED_H

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bp_abi_sdk.h"
#include "shared/cuda_tensor_ops.h"
#include "shared/weighted_check.h"

#define OPS_CUDA_VIEW_MAX 4 /* tensors per side: conv2d and fc have at most 3 */
#define OPS_CUDA_ALIGN 256  /* workspace pieces start at multiples of this */

/* The FP32-typed view of one call's descriptors (args points into it:
 * never copy or move it after ops_cuda_view_make). */
typedef struct ops_cuda_view {
  bp_abi_kernel_args args;
  bp_abi_tensor in[OPS_CUDA_VIEW_MAX], out[OPS_CUDA_VIEW_MAX];
  int32_t dtype; /* of every tensor of the call: BP_ABI_DTYPE_FP32 or _FP16 */
} ops_cuda_view;

/* Builds the view; 1, or 0 with a reason (an unsupported dtype, mixed
 * dtypes, or args the SDK refuses). */
static inline int ops_cuda_view_make(const bp_abi_kernel_args *args, ops_cuda_view *v,
                                     char *reason, size_t rs) {
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (args->struct_size < offsetof(bp_abi_kernel_args, workspace))
    return bp_sdk_fail(reason, rs, "args struct_size %u is too small",
                       (unsigned)args->struct_size);
  if (args->num_inputs < 1 || args->num_outputs < 1 || args->num_inputs > OPS_CUDA_VIEW_MAX ||
      args->num_outputs > OPS_CUDA_VIEW_MAX)
    return bp_sdk_fail(reason, rs, "expects 1 to %d inputs and outputs, got %d and %d",
                       OPS_CUDA_VIEW_MAX, (int)args->num_inputs, (int)args->num_outputs);
  if (!bp_sdk_check_args(args, args->num_inputs, args->num_outputs, reason, rs)) return 0;
  memset(v, 0, sizeof *v);
  v->dtype = bp_sdk_input(args, 0)->dtype;
  if (v->dtype != BP_ABI_DTYPE_FP32 && v->dtype != BP_ABI_DTYPE_FP16)
    return bp_sdk_fail(reason, rs, "input 0: dtype %s, expected fp32 or fp16",
                       bp_sdk_dtype_name(v->dtype));
  const size_t args_size = args->struct_size < sizeof v->args ? args->struct_size : sizeof v->args;
  memcpy(&v->args, args, args_size);
  v->args.struct_size = (uint32_t)args_size;
  for (int side = 0; side < 2; side++) {
    const int count = side ? args->num_outputs : args->num_inputs;
    for (int i = 0; i < count; i++) {
      const bp_abi_tensor *t = side ? bp_sdk_output(args, i) : bp_sdk_input(args, i);
      if (t->dtype != v->dtype)
        return bp_sdk_fail(reason, rs, "%s %d: dtype %s, input 0 is %s (mixed dtypes)",
                           side ? "output" : "input", i, bp_sdk_dtype_name(t->dtype),
                           bp_sdk_dtype_name(v->dtype));
      bp_abi_tensor *w = side ? &v->out[i] : &v->in[i];
      memcpy(w, t, sizeof *w);
      w->struct_size = sizeof *w;
      if (v->dtype == BP_ABI_DTYPE_FP16) {
        w->dtype = BP_ABI_DTYPE_FP32;
        w->slot_bytes = t->slot_bytes > UINT64_MAX / 2 ? UINT64_MAX : t->slot_bytes * 2;
      }
    }
  }
  v->args.inputs = v->in;
  v->args.outputs = v->out;
  return 1;
}

/* t's shape and strides. */
static inline ops_cuda_layout ops_cuda_layout_of(const bp_abi_tensor *t) {
  ops_cuda_layout l;
  for (int d = 0; d < 4; d++) l.shape[d] = t->shape[d], l.stride[d] = t->stride[d];
  return l;
}

/* 1 when the logical elements of l are one dense run in NHWC order
 * (dimensions of extent 1 may carry any stride). */
static inline int ops_cuda_is_dense(const ops_cuda_layout *l) {
  int64_t inner = 1;
  for (int d = 3; d >= 0; d--) {
    if (l->shape[d] > 1 && l->stride[d] != inner) return 0;
    inner *= l->shape[d];
  }
  return 1;
}

/* Elements of the logical extent. */
static inline int64_t ops_cuda_count(const ops_cuda_layout *l) {
  return l->shape[0] * l->shape[1] * l->shape[2] * l->shape[3];
}

/* Bytes rounded up to OPS_CUDA_ALIGN. */
static inline uint64_t ops_cuda_round(uint64_t bytes) {
  return (bytes + OPS_CUDA_ALIGN - 1) / OPS_CUDA_ALIGN * OPS_CUDA_ALIGN;
}

/* The workspace base aligned to OPS_CUDA_ALIGN (a kernel asks for
 * OPS_CUDA_ALIGN bytes more than its pieces to afford this), or NULL. */
static inline char *ops_cuda_workspace_base(const bp_abi_kernel_args *args) {
  if (!args->workspace) return NULL;
  const uintptr_t p = (uintptr_t)args->workspace;
  return (char *)args->workspace + (OPS_CUDA_ALIGN - p % OPS_CUDA_ALIGN) % OPS_CUDA_ALIGN;
}

/* ---- run: errors and staging ----------------------------------------------------- */

/* A launcher's or the runtime's result (0 or a cudaError_t) as the
 * kernel's: BP_ABI_OK, or an error with "<what>: <text> (<name>)" in
 * args->reason. */
static inline int ops_cuda_result(const bp_abi_kernel_args *args, const char *what, int err) {
  if (err == 0) return BP_ABI_OK;
  const cudaError_t e = (cudaError_t)err;
  bp_sdk_set_reason(args, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  return e == cudaErrorMemoryAllocation ? BP_ABI_ERR_NOMEM : BP_ABI_ERR_DEVICE;
}

/* The pointer a library reads for an input: the tensor itself when it is
 * not staged, else its dense copy at `buf` (enqueued here). */
static inline int ops_cuda_stage_in(const bp_abi_kernel_args *args, const void *src,
                                    const ops_cuda_layout *l, int staged, char *buf, int esize,
                                    const void **out) {
  *out = src;
  if (!staged) return BP_ABI_OK;
  *out = buf;
  return ops_cuda_result(args, "staging an input",
                         ops_cuda_copy_strided(src, *l, buf, ops_cuda_dense_layout(l->shape),
                                               esize, args->stream));
}

/* The pointer a library writes for an output: the tensor itself when it
 * is not staged, else `buf`, first holding the tensor's values when the
 * result is added to them (accumulate). */
static inline int ops_cuda_stage_out(const bp_abi_kernel_args *args, void *dst,
                                     const ops_cuda_layout *l, int staged, int accumulate,
                                     char *buf, int esize, void **out) {
  *out = dst;
  if (!staged) return BP_ABI_OK;
  *out = buf;
  if (!accumulate) return BP_ABI_OK;
  return ops_cuda_result(args, "staging an output",
                         ops_cuda_copy_strided(dst, *l, buf, ops_cuda_dense_layout(l->shape),
                                               esize, args->stream));
}

/* Copies a staged output back into its tensor (logical elements only). */
static inline int ops_cuda_unstage_out(const bp_abi_kernel_args *args, void *dst,
                                       const ops_cuda_layout *l, int staged, const void *buf,
                                       int esize) {
  if (!staged) return BP_ABI_OK;
  return ops_cuda_result(args, "copying a staged output back",
                         ops_cuda_copy_strided(buf, ops_cuda_dense_layout(l->shape), dst, *l,
                                               esize, args->stream));
}

/* The bias broadcast over the rows of an output laid out as `out`: the
 * source layout for ops_cuda_copy_strided that writes b[k * b_stride]
 * into every (n, h, w, k). */
static inline ops_cuda_layout ops_cuda_bias_layout(const ops_cuda_layout *out,
                                                   int64_t b_stride) {
  ops_cuda_layout l = *out;
  l.stride[0] = l.stride[1] = l.stride[2] = 0;
  l.stride[3] = b_stride;
  return l;
}

/* Switches the host passes the GPU modules as module options (ABI 1.6,
 * bp_abi_host.option; the CLI's --deterministic and --no-tf32, or
 * BP_DETERMINISTIC and BP_TF32). Read once at a module's init. */
static inline int ops_cuda_option_deterministic(const bp_abi_host *host) {
  const char *v = bp_sdk_host_option(host, "deterministic");
  return v && strcmp(v, "1") == 0;
}
static inline int ops_cuda_option_tf32(const bp_abi_host *host) {
  const char *v = bp_sdk_host_option(host, "tf32");
  return !(v && strcmp(v, "0") == 0);
}

#endif
