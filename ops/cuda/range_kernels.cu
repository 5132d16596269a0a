/* ops/cuda: the range family's kernels and launchers. */
#include "cuda-impl.h"
