/* The region catalog and the compile-time checks of the adjacency that range
 * ops rely on. */
#include "blueprint/region.h"

#include <strings.h>

static const bp_region_info region_rows[] = {
#define BP_REGION_ROW_(id, series, role, dtype, feature, bucket)                                   \
  {#id, series, role, BP_DTYPE_##dtype, BP_FEATURE_##feature, BP_BUCKET_##bucket},
    BP_REGION_TABLE(BP_REGION_ROW_)
#undef BP_REGION_ROW_
};

_Static_assert(sizeof region_rows / sizeof region_rows[0] == BP_REGION_COUNT,
               "one catalog row per region");

/* Every family lists the six parameter kinds in bp_param_kind order, so
 * family base + kind is the region and a family is one span. */
#define FAMILY_BASES(X) X(W) X(E) X(A) X(G) X(G16) X(M) X(V)
#define CHECK_FAMILY_(f)                                                                           \
  _Static_assert(BP_REGION_##f##_BN_WEIGHT == BP_REGION_##f##_BN_BIAS + BP_PARAM_BN_WEIGHT &&     \
                     BP_REGION_##f##_FC_BIAS == BP_REGION_##f##_BN_BIAS + BP_PARAM_FC_BIAS &&     \
                     BP_REGION_##f##_FC_WEIGHT == BP_REGION_##f##_BN_BIAS + BP_PARAM_FC_WEIGHT && \
                     BP_REGION_##f##_CONV_FIRST == BP_REGION_##f##_BN_BIAS + BP_PARAM_CONV_FIRST && \
                     BP_REGION_##f##_CONV_DEEP == BP_REGION_##f##_BN_BIAS + BP_PARAM_CONV_DEEP,   \
                 "family " #f " lists the parameter kinds in order");
FAMILY_BASES(CHECK_FAMILY_)
#undef CHECK_FAMILY_

static const bp_region family_base[BP_FAMILY_COUNT] = {
#define FAMILY_BASE_(f) BP_REGION_##f##_BN_BIAS,
    FAMILY_BASES(FAMILY_BASE_)
#undef FAMILY_BASE_
};

/* Weight decay applies to the span FC_WEIGHT..CONV_DEEP and not to
 * BN_BIAS..FC_BIAS: each must be one span. */
_Static_assert(BP_PARAM_FC_WEIGHT == BP_PARAM_FC_BIAS + 1 &&
                   BP_PARAM_CONV_DEEP == BP_PARAM_KIND_COUNT - 1,
               "bias-like kinds first, decayed weights last");
/* Bucket 1 (deep conv gradient + results) is one span: with AMP it is
 * G16_CONV_DEEP..R; without AMP the G16 regions between G_CONV_DEEP and R are
 * empty, so G_CONV_DEEP..R is one span too. */
_Static_assert(BP_REGION_R == BP_REGION_G16_CONV_DEEP + 1, "R follows the FP16 deep-conv grads");
_Static_assert(BP_REGION_G16_BN_BIAS == BP_REGION_G_CONV_DEEP + 1, "FP16 grads follow FP32 grads");
/* The FP32 master weights and their FP16 working copies are each one span,
 * cast by one kernel; the EMA copies follow the weights. */
_Static_assert(BP_REGION_E_BN_BIAS == BP_REGION_W_CONV_DEEP + 1, "E follows W");
_Static_assert(BP_REGION_A_BN_BIAS == BP_REGION_E_CONV_DEEP + 1, "A follows E");
_Static_assert(BP_REGION_I_B == BP_REGION_I_A + 1, "input double buffers are adjacent");
_Static_assert(BP_REGION_F16 == BP_REGION_F32 + 1, "feature regions are adjacent");

const bp_region_info *bp_region_get(bp_region region) {
  return (int)region >= 0 && region < BP_REGION_COUNT ? &region_rows[region] : NULL;
}

bp_region bp_region_of_param(bp_param_family family, bp_param_kind kind) {
  return (bp_region)(family_base[family] + kind);
}

bp_region bp_region_from_name(const char *name) {
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    if (strcasecmp(name, region_rows[r].name) == 0) return (bp_region)r;
  }
  return BP_REGION_COUNT;
}

const char *bp_feature_name(bp_feature feature) {
  switch (feature) {
  case BP_FEATURE_ALWAYS: return "always";
  case BP_FEATURE_AMP: return "amp";
  case BP_FEATURE_EMA: return "ema";
  case BP_FEATURE_MOMENT1: return "moment1";
  case BP_FEATURE_MOMENT2: return "moment2";
  case BP_FEATURE_LARS: return "lars";
  }
  return "?";
}

const char *bp_param_kind_name(bp_param_kind kind) {
  static const char *names[BP_PARAM_KIND_COUNT] = {"bn_bias",   "bn_weight",  "fc_bias",
                                                   "fc_weight", "conv_first", "conv_deep"};
  return (int)kind >= 0 && kind < BP_PARAM_KIND_COUNT ? names[kind] : "?";
}
