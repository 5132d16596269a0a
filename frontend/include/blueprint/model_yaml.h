/* The YAML front end: model files (format: models/README.md) read into
 * the model IR (model.h). The core never reads files of models: a front
 * end builds a bp_model, and everything after it works on that. */
#ifndef BLUEPRINT_MODEL_YAML_H
#define BLUEPRINT_MODEL_YAML_H

#include <stddef.h>

#include "blueprint/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads a YAML model file (format: models/README.md). Errors are one line
 * naming "file:line:column", the field and the value: BP_ERR_IO (the file
 * cannot be read), BP_ERR_PARSE (YAML syntax), BP_ERR_INVALID (an unknown
 * layer type or field, a wrong value type or range, a duplicate name, an
 * unknown or later input, a missing required field, no softmax_ce last).
 * *model_out is written only on success. */
bp_status bp_model_load(const char *path, bp_model **model_out);
/* The same from memory; `display_name` stands for the file in messages. */
bp_status bp_model_parse(const char *text, size_t length, const char *display_name,
                         bp_model **model_out);

struct bp_registry; /* registry.h */
/* The same, with the layer types of the op modules `registry` loaded: a
 * `type:` that is not built in names one of them (bp_registry_find_layer),
 * and its keys fill the type's attribute block by the type's schema (type,
 * range, default, required; an unknown key is an error). Without the type
 * the error names the modules loaded. The model borrows the registry,
 * which must outlive it. NULL registry: built-in types only. */
bp_status bp_model_load_with_registry(const char *path, const struct bp_registry *registry,
                                      bp_model **model_out);
bp_status bp_model_parse_with_registry(const char *text, size_t length, const char *display_name,
                                       const struct bp_registry *registry, bp_model **model_out);

/* Training settings alone: a YAML mapping with one optional 'train' block
 * of a model file's form (models/README.md), the settings beside a model
 * that carries none itself (an ONNX file: model_onnx.h). The fields the
 * text sets overwrite *settings; the others are left as they are. The
 * errors of bp_model_parse; any top-level key but 'train' is refused. */
bp_status bp_train_settings_parse(const char *text, size_t length, const char *display_name,
                                  bp_train_settings *settings);

#ifdef __cplusplus
}
#endif
#endif
