/* The kernel report of `train`, `eval` and `predict` (kernel_report.h). */
#include "kernel_report.h"

#include <string.h>

#include "cli_util.h"

void bp_cli_kernel_notes(const char *command, const bp_trainer *t) {
  const char *w = bp_trainer_warnings(t);
  while (*w) {
    const char *nl = strchr(w, '\n');
    const int len = nl ? (int)(nl - w) : (int)strlen(w);
    bp_cli_report(command, "warning: %.*s", len, w);
    w += len + (nl ? 1 : 0);
  }
  const bp_registry *r = bp_trainer_registry(t);
  int refused = 0;
  for (int i = 0; i < bp_registry_record_count(r); i++) {
    const bp_load_record *rec = bp_registry_record(r, i);
    refused += rec->outcome == BP_LOAD_REFUSED && strcmp(rec->source, "BP_PLUGIN_PATH") == 0;
  }
  if (refused)
    bp_cli_report(command, "note: %d module%s on BP_PLUGIN_PATH %s refused; see `blueprint "
                  "plugins`", refused, refused == 1 ? "" : "s", refused == 1 ? "was" : "were");
}

/* Where the pins came from, as a user of the command line knows it. */
static const char *source_text(bp_pin_source source) {
  switch (source) {
  case BP_PINS_OPTION: return "--kernels";
  case BP_PINS_MODEL: return "the model file";
  case BP_PINS_ENV:
  case BP_PINS_NONE: break;
  }
  return bp_pin_source_name(source);
}

static int kept(const bp_kernel_use *u, const char *prefix) {
  return !prefix || strncmp(u->variant, prefix, strlen(prefix)) == 0;
}

static int same_kind(const bp_abi_kernel *a, const bp_abi_kernel *b) {
  return !strcmp(a->op, b->op) && !strcmp(a->impl, b->impl) && !strcmp(a->device, b->device);
}

void bp_cli_kernel_warnings(FILE *out, const char *text) {
  while (*text) {
    const char *nl = strchr(text, '\n');
    const int len = nl ? (int)(nl - text) : (int)strlen(text);
    fprintf(out, "  warning: %.*s\n", len, text);
    text += len + (nl ? 1 : 0);
  }
}

void bp_cli_kernel_table(FILE *out, const bp_trainer *t, const char *prefix, int verbose) {
  const int n = bp_trainer_kernel_use_count(t);
  bp_pin_source source;
  const char *pins = bp_trainer_pins(t, &source);
  if (pins[0])
    fprintf(out, "kernels (pins from %s: %s):\n", source_text(source), pins);
  else
    fprintf(out, "kernels (no pins):\n");
  for (int i = 0; i < n; i++) {
    const bp_kernel_use *u = bp_trainer_kernel_use(t, i);
    if (!kept(u, prefix)) continue;
    int first = 1, nodes = 0;
    for (int j = 0; j < n && first; j++) {
      const bp_kernel_use *o = bp_trainer_kernel_use(t, j);
      if (j < i && kept(o, prefix) && same_kind(&o->kernel->kernel, &u->kernel->kernel))
        first = 0;
    }
    if (!first) continue;
    for (int j = i; j < n; j++) {
      const bp_kernel_use *o = bp_trainer_kernel_use(t, j);
      nodes += kept(o, prefix) && same_kind(&o->kernel->kernel, &u->kernel->kernel);
    }
    const bp_abi_kernel *k = &u->kernel->kernel;
    fprintf(out, "  %-26s %-12s %-6s %4d node%s%s\n", k->op, k->impl, k->device, nodes,
            nodes == 1 ? "" : "s", (k->flags & BP_ABI_KERNEL_REFERENCE) ? "  (reference)" : "");
  }
  bp_cli_kernel_warnings(out, bp_trainer_kernel_warnings(t));
  if (!verbose) return;
  fprintf(out, "kernel of each node:\n");
  for (int i = 0; i < n; i++) {
    const bp_kernel_use *u = bp_trainer_kernel_use(t, i);
    if (!kept(u, prefix)) continue;
    char where[96];
    snprintf(where, sizeof where, "%s/%s", u->variant, u->segment);
    fprintf(out, "  rank %d  %-24s %-28s %s/%s/%s\n", u->rank, where, u->node,
            u->kernel->kernel.op, u->kernel->kernel.impl, u->kernel->kernel.device);
  }
}

void bp_cli_exec_kernel_table(FILE *out, const bp_exec *x, int variant, bp_segment segment,
                              const char *pins, int verbose) {
  if (pins && pins[0]) fprintf(out, "kernels (pins: %s):\n", pins);
  else fprintf(out, "kernels (no pins):\n");
  int n = 0;
  while (bp_exec_kernel(x, variant, segment, n)) n++;
  for (int i = 0; i < n; i++) {
    const bp_abi_kernel *k = &bp_exec_kernel(x, variant, segment, i)->kernel;
    int first = 1, nodes = 0;
    for (int j = 0; j < i && first; j++)
      first = !same_kind(&bp_exec_kernel(x, variant, segment, j)->kernel, k);
    if (!first) continue;
    for (int j = i; j < n; j++)
      nodes += same_kind(&bp_exec_kernel(x, variant, segment, j)->kernel, k);
    fprintf(out, "  %-26s %-12s %-6s %4d node%s%s\n", k->op, k->impl, k->device, nodes,
            nodes == 1 ? "" : "s", (k->flags & BP_ABI_KERNEL_REFERENCE) ? "  (reference)" : "");
  }
  if (!verbose) return;
  fprintf(out, "kernel of each node:\n");
  for (int i = 0; i < n; i++) {
    const bp_abi_kernel *k = &bp_exec_kernel(x, variant, segment, i)->kernel;
    const bp_node *node = bp_exec_node(x, variant, segment, i);
    fprintf(out, "  %-28s %s/%s/%s\n", node ? node->name : "?", k->op, k->impl, k->device);
  }
}
