/* bp_plan_check: verifies the numbered invariants of plan.h on a finalized
 * plan. Called by finalize and by the tests; cheap (linear in tensors). */
#include <inttypes.h>
#include <stdlib.h>

#include "blueprint/plan.h"

#define BROKEN(...) bp_fail(BP_ERR_STATE, "plan invariant " __VA_ARGS__)

static bp_status check_layout(const bp_plan *p) {
  uint64_t expect_base = 0;
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    bp_span s = bp_plan_region_span(p, (bp_region)r);
    const char *name = bp_region_get((bp_region)r)->name;
    if (s.offset != expect_base) return BROKEN("1: region %s does not follow its neighbour", name);
    if (s.offset % BP_SLOT_ALIGN) return BROKEN("3: region %s base is not 256-aligned", name);
    if (!bp_region_enabled(bp_plan_get_options(p), (bp_region)r) && s.bytes != 0)
      return BROKEN("5: disabled region %s holds %" PRIu64 " bytes", name, s.bytes);
    /* invariant 2: the region's tensors tile it in allocation order;
     * invariant 8: a packed region's lie inside it, the last end closing it */
    const int packed = bp_plan_is_packed(p) && bp_region_is_packed((bp_region)r);
    uint64_t cursor = s.offset;
    for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
      const bp_dtensor *t = bp_plan_tensor(p, 0, id);
      if ((int)t->region != r) continue;
      if (packed) {
        if (t->offset < s.offset)
          return BROKEN("8: packed tensor '%s' lies before region %s", t->name, name);
        if (t->offset + t->slot_bytes > cursor) cursor = t->offset + t->slot_bytes;
        continue;
      }
      if (t->offset != cursor) return BROKEN("2: tensor '%s' is not at its region cursor", t->name);
      cursor += t->slot_bytes;
    }
    if (cursor != s.offset + s.bytes) return BROKEN("2: region %s is not tiled by its tensors", name);
    expect_base = cursor;
  }
  if (expect_base != bp_plan_total_bytes(p)) return BROKEN("1: total bytes differ from regions");
  return BP_OK;
}

static bp_status check_variants(const bp_plan *p) {
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *t0 = bp_plan_tensor(p, 0, id);
    if (t0->offset % BP_SLOT_ALIGN || t0->slot_bytes % BP_SLOT_ALIGN)
      return BROKEN("3: tensor '%s' offset or slot is not a multiple of 256", t0->name);
    uint64_t max_own = 0;
    for (int v = 0; v < bp_plan_variant_count(p); v++) {
      const bp_dtensor *t = bp_plan_tensor(p, v, id);
      if (t->id != id || t->offset != t0->offset || t->slot_bytes != t0->slot_bytes)
        return BROKEN("4: tensor '%s' differs in variant '%s'", t0->name,
                      bp_plan_variant(p, v)->name);
      uint64_t own;
      if (bp_dtensor_slot_bytes(t->dtype, t->region, t->shape, &own) != BP_OK)
        return BROKEN("4: tensor '%s' has no valid slot", t->name);
      if (own > max_own) max_own = own;
    }
    if (max_own != t0->slot_bytes)
      return BROKEN("4: tensor '%s' slot is not the max across variants", t0->name);
  }
  return BP_OK;
}

/* Invariant 6: family member k of each kind sits at W's relative offset,
 * scaled by 1/2 for the FP16 families, with the matching slot. */
static bp_status check_families(const bp_plan *p) {
  for (int k = 0; k < BP_PARAM_KIND_COUNT; k++) {
    bp_region wr = bp_region_of_param(BP_FAMILY_W, (bp_param_kind)k);
    bp_span ws = bp_plan_region_span(p, wr);
    for (int f = BP_FAMILY_E; f < BP_FAMILY_COUNT; f++) {
      bp_region fr = bp_region_of_param((bp_param_family)f, (bp_param_kind)k);
      if (!bp_region_enabled(bp_plan_get_options(p), fr)) continue;
      int half = bp_region_get(fr)->dtype == BP_DTYPE_FP16;
      bp_span fs = bp_plan_region_span(p, fr);
      if ((half ? 2 * fs.bytes : fs.bytes) != ws.bytes)
        return BROKEN("6: region %s is not %s region %s", bp_region_get(fr)->name,
                      half ? "half of" : "the size of", bp_region_get(wr)->name);
      /* pair the i-th tensor of each region */
      int32_t wi = 0, fi = 0, n = bp_plan_tensor_count(p);
      for (;;) {
        while (wi < n && bp_plan_tensor(p, 0, wi)->region != wr) wi++;
        while (fi < n && bp_plan_tensor(p, 0, fi)->region != fr) fi++;
        if (wi == n || fi == n) break;
        const bp_dtensor *w = bp_plan_tensor(p, 0, wi), *t = bp_plan_tensor(p, 0, fi);
        uint64_t wrel = w->offset - ws.offset, trel = t->offset - fs.offset;
        if ((half ? 2 * trel : trel) != wrel || (half ? 2 * t->slot_bytes : t->slot_bytes) !=
                                                    w->slot_bytes)
          return BROKEN("6: '%s' does not mirror '%s'", t->name, w->name);
        wi++;
        fi++;
      }
      if (wi != fi && (wi < n || fi < n)) return BROKEN("6: region %s lacks a tensor of %s",
                                                        bp_region_get(fr)->name,
                                                        bp_region_get(wr)->name);
    }
  }
  return BP_OK;
}

/* Invariant 7: every region inside a bucket's span either belongs to the
 * bucket or is empty. */
static bp_status check_buckets(const bp_plan *p) {
  for (int b = BP_BUCKET_DEEP; b <= BP_BUCKET_BN; b++) {
    bp_span s;
    if (bp_plan_bucket_span(p, b, &s) != BP_OK) return BROKEN("7: bucket %d has no span", b);
    for (int r = 0; r < BP_REGION_COUNT; r++) {
      bp_span rs = bp_plan_region_span(p, (bp_region)r);
      if (rs.bytes == 0 || rs.offset < s.offset || rs.offset >= s.offset + s.bytes) continue;
      if (bp_region_get((bp_region)r)->bucket != b)
        return BROKEN("7: region %s breaks all-reduce bucket %d", bp_region_get((bp_region)r)->name,
                      b);
    }
  }
  return BP_OK;
}

/* Invariant 8: tensors of a packed region that share a byte are never
 * live at the same node of any variant. Pairs in offset order, so only
 * neighbours whose slots reach each other are compared. */
static int cmp_u64(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static bp_status check_packing(const bp_plan *p) {
  if (!bp_plan_is_packed(p)) return BP_OK;
  const int32_t n = bp_plan_tensor_count(p);
  /* (offset, id) pairs, sorted by offset */
  uint64_t *order = malloc(2 * (size_t)(n ? n : 1) * sizeof *order);
  if (!order) return bp_fail(BP_ERR_NOMEM, "out of memory checking a plan");
  int32_t count = 0;
  for (int32_t id = 0; id < n; id++)
    if (bp_region_is_packed(bp_plan_tensor(p, 0, id)->region)) {
      order[2 * count] = bp_plan_tensor(p, 0, id)->offset;
      order[2 * count + 1] = (uint64_t)id;
      count++;
    }
  qsort(order, (size_t)count, 2 * sizeof *order, cmp_u64);
  bp_status st = BP_OK;
  for (int32_t i = 0; i < count && st == BP_OK; i++) {
    const bp_dtensor *a = bp_plan_tensor(p, 0, (int32_t)order[2 * i + 1]);
    for (int32_t j = i + 1; j < count && st == BP_OK; j++) {
      const bp_dtensor *b = bp_plan_tensor(p, 0, (int32_t)order[2 * j + 1]);
      if (b->offset >= a->offset + a->slot_bytes) break; /* sorted: no later one reaches a */
      for (int v = 0; v < bp_plan_variant_count(p); v++)
        if (bp_live_overlap(bp_plan_live_range(p, v, a->id), bp_plan_live_range(p, v, b->id))) {
          st = BROKEN("8: '%s' and '%s' share bytes and are both live in variant '%s'", a->name,
                      b->name, bp_plan_variant(p, v)->name);
          break;
        }
    }
  }
  free(order);
  return st;
}

bp_status bp_plan_check(const bp_plan *p) {
  if (!bp_plan_is_finalized(p)) return BROKEN("0: the plan is not finalized");
  bp_status st;
  if ((st = check_layout(p)) != BP_OK || (st = check_variants(p)) != BP_OK ||
      (st = check_families(p)) != BP_OK || (st = check_buckets(p)) != BP_OK ||
      (st = check_packing(p)) != BP_OK)
    return st;
  return BP_OK;
}
