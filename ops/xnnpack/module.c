/* The XNNPACK op module: its ABI entry (the only exported symbol), XNNPACK's
 * one-time initialization, the thread pools shared per rank, the node
 * state and the helpers every kernel uses.
 *
 * Kernels: conv2d.fwd, fc.fwd, maxpool.fwd (with its INT8 mask), avgpool.fwd,
 * global_avgpool.fwd, relu.fwd and add.fwd, FP32 and FP16 (where XNNPACK
 * runs FP16 on this CPU), device "cpu", implementation "xnnpack",
 * priorities by measurement (xnn-impl.h: 15 where only the reference
 * competes, 9 for conv2d and fc, below the BLAS modules, 4 for maxpool and
 * relu, below ops/cpu). Flagged
 * DETERMINISTIC: XNNPACK splits work across threads by output tiles, never
 * inside one output element's sum, so the bits do not depend on the thread
 * count either. Not REFERENCE. README.md says what each kernel refuses.
 *
 * Threads: XNNPACK runs on a pthreadpool. One pool serves every node bound
 * with the same host thread service (one service per rank) in one
 * registry (the pools live in the context init_ctx makes), created with
 * that service's count (args->threads->count: the rank's share of the
 * cores), and destroyed with the last node that holds it. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module_register.h"
#include "xnn-impl.h"
#ifdef BP_OPS_XNNPACK_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_XNNPACK_VERSION
#define BP_OPS_XNNPACK_VERSION "0.0.0"
#endif
#ifndef BP_OPS_XNNPACK_BUILD_ID
#define BP_OPS_XNNPACK_BUILD_ID "unknown"
#endif

/* ---- thread pools ------------------------------------------------------------ */

struct xnnp_pool {
  xnnp_ctx *owner; /* the context whose list holds it */
  const void *key; /* the host service's ctx */
  int count;
  int refs;
  pthreadpool_t handle; /* NULL for one thread */
  struct xnnp_pool *next;
};

#define XNNP_KERNEL_COUNT 7

/* One registry's view of the module (init_ctx makes it, fini_ctx frees
 * it): its thread pools, and what its kernels' user points at. */
struct xnnp_ctx {
  pthread_mutex_t pools_lock; /* rank threads bind nodes in parallel */
  xnnp_pool *pools;           /* every pool some node of this registry holds */
  xnnp_user users[XNNP_KERNEL_COUNT];
};

xnnp_pool *xnnp_pool_acquire(xnnp_ctx *ctx, const bp_abi_threads *threads) {
  if (!ctx) return NULL;
  const void *key = threads ? threads->ctx : NULL;
  const int count = threads && threads->count > 1 ? (int)threads->count : 1;
  pthread_mutex_lock(&ctx->pools_lock);
  xnnp_pool *p = ctx->pools;
  while (p && !(p->key == key && p->count == count)) p = p->next;
  if (p) {
    p->refs++;
  } else if ((p = calloc(1, sizeof *p)) != NULL) {
    p->owner = ctx, p->key = key, p->count = count, p->refs = 1;
    if (count > 1 && !(p->handle = pthreadpool_create((size_t)count))) {
      free(p);
      p = NULL;
    } else {
      p->next = ctx->pools, ctx->pools = p;
    }
  }
  pthread_mutex_unlock(&ctx->pools_lock);
  return p;
}

void xnnp_pool_release(xnnp_pool *p) {
  if (!p) return;
  xnnp_ctx *ctx = p->owner;
  pthread_mutex_lock(&ctx->pools_lock);
  if (--p->refs == 0) {
    xnnp_pool **link = &ctx->pools;
    while (*link != p) link = &(*link)->next;
    *link = p->next;
    if (p->handle) pthreadpool_destroy(p->handle);
    free(p);
  }
  pthread_mutex_unlock(&ctx->pools_lock);
}

pthreadpool_t xnnp_pool_handle(const xnnp_pool *p) { return p ? p->handle : NULL; }

/* ---- node state ------------------------------------------------------------------ */

int xnn_node_create(void *user, const bp_abi_kernel_args *args, xnn_node **out) {
  *out = NULL;
  xnn_node *s = calloc(1, sizeof *s);
  if (!s) {
    bp_sdk_set_reason(args, "out of memory for the node state");
    return BP_ABI_ERR_NOMEM;
  }
  s->pool = xnnp_pool_acquire(user ? ((xnnp_user *)user)->ctx : NULL, bp_sdk_args_threads(args));
  if (!s->pool) {
    free(s);
    bp_sdk_set_reason(args, "cannot create a pthreadpool of %d threads",
                      bp_sdk_args_thread_count(args));
    return BP_ABI_ERR_NOMEM;
  }
  s->set_batch = -1;
  *out = s;
  return BP_ABI_OK;
}

int xnn_node_prepare(void *user, const bp_abi_kernel_args *args, void **state_out,
                     xnn_node_create_fn create) {
  *state_out = NULL;
  xnn_node *s;
  int rc = xnn_node_create(user, args, &s);
  if (rc == BP_ABI_OK && create && (rc = create(s, args)) != BP_ABI_OK) xnn_node_release(NULL, s);
  if (rc == BP_ABI_OK) *state_out = s;
  return rc;
}

int xnn_node_for_run(void *user, const bp_abi_kernel_args *args, xnn_node **s, xnn_node **tmp,
                     xnn_node_create_fn create) {
  *tmp = NULL;
  *s = bp_sdk_args_state(args);
  if (*s) return BP_ABI_OK;
  void *made = NULL;
  const int rc = xnn_node_prepare(user, args, &made, create);
  *s = *tmp = made;
  return rc;
}

void xnn_node_drop_op(xnn_node *s) {
  if (s->op) xnn_delete_operator(s->op);
  s->op = NULL;
  s->packed = 0;
  s->set_batch = -1;
}

void xnn_node_release(void *user, void *state) {
  (void)user;
  xnn_node *s = state;
  if (!s) return;
  xnn_node_drop_op(s);
  xnnp_pool_release(s->pool);
  free(s->dense);
  free(s);
}

int xnn_node_setup_current(xnn_node *s, const void *in0, const void *in1, void *out, void *extra,
                           int64_t batch) {
  if (s->set_batch == batch && s->set_in[0] == in0 && s->set_in[1] == in1 && s->set_out == out &&
      s->set_extra == extra)
    return 1;
  s->set_in[0] = in0, s->set_in[1] = in1, s->set_out = out, s->set_extra = extra;
  s->set_batch = batch;
  return 0;
}

/* ---- helpers ------------------------------------------------------------------------ */

const char *xnn_status_name(enum xnn_status st) {
  switch (st) {
    case xnn_status_success: return "xnn_status_success";
    case xnn_status_uninitialized: return "xnn_status_uninitialized";
    case xnn_status_invalid_parameter: return "xnn_status_invalid_parameter";
    case xnn_status_invalid_state: return "xnn_status_invalid_state";
    case xnn_status_unsupported_parameter: return "xnn_status_unsupported_parameter";
    case xnn_status_unsupported_hardware: return "xnn_status_unsupported_hardware";
    case xnn_status_out_of_memory: return "xnn_status_out_of_memory";
    default: return "xnn_status_unknown";
  }
}

int xnnp_fail(const bp_abi_kernel_args *args, const char *what, enum xnn_status st) {
  bp_sdk_set_reason(args, "XNNPACK %s failed: %s", what, xnn_status_name(st));
  if (st == xnn_status_unsupported_hardware) return BP_ABI_ERR_UNSUPPORTED;
  if (st == xnn_status_out_of_memory) return BP_ABI_ERR_NOMEM;
  return BP_ABI_ERR_INVALID;
}

int xnnp_standard_nhwc(const bp_abi_tensor *t, const char *name, char *reason, size_t rs) {
  const int64_t pc = t->padded_c;
  const int64_t want[4] = {t->shape[1] * t->shape[2] * pc, t->shape[2] * pc, pc, 1};
  for (int d = 0; d < 4; d++)
    if (t->shape[d] > 1 && t->stride[d] != want[d])
      return bp_sdk_fail(reason, rs,
                         "%s: stride %lld of dimension %d is not the dense NHWC stride %lld over "
                         "padded channels (XNNPACK takes a pixel stride only)",
                         name, (long long)t->stride[d], d, (long long)want[d]);
  return 1;
}

int xnnp_view_as_fp32(const bp_abi_kernel_args *args, xnnp_args_view *v, char *reason,
                      size_t rs) {
  if (!args || args->struct_size < offsetof(bp_abi_kernel_args, workspace))
    return bp_sdk_fail(reason, rs, "no args or args too small"), -1;
  if (args->num_inputs < 0 || args->num_outputs < 0 ||
      args->num_inputs + args->num_outputs > 8 || (args->num_inputs > 0 && !args->inputs) ||
      (args->num_outputs > 0 && !args->outputs))
    return bp_sdk_fail(reason, rs, "unexpected tensor counts %d and %d", (int)args->num_inputs,
                       (int)args->num_outputs),
           -1;
  memset(v, 0, sizeof *v);
  const size_t n = args->struct_size < sizeof v->args ? args->struct_size : sizeof v->args;
  memcpy(&v->args, args, n);
  v->args.struct_size = (uint32_t)n;
  int dtype = -1;
  const int total = args->num_inputs + args->num_outputs;
  for (int i = 0; i < total; i++) {
    const bp_abi_tensor *t = i < args->num_inputs ? bp_sdk_input(args, i)
                                                  : bp_sdk_output(args, i - args->num_inputs);
    if (t->struct_size < sizeof(bp_abi_tensor))
      return bp_sdk_fail(reason, rs, "tensor %d: struct_size %u is too small", i,
                         (unsigned)t->struct_size),
             -1;
    bp_abi_tensor c = *t;
    c.struct_size = sizeof c;
    if (c.dtype == BP_ABI_DTYPE_FP32 || c.dtype == BP_ABI_DTYPE_FP16) {
      if (dtype >= 0 && dtype != c.dtype)
        return bp_sdk_fail(reason, rs, "tensors mix %s and %s", bp_sdk_dtype_name(dtype),
                           bp_sdk_dtype_name(c.dtype)),
               -1;
      dtype = c.dtype;
      if (c.dtype == BP_ABI_DTYPE_FP16) {
        c.dtype = BP_ABI_DTYPE_FP32;
        c.slot_bytes = c.slot_bytes > UINT64_MAX / 2 ? UINT64_MAX : c.slot_bytes * 2;
      }
    }
    v->tensors[i] = c;
  }
  v->args.inputs = v->tensors;
  v->args.outputs = v->tensors + args->num_inputs;
  if (dtype < 0) return bp_sdk_fail(reason, rs, "no FP32 or FP16 tensor"), -1;
  return dtype;
}

/* ---- FP16 probe ------------------------------------------------------------------------ */

/* Process-wide, written once (pthread_once) and read-only after: whether
 * this CPU and this XNNPACK build run FP16 operators is a property of the
 * process, the same for every registry. */
static pthread_once_t fp16_once = PTHREAD_ONCE_INIT;
static int fp16_ok;
static char fp16_why[160] = "FP16: not probed";

int xnnp_fp16_available(void) { return fp16_ok; }
const char *xnnp_fp16_reason(void) { return fp16_why; }

/* Creates a 1x1 FP16 convolution: XNNPACK returns
 * xnn_status_unsupported_hardware where the CPU lacks FP16 arithmetic
 * (x86 needs F16C and AVX2 in this version), or where it was built
 * without FP16 operators. */
static void fp16_probe(void) {
  const uint16_t w[4] = {0};
  xnn_operator_t op = NULL;
  const enum xnn_status st = xnn_create_convolution2d_nhwc_f16(
      0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, w, NULL, -INFINITY, INFINITY, 0, &op);
  fp16_ok = st == xnn_status_success;
  if (op) xnn_delete_operator(op);
  if (fp16_ok)
    snprintf(fp16_why, sizeof fp16_why, "FP16 operators available");
  else
    snprintf(fp16_why, sizeof fp16_why,
             "XNNPACK cannot run FP16 operators on this CPU (creating one returns %s)",
             xnn_status_name(st));
}

/* ---- the module ------------------------------------------------------------------------ */

static const bp_abi_kernel *const xnnp_kernels[] = {
    &xnnp_conv2d_fwd,  &xnnp_fc_fwd,           &xnnp_maxpool_fwd, &xnnp_avgpool_fwd,
    &xnnp_global_avgpool_fwd, &xnnp_relu_fwd, &xnnp_add_fwd,
};

/* XNNPACK and cpuinfo (which it loads) keep tables of the CPU for the
 * life of the process, reachable only from their globals, and have no
 * real teardown; if they unloaded with this module those tables would be
 * lost (LeakSanitizer reports them). Marking both as never unloaded keeps
 * them, and a module loaded again finds them initialized. */
static void xnnp_pin_libraries(void) {
  static const char *const libs[] = {"libXNNPACK.so.0", "libXNNPACK.so", "libcpuinfo.so.0"};
  for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
    void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    if (h) dlclose(h); /* the NODELETE mark stays */
  }
}

_Static_assert(sizeof xnnp_kernels / sizeof xnnp_kernels[0] == XNNP_KERNEL_COUNT,
               "XNNP_KERNEL_COUNT is the table's length");

static int xnnp_init_ctx(const bp_abi_host *host, void **ctx_out) {
  xnnp_pin_libraries();
  /* xnn_initialize initializes once per process (later calls return at
   * once); it is never undone, see xnnp_pin_libraries. */
  const enum xnn_status st = xnn_initialize(NULL);
  if (st != xnn_status_success) {
    char message[256];
    snprintf(message, sizeof message, "ops-xnnpack: xnn_initialize failed: %s%s",
             xnn_status_name(st),
             st == xnn_status_unsupported_hardware ? " (this CPU lacks SSE2 / NEON)" : "");
    if (host->error) host->error(host->ctx, message);
    return BP_ABI_ERR_UNSUPPORTED;
  }
  pthread_once(&fp16_once, fp16_probe);
  xnnp_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx || pthread_mutex_init(&ctx->pools_lock, NULL) != 0) {
    free(ctx);
    if (host->error) host->error(host->ctx, "ops-xnnpack: out of memory for the context");
    return BP_ABI_ERR_NOMEM;
  }
  bp_abi_kernel kernels[XNNP_KERNEL_COUNT];
  const bp_abi_kernel *table[XNNP_KERNEL_COUNT];
  for (size_t i = 0; i < XNNP_KERNEL_COUNT; i++) {
    ctx->users[i] = (xnnp_user){ctx, xnnp_kernels[i]->user};
    kernels[i] = *xnnp_kernels[i];
    kernels[i].user = &ctx->users[i];
    table[i] = &kernels[i];
  }
  const int rc = ops_register_kernels(host, "ops-xnnpack", table, XNNP_KERNEL_COUNT);
  if (rc != BP_ABI_OK) {
    pthread_mutex_destroy(&ctx->pools_lock);
    free(ctx); /* a failed init_ctx frees its own context (bp_abi.h) */
    return rc;
  }
  char message[256];
  snprintf(message, sizeof message, "ops-xnnpack: XNNPACK ready; %s", fp16_why);
  ops_host_log(host, BP_ABI_LOG_INFO, message);
  *ctx_out = ctx;
  return BP_ABI_OK;
}

/* Every node (and so every pool) is released before the registry is
 * destroyed; a pool left here would be a host bug, freed all the same. */
static void xnnp_fini_ctx(void *p) {
  xnnp_ctx *ctx = p;
  while (ctx->pools) {
    xnnp_pool *next = ctx->pools->next;
    if (ctx->pools->handle) pthreadpool_destroy(ctx->pools->handle);
    free(ctx->pools);
    ctx->pools = next;
  }
  pthread_mutex_destroy(&ctx->pools_lock);
  free(ctx);
}

static const bp_abi_module xnnp_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 6, /* init_ctx; per-node state and the parameter generation (1.4) */
    .name = "ops-xnnpack",
    .version = BP_OPS_XNNPACK_VERSION,
    .build_id = BP_OPS_XNNPACK_BUILD_ID,
    .init_ctx = xnnp_init_ctx,
    .fini_ctx = xnnp_fini_ctx,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &xnnp_module; }
