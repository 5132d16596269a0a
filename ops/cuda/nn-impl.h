/* ops/cuda layer family (batchnorm, relu, add, pooling, softmax-CE):
 * what its C files (descriptors, checks: nn.c, nn_ew.c, nn_pool.c,
 * nn_bn.c, nn_ce.c) and its .cu files (kernels and launchers) share.
 *
 * A launcher takes tensors as plain descriptors (cuda_nhwc: logical
 * extents, the device element strides, which are those of padded_c, and
 * the element type), device pointers, attributes already checked on the
 * host, and the cudaStream_t as void *. It enqueues its kernels on that
 * stream and returns 0 or the cudaError_t of a launch. No launcher
 * allocates, synchronizes or reads device memory on the host. Kernels
 * touch only the logical extent of every tensor (channel padding of an
 * output is never written, of an input never read). */
#ifndef BP_OPS_CUDA_NN_IMPL_H
#define BP_OPS_CUDA_NN_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "cuda-impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An NHWC tensor on the device: element (n,h,w,c) at
 * ptr + n*s0 + h*s1 + w*s2 + c*s3 elements; fp16 1: FP16 elements
 * (widened exactly, arithmetic in FP32, each result rounded once to
 * nearest even), 0: FP32 (INT8 for the max-pool mask, INT32 for labels). */
typedef struct cuda_nhwc {
  int64_t n, h, w, c;
  int64_t s0, s1, s2, s3;
  int32_t fp16;
} cuda_nhwc;

/* A per-channel [1,1,1,C] tensor: element c at p + c * stride. */
typedef struct cuda_chan {
  void *p;
  int64_t stride;
  int32_t fp16;
} cuda_chan;

/* A pooling window (bp_pool_attrs, checked). */
typedef struct cuda_pool {
  int64_t kh, kw, sh, sw, ph, pw;
  int32_t count_include_pad;
} cuda_pool;

/* ---- workspace ------------------------------------------------------------ */

/* Every workspace is used from its first 256-byte boundary on. */
#define CUDA_NN_WS_ALIGN 256

/* Batch norm cuts the M = N*H*W pixels into `slices` runs of about
 * CUDA_BN_SLICE pixels (at most CUDA_BN_MAX_SLICES runs); each block sums
 * one run of 32 channels and leaves its double partial sums in the
 * workspace, which one thread per channel then adds in slice order. The
 * cut depends only on M, so the sums' order (and the bits) never depend on
 * timing. */
#define CUDA_BN_SLICE 2048
#define CUDA_BN_MAX_SLICES 1024
static inline int64_t cuda_bn_slices(int64_t pixels) {
  int64_t s = (pixels + CUDA_BN_SLICE - 1) / CUDA_BN_SLICE;
  if (s < 1) s = 1;
  if (s > CUDA_BN_MAX_SLICES) s = CUDA_BN_MAX_SLICES;
  return s;
}
/* doubles: 5 per channel (mean, invstd, scale/k, shift/mdy, mdyx) and two
 * per (slice, channel) partial sums */
static inline uint64_t cuda_bn_workspace_bytes(int64_t pixels, int64_t channels) {
  return (uint64_t)(5 + 2 * cuda_bn_slices(pixels)) * (uint64_t)channels * sizeof(double) +
         CUDA_NN_WS_ALIGN;
}

/* softmax_ce: each sample's loss and hit (doubles), added in sample order
 * by one thread at the end. */
static inline uint64_t cuda_ce_workspace_bytes(int64_t samples) {
  return 2u * (uint64_t)samples * sizeof(double) + CUDA_NN_WS_ALIGN;
}

/* ---- launchers (nn_*.cu) ------------------------------------------------------ */

/* relu, add (nn_ew.cu). accumulate 1: out = out + result (FP16: rounded
 * once after the FP32 addition). */
int cuda_nn_relu_fwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc y, void *py);
int cuda_nn_relu_bwd(void *stream, cuda_nhwc y, const void *py, cuda_nhwc dy, const void *pdy,
                     cuda_nhwc dx, void *pdx, int accumulate);
int cuda_nn_add_fwd(void *stream, cuda_nhwc a, const void *pa, cuda_nhwc b, const void *pb,
                    cuda_nhwc y, void *py);
int cuda_nn_add_bwd(void *stream, cuda_nhwc dy, const void *pdy, cuda_nhwc da, void *pda,
                    cuda_nhwc db, void *pdb, int accumulate);

/* pooling (nn_pool.cu); x stands for dx and y for dy in the backward. */
int cuda_nn_maxpool_fwd(void *stream, cuda_pool g, cuda_nhwc x, const void *px, cuda_nhwc y,
                        void *py, cuda_nhwc mask, void *pmask);
int cuda_nn_maxpool_bwd(void *stream, cuda_pool g, cuda_nhwc dy, const void *pdy, cuda_nhwc mask,
                        const void *pmask, cuda_nhwc dx, void *pdx, int accumulate);
int cuda_nn_avgpool_fwd(void *stream, cuda_pool g, cuda_nhwc x, const void *px, cuda_nhwc y,
                        void *py);
int cuda_nn_avgpool_bwd(void *stream, cuda_pool g, cuda_nhwc dy, const void *pdy, cuda_nhwc dx,
                        void *pdx, int accumulate);
int cuda_nn_gap_fwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc y, void *py);
int cuda_nn_gap_bwd(void *stream, cuda_nhwc dy, const void *pdy, cuda_nhwc dx, void *pdx,
                    int accumulate);

/* batch norm (nn_bn.cu); ws: cuda_bn_workspace_bytes(N*H*W, C) bytes.
 * fwd_train p: gamma, beta, running_mean (in), running_var (in),
 *              save_mean, save_invstd, running_mean (out), running_var (out)
 * fwd_eval  p: gamma, beta, running_mean, running_var
 * bwd       p: gamma, save_mean, save_invstd, dgamma, dbeta */
int cuda_nn_bn_fwd_train(void *stream, cuda_nhwc x, const void *px, cuda_nhwc y, void *py,
                         const cuda_chan p[8], float eps, float momentum, void *ws);
int cuda_nn_bn_fwd_eval(void *stream, cuda_nhwc x, const void *px, cuda_nhwc y, void *py,
                        const cuda_chan p[4], float eps, void *ws);
int cuda_nn_bn_bwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc dy, const void *pdy,
                   cuda_nhwc dx, void *pdx, const cuda_chan p[5], int accumulate, void *ws);

/* softmax_ce.fwd_bwd (nn_ce.cu); z [N,1,1,K], labels [N,1,1,1] INT32 at
 * plab with sample stride lab_stride; loss_scale NULL or the FP32 scalar
 * S; dz NULL without compute_grad; ws: cuda_ce_workspace_bytes(N). */
int cuda_nn_softmax_ce(void *stream, cuda_nhwc z, const void *pz, const int32_t *plab,
                       int64_t lab_stride, const float *loss_scale, float *loss, float *correct,
                       cuda_nhwc dz, void *pdz, float label_smoothing, float grad_scale,
                       void *ws);

/* attention.fwd / .bwd (nn_attn.cu): one block per (sample, head), the
 * head's operands staged in shared memory (bytes below, at most
 * CUDA_ATTN_MAX_SHARED), dh <= CUDA_ATTN_MAX_DH floats of accumulators per
 * thread. q stands for qkv [N,H,W,3D], l for lse [N,H,W,heads] FP32. */
#define CUDA_ATTN_MAX_DH 64
#define CUDA_ATTN_MAX_SHARED (48u * 1024u)
static inline size_t cuda_attn_fwd_shared(int64_t tokens, int64_t dh) {
  return (size_t)(2 * tokens * dh) * sizeof(float);
}
static inline size_t cuda_attn_bwd_shared(int64_t tokens, int64_t dh) {
  return (size_t)(4 * tokens * dh + 2 * tokens) * sizeof(float);
}
int cuda_nn_attention_fwd(void *stream, cuda_nhwc q, const void *pq, cuda_nhwc y, void *py,
                          cuda_nhwc l, float *pl, int heads, int causal);
int cuda_nn_attention_bwd(void *stream, cuda_nhwc q, const void *pq, cuda_nhwc y, const void *py,
                          cuda_nhwc l, const float *pl, cuda_nhwc dy, const void *pdy,
                          cuda_nhwc dq, void *pdq, int heads, int causal, int accumulate);
/* The ViT ops (nn_vit.cu). layernorm: sm, si the FP32 [N,H,W,1]
 * statistics; bwd ws: cuda_ln_workspace_bytes(chunks, C), the chunks of
 * ops/shared/layernorm_steps.h (chunk_len positions each). pos_embed: P
 * and dP [1,H,W,C]. accumulate as above. */
static inline uint64_t cuda_ln_workspace_bytes(int64_t chunks, int64_t channels) {
  return 2u * (uint64_t)chunks * (uint64_t)channels * sizeof(double) + CUDA_NN_WS_ALIGN;
}
int cuda_nn_gelu_tanh_fwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc y, void *py);
int cuda_nn_gelu_tanh_bwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc dy,
                          const void *pdy, cuda_nhwc dx, void *pdx, int accumulate);
int cuda_nn_pos_embed_fwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc P, const void *pP,
                          cuda_nhwc y, void *py);
int cuda_nn_pos_embed_bwd(void *stream, cuda_nhwc dy, const void *pdy, cuda_nhwc dx, void *pdx,
                          cuda_nhwc dP, void *pdP, int accumulate);
int cuda_nn_ln_fwd(void *stream, cuda_nhwc x, const void *px, cuda_chan gain, cuda_chan bias,
                   cuda_nhwc y, void *py, cuda_nhwc sm, void *psm, cuda_nhwc si, void *psi,
                   float eps);
int cuda_nn_ln_bwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc dy, const void *pdy,
                   cuda_chan gain, cuda_nhwc sm, const void *psm, cuda_nhwc si, const void *psi,
                   cuda_nhwc dx, void *pdx, cuda_chan dgain, cuda_chan dbias, int64_t chunk_len,
                   int64_t chunks, int accumulate, void *ws);

#ifndef __CUDACC__
#include "shared/fp16_adapter.h"

/* The descriptors (nn_*.c) that nn.c lists in cuda_nn_kernels. */
extern const bp_abi_kernel cuda_relu_fwd_kernel, cuda_relu_bwd_kernel;
extern const bp_abi_kernel cuda_add_fwd_kernel, cuda_add_bwd_kernel;
extern const bp_abi_kernel cuda_maxpool_fwd_kernel, cuda_maxpool_bwd_kernel;
extern const bp_abi_kernel cuda_avgpool_fwd_kernel, cuda_avgpool_bwd_kernel;
extern const bp_abi_kernel cuda_gap_fwd_kernel, cuda_gap_bwd_kernel;
extern const bp_abi_kernel cuda_bn_fwd_train_kernel, cuda_bn_fwd_eval_kernel, cuda_bn_bwd_kernel;
extern const bp_abi_kernel cuda_softmax_ce_kernel;
extern const bp_abi_kernel cuda_attention_fwd_kernel, cuda_attention_bwd_kernel;
extern const bp_abi_kernel cuda_gelu_tanh_fwd_kernel, cuda_gelu_tanh_bwd_kernel; /* nn_vit.c */
extern const bp_abi_kernel cuda_ln_fwd_kernel, cuda_ln_bwd_kernel;
extern const bp_abi_kernel cuda_pos_embed_fwd_kernel, cuda_pos_embed_bwd_kernel;

/* t as the launchers see it (nn.c). */
cuda_nhwc cuda_nn_tensor(const bp_abi_tensor *t);
cuda_chan cuda_nn_channels(const bp_abi_tensor *t, const void *p);

/* Descriptor fields of this family: device "cuda", impl "cuda", priority
 * 15, deterministic (fixed reduction orders, no atomics) and capturable. */
#define CUDA_NN_PRIORITY 15
#define CUDA_NN_FLAGS (BP_ABI_KERNEL_DETERMINISTIC | BP_ABI_KERNEL_GRAPH_CAPTURABLE)
#define CUDA_NN_F16 (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16))
#define CUDA_NN_KERNEL(op_name, supports_fn, workspace_fn, run_fn, user_ptr, extra_flags,        \
                       dtype_mask)                                                               \
  {                                                                                              \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = "cuda", .device = "cuda",    \
    .dtypes = (dtype_mask), .priority = CUDA_NN_PRIORITY, .flags = CUDA_NN_FLAGS | (extra_flags), \
    .supports = (supports_fn), .workspace_size = (workspace_fn), .run = (run_fn),               \
    .user = (void *)(user_ptr)                                                                   \
  }

/* What the reference accepts, with its reasons, FP16 tensors included:
 * the reference's FP32 check applied through the FP16 adapter's
 * supports() (ops/shared/fp16_adapter.h), which checks every FP16 tensor
 * and asks the FP32 check about the compact FP32 view of the call, exactly
 * as the reference's descriptors do. Only that check is used: the kernels
 * read FP16 themselves. A kernel's `user` is its record:
 *   static const ops_fp16_kernel rec = CUDA_NN_CHECK16(check, acc_offset, pairs...);
 *   CUDA_NN_KERNEL(op, ops_fp16_supports, ws_fn, run_fn, &rec, flags, dtypes) */
#define CUDA_NN_CHECK16_ALIAS(check_fn, acc_offset, n_alias, out0, in0, out1, in1)              \
  {                                                                                              \
    .supports = (check_fn), .accumulate_offset = (acc_offset), .alias_count = (n_alias),        \
    .alias_out = {(out0), (out1)}, .alias_in = {(in0), (in1)},                                  \
    .convert = ops_fp16_convert_scalar                                                           \
  }
#define CUDA_NN_CHECK16(check_fn, acc_offset) \
  CUDA_NN_CHECK16_ALIAS(check_fn, acc_offset, 0, 0, 0, 0, 0)

/* run()'s checks (nn.c) with the host's reason buffer: the record's
 * supports() (user), then the pointers (bp_sdk_check_ptrs with the
 * record's "may alias" pairs). 1 when the call may run. */
int cuda_nn_run_ok(void *user, const bp_abi_kernel_args *args);
/* 1 when args->workspace holds `need` bytes, else 0 with a reason. */
int cuda_nn_workspace_ok(const bp_abi_kernel_args *args, uint64_t need);
#endif

#ifdef __cplusplus
}
#endif

#endif
