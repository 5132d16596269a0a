/* MemoryPlan: semantic allocation per variant, then one layout for all.
 * Invariants are listed in plan.h and verified by bp_plan_check. */
#include "blueprint/plan.h"
#include "plan-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bp_plan {
  bp_plan_options options;
  int variant_count;
  bp_variant_info *variants;   /* [variant_count] */
  bp_dtensor **tensors;        /* [variant_count][tensor_count] */
  int32_t tensor_count;        /* fixed by variant 0 */
  int32_t tensor_cap;          /* capacity of tensors[0] while variant 0 runs */
  int32_t cursor;              /* next id in the open variant */
  int open;                    /* a variant is open */
  int finalized;
  bp_span regions[BP_REGION_COUNT];
  int32_t region_tensors[BP_REGION_COUNT];
  uint64_t total_bytes;
  /* liveness packing (invariant 8); NULL: not packed */
  uint64_t *packed_rel;  /* [tensor_count] offset of a packed region's tensor in its region */
  bp_live_range *live;   /* [variant_count * tensor_count] */
  uint64_t unpacked_bytes;
  void *attachment; /* plan-impl.h: owned, freed by attachment_free */
  void (*attachment_free)(void *);
  /* names of variant 0's tensors: open addressing, id + 1 (0: empty), a
   * power-of-two size at least twice the count; NULL: search linearly */
  int32_t *name_index;
  uint32_t name_index_cap;
};

static uint32_t name_hash(const char *s) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

static void index_put(int32_t *index, uint32_t cap, const bp_dtensor *ts, int32_t id) {
  for (uint32_t i = name_hash(ts[id].name) & (cap - 1);; i = (i + 1) & (cap - 1))
    if (index[i] == 0) {
      index[i] = id + 1;
      return;
    }
}

/* Adds tensor `id` of variant 0 to the index, growing it; out of memory
 * drops the index (lookups then search linearly, still correct). */
static void index_add(bp_plan *p, int32_t id) {
  if ((uint64_t)(id + 1) * 2 > p->name_index_cap) {
    uint32_t cap = p->name_index_cap ? 2 * p->name_index_cap : 256;
    int32_t *grown = cap > p->name_index_cap ? calloc(cap, sizeof *grown) : NULL;
    free(p->name_index);
    p->name_index = grown;
    p->name_index_cap = grown ? cap : 0;
    if (!grown) return;
    for (int32_t k = 0; k < id; k++) index_put(grown, cap, p->tensors[0], k);
  }
  if (p->name_index) index_put(p->name_index, p->name_index_cap, p->tensors[0], id);
}

const char *bp_optimizer_name(bp_optimizer opt) {
  switch (opt) {
  case BP_OPT_SGD: return "sgd";
  case BP_OPT_ADAMW: return "adamw";
  case BP_OPT_LARS: return "lars";
  }
  return "?";
}

int bp_optimizer_from_name(const char *name, bp_optimizer *out) {
  for (int o = BP_OPT_SGD; o <= BP_OPT_LARS; o++) {
    if (strcmp(name, bp_optimizer_name((bp_optimizer)o)) == 0) {
      *out = (bp_optimizer)o;
      return 0;
    }
  }
  return -1;
}

int bp_region_enabled(const bp_plan_options *o, bp_region region) {
  switch (bp_region_get(region)->enabled_by) {
  case BP_FEATURE_ALWAYS: return 1;
  case BP_FEATURE_AMP: return o->amp != 0;
  case BP_FEATURE_EMA: return o->ema != 0;
  case BP_FEATURE_MOMENT1: return 1; /* every optimizer keeps a first moment */
  case BP_FEATURE_MOMENT2: return o->optimizer == BP_OPT_ADAMW;
  case BP_FEATURE_LARS: return o->optimizer == BP_OPT_LARS;
  }
  return 0;
}

bp_status bp_plan_create(const bp_plan_options *options, bp_plan **plan_out) {
  if (!options || !plan_out) return bp_fail(BP_ERR_INVALID, "bp_plan_create: NULL argument");
  if ((int)options->optimizer < BP_OPT_SGD || options->optimizer > BP_OPT_LARS)
    return bp_fail(BP_ERR_INVALID, "unknown optimizer %d", (int)options->optimizer);
  bp_plan *p = calloc(1, sizeof *p);
  if (!p) return bp_fail(BP_ERR_NOMEM, "out of memory creating a plan");
  p->options = *options;
  *plan_out = p;
  return BP_OK;
}

void bp_plan_attach(bp_plan *plan, void *data, void (*free_fn)(void *)) {
  if (plan->attachment && plan->attachment_free) plan->attachment_free(plan->attachment);
  plan->attachment = data;
  plan->attachment_free = free_fn;
}

const void *bp_plan_attachment(const bp_plan *plan) { return plan ? plan->attachment : NULL; }

void bp_plan_destroy(bp_plan *plan) {
  if (!plan) return;
  bp_plan_attach(plan, NULL, NULL);
  free(plan->name_index);
  free(plan->packed_rel);
  free(plan->live);
  for (int v = 0; v < plan->variant_count; v++) free(plan->tensors[v]);
  free(plan->tensors);
  free(plan->variants);
  free(plan);
}

bp_status bp_plan_begin_variant(bp_plan *p, const char *name, int64_t batch, int64_t height,
                                int64_t width) {
  if (p->open || p->finalized)
    return bp_fail(BP_ERR_STATE, "variant '%s' begun while another is open or after finalize",
                   name);
  if (strlen(name) >= BP_NAME_MAX || name[0] == '\0')
    return bp_fail(BP_ERR_INVALID, "variant name '%s' is empty or too long", name);
  if (batch < 1 || height < 1 || width < 1)
    return bp_fail(BP_ERR_INVALID, "variant '%s': batch %lld, %lldx%lld must all be >= 1", name,
                   (long long)batch, (long long)height, (long long)width);
  if (bp_plan_find_variant(p, name) >= 0)
    return bp_fail(BP_ERR_INVALID, "variant '%s' is defined twice", name);
  int n = p->variant_count;
  bp_variant_info *vi = realloc(p->variants, (size_t)(n + 1) * sizeof *vi);
  if (!vi) return bp_fail(BP_ERR_NOMEM, "out of memory adding variant '%s'", name);
  p->variants = vi;
  bp_dtensor **ts = realloc(p->tensors, (size_t)(n + 1) * sizeof *ts);
  if (!ts) return bp_fail(BP_ERR_NOMEM, "out of memory adding variant '%s'", name);
  p->tensors = ts;
  ts[n] = NULL;
  if (n > 0 && p->tensor_count > 0) {
    ts[n] = calloc((size_t)p->tensor_count, sizeof **ts);
    if (!ts[n]) return bp_fail(BP_ERR_NOMEM, "out of memory adding variant '%s'", name);
  }
  memset(&vi[n], 0, sizeof vi[n]);
  memcpy(vi[n].name, name, strlen(name));
  vi[n].batch = batch;
  vi[n].height = height;
  vi[n].width = width;
  p->variant_count = n + 1;
  p->cursor = 0;
  p->open = 1;
  if (n == 0) p->tensor_cap = 0;
  return BP_OK;
}

bp_status bp_plan_end_variant(bp_plan *p) {
  if (!p->open) return bp_fail(BP_ERR_STATE, "end_variant without begin_variant");
  int v = p->variant_count - 1;
  if (v == 0) {
    p->tensor_count = p->cursor;
  } else if (p->cursor != p->tensor_count) {
    return bp_fail(BP_ERR_SHAPE, "variant '%s' allocated %d tensors, variant '%s' %d",
                   p->variants[v].name, (int)p->cursor, p->variants[0].name,
                   (int)p->tensor_count);
  }
  p->open = 0;
  return BP_OK;
}

static int shape_eq(bp_shape a, bp_shape b) {
  return a.n == b.n && a.h == b.h && a.w == b.w && a.c == b.c;
}

/* Appends one tensor to the open variant. `fixed` tensors (parameters, BN
 * statistics) must have the same shape in every variant. */
static bp_status add_tensor(bp_plan *p, const char *name, bp_shape shape, bp_dtype dtype,
                            bp_region region, bp_init init, int fixed, int32_t *id_out) {
  if (!p->open) return bp_fail(BP_ERR_STATE, "tensor '%s' allocated outside a variant", name);
  if (!bp_region_enabled(&p->options, region))
    return bp_fail(BP_ERR_STATE, "tensor '%s': region %s is disabled", name,
                   bp_region_get(region)->name);
  bp_dtype want = bp_region_get(region)->dtype;
  if (want != BP_DTYPE_ANY && want != dtype)
    return bp_fail(BP_ERR_INVALID, "tensor '%s': region %s holds %s, not %s", name,
                   bp_region_get(region)->name, bp_dtype_name(want), bp_dtype_name(dtype));
  if (strlen(name) >= BP_NAME_MAX)
    return bp_fail(BP_ERR_INVALID, "tensor name '%s' is longer than %d bytes", name,
                   BP_NAME_MAX - 1);
  int v = p->variant_count - 1;
  int32_t id = p->cursor;
  bp_dtensor t;
  bp_status st = bp_dtensor_make(&t, id, name, shape, dtype, region, 0, init);
  if (st != BP_OK) {
    char why[512]; /* copied: bp_fail must not read the buffer it writes */
    snprintf(why, sizeof why, "%s", bp_last_error());
    return bp_fail(st, "tensor '%s' in variant '%s': %s", name, p->variants[v].name, why);
  }
  if (v == 0) {
    if (bp_plan_find_tensor(p, name) >= 0)
      return bp_fail(BP_ERR_INVALID, "tensor name '%s' is used twice", name);
    if (id == p->tensor_cap) {
      int32_t cap = p->tensor_cap ? 2 * p->tensor_cap : 64;
      bp_dtensor *grown = realloc(p->tensors[0], (size_t)cap * sizeof *grown);
      if (!grown) return bp_fail(BP_ERR_NOMEM, "out of memory allocating tensor '%s'", name);
      p->tensors[0] = grown;
      p->tensor_cap = cap;
    }
  } else {
    const bp_dtensor *first = id < p->tensor_count ? &p->tensors[0][id] : NULL;
    if (!first || strcmp(first->name, name) != 0 || first->region != region ||
        first->dtype != dtype)
      return bp_fail(BP_ERR_SHAPE,
                     "variant '%s' allocates '%s' as tensor %d where variant '%s' has '%s'",
                     p->variants[v].name, name, (int)id, p->variants[0].name,
                     first ? first->name : "(none)");
    if (fixed && !shape_eq(first->shape, shape))
      return bp_fail(BP_ERR_SHAPE,
                     "parameter '%s' is [%lld,%lld,%lld,%lld] in variant '%s' but "
                     "[%lld,%lld,%lld,%lld] in '%s'; parameters cannot change across variants",
                     name, (long long)shape.n, (long long)shape.h, (long long)shape.w,
                     (long long)shape.c, p->variants[v].name, (long long)first->shape.n,
                     (long long)first->shape.h, (long long)first->shape.w,
                     (long long)first->shape.c, p->variants[0].name);
  }
  p->tensors[v][id] = t;
  p->cursor = id + 1;
  if (v == 0) index_add(p, id);
  if (id_out) *id_out = id;
  return BP_OK;
}

/* name + suffix, checked against BP_NAME_MAX. */
static bp_status suffixed(char out[BP_NAME_MAX], const char *name, const char *suffix) {
  size_t a = strlen(name), b = strlen(suffix);
  if (a + b >= BP_NAME_MAX)
    return bp_fail(BP_ERR_INVALID, "tensor name '%s%s' is longer than %d bytes", name, suffix,
                   BP_NAME_MAX - 1);
  memcpy(out, name, a);
  memcpy(out + a, suffix, b + 1);
  return BP_OK;
}

static bp_status add_family_member(bp_plan *p, bp_param_family family, bp_param_kind kind,
                                   const char *name, const char *suffix, bp_shape shape,
                                   bp_dtype dtype, bp_init init, int32_t *id_out) {
  *id_out = -1;
  bp_region region = bp_region_of_param(family, kind);
  if (!bp_region_enabled(&p->options, region)) return BP_OK;
  char full[BP_NAME_MAX];
  bp_status st = suffixed(full, name, suffix);
  if (st != BP_OK) return st;
  return add_tensor(p, full, shape, dtype, region, init, 1, id_out);
}

bp_status bp_plan_alloc_param(bp_plan *p, bp_param_kind kind, const char *name, bp_shape shape,
                              bp_init init, bp_param_ids *ids_out) {
  if ((int)kind < 0 || kind >= BP_PARAM_KIND_COUNT)
    return bp_fail(BP_ERR_INVALID, "parameter '%s': unknown kind %d", name, (int)kind);
  const bp_init none = {BP_INIT_NONE, 0, 0, 0}, zeros = {BP_INIT_ZEROS, 0, 0, 0};
  bp_param_ids ids;
  bp_status st;
#define MEMBER(family, suffix, dtype, rule, field)                                                 \
  if ((st = add_family_member(p, family, kind, name, suffix, shape, dtype, rule, &ids.field)) != \
      BP_OK)                                                                                       \
    return st;
  MEMBER(BP_FAMILY_W, "", BP_DTYPE_FP32, init, w)
  MEMBER(BP_FAMILY_E, ".ema", BP_DTYPE_FP32, none, e) /* starts as a copy of W */
  MEMBER(BP_FAMILY_A, ".fp16", BP_DTYPE_FP16, none, a)  /* cast from W each step */
  MEMBER(BP_FAMILY_G, ".grad", BP_DTYPE_FP32, zeros, g)
  MEMBER(BP_FAMILY_G16, ".grad16", BP_DTYPE_FP16, none, g16)
  MEMBER(BP_FAMILY_M, ".m", BP_DTYPE_FP32, zeros, m)
  MEMBER(BP_FAMILY_V, ".v", BP_DTYPE_FP32, zeros, v)
#undef MEMBER
  ids.n = -1;
  if (bp_region_enabled(&p->options, BP_REGION_N)) {
    char full[BP_NAME_MAX];
    if ((st = suffixed(full, name, ".norm")) != BP_OK) return st;
    if ((st = add_tensor(p, full, (bp_shape){1, 1, 1, 2}, BP_DTYPE_FP32, BP_REGION_N, zeros, 1,
                         &ids.n)) != BP_OK)
      return st;
  }
  if (ids_out) *ids_out = ids;
  return BP_OK;
}

bp_status bp_plan_alloc_bn_stats(bp_plan *p, const char *name, int64_t channels,
                                 int32_t mean_var_ids_out[2]) {
  char full[BP_NAME_MAX];
  bp_shape s = {1, 1, 1, channels};
  bp_status st;
  if ((st = suffixed(full, name, ".running_mean")) != BP_OK ||
      (st = add_tensor(p, full, s, BP_DTYPE_FP32, BP_REGION_B, (bp_init){BP_INIT_ZEROS, 0, 0, 0},
                       1, &mean_var_ids_out[0])) != BP_OK)
    return st;
  if ((st = suffixed(full, name, ".running_var")) != BP_OK ||
      (st = add_tensor(p, full, s, BP_DTYPE_FP32, BP_REGION_B, (bp_init){BP_INIT_ONES, 0, 0, 0},
                       1, &mean_var_ids_out[1])) != BP_OK)
    return st;
  return BP_OK;
}

bp_status bp_plan_alloc_feature(bp_plan *p, const char *name, bp_shape shape, bp_dtype dtype,
                                int32_t *id_out) {
  if (dtype != BP_DTYPE_FP32 && dtype != BP_DTYPE_FP16)
    return bp_fail(BP_ERR_INVALID, "feature '%s' must be fp32 or fp16, not %s", name,
                   bp_dtype_name(dtype));
  bp_region region = dtype == BP_DTYPE_FP16 ? BP_REGION_F16 : BP_REGION_F32;
  return add_tensor(p, name, shape, dtype, region, (bp_init){0}, 0, id_out);
}

bp_status bp_plan_alloc_input(bp_plan *p, const char *name, bp_shape shape, bp_dtype dtype,
                              int32_t ids_out[2]) {
  char full[BP_NAME_MAX];
  bp_status st;
  if ((st = suffixed(full, name, ".a")) != BP_OK ||
      (st = add_tensor(p, full, shape, dtype, BP_REGION_I_A, (bp_init){0}, 0, &ids_out[0])) !=
          BP_OK)
    return st;
  if ((st = suffixed(full, name, ".b")) != BP_OK ||
      (st = add_tensor(p, full, shape, dtype, BP_REGION_I_B, (bp_init){0}, 0, &ids_out[1])) !=
          BP_OK)
    return st;
  return BP_OK;
}

bp_status bp_plan_alloc_result(bp_plan *p, const char *name, bp_shape shape, int32_t *id_out) {
  return add_tensor(p, name, shape, BP_DTYPE_FP32, BP_REGION_R, (bp_init){BP_INIT_ZEROS, 0, 0, 0},
                    0, id_out);
}

bp_status bp_plan_alloc_scalar(bp_plan *p, const char *name, bp_dtype dtype, bp_init init,
                               int32_t *id_out) {
  return add_tensor(p, name, (bp_shape){1, 1, 1, 1}, dtype, BP_REGION_S_SCALAR, init, 1, id_out);
}

bp_status bp_plan_alloc_mask(bp_plan *p, const char *name, bp_shape shape, int32_t *id_out) {
  return add_tensor(p, name, shape, BP_DTYPE_INT8, BP_REGION_S_MASK, (bp_init){0}, 0, id_out);
}

bp_status bp_plan_alloc_temp(bp_plan *p, const char *name, bp_shape shape, bp_dtype dtype,
                             int32_t *id_out) {
  return add_tensor(p, name, shape, dtype, BP_REGION_T, (bp_init){0}, 0, id_out);
}

/* Regions in enum order; tensors in allocation order inside each, but
 * for a packed region of a packed plan, at their packed offsets. */
static bp_status layout(bp_plan *p) {
  uint64_t cursor = 0;
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    const uint64_t base = cursor;
    const int packed = p->packed_rel && bp_region_is_packed((bp_region)r);
    p->regions[r].offset = base;
    p->region_tensors[r] = 0;
    for (int32_t id = 0; id < p->tensor_count; id++) {
      bp_dtensor *t0 = &p->tensors[0][id];
      if ((int)t0->region != r) continue;
      uint64_t at = packed ? base + p->packed_rel[id] : cursor, end;
      if (at < base || __builtin_add_overflow(at, t0->slot_bytes, &end))
        return bp_fail(BP_ERR_OVERFLOW, "plan size overflows 64 bits at tensor '%s'", t0->name);
      for (int v = 0; v < p->variant_count; v++) p->tensors[v][id].offset = at;
      if (end > cursor) cursor = end;
      p->region_tensors[r]++;
    }
    p->regions[r].bytes = cursor - base;
  }
  if (cursor > (uint64_t)PTRDIFF_MAX)
    return bp_fail(BP_ERR_OVERFLOW, "plan of %llu bytes exceeds the address space",
                   (unsigned long long)cursor);
  p->total_bytes = cursor;
  return BP_OK;
}

bp_status bp_plan_finalize(bp_plan *p) {
  if (p->open || p->finalized || p->variant_count == 0)
    return bp_fail(BP_ERR_STATE, "finalize needs at least one closed variant, once");
  /* slot of each id = max over variants */
  for (int32_t id = 0; id < p->tensor_count; id++) {
    uint64_t slot = 0;
    for (int v = 0; v < p->variant_count; v++)
      if (p->tensors[v][id].slot_bytes > slot) slot = p->tensors[v][id].slot_bytes;
    for (int v = 0; v < p->variant_count; v++) p->tensors[v][id].slot_bytes = slot;
  }
  bp_status st = layout(p);
  if (st != BP_OK) return st;
  p->unpacked_bytes = p->total_bytes;
  p->finalized = 1;
  return bp_plan_check(p);
}

bp_status bp_plan_pack(bp_plan *p, const uint64_t *rel_offsets, const bp_live_range *live) {
  if (!p->finalized || p->packed_rel)
    return bp_fail(BP_ERR_STATE, "pack needs a finalized plan, once");
  const size_t n = (size_t)p->tensor_count, cells = (size_t)p->variant_count * n;
  p->packed_rel = malloc((n ? n : 1) * sizeof *p->packed_rel);
  p->live = malloc((cells ? cells : 1) * sizeof *p->live);
  if (!p->packed_rel || !p->live) return bp_fail(BP_ERR_NOMEM, "out of memory packing a plan");
  for (size_t id = 0; id < n; id++)
    p->packed_rel[id] = bp_region_is_packed(p->tensors[0][id].region) ? rel_offsets[id] : 0;
  memcpy(p->live, live, cells * sizeof *p->live);
  bp_status st = layout(p);
  return st != BP_OK ? st : bp_plan_check(p);
}

int bp_plan_is_finalized(const bp_plan *p) { return p->finalized; }
const bp_plan_options *bp_plan_get_options(const bp_plan *p) { return &p->options; }
int bp_plan_variant_count(const bp_plan *p) { return p->variant_count; }

const bp_variant_info *bp_plan_variant(const bp_plan *p, int v) {
  return v >= 0 && v < p->variant_count ? &p->variants[v] : NULL;
}

int bp_plan_find_variant(const bp_plan *p, const char *name) {
  for (int v = 0; v < p->variant_count; v++)
    if (strcmp(p->variants[v].name, name) == 0) return v;
  return -1;
}

int32_t bp_plan_tensor_count(const bp_plan *p) { return p->tensor_count; }

const bp_dtensor *bp_plan_tensor(const bp_plan *p, int v, int32_t id) {
  if (v < 0 || v >= p->variant_count || id < 0 || id >= p->tensor_count) return NULL;
  return &p->tensors[v][id];
}

int32_t bp_plan_find_tensor(const bp_plan *p, const char *name) {
  /* while variant 0 is open its tensors are counted by the cursor */
  int32_t n = p->variant_count == 1 && p->open ? p->cursor : p->tensor_count;
  if (p->name_index) {
    const uint32_t mask = p->name_index_cap - 1;
    for (uint32_t i = name_hash(name) & mask; p->name_index[i]; i = (i + 1) & mask) {
      int32_t id = p->name_index[i] - 1;
      if (id < n && strcmp(p->tensors[0][id].name, name) == 0) return id;
    }
    return -1;
  }
  for (int32_t id = 0; id < n; id++)
    if (strcmp(p->tensors[0][id].name, name) == 0) return id;
  return -1;
}

uint64_t bp_plan_total_bytes(const bp_plan *p) { return p->total_bytes; }

int bp_plan_is_packed(const bp_plan *p) { return p->packed_rel != NULL; }
uint64_t bp_plan_unpacked_bytes(const bp_plan *p) { return p->unpacked_bytes; }

bp_live_range bp_plan_live_range(const bp_plan *p, int v, int32_t id) {
  const bp_live_range none = {-1, -1};
  if (!p->live || v < 0 || v >= p->variant_count || id < 0 || id >= p->tensor_count ||
      !bp_region_is_packed(p->tensors[0][id].region))
    return none;
  return p->live[(size_t)v * (size_t)p->tensor_count + (size_t)id];
}

bp_span bp_plan_region_span(const bp_plan *p, bp_region region) { return p->regions[region]; }

int32_t bp_plan_region_tensor_count(const bp_plan *p, bp_region region) {
  return p->region_tensors[region];
}

bp_status bp_plan_resolve(const bp_plan *p, bp_region first, bp_region last, bp_span *out) {
  if (!p->finalized) return bp_fail(BP_ERR_STATE, "resolve before finalize");
  if ((int)first < 0 || last >= BP_REGION_COUNT || first > last)
    return bp_fail(BP_ERR_INVALID, "region span %d..%d is not in order", (int)first, (int)last);
  out->offset = p->regions[first].offset;
  out->bytes = p->regions[last].offset + p->regions[last].bytes - out->offset;
  return BP_OK;
}

/* Whether `region` is reduced in `bucket`: under AMP the FP16 gradients are
 * reduced and the FP32 ones derived from them, so G_* leave their bucket. */
static int in_bucket(const bp_plan_options *o, bp_region r, int bucket) {
  if (bp_region_get(r)->bucket != bucket || !bp_region_enabled(o, r)) return 0;
  return !(o->amp && r >= BP_REGION_G_BN_BIAS && r <= BP_REGION_G_CONV_DEEP);
}

bp_status bp_plan_bucket_span(const bp_plan *p, int bucket, bp_span *out) {
  int first = -1, last = -1;
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    if (!in_bucket(&p->options, (bp_region)r, bucket)) continue;
    if (first < 0) first = r;
    last = r;
  }
  if (first < 0) {
    *out = (bp_span){0, 0};
    return BP_OK;
  }
  return bp_plan_resolve(p, (bp_region)first, (bp_region)last, out);
}
