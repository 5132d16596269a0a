/* model_onnx.h in a build without protobuf-c or ONNX's schema: every call
 * says what the build lacks. */
#include "blueprint/model_onnx.h"

#define MISSING                                                                          \
  "this blueprint was built without ONNX support (install libprotobuf-c-dev, "          \
  "protobuf-c-compiler and libonnx-dev, then configure again)"

int bp_onnx_available(void) { return 0; }

bp_status bp_onnx_load(const char *path, bp_model **model_out) {
  (void)model_out;
  return bp_fail(BP_ERR_UNSUPPORTED, "%s: %s", path ? path : "(null)", MISSING);
}

bp_status bp_onnx_parse(const void *data, size_t size, const char *display_name,
                        bp_model **model_out) {
  (void)data, (void)size, (void)model_out;
  return bp_fail(BP_ERR_UNSUPPORTED, "%s: %s", display_name ? display_name : "(memory)", MISSING);
}

bp_status bp_onnx_save(const bp_model *model, bp_onnx_tensor_reader read, void *user,
                       const bp_onnx_export_options *options, const char *path) {
  (void)model, (void)read, (void)user, (void)options;
  return bp_fail(BP_ERR_UNSUPPORTED, "%s: %s", path ? path : "(null)", MISSING);
}
