/* The profile table of `train --profile` and `eval --profile`
 * (profile_report.h). Shares are of the variant's step time; GFLOP/s only
 * for the nodes whose FLOPs are counted (conv and fc), read against the
 * SGEMM yardstick measured at the start of the run. */
#include "profile_report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double ms(uint64_t ns) { return (double)ns / 1e6; }
static double pct(uint64_t part, uint64_t whole) {
  return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

/* "  123.4  0.56" (GFLOP/s, of the yardstick) or blanks. */
static void rate(FILE *f, uint64_t flops, uint64_t ns, const bp_profile_sgemm *s) {
  if (!flops || !ns) {
    fprintf(f, "  %8s  %8s", "", "");
    return;
  }
  const double gflops = (double)flops / (double)ns;
  fprintf(f, "  %8.1f", gflops);
  if (s->measured)
    fprintf(f, "  %8.2f", gflops / s->gflops);
  else
    fprintf(f, "  %8s", "-");
}

/* "step"/"steps" or "batch"/"batches" of a variant ("eval*" runs batches). */
static const char *unit(const char *variant, uint64_t count) {
  const int batches = strncmp(variant, "eval", 4) == 0;
  if (count == 1) return batches ? "batch" : "step";
  return batches ? "batches" : "steps";
}

static void yardstick(FILE *f, const bp_profile_sgemm *s) {
  if (s->measured)
    fprintf(f,
            "SGEMM yardstick: fc.fwd/%s, %lld x %lld x %lld FP32 on %d thread%s: %.1f GFLOP/s "
            "(fastest of %d runs in %d measurement%s, %.2f ms; median run %.1f GFLOP/s)\n",
            s->impl, (long long)s->m, (long long)s->k, (long long)s->n, s->threads,
            s->threads == 1 ? "" : "s", s->gflops, s->runs, s->measurements,
            s->measurements == 1 ? "" : "s", s->best_seconds * 1e3, s->median_gflops);
  else
    fprintf(f, "SGEMM yardstick: %s\n", s->why);
}

/* The step's work at the yardstick's rate (bp_profile_work_flops), and
 * the share of that floor the step reaches (bp_profile_floor_share). */
static void sgemm_floor(FILE *f, const bp_profile *p, int v, const bp_profile_sgemm *s) {
  const bp_profile_variant *pv = bp_profile_variant_at(p, v);
  int trains;
  const uint64_t work = bp_profile_work_flops(p, v, &trains);
  const double best = bp_profile_floor_share(p, v, s->gflops);
  const double median = bp_profile_floor_share(p, v, s->median_gflops);
  if (!s->measured || isnan(best) || isnan(median)) return;
  const double step_ms = ms(pv->step_ns) / (double)pv->steps;
  fprintf(f,
          "SGEMM floor: %.1f MFLOP of %s work a %s (%s) at the yardstick's rate: %.3f ms, "
          "%.3f ms at its median run; the %s reaches %.1f%% and %.1f%% of them\n",
          (double)work / 1e6, trains ? "training" : "inference", unit(pv->name, 1),
          trains ? "3 x the forward conv and fc FLOPs" : "the forward conv and fc FLOPs",
          best * step_ms, median * step_ms, unit(pv->name, 1), 100.0 * best, 100.0 * median);
}

static int by_node_time(const void *a, const void *b) {
  const bp_profile_node *x = *(const bp_profile_node *const *)a;
  const bp_profile_node *y = *(const bp_profile_node *const *)b;
  if (x->ns != y->ns) return x->ns < y->ns ? 1 : -1;
  return strcmp(x->name, y->name);
}

static void by_op(FILE *f, const bp_profile *p, int v, const bp_profile_sgemm *s) {
  const bp_profile_variant *pv = bp_profile_variant_at(p, v);
  const int count = bp_profile_ops(p, v, NULL, 0);
  bp_profile_op *ops = calloc((size_t)count + 1, sizeof *ops);
  if (!ops) return;
  bp_profile_ops(p, v, ops, count);
  fprintf(f, "  %-34s %5s %7s %10s %9s %6s  %8s  %8s\n", "op/impl", "nodes", "calls",
          "total ms", "mean ms", "share", "GFLOP/s", "of SGEMM");
  for (int i = 0; i < count; i++) {
    char name[96];
    snprintf(name, sizeof name, "%s/%s", ops[i].op, ops[i].impl);
    fprintf(f, "  %-34.34s %5d %7llu %10.2f %9.3f %5.1f%%", name, ops[i].nodes,
            (unsigned long long)ops[i].calls, ms(ops[i].ns),
            ops[i].calls ? ms(ops[i].ns) / (double)ops[i].calls : 0.0,
            pct(ops[i].ns, pv->step_ns));
    rate(f, ops[i].flops, ops[i].ns, s);
    fputc('\n', f);
  }
  free(ops);
}

static void by_node(FILE *f, const bp_profile *p, int v, const bp_profile_sgemm *s) {
  const bp_profile_variant *pv = bp_profile_variant_at(p, v);
  const bp_profile_node **nodes = calloc((size_t)bp_profile_node_count(p) + 1, sizeof *nodes);
  if (!nodes) return;
  int count = 0;
  for (int i = 0; i < bp_profile_node_count(p); i++)
    if (bp_profile_node_at(p, i)->variant == v) nodes[count++] = bp_profile_node_at(p, i);
  qsort(nodes, (size_t)count, sizeof *nodes, by_node_time);
  fprintf(f, "  %-24s %-10s %-32s %6s %9s %6s  %8s  %8s\n", "node", "segment", "op/impl",
          "calls", "mean ms", "share", "GFLOP/s", "of SGEMM");
  for (int i = 0; i < count; i++) {
    const bp_profile_node *n = nodes[i];
    char kernel[96];
    snprintf(kernel, sizeof kernel, "%s/%s", n->op, n->impl);
    fprintf(f, "  %-24.24s %-10.10s %-32.32s %6llu %9.3f %5.1f%%", n->name,
            bp_segment_name(n->segment), kernel, (unsigned long long)n->calls,
            n->calls ? ms(n->ns) / (double)n->calls : 0.0, pct(n->ns, pv->step_ns));
    rate(f, n->flops * n->calls, n->ns, s);
    fputc('\n', f);
  }
  fprintf(f, "  %-24s %-10s %-32s %6s %9.3f %5.1f%%\n", "(outside kernels)", "", "", "",
          pv->steps ? ms(pv->step_ns - pv->run_ns) / (double)pv->steps : 0.0,
          pct(pv->step_ns - pv->run_ns, pv->step_ns));
  free(nodes);
}

void bp_cli_profile_report(FILE *f, const bp_profile *p, const char *main) {
  const bp_profile_sgemm *s = bp_profile_sgemm_rate(p);
  fprintf(f, "\nprofile of rank 0 (kernel time per node; docs/profile.md)\n");
  yardstick(f, s);
  const int v = bp_profile_variant_find(p, main);
  const bp_profile_variant *pv = bp_profile_variant_at(p, v);
  if (!pv || pv->steps == 0) {
    fprintf(f, "variant %s: no step was profiled\n", main);
  } else {
    fprintf(f,
            "variant %s: %llu %s, %.3f ms each; kernels %.1f%% of it, outside kernels %.1f%%\n",
            main, (unsigned long long)pv->steps, unit(main, pv->steps),
            ms(pv->step_ns) / (double)pv->steps, pct(pv->run_ns, pv->step_ns),
            pct(pv->step_ns - pv->run_ns, pv->step_ns));
    sgemm_floor(f, p, v, s);
    fprintf(f, "by op (share: of the step time)\n");
    by_op(f, p, v, s);
    fprintf(f, "by node, most time first\n");
    by_node(f, p, v, s);
  }
  for (int o = 0; o < bp_profile_variant_count(p); o++) {
    const bp_profile_variant *ov = bp_profile_variant_at(p, o);
    if (o == v || ov->steps == 0) continue;
    fprintf(f, "variant %s: %llu %s, %.3f ms each; kernels %.1f%% of it\n",
            ov->name, (unsigned long long)ov->steps, unit(ov->name, ov->steps),
            ms(ov->step_ns) / (double)ov->steps,
            pct(ov->run_ns, ov->step_ns));
  }
}
