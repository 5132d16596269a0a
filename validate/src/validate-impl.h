/* Internals of kernel validation (validate.h): cases, tensor buffers, the
 * checks of one (kernel, case), the op conventions they rely on, gradient
 * checks and cases from a model. Shared with autotune.c. Not installed.
 *
 * Files: validate.c (the driver: kernels x cases, child processes, the
 * report), validate_ops.c (a case completed from the op table,
 * blueprint/op_table.h: input value ranges, outputs read before written,
 * accumulate, in-place pairs, the skip input, FP16 tolerances, AMP twins
 * and the oracle's case),
 * validate_cases.c (the built-in case table), validate_model.c (cases from
 * a model's plan), validate_buffers.c (guarded buffers, poison, dtype
 * conversion), validate_check.c (the checks), validate_guard.c (guard
 * pages in this process), validate_grad.c (finite differences),
 * validate_device.c (runs through a device plugin: device memory, copies,
 * its stream). */
#ifndef BLUEPRINT_VALIDATE_IMPL_H
#define BLUEPRINT_VALIDATE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "blueprint/graph.h"
#include "blueprint/registry.h"
#include "blueprint/validate.h"

#define VC_MAX BP_NODE_MAX_TENSORS

/* How a tensor's logical elements are filled before a run. */
typedef enum vc_fill {
  VC_FILL_UNIFORM = 0, /* uniform in [lo, hi) */
  VC_FILL_AWAY,        /* |v| uniform in [lo, hi), random sign (away from kinks) */
  VC_FILL_INT,         /* integers uniform in [lo, hi] */
  VC_FILL_CONST,       /* every element lo */
  VC_FILL_POOL_MASK,   /* maxpool mask: an in-bounds window index per element */
  VC_FILL_SEGMENTS,    /* LARS segment table: 0 < ... < the span's elements */
  VC_FILL_NAN_LAST,    /* uniform in [lo, hi) with a NaN as the last element */
  VC_FILL_RELU_Y,      /* max(0, uniform in [lo, hi)): a relu output */
  VC_FILL_UNSET,       /* not decided yet: vc_op_complete picks */
} vc_fill;

typedef struct vc_tensor {
  bp_abi_tensor d;
  vc_fill fill;
  double lo, hi;
} vc_tensor;

/* One case of one op: descriptors, attributes and how to fill them. */
typedef struct vc_case {
  const char *op; /* registry-owned or static */
  char name[96];
  int num_inputs, num_outputs;
  vc_tensor in[VC_MAX], out[VC_MAX];
  /* out[o] is the very buffer of in[alias[o]] (the op updates it in
   * place), or -1 */
  int alias[VC_MAX];
  /* out[o] is read before it is written (optimizer state, accumulating
   * loss): filled by its rule instead of poisoned */
  int rmw[VC_MAX];
  unsigned char attrs[64];
  uint32_t attr_size;
  int accumulate_offset; /* byte offset of the int32 accumulate flag, or -1 */
  int inplace_in;        /* input an IN_PLACE kernel's output 0 may be, or -1 */
  int collective;        /* allreduce.*: never run alone */
  /* the trailing skip input (has_skip), or -1; when it holds a nonzero
   * constant every output starts from data and must keep it */
  int skip_in;
  /* inputs that are parameters (bit i: input i): check 10 keeps them
   * while the params_generation stays, and changes every other input */
  unsigned param_in;
  /* one of the batch cases of the built-in table (N = 17 .. 33): no
   * gradient check (the backward's handling of a batch is what the other
   * checks compare) */
  int batch_sweep;
} vc_case;

/* ---- validate_device.c ----------------------------------------------------- */

/* A device a kernel's runs go through: a compute stream and a scratch
 * arena (with its pinned staging) of one device of a device plugin. */
typedef struct vc_device vc_device;

/* Opens device `index` of dev (which reports at least index + 1 devices). */
bp_status vc_device_open(const bp_abi_device *dev, int index, vc_device **out);
void vc_device_close(vc_device *d); /* NULL ok */
const char *vc_device_kind(const vc_device *d);
int vc_device_index(const vc_device *d);
/* What args->stream is for a kernel on d: the compute stream's native
 * handle, or NULL when its kernels run as host tasks. */
void *vc_device_stream(const vc_device *d);

/* One tensor slot of a run on a device: its host image (bytes long) and,
 * after vc_device_upload, where it lives in the arena. */
typedef struct vc_slot {
  unsigned char *host;
  uint64_t bytes;
  uint64_t offset; /* in the scratch arena */
  void *dev;       /* device pointer */
} vc_slot;

/* Lays the slots (each 256-byte aligned) and a workspace of ws_bytes out
 * in the scratch arena and enqueues the copy of every host image into it;
 * sets slots[].offset, slots[].dev and *ws_out (NULL when ws_bytes is 0).
 * 0, or -1 and why. */
int vc_device_upload(vc_device *d, vc_slot *slots, int n, uint64_t ws_bytes, void **ws_out,
                     char *why, size_t why_size);
/* Sets a->stream and calls k->prepare(a, state) as the executor's bind
 * does, but in a host task (waited for) on a device whose kernels run in
 * them: such a device's memory is reachable only there. *krc_out:
 * prepare()'s status. 0, or -1 and why when the device failed. */
int vc_device_prepare(vc_device *d, const bp_abi_kernel *k, bp_abi_kernel_args *a, void **state,
                      int *krc_out, char *why, size_t why_size);
/* Sets a->stream and runs k->run(a) on the compute stream (or in a host
 * task on it), then waits for the stream. *krc_out: run()'s status. 0, or
 * -1 and why when the device failed. */
int vc_device_launch(vc_device *d, const bp_abi_kernel *k, bp_abi_kernel_args *a, int *krc_out,
                     char *why, size_t why_size);
/* Copies every slot back into its host image and waits. 0, or -1 and why. */
int vc_device_download(vc_device *d, const vc_slot *slots, int n, char *why, size_t why_size);

/* ---- validate.c ------------------------------------------------------------ */

/* The cpu reference kernel (BP_ABI_KERNEL_REFERENCE) of op in r, or NULL:
 * the oracle the checks compare against. */
const bp_abi_kernel *vc_reference(const bp_registry *r, const char *op);

/* ---- validate_ops.c ------------------------------------------------------ */

/* Fills what the op's conventions decide and the case left open: fill
 * rules (VC_FILL_UNSET), rmw, accumulate_offset, inplace_in, collective,
 * skip_in.
 * Ops it does not know keep uniform [-1, 1) inputs and nothing else. */
void vc_op_complete(vc_case *c);

/* The tolerance of an FP32 output of a kernel of implementation impl:
 * the FP32 one, or VC_TF32_TOLERANCE for cuDNN and cuBLAS kernels (their
 * FP32 math may use TF32 tensor cores) unless `no_tf32` (the modules were
 * told not to use it: bp_validate_options). */
#define VC_TF32_TOLERANCE 5e-3
double vc_impl_fp32_tolerance(const char *impl, int no_tf32);

/* The tolerance of an FP16 output of op (docs/validate.md): an element
 * passes when |out - ref| <= rtol*|ref| + atol*max(1, max|ref|). */
void vc_op_fp16_tolerance(const char *op, double *rtol, double *atol);

/* The AMP twin of a case of a layer op: its tensors in the dtypes and
 * channel paddings of an AMP plan (features and their gradients FP16
 * padded to 8, the first layer's input padded to 4, weights FP16, batch
 * norm statistics, the loss, its count and the loss scale FP32), name
 * ending in " fp16". 0 for range ops and collectives (their dtypes are
 * cases of their own) and cases without an FP32 tensor. */
int vc_case_amp(const vc_case *c, vc_case *out);

/* The case the reference kernel (the oracle) runs for case c: a layer
 * op's FP16 tensors widened to FP32 (FP16 kernels, the reference's own
 * included, are held to FP32 math), a skip input that holds 0 dropped
 * (has_skip 0: skip = 0 must equal no skip). 1 when it differs from c. */
int vc_case_oracle(const vc_case *c, vc_case *out);

/* ---- validate_cases.c ---------------------------------------------------- */

/* c emptied for op: no tensors or attributes, no aliases, every fill rule
 * VC_FILL_UNSET. */
void vc_case_init(vc_case *c, const char *op);

/* For an op of a module layer type (bp_abi_layer): the accumulate flag of
 * its backward op, and (defaults) the layer's attribute defaults written
 * into the block. */
void vc_layer_complete(const bp_registry *r, vc_case *c, int defaults);

/* The built-in cases (static, complete). */
const vc_case *vc_builtin_cases(int *count_out);
/* A descriptor by the plan's rules: NHWC strides over padded_c, slot_bytes
 * by the slot rule (dtensor.h) of the padded shape. */
bp_abi_tensor vc_tensor_desc(int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c,
                             int64_t padded_c);
/* A span [1,1,1,elements] whose slot is exactly its bytes, as the executor
 * passes range ops. */
bp_abi_tensor vc_span_desc(int32_t dtype, int64_t elements);
/* Cases for a module op with infer_shape: each input one of a few shapes,
 * outputs from infer_shape (the saved tensors of a module layer type whose
 * forward op it is: from their declarations), the attribute block zero
 * but for the defaults of a module layer type that uses the op (and its
 * accumulate flag).
 * Returns the count written (at most cap); 0 when infer_shape refuses
 * them all. */
int vc_infer_cases(const bp_registry *r, const bp_abi_op *op, vc_case *out, int cap);

/* ---- validate_model.c ----------------------------------------------------- */

/* Every distinct node of the model's plan (default compile and graph
 * options; layer types of the modules in r too) as a case, unfused and,
 * when `fuse`, fused too; compiled for global batch `batch` (0: the
 * model's); malloc'ed array in *cases_out. */
bp_status vc_model_cases(const bp_registry *r, const char *path, int fuse, int64_t batch,
                         vc_case **cases_out, int *count_out);

/* ---- validate_buffers.c ---------------------------------------------------- */

/* One tensor's memory. With a guard, the slot ends exactly where an
 * inaccessible page begins (its start rounded down to 256 bytes when
 * slot_bytes is not a multiple of 256). */
typedef struct vbuf {
  void *map;            /* mmap'ed region, or the malloc'ed block */
  size_t map_bytes;     /* 0: malloc'ed */
  unsigned char *ptr;   /* the tensor's pointer */
  uint64_t bytes;       /* slot_bytes */
  unsigned char *guard; /* first byte of the guard page, or NULL */
} vbuf;

/* Memory of a check (buffers, snapshots, values) is tracked, so a guarded
 * check cut short by a fault (validate_guard.c) releases it all at once.
 * Process-wide: one check at a time. */
void *vc_mem_calloc(size_t count, size_t size);
void vc_mem_free(void *p); /* NULL ok */
void vc_mem_release_all(void);

int vbuf_alloc(vbuf *b, uint64_t bytes, int guard); /* 0 on success */
void vbuf_free(vbuf *b);                           /* zeroed ok */

/* Guard pages of live buffers, for the SIGSEGV handler of a child: which
 * tensor an address past a slot belongs to ("input 1"), or NULL. */
void vbuf_guard_register(const vbuf *b, const char *what);
void vbuf_guard_clear(void);
const char *vbuf_guard_owner(const void *addr);

int64_t vt_count(const bp_abi_tensor *t);            /* logical elements */
size_t vt_elem_size(int32_t dtype);                   /* bytes of one element */
/* Byte offset of logical element i (compact NHWC order). */
uint64_t vt_offset(const bp_abi_tensor *t, int64_t i);
/* Writes / reads the logical elements (compact NHWC, as double). */
void vt_write(const bp_abi_tensor *t, void *p, const double *values);
void vt_read(const bp_abi_tensor *t, const void *p, double *values);
/* The whole slot of an input: padding channels NaN (0x5a bytes for
 * integers), the tail 0xa5 bytes. */
void vt_fill_input_padding(const bp_abi_tensor *t, void *p);
/* The whole slot of an output: 0xa5 bytes; then, when poison, every
 * logical element the poison value. */
void vt_fill_output(const bp_abi_tensor *t, void *p, int poison);
/* 1 when logical element i holds the poison value. */
int vt_is_poison(const bp_abi_tensor *t, const void *p, int64_t i);
/* The first logical element that holds the poison value, or -1. */
int64_t vt_find_poison(const bp_abi_tensor *t, const void *p);
/* 1 at the bytes of logical elements; malloc'ed slot_bytes array. */
unsigned char *vt_logical_mask(const bp_abi_tensor *t);
/* Rounds values through the dtype (what a tensor of it can hold). */
void vt_round(int32_t dtype, double *values, int64_t count);

/* SplitMix64 stream. */
uint64_t vc_rand(uint64_t *state);
double vc_rand_unit(uint64_t *state); /* [0, 1) */
/* Host values of tensor t of case c by its fill rule (count vt_count). */
void vc_fill_values(const vc_case *c, const vc_tensor *t, uint64_t *rng, double *values);

/* ---- validate_check.c ------------------------------------------------------ */

/* Per-dtype tolerance of the normalized error (docs/validate.md). */
double vc_tolerance(int32_t dtype);

/* What the checks of one (kernel, case) found. */
typedef struct vc_outcome {
  bp_validate_verdict verdict;
  double error, tolerance; /* NaN when nothing was compared */
  char detail[320];
} vc_outcome;

typedef struct vc_check_options {
  uint64_t seed;
  int guard;                        /* guard pages after every slot */
  const bp_abi_threads *threads;    /* lent to the kernels (never NULL) */
  /* NULL: the kernel runs on host buffers; else its runs go through this
   * device (the reference still runs on the host) */
  vc_device *device;
  int no_tf32; /* bp_validate_options.no_tf32 */
  /* Thread services of other counts (NULL: none): the runs of check 10
   * (new inputs on the same buffers) use sweep[0] (else `threads`), and
   * check 11 runs the case once on each other count */
  const bp_abi_threads *const *sweep;
  int sweep_count;
} vc_check_options;

/* Runs every check of kernel k (against ref, which may be k itself) on
 * case c. Never aborts on what the kernels do, short of a crash. */
void vc_check(const bp_abi_kernel *k, const bp_abi_kernel *ref, const vc_case *c,
              const vc_check_options *o, vc_outcome *out);

/* vc_check with guard pages in this process (validate_guard.c): a read
 * past slot_bytes fails the check instead of the process. One at a time;
 * give the kernel a one-thread service. */
void vc_check_guarded(const bp_abi_kernel *k, const bp_abi_kernel *ref, const vc_case *c,
                      const vc_check_options *o, vc_outcome *out);

/* c with its FP16 tensors made FP32: same shapes and padded_c, slots by
 * the plan's rule, the same (FP16) values. 1 when something changed. */
int vc_case_widen(const vc_case *c, vc_case *out);

/* The case of a node as a kernel sees it: descriptors and attributes from
 * args (pointers ignored), completed by the op's conventions. Aliases come
 * from equal pointers when args carries them. */
int vc_case_from_args(const char *op, const bp_abi_kernel_args *args, vc_case *c); /* 0 ok */

/* One run of k on c (accumulate flag, input values, starting values of
 * the outputs or NULL for poison); outputs into got. 0, or -1 and why. */
int vc_run_values(const bp_abi_kernel *k, const vc_case *c, int accumulate, double *const *in,
                  double *const *prior, double **got, const vc_check_options *o, char *why,
                  size_t why_size);

/* ---- validate_grad.c --------------------------------------------------------- */

/* Gradient checks: one row per (reference backward op, forward case of
 * the built-in table). */
int vc_grad_row_count(void);
/* Row `row`'s backward op (static) and case name, without running it. */
void vc_grad_row_name(int row, const char **op_out, char *case_name, size_t case_name_size);
/* Row `row`: its backward op (static) and case name, and the check of the
 * reference backward against central differences of the reference
 * forward (docs/validate.md). */
void vc_grad_row(const bp_registry *r, int row, const vc_check_options *o, const char **op_out,
                 char *case_name, size_t case_name_size, vc_outcome *out);

/* Gradient checks of module ops: for the backward op of every layer type
 * a module registers, one row per (cpu kernel of it, case of its forward
 * op from infer_shape), checked like the built-in rows against central
 * differences of the forward op's own kernel (its reference kernel, else
 * its first cpu FP32 kernel; inputs away from 0); and a row saying why for
 * every other module op (no layer type, no backward op, no
 * cases, no FP32). */
typedef struct vc_module_grad {
  const char *op;                 /* the backward op, or the op a skip row is about */
  const char *impl, *device;      /* the backward kernel's ("-" on a skip row) */
  const bp_abi_kernel *bwd, *fwd; /* NULL: a skip row (why) */
  const bp_registered_layer *layer;
  vc_case c; /* the forward case (c.name: the row's case) */
  char why[240];
} vc_module_grad;

/* malloc'ed rows in *rows_out. */
bp_status vc_module_grad_rows(const bp_registry *r, vc_module_grad **rows_out, int *count_out);
void vc_module_grad_check(const bp_registry *r, const vc_module_grad *row,
                          const vc_check_options *o, vc_outcome *out);

#endif
