/* The data of a profile: nodes, variants, steps (profile.h). */
#include "blueprint/profile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blueprint/op_table.h"
#include "bp_abi_sdk.h"
#include "profile-impl.h"

struct bp_profile {
  bp_profile_options options;
  bp_profile_node *nodes;
  int node_count, node_cap;
  bp_profile_variant *variants;
  int variant_count, variant_cap;
  int current;       /* variant of the step under way, -1 between steps */
  uint64_t step_t0;  /* its start */
  int stepped;       /* a step was recorded: no more nodes */
  bp_profile_sgemm sgemm;  /* over the pool below */
  uint64_t *sgemm_pool;    /* every measurement's run times, BP_PROFILE_SGEMM_POOL */
  int sgemm_pooled;
};

bp_status bp_profile_create(const bp_profile_options *options, bp_profile **out) {
  if (!out) return bp_fail(BP_ERR_INVALID, "bp_profile_create: NULL argument");
  bp_profile *p = calloc(1, sizeof *p);
  if (!p) return bp_fail(BP_ERR_NOMEM, "out of memory creating a profile");
  if (options) p->options = *options;
  if (p->options.sgemm_size == 0) p->options.sgemm_size = BP_PROFILE_SGEMM_SIZE;
  p->current = -1;
  snprintf(p->sgemm.why, sizeof p->sgemm.why, "not measured");
  *out = p;
  return BP_OK;
}

void bp_profile_destroy(bp_profile *p) {
  if (!p) return;
  free(p->nodes);
  free(p->variants);
  free(p->sgemm_pool);
  free(p);
}

/* ---- FLOPs ------------------------------------------------------------------ */

static uint64_t elems(const bp_abi_tensor *t, int first, int last) {
  uint64_t n = 1;
  for (int d = first; d <= last; d++) n *= t->shape[d] > 0 ? (uint64_t)t->shape[d] : 0;
  return n;
}

static const bp_abi_tensor *tensor_of(const bp_abi_kernel_args *a, bp_op_ref r) {
  if (r.output) return r.index < a->num_outputs ? bp_sdk_output(a, r.index) : NULL;
  return r.index < a->num_inputs ? bp_sdk_input(a, r.index) : NULL;
}

/* The op table's FLOPs (blueprint/op_table.h): conv 2 * (N*OH*OW) *
 * (K*kh*kw*C/groups), fc 2 * N * (out*in); 0 for ops it counts none of. */
uint64_t bp_profile_op_flops(const char *op, const bp_abi_kernel_args *a) {
  const bp_op_info *info = bp_op_find(op);
  if (!info || !info->has_flops || !a) return 0;
  const bp_abi_tensor *rows = tensor_of(a, info->flops_rows), *w = tensor_of(a, info->flops_weight);
  return rows && w ? 2 * elems(rows, 0, 2) * elems(w, 0, 3) : 0;
}

/* ---- recording -------------------------------------------------------------- */

bp_status bp_profile_add_variant(bp_profile *p, int variant, const char *name) {
  if (!p || variant != p->variant_count)
    return bp_fail(BP_ERR_INVALID, "bp_profile_add_variant: variant %d out of order", variant);
  if (p->stepped) return bp_fail(BP_ERR_STATE, "bp_profile_add_variant: steps were recorded");
  if (p->variant_count == p->variant_cap) {
    const int cap = p->variant_cap ? 2 * p->variant_cap : 8;
    bp_profile_variant *v = realloc(p->variants, (size_t)cap * sizeof *v);
    if (!v) return bp_fail(BP_ERR_NOMEM, "out of memory in a profile");
    p->variants = v;
    p->variant_cap = cap;
  }
  p->variants[p->variant_count++] = (bp_profile_variant){.name = name};
  return BP_OK;
}

bp_status bp_profile_add_node(bp_profile *p, int variant, bp_segment segment, const char *name,
                              const char *op, const char *impl, const bp_abi_kernel_args *args,
                              int *slot_out) {
  if (!p || !slot_out || variant < 0 || variant >= p->variant_count)
    return bp_fail(BP_ERR_INVALID, "bp_profile_add_node: variant %d not declared", variant);
  if (p->stepped) return bp_fail(BP_ERR_STATE, "bp_profile_add_node: steps were recorded");
  if (p->node_count == p->node_cap) {
    const int cap = p->node_cap ? 2 * p->node_cap : 64;
    bp_profile_node *n = realloc(p->nodes, (size_t)cap * sizeof *n);
    if (!n) return bp_fail(BP_ERR_NOMEM, "out of memory in a profile");
    p->nodes = n;
    p->node_cap = cap;
  }
  p->nodes[p->node_count] = (bp_profile_node){.variant = variant,
                                              .segment = segment,
                                              .name = name,
                                              .op = op,
                                              .impl = impl,
                                              .flops = bp_profile_op_flops(op, args)};
  *slot_out = p->node_count++;
  return BP_OK;
}

uint64_t bp_profile_now_ns(void) { return bp_exec_now_ns(); }

void bp_profile_step_begin(bp_profile *p, int variant) {
  BP_ASSERT(p->current < 0 && variant >= 0 && variant < p->variant_count);
  p->stepped = 1;
  p->current = variant;
  p->step_t0 = bp_profile_now_ns();
}

void bp_profile_step_end(bp_profile *p) {
  BP_ASSERT(p->current >= 0);
  bp_profile_variant *v = &p->variants[p->current];
  v->step_ns += bp_profile_now_ns() - p->step_t0;
  v->steps++;
  p->current = -1;
}

int bp_profile_recording(const bp_profile *p) { return p->current >= 0; }

void bp_profile_node_time(bp_profile *p, int slot, uint64_t ns) {
  p->nodes[slot].calls++;
  p->nodes[slot].ns += ns;
}

void bp_profile_run_time(bp_profile *p, int variant, uint64_t ns) {
  p->variants[variant].run_ns += ns;
}

/* ---- the executor's timer -------------------------------------------------- */

static bp_status timer_add_variant(void *p, int variant, const char *name) {
  return bp_profile_add_variant(p, variant, name);
}

static bp_status timer_add_node(void *p, int variant, bp_segment segment, const char *name,
                                const char *op, const char *impl, const bp_abi_kernel_args *args,
                                int *slot_out) {
  return bp_profile_add_node(p, variant, segment, name, op, impl, args, slot_out);
}

static int timer_recording(const void *p) { return bp_profile_recording(p); }
static void timer_node_time(void *p, int slot, uint64_t ns) { bp_profile_node_time(p, slot, ns); }
static void timer_run_time(void *p, int variant, uint64_t ns) {
  bp_profile_run_time(p, variant, ns);
}

bp_status bp_exec_set_profile(bp_exec *x, bp_profile *p) {
  if (!x) return bp_fail(BP_ERR_INVALID, "bp_exec_set_profile: NULL executor");
  if (!p) return bp_exec_set_timer(x, NULL);
  if (bp_profile_variant_count(p) != 0)
    return bp_fail(BP_ERR_STATE, "bp_exec_set_profile: the profile is attached elsewhere");
  const bp_exec_timer timer = {.ctx = p,
                               .add_variant = timer_add_variant,
                               .add_node = timer_add_node,
                               .recording = timer_recording,
                               .node_time = timer_node_time,
                               .run_time = timer_run_time};
  return bp_exec_set_timer(x, &timer);
}

/* ---- reading ---------------------------------------------------------------- */

int bp_profile_variant_count(const bp_profile *p) { return p ? p->variant_count : 0; }

const bp_profile_variant *bp_profile_variant_at(const bp_profile *p, int v) {
  return p && v >= 0 && v < p->variant_count ? &p->variants[v] : NULL;
}

int bp_profile_variant_find(const bp_profile *p, const char *name) {
  for (int v = 0; p && name && v < p->variant_count; v++)
    if (p->variants[v].name && strcmp(p->variants[v].name, name) == 0) return v;
  return -1;
}

int bp_profile_node_count(const bp_profile *p) { return p ? p->node_count : 0; }

const bp_profile_node *bp_profile_node_at(const bp_profile *p, int i) {
  return p && i >= 0 && i < p->node_count ? &p->nodes[i] : NULL;
}

static int by_time(const void *a, const void *b) {
  const bp_profile_op *x = a, *y = b;
  if (x->ns != y->ns) return x->ns < y->ns ? 1 : -1;
  const int c = strcmp(x->op, y->op);
  return c ? c : strcmp(x->impl, y->impl);
}

int bp_profile_ops(const bp_profile *p, int variant, bp_profile_op *out, int max) {
  if (!p) return 0;
  bp_profile_op *all = calloc((size_t)p->node_count + 1, sizeof *all);
  if (!all) return 0;
  int count = 0;
  for (int i = 0; i < p->node_count; i++) {
    const bp_profile_node *n = &p->nodes[i];
    if (n->variant != variant) continue;
    int j = 0;
    while (j < count && (strcmp(all[j].op, n->op) || strcmp(all[j].impl, n->impl))) j++;
    if (j == count) all[count++] = (bp_profile_op){.op = n->op, .impl = n->impl};
    all[j].nodes++;
    all[j].calls += n->calls;
    all[j].ns += n->ns;
    all[j].flops += n->flops * n->calls;
  }
  qsort(all, (size_t)count, sizeof *all, by_time);
  if (out) memcpy(out, all, (size_t)(count < max ? count : max) * sizeof *all);
  free(all);
  return count;
}

const bp_profile_sgemm *bp_profile_sgemm_rate(const bp_profile *p) { return p ? &p->sgemm : NULL; }

uint64_t bp_profile_work_flops(const bp_profile *p, int variant, int *trains) {
  uint64_t forward = 0;
  int backward = 0;
  for (int i = 0; p && i < p->node_count; i++) {
    const bp_profile_node *n = &p->nodes[i];
    if (n->variant != variant) continue;
    if (n->segment == BP_SEGMENT_BACKWARD) backward = 1;
    const size_t len = strlen(n->op);
    if (len > 4 && strcmp(n->op + len - 4, ".fwd") == 0) forward += n->flops;
  }
  if (trains) *trains = backward;
  return backward ? 3 * forward : forward;
}

double bp_profile_floor_share(const bp_profile *p, int variant, double gflops) {
  const bp_profile_variant *pv = bp_profile_variant_at(p, variant);
  const uint64_t work = bp_profile_work_flops(p, variant, NULL);
  if (!pv || !pv->steps || !pv->step_ns || !work || !(gflops > 0)) return NAN;
  /* FLOPs / (FLOP per ns) = ns of the floor, against ns per step */
  return (double)work / gflops * (double)pv->steps / (double)pv->step_ns;
}

void bp_profile_measure_sgemm(bp_profile *p, bp_registry *registry, const char *device,
                              const bp_abi_threads *threads) {
  if (!p) return;
  if (p->options.sgemm_size < 0) {
    snprintf(p->sgemm.why, sizeof p->sgemm.why, "not measured (switched off)");
    return;
  }
  if (p->sgemm_pooled >= BP_PROFILE_SGEMM_POOL) return; /* the pool is full */
  if (!p->sgemm_pool && !(p->sgemm_pool = malloc(BP_PROFILE_SGEMM_POOL * sizeof *p->sgemm_pool))) {
    if (!p->sgemm.measured) snprintf(p->sgemm.why, sizeof p->sgemm.why, "out of memory");
    return;
  }
  bp_profile_sgemm m;
  bp_profile_sgemm_measure(registry, device, threads, p->options.sgemm_size, &m);
  if (!m.measured) { /* an earlier measurement stands */
    if (!p->sgemm.measured) p->sgemm = m;
    return;
  }
  const int measurements = p->sgemm.measured ? p->sgemm.measurements + 1 : 1;
  for (int r = 0; r < m.runs && p->sgemm_pooled < BP_PROFILE_SGEMM_POOL; r++)
    p->sgemm_pool[p->sgemm_pooled++] = m.run_ns[r];
  p->sgemm = m;
  p->sgemm.measurements = measurements;
  bp_profile_sgemm_rates(&p->sgemm, p->sgemm_pool, p->sgemm_pooled);
}
