/* Internals shared by the model parser (model_yaml.c), the model checks
 * (model.c), the layer table (layers.c, layer-impl.h) and the compiler
 * (compile.c). Not installed. */
#ifndef BLUEPRINT_MODEL_IMPL_H
#define BLUEPRINT_MODEL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "blueprint/model.h"

/* Longest layer name. Tensor names are "<layer>.<what><family suffix>"
 * (the longest: "<layer>.running_mean", "<layer>.weight.grad16", 14 bytes),
 * and must fit in BP_NAME_MAX. */
#define BP_LAYER_NAME_MAX 48

/* Upper bound of every spatial or channel field (height, kernel, filters, ...).
 * It keeps the compiler's own arithmetic (H + 2*pad, dilation*(k-1)+1) far
 * from overflow; element counts are still checked where they are multiplied. */
#define BP_MODEL_DIM_MAX INT32_MAX

/* Most layers a model file may list. */
#define BP_MODEL_LAYERS_MAX 16384

/* The name that, as a layer's `input`, means the model's input. No layer
 * may take it. */
#define BP_MODEL_INPUT_NAME "input"

/* Built-in layer type by its file name ("conv", ...); 0 on success
 * (never BP_LAYER_MODULE: a module's type is the registry's). layers.c. */
int bp_layer_type_from_name(const char *name, bp_layer_type *out);

/* A layer of `type` with every attribute at the default its key declares
 * in the layer table (stride 1, pad 0, dilation 1, groups 1, bias on, eps
 * 1e-5, momentum 0.1), no name, the model's input as every input. Pool
 * strides default to the kernel; the parser sets that. layers.c. */
void bp_layer_set_defaults(bp_layer *layer, bp_layer_type type);

/* The documented defaults of the training settings. */
bp_train_settings bp_train_defaults(void);

/* 1 when `name` may name a layer: 1..BP_LAYER_NAME_MAX-1 bytes of
 * [A-Za-z0-9_-], and not BP_MODEL_INPUT_NAME. */
int bp_layer_name_valid(const char *name);

/* "file:line:column" of a layer, "file" when it has no position, or
 * "model 'name'" when the model has no file. Writes into buf (size >= 1). */
void bp_model_where(const bp_model *model, const bp_layer *layer, char *buf, size_t size);

/* Structural checks of a model, whatever built it: input extents, layer
 * types, attribute ranges (each type's keys; a module type's schema),
 * unique valid names, producers that come earlier, the type's input count,
 * one softmax_ce and last. BP_ERR_INVALID with
 * "where: layer 'name': what" on the first failure. Shapes are the
 * compiler's business. */
bp_status bp_model_check(const bp_model *model);

#endif
