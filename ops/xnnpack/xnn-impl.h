/* Internal to the XNNPACK op module (ops/xnnpack): the per-node state every
 * kernel keeps, the shared thread pools, FP16 availability, and the
 * kernel descriptors module.c registers.
 *
 * Every kernel follows one pattern (README.md):
 *  - supports(): the in-tree checks (ops/shared), then XNNPACK's own limits;
 *  - prepare(): a node state (xnn_node) holding the rank's thread pool and,
 *    for ops without weights, the operator itself;
 *  - run(): (re)creates the operator when it packs weights and the
 *    parameter generation moved since it packed (conv2d, fc), calls
 *    setup only when a pointer or the batch changed, then runs it. */
#ifndef BP_OPS_XNNPACK_IMPL_H
#define BP_OPS_XNNPACK_IMPL_H

#include <pthreadpool.h>
#include <xnnpack.h>

#include "bp_abi_sdk.h"

/* A pthreadpool shared by every node bound with the same host thread
 * service (one per rank), counted by the nodes that hold it. NULL pool:
 * one thread (XNNPACK then runs on the calling thread). */
typedef struct xnnp_pool xnnp_pool;
/* The pools live in the module's context (module.c: one per registry that
 * loads the module, made by init_ctx); every kernel's user is an
 * xnnp_user pointing at that context and at what the static descriptor
 * carried as user (conv_fc.c's weighted_op, or NULL). */
typedef struct xnnp_ctx xnnp_ctx;
typedef struct xnnp_user {
  xnnp_ctx *ctx;
  const void *inner; /* the static descriptor's user */
} xnnp_user;
static inline const void *xnnp_inner(const void *user) {
  return user ? ((const xnnp_user *)user)->inner : NULL;
}
xnnp_pool *xnnp_pool_acquire(xnnp_ctx *ctx, const bp_abi_threads *threads); /* NULL on failure */
void xnnp_pool_release(xnnp_pool *p);                        /* NULL ok */
pthreadpool_t xnnp_pool_handle(const xnnp_pool *p);

/* The state of one (variant, node, rank). */
typedef struct xnn_node {
  xnn_operator_t op;        /* NULL until created */
  xnnp_pool *pool;          /* the rank's pool */
  int packed;               /* 1: op holds weights packed at `generation` */
  uint64_t generation;      /* params_generation the weights were packed at */
  uint64_t packs;           /* how many times weights were packed (tests, logs) */
  const void *set_in[2];    /* pointers and batch of the last setup */
  void *set_out, *set_extra;
  int64_t set_batch;
  void *dense;              /* dense copy of padded weights / bias, or NULL */
  size_t dense_bytes;
} xnn_node;

/* A fresh state holding the rank's pool (args->threads) from user's
 * context; BP_ABI_OK or an error with args->reason written. */
int xnn_node_create(void *user, const bp_abi_kernel_args *args, xnn_node **out);
void xnn_node_release(void *user, void *state); /* bp_abi_kernel.release */
/* Creates an operator in a node state (a kernel's part of prepare()). */
typedef int (*xnn_node_create_fn)(xnn_node *s, const bp_abi_kernel_args *args);
/* prepare(): a fresh state, then create(s, args) when create is not NULL. */
int xnn_node_prepare(void *user, const bp_abi_kernel_args *args, void **state_out,
                     xnn_node_create_fn create);
/* The state for run(): the prepared one (args->state), or, for a caller
 * that skipped prepare, a temporary one made like xnn_node_prepare that
 * *tmp owns and the caller releases after the run. */
int xnn_node_for_run(void *user, const bp_abi_kernel_args *args, xnn_node **s, xnn_node **tmp,
                     xnn_node_create_fn create);
/* Deletes the operator and forgets the setup (before a re-create). */
void xnn_node_drop_op(xnn_node *s);
/* 1 when the setup recorded in s matches these pointers and batch (then
 * setup is skipped); else records them and returns 0. */
int xnn_node_setup_current(xnn_node *s, const void *in0, const void *in1, void *out,
                           void *extra, int64_t batch);

/* "xnn_status_..." for messages. */
const char *xnn_status_name(enum xnn_status st);

/* FP16 operators: 1 when this XNNPACK built them and the CPU runs them
 * (probed at init: create returns xnn_status_unsupported_hardware
 * otherwise); the reason supports() gives when they are not. */
int xnnp_fp16_available(void);
const char *xnnp_fp16_reason(void);

/* The checks of the FP32 in-tree kernels (ops/shared) take FP32 tensors
 * only. For an FP16 call, a copy of its descriptors with the dtype made
 * FP32 and slot_bytes doubled passes those geometry checks exactly when
 * the FP16 tensors would; each real tensor is then checked as FP16. */
typedef struct xnnp_args_view {
  bp_abi_kernel_args args;
  bp_abi_tensor tensors[8];
} xnnp_args_view;
/* Fills v from args with every FP16 tensor seen as FP32; returns the
 * common dtype of the float tensors (FP32 or FP16), or -1 with a reason
 * when they mix or one has another dtype (int8 mask excepted). */
int xnnp_view_as_fp32(const bp_abi_kernel_args *args, xnnp_args_view *v, char *reason,
                      size_t rs);

/* 1 when t has the plan's dense NHWC strides over padded_c (channels
 * contiguous, pixels padded_c apart, rows and images packed). */
int xnnp_standard_nhwc(const bp_abi_tensor *t, const char *name, char *reason, size_t rs);

/* Reports an XNNPACK failure of `what` into args->reason; returns the ABI
 * error (unsupported hardware -> UNSUPPORTED, out of memory -> NOMEM, else
 * INVALID). */
int xnnp_fail(const bp_abi_kernel_args *args, const char *what, enum xnn_status st);

/* The kernels (conv_fc.c, pool.c, elementwise.c). */
extern const bp_abi_kernel xnnp_conv2d_fwd, xnnp_fc_fwd, xnnp_maxpool_fwd, xnnp_avgpool_fwd,
    xnnp_global_avgpool_fwd, xnnp_relu_fwd, xnnp_add_fwd;

/* Priorities, from bench/forward_kernels.c (bench/RESULTS.md, issue 14):
 *  - XNNP_PRIORITY (15, the library tier's XNNPACK slot): add, avgpool,
 *    global_avgpool, where only the reference competes (4-10x faster);
 *  - XNNP_PRIORITY_BELOW_BLAS (9): conv2d and fc, which OpenBLAS and oneDNN
 *    beat 1.5-2x on the 3x3 convolutions of 16-64 channels and on the fcs
 *    at batch 128 and 200; XNNPACK serves where neither BLAS module is
 *    built, and autotune picks it per node where it wins (the first
 *    convolution of one channel: 1.2-3.3x);
 *  - XNNP_PRIORITY_BELOW_CPU (4): maxpool (its mask pass makes it slower
 *    than ops/cpu's) and relu (on par with ops/cpu's, but it turns NaN into
 *    0, which would hide a diverging run from the NaN checks).
 * Pins (--kernels) and autotune override all of them. */
#define XNNP_PRIORITY (BP_ABI_PRIORITY_LIBRARY + 5)
#define XNNP_PRIORITY_BELOW_BLAS (BP_ABI_PRIORITY_LIBRARY - 1)
#define XNNP_PRIORITY_BELOW_CPU (BP_ABI_PRIORITY_PORTABLE - 1)
#define XNNP_FLAGS BP_ABI_KERNEL_DETERMINISTIC
#define XNNP_DTYPES (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16))

#endif
