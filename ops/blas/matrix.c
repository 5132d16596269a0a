/* Matrix views of tensors, the small loops around the GEMMs of the BLAS
 * op modules and the symbol lookup of their providers; see blas-impl.h. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "blas-impl.h"

int blas_view(const bp_abi_tensor *t, int split, const char *name, const char *row_what,
              blas_mat *m, char *reason, size_t reason_size) {
  /* columns: adjacent, innermost first */
  int64_t cols = 1;
  for (int d = 3; d >= split; d--) {
    if (t->shape[d] > 1 && t->stride[d] != cols)
      return bp_sdk_fail(reason, reason_size,
                         "%s: device strides [%lld,%lld,%lld,%lld] (padded_c %lld) do not form a "
                         "matrix of %s with adjacent values; the reference kernel serves this "
                         "layout",
                         name, (long long)t->stride[0], (long long)t->stride[1],
                         (long long)t->stride[2], (long long)t->stride[3], (long long)t->padded_c,
                         row_what);
    cols *= t->shape[d];
  }
  /* rows: evenly spaced */
  int64_t rows = 1, ld = -1, next = 0;
  for (int d = split - 1; d >= 0; d--) {
    rows *= t->shape[d];
    if (t->shape[d] == 1) continue;
    if (ld < 0) {
      ld = t->stride[d];
    } else if (t->stride[d] != next) {
      return bp_sdk_fail(reason, reason_size,
                         "%s: device strides [%lld,%lld,%lld,%lld] do not space the %s evenly; the "
                         "reference kernel serves this layout",
                         name, (long long)t->stride[0], (long long)t->stride[1],
                         (long long)t->stride[2], (long long)t->stride[3], row_what);
    }
    next = t->stride[d] * t->shape[d]; /* cannot overflow: bp_sdk_check_tensor bounded the span */
  }
  if (ld < cols) ld = cols; /* one row (any stride), or nested strides give ld >= cols anyway */
  m->rows = rows, m->cols = cols, m->ld = ld;
  return 1;
}

int blas_check_int(int64_t v, const char *what, char *reason, size_t reason_size) {
  if (v < 0 || v > INT_MAX)
    return bp_sdk_fail(reason, reason_size, "%s is %lld, beyond the 32-bit BLAS interface", what,
                       (long long)v);
  return 1;
}

int blas_check_workspace(const bp_abi_kernel_args *args, uint64_t bytes, char *reason,
                         size_t rs) {
  if (!BP_SDK_HAS_FIELD(args, bp_abi_kernel_args, workspace_bytes) || !args->workspace ||
      args->workspace_bytes < bytes || (uintptr_t)args->workspace % sizeof(float) != 0)
    return bp_sdk_fail(reason, rs, "needs a 4-byte aligned workspace of %llu bytes, got %llu",
                       (unsigned long long)bytes,
                       (unsigned long long)(args->workspace ? args->workspace_bytes : 0));
  /* the workspace is the kernel's alone */
  const uintptr_t w0 = (uintptr_t)args->workspace, w1 = w0 + (uintptr_t)bytes;
  for (int o = 0; o < args->num_outputs; o++) {
    const uintptr_t o0 = (uintptr_t)args->output_ptrs[o];
    if (o0 < w1 && w0 < o0 + bp_sdk_output(args, o)->slot_bytes)
      return bp_sdk_fail(reason, rs, "the workspace overlaps output %d", o);
  }
  for (int i = 0; i < args->num_inputs; i++) {
    const uintptr_t i0 = (uintptr_t)args->input_ptrs[i];
    if (i0 < w1 && w0 < i0 + bp_sdk_input(args, i)->slot_bytes)
      return bp_sdk_fail(reason, rs, "the workspace overlaps input %d", i);
  }
  return 1;
}

int blas_needs_pad(int64_t ld, int64_t m, int64_t n, int64_t k) {
  return BLAS_PAD_POW2_LD && ld % BLAS_PAD_MODULUS == 0 && m >= BLAS_PAD_MIN_EXTENT &&
         n >= BLAS_PAD_MIN_EXTENT && k >= BLAS_PAD_MIN_EXTENT;
}

int blas_one_thread(int64_t m, int64_t n, int64_t k) {
  /* m*n*k < limit without overflow: each extent fits a BLAS int
   * (blas_check_int), so m*n fits int64_t, and m*n*k <= limit - 1 exactly
   * when m*n <= (limit - 1) / k */
  return k == 0 || m * n <= (BLAS_ONE_THREAD_MACS - 1) / k;
}

int64_t blas_padded_ld(int64_t cols) {
  const int64_t ld = (cols + 15) / 16 * 16;
  return ld % BLAS_PAD_MODULUS == 0 ? ld + 16 : ld;
}

uint64_t blas_padded_bytes(int64_t rows, int64_t cols) {
  return ((uint64_t)rows * (uint64_t)blas_padded_ld(cols) * sizeof(float) + 63) / 64 * 64;
}

void blas_copy_padded(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t ldd = blas_padded_ld(cols);
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + r * ldd, src + r * ld, (size_t)cols * sizeof *dst);
}

void blas_fill_rows(float *y, int64_t ld, int64_t rows, int64_t cols, const float *bias,
                    int64_t bias_stride) {
  for (int64_t r = 0; r < rows; r++) {
    float *row = y + r * ld;
    for (int64_t c = 0; c < cols; c++) row[c] = bias[c * bias_stride];
  }
}

/* Columns are summed in blocks of SUM_BLOCK, row by row, so dy is read once
 * per block and not once per column; each column still sums its rows in
 * row order. */
#define SUM_BLOCK 256
void blas_sum_rows(const float *dy, int64_t ld, int64_t rows, int64_t cols, float *db,
                   int64_t db_stride, int accumulate) {
  double sum[SUM_BLOCK];
  for (int64_t c0 = 0; c0 < cols; c0 += SUM_BLOCK) {
    const int64_t nc = cols - c0 < SUM_BLOCK ? cols - c0 : SUM_BLOCK;
    for (int64_t c = 0; c < nc; c++) sum[c] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      const float *row = dy + r * ld + c0;
      for (int64_t c = 0; c < nc; c++) sum[c] += row[c];
    }
    for (int64_t c = 0; c < nc; c++) {
      float *o = db + (c0 + c) * db_stride;
      *o = accumulate ? (float)(*o + sum[c]) : (float)sum[c];
    }
  }
}

int blas_symbol(void *lib, const char *lib_name, const char *name, void *fn, size_t fn_size,
                char *reason, size_t reason_size) {
  void *p = dlsym(lib, name);
  if (!p) {
    snprintf(reason, reason_size, "%s has no symbol %s", lib_name, name);
    return 0;
  }
  memcpy(fn, &p, fn_size); /* not a cast: ISO C leaves object-to-function casts undefined */
  return 1;
}
