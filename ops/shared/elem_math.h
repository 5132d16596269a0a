/* Per-element formulas that the CPU kernels and the CUDA kernels share:
 * optimizer updates, casts, loss-scale logic, batch-norm and loss steps.
 * Each is a static inline function that compiles as C11 (the reference
 * and ops/cpu call it, so the CPU suites test the math) and under nvcc as
 * __host__ __device__ (ops/cuda's kernels call it, so a GPU run tests only
 * the indexing around it). Same expression, same operation order: the CPU
 * and the GPU round the same way wherever the hardware does (no FMA
 * contraction is assumed: CUDA builds pass --fmad=false for files that
 * need the CPU's bits).
 *
 * Keep every function free of libc calls other than the <math.h> ones
 * that CUDA provides as device functions (sqrtf, fabsf, expf, logf). */
#ifndef BP_OPS_SHARED_ELEM_MATH_H
#define BP_OPS_SHARED_ELEM_MATH_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define BP_HD __host__ __device__ static inline
#else
#define BP_HD static inline
#endif

/* ---- range ops: casts, unscale, optimizer updates, EMA, loss scale ------- */

/* ---- layer ops: batch norm, relu, pooling, softmax cross-entropy -------- */

#endif
