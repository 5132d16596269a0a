/* Kernel selection for one node (registry.h): pins -> supports() ->
 * autotuned winner -> highest priority -> load order; REFERENCE kernels
 * only when nothing else supports the node. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/dtype.h"
#include "registry-impl.h"

/* "fp32[8,1,1,16], ..." for each tensor into buf. */
static void format_tensors(char *buf, size_t size, const bp_abi_tensor *t, int count) {
  buf[0] = '\0';
  if (count == 0) bp_strcatf(buf, size, "none");
  for (int i = 0; i < count; i++)
    bp_strcatf(buf, size, "%s%s[%lld,%lld,%lld,%lld]", i ? ", " : "",
               bp_dtype_name((bp_dtype)t[i].dtype), (long long)t[i].shape[0],
               (long long)t[i].shape[1], (long long)t[i].shape[2], (long long)t[i].shape[3]);
}

/* 1 when every tensor's dtype is in the kernel's mask; else 0 and why. */
static int dtypes_ok(const bp_abi_kernel *k, const bp_abi_kernel_args *a, char *reason,
                     size_t size) {
  for (int side = 0; side < 2; side++) {
    const bp_abi_tensor *t = side ? a->outputs : a->inputs;
    int n = side ? a->num_outputs : a->num_inputs;
    for (int i = 0; i < n; i++) {
      int d = t[i].dtype;
      if (d >= 0 && d < 32 && (k->dtypes & BP_ABI_DTYPE_BIT((unsigned)d))) continue;
      char mask[128] = "";
      for (unsigned b = 0; b < 32; b++)
        if (k->dtypes & BP_ABI_DTYPE_BIT(b))
          bp_strcatf(mask, sizeof mask, "%s%s", mask[0] ? "," : "", bp_dtype_name((bp_dtype)b));
      snprintf(reason, size, "%s %d is %s; the kernel takes %s", side ? "output" : "input", i,
               bp_dtype_name((bp_dtype)d), mask);
      return 0;
    }
  }
  return 1;
}

/* 1 when kernel k can run the node (dtypes, then its supports()). */
static int kernel_supports(const bp_registered_kernel *k, const bp_abi_kernel_args *meta,
                           char *reason, size_t size) {
  reason[0] = '\0';
  if (!dtypes_ok(&k->kernel, meta, reason, size)) return 0;
  if (!k->kernel.supports) return 1;
  if (k->kernel.supports(k->kernel.user, meta, reason, size)) return 1;
  reason[size - 1] = '\0'; /* a module that filled the buffer to the end */
  if (!reason[0]) snprintf(reason, size, "supports() said no without a reason");
  return 0;
}

/* Preference: higher priority first, then earlier registration. */
static int prefer(const bp_registered_kernel *a, const bp_registered_kernel *b) {
  if (a->kernel.priority != b->kernel.priority) return a->kernel.priority > b->kernel.priority;
  return a->load_index < b->load_index;
}

static int is_reference(const bp_registered_kernel *k) {
  return (k->kernel.flags & BP_ABI_KERNEL_REFERENCE) != 0;
}

const bp_registered_kernel *bp_registry_default_kernel(const bp_registry *r, const char *op,
                                                       const char *device) {
  if (!r || !op || !device) return NULL;
  const bp_registered_kernel *best = NULL;
  for (int i = 0; i < r->kernels.count; i++) {
    const bp_registered_kernel *k = r->kernels.items[i];
    if (strcmp(k->kernel.op, op) != 0 || strcmp(k->kernel.device, device) != 0) continue;
    if (!best || (is_reference(best) && !is_reference(k)) ||
        (is_reference(best) == is_reference(k) && prefer(k, best)))
      best = k;
  }
  return best;
}

/* Appends a line to the caller's report, if it asked for one. */
#define REPORT(opts, ...)                                                                      \
  do {                                                                                         \
    if ((opts) && (opts)->report && (opts)->report_size)                                       \
      bp_strcatf((opts)->report, (opts)->report_size, __VA_ARGS__);                            \
  } while (0)

/* "kernels for relu.fwd exist on: cpu, cuda" into buf. */
static void other_devices(const bp_registry *r, const char *op, char *buf, size_t size) {
  buf[0] = '\0';
  for (int i = 0; i < r->kernels.count; i++) {
    const bp_registered_kernel *k = r->kernels.items[i];
    if (strcmp(k->kernel.op, op) != 0) continue;
    int seen = 0;
    for (int j = 0; j < i && !seen; j++) {
      const bp_registered_kernel *o = r->kernels.items[j];
      seen = strcmp(o->kernel.op, op) == 0 && strcmp(o->kernel.device, k->kernel.device) == 0;
    }
    if (!seen) bp_strcatf(buf, size, "%s%s", buf[0] ? ", " : "", k->kernel.device);
  }
}

/* Selection once the node and its candidates are known. */
static bp_status select_among(bp_registry *r, const char *op, const char *device,
                              const bp_abi_kernel_args *a, const bp_select_options *options,
                              const bp_registered_kernel **cands, int n,
                              char (*reason)[BP_REASON_MAX], int *ok,
                              const bp_registered_kernel **pool,
                              const bp_registered_kernel **kernel_out) {
  char io[1024], in[480], out[480];
  format_tensors(in, sizeof in, a->inputs, a->num_inputs);
  format_tensors(out, sizeof out, a->outputs, a->num_outputs);
  snprintf(io, sizeof io, "inputs %s -> outputs %s", in, out);

  bp_abi_kernel_args meta = *a; /* what supports() sees: no pointers */
  meta.input_ptrs = NULL;
  meta.output_ptrs = NULL;
  meta.workspace = NULL;
  meta.workspace_bytes = 0;
  meta.params_generation = NULL; /* (1.4) run() and prepare() only */
  meta.reason = NULL;
  meta.reason_size = 0;

  /* 1. pins: a pin that matches nothing or names no kernel is an error
   * here too, whichever node asks (registry.h) */
  bp_pin_source source;
  const char *pins = bp_registry_resolve_pins(r, options ? options->pins : NULL, NULL, &source);
  const char *pin_source = source == BP_PINS_OPTION ? "select options" : "BP_KERNELS";
  char impl[64], pin_text[BP_PIN_MAX], err[BP_REASON_MAX];
  if (pins[0]) {
    bp_status checked = bp_registry_check_pins(r, pins, pin_source, NULL, 0);
    if (checked != BP_OK) return checked;
  }
  int pinned = bp_pins_find(pins, op, device, impl, pin_text, err, sizeof err);
  if (pinned < 0) return bp_fail(BP_ERR_INVALID, "%s: %s", pin_source, err);
  if (pinned) {
    for (int i = 0; i < n; i++) {
      if (strcmp(cands[i]->kernel.impl, impl) != 0) continue;
      if (!kernel_supports(cands[i], &meta, reason[i], BP_REASON_MAX))
        return bp_fail(BP_ERR_UNSUPPORTED,
                       "kernel %s/%s/%s is pinned by '%s' (%s) but does not support the node "
                       "(%s): %s",
                       op, impl, device, pin_text, pin_source, io, reason[i]);
      /* a pinned kernel gets the checks autotune gives a candidate, when a
       * checker is installed (the trainer's, unless --trust-pins) */
      const bp_select_checker *checker = bp_registry_checker(r);
      char why[BP_REASON_MAX] = "";
      if (checker &&
          !checker->pinned(checker->ctx, r, op, device, a, cands[i],
                           options && options->node ? options->node : "", why, sizeof why))
        return bp_fail(BP_ERR_UNSUPPORTED,
                       "kernel %s/%s/%s, pinned by '%s', fails the checks on the node's "
                       "shapes: %s (--trust-pins runs it unchecked)",
                       op, impl, device, pin_text, why);
      REPORT(options, "%s: picked (pinned by '%s' from %s)\n", impl, pin_text, pin_source);
      *kernel_out = cands[i];
      return BP_OK;
    }
    char names[512] = "";
    for (int i = 0; i < n; i++)
      bp_strcatf(names, sizeof names, "%s%s", i ? ", " : "", cands[i]->kernel.impl);
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "pin '%s' (%s) names no registered kernel '%s' for %s on %s (there are: %s)",
                   pin_text, pin_source, impl, op, device, names);
  }

  /* 2. supports(), with REFERENCE kernels held back */
  int any_other = 0, any_ref = 0;
  for (int i = 0; i < n; i++) {
    ok[i] = kernel_supports(cands[i], &meta, reason[i], BP_REASON_MAX);
    if (ok[i] && is_reference(cands[i])) any_ref = 1;
    if (ok[i] && !is_reference(cands[i])) any_other = 1;
  }
  if (!any_other && !any_ref) {
    char why[2048] = "";
    for (int i = 0; i < n; i++)
      bp_strcatf(why, sizeof why, "%s%s: %s", i ? "; " : "", cands[i]->kernel.impl, reason[i]);
    return bp_fail(BP_ERR_UNSUPPORTED, "no kernel supports %s on %s for %s; candidates: %s", op,
                   device, io, why);
  }
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (!ok[i] || (any_other && is_reference(cands[i]))) continue;
    int at = m++; /* insertion by preference keeps the order deterministic */
    while (at > 0 && prefer(cands[i], pool[at - 1])) {
      pool[at] = pool[at - 1];
      at--;
    }
    pool[at] = cands[i];
  }

  /* 3. autotune, 4. priority, 5. load order */
  int winner = 0;
  char tune_report[1024] = "";
  int collective = 0; /* a collective cannot be timed on one rank alone */
  for (int i = 0; i < m; i++) collective |= (pool[i]->kernel.flags & BP_ABI_KERNEL_COLLECTIVE) != 0;
  /* autotune checks a lone candidate against the reference too */
  const bp_registered_kernel *chosen = pool[0];
  if (options && options->autotune && !collective && (m > 1 || (m == 1 && any_other && any_ref))) {
    if ((a->num_inputs && !a->input_ptrs) || (a->num_outputs && !a->output_ptrs))
      return bp_fail(BP_ERR_INVALID,
                     "autotune of %s on %s needs the node's real pointers in args", op, device);
    const bp_select_tuner *tuner = bp_registry_tuner(r);
    if (!tuner)
      return bp_fail(BP_ERR_STATE,
                     "autotune of %s on %s: no tuner is installed in the registry "
                     "(bp_autotune_install, autotune.h)",
                     op, device);
    bp_status st = tuner->pick(tuner->ctx, r, op, device, options->device_index, a, pool, m,
                               options->autotune_cache, options->node, &winner, tune_report,
                               sizeof tune_report);
    if (st != BP_OK) return st;
    chosen = winner >= 0 ? pool[winner] : NULL;
    for (int i = 0; winner < 0 && i < n; i++) /* every candidate failed the checks */
      if (ok[i] && is_reference(cands[i]) && (!chosen || prefer(cands[i], chosen)))
        chosen = cands[i];
    if (!chosen)
      return bp_fail(BP_ERR_UNSUPPORTED,
                     "autotune of %s on %s: every kernel failed validate's checks (%s)", op,
                     device, tune_report);
  }
  for (int i = 0; i < n; i++) {
    const bp_registered_kernel *k = cands[i];
    if (k == chosen)
      REPORT(options, "%s (priority %d): picked (%s)\n", k->kernel.impl, k->kernel.priority,
             tune_report[0] ? "autotuned" : m > 1 ? "highest priority, then load order"
                                                  : "the only kernel that supports the node");
    else if (!ok[i])
      REPORT(options, "%s (priority %d): does not support the node: %s\n", k->kernel.impl,
             k->kernel.priority, reason[i]);
    else if (any_other && is_reference(k))
      REPORT(options, "%s (priority %d): reference, held back: another kernel supports the node\n",
             k->kernel.impl, k->kernel.priority);
    else
      REPORT(options, "%s (priority %d): supports the node, not picked\n", k->kernel.impl,
             k->kernel.priority);
  }
  if (tune_report[0]) REPORT(options, "%s", tune_report);
  /* picked by priority among several: the checker may look at it */
  const bp_select_checker *checker = bp_registry_checker(r);
  if (checker && checker->by_priority && !tune_report[0] && m > 1 && chosen == pool[0])
    checker->by_priority(checker->ctx, r, op, device, a, pool, m,
                         options && options->node ? options->node : "");
  *kernel_out = chosen;
  return BP_OK;
}

bp_status bp_registry_select(bp_registry *r, const char *op, const char *device,
                             const bp_abi_kernel_args *args, const bp_select_options *options,
                             const bp_registered_kernel **kernel_out) {
  if (!r || !op || !device || !args || !kernel_out)
    return bp_fail(BP_ERR_INVALID, "bp_registry_select: NULL argument");
  if (options && options->report && options->report_size) options->report[0] = '\0';
  const bp_abi_op *o = bp_registry_find_op(r, op);
  if (!o) return bp_fail(BP_ERR_INVALID, "unknown op '%s'", op);
  uint32_t size = args->struct_size;
  if (size < BP_ABI_END(bp_abi_kernel_args, outputs) || size > BP_ABI_STRUCT_MAX)
    return bp_fail(BP_ERR_INVALID, "%s: kernel args have struct_size %u", op, size);
  bp_abi_kernel_args a;
  bp_abi_copy(&a, sizeof a, args);
  /* Counts are maxima: optional trailing tensors follow the attributes. */
  if (a.num_inputs < 0 || a.num_outputs < 0 || a.num_inputs > o->num_inputs ||
      a.num_outputs > o->num_outputs)
    return bp_fail(BP_ERR_INVALID,
                   "%s takes at most %d inputs and %d outputs; args have %d and %d", op,
                   o->num_inputs, o->num_outputs, a.num_inputs, a.num_outputs);
  if ((a.num_inputs && !a.inputs) || (a.num_outputs && !a.outputs))
    return bp_fail(BP_ERR_INVALID, "%s: args lack tensor descriptors", op);

  int n = bp_registry_candidates(r, op, device, NULL, 0);
  if (n == 0) {
    char devs[256];
    other_devices(r, op, devs, sizeof devs);
    return bp_fail(BP_ERR_UNSUPPORTED, "no kernel for %s on device '%s' (%s%s)", op, device,
                   devs[0] ? "kernels for it exist on: " : "no kernel for it on any device",
                   devs);
  }
  const bp_registered_kernel **cands = malloc((size_t)n * sizeof *cands);
  char(*reason)[BP_REASON_MAX] = malloc((size_t)n * sizeof *reason);
  int *ok = malloc((size_t)n * sizeof *ok);
  const bp_registered_kernel **pool = malloc((size_t)n * sizeof *pool);
  bp_status st;
  if (!cands || !reason || !ok || !pool) {
    st = bp_fail(BP_ERR_NOMEM, "out of memory selecting a kernel for %s", op);
  } else {
    bp_registry_candidates(r, op, device, cands, n);
    st = select_among(r, op, device, &a, options, cands, n, reason, ok, pool, kernel_out);
  }
  free(pool);
  free(cands);
  free(reason);
  free(ok);
  return st;
}
