/* Which front end reads a model file: ONNX by the ".onnx" extension, with
 * its training settings from "<name>.train.yaml" beside it when that file
 * exists; YAML otherwise (model_onnx.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/infile.h"
#include "blueprint/model_onnx.h"
#include "blueprint/model_yaml.h"

int bp_model_path_is_onnx(const char *path) {
  const size_t n = path ? strlen(path) : 0;
  return n > 5 && strcmp(path + n - 5, ".onnx") == 0;
}

/* "<path without .onnx>.train.yaml" into `out` */
static void settings_path(const char *path, char *out, size_t size) {
  snprintf(out, size, "%.*s.train.yaml", (int)(strlen(path) - 5), path);
}

bp_status bp_model_load_file(const char *path, const struct bp_registry *registry,
                             bp_model **model_out) {
  if (!bp_model_path_is_onnx(path)) return bp_model_load_with_registry(path, registry, model_out);
  bp_model *m = NULL;
  bp_status st = bp_onnx_load(path, &m);
  if (st != BP_OK) return st;
  char settings[4200];
  settings_path(path, settings, sizeof settings);
  char *text = NULL;
  size_t size = 0;
  st = bp_input_read_all(settings, "training settings", 1u << 20, &text, &size);
  if (st != BP_OK && errno == ENOENT) {
    st = BP_OK; /* none beside it: the defaults, and the command line */
  } else if (st == BP_OK) {
    st = bp_train_settings_parse(text, size, settings, &m->train);
  }
  free(text);
  if (st != BP_OK) {
    bp_model_destroy(m);
    return st;
  }
  *model_out = m;
  return BP_OK;
}
