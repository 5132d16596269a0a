/* Autotune over whole steps (docs/tuning.md). The autotuner (autotune.h)
 * times each node's candidates alone; in a training step the libraries'
 * thread pools (OpenMP, OpenBLAS's, pthreadpool) then share the cores and a
 * mix of picks can be slower than the default selection. So with
 * --autotune every rank binds twice, the tuned selection and the default
 * one (no autotune, same pins), and before the first step the trainer runs
 * both over whole training steps, alternating, on the real arena: the tuned
 * selection is kept only when its median step beats the default's by
 * BP_AUTOTUNE_STEP_MARGIN (bp_autotune_keep_tuned), else the default runs.
 *
 * The timing steps leave the run's bits alone: each rank's arena is copied
 * before the first of them and restored before each step and after the
 * last (parameters, optimizer state, scalars, results, inputs), and the
 * kernels are told the parameters changed. So a --autotune run trains to
 * the same losses as a run pinned to the kernels it kept.
 *
 * On rank 0 a node timer (exec.h) charges each node its time inside the
 * steps; the report (bp_trainer_autotune_report) lists per node the default
 * and the tuned kernel with their in-step times and what the candidates
 * took alone, then the step times of both selections. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/autotune.h"
#include "train-impl.h"

#define TUNE_WARMUP 1 /* untimed steps of each selection first */
/* Timed steps of each, alternating; the medians decide. At least
 * TUNE_ROUNDS_MIN, then more until each side has TUNE_BUDGET_S of steps
 * (short steps: a preempted one on a loaded machine must stay an outlier),
 * at most TUNE_ROUNDS. */
#define TUNE_ROUNDS_MIN 5
#define TUNE_ROUNDS 41
#define TUNE_BUDGET_S 0.25

/* The segments of a training step, in run order (as train_loop.c runs them). */
static const bp_segment step_segments[] = {
    BP_SEGMENT_TRANSFER,  BP_SEGMENT_ZERO_GRAD, BP_SEGMENT_CAST,   BP_SEGMENT_FORWARD,
    BP_SEGMENT_LOSS,      BP_SEGMENT_BACKWARD,  BP_SEGMENT_CAST_GRAD, BP_SEGMENT_COMM,
    BP_SEGMENT_UPDATE,    BP_SEGMENT_GATHER,    BP_SEGMENT_EMA,
};

/* One bound node of rank 0 as the node timer saw it. */
typedef struct tune_node {
  int variant;
  bp_segment segment;
  char name[64], op[64], impl[64];
  char alone[256]; /* what autotune recorded: "impl=ms,..." ("" when none) */
  int refused;     /* autotune's checks excluded this node's kernel */
  double ns[TUNE_ROUNDS];
  int runs;
} tune_node;

/* The node timer of one selection on rank 0. */
typedef struct tune_side {
  bp_trainer *t;
  tune_node *nodes;
  int count, cap;
  int recording, round;
} tune_side;

static bp_status side_add_variant(void *ctx, int variant, const char *name) {
  (void)ctx, (void)variant, (void)name;
  return BP_OK;
}

static bp_status side_add_node(void *ctx, int variant, bp_segment segment, const char *name,
                               const char *op, const char *impl, const bp_abi_kernel_args *args,
                               int *slot_out) {
  tune_side *s = ctx;
  if (s->count == s->cap) {
    const int cap = s->cap ? 2 * s->cap : 64;
    tune_node *grown = realloc(s->nodes, (size_t)cap * sizeof *grown);
    if (!grown) return bp_fail(BP_ERR_NOMEM, "out of memory timing autotune's steps");
    s->nodes = grown;
    s->cap = cap;
  }
  tune_node *n = &s->nodes[s->count];
  memset(n, 0, sizeof *n);
  n->variant = variant;
  n->segment = segment;
  snprintf(n->name, sizeof n->name, "%s", name);
  snprintf(n->op, sizeof n->op, "%s", op);
  snprintf(n->impl, sizeof n->impl, "%s", impl);
  (void)bp_autotune_node_times(s->t->registry, op, s->t->kernel_kind, args, n->alone,
                               sizeof n->alone);
  n->refused = bp_autotune_excluded(s->t->registry, op, s->t->kernel_kind, args, impl);
  *slot_out = s->count++;
  return BP_OK;
}

static int side_recording(const void *ctx) { return ((const tune_side *)ctx)->recording; }

static void side_node_time(void *ctx, int slot, uint64_t ns) {
  tune_side *s = ctx;
  tune_node *n = &s->nodes[slot];
  if (s->round < TUNE_ROUNDS) n->ns[s->round] += (double)ns; /* a node may run twice a step */
  if (n->runs <= s->round) n->runs = s->round + 1;
}

static void side_run_time(void *ctx, int variant, uint64_t ns) { (void)ctx, (void)variant, (void)ns; }

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(const double *v, int n) {
  double s[TUNE_ROUNDS];
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* Whether some rank binds another kernel than the default for some node. */
static int selections_differ(const bp_trainer *t) {
  for (int k = 0; k < t->local; k++) {
    const bp_train_rank *r = &t->ranks[k];
    for (int v = 0; v < bp_plan_variant_count(t->plan); v++)
      for (int s = 0; s < BP_SEGMENT_COUNT; s++)
        for (int i = 0; bp_exec_node(r->exec, v, (bp_segment)s, i); i++)
          if (bp_exec_kernel(r->exec, v, (bp_segment)s, i) !=
              bp_exec_kernel(r->default_exec, v, (bp_segment)s, i))
            return 1;
  }
  return 0;
}

/* The arena of every local rank back to the copy taken before the steps. */
static void restore_arenas(bp_trainer *t, char *const *copies, uint64_t bytes) {
  for (int k = 0; k < t->local; k++) memcpy(t->ranks[k].base, copies[k], (size_t)bytes);
  bp_train_params_changed(t);
}

/* One whole training step on every rank with selection `which` (0: the
 * default, 1: tuned), from the restored arena; its seconds in *sec_out. */
static bp_status one_step(bp_trainer *t, bp_exec *const *execs, int which, char *const *copies,
                          uint64_t bytes, tune_side *sides, int round, double *sec_out) {
  for (int k = 0; k < t->local; k++) t->ranks[k].exec = execs[2 * k + which];
  /* the step's kernels see new parameters, as after every real step's update */
  restore_arenas(t, copies, bytes);
  bp_status st = bp_train_write_scalars(t, bp_schedule_lr(&t->schedule, 0), 1);
  if (st != BP_OK) return st;
  sides[which].recording = round >= 0;
  sides[which].round = round;
  const double t0 = bp_train_now();
  st = bp_rank_pool_run(t, t->rank_steps[BP_STEP_FULL], step_segments,
                        (int)(sizeof step_segments / sizeof step_segments[0]), 0, NULL, NULL);
  *sec_out = bp_train_now() - t0;
  sides[which].recording = 0;
  return st;
}

static void note(bp_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(bp_trainer *t, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  const size_t have = t->autotune_report ? strlen(t->autotune_report) : 0;
  char *grown = realloc(t->autotune_report, have + strlen(line) + 1);
  if (!grown) return; /* the report is advice; the run goes on */
  memcpy(grown + have, line, strlen(line) + 1);
  t->autotune_report = grown;
}

/* The per-node table: the nodes of a training step where a candidate was
 * timed or the two selections differ. */
static void report_nodes(bp_trainer *t, const tune_side *sides, int rounds) {
  note(t, "autotune: %-34s %-22s %-22s %s\n", "node (op)", "default, ms in step",
       "tuned, ms in step", "candidates timed alone, ms");
  const tune_side *d = &sides[0], *u = &sides[1];
  for (int i = 0; i < d->count && i < u->count; i++) {
    const tune_node *a = &d->nodes[i], *b = &u->nodes[i];
    if (a->variant != t->v_train || !a->runs || strcmp(a->name, b->name) != 0) continue;
    if (!strchr(b->alone, ',') && strcmp(a->impl, b->impl) == 0) continue;
    char who[160], left[96], right[96];
    snprintf(who, sizeof who, "%s (%s)", a->name, a->op);
    snprintf(left, sizeof left, "%s %.3f", a->impl, median(a->ns, rounds) / 1e6);
    snprintf(right, sizeof right, "%s %.3f", b->impl, median(b->ns, rounds) / 1e6);
    note(t, "autotune: %-34s %-22s %-22s %s\n", who, left, right,
         b->alone[0] ? b->alone : "-");
  }
}

/* A node where the default selection binds a kernel that autotune's
 * checks excluded, or NULL: such a default is no alternative, since it
 * would run a kernel the checks refused. */
static const tune_node *default_failed_checks(const tune_side *sides) {
  for (int i = 0; i < sides[0].count; i++)
    if (sides[0].nodes[i].refused) return &sides[0].nodes[i];
  return NULL;
}

bp_status bp_train_autotune_confirm(bp_trainer *t) {
  if (!t->opt.autotune) return BP_OK;
  const char *skip = NULL;
  if (bp_train_multi_process(t))
    skip = "under mpirun (each process would time its own steps)";
  else if (t->graph_mode)
    skip = "steps run as captured graphs";
  else if (!t->ranks[0].io.host)
    skip = "the arena is not host memory";
  else if (!t->train_set || t->v_train < 0 || t->rank_steps[BP_STEP_FULL][0].variant < 0)
    skip = "no training steps to time";
  else if (!selections_differ(t))
    skip = "the tuned kernels are the default ones";
  bp_status st = BP_OK;
  const uint64_t bytes = bp_plan_total_bytes(t->plan);
  char *copies[BP_TRAIN_MAX_RANKS] = {NULL};
  bp_exec *execs[2 * BP_TRAIN_MAX_RANKS];
  tune_side sides[2] = {{.t = t}, {.t = t}};
  int keep = 1; /* the tuned selection, unless the steps say otherwise */
  for (int k = 0; k < t->local; k++) {
    execs[2 * k] = t->ranks[k].default_exec;
    execs[2 * k + 1] = t->ranks[k].exec;
  }
  if (skip) {
    note(t, "autotune: kept the tuned kernels without timing whole steps: %s\n", skip);
    goto done;
  }
  for (int k = 0; k < t->local; k++) {
    copies[k] = malloc((size_t)bytes);
    if (!copies[k]) {
      st = bp_fail(BP_ERR_NOMEM, "out of memory copying the arena for autotune's steps");
      goto done;
    }
    memcpy(copies[k], t->ranks[k].base, (size_t)bytes);
  }
  for (int w = 0; w < 2; w++) {
    const bp_exec_timer timer = {.ctx = &sides[w],
                                 .add_variant = side_add_variant,
                                 .add_node = side_add_node,
                                 .recording = side_recording,
                                 .node_time = side_node_time,
                                 .run_time = side_run_time};
    if ((st = bp_exec_set_timer(execs[w], &timer)) != BP_OK) goto done;
  }
  const tune_node *refused = default_failed_checks(sides);
  if (refused) {
    note(t,
         "autotune: kept the tuned kernels without timing whole steps: the default selection "
         "binds %s to node '%s' (%s), which failed autotune's checks\n",
         refused->impl, refused->name, refused->op);
    goto done;
  }
  double sec[2][TUNE_ROUNDS], ignored, spent = 0;
  int rounds = 0;
  for (int i = 0; i < TUNE_WARMUP && st == BP_OK; i++)
    for (int w = 0; w < 2 && st == BP_OK; w++)
      st = one_step(t, execs, w, copies, bytes, sides, -1, &ignored);
  /* alternating, each round's first side swapped (ABBA...): both see the same load */
  for (; st == BP_OK && rounds < TUNE_ROUNDS &&
         (rounds < TUNE_ROUNDS_MIN || spent < 2 * TUNE_BUDGET_S);
       rounds++)
    for (int j = 0; j < 2 && st == BP_OK; j++) {
      const int w = (rounds % 2) ^ j;
      st = one_step(t, execs, w, copies, bytes, sides, rounds, &sec[w][rounds]);
      spent += sec[w][rounds];
    }
  if (st != BP_OK) goto done;
  const double default_ms = median(sec[0], rounds) * 1e3;
  const double tuned_ms = median(sec[1], rounds) * 1e3;
  keep = bp_autotune_keep_tuned(tuned_ms, default_ms, BP_AUTOTUNE_STEP_MARGIN);
  t->autotune_step_ms[0] = default_ms;
  t->autotune_step_ms[1] = tuned_ms;
  t->autotune_confirmed = 1;
  report_nodes(t, sides, rounds);
  note(t,
       "autotune: step: %.3f ms tuned vs %.3f ms default (median of %d alternating steps): "
       "%s\n",
       tuned_ms, default_ms, rounds,
       keep ? "keeping the tuned kernels"
            : "keeping the default kernels (the tuned ones are not faster by 2%)");
done:
  for (int w = 0; w < 2 && !skip; w++) (void)bp_exec_set_timer(execs[w], NULL);
  for (int w = 0; w < 2; w++) free(sides[w].nodes);
  for (int k = 0; k < t->local; k++) {
    bp_train_rank *r = &t->ranks[k];
    bp_exec *tuned = execs[2 * k + 1];
    if (copies[k]) memcpy(r->base, copies[k], (size_t)bytes);
    free(copies[k]);
    r->exec = keep ? tuned : r->default_exec;
    bp_exec_destroy(keep ? r->default_exec : tuned);
    r->default_exec = NULL;
  }
  t->autotune_kept_tuned = keep;
  bp_train_params_changed(t);
  return st;
}

const char *bp_trainer_autotune_report(const bp_trainer *t) {
  return t && t->autotune_report ? t->autotune_report : "";
}
