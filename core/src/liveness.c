/* Liveness packing: feature and gradient slots (F32, F16) whose live
 * ranges within a step never overlap share bytes (docs/plan.md, "Liveness
 * packing"; invariant 8 of plan.h).
 *
 * A variant's step is its nodes of every segment, segments in enum order
 * (graph.h; only FORWARD, LOSS, BACKWARD and EVAL touch F, in that order).
 * A tensor is live from its first touch (a write, a range.zero included)
 * to its last, inclusive, and every input and output of a node is live at
 * that node: an output never shares bytes with an input of its node. The
 * layout is one for all variants: two tensors share bytes only when their
 * ranges are disjoint in every variant, and their slots are already the max
 * over variants. */
#include "liveness-impl.h"

#include <stdlib.h>
#include <string.h>

#include "layer-impl.h"
#include "plan-impl.h"

/* ---- ranges ---------------------------------------------------------------------- */

typedef struct by_offset {
  uint64_t offset;
  int32_t id;
} by_offset;

static int cmp_by_offset(const void *a, const void *b) {
  const by_offset *x = a, *y = b;
  if (x->offset != y->offset) return (x->offset > y->offset) - (x->offset < y->offset);
  return (x->id > y->id) - (x->id < y->id);
}

/* The packed regions' tensors by offset; *count of them. */
static by_offset *packed_by_offset(const bp_plan *plan, int32_t *count) {
  const int32_t n = bp_plan_tensor_count(plan);
  by_offset *list = malloc((size_t)(n ? n : 1) * sizeof *list);
  if (!list) return NULL;
  int32_t c = 0;
  for (int32_t id = 0; id < n; id++) {
    const bp_dtensor *t = bp_plan_tensor(plan, 0, id);
    if (bp_region_is_packed(t->region)) list[c++] = (by_offset){t->offset, id};
  }
  qsort(list, (size_t)c, sizeof *list, cmp_by_offset);
  *count = c;
  return list;
}

typedef struct walk_ctx {
  const bp_plan *plan;
  bp_live_range *row; /* this variant's ranges, [id] */
  unsigned char *pinned;
  const by_offset *list;
  int32_t count;
} walk_ctx;

static void touch(walk_ctx *w, int32_t id, int32_t k, int write) {
  bp_live_range *r = &w->row[id];
  if (r->first < 0) {
    r->first = k;
    if (!write) w->pinned[id] = 1; /* read before any write: an earlier step's data */
  }
  r->last = k;
}

/* A node tensor: an id of a packed region, or a span that reaches into
 * one (every tensor it overlaps: on a plan not packed, a byte has one). */
static void touch_tensor(walk_ctx *w, const bp_node_tensor *t, int32_t k, int write) {
  if (t->id >= 0) {
    if (bp_region_is_packed(bp_plan_tensor(w->plan, 0, t->id)->region)) touch(w, t->id, k, write);
    return;
  }
  const uint64_t end = t->span.offset + t->span.bytes;
  for (int32_t i = 0; i < w->count && w->list[i].offset < end; i++) {
    const bp_dtensor *d = bp_plan_tensor(w->plan, 0, w->list[i].id);
    if (d->offset + d->slot_bytes > t->span.offset) touch(w, d->id, k, write);
  }
}

bp_status bp_liveness_ranges(const bp_plan *plan, const bp_graph *graph, int32_t logits,
                             bp_live_range **out) {
  const int32_t n = bp_plan_tensor_count(plan);
  const int variants = bp_plan_variant_count(plan);
  const size_t cells = (size_t)variants * (size_t)n;
  walk_ctx w = {.plan = plan};
  bp_live_range *live = malloc((cells ? cells : 1) * sizeof *live);
  w.pinned = calloc((size_t)n + 1, 1);
  w.list = packed_by_offset(plan, &w.count);
  if (!live || !w.pinned || !w.list) {
    free(live);
    free(w.pinned);
    free((void *)w.list);
    return bp_fail(BP_ERR_NOMEM, "out of memory taking live ranges");
  }
  for (size_t c = 0; c < cells; c++) live[c] = (bp_live_range){-1, -1};
  for (int v = 0; v < variants; v++) {
    w.row = live + (size_t)v * (size_t)n;
    int32_t k = 0;
    for (int s = 0; s < BP_SEGMENT_COUNT; s++)
      for (int i = 0; i < bp_graph_node_count(graph, v, (bp_segment)s); i++, k++) {
        const bp_node *node = bp_graph_node(graph, v, (bp_segment)s, i);
        for (int j = 0; j < node->num_inputs; j++) touch_tensor(&w, &node->inputs[j], k, 0);
        for (int j = 0; j < node->num_outputs; j++) touch_tensor(&w, &node->outputs[j], k, 1);
      }
    if (logits >= 0 && w.row[logits].first >= 0) w.row[logits].last = BP_LIVE_END;
  }
  for (int32_t id = 0; id < n; id++)
    if (w.pinned[id])
      for (int v = 0; v < variants; v++) live[(size_t)v * (size_t)n + (size_t)id] =
                                             (bp_live_range){0, BP_LIVE_END};
  free(w.pinned);
  free((void *)w.list);
  *out = live;
  return BP_OK;
}

/* ---- offsets --------------------------------------------------------------------- */

/* A placing order: by k1, then k2, both descending, then by id. */
typedef struct order_key {
  uint64_t k1, k2;
  int32_t id;
} order_key;

static int cmp_key(const void *a, const void *b) {
  const order_key *x = a, *y = b;
  if (x->k1 != y->k1) return (x->k1 < y->k1) - (x->k1 > y->k1);
  if (x->k2 != y->k2) return (x->k2 < y->k2) - (x->k2 > y->k2);
  return (x->id > y->id) - (x->id < y->id);
}

/* Nodes `id` is live over all variants (a range to the end counts 2^20). */
static uint64_t lifetime(const bp_plan *plan, const bp_live_range *live, int32_t id) {
  const size_t n = (size_t)bp_plan_tensor_count(plan);
  uint64_t sum = 0;
  for (int v = 0; v < bp_plan_variant_count(plan); v++) {
    const bp_live_range r = live[(size_t)v * n + (size_t)id];
    if (r.first >= 0) sum += (r.last == BP_LIVE_END ? (1u << 20) : (uint64_t)r.last) - r.first + 1;
  }
  return sum;
}

/* The orders tried; the packing keeps the smallest region. First fit is
 * not optimal, and no one order wins on every model. */
enum { ORDER_SLOT, ORDER_START, ORDER_AREA, ORDER_LIFETIME, ORDER_COUNT };

static order_key key_of(const bp_plan *plan, const bp_live_range *live, int32_t id, int order) {
  const uint64_t slot = bp_plan_tensor(plan, 0, id)->slot_bytes, life = lifetime(plan, live, id);
  const bp_live_range r0 = live[id]; /* variant 0 */
  switch (order) {
  case ORDER_START: /* left edge: earliest first (never touched: last) */
    return (order_key){UINT64_MAX - (r0.first >= 0 ? (uint64_t)r0.first : UINT32_MAX), slot, id};
  case ORDER_AREA: return (order_key){slot / BP_SLOT_ALIGN * life, slot, id};
  case ORDER_LIFETIME: return (order_key){life, slot, id};
  default: return (order_key){slot, life, id};
  }
}

/* Whether a and b are live at a common node of some variant. */
static int conflict(const bp_plan *plan, const bp_live_range *live, int32_t a, int32_t b) {
  const size_t n = (size_t)bp_plan_tensor_count(plan);
  for (int v = 0; v < bp_plan_variant_count(plan); v++)
    if (bp_live_overlap(live[(size_t)v * n + (size_t)a], live[(size_t)v * n + (size_t)b]))
      return 1;
  return 0;
}

/* First fit of `id` against the placed tensors it conflicts with. */
static uint64_t first_fit(const bp_plan *plan, const bp_live_range *live, const uint64_t *rel,
                          const int32_t *placed, int32_t placed_count, int32_t id,
                          by_offset *busy) {
  int32_t c = 0;
  for (int32_t i = 0; i < placed_count; i++)
    if (conflict(plan, live, id, placed[i])) busy[c++] = (by_offset){rel[placed[i]], placed[i]};
  qsort(busy, (size_t)c, sizeof *busy, cmp_by_offset);
  const uint64_t slot = bp_plan_tensor(plan, 0, id)->slot_bytes;
  uint64_t at = 0;
  for (int32_t i = 0; i < c; i++) {
    if (at + slot <= busy[i].offset) break; /* the gap before it fits */
    const uint64_t end = busy[i].offset + bp_plan_tensor(plan, 0, busy[i].id)->slot_bytes;
    if (end > at) at = end;
  }
  return at; /* slots and offsets are multiples of 256, so is `at` */
}

bp_status bp_liveness_offsets(const bp_plan *plan, const bp_live_range *live, uint64_t **out) {
  const int32_t n = bp_plan_tensor_count(plan);
  uint64_t *rel = calloc((size_t)n + 1, sizeof *rel);
  uint64_t *trial = calloc((size_t)n + 1, sizeof *trial);
  int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
  by_offset *busy = malloc(((size_t)n + 1) * sizeof *busy);
  order_key *keys = malloc(((size_t)n + 1) * sizeof *keys);
  bp_status st = BP_OK;
  if (!rel || !trial || !ids || !busy || !keys) {
    free(rel);
    rel = NULL;
    st = bp_fail(BP_ERR_NOMEM, "out of memory packing the plan");
    goto done;
  }
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    if (!bp_region_is_packed((bp_region)r)) continue;
    uint64_t best = UINT64_MAX;
    for (int order = 0; order < ORDER_COUNT; order++) {
      int32_t count = 0;
      for (int32_t id = 0; id < n; id++)
        if ((int)bp_plan_tensor(plan, 0, id)->region == r) keys[count++] = key_of(plan, live, id, order);
      qsort(keys, (size_t)count, sizeof *keys, cmp_key);
      uint64_t size = 0;
      for (int32_t i = 0; i < count; i++) {
        ids[i] = keys[i].id;
        trial[ids[i]] = first_fit(plan, live, trial, ids, i, ids[i], busy);
        const uint64_t end = trial[ids[i]] + bp_plan_tensor(plan, 0, ids[i])->slot_bytes;
        if (end > size) size = end;
      }
      if (size >= best) continue;
      best = size;
      for (int32_t i = 0; i < count; i++) rel[ids[i]] = trial[ids[i]];
    }
  }
  *out = rel;
done:
  free(trial);
  free(ids);
  free(busy);
  free(keys);
  return st;
}

/* ---- the check on a graph --------------------------------------------------------- */

static int live_at(bp_live_range r, int32_t k) { return r.first >= 0 && r.first <= k && k <= r.last; }

/* Whether node tensor `t` at node k of variant v stays inside live tensors. */
static int inside_live(const bp_plan *plan, int v, const bp_node_tensor *t, int32_t k,
                       const char **name) {
  if (t->id >= 0) {
    const bp_dtensor *d = bp_plan_tensor(plan, v, t->id);
    *name = d->name;
    return !bp_region_is_packed(d->region) || live_at(bp_plan_live_range(plan, v, t->id), k);
  }
  *name = "a span";
  int in_packed = 0;
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    const bp_span s = bp_plan_region_span(plan, (bp_region)r);
    if (bp_region_is_packed((bp_region)r) && t->span.offset < s.offset + s.bytes &&
        s.offset < t->span.offset + t->span.bytes)
      in_packed = 1;
  }
  if (!in_packed) return 1;
  for (int32_t id = 0; id < bp_plan_tensor_count(plan); id++) {
    const bp_dtensor *d = bp_plan_tensor(plan, v, id);
    if (bp_region_is_packed(d->region) && d->offset <= t->span.offset &&
        t->span.offset + t->span.bytes <= d->offset + d->slot_bytes &&
        live_at(bp_plan_live_range(plan, v, id), k))
      return 1;
  }
  return 0;
}

bp_status bp_liveness_check_graph(const bp_plan *plan, const bp_graph *graph) {
  if (!bp_plan_is_packed(plan)) return BP_OK;
  for (int v = 0; v < bp_plan_variant_count(plan); v++) {
    int32_t k = 0;
    for (int s = 0; s < BP_SEGMENT_COUNT; s++)
      for (int i = 0; i < bp_graph_node_count(graph, v, (bp_segment)s); i++, k++) {
        const bp_node *node = bp_graph_node(graph, v, (bp_segment)s, i);
        for (int j = 0; j < node->num_inputs + node->num_outputs; j++) {
          const bp_node_tensor *t =
              j < node->num_inputs ? &node->inputs[j] : &node->outputs[j - node->num_inputs];
          const char *name;
          if (!inside_live(plan, v, t, k, &name))
            return bp_fail(BP_ERR_STATE,
                           "plan invariant 8: node '%s' (variant '%s') touches %s outside its "
                           "live range: the packed plan does not fit this graph",
                           node->name, bp_plan_variant(plan, v)->name, name);
        }
      }
  }
  return BP_OK;
}
