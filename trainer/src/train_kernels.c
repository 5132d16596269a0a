/* Which kernels a run uses (train.h): the pins in effect, checked once at
 * create, the table of the kernel each bound node got, for the
 * command line's report and the metrics file's "kernels" line, and what
 * the kernel checks (kernel_checks.h) found while the ranks bound. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/kernel_checks.h"
#include "train-impl.h"

/* How the pins' source is named in messages. */
static const char *source_label(bp_pin_source source) {
  switch (source) {
  case BP_PINS_OPTION: return "--kernels";
  case BP_PINS_ENV: return "BP_KERNELS";
  case BP_PINS_MODEL: return "the model file's kernels";
  case BP_PINS_NONE: break;
  }
  return "pins";
}

bp_status bp_train_pins_resolve(bp_trainer *t) {
  const char *pins =
      bp_registry_resolve_pins(t->registry, t->kernels, t->model->train.kernels, &t->pin_source);
  t->pins = strdup(pins);
  if (!t->pins) return bp_fail(BP_ERR_NOMEM, "out of memory copying the pins");
  if (!t->pins[0]) return BP_OK;
  return bp_registry_check_pins(t->registry, t->pins, source_label(t->pin_source), t->warnings,
                                sizeof t->warnings);
}

/* Appends one use; the array grows by doubling. */
static bp_status push(bp_trainer *t, int *cap, bp_kernel_use use) {
  if (t->kernel_use_count == *cap) {
    const int grown = *cap ? 2 * *cap : 256;
    bp_kernel_use *u = realloc(t->kernel_uses, (size_t)grown * sizeof *u);
    if (!u) return bp_fail(BP_ERR_NOMEM, "out of memory listing the kernels");
    t->kernel_uses = u;
    *cap = grown;
  }
  t->kernel_uses[t->kernel_use_count++] = use;
  return BP_OK;
}

/* The kernel local rank 0 bound for `node` of variant v, or NULL. */
static const bp_registered_kernel *first_rank_kernel(const bp_trainer *t, int v, bp_segment s,
                                                     const bp_node *node) {
  const bp_exec *x = t->ranks[0].exec;
  for (int i = 0; bp_exec_node(x, v, s, i); i++)
    if (bp_exec_node(x, v, s, i) == node) return bp_exec_kernel(x, v, s, i);
  return NULL;
}

bp_status bp_train_kernels_collect(bp_trainer *t) {
  int cap = 0;
  free(t->kernel_warnings); /* what the kernel checks found while the ranks bound */
  /* under autotune the priority picks they judge are the default
   * selection's: moot when the tuned one runs */
  const int moot = t->opt.autotune && t->autotune_kept_tuned;
  t->kernel_warnings = strdup(moot ? "" : bp_kernel_checks_warnings(t->registry));
  if (!t->kernel_warnings) return bp_fail(BP_ERR_NOMEM, "out of memory listing the kernels");
  for (int k = 0; k < t->local; k++) {
    const bp_exec *x = t->ranks[k].exec;
    for (int v = 0; v < bp_plan_variant_count(t->plan); v++)
      for (int s = 0; s < BP_SEGMENT_COUNT; s++)
        for (int i = 0; bp_exec_node(x, v, (bp_segment)s, i); i++) {
          const bp_node *n = bp_exec_node(x, v, (bp_segment)s, i);
          const bp_registered_kernel *kern = bp_exec_kernel(x, v, (bp_segment)s, i);
          if (k > 0 && first_rank_kernel(t, v, (bp_segment)s, n) == kern) continue;
          const bp_kernel_use use = {.rank = t->first_rank + k,
                                     .variant = bp_plan_variant(t->plan, v)->name,
                                     .segment = bp_segment_name((bp_segment)s),
                                     .node = n->name,
                                     .kernel = kern};
          bp_status st = push(t, &cap, use);
          if (st != BP_OK) return st;
        }
  }
  return BP_OK;
}

int bp_trainer_kernel_use_count(const bp_trainer *t) { return t ? t->kernel_use_count : 0; }

const bp_kernel_use *bp_trainer_kernel_use(const bp_trainer *t, int index) {
  if (!t || index < 0 || index >= t->kernel_use_count) return NULL;
  return &t->kernel_uses[index];
}

const char *bp_trainer_pins(const bp_trainer *t, bp_pin_source *source_out) {
  if (source_out) *source_out = t ? t->pin_source : BP_PINS_NONE;
  return t && t->pins ? t->pins : "";
}

const char *bp_trainer_warnings(const bp_trainer *t) { return t ? t->warnings : ""; }

const char *bp_trainer_kernel_warnings(const bp_trainer *t) {
  return t && t->kernel_warnings ? t->kernel_warnings : "";
}

const bp_registry *bp_trainer_registry(const bp_trainer *t) { return t ? t->registry : NULL; }
