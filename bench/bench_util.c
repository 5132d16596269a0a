/* The kernel benches' shared parts; see bench_util.h. */
#include "bench_util.h"
#include "bench_env.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bench_buf_new(bench_buf *b, int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c,
                  uint64_t *rng) {
  memset(b, 0, sizeof *b);
  b->d.struct_size = sizeof b->d;
  b->d.dtype = dtype;
  b->d.shape[0] = n, b->d.shape[1] = h, b->d.shape[2] = w, b->d.shape[3] = c;
  b->d.padded_c = c;
  b->d.stride[3] = 1, b->d.stride[2] = c, b->d.stride[1] = w * c, b->d.stride[0] = h * w * c;
  const size_t esize = dtype == BP_ABI_DTYPE_INT8 ? 1 : 4;
  b->d.slot_bytes = (uint64_t)(n * h * w * c) * esize + 16;
  if (posix_memalign(&b->p, 256, (size_t)b->d.slot_bytes) != 0) {
    b->p = NULL;
    return 0;
  }
  memset(b->p, 0, (size_t)b->d.slot_bytes);
  if (dtype == BP_ABI_DTYPE_FP32 && rng)
    for (int64_t i = 0; i < n * h * w * c; i++) {
      *rng = *rng * 6364136223846793005u + 1442695040888963407u;
      ((float *)b->p)[i] = (float)((double)(*rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
  return 1;
}

int64_t bench_buf_count(const bench_buf *b) {
  return b->d.shape[0] * b->d.shape[1] * b->d.shape[2] * b->d.shape[3];
}

double bench_norm_err(const bench_buf *x, const bench_buf *ref) {
  const float *a = x->p, *r = ref->p;
  double diff = 0.0, scale = 1.0;
  for (int64_t i = 0; i < bench_buf_count(ref); i++) {
    const double d = fabs((double)a[i] - r[i]);
    if (!(d <= diff)) diff = d;
    if (fabs(r[i]) > scale) scale = fabs(r[i]);
  }
  return diff / scale;
}

int bench_discover(const char *prog, bp_registry **r, bp_threads **pool) {
  *r = NULL, *pool = NULL;
  const bp_registry_options ro = bench_env_registry();
  if (bp_registry_create_with(&ro, r) != BP_OK || bp_registry_discover(*r, NULL, 0) != BP_OK ||
      bp_threads_create(bench_env_rank_threads(), pool) != BP_OK) {
    fprintf(stderr, "%s: %s\n", prog, bp_last_error());
    bp_registry_destroy(*r);
    *r = NULL;
    return 0;
  }
  return 1;
}

const bp_abi_kernel *bench_find_kernel(const bp_registry *r, const char *op, const char *impl) {
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(r, i)->kernel;
    if (strcmp(k->op, op) == 0 && strcmp(k->impl, impl) == 0 && strcmp(k->device, "cpu") == 0)
      return k;
  }
  return NULL;
}

/* n->reason becomes "step: " and the kernel's words; 0. */
static int failed(bench_node *n, const char *step) {
  char words[sizeof n->reason];
  memcpy(words, n->reason, sizeof words);
  words[sizeof words - 1] = '\0';
  snprintf(n->reason, sizeof n->reason, "%s: %.200s", step, words[0] ? words : "(no reason)");
  return 0;
}

int bench_node_open(bench_node *n, const bp_abi_kernel *k, const bench_buf *in, int nin,
                    const bench_buf *out, int nout, const void *attrs, uint32_t attr_size,
                    const bp_abi_threads *threads) {
  memset(n, 0, sizeof *n);
  n->k = k;
  if (nin > BENCH_MAX_ARGS || nout > BENCH_MAX_ARGS) {
    snprintf(n->reason, sizeof n->reason, "takes more than %d inputs or outputs", BENCH_MAX_ARGS);
    return 0;
  }
  for (int i = 0; i < nin; i++) n->in[i] = in[i].d, n->in_ptrs[i] = in[i].p;
  for (int o = 0; o < nout; o++) n->out[o] = out[o].d, n->out_ptrs[o] = out[o].p;
  bp_abi_kernel_args *a = &n->args;
  a->struct_size = sizeof *a;
  a->num_inputs = nin, a->num_outputs = nout;
  a->inputs = n->in, a->outputs = n->out;
  a->attrs = attrs, a->attr_size = attr_size;
  a->attr_version = BP_ABI_ATTR_VERSION;
  a->world_size = 1;
  a->threads = threads;
  if (k->supports && !k->supports(k->user, a, n->reason, sizeof n->reason))
    return failed(n, "refuses");
  const uint64_t need = k->workspace_size ? k->workspace_size(k->user, a) : 0;
  if (need > 0) {
    if (posix_memalign(&n->ws, 256, (size_t)need) != 0) {
      n->ws = NULL;
      snprintf(n->reason, sizeof n->reason, "has no memory for a workspace of %llu bytes",
               (unsigned long long)need);
      return 0;
    }
    a->workspace = n->ws, a->workspace_bytes = need;
  }
  a->input_ptrs = n->in_ptrs, a->output_ptrs = n->out_ptrs;
  n->generation = 1;
  a->params_generation = &n->generation;
  a->reason = n->reason, a->reason_size = sizeof n->reason;
  if (k->prepare && k->prepare(k->user, a, &n->state) != BP_ABI_OK) return failed(n, "prepare");
  a->state = n->state;
  return 1;
}

double bench_node_call(bench_node *n) {
  const double t0 = bench_now();
  if (n->k->run(n->k->user, &n->args) != BP_ABI_OK) return failed(n, "run") - 1;
  return bench_now() - t0;
}

double bench_node_best(bench_node *n, double seconds, int repack) {
  if (bench_node_call(n) < 0) return -1;
  double best = INFINITY;
  const double start = bench_now();
  for (int reps = 0; reps < 2 || bench_now() - start < seconds; reps++) {
    if (repack) n->generation++;
    const double t = bench_node_call(n);
    if (t < 0) return -1;
    if (t < best) best = t;
  }
  return best;
}

void bench_node_report(const bench_node *n, const char *prog) {
  fprintf(stderr, "%s: %s/%s %s\n", prog, n->k ? n->k->op : "?", n->k ? n->k->impl : "?",
          n->reason);
}

void bench_node_close(bench_node *n) {
  if (n->state && n->k->release) n->k->release(n->k->user, n->state);
  n->state = NULL;
  free(n->ws);
  n->ws = NULL;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
