/* Helpers of the reference op module tests; see ops_ref_util.h. */
#include "ops_ref_util.h"
#include "test_env.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loading ------------------------------------------------------------ */

/* The module goes through the core's registry, as the executor loads it:
 * bp_registry_load of the built file, then the registered kernels. The
 * registry lives until the process ends (the kernels point into it). */
static bp_registry *ops_registry;

bp_registry *ops_registry_get(void) {
  if (!ops_registry) {
    bp_registry *r = NULL;
    /* BP_CPU_ISA, which CTest sets per run, as the module option cpu_isa */
    if (bp_registry_create_with(bp_test_registry_options(), &r) != BP_OK)
      ck_abort_msg("bp_registry_create: %s", bp_last_error());
    if (bp_registry_load(r, BP_OPS_REFERENCE_PATH) != BP_OK)
      ck_abort_msg("bp_registry_load(%s): %s", BP_OPS_REFERENCE_PATH, bp_last_error());
    ops_registry = r;
  }
  return ops_registry;
}

bp_registry *ops_registry_with(const char *path) {
  static const char *loaded[8];
  static int count;
  bp_registry *r = ops_registry_get();
  for (int i = 0; i < count; i++)
    if (strcmp(loaded[i], path) == 0) return r;
  ck_assert_int_lt(count, 8);
  if (bp_registry_load(r, path) != BP_OK)
    ck_abort_msg("bp_registry_load(%s): %s", path, bp_last_error());
  loaded[count++] = path;
  return r;
}

const bp_abi_kernel *ops_kernel_impl(const char *op, const char *impl) {
  const bp_registry *r = ops_registry_get();
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(r, i)->kernel;
    if (strcmp(k->op, op) == 0 && strcmp(k->impl, impl) == 0 && strcmp(k->device, "cpu") == 0)
      return k;
  }
  ck_abort_msg("no %s kernel for %s", impl, op);
  return NULL;
}

const bp_abi_kernel *ops_kernel(const char *op) { return ops_kernel_impl(op, "reference"); }

/* ---- tensors ------------------------------------------------------------ */

static size_t elem_bytes(int32_t dtype) {
  return dtype == BP_ABI_DTYPE_INT8 ? 1 : dtype == BP_ABI_DTYPE_FP16 ? 2 : 4;
}

#define SENTINEL_BITS 0x7fc0beefu /* a quiet NaN with a payload */

tt tt_new(int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c, int64_t extra_c) {
  tt t;
  memset(&t, 0, sizeof t);
  t.d.struct_size = sizeof t.d;
  t.d.dtype = dtype;
  t.d.shape[0] = n, t.d.shape[1] = h, t.d.shape[2] = w, t.d.shape[3] = c;
  t.d.padded_c = c + extra_c;
  t.d.stride[3] = 1;
  t.d.stride[2] = t.d.padded_c;
  t.d.stride[1] = w * t.d.padded_c;
  t.d.stride[0] = h * w * t.d.padded_c;
  const size_t elems = (size_t)(n * h * w * t.d.padded_c);
  t.d.slot_bytes = elems * elem_bytes(dtype) + 16;
  t.data = malloc(t.d.slot_bytes);
  ck_assert_ptr_nonnull(t.data);
  memset(t.data, 0x5a, t.d.slot_bytes);
  for (size_t i = 0; i < elems; i++) {
    const int64_t ch = (int64_t)(i % (size_t)t.d.padded_c);
    if (dtype == BP_ABI_DTYPE_FP32) {
      uint32_t bits = SENTINEL_BITS;
      float v = 0.0f;
      if (ch >= c) memcpy(&v, &bits, sizeof v);
      ((float *)t.data)[i] = v;
    } else if (ch < c) {
      memset((char *)t.data + i * elem_bytes(dtype), 0, elem_bytes(dtype));
    }
  }
  return t;
}

void tt_free(tt *t) {
  free(t->data);
  t->data = NULL;
}

int64_t tt_count(const tt *t) { return t->d.shape[0] * t->d.shape[1] * t->d.shape[2] * t->d.shape[3]; }

/* Hot helpers check with `if` and abort only on failure: every passing
 * ck_assert is a message to Check's parent process, which would dominate
 * the finite-difference loops. */
static int64_t off(const tt *t, int64_t n, int64_t h, int64_t w, int64_t c) {
  if (!(n >= 0 && n < t->d.shape[0] && h >= 0 && h < t->d.shape[1] && w >= 0 &&
        w < t->d.shape[2] && c >= 0 && c < t->d.shape[3]))
    ck_abort_msg("element (%lld,%lld,%lld,%lld) outside the tensor", (long long)n, (long long)h,
                 (long long)w, (long long)c);
  return n * t->d.stride[0] + h * t->d.stride[1] + w * t->d.stride[2] + c * t->d.stride[3];
}

float *tt_f(const tt *t, int64_t n, int64_t h, int64_t w, int64_t c) {
  return (float *)t->data + off(t, n, h, w, c);
}
int32_t *tt_i32(const tt *t, int64_t n, int64_t h, int64_t w, int64_t c) {
  return (int32_t *)t->data + off(t, n, h, w, c);
}
int8_t *tt_i8(const tt *t, int64_t n, int64_t h, int64_t w, int64_t c) {
  return (int8_t *)t->data + off(t, n, h, w, c);
}

float *tt_at(const tt *t, int64_t i) {
  const int64_t c = i % t->d.shape[3];
  i /= t->d.shape[3];
  const int64_t w = i % t->d.shape[2];
  i /= t->d.shape[2];
  const int64_t h = i % t->d.shape[1];
  return tt_f(t, i / t->d.shape[1], h, w, c);
}

void tt_set(tt *t, const float *values) {
  for (int64_t i = 0; i < tt_count(t); i++) *tt_at(t, i) = values[i];
}

double tt_rand_unit(uint64_t *rng) {
  /* splitmix64 */
  uint64_t z = (*rng += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0;
}

void tt_rand(tt *t, uint64_t *rng, double lo, double hi) {
  for (int64_t i = 0; i < tt_count(t); i++) *tt_at(t, i) = (float)(lo + (hi - lo) * tt_rand_unit(rng));
}

void tt_rand_away(tt *t, uint64_t *rng, double lo, double hi) {
  for (int64_t i = 0; i < tt_count(t); i++) {
    const double v = lo + (hi - lo) * tt_rand_unit(rng);
    *tt_at(t, i) = (float)(tt_rand_unit(rng) < 0.5 ? -v : v);
  }
}

void tt_copy(tt *dst, const tt *src) {
  if (tt_count(dst) != tt_count(src)) ck_abort_msg("tt_copy: sizes differ");
  for (int64_t i = 0; i < tt_count(src); i++) *tt_at(dst, i) = *tt_at(src, i);
}

int tt_padding_intact(const tt *t) {
  const size_t eb = elem_bytes(t->d.dtype);
  for (int64_t n = 0; n < t->d.shape[0]; n++)
    for (int64_t h = 0; h < t->d.shape[1]; h++)
      for (int64_t w = 0; w < t->d.shape[2]; w++)
        for (int64_t c = t->d.shape[3]; c < t->d.padded_c; c++) {
          const char *p = (const char *)t->data +
                          (size_t)(n * t->d.stride[0] + h * t->d.stride[1] + w * t->d.stride[2] + c) * eb;
          if (t->d.dtype == BP_ABI_DTYPE_FP32) {
            uint32_t bits;
            memcpy(&bits, p, sizeof bits);
            if (bits != SENTINEL_BITS) return 0;
          } else {
            for (size_t b = 0; b < eb; b++)
              if ((unsigned char)p[b] != 0x5a) return 0;
          }
        }
  /* the 16-byte tail */
  const unsigned char *tail = (const unsigned char *)t->data + t->d.slot_bytes - 16;
  for (int i = 0; i < 16; i++)
    if (tail[i] != 0x5a) return 0;
  return 1;
}

uint32_t bits_of(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

float float_of(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

/* ---- calls -------------------------------------------------------------- */

void ops_args_make(ops_args *b, const ops_call *call, int with_ptrs) {
  memset(b, 0, sizeof *b);
  for (int i = 0; i < call->nin; i++) b->in[i] = call->in[i]->d, b->in_ptrs[i] = call->in[i]->data;
  for (int i = 0; i < call->nout; i++)
    b->out[i] = call->out[i]->d, b->out_ptrs[i] = call->out[i]->data;
  b->args.struct_size = sizeof b->args;
  b->args.num_inputs = call->nin;
  b->args.num_outputs = call->nout;
  b->args.inputs = b->in;
  b->args.outputs = b->out;
  b->args.input_ptrs = with_ptrs ? b->in_ptrs : NULL;
  b->args.output_ptrs = with_ptrs ? b->out_ptrs : NULL;
  b->args.attrs = call->attrs;
  b->args.attr_size = call->attr_size;
  b->args.attr_version = BP_ABI_ATTR_VERSION;
  b->args.world_size = 1;
}

const char *ops_selected_impl(const ops_call *call, const char *pins, char *report,
                              size_t report_size) {
  ops_args a;
  ops_args_make(&a, call, 0);
  bp_select_options o;
  memset(&o, 0, sizeof o);
  o.pins = pins;
  o.report = report, o.report_size = report_size;
  const bp_registered_kernel *k = NULL;
  if (bp_registry_select(ops_registry_get(), call->op, "cpu", &a.args, &o, &k) != BP_OK)
    ck_abort_msg("select %s: %s", call->op, bp_last_error());
  return k->kernel.impl;
}

int ops_kernel_supports(const bp_abi_kernel *k, const ops_call *call, char *reason,
                        size_t reason_size) {
  ops_args a;
  ops_args_make(&a, call, 0);
  if (reason_size) reason[0] = '\0';
  if (!k->supports) ck_abort_msg("%s/%s has no supports()", call->op, k->impl);
  return k->supports(k->user, &a.args, reason, reason_size);
}

int ops_kernel_run(const bp_abi_kernel *k, const ops_call *call, void *ws, uint64_t ws_bytes) {
  ops_args a;
  ops_args_make(&a, call, 1);
  a.args.workspace = ws, a.args.workspace_bytes = ws_bytes;
  return k->run(k->user, &a.args);
}

int ops_supports(const ops_call *call, char *reason, size_t reason_size) {
  return ops_kernel_supports(ops_kernel(call->op), call, reason, reason_size);
}

int ops_run_raw(const ops_call *call) { return ops_kernel_run(ops_kernel(call->op), call, NULL, 0); }

void ops_run(const ops_call *call) {
  char reason[256];
  if (ops_supports(call, reason, sizeof reason) != 1)
    ck_abort_msg("%s refused: %s", call->op, reason);
  const int rc = ops_run_raw(call);
  if (rc != BP_ABI_OK) ck_abort_msg("%s run() returned %d", call->op, rc);
}

void ops_expect_refused(const ops_call *call, const char *needle) {
  char reason[256];
  ck_assert_msg(ops_supports(call, reason, sizeof reason) == 0, "%s accepted, expected refusal (%s)",
                call->op, needle);
  ck_assert_msg(reason[0] != '\0', "%s: refusal without a reason", call->op);
  ck_assert_msg(strstr(reason, needle) != NULL, "%s: reason '%s' lacks '%s'", call->op, reason,
                needle);
  /* run() refuses the same args without aborting */
  ck_assert_int_eq(ops_run_raw(call), BP_ABI_ERR_INVALID);
}

/* ---- prepared nodes ----------------------------------------------------- */

void ops_node_open(ops_node *n, const char *impl, const ops_call *c,
                   const bp_abi_threads *threads) {
  memset(n, 0, sizeof *n);
  n->k = ops_kernel_impl(c->op, impl);
  ops_args_make(&n->a, c, 1);
  n->a.args.threads = threads;
  char why[256] = "";
  ops_args s;
  ops_args_make(&s, c, 0);
  s.args.threads = threads;
  ck_assert_msg(!n->k->supports || n->k->supports(n->k->user, &s.args, why, sizeof why),
                "%s/%s refuses: %s", c->op, impl, why);
  const uint64_t need = n->k->workspace_size ? n->k->workspace_size(n->k->user, &s.args) : 0;
  if (need) {
    ck_assert_int_eq(posix_memalign(&n->ws, 64, (size_t)need), 0);
    n->a.args.workspace = n->ws, n->a.args.workspace_bytes = need;
  }
  n->generation = 1;
  n->a.args.params_generation = &n->generation;
  n->a.args.reason = n->reason, n->a.args.reason_size = sizeof n->reason;
  if (n->k->prepare)
    ck_assert_msg(n->k->prepare(n->k->user, &n->a.args, &n->state) == BP_ABI_OK, "%s",
                  n->reason);
  n->a.args.state = n->state;
}

void ops_node_run(ops_node *n) {
  ck_assert_msg(n->k->run(n->k->user, &n->a.args) == BP_ABI_OK, "%s/%s: %s", n->k->op, n->k->impl,
                n->reason);
}

void ops_node_close(ops_node *n) {
  if (n->state && n->k->release) n->k->release(n->k->user, n->state);
  free(n->ws);
}

double ops_rel_err(const tt *a, const tt *b) {
  double d = 0, scale = 1;
  for (int64_t i = 0; i < tt_count(a); i++) {
    const double e = fabs((double)*tt_at(a, i) - *tt_at(b, i));
    if (!(e <= d)) d = e;
    if (fabs(*tt_at(b, i)) > scale) scale = fabs(*tt_at(b, i));
  }
  return d / scale;
}

int ops_same_bits(const tt *a, const tt *b) {
  for (int64_t i = 0; i < tt_count(a); i++)
    if (bits_of(*tt_at(a, i)) != bits_of(*tt_at(b, i))) return 0;
  return 1;
}

/* ---- gradients ---------------------------------------------------------- */

double ops_dot(const tt *r, const tt *y) {
  if (tt_count(r) != tt_count(y)) ck_abort_msg("ops_dot: sizes differ");
  double s = 0.0;
  for (int64_t i = 0; i < tt_count(y); i++) s += (double)*tt_at(r, i) * *tt_at(y, i);
  return s;
}

void ops_fd_grad(ops_loss_fn loss, void *ctx, tt *t, double h, double *grad) {
  for (int64_t i = 0; i < tt_count(t); i++) {
    float *p = tt_at(t, i);
    const float v = *p;
    const float up = (float)(v + h), down = (float)(v - h);
    *p = up;
    const double lu = loss(ctx);
    *p = down;
    const double ld = loss(ctx);
    *p = v;
    grad[i] = (lu - ld) / ((double)up - (double)down);
  }
}

double ops_grad_err(const tt *analytic, const double *numeric) {
  double max_diff = 0.0, max_n = 1.0;
  for (int64_t i = 0; i < tt_count(analytic); i++) {
    const double d = fabs((double)*tt_at(analytic, i) - numeric[i]);
    if (!(d <= max_diff)) max_diff = d; /* NaN sticks */
    if (fabs(numeric[i]) > max_n) max_n = fabs(numeric[i]);
  }
  return max_diff / max_n;
}

void ops_expect_close(const tt *t, const float *expect, double tol, const char *what) {
  for (int64_t i = 0; i < tt_count(t); i++) {
    const double v = *tt_at(t, i);
    if (!(fabs(v - expect[i]) <= tol))
      ck_abort_msg("%s[%lld] = %.9g, expected %.9g", what, (long long)i,
                  v, (double)expect[i]);
  }
}

void ops_expect_accumulated(const tt *after, const tt *before, const tt *delta, const char *what) {
  for (int64_t i = 0; i < tt_count(after); i++) {
    const double a = *tt_at(after, i), b = *tt_at(before, i), d = *tt_at(delta, i);
    if (!(fabs(a - (b + d)) <= 1e-4 * (1.0 + fabs(b) + fabs(d))))
      ck_abort_msg("%s[%lld] = %.9g after accumulate, expected %.9g + %.9g", what, (long long)i, a,
                  b, d);
  }
}
