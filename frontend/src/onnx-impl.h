/* What the ONNX reader and writer share: each layer's output shape in
 * ONNX's terms, and the two layout conversions between blueprint's
 * parameters and ONNX's (docs/onnx.md, "Layouts"). */
#ifndef BLUEPRINT_ONNX_IMPL_H
#define BLUEPRINT_ONNX_IMPL_H

#include <stdint.h>

#include "blueprint/model.h"

/* A feature map as ONNX sees it: [N, c, h, w] (rank 4) or [N, c] (rank 2,
 * after a fc layer, a Flatten or a Reshape; then h = w = 1). */
typedef struct bp_onnx_shape {
  int64_t c, h, w;
  int rank;
} bp_onnx_shape;

/* The output shape of every layer of `model` (shapes[layer_count]); 0, or
 * -1 with the layer's index in *bad when a layer cannot be shaped (an op
 * module's type, a shape that does not fit). */
int bp_onnx_model_shapes(const bp_model *model, bp_onnx_shape *shapes, int *bad);

/* The constants of GELU's tanh form, as export writes them and import
 * expects them: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
#define BP_ONNX_GELU_CUBE 0.044715f
#define BP_ONNX_GELU_SQRT_2_PI 0.797884560802865f

/* conv weight [F, kh, kw, cg] (blueprint) <-> [F, cg, kh, kw] (ONNX) */
void bp_onnx_conv_to_oihw(const float *src, float *dst, int64_t f, int64_t kh, int64_t kw,
                          int64_t cg);
void bp_onnx_conv_from_oihw(const float *src, float *dst, int64_t f, int64_t kh, int64_t kw,
                            int64_t cg);
/* fc weight [U, h*w*c] flattened NHWC (blueprint) <-> [U, c*h*w] flattened
 * NCHW (ONNX's Flatten of an NCHW map) */
void bp_onnx_fc_to_nchw(const float *src, float *dst, int64_t u, int64_t c, int64_t h, int64_t w);
void bp_onnx_fc_from_nchw(const float *src, float *dst, int64_t u, int64_t c, int64_t h,
                          int64_t w);

#endif
