/* What the kernel benches (conv_kernels.c, winograd_bench.c, memory_ops.c,
 * forward_kernels.c) share: compact NHWC tensors, finding a cpu kernel in a
 * registry, and a kernel bound as a training node binds it (threads,
 * workspace, prepare(), a parameter generation), timed call by call. */
#ifndef BP_BENCH_UTIL_H
#define BP_BENCH_UTIL_H

#include <stdint.h>

#include "bench_clock.h"
#include "blueprint/registry.h"
#include "blueprint/threads.h"
#include "bp_abi.h"
#include "bp_abi_ops.h"

/* A compact NHWC tensor (padded_c = c) and its buffer: 256-byte aligned,
 * 16 bytes of slack past the last element. */
typedef struct bench_buf {
  bp_abi_tensor d;
  void *p;
} bench_buf;

/* FP32 elements uniform in [-1, 1) from *rng (a 64-bit LCG) when rng is
 * given, else zeros; any other dtype (4 bytes, INT8 1) zeros. 0 when out
 * of memory. */
int bench_buf_new(bench_buf *b, int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c,
                  uint64_t *rng);
int64_t bench_buf_count(const bench_buf *b); /* elements */
/* FP32: max |x - ref| / max(1, max |ref|). */
double bench_norm_err(const bench_buf *x, const bench_buf *ref);

/* A new registry of every module `blueprint plugins` finds and one rank's
 * threads, as in training (every core this process may use, or
 * BP_THREADS); 0 with the error on stderr after "prog: ". */
int bench_discover(const char *prog, bp_registry **r, bp_threads **pool);

/* The kernel of `op` and `impl` for device "cpu" in r; NULL when none. */
const bp_abi_kernel *bench_find_kernel(const bp_registry *r, const char *op, const char *impl);

#define BENCH_MAX_ARGS 6

/* A kernel bound to its tensors as one node. */
typedef struct bench_node {
  const bp_abi_kernel *k;
  bp_abi_tensor in[BENCH_MAX_ARGS], out[BENCH_MAX_ARGS];
  const void *in_ptrs[BENCH_MAX_ARGS];
  void *out_ptrs[BENCH_MAX_ARGS];
  bp_abi_kernel_args args;
  void *ws, *state;
  uint64_t generation; /* 1 at open; a bench moves it to announce new parameters */
  char reason[256];
} bench_node;

/* Binds k to in[0..nin) and out[0..nout) with the attributes, on `threads`
 * (NULL: one thread): supports(), the workspace it asks for, prepare().
 * 0 when one of them fails, with the step and why in n->reason ("refuses:
 * ..."); the node can be closed either way. */
int bench_node_open(bench_node *n, const bp_abi_kernel *k, const bench_buf *in, int nin,
                    const bench_buf *out, int nout, const void *attrs, uint32_t attr_size,
                    const bp_abi_threads *threads);
/* Seconds of one run(); < 0 when it fails ("run: ..." in n->reason). */
double bench_node_call(bench_node *n);
/* One warm-up call, then the best seconds of one call over calls for at
 * least `seconds` (at least 2); repack: the generation moves before each.
 * < 0 when a call fails. */
double bench_node_best(bench_node *n, double seconds, int repack);
/* "prog: op/impl " and n->reason on stderr. */
void bench_node_report(const bench_node *n, const char *prog);
void bench_node_close(bench_node *n);

/* The median of v[0..n) (sorts v). */
double bench_median(double *v, int n);

#endif
