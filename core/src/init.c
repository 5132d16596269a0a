/* Initialization rules: deterministic, counter-based random fills. Element i
 * of a tensor depends only on (run seed, rule seed, i), so a fill is the same
 * whatever the order tensors are filled in or the thread that fills them. */
#include <math.h>

#include "blueprint/dtensor.h"

/* splitmix64 finalizer: a bijective 64-bit mix. */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Uniform in (0, 1): 53 random bits, never 0. */
static double unit_open(uint64_t key, uint64_t counter) {
  uint64_t bits = mix64(key ^ mix64(counter)) >> 11;
  return ((double)bits + 0.5) * 0x1.0p-53;
}

void bp_shape_fans(bp_shape s, double *fan_in, double *fan_out) {
  double receptive = (double)s.h * (double)s.w;
  *fan_in = receptive * (double)s.c;
  *fan_out = receptive * (double)s.n;
}

bp_status bp_dtensor_init_fill(const bp_dtensor *t, uint64_t run_seed, float *dst) {
  uint64_t n = bp_dtensor_host_elems(t);
  const bp_init *r = &t->init;
  double fan_in, fan_out;
  bp_shape_fans(t->shape, &fan_in, &fan_out);
  double lo = 0.0, hi = 0.0, mean = 0.0, std = 0.0;
  int normal = 0;
  switch (r->kind) {
  case BP_INIT_NONE: return BP_OK;
  case BP_INIT_ZEROS: lo = hi = 0.0; break;
  case BP_INIT_ONES: lo = hi = 1.0; break;
  case BP_INIT_CONSTANT: lo = hi = r->a; break;
  case BP_INIT_UNIFORM: lo = r->a; hi = r->b; break;
  case BP_INIT_NORMAL: normal = 1; mean = r->a; std = r->b; break;
  case BP_INIT_KAIMING_NORMAL:
    normal = 1;
    std = (r->a != 0.0f ? r->a : sqrt(2.0)) / sqrt(fan_in);
    break;
  case BP_INIT_KAIMING_UNIFORM:
    hi = (r->a != 0.0f ? r->a : sqrt(2.0)) * sqrt(3.0 / fan_in);
    lo = -hi;
    break;
  case BP_INIT_XAVIER_NORMAL:
    normal = 1;
    std = (r->a != 0.0f ? r->a : 1.0) * sqrt(2.0 / (fan_in + fan_out));
    break;
  case BP_INIT_XAVIER_UNIFORM:
    hi = (r->a != 0.0f ? r->a : 1.0) * sqrt(6.0 / (fan_in + fan_out));
    lo = -hi;
    break;
  default:
    return bp_fail(BP_ERR_INVALID, "tensor '%s': unknown init rule %d", t->name, (int)r->kind);
  }
  if (t->dtype != BP_DTYPE_FP32)
    return bp_fail(BP_ERR_UNSUPPORTED, "tensor '%s': init fill writes fp32, tensor is %s",
                   t->name, bp_dtype_name(t->dtype));
  uint64_t key = mix64(run_seed ^ mix64(r->seed));
  for (uint64_t i = 0; i < n; i++) {
    double v;
    if (normal) { /* Box-Muller from two independent uniforms of element i */
      double u1 = unit_open(key, 2 * i), u2 = unit_open(key, 2 * i + 1);
      v = mean + std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    } else {
      v = lo + (hi - lo) * unit_open(key, i);
    }
    dst[i] = (float)v;
  }
  return BP_OK;
}
