/* The metrics file: one JSON object per line (docs/metrics-jsonl.md), each
 * line written whole and flushed, so a reader (or a crash) never sees half
 * an object. Non-finite numbers, which JSON cannot hold, are written null. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train-impl.h"

struct bp_metrics {
  FILE *file;
  char *path;
};

bp_status bp_metrics_open(const char *path, int append, bp_metrics **out) {
  bp_metrics *m = calloc(1, sizeof *m);
  if (!m) return bp_fail(BP_ERR_NOMEM, "out of memory opening the metrics file");
  m->path = strdup(path);
  m->file = m->path ? fopen(path, append ? "a" : "w") : NULL;
  if (!m->file) {
    const int err = errno;
    free(m->path);
    free(m);
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
  size_t n = strlen(line);
  snprintf(line + n, sizeof line - n, ",\"complete\":%s,\"checkpointed\":%s",
           r->complete ? "true" : "false", r->checkpointed ? "true" : "false");
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
