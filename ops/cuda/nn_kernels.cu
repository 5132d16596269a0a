/* ops/cuda: the nn family's kernels and launchers. */
#include "cuda-impl.h"
