/* Private helpers of the BLAS op module (ops/blas/). Nothing here is
 * exported: the module is built with -fvisibility=hidden and only the ABI
 * entry (module.c) is visible.
 *
 * The module validates its arguments with the reference module's checks
 * (the module SDK, abi/bp_abi_sdk.h, and ops/shared/weighted_check.h), so
 * it accepts exactly the nodes the reference accepts, minus the layouts
 * listed below, which its supports() refuses with a reason and the
 * reference kernel then serves.
 *
 * Layouts. Every GEMM operand is a row-major matrix taken straight from the
 * device pointer with a leading dimension (blas_view):
 *  - conv y and dy: N*OH*OW rows of K channels. Channel padding
 *    (padded_c > K) is fine: it only widens the leading dimension, and the
 *    padding is never read or written. Refused: strides whose rows are not
 *    evenly spaced (stride[1] != OW*stride[2] or stride[0] !=
 *    OH*stride[1]) or whose channels are not adjacent (stride[3] != 1).
 *  - conv filters (w, dw): K rows of kh*kw*C/G values, which must be
 *    adjacent, so a padded filter (padded_c > C/G) is refused unless the
 *    kernel is 1x1.
 *  - fc x / dx: N rows of H*W*C features, which must be adjacent, so a
 *    padded input (padded_c > C) is refused unless H = W = 1. fc w, dw, y,
 *    dy: any channel padding.
 *  - conv x and dx may have any strides the reference accepts: im2col
 *    gathers x and col2im scatters into dx through the strides; only the
 *    paths that use them in place (1x1 / stride 1 / no padding; the
 *    flipped stride-1 backward-data) need a matrix, and fall back to
 *    im2col / col2im when they are not one.
 *  - Every matrix extent and leading dimension must fit in a 32-bit BLAS
 *    int.
 *
 * Determinism: results depend on the inputs, the library's thread count
 * and its kernel set (fixed per machine: OpenBLAS's picked from the CPU's
 * features at load, openblas.c, or named by OPENBLAS_CORETYPE; oneDNN's
 * JIT picks from the CPU's ISA). Either library's threads split a GEMM the
 * same way for the same shape and thread count, and every other sum here
 * runs in a fixed order; so with a fixed thread count (the rank's share
 * the host lends, module.c; BP_THREADS fixes it; one for small GEMMs,
 * BLAS_ONE_THREAD_MACS) the same
 * inputs give the same bits, however many ranks call at once
 * (tests/test_ops_blas.c checks both, for each module). */
#ifndef BP_OPS_BLAS_IMPL_H
#define BP_OPS_BLAS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "bp_abi.h"
#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"
#include "shared/fp16_convert_x86.h"
#include "shared/weighted_check.h"

/* Two modules are built from these sources, one per GEMM library (the
 * "provider"), loaded at init rather than linked:
 *   bp_ops_blas.so  impl "blas", OpenBLAS's cblas_sgemm (openblas.c),
 *                   priority 10;
 *   bp_ops_dnnl.so  impl "dnnl", oneDNN's dnnl_sgemm (onednn.c), built with
 *                   BLAS_PROVIDER_DNNL, priority 12: where both load, the
 *                   registry prefers it (its SGEMMs are 15-25% faster on
 *                   the fc and conv shapes here, most at small batches:
 *                   bench/RESULTS.md), and a pin picks either. */
#ifdef BLAS_PROVIDER_DNNL
#define BLAS_IMPL "dnnl"
#define BLAS_MODULE_NAME "ops-dnnl"
#define BLAS_PRIORITY 12
#else
#define BLAS_IMPL "blas"
#define BLAS_MODULE_NAME "ops-blas"
#define BLAS_PRIORITY 10
#endif
#define BLAS_DEVICE "cpu"
#define BLAS_FLAGS BP_ABI_KERNEL_DETERMINISTIC /* with a fixed BLAS thread count (above) */

/* im2col chunking (conv2d.c). The column buffer holds the im2col rows of
 * `images` whole images at once, images = clamp(BLAS_COL_TARGET_BYTES /
 * bytes of one image's rows, 1, N); that is the kernel's workspace. An
 * image whose rows alone exceed BLAS_COL_MAX_BYTES is refused. 1 MiB keeps
 * a chunk in a core's L2 cache while the GEMM reads it (measured against
 * 512 KiB, 2 and 4 MiB on the CNN's convolutions). */
#define BLAS_COL_TARGET_BYTES (UINT64_C(1) << 20)
#define BLAS_COL_MAX_BYTES (UINT64_C(1) << 30)

/* A tensor read as a row-major matrix: dimensions [0, split) are the rows,
 * dimensions [split, 4) the columns. */
typedef struct blas_mat {
  int64_t rows, cols; /* products of the extents */
  int64_t ld;         /* elements from one row to the next (>= cols) */
} blas_mat;

/* 1 and *m when t (already through bp_sdk_check_tensor) is such a matrix: the
 * column dimensions adjacent in order (stride 1 for the last, each other
 * the span of those inside it) and the row dimensions evenly spaced;
 * dimensions of extent 1 carry any stride. Else 0 with a reason naming
 * `name` and what a row holds (`row_what`, e.g. "N*H*W rows of C channels"). */
int blas_view(const bp_abi_tensor *t, int split, const char *name, const char *row_what,
              blas_mat *m, char *reason, size_t reason_size);

/* 1 if v fits a BLAS int (and is >= 0), else 0 with a reason naming it. */
int blas_check_int(int64_t v, const char *what, char *reason, size_t reason_size);

/* What run() checks of a workspace of `bytes` (> 0) bytes: present, that
 * large, 4-byte aligned, overlapping no input or output. 1, or 0 with a
 * reason. */
int blas_check_workspace(const bp_abi_kernel_args *args, uint64_t bytes, char *reason,
                         size_t reason_size);

/* Leading dimensions that are a multiple of BLAS_PAD_MODULUS floats (1 KiB:
 * 512-wide fc layers) slow dnnl_sgemm down where it packs an operand down
 * its columns: the rows of a column fall into the same few L1 sets. On the
 * MLP's 512x512 layers (bench/fc_gemms.c's output) that is
 * backward-data's W (N/N: 47-50 GFLOP/s on one thread against 72-88 with
 * W's rows 16 floats apart more) and both operands of backward-filter
 * (T/N: 42-54 against 70-83); forward (N/T) runs at full speed either way.
 * Where the provider sets BLAS_PAD_POW2_LD, fc.c copies those operands into
 * the workspace with blas_padded_ld's leading dimension first (a copy of
 * at most a few MiB, a few percent of the GEMM); the GEMM then reads the
 * same values and returns the same bits (dnnl_sgemm's sums do not depend
 * on the leading dimension; tests/test_ops_blas.c checks it). */
#define BLAS_PAD_MODULUS 256
/* ... but only for a GEMM whose m, n and k are all at least
 * BLAS_PAD_MIN_EXTENT: with fewer rows down a column (fc3's backward-data,
 * k = O = 10) nothing conflicts, and with a packed operand reused over
 * fewer rows of the other (fc3's backward-filter, m = O = 10) the copy
 * costs what the faster packing saves: on one thread m n k = 10 512 128
 * ran 22 us with or without the copy, on two 35-42 us with it against
 * 31-35 without; m = 32 already gained 10-20%
 * (bench/RESULTS.md, "Small fc GEMMs on oneDNN"). The rule looks at the
 * shape alone, and the copy never changes bits. */
#define BLAS_PAD_MIN_EXTENT 32
#ifdef BLAS_PROVIDER_DNNL
#define BLAS_PAD_POW2_LD 1
#else
#define BLAS_PAD_POW2_LD 0 /* OpenBLAS runs these shapes at the same speed padded or not */
#endif

/* 1 when an operand with leading dimension ld of an m x n x k GEMM is
 * copied (BLAS_PAD_POW2_LD, BLAS_PAD_MIN_EXTENT). */
int blas_needs_pad(int64_t ld, int64_t m, int64_t n, int64_t k);
/* The leading dimension of the padded copy of a matrix with `cols`
 * columns: cols rounded up to 16 floats (64 bytes), plus 16 when that is a
 * multiple of BLAS_PAD_MODULUS. */
int64_t blas_padded_ld(int64_t cols);
/* Bytes of the padded copy of a rows x cols matrix, rounded up to 64. */
uint64_t blas_padded_bytes(int64_t rows, int64_t cols);
/* Copies rows x cols of src (leading dimension ld) into dst with leading
 * dimension blas_padded_ld(cols). */
void blas_copy_padded(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld);

/* Sets every row r < rows of the matrix at y (leading dimension ld) to
 * bias[c * bias_stride], c < cols: the C that a GEMM with beta = 1 then
 * adds to. */
void blas_fill_rows(float *y, int64_t ld, int64_t rows, int64_t cols, const float *bias,
                    int64_t bias_stride);

/* db[k * db_stride] (+)= sum of column k < cols over rows of dy (leading
 * dimension ld), summed in double in row order and rounded once, as the
 * reference does. */
void blas_sum_rows(const float *dy, int64_t ld, int64_t rows, int64_t cols, float *db,
                   int64_t db_stride, int accumulate);

/* dlsym(lib, name) into the function pointer at fn (fn_size bytes; POSIX
 * guarantees the representation): 1, or 0 with a reason naming lib_name. */
int blas_symbol(void *lib, const char *lib_name, const char *name, void *fn, size_t fn_size,
                char *reason, size_t reason_size);

/* The provider (openblas.c or onednn.c). */
/* Loads the library: 1, or 0 with a reason. `host` lends the module
 * options (oneDNN: "dnnl_library", another library file to open). */
int blas_provider_load(const bp_abi_host *host, char *reason, size_t reason_size);
/* Threads for the GEMMs of the calling thread from now on (>= 1; 0 keeps
 * the current count). Called before every run with the rank's count
 * (module.c); cheap when the count is already in force. */
void blas_provider_use_threads(int threads);
/* One line for the log: the library, its version or configuration, its
 * kernel set where it says, and its current thread count. */
void blas_provider_describe(char *text, size_t size);

/* Small GEMMs run on one thread: on oneDNN, a GEMM with m*n*k below
 * BLAS_ONE_THREAD_MACS runs on the calling thread alone whatever the
 * rank's count (onednn.c). Waking the OpenMP worker (a futex under the
 * passive wait policy the CLI sets, docs/training.md) and the barrier
 * after cost more than the second thread saves: the MLP's fc3 GEMMs
 * (m n k = 128 10 512 and its transposes) took 20-29 us on one thread
 * against 34-46 us on two (bench/fc_gemms.c, minima; 22-31 against 45-57
 * us right after a 2-thread fc2 GEMM), and m*n*k = 2^21 (O = 32) still
 * ran faster on one (bench/RESULTS.md, "Small fc GEMMs on oneDNN"). The
 * rule looks at the shape alone, so the bits stay a function of the shape
 * and the rank's count; shapes under it get the same bits on any count
 * (tests/test_ops_blas.c).
 * OpenBLAS makes the same choice itself (its own threshold), and its count
 * is one per process, so openblas.c leaves it alone. */
#define BLAS_ONE_THREAD_MACS (INT64_C(1) << 21)
/* 1 when an m x n x k GEMM runs on one thread (BLAS_ONE_THREAD_MACS). */
int blas_one_thread(int64_t m, int64_t n, int64_t k);

/* C = A*B (+ C with beta = 1; beta = 0 overwrites) on row-major operands,
 * with every extent and leading dimension already checked by
 * blas_check_int. BP_ABI_OK, or the error the library reported. */
int blas_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a,
               int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* Returns from the calling kernel with the status of a blas_sgemm that
 * failed. */
#define BLAS_TRY(call)                   \
  do {                                   \
    const int blas_rc_ = (call);         \
    if (blas_rc_ != BP_ABI_OK) return blas_rc_; \
  } while (0)

/* The kernels, one descriptor each (conv2d.c, fc.c, attention.c, gelu_tanh.c). */
extern const bp_abi_kernel blas_conv2d_fwd, blas_conv2d_bwd_data, blas_conv2d_bwd_filter;
extern const bp_abi_kernel blas_fc_fwd, blas_fc_bwd_data, blas_fc_bwd_filter;
/* The ViT's float loops, no GEMM library call (attention.c, gelu_tanh.c,
 * blas-simd.h): within validate's tolerance of the reference, not its bits. */
extern const bp_abi_kernel blas_attention_fwd, blas_attention_bwd;
extern const bp_abi_kernel blas_gelu_tanh_fwd, blas_gelu_tanh_bwd;

/* Every kernel also takes FP16 tensors (features, weights, gradients;
 * mixed with FP32 ones) through the FP16 adapter (shared/fp16_adapter.h):
 * compact FP32 copies of the FP16 tensors in the workspace (so the padded
 * layouts refused above are fine when FP16), the FP32 GEMM path, each FP16
 * output rounded once to nearest even, F16C conversions where the CPU has
 * them (shared/fp16_convert_x86.h). FP32 calls go straight to the FP32
 * kernel. BLAS_FP16 makes the adapter's record (accumulate flag offset or
 * OPS_FP16_NO_ACCUMULATE), BLAS_KERNEL the descriptor. */
#define BLAS_FP16(supports_fn, workspace_fn, run_fn, acc_offset)                              \
  {                                                                                          \
    .supports = (supports_fn), .workspace_size = (workspace_fn), .run = (run_fn),           \
    .accumulate_offset = (acc_offset), .convert = ops_fp16_convert_fast                     \
  }
#define BLAS_KERNEL(op_name, fp16_kernel)                                                     \
  {                                                                                          \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = BLAS_IMPL,               \
    .device = BLAS_DEVICE,                                                                   \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16),     \
    .priority = BLAS_PRIORITY, .flags = BLAS_FLAGS, OPS_FP16_FUNCS(&(fp16_kernel))           \
  }

#endif
