/* The metrics file: one JSON object per line (docs/metrics-jsonl.md), each
 * line written whole and flushed, so a reader (or a crash) never sees half
 * an object. Non-finite numbers, which JSON cannot hold, are written null. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blueprint/json_out.h"
#include "blueprint/outfile.h"
#include "train-impl.h"

struct bp_metrics {
  FILE *file;
  char *path;
};

bp_status bp_metrics_open(const char *path, int append, bp_metrics **out) {
  bp_metrics *m = calloc(1, sizeof *m);
  if (!m) return bp_fail(BP_ERR_NOMEM, "out of memory opening the metrics file");
  m->path = strdup(path);
  /* never a FIFO or a device: opened without blocking, checked (outfile.h) */
  int fd = m->path ? bp_output_open(path, "metrics file", append) : -1;
  m->file = fd >= 0 ? fdopen(fd, append ? "a" : "w") : NULL;
  if (!m->file) {
    const int err = errno;
    if (fd >= 0) close(fd);
    free(m->path);
    free(m);
    if (fd < 0 && path) return BP_ERR_IO; /* bp_output_open said why */
    return bp_fail(BP_ERR_IO, "metrics file '%s': %s", path, strerror(err));
  }
  *out = m;
  return BP_OK;
}

void bp_metrics_close(bp_metrics *m) {
  if (!m) return;
  fclose(m->file);
  free(m->path);
  free(m);
}

/* Appends `"key":value` (a number, or null when not finite) to buf. */
static void num(char *buf, size_t size, const char *key, double v) {
  size_t n = strlen(buf);
  if (n >= size) return;
  if (isfinite(v))
    snprintf(buf + n, size - n, ",\"%s\":%.9g", key, v);
  else
    snprintf(buf + n, size - n, ",\"%s\":null", key);
}

static void integer(char *buf, size_t size, const char *key, int64_t v) {
  size_t n = strlen(buf);
  if (n < size) snprintf(buf + n, size - n, ",\"%s\":%lld", key, (long long)v);
}

static bp_status emit(bp_metrics *m, const char *line) {
  if (fprintf(m->file, "%s}\n", line) < 0 || fflush(m->file) != 0)
    return bp_fail(BP_ERR_IO, "metrics file '%s': %s", m->path, strerror(errno));
  return BP_OK;
}

bp_status bp_metrics_write_epoch(bp_metrics *m, const bp_epoch_report *r) {
  char line[1024] = "{\"event\":\"epoch\"";
  integer(line, sizeof line, "epoch", r->epoch);
  integer(line, sizeof line, "epochs", r->epochs);
  integer(line, sizeof line, "global_step", r->global_step);
  integer(line, sizeof line, "steps", r->steps);
  integer(line, sizeof line, "samples", r->samples);
  num(line, sizeof line, "train_loss", r->train_loss);
  num(line, sizeof line, "train_accuracy", r->train_accuracy);
  num(line, sizeof line, "test_loss", r->test_loss);
  num(line, sizeof line, "test_accuracy", r->test_accuracy);
  integer(line, sizeof line, "test_samples", r->test_samples);
  num(line, sizeof line, "images_per_second", r->images_per_second);
  num(line, sizeof line, "train_seconds", r->train_seconds);
  num(line, sizeof line, "eval_seconds", r->eval_seconds);
  num(line, sizeof line, "seconds", r->seconds);
  num(line, sizeof line, "lr", r->lr);
  if (r->amp) {
    num(line, sizeof line, "loss_scale", r->loss_scale);
    integer(line, sizeof line, "skipped_steps", r->skipped_steps);
  }
  size_t n = strlen(line);
  snprintf(line + n, sizeof line - n, ",\"complete\":%s,\"checkpointed\":%s",
           r->complete ? "true" : "false", r->checkpointed ? "true" : "false");
  /* how rank 0's steps reached the device, per step (docs/training.md) */
  const double steps = r->exec.steps ? (double)r->exec.steps : 1.0;
  num(line, sizeof line, "graph_launches_per_step", (double)r->exec.graph_launches / steps);
  num(line, sizeof line, "kernel_calls_per_step", (double)r->exec.kernel_calls / steps);
  num(line, sizeof line, "host_tasks_per_step", (double)r->exec.host_tasks / steps);
  num(line, sizeof line, "syncs_per_step", (double)r->exec.syncs / steps);
  num(line, sizeof line, "waits_per_step", (double)r->exec.waits / steps);
  num(line, sizeof line, "events_per_step", (double)r->exec.events / steps);
  num(line, sizeof line, "comm_ms_per_step", (double)r->exec.comm_us / 1e3 / steps);
  num(line, sizeof line, "comm_overlap_ms_per_step", (double)r->exec.comm_overlap_us / 1e3 / steps);
  return emit(m, line);
}

bp_status bp_metrics_write_step(bp_metrics *m, const bp_train_progress *p) {
  char line[1024] = "{\"event\":\"step\"";
  integer(line, sizeof line, "epoch", p->epoch);
  integer(line, sizeof line, "epochs", p->epochs);
  integer(line, sizeof line, "step", p->step);
  integer(line, sizeof line, "steps", p->steps);
  integer(line, sizeof line, "global_step", p->global_step);
  integer(line, sizeof line, "samples", p->samples);
  num(line, sizeof line, "train_loss", p->loss);
  num(line, sizeof line, "train_accuracy", p->accuracy);
  num(line, sizeof line, "lr", p->lr);
  num(line, sizeof line, "images_per_second", p->images_per_second);
  num(line, sizeof line, "seconds", p->seconds);
  return emit(m, line);
}

bp_status bp_metrics_write_profile(bp_metrics *m, const bp_profile *p) {
  fputs("{\"event\":\"profile\"", m->file);
  bp_status st = bp_profile_write_json(p, m->file);
  return st == BP_OK ? emit(m, "") : st;
}

/* 1 when use i is the first of its (op, impl, device). */
static int first_of_kind(const bp_trainer *t, int i) {
  const bp_abi_kernel *k = &bp_trainer_kernel_use(t, i)->kernel->kernel;
  for (int j = 0; j < i; j++) {
    const bp_abi_kernel *o = &bp_trainer_kernel_use(t, j)->kernel->kernel;
    if (o == k || (!strcmp(o->op, k->op) && !strcmp(o->impl, k->impl) &&
                   !strcmp(o->device, k->device)))
      return 0;
  }
  return 1;
}

bp_status bp_metrics_write_kernels(bp_metrics *m, const bp_trainer *t) {
  FILE *f = m->file;
  bp_pin_source source;
  const char *pins = bp_trainer_pins(t, &source);
  fputs("{\"event\":\"kernels\",\"device\":", f);
  bp_json_string(f, t->device);
  fputs(",\"pins\":", f);
  bp_json_string(f, pins);
  fputs(",\"pins_source\":", f);
  bp_json_string(f, bp_pin_source_name(source));
  fprintf(f, ",\"autotune\":%s,", t->opt.autotune ? "true" : "false");
  if (t->autotune_confirmed) /* the whole steps that decided (train_autotune.c) */
    fprintf(f, "\"autotune_kept\":\"%s\",\"autotune_step_ms\":%.4f,\"default_step_ms\":%.4f,",
            t->autotune_kept_tuned ? "tuned" : "default", t->autotune_step_ms[1],
            t->autotune_step_ms[0]);
  fputs("\"warnings\":[", f);
  /* pin warnings, then the kernel checks' (a slow priority pick) */
  const char *lists[2] = {bp_trainer_warnings(t), bp_trainer_kernel_warnings(t)};
  int first = 1;
  for (int k = 0; k < 2; k++)
    for (const char *w = lists[k]; *w; first = 0) { /* one string per line */
      const char *nl = strchr(w, '\n');
      const size_t len = nl ? (size_t)(nl - w) : strlen(w);
      char line[1024];
      snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), w);
      if (!first) fputc(',', f);
      bp_json_string(f, line);
      w += len + (nl ? 1 : 0);
    }
  fputs("],\"ops\":[", f);
  const int n = bp_trainer_kernel_use_count(t);
  for (int i = 0, listed = 0; i < n; i++) {
    if (!first_of_kind(t, i)) continue;
    const bp_registered_kernel *k = bp_trainer_kernel_use(t, i)->kernel;
    int nodes = 0;
    for (int j = i; j < n; j++) {
      const bp_abi_kernel *o = &bp_trainer_kernel_use(t, j)->kernel->kernel;
      nodes += !strcmp(o->op, k->kernel.op) && !strcmp(o->impl, k->kernel.impl) &&
               !strcmp(o->device, k->kernel.device);
    }
    fputs(listed++ ? ",{\"op\":" : "{\"op\":", f);
    bp_json_string(f, k->kernel.op);
    fputs(",\"impl\":", f);
    bp_json_string(f, k->kernel.impl);
    fputs(",\"device\":", f);
    bp_json_string(f, k->kernel.device);
    fputs(",\"module\":", f);
    bp_json_string(f, k->path);
    fprintf(f, ",\"nodes\":%d}", nodes);
  }
  fputs("],\"nodes\":[", f);
  for (int i = 0; i < n; i++) {
    const bp_kernel_use *u = bp_trainer_kernel_use(t, i);
    fprintf(f, "%s{\"rank\":%d,\"variant\":", i ? "," : "", u->rank);
    bp_json_string(f, u->variant);
    fputs(",\"segment\":", f);
    bp_json_string(f, u->segment);
    fputs(",\"node\":", f);
    bp_json_string(f, u->node);
    fputs(",\"op\":", f);
    bp_json_string(f, u->kernel->kernel.op);
    fputs(",\"impl\":", f);
    bp_json_string(f, u->kernel->kernel.impl);
    fputs(",\"device\":", f);
    bp_json_string(f, u->kernel->kernel.device);
    fputc('}', f);
  }
  fputs("]", f);
  return emit(m, "");
}
