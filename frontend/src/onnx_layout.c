/* Shapes and layout conversions shared by the ONNX reader and writer
 * (onnx-impl.h). */
#include "onnx-impl.h"

int bp_onnx_model_shapes(const bp_model *m, bp_onnx_shape *shapes, int *bad) {
  for (int i = 0; i < m->layer_count; i++) {
    const bp_layer *l = &m->layers[i];
    const bp_onnx_shape in = l->inputs[0] == BP_MODEL_INPUT
                                 ? (bp_onnx_shape){m->channels, m->height, m->width, 4}
                                 : shapes[l->inputs[0]];
    bp_onnx_shape out = in;
    switch (l->type) {
    case BP_LAYER_CONV:
      out.c = l->units;
      out.h = (in.h + 2 * l->pad - l->dilation * (l->kernel_h - 1) - 1) / l->stride + 1;
      out.w = (in.w + 2 * l->pad - l->dilation * (l->kernel_w - 1) - 1) / l->stride + 1;
      break;
    case BP_LAYER_MAXPOOL:
    case BP_LAYER_AVGPOOL:
      out.h = (in.h + 2 * l->pad - l->kernel_h) / l->stride + 1;
      out.w = (in.w + 2 * l->pad - l->kernel_w) / l->stride + 1;
      break;
    case BP_LAYER_GLOBAL_AVGPOOL: out.h = out.w = 1; break;
    case BP_LAYER_FC: out = (bp_onnx_shape){l->units, 1, 1, 2}; break;
    case BP_LAYER_ATTENTION:
      if (in.c % 3 || l->heads < 1 || (in.c / 3) % l->heads) {
        *bad = i;
        return -1;
      }
      out.c = in.c / 3;
      break;
    case BP_LAYER_BATCHNORM:
    case BP_LAYER_LAYERNORM:
    case BP_LAYER_POS_EMBED:
    case BP_LAYER_GELU_TANH:
    case BP_LAYER_RELU:
    case BP_LAYER_ADD:
    case BP_LAYER_GELU:
    case BP_LAYER_SOFTMAX_CE: break;
    default:
      *bad = i;
      return -1;
    }
    const int spatial = l->type == BP_LAYER_CONV || l->type == BP_LAYER_MAXPOOL ||
                        l->type == BP_LAYER_AVGPOOL || l->type == BP_LAYER_GLOBAL_AVGPOOL ||
                        l->type == BP_LAYER_LAYERNORM || l->type == BP_LAYER_POS_EMBED ||
                        l->type == BP_LAYER_ATTENTION;
    if ((spatial && in.rank != 4) || out.c <= 0 || out.h <= 0 || out.w <= 0) {
      *bad = i;
      return -1;
    }
    shapes[i] = out;
  }
  return 0;
}

void bp_onnx_conv_to_oihw(const float *src, float *dst, int64_t f, int64_t kh, int64_t kw,
                          int64_t cg) {
  for (int64_t o = 0; o < f; o++)
    for (int64_t y = 0; y < kh; y++)
      for (int64_t x = 0; x < kw; x++)
        for (int64_t c = 0; c < cg; c++)
          dst[((o * cg + c) * kh + y) * kw + x] = src[((o * kh + y) * kw + x) * cg + c];
}

void bp_onnx_conv_from_oihw(const float *src, float *dst, int64_t f, int64_t kh, int64_t kw,
                            int64_t cg) {
  for (int64_t o = 0; o < f; o++)
    for (int64_t y = 0; y < kh; y++)
      for (int64_t x = 0; x < kw; x++)
        for (int64_t c = 0; c < cg; c++)
          dst[((o * kh + y) * kw + x) * cg + c] = src[((o * cg + c) * kh + y) * kw + x];
}

void bp_onnx_fc_to_nchw(const float *src, float *dst, int64_t u, int64_t c, int64_t h, int64_t w) {
  const int64_t k = c * h * w;
  for (int64_t o = 0; o < u; o++)
    for (int64_t y = 0; y < h; y++)
      for (int64_t x = 0; x < w; x++)
        for (int64_t ch = 0; ch < c; ch++)
          dst[o * k + (ch * h + y) * w + x] = src[o * k + (y * w + x) * c + ch];
}

void bp_onnx_fc_from_nchw(const float *src, float *dst, int64_t u, int64_t c, int64_t h,
                          int64_t w) {
  const int64_t k = c * h * w;
  for (int64_t o = 0; o < u; o++)
    for (int64_t y = 0; y < h; y++)
      for (int64_t x = 0; x < w; x++)
        for (int64_t ch = 0; ch < c; ch++)
          dst[o * k + (y * w + x) * c + ch] = src[o * k + (ch * h + y) * w + x];
}
