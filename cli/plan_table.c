/* The readable table of `blueprint plan`: variants, regions, tensors and the
 * arena size per rank. Column widths follow the data so long tensor names
 * never break the alignment. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "plan_print.h"

#define SHAPE_MAX 96

static int imax(int a, int b) { return a > b ? a : b; }

static void print_variants(FILE *out, const bp_plan *plan) {
  int nv = bp_plan_variant_count(plan), w = 4;
  for (int v = 0; v < nv; v++) w = imax(w, (int)strlen(bp_plan_variant(plan, v)->name));
  fprintf(out, "variants (%d; one layout shared by all):\n", nv);
  fprintf(out, "  %-*s  %10s  %s\n", w, "name", "batch", "input HxW");
  for (int v = 0; v < nv; v++) {
    const bp_variant_info *vi = bp_plan_variant(plan, v);
    fprintf(out, "  %-*s  %10" PRId64 "  %" PRId64 "x%" PRId64 "\n", w, vi->name, vi->batch,
            vi->height, vi->width);
  }
}

static void print_regions(FILE *out, const bp_plan *plan) {
  char a[BP_FMT_MAX], b[BP_FMT_MAX], c[BP_FMT_MAX];
  int shown = 0, wname = 6, wbase = 4, wbytes = 5;
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    bp_span s = bp_plan_region_span(plan, (bp_region)r);
    if (s.bytes == 0) continue;
    shown++;
    wname = imax(wname, (int)strlen(bp_region_get((bp_region)r)->name));
    wbase = imax(wbase, (int)strlen(bp_fmt_count(s.offset, a)));
    wbytes = imax(wbytes, (int)strlen(bp_fmt_count(s.bytes, a)));
  }
  fprintf(out, "regions (%d of %d hold bytes; base and size per rank, the same in every variant):\n",
          shown, BP_REGION_COUNT);
  fprintf(out, "  %-*s  %-6s  %*s  %9s  %*s  %7s  %s\n", wname, "region", "series", wbase, "base",
          "size", wbytes, "bytes", "tensors", "role");
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    bp_span s = bp_plan_region_span(plan, (bp_region)r);
    if (s.bytes == 0) continue;
    const bp_region_info *ri = bp_region_get((bp_region)r);
    fprintf(out, "  %-*s  %-6c  %*s  %9s  %*s  %7d  %s\n", wname, ri->name, ri->series, wbase,
            bp_fmt_count(s.offset, a), bp_fmt_bytes(s.bytes, b), wbytes, bp_fmt_count(s.bytes, c),
            (int)bp_plan_region_tensor_count(plan, (bp_region)r), ri->role);
  }
  char zero[2048];
  int nzero = bp_fmt_zero_regions(plan, zero, sizeof zero);
  if (nzero == 0) return;
  fprintf(out, "  not shown (%d regions of 0 bytes):\n", nzero);
  /* one reason per line: the summary separates them with "; " */
  for (char *line = zero; line && *line;) {
    char *next = strstr(line, "; ");
    if (next) *next = '\0';
    /* long lists continue on lines indented under the reason */
    for (const char *rest = line, *indent = "    "; *rest; indent = "        ") {
      size_t n = bp_fmt_wrap(rest, 92);
      fprintf(out, "%s%.*s\n", indent, (int)n, rest);
      rest += n;
      while (*rest == ' ') rest++;
    }
    line = next ? next + 2 : NULL;
  }
}

static void print_tensors(FILE *out, const bp_plan *plan) {
  char a[BP_FMT_MAX], b[BP_FMT_MAX], shape[SHAPE_MAX];
  int32_t nt = bp_plan_tensor_count(plan);
  int wid = 2, wname = 4, wregion = 6, wshape = 15, woff = 6, wslot = 10;
  for (int32_t id = 0; id < nt; id++) {
    const bp_dtensor *t = bp_plan_tensor(plan, 0, id);
    wid = imax(wid, snprintf(a, sizeof a, "%" PRId32, id));
    wname = imax(wname, (int)strlen(t->name));
    wregion = imax(wregion, (int)strlen(bp_region_get(t->region)->name));
    wshape = imax(wshape, (int)strlen(bp_fmt_shape(t->shape, shape, sizeof shape)));
    woff = imax(woff, (int)strlen(bp_fmt_count(t->offset, a)));
    wslot = imax(wslot, (int)strlen(bp_fmt_count(t->slot_bytes, a)));
  }
  fprintf(out,
          "tensors (%" PRId32 ", shapes of variant '%s'; offsets and slots are the same in every "
          "variant):\n",
          nt, bp_plan_variant(plan, 0)->name);
  fprintf(out, "  %*s  %-*s  %-*s  %-5s  %-*s  %8s  %*s  %*s\n", wid, "id", wname, "name", wregion,
          "region", "dtype", wshape, "shape [n,h,w,c]", "padded_c", woff, "offset", wslot,
          "slot_bytes");
  for (int32_t id = 0; id < nt; id++) {
    const bp_dtensor *t = bp_plan_tensor(plan, 0, id);
    fprintf(out, "  %*" PRId32 "  %-*s  %-*s  %-5s  %-*s  %8" PRId64 "  %*s  %*s\n", wid, id, wname,
            t->name, wregion, bp_region_get(t->region)->name, bp_dtype_name(t->dtype), wshape,
            bp_fmt_shape(t->shape, shape, sizeof shape), t->padded_c, woff,
            bp_fmt_count(t->offset, a), wslot, bp_fmt_count(t->slot_bytes, b));
  }
}

static int shape_eq(bp_shape x, bp_shape y) {
  return x.n == y.n && x.h == y.h && x.w == y.w && x.c == y.c;
}

/* The tensors whose shape differs from variant 0 in some other variant,
 * one column per other variant ("same" where it does not differ). */
static void print_shape_differences(FILE *out, const bp_plan *plan) {
  int nv = bp_plan_variant_count(plan);
  int32_t nt = bp_plan_tensor_count(plan);
  if (nv < 2) return;
  char shape[SHAPE_MAX], a[BP_FMT_MAX];
  int wid = 2, wname = 4, differing = 0;
  int *wcol = calloc((size_t)nv, sizeof *wcol);
  if (!wcol) return; /* only a column width table; nothing sensible to print without it */
  for (int v = 1; v < nv; v++) wcol[v] = imax(4, (int)strlen(bp_plan_variant(plan, v)->name));
  for (int32_t id = 0; id < nt; id++) {
    const bp_dtensor *t0 = bp_plan_tensor(plan, 0, id);
    int differs = 0;
    for (int v = 1; v < nv; v++) {
      const bp_dtensor *t = bp_plan_tensor(plan, v, id);
      if (shape_eq(t->shape, t0->shape)) continue;
      differs = 1;
      wcol[v] = imax(wcol[v], (int)strlen(bp_fmt_shape(t->shape, shape, sizeof shape)));
    }
    if (!differs) continue;
    differing++;
    wid = imax(wid, snprintf(a, sizeof a, "%" PRId32, id));
    wname = imax(wname, (int)strlen(t0->name));
  }
  if (differing == 0) {
    fprintf(out, "every tensor has the same shape in every variant.\n");
    free(wcol);
    return;
  }
  fprintf(out, "shapes in the other variants (%d tensors differ from '%s'):\n", differing,
          bp_plan_variant(plan, 0)->name);
  fprintf(out, "  %*s  %-*s", wid, "id", wname, "name");
  /* the last column is not padded: no trailing blanks */
  for (int v = 1; v < nv; v++)
    fprintf(out, "  %-*s", v + 1 < nv ? wcol[v] : 0, bp_plan_variant(plan, v)->name);
  fputc('\n', out);
  for (int32_t id = 0; id < nt; id++) {
    const bp_dtensor *t0 = bp_plan_tensor(plan, 0, id);
    int differs = 0;
    for (int v = 1; v < nv; v++) differs |= !shape_eq(bp_plan_tensor(plan, v, id)->shape, t0->shape);
    if (!differs) continue;
    fprintf(out, "  %*" PRId32 "  %-*s", wid, id, wname, t0->name);
    for (int v = 1; v < nv; v++) {
      const bp_dtensor *t = bp_plan_tensor(plan, v, id);
      fprintf(out, "  %-*s", v + 1 < nv ? wcol[v] : 0,
              shape_eq(t->shape, t0->shape) ? "same" : bp_fmt_shape(t->shape, shape, sizeof shape));
    }
    fputc('\n', out);
  }
  free(wcol);
}

/* Liveness packing: the bytes without it, and how many slots share. */
static void print_reuse(FILE *out, const bp_plan *plan) {
  if (!bp_plan_is_packed(plan)) {
    fprintf(out, "liveness reuse: off (every feature and gradient slot has its own bytes)\n");
    return;
  }
  const uint64_t total = bp_plan_total_bytes(plan), without = bp_plan_unpacked_bytes(plan);
  int32_t shared = 0, packed = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(plan); id++) {
    const bp_dtensor *t = bp_plan_tensor(plan, 0, id);
    if (!bp_region_is_packed(t->region)) continue;
    packed++;
    for (int32_t j = 0; j < bp_plan_tensor_count(plan); j++) {
      const bp_dtensor *u = bp_plan_tensor(plan, 0, j);
      if (j != id && u->region == t->region && u->offset < t->offset + t->slot_bytes &&
          t->offset < u->offset + u->slot_bytes) {
        shared++;
        break;
      }
    }
  }
  fprintf(out,
          "liveness reuse: on, %" PRId32 " of %" PRId32 " feature and gradient slots share bytes "
          "with a slot not live at the same time\n"
          "without reuse (--no-reuse): %" PRIu64 " (%.2f MiB); reuse saves %.1f%%\n",
          shared, packed, without, (double)without / (1024.0 * 1024.0),
          without ? 100.0 * (double)(without - total) / (double)without : 0.0);
}

void bp_plan_print_table(FILE *out, const bp_plan *plan, const bp_plan_print_info *info) {
  char opts[128];
  const char *name = info && info->model_name && *info->model_name ? info->model_name : "(unnamed)";
  fprintf(out, "plan of model %s", name);
  if (info && info->model_path && *info->model_path) fprintf(out, " (%s)", info->model_path);
  fprintf(out, "\noptions: %s\n\n", bp_fmt_options(plan, ", ", opts, sizeof opts));
  print_variants(out, plan);
  fputc('\n', out);
  print_regions(out, plan);
  fputc('\n', out);
  print_tensors(out, plan);
  fputc('\n', out);
  print_shape_differences(out, plan);
  fputc('\n', out);
  uint64_t total = bp_plan_total_bytes(plan);
  fprintf(out, "total arena bytes per rank: %" PRIu64 " (%.2f MiB)\n", total,
          (double)total / (1024.0 * 1024.0));
  print_reuse(out, plan);
}
