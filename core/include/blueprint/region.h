/* The region catalog: semantic partitions of the arena, laid out in this
 * enum's order. The order is load-bearing (range ops treat spans of adjacent
 * regions as one flat array); region.c checks it at compile time. */
#ifndef BLUEPRINT_REGION_H
#define BLUEPRINT_REGION_H

#include "blueprint/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What switches a region on. A disabled region gets zero bytes; its
 * neighbours stay adjacent. */
typedef enum bp_feature {
  BP_FEATURE_ALWAYS = 0,
  BP_FEATURE_AMP,     /* mixed precision: FP16 working copies and gradients */
  BP_FEATURE_EMA,     /* exponential moving average of the weights */
  BP_FEATURE_MOMENT1, /* optimizer first moment (SGD momentum, AdamW, LARS) */
  BP_FEATURE_MOMENT2, /* optimizer second moment (AdamW) */
  BP_FEATURE_LARS,    /* per-layer norms for LARS */
} bp_feature;

/* All-reduce buckets: gradients are reduced as region spans, bucket 1 first
 * (deep conv gradients + results, ready first in backward), then bucket 2
 * (the other gradients); bucket 3 is averaged (BN running statistics). */
enum { BP_BUCKET_NONE = 0, BP_BUCKET_DEEP = 1, BP_BUCKET_REST = 2, BP_BUCKET_BN = 3 };

/* The catalog, one row per region, in layout order:
 *   X(ID, series, role, dtype, enabled_by, bucket)
 * dtype BP_DTYPE_ANY means the region holds several dtypes. The six
 * parameter kinds repeat in the same order in every parameter family
 * (W, E, A, G, G16, M, V): bias-like kinds first (no weight decay), then
 * weights (decay). */
#define BP_REGION_TABLE(X)                                                                   \
  X(B, 'B', "running BN statistics (mean, var)", FP32, ALWAYS, BN)                           \
  X(W_BN_BIAS, 'W', "FP32 master weights: BN bias", FP32, ALWAYS, NONE)                       \
  X(W_BN_WEIGHT, 'W', "FP32 master weights: BN weight", FP32, ALWAYS, NONE)                   \
  X(W_FC_BIAS, 'W', "FP32 master weights: FC bias", FP32, ALWAYS, NONE)                       \
  X(W_FC_WEIGHT, 'W', "FP32 master weights: FC weight", FP32, ALWAYS, NONE)                   \
  X(W_CONV_FIRST, 'W', "FP32 master weights: first conv", FP32, ALWAYS, NONE)                 \
  X(W_CONV_DEEP, 'W', "FP32 master weights: deep conv", FP32, ALWAYS, NONE)                   \
  X(E_BN_BIAS, 'E', "EMA copy: BN bias", FP32, EMA, NONE)                                     \
  X(E_BN_WEIGHT, 'E', "EMA copy: BN weight", FP32, EMA, NONE)                                 \
  X(E_FC_BIAS, 'E', "EMA copy: FC bias", FP32, EMA, NONE)                                     \
  X(E_FC_WEIGHT, 'E', "EMA copy: FC weight", FP32, EMA, NONE)                                 \
  X(E_CONV_FIRST, 'E', "EMA copy: first conv", FP32, EMA, NONE)                               \
  X(E_CONV_DEEP, 'E', "EMA copy: deep conv", FP32, EMA, NONE)                                 \
  X(A_BN_BIAS, 'A', "FP16 working copy: BN bias", FP16, AMP, NONE)                            \
  X(A_BN_WEIGHT, 'A', "FP16 working copy: BN weight", FP16, AMP, NONE)                        \
  X(A_FC_BIAS, 'A', "FP16 working copy: FC bias", FP16, AMP, NONE)                            \
  X(A_FC_WEIGHT, 'A', "FP16 working copy: FC weight", FP16, AMP, NONE)                        \
  X(A_CONV_FIRST, 'A', "FP16 working copy: first conv", FP16, AMP, NONE)                      \
  X(A_CONV_DEEP, 'A', "FP16 working copy: deep conv", FP16, AMP, NONE)                        \
  X(G_BN_BIAS, 'G', "FP32 gradient: BN bias", FP32, ALWAYS, REST)                             \
  X(G_BN_WEIGHT, 'G', "FP32 gradient: BN weight", FP32, ALWAYS, REST)                         \
  X(G_FC_BIAS, 'G', "FP32 gradient: FC bias", FP32, ALWAYS, REST)                             \
  X(G_FC_WEIGHT, 'G', "FP32 gradient: FC weight", FP32, ALWAYS, REST)                         \
  X(G_CONV_FIRST, 'G', "FP32 gradient: first conv", FP32, ALWAYS, REST)                       \
  X(G_CONV_DEEP, 'G', "FP32 gradient: deep conv", FP32, ALWAYS, DEEP)                         \
  X(G16_BN_BIAS, 'G', "FP16 gradient: BN bias", FP16, AMP, REST)                              \
  X(G16_BN_WEIGHT, 'G', "FP16 gradient: BN weight", FP16, AMP, REST)                          \
  X(G16_FC_BIAS, 'G', "FP16 gradient: FC bias", FP16, AMP, REST)                              \
  X(G16_FC_WEIGHT, 'G', "FP16 gradient: FC weight", FP16, AMP, REST)                          \
  X(G16_CONV_FIRST, 'G', "FP16 gradient: first conv", FP16, AMP, REST)                        \
  X(G16_CONV_DEEP, 'G', "FP16 gradient: deep conv", FP16, AMP, DEEP)                          \
  X(R, 'R', "results: loss, correct count", FP32, ALWAYS, DEEP)                               \
  X(M_BN_BIAS, 'M', "first moment: BN bias", FP32, MOMENT1, NONE)                             \
  X(M_BN_WEIGHT, 'M', "first moment: BN weight", FP32, MOMENT1, NONE)                         \
  X(M_FC_BIAS, 'M', "first moment: FC bias", FP32, MOMENT1, NONE)                             \
  X(M_FC_WEIGHT, 'M', "first moment: FC weight", FP32, MOMENT1, NONE)                         \
  X(M_CONV_FIRST, 'M', "first moment: first conv", FP32, MOMENT1, NONE)                       \
  X(M_CONV_DEEP, 'M', "first moment: deep conv", FP32, MOMENT1, NONE)                         \
  X(V_BN_BIAS, 'V', "second moment: BN bias", FP32, MOMENT2, NONE)                            \
  X(V_BN_WEIGHT, 'V', "second moment: BN weight", FP32, MOMENT2, NONE)                        \
  X(V_FC_BIAS, 'V', "second moment: FC bias", FP32, MOMENT2, NONE)                            \
  X(V_FC_WEIGHT, 'V', "second moment: FC weight", FP32, MOMENT2, NONE)                        \
  X(V_CONV_FIRST, 'V', "second moment: first conv", FP32, MOMENT2, NONE)                      \
  X(V_CONV_DEEP, 'V', "second moment: deep conv", FP32, MOMENT2, NONE)                        \
  X(N, 'N', "per-layer norms (LARS)", FP32, LARS, NONE)                                       \
  X(I_A, 'I', "input/label buffer A", ANY, ALWAYS, NONE)                                      \
  X(I_B, 'I', "input/label buffer B", ANY, ALWAYS, NONE)                                      \
  X(F32, 'F', "FP32 features and gradient slots", FP32, ALWAYS, NONE)                         \
  X(F16, 'F', "FP16 features and gradient slots", FP16, AMP, NONE)                            \
  X(S_SCALAR, 'S', "scalars (lr, loss scale, step)", ANY, ALWAYS, NONE)                       \
  X(S_MASK, 'S', "masks (INT8)", INT8, ALWAYS, NONE)                                          \
  X(T, 'T', "temporaries and workspaces", ANY, ALWAYS, NONE)

typedef enum bp_region {
#define BP_REGION_ENUM_(id, series, role, dtype, feature, bucket) BP_REGION_##id,
  BP_REGION_TABLE(BP_REGION_ENUM_)
#undef BP_REGION_ENUM_
  BP_REGION_COUNT /* counted from the table */
} bp_region;

/* The six parameter kinds, in the order their regions take in each family. */
typedef enum bp_param_kind {
  BP_PARAM_BN_BIAS = 0,
  BP_PARAM_BN_WEIGHT,
  BP_PARAM_FC_BIAS,
  BP_PARAM_FC_WEIGHT,
  BP_PARAM_CONV_FIRST,
  BP_PARAM_CONV_DEEP,
  BP_PARAM_KIND_COUNT
} bp_param_kind;

/* The parameter families: each holds one region per parameter kind. */
typedef enum bp_param_family {
  BP_FAMILY_W = 0, /* FP32 master weights */
  BP_FAMILY_E,     /* EMA copies */
  BP_FAMILY_A,     /* FP16 working copies */
  BP_FAMILY_G,     /* FP32 gradients */
  BP_FAMILY_G16,   /* FP16 gradients */
  BP_FAMILY_M,     /* first moments */
  BP_FAMILY_V,     /* second moments */
  BP_FAMILY_COUNT
} bp_param_family;

typedef struct bp_region_info {
  const char *name;      /* "W_FC_WEIGHT" */
  char series;           /* 'W' */
  const char *role;      /* one line for people */
  bp_dtype dtype;        /* BP_DTYPE_ANY when mixed */
  bp_feature enabled_by; /* BP_FEATURE_ALWAYS or the switch */
  int bucket;            /* BP_BUCKET_* */
} bp_region_info;

/* The row of `region`; NULL when out of range. */
const bp_region_info *bp_region_get(bp_region region);

/* Region of parameter `kind` in `family` (e.g. G, CONV_DEEP -> G_CONV_DEEP). */
bp_region bp_region_of_param(bp_param_family family, bp_param_kind kind);

/* Region whose name equals `name` (case-insensitive); BP_REGION_COUNT if none. */
bp_region bp_region_from_name(const char *name);

const char *bp_feature_name(bp_feature feature);
const char *bp_param_kind_name(bp_param_kind kind);

#ifdef __cplusplus
}
#endif
#endif
