/* The CNN's 3x3 convolutions (models/cnn.yaml conv1..conv4: stride 1,
 * padding 1, no bias) that the conv benches time. Header only: the benches
 * that include it link blueprint or not. */
#ifndef BP_BENCH_CNN_CONVS_H
#define BP_BENCH_CNN_CONVS_H

#include <stdint.h>

/* input h x w x c, k filters */
typedef struct cnn_conv {
  const char *name;
  int64_t h, w, c, k;
} cnn_conv;

static const cnn_conv cnn_convs[] = {
    {"conv1 28x28x1->32", 28, 28, 1, 32},
    {"conv2 28x28x32->32", 28, 28, 32, 32},
    {"conv3 14x14x32->64", 14, 14, 32, 64},
    {"conv4 14x14x64->64", 14, 14, 64, 64},
};
#define CNN_CONVS (sizeof cnn_convs / sizeof cnn_convs[0])

#endif
