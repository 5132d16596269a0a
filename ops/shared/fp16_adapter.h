/* FP16 through an FP32 kernel ("FP16 storage, FP32 arithmetic"), shared by
 * the in-tree modules (ops/reference, ops/cpu, ops/blas). Header-only
 * (static inline), on the module SDK.
 *
 * A kernel descriptor whose supports / workspace_size / run are
 * ops_fp16_supports, ops_fp16_workspace_size and ops_fp16_run, with `user`
 * an ops_fp16_kernel naming the module's FP32 functions, serves:
 *  - calls without an FP16 tensor: straight to the FP32 functions (same
 *    checks, reasons, workspace and bits as before);
 *  - calls with FP16 tensors: every FP16 input is widened (exactly) into a
 *    compact FP32 copy in the workspace (padded_c = C, dense NHWC strides,
 *    16-byte tail), every FP16 output gets a compact FP32 buffer, the FP32
 *    kernel runs on that view (other dtypes, e.g. an INT8 mask or FP32
 *    batch-norm statistics, pass through untouched), and each FP16 output
 *    element is rounded to FP16 once, to nearest even. Only logical
 *    elements are read or written: channel padding of an output stays
 *    untouched (rule 2 of bp_abi_ops.h).
 *  - accumulate (backward ops; the flag at accumulate_offset of the
 *    attribute block): the FP32 kernel runs with accumulate 0 into
 *    buffers of its own, and each output element becomes
 *    out = round16(float(out) + result) (FP16) or out + result (an FP32
 *    output of the same call): one addition of the whole result, as the
 *    mixed-precision contract states.
 *  - "may alias" pairs (alias_out[k], alias_in[k]): an FP16 output that is
 *    the very same elements as its FP16 input shares that input's FP32
 *    copy when overwriting (so the kernel sees the in-place call it
 *    supports); any other overlap is refused (bp_sdk_check_ptrs).
 * supports() checks every FP16 tensor (bp_sdk_check_tensor), then asks the
 * FP32 kernel about the compact FP32 view, so a layout the FP32 kernel
 * refuses only because of padded channels or strides is accepted here.
 * The workspace is the FP32 copies (each rounded up to 64 bytes, plus 64
 * for aligning the base) and then the FP32 kernel's own workspace for the
 * view. The conversions run on the host's threads (bp_sdk_parallel_for),
 * in chunks of whole pixels; each element is converted on its own, so the
 * bits never depend on the split.
 *
 * Conversions come in an ops_fp16_convert table: the scalar one below (the
 * SDK's bit-exact bp_sdk_fp16_to_fp32 / bp_sdk_fp32_to_fp16) for the
 * reference module, the F16C one of shared/fp16_convert_x86.h for the fast
 * modules; both give the same bits. */
#ifndef BP_OPS_SHARED_FP16_ADAPTER_H
#define BP_OPS_SHARED_FP16_ADAPTER_H

#include "bp_abi_sdk.h"

#define OPS_FP16_MAX_TENSORS 8           /* per side; the ops here have at most 5 */
#define OPS_FP16_MAX_ATTR_BYTES 256      /* attribute block copied for the FP32 view */
#define OPS_FP16_NO_ACCUMULATE UINT32_MAX /* accumulate_offset of a forward op */
#define OPS_FP16_ALIGN 64

/* Contiguous runs of n elements; dst never overlaps src. */
typedef struct ops_fp16_convert {
  const char *name;
  void (*widen)(const uint16_t *src, float *dst, int64_t n);     /* dst = float(src) */
  void (*narrow)(const float *src, uint16_t *dst, int64_t n);    /* dst = round16(src) */
  /* dst = round16(float(dst) + src) */
  void (*add_narrow)(const float *src, uint16_t *dst, int64_t n);
} ops_fp16_convert;

static inline void ops_fp16_widen_scalar(const uint16_t *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = bp_sdk_fp16_to_fp32(src[i]);
}
static inline void ops_fp16_narrow_scalar(const float *src, uint16_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = bp_sdk_fp32_to_fp16(src[i]);
}
static inline void ops_fp16_add_narrow_scalar(const float *src, uint16_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    dst[i] = bp_sdk_fp32_to_fp16(bp_sdk_fp16_to_fp32(dst[i]) + src[i]);
}

/* The scalar table (the reference module's). */
static inline const ops_fp16_convert *ops_fp16_convert_scalar(void) {
  static const ops_fp16_convert scalar = {"scalar", ops_fp16_widen_scalar, ops_fp16_narrow_scalar,
                                          ops_fp16_add_narrow_scalar};
  return &scalar;
}

/* What a module hands the adapter (the descriptor's `user`). */
typedef struct ops_fp16_kernel {
  int (*supports)(void *user, const bp_abi_kernel_args *args, char *reason, size_t reason_size);
  uint64_t (*workspace_size)(void *user, const bp_abi_kernel_args *args); /* NULL: none */
  int (*run)(void *user, const bp_abi_kernel_args *args);
  void *user;                              /* the FP32 functions' own user */
  uint32_t accumulate_offset;              /* int32 flag in the attrs, or OPS_FP16_NO_ACCUMULATE */
  int alias_count;                         /* the op's "may alias" pairs */
  int alias_out[2], alias_in[2];
  const ops_fp16_convert *(*convert)(void); /* the conversions to use (asked at every run) */
} ops_fp16_kernel;

/* The descriptor fields that route a kernel through the adapter. */
#define OPS_FP16_FUNCS(fp16_kernel_ptr)                                                       \
  .supports = ops_fp16_supports, .workspace_size = ops_fp16_workspace_size,                 \
  .run = ops_fp16_run, .user = (void *)(fp16_kernel_ptr)

/* How an output of the FP32 view is served. */
enum { OPS_FP16_PASS = 0, OPS_FP16_WRITE16, OPS_FP16_ADD16, OPS_FP16_ADD32 };

/* The FP32 view of one call (its args point into the struct: never move it). */
typedef struct ops_fp16_view {
  bp_abi_kernel_args args;
  bp_abi_tensor in[OPS_FP16_MAX_TENSORS], out[OPS_FP16_MAX_TENSORS];
  const void *in_ptrs[OPS_FP16_MAX_TENSORS];
  void *out_ptrs[OPS_FP16_MAX_TENSORS];
  int in_wide[OPS_FP16_MAX_TENSORS];  /* 1: an FP16 input, widened into a copy */
  int out_mode[OPS_FP16_MAX_TENSORS]; /* OPS_FP16_* */
  uint64_t in_off[OPS_FP16_MAX_TENSORS], out_off[OPS_FP16_MAX_TENSORS]; /* in the workspace */
  uint64_t bytes; /* the copies, each rounded up to OPS_FP16_ALIGN */
  union {
    unsigned char bytes[OPS_FP16_MAX_ATTR_BYTES];
    uint64_t align;
  } attrs;
} ops_fp16_view;

/* 1 when some tensor of the call is FP16 (the adapter's path). */
static inline int ops_fp16_any(const bp_abi_kernel_args *args) {
  if (!args || args->struct_size < offsetof(bp_abi_kernel_args, workspace)) return 0;
  for (int i = 0; i < args->num_inputs && args->inputs; i++)
    if (bp_sdk_input(args, i)->dtype == BP_ABI_DTYPE_FP16) return 1;
  for (int o = 0; o < args->num_outputs && args->outputs; o++)
    if (bp_sdk_output(args, o)->dtype == BP_ABI_DTYPE_FP16) return 1;
  return 0;
}

/* 1 when t's logical elements are one dense run in NHWC order. */
static inline int ops_fp16_dense(const bp_abi_tensor *t) {
  int64_t inner = 1;
  for (int d = 3; d >= 0; d--) {
    if (t->shape[d] > 1 && t->stride[d] != inner) return 0;
    inner *= t->shape[d];
  }
  return 1;
}

/* t (a checked tensor) as a compact FP32 tensor; its buffer's bytes. */
static inline uint64_t ops_fp16_compact(bp_abi_tensor *t) {
  const int64_t c = t->shape[3], w = t->shape[2], h = t->shape[1];
  t->dtype = BP_ABI_DTYPE_FP32;
  t->padded_c = c;
  t->stride[3] = 1, t->stride[2] = c, t->stride[1] = w * c, t->stride[0] = h * w * c;
  t->slot_bytes = (uint64_t)bp_sdk_count(t) * sizeof(float) + 16;
  return (t->slot_bytes + OPS_FP16_ALIGN - 1) / OPS_FP16_ALIGN * OPS_FP16_ALIGN;
}

/* Builds the FP32 view of a call with FP16 tensors (no pointers yet). */
static inline int ops_fp16_view_make(const ops_fp16_kernel *k, const bp_abi_kernel_args *args,
                                     ops_fp16_view *v, char *reason, size_t rs) {
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (args->num_inputs < 0 || args->num_outputs < 0 ||
      args->num_inputs > OPS_FP16_MAX_TENSORS || args->num_outputs > OPS_FP16_MAX_TENSORS)
    return bp_sdk_fail(reason, rs, "fp16: %d inputs and %d outputs, at most %d each",
                       (int)args->num_inputs, (int)args->num_outputs, OPS_FP16_MAX_TENSORS);
  if (!bp_sdk_check_args(args, args->num_inputs, args->num_outputs, reason, rs)) return 0;
  memset(v, 0, sizeof *v);
  const size_t args_size = args->struct_size < sizeof v->args ? args->struct_size : sizeof v->args;
  memcpy(&v->args, args, args_size);
  v->args.struct_size = (uint32_t)args_size;
  if (args->attr_size > OPS_FP16_MAX_ATTR_BYTES)
    return bp_sdk_fail(reason, rs, "fp16: attribute block of %u bytes, at most %d",
                       (unsigned)args->attr_size, OPS_FP16_MAX_ATTR_BYTES);
  int accumulate = 0;
  if (args->attr_size > 0 && args->attrs) {
    memcpy(v->attrs.bytes, args->attrs, args->attr_size);
    v->args.attrs = v->attrs.bytes;
    const uint32_t off = k->accumulate_offset;
    if (off != OPS_FP16_NO_ACCUMULATE && (uint64_t)off + sizeof(int32_t) <= args->attr_size) {
      int32_t flag;
      memcpy(&flag, v->attrs.bytes + off, sizeof flag);
      if (flag == 1) { /* 0 or another value (which the FP32 check refuses) pass as they are */
        accumulate = 1;
        flag = 0;
        memcpy(v->attrs.bytes + off, &flag, sizeof flag);
      }
    }
  }
  for (int side = 0; side < 2; side++) {
    const int count = side ? args->num_outputs : args->num_inputs;
    for (int i = 0; i < count; i++) {
      const bp_abi_tensor *t = side ? bp_sdk_output(args, i) : bp_sdk_input(args, i);
      bp_abi_tensor *w = side ? &v->out[i] : &v->in[i];
      memcpy(w, t, sizeof *w);
      w->struct_size = sizeof *w;
      const int fp16 = t->dtype == BP_ABI_DTYPE_FP16;
      const int mode = !side            ? OPS_FP16_PASS
                       : fp16           ? (accumulate ? OPS_FP16_ADD16 : OPS_FP16_WRITE16)
                       : accumulate && t->dtype == BP_ABI_DTYPE_FP32 ? OPS_FP16_ADD32
                                                                     : OPS_FP16_PASS;
      if (!fp16 && mode == OPS_FP16_PASS) continue;
      char name[32];
      snprintf(name, sizeof name, "%s %d", side ? "output" : "input", i);
      if (!bp_sdk_check_tensor(t, name, t->dtype, reason, rs)) return 0;
      const uint64_t off = v->bytes;
      v->bytes += ops_fp16_compact(w);
      if (side) v->out_mode[i] = mode, v->out_off[i] = off;
      else v->in_wide[i] = 1, v->in_off[i] = off;
    }
  }
  v->args.inputs = v->in;
  v->args.outputs = v->out;
  v->args.input_ptrs = NULL;
  v->args.output_ptrs = NULL;
  v->args.workspace = NULL;
  v->args.workspace_bytes = 0;
  return 1;
}

static inline uint64_t ops_fp16_inner_workspace(const ops_fp16_kernel *k, const ops_fp16_view *v) {
  return k->workspace_size ? k->workspace_size(k->user, &v->args) : 0;
}

static inline int ops_fp16_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                                    size_t rs) {
  const ops_fp16_kernel *k = (const ops_fp16_kernel *)user;
  if (!ops_fp16_any(args)) return k->supports ? k->supports(k->user, args, reason, rs) : 1;
  ops_fp16_view v;
  if (!ops_fp16_view_make(k, args, &v, reason, rs)) return 0;
  return k->supports ? k->supports(k->user, &v.args, reason, rs) : 1;
}

static inline uint64_t ops_fp16_workspace_size(void *user, const bp_abi_kernel_args *args) {
  const ops_fp16_kernel *k = (const ops_fp16_kernel *)user;
  if (!ops_fp16_any(args)) return k->workspace_size ? k->workspace_size(k->user, args) : 0;
  ops_fp16_view v;
  if (!ops_fp16_view_make(k, args, &v, NULL, 0)) return 0;
  return v.bytes + OPS_FP16_ALIGN + ops_fp16_inner_workspace(k, &v);
}

/* One run of n results src into the output elements at dst, `stride`
 * elements apart (mode WRITE16, ADD16 or ADD32). */
static inline void ops_fp16_store_run(const ops_fp16_convert *cv, int mode, const float *src,
                                      void *dst, int64_t n, int64_t stride) {
  if (mode == OPS_FP16_ADD32) {
    float *p = (float *)dst;
    for (int64_t j = 0; j < n; j++) p[j * stride] += src[j];
    return;
  }
  uint16_t *p = (uint16_t *)dst;
  if (stride != 1) {
    for (int64_t j = 0; j < n; j++) ops_fp16_store_run(cv, mode, src + j, p + j * stride, 1, 1);
    return;
  }
  if (mode == OPS_FP16_WRITE16) cv->narrow(src, p, n);
  else cv->add_narrow(src, p, n);
}

/* One tensor's conversion, cut into chunks of whole pixels (about
 * OPS_FP16_CHUNK elements each) that the host's threads share; each
 * element is converted on its own, so the split never changes a bit. */
#define OPS_FP16_CHUNK 16384
#define OPS_FP16_WIDEN (-1) /* job mode: FP16 input -> compact FP32 copy */
typedef struct ops_fp16_job {
  const ops_fp16_convert *cv;
  int mode;                /* OPS_FP16_WIDEN, or the output's OPS_FP16_* */
  const bp_abi_tensor *t;  /* the caller's tensor */
  void *data;              /* its elements */
  float *compact;          /* the FP32 copy / result */
  int64_t pixels, per_chunk; /* N*H*W, pixels per chunk */
  int dense;
} ops_fp16_job;

static inline void ops_fp16_job_chunk(void *arg, int64_t chunk) {
  const ops_fp16_job *j = (const ops_fp16_job *)arg;
  const bp_abi_tensor *t = j->t;
  const int64_t c = t->shape[3], cs = t->stride[3];
  const int64_t p0 = chunk * j->per_chunk;
  const int64_t p1 = p0 + j->per_chunk < j->pixels ? p0 + j->per_chunk : j->pixels;
  const size_t size = bp_sdk_dtype_size(t->dtype);
  /* a dense tensor is one run: pixel p starts at element p*c */
  const int64_t runs = j->dense ? 1 : p1 - p0, len = j->dense ? (p1 - p0) * c : c;
  for (int64_t r = 0; r < runs; r++) {
    const int64_t p = p0 + r, w = p % t->shape[2], h = p / t->shape[2] % t->shape[1];
    const int64_t n = p / t->shape[2] / t->shape[1];
    char *at = (char *)j->data + (size_t)bp_sdk_offset(t, n, h, w, 0) * size;
    float *compact = j->compact + p * c;
    if (j->mode != OPS_FP16_WIDEN) {
      ops_fp16_store_run(j->cv, j->mode, compact, at, len, j->dense ? 1 : cs);
    } else if (j->dense || cs == 1) {
      j->cv->widen((const uint16_t *)(const void *)at, compact, len);
    } else {
      for (int64_t e = 0; e < len; e++)
        j->cv->widen((const uint16_t *)(const void *)at + e * cs, compact + e, 1);
    }
  }
}

/* Widens the FP16 tensor t at data into compact (mode OPS_FP16_WIDEN), or
 * writes the compact result into the output t at data (WRITE16, ADD16,
 * ADD32), logical elements only: channel padding stays untouched. */
static inline void ops_fp16_convert_tensor(const bp_abi_kernel_args *args,
                                           const ops_fp16_convert *cv, int mode,
                                           const bp_abi_tensor *t, void *data, float *compact) {
  ops_fp16_job j = {cv, mode, t, data, compact, t->shape[0] * t->shape[1] * t->shape[2], 1,
                    ops_fp16_dense(t)};
  if (t->shape[3] < OPS_FP16_CHUNK) j.per_chunk = OPS_FP16_CHUNK / t->shape[3];
  bp_sdk_parallel_for(args, ops_fp16_job_chunk, &j, (j.pixels + j.per_chunk - 1) / j.per_chunk);
}

static inline int ops_fp16_run(void *user, const bp_abi_kernel_args *args) {
  const ops_fp16_kernel *k = (const ops_fp16_kernel *)user;
  if (!ops_fp16_any(args)) return k->run(k->user, args);
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  ops_fp16_view v;
  if (!ops_fp16_view_make(k, args, &v, reason, rs) ||
      !bp_sdk_check_ptrs(args, k->alias_out, k->alias_in, k->alias_count, reason, rs))
    return BP_ABI_ERR_INVALID;
  const uint64_t inner = ops_fp16_inner_workspace(k, &v);
  const uint64_t need = v.bytes + OPS_FP16_ALIGN + inner;
  if (!args->workspace || args->workspace_bytes < need) {
    bp_sdk_set_reason(args, "fp16: workspace of %llu bytes, needs %llu",
                      (unsigned long long)(args->workspace ? args->workspace_bytes : 0),
                      (unsigned long long)need);
    return BP_ABI_ERR_INVALID;
  }
  unsigned char *base =
      (unsigned char *)(((uintptr_t)args->workspace + OPS_FP16_ALIGN - 1) &
                        ~(uintptr_t)(OPS_FP16_ALIGN - 1));
  const ops_fp16_convert *cv = k->convert();
  for (int i = 0; i < args->num_inputs; i++) {
    v.in_ptrs[i] = args->input_ptrs[i];
    if (!v.in_wide[i]) continue;
    float *copy = (float *)(void *)(base + v.in_off[i]);
    ops_fp16_convert_tensor(args, cv, OPS_FP16_WIDEN, bp_sdk_input(args, i),
                            (void *)(uintptr_t)args->input_ptrs[i], copy);
    v.in_ptrs[i] = copy;
  }
  for (int o = 0; o < args->num_outputs; o++) {
    v.out_ptrs[o] = args->output_ptrs[o];
    if (v.out_mode[o] == OPS_FP16_PASS) continue;
    v.out_ptrs[o] = base + v.out_off[o];
    if (v.out_mode[o] != OPS_FP16_WRITE16) continue;
    for (int a = 0; a < k->alias_count; a++) { /* in place: share the input's copy */
      const int i = k->alias_in[a];
      if (k->alias_out[a] == o && i < args->num_inputs && v.in_wide[i] &&
          bp_sdk_same_elements(bp_sdk_output(args, o), args->output_ptrs[o], bp_sdk_input(args, i),
                               args->input_ptrs[i]))
        v.out_ptrs[o] = (void *)(uintptr_t)v.in_ptrs[i];
    }
  }
  v.args.input_ptrs = v.in_ptrs;
  v.args.output_ptrs = v.out_ptrs;
  v.args.workspace = inner ? base + v.bytes : NULL;
  v.args.workspace_bytes = inner;
  const int rc = k->run(k->user, &v.args);
  if (rc != BP_ABI_OK) return rc;
  for (int o = 0; o < args->num_outputs; o++)
    if (v.out_mode[o] != OPS_FP16_PASS)
      ops_fp16_convert_tensor(args, cv, v.out_mode[o], bp_sdk_output(args, o),
                              args->output_ptrs[o], (float *)v.out_ptrs[o]);
  return BP_ABI_OK;
}

#endif
