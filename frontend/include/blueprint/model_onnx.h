/* The ONNX front end: a network in an ONNX file read into the model IR
 * (model.h) with its initializers as the model's initial values, and a
 * model with its trained tensors written out as an ONNX inference graph.
 * The op subset and the layouts are docs/onnx.md. Built where protobuf-c
 * and ONNX's schema (libonnx-dev's onnx.proto) are found; elsewhere every
 * call fails with BP_ERR_UNSUPPORTED saying so. */
#ifndef BLUEPRINT_MODEL_ONNX_H
#define BLUEPRINT_MODEL_ONNX_H

#include <stddef.h>
#include <stdint.h>

#include "blueprint/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build reads and writes ONNX files. */
int bp_onnx_available(void);

/* 1 when `path` names an ONNX file by its extension (".onnx"). */
int bp_model_path_is_onnx(const char *path);

/* Reads an ONNX model (the ops and attributes of docs/onnx.md) into a
 * bp_model whose inits hold every initializer in the plan's layout
 * (conv weights OIHW -> [F,kh,kw,C/g], fc weights permuted to blueprint's
 * NHWC flattening), a softmax_ce layer appended to the graph's output and
 * the default training settings (model.c). Errors are one line:
 * BP_ERR_IO (unreadable), BP_ERR_PARSE (not an ONNX protobuf),
 * BP_ERR_UNSUPPORTED ("file: node 'NAME' (OP): what is missing", an op or
 * attribute blueprint cannot run), BP_ERR_INVALID (a graph that does not
 * fit together). *model_out is written only on success. */
bp_status bp_onnx_load(const char *path, bp_model **model_out);
bp_status bp_onnx_parse(const void *data, size_t size, const char *display_name,
                        bp_model **model_out);

/* A YAML or an ONNX model file, by the file's extension
 * (bp_model_load_with_registry for YAML; `registry` may be NULL). */
bp_status bp_model_load_file(const char *path, const struct bp_registry *registry,
                             bp_model **model_out);

/* Reads tensor `name` ("conv1.w") of the trained model into dst, `count`
 * compact NHWC FP32 values (bp_trainer_read_tensor fits). */
typedef bp_status (*bp_onnx_tensor_reader)(void *user, const char *name, float *dst,
                                           uint64_t count);

#define BP_ONNX_MAX_CHANNELS 4

typedef struct bp_onnx_export_options {
  int channels;                     /* of the input normalization below */
  float mean[BP_ONNX_MAX_CHANNELS]; /* the network reads (pixel / 255 - mean[c]) / std[c] */
  float std[BP_ONNX_MAX_CHANNELS];
  const char *source;    /* (optional) where the weights came from: stored as metadata */
  const char *weights;   /* (optional) "master" or "ema": stored as metadata */
} bp_onnx_export_options;

/* Writes `model` as an ONNX inference graph (opset 17, FP32, NCHW input
 * "input" [N, C, H, W], output "logits" [N, classes]; BatchNormalization in
 * its inference form with the running statistics), every parameter read
 * through `read`, the input's normalization in metadata_props; atomically
 * (a temporary beside `path`, then renamed). BP_ERR_UNSUPPORTED names a
 * layer ONNX export lacks (a module type); BP_ERR_IO a write that failed. */
bp_status bp_onnx_save(const bp_model *model, bp_onnx_tensor_reader read, void *user,
                       const bp_onnx_export_options *options, const char *path);

#ifdef __cplusplus
}
#endif
#endif
