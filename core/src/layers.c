/* The table of layer types (layer-impl.h): the descriptors of every
 * built-in type by enum value, the YAML keys they share, and what follows
 * from the table alone (names, defaults). */
#include <stddef.h>
#include <string.h>

#include "layer-impl.h"

static const bp_layer_desc *const table[BP_LAYER_TYPE_COUNT] = {
    [BP_LAYER_CONV] = &bp_layer_conv,
    [BP_LAYER_BATCHNORM] = &bp_layer_batchnorm,
    [BP_LAYER_RELU] = &bp_layer_relu,
    [BP_LAYER_MAXPOOL] = &bp_layer_maxpool,
    [BP_LAYER_AVGPOOL] = &bp_layer_avgpool,
    [BP_LAYER_GLOBAL_AVGPOOL] = &bp_layer_global_avgpool,
    [BP_LAYER_FC] = &bp_layer_fc,
    [BP_LAYER_ADD] = &bp_layer_add,
    [BP_LAYER_SOFTMAX_CE] = &bp_layer_softmax_ce,
    [BP_LAYER_MODULE] = &bp_layer_module,
    [BP_LAYER_GELU] = &bp_layer_gelu,
    [BP_LAYER_ATTENTION] = &bp_layer_attention,
    [BP_LAYER_GELU_TANH] = &bp_layer_gelu_tanh,
    [BP_LAYER_LAYERNORM] = &bp_layer_layernorm,
    [BP_LAYER_POS_EMBED] = &bp_layer_pos_embed,
};

const bp_layer_desc *bp_layer_desc_of(bp_layer_type type) {
  return (int)type >= 0 && type < BP_LAYER_TYPE_COUNT ? table[type] : NULL;
}

const bp_layer_desc *bp_layer_desc_for(const bp_layer *l) { return bp_layer_desc_of(l->type); }

const char *bp_layer_type_name(bp_layer_type type) {
  const bp_layer_desc *d = bp_layer_desc_of(type);
  return d ? d->name : "?";
}

const char *bp_layer_kind(const bp_layer *l) {
  if (l->type == BP_LAYER_MODULE && l->module) return l->module->layer.type;
  return bp_layer_type_name(l->type);
}

/* Only the types a file may name: a module's type is looked up in the
 * registry, never as "module". */
int bp_layer_type_from_name(const char *name, bp_layer_type *out) {
  for (int t = 0; t < BP_LAYER_TYPE_COUNT; t++) {
    if (t != BP_LAYER_MODULE && strcmp(name, table[t]->name) == 0) {
      *out = (bp_layer_type)t;
      return 0;
    }
  }
  return -1;
}

/* ---- keys ------------------------------------------------------------------- */

#define FIELD(member) offsetof(bp_layer, member)

const bp_layer_key bp_key_kernel = {
    .key = "kernel", .field = "kernel", .kind = BP_KEY_KERNEL, .offset = FIELD(kernel_h),
    .lo = 1, .hi = BP_MODEL_DIM_MAX, .default_value = 1, .required = 1};
const bp_layer_key bp_key_stride = {
    .key = "stride", .field = "stride", .kind = BP_KEY_INT, .offset = FIELD(stride),
    .lo = 1, .hi = BP_MODEL_DIM_MAX, .default_value = 1};
const bp_layer_key bp_key_pad = {
    .key = "pad", .field = "pad", .kind = BP_KEY_INT, .offset = FIELD(pad),
    .lo = 0, .hi = BP_MODEL_DIM_MAX, .default_value = 0};
/* on, as in PyTorch; the shipped models say `bias:` explicitly */
const bp_layer_key bp_key_bias = {
    .key = "bias", .field = "bias", .kind = BP_KEY_BOOL, .offset = FIELD(bias),
    .lo = 0, .hi = 1, .default_value = 1};

/* Every key of every built-in type, each once: the parser tells an
 * unknown key from one another type takes, and the defaults come from
 * here. */
int bp_layer_all_keys(const bp_layer_key **out, int cap) {
  int k = 0;
  for (int t = 0; t < BP_LAYER_TYPE_COUNT; t++)
    for (int i = 0; i < table[t]->key_count; i++) {
      int seen = 0;
      for (int j = 0; j < k; j++) seen |= out[j] == table[t]->keys[i];
      if (!seen && k < cap) out[k++] = table[t]->keys[i];
    }
  return k;
}

/* Writes a key's default into its field. */
static void key_default(bp_layer *l, const bp_layer_key *k) {
  char *p = (char *)l + k->offset;
  switch (k->kind) {
  case BP_KEY_KERNEL:
    l->kernel_h = l->kernel_w = (int64_t)k->default_value;
    break;
  case BP_KEY_INT: {
    int64_t v = (int64_t)k->default_value;
    memcpy(p, &v, sizeof v);
    break;
  }
  case BP_KEY_NUMBER: {
    float v = (float)k->default_value;
    memcpy(p, &v, sizeof v);
    break;
  }
  case BP_KEY_BOOL: {
    int v = k->default_value != 0.0;
    memcpy(p, &v, sizeof v);
    break;
  }
  }
}

void bp_layer_set_defaults(bp_layer *l, bp_layer_type type) {
  memset(l, 0, sizeof *l);
  l->type = type;
  l->inputs[0] = l->inputs[1] = BP_MODEL_INPUT;
  const bp_layer_desc *d = bp_layer_desc_of(type);
  l->input_count = d ? d->inputs : 1;
  /* every key's default, whatever the type: a field means the same in
   * every type that has it */
  const bp_layer_key *keys[BP_LAYER_KEYS_MAX];
  const int count = bp_layer_all_keys(keys, BP_LAYER_KEYS_MAX);
  for (int i = 0; i < count; i++) key_default(l, keys[i]);
}
