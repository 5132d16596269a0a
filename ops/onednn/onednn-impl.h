/* Internal to the oneDNN convolution module (ops/onednn): the CPU engine
 * and thread control module.c owns, and the kernel descriptors it
 * registers (conv2d.c). Nothing here is exported.
 *
 * The module links Debian's libdnnl (2.x C API) and uses its convolution
 * primitives directly: NHWC activations, filters in whatever blocked
 * layout oneDNN's JIT kernel picks (README.md). */
#ifndef BP_OPS_ONEDNN_IMPL_H
#define BP_OPS_ONEDNN_IMPL_H

#include <oneapi/dnnl/dnnl.h>

#include "bp_abi.h"
#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"

/* The CPU engine every state shares (created at init; oneDNN allows
 * primitives of one engine to run from several threads at once, each on its
 * own stream). */
dnnl_engine_t odnn_engine(void);

/* Debian's oneDNN runs its threads on OpenMP, whose thread count is per
 * calling thread: applies `threads` in the calling thread (before a
 * primitive is made, and before it runs with the count it was made for);
 * cheap when already in force. */
void odnn_use_threads(int threads);

/* The ABI error for a oneDNN status (out of memory -> NOMEM, else INVALID). */
int odnn_error(dnnl_status_t st);

/* Priority 13: above the im2col + dnnl_sgemm kernels of ops/blas "dnnl"
 * (12), so these serve every convolution they support. They are faster
 * (bench_conv_kernels --impls, README.md: the sum of a training step's
 * convolutions at batch 128, CNN 1.04x with one thread, 2.3x with two;
 * ResNet-8 1.33x and 2.0x). */
#define ODNN_PRIORITY (BP_ABI_PRIORITY_LIBRARY + 3)

extern const bp_abi_kernel odnn_conv2d_fwd, odnn_conv2d_bwd_data, odnn_conv2d_bwd_filter;

#endif
