/* `blueprint plan --json`: the stable document of docs/plan-json.md. Keys
 * come in the documented order; objects of a list sit one per line so the
 * output diffs well. Fields are only ever added. */
#include <inttypes.h>

#include "blueprint/json_out.h"
#include "plan_print.h"

static void print_regions(FILE *out, const bp_plan *plan) {
  fputs("      \"regions\": [\n", out);
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    bp_span s = bp_plan_region_span(plan, (bp_region)r);
    fputs("        {\"name\": ", out);
    bp_json_string(out, bp_region_get((bp_region)r)->name);
    fprintf(out, ", \"base\": %" PRIu64 ", \"bytes\": %" PRIu64 "}%s\n", s.offset, s.bytes,
            r + 1 < BP_REGION_COUNT ? "," : "");
  }
  fputs("      ],\n", out);
}

static void print_tensors(FILE *out, const bp_plan *plan, int v) {
  int32_t nt = bp_plan_tensor_count(plan);
  fputs(nt ? "      \"tensors\": [\n" : "      \"tensors\": [", out);
  for (int32_t id = 0; id < nt; id++) {
    const bp_dtensor *t = bp_plan_tensor(plan, v, id);
    fprintf(out, "        {\"id\": %" PRId32 ", \"name\": ", t->id);
    bp_json_string(out, t->name);
    fputs(", \"region\": ", out);
    bp_json_string(out, bp_region_get(t->region)->name);
    fputs(", \"dtype\": ", out);
    bp_json_string(out, bp_dtype_name(t->dtype));
    fprintf(out,
            ", \"shape\": [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]"
            ", \"padded_c\": %" PRId64 ", \"offset\": %" PRIu64 ", \"slot_bytes\": %" PRIu64
            "}%s\n",
            t->shape.n, t->shape.h, t->shape.w, t->shape.c, t->padded_c, t->offset, t->slot_bytes,
            id + 1 < nt ? "," : "");
  }
  fputs(nt ? "      ]\n" : "]\n", out);
}

void bp_plan_print_json(FILE *out, const bp_plan *plan) {
  int nv = bp_plan_variant_count(plan);
  fputs("{\n  \"variants\": [\n", out);
  for (int v = 0; v < nv; v++) {
    const bp_variant_info *vi = bp_plan_variant(plan, v);
    fputs("    {\n      \"name\": ", out);
    bp_json_string(out, vi->name);
    fprintf(out,
            ",\n      \"batch\": %" PRId64 ",\n      \"height\": %" PRId64
            ",\n      \"width\": %" PRId64 ",\n      \"total_bytes\": %" PRIu64 ",\n",
            vi->batch, vi->height, vi->width, bp_plan_total_bytes(plan));
    print_regions(out, plan);
    print_tensors(out, plan, v);
    fprintf(out, "    }%s\n", v + 1 < nv ? "," : "");
  }
  fputs("  ]\n}\n", out);
}
