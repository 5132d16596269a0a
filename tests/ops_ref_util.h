/* Helpers of the reference op module tests (test_ops_*.c): loading the
 * module, host tensors with device strides, running kernels (once, or as a
 * prepared node), and the finite difference check of backward kernels. */
#ifndef BP_TESTS_OPS_REF_UTIL_H
#define BP_TESTS_OPS_REF_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "blueprint/registry.h"
#include "bp_abi.h"
#include "bp_abi_ops.h"

/* The registry holding the module, loaded from BP_OPS_REFERENCE_PATH
 * (bp_registry_load) on first use; fails the test when loading fails. */
bp_registry *ops_registry_get(void);
/* The reference kernel of `op` (impl "reference", device "cpu") from it;
 * fails the test when missing. */
const bp_abi_kernel *ops_kernel(const char *op);
/* The same for implementation `impl` (of a module the test loaded into
 * that registry too). */
const bp_abi_kernel *ops_kernel_impl(const char *op, const char *impl);
/* That registry with the module file `path` loaded into it too (once per
 * path, whichever test asks first); fails the test when loading fails. */
bp_registry *ops_registry_with(const char *path);

/* A host tensor laid out like a device one: NHWC, padded_c = c + extra_c,
 * strides from padded_c. Logical elements start as 0; padding channels
 * hold a sentinel (a NaN payload for FP32, 0x5a bytes otherwise) so a
 * kernel that reads padding produces NaN and one that writes it is caught
 * by tt_padding_intact. */
typedef struct tt {
  bp_abi_tensor d;
  void *data; /* d.slot_bytes bytes */
} tt;

tt tt_new(int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c, int64_t extra_c);
void tt_free(tt *t);
int64_t tt_count(const tt *t); /* logical elements */
/* Element (n,h,w,c). */
float *tt_f(const tt *t, int64_t n, int64_t h, int64_t w, int64_t c);
int32_t *tt_i32(const tt *t, int64_t n, int64_t h, int64_t w, int64_t c);
int8_t *tt_i8(const tt *t, int64_t n, int64_t h, int64_t w, int64_t c);
/* Logical element i in compact NHWC order. */
float *tt_at(const tt *t, int64_t i);
/* Sets the logical elements from compact NHWC values. */
void tt_set(tt *t, const float *values);
/* Logical elements uniform in [lo, hi). */
void tt_rand(tt *t, uint64_t *rng, double lo, double hi);
/* Logical elements with |v| in [lo, hi), random sign (away from kinks). */
void tt_rand_away(tt *t, uint64_t *rng, double lo, double hi);
void tt_copy(tt *dst, const tt *src); /* logical elements; same shape */
int tt_padding_intact(const tt *t);
double tt_rand_unit(uint64_t *rng); /* uniform [0, 1) */
/* A float's bits and back (memcpy: no aliasing games). */
uint32_t bits_of(float f);
float float_of(uint32_t b);

/* Arguments of one kernel call. */
typedef struct ops_call {
  const char *op;
  tt *in[6];
  tt *out[6];
  int nin, nout;
  const void *attrs;
  uint32_t attr_size;
} ops_call;

/* A call's argument block and the arrays it points at. */
typedef struct ops_args {
  bp_abi_tensor in[6], out[6];
  const void *in_ptrs[6];
  void *out_ptrs[6];
  bp_abi_kernel_args args;
} ops_args;
/* The call's args (world 1); pointers only `with_ptrs` (supports() gets none). */
void ops_args_make(ops_args *a, const ops_call *call, int with_ptrs);

/* The impl bp_registry_select picks for the call on the cpu from the
 * registry (pins NULL: the registry's default pins, none here); the selection report into
 * `report` when given. Fails the test when nothing is selected. */
const char *ops_selected_impl(const ops_call *call, const char *pins, char *report,
                              size_t report_size);

/* supports() of kernel k for the call; reason filled when it says no. */
int ops_kernel_supports(const bp_abi_kernel *k, const ops_call *call, char *reason,
                        size_t reason_size);
/* run() of kernel k with workspace ws (NULL, 0: none); returns its status. */
int ops_kernel_run(const bp_abi_kernel *k, const ops_call *call, void *ws, uint64_t ws_bytes);

/* supports() of the call's kernel; reason filled when it says no. */
int ops_supports(const ops_call *call, char *reason, size_t reason_size);
/* run() of the call's kernel, with supports() asserted first. */
void ops_run(const ops_call *call);
/* run() without the supports() assertion; returns its status. */
int ops_run_raw(const ops_call *call);
/* Asserts supports() says no with a reason containing `needle`. */
void ops_expect_refused(const ops_call *call, const char *needle);

/* One prepared node of a kernel, as a binding keeps it: its args, the
 * workspace it asked for, its state, its parameter generation (1 at open;
 * a test bumps it to announce new parameters) and its reason buffer. */
typedef struct ops_node {
  const bp_abi_kernel *k;
  ops_args a;
  void *ws, *state;
  uint64_t generation;
  char reason[256];
} ops_node;
/* Opens a node of kernel `impl` for the call on `threads` (NULL: one
 * thread): supports() must accept it (with those threads), its workspace is
 * allocated, prepare() runs where the kernel has one. Fails the test
 * otherwise. */
void ops_node_open(ops_node *n, const char *impl, const ops_call *c,
                   const bp_abi_threads *threads);
void ops_node_run(ops_node *n);   /* run(); fails the test unless it succeeds */
void ops_node_close(ops_node *n); /* release() and the workspace */

/* max |a - b| / max(1, max |b|) over the logical elements; a NaN sticks. */
double ops_rel_err(const tt *a, const tt *b);
/* 1 when every logical element of a has the bits of b's. */
int ops_same_bits(const tt *a, const tt *b);

/* sum over logical elements of r .* y, in double. */
double ops_dot(const tt *r, const tt *y);

/* Central differences: grad[i] = (L(t_i + h) - L(t_i - h)) / (step taken),
 * with the steps as rounded to float, over every logical element of t; t
 * is restored afterwards. */
typedef double (*ops_loss_fn)(void *ctx);
void ops_fd_grad(ops_loss_fn loss, void *ctx, tt *t, double h, double *grad);
/* max |analytic - numeric| / max(1, max |numeric|). */
double ops_grad_err(const tt *analytic, const double *numeric);

/* The gradient check bound used by every backward test: forward in FP32
 * with sums in double, h = 1e-2, normalized error below this. */
#define OPS_FD_H 1e-2
#define OPS_FD_TOL 1e-3

/* Asserts |t - expect| <= tol for every logical element. */
void ops_expect_close(const tt *t, const float *expect, double tol, const char *what);
/* Asserts after == before + delta elementwise within a relative 1e-4
 * (the accumulate = 1 check). */
void ops_expect_accumulated(const tt *after, const tt *before, const tt *delta, const char *what);

#endif
