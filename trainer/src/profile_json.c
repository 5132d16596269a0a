/* The "profile" object of the metrics file (profile.h:
 * bp_profile_write_json; the fields are documented in
 * docs/metrics-jsonl.md). Times are integer nanoseconds, so a reader can
 * check the invariants of profile.h exactly; shares and rates are derived
 * numbers, null where undefined (no time, no FLOPs, no yardstick). */
#include <math.h>
#include <stdlib.h>

#include "blueprint/json_out.h"
#include "blueprint/profile.h"

/* ,"key":v, or null when v is not finite */
static void num(FILE *f, const char *key, double v) {
  if (isfinite(v))
    fprintf(f, ",\"%s\":%.9g", key, v);
  else
    fprintf(f, ",\"%s\":null", key);
}

static void u64(FILE *f, const char *key, uint64_t v) {
  fprintf(f, ",\"%s\":%llu", key, (unsigned long long)v);
}

/* The time fields shared by ops and nodes: ns of `calls` runs of `flops`
 * FLOPs in all, against a variant's step time and the yardstick. */
static void timing(FILE *f, uint64_t calls, uint64_t ns, uint64_t flops, uint64_t step_ns,
                   double sgemm_gflops) {
  u64(f, "calls", calls);
  u64(f, "ns", ns);
  num(f, "share", step_ns ? (double)ns / (double)step_ns : NAN);
  num(f, "mean_ms", calls ? (double)ns / (double)calls / 1e6 : NAN);
  const double gflops = flops && ns ? (double)flops / (double)ns : NAN;
  num(f, "gflops", gflops);
  num(f, "sgemm_ratio", gflops / sgemm_gflops);
}

static void sgemm(FILE *f, const bp_profile_sgemm *s) {
  fprintf(f, ",\"sgemm\":{\"measured\":%s", s->measured ? "true" : "false");
  fprintf(f, ",\"m\":%lld,\"n\":%lld,\"k\":%lld", (long long)s->m, (long long)s->n,
          (long long)s->k);
  fputs(",\"impl\":", f);
  if (s->impl)
    bp_json_string(f, s->impl);
  else
    fputs("null", f);
  fprintf(f, ",\"threads\":%d,\"measurements\":%d,\"runs\":%d", s->threads, s->measurements,
          s->runs);
  num(f, "best_seconds", s->measured ? s->best_seconds : NAN);
  num(f, "gflops", s->measured ? s->gflops : NAN);
  num(f, "median_gflops", s->measured ? s->median_gflops : NAN);
  fputs(",\"why\":", f);
  bp_json_string(f, s->why);
  fputc('}', f);
}

static bp_status variant(FILE *f, const bp_profile *p, int v, double sgemm_gflops,
                         double median_gflops) {
  const bp_profile_variant *pv = bp_profile_variant_at(p, v);
  fputs("{\"variant\":", f);
  bp_json_string(f, pv->name);
  u64(f, "steps", pv->steps);
  u64(f, "step_ns", pv->step_ns);
  u64(f, "kernel_ns", pv->run_ns);
  num(f, "step_mean_ms", (double)pv->step_ns / (double)pv->steps / 1e6);
  num(f, "kernel_share", pv->step_ns ? (double)pv->run_ns / (double)pv->step_ns : NAN);
  /* the SGEMM floor: the step's work at the yardstick's rate, over the step's time */
  int trains;
  const uint64_t work = bp_profile_work_flops(p, v, &trains);
  u64(f, "work_flops", work);
  fprintf(f, ",\"trains\":%s", trains ? "true" : "false");
  num(f, "floor_share", bp_profile_floor_share(p, v, sgemm_gflops));
  num(f, "floor_share_median", bp_profile_floor_share(p, v, median_gflops));
  fputs(",\"ops\":[", f);
  const int count = bp_profile_ops(p, v, NULL, 0);
  bp_profile_op *ops = calloc((size_t)count + 1, sizeof *ops);
  if (!ops) return bp_fail(BP_ERR_NOMEM, "out of memory writing a profile");
  bp_profile_ops(p, v, ops, count);
  for (int i = 0; i < count; i++) {
    fputs(i ? ",{\"op\":" : "{\"op\":", f);
    bp_json_string(f, ops[i].op);
    fputs(",\"impl\":", f);
    bp_json_string(f, ops[i].impl);
    fprintf(f, ",\"nodes\":%d", ops[i].nodes);
    u64(f, "flops", ops[i].flops);
    timing(f, ops[i].calls, ops[i].ns, ops[i].flops, pv->step_ns, sgemm_gflops);
    fputc('}', f);
  }
  free(ops);
  fputs("],\"nodes\":[", f);
  for (int i = 0, listed = 0; i < bp_profile_node_count(p); i++) {
    const bp_profile_node *n = bp_profile_node_at(p, i);
    if (n->variant != v) continue;
    fputs(listed++ ? ",{\"node\":" : "{\"node\":", f);
    bp_json_string(f, n->name);
    fputs(",\"segment\":", f);
    bp_json_string(f, bp_segment_name(n->segment));
    fputs(",\"op\":", f);
    bp_json_string(f, n->op);
    fputs(",\"impl\":", f);
    bp_json_string(f, n->impl);
    u64(f, "flops_per_call", n->flops);
    timing(f, n->calls, n->ns, n->flops * n->calls, pv->step_ns, sgemm_gflops);
    fputc('}', f);
  }
  fputs("]}", f);
  return BP_OK;
}

bp_status bp_profile_write_json(const bp_profile *p, FILE *f) {
  if (!p || !f) return bp_fail(BP_ERR_INVALID, "bp_profile_write_json: NULL argument");
  const bp_profile_sgemm *s = bp_profile_sgemm_rate(p);
  fputs(",\"rank\":0,\"clock\":\"CLOCK_MONOTONIC\"", f);
  sgemm(f, s);
  fputs(",\"variants\":[", f);
  bp_status st = BP_OK;
  for (int v = 0, listed = 0; st == BP_OK && v < bp_profile_variant_count(p); v++) {
    if (bp_profile_variant_at(p, v)->steps == 0) continue;
    if (listed++) fputc(',', f);
    st = variant(f, p, v, s->measured ? s->gflops : NAN, s->measured ? s->median_gflops : NAN);
  }
  fputc(']', f);
  if (st == BP_OK && ferror(f)) return bp_fail(BP_ERR_IO, "writing a profile failed");
  return st;
}
