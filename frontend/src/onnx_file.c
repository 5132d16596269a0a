/* Which front end reads a model file: ONNX by the ".onnx" extension, YAML
 * otherwise (model_onnx.h). */
#include <string.h>

#include "blueprint/model_onnx.h"
#include "blueprint/model_yaml.h"

int bp_model_path_is_onnx(const char *path) {
  const size_t n = path ? strlen(path) : 0;
  return n > 5 && strcmp(path + n - 5, ".onnx") == 0;
}

bp_status bp_model_load_file(const char *path, const struct bp_registry *registry,
                             bp_model **model_out) {
  if (bp_model_path_is_onnx(path)) return bp_onnx_load(path, model_out);
  return bp_model_load_with_registry(path, registry, model_out);
}
