/* bp_plan_hash: a 64-bit FNV-1a hash over a canonical serialization of what
 * a checkpoint stores and what its bytes depend on: the options, the batch
 * its step counters count in, and the layout of the state spans
 * (checkpoint-impl.h). No pointer, no padding byte and no host byte order
 * reaches the hash, so equal plans hash equally on every run and machine.
 *
 * The serialization (every integer little-endian, every string as a u32
 * length then its bytes, no NUL):
 *   string  "bp-plan-hash-v2"          (bumped if this list ever changes)
 *   u32     amp (0 or 1), u32 ema (0 or 1)
 *   string  optimizer name ("sgd", "adamw", "lars")
 *   i64     batch of variant 0 (the training batch of one rank)
 *   u64     bytes of each state span, in file order
 *   u32     count of the tensors that lie in a state span
 *   then for each of them, in id order:
 *     string name, string region name ("W_FC_WEIGHT"), string dtype name
 *     ("fp32"), i64 n, h, w, c, i64 padded_c, u64 offset from the start of
 *     its span, u64 slot_bytes
 * Feature, gradient, input, scalar and temporary slots are left out, and so
 * are the arena offsets of the spans: the saved bytes do not depend on them,
 * so plans that pack features differently (fusion, liveness reuse or not)
 * read each other's checkpoints. Names rather than enum values keep the hash
 * independent of how the enums are numbered. Init rules and the other
 * variants are left out: the saved bytes do not depend on them. */
#include <string.h>

#include "blueprint/checkpoint.h"
#include "checkpoint-impl.h"

#define FNV64_OFFSET 0xcbf29ce484222325ull
#define FNV64_PRIME 0x100000001b3ull

static uint64_t fnv_bytes(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= FNV64_PRIME;
  }
  return h;
}

static uint64_t fnv_u64(uint64_t h, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
  return fnv_bytes(h, b, sizeof b);
}

static uint64_t fnv_u32(uint64_t h, uint32_t v) {
  unsigned char b[4];
  for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
  return fnv_bytes(h, b, sizeof b);
}

static uint64_t fnv_str(uint64_t h, const char *s) {
  size_t len = strlen(s);
  h = fnv_u32(h, (uint32_t)len);
  return fnv_bytes(h, s, len);
}

/* The state span that holds `region`, or -1. */
static int section_of(bp_region region) {
  for (int s = 0; s < BP_CHECKPOINT_SECTIONS; s++)
    if (region >= bp_checkpoint_sections[s][0] && region <= bp_checkpoint_sections[s][1]) return s;
  return -1;
}

uint64_t bp_plan_hash(const bp_plan *plan) {
  if (!plan) return 0;
  const bp_plan_options *o = bp_plan_get_options(plan);
  uint64_t h = FNV64_OFFSET;
  h = fnv_str(h, "bp-plan-hash-v2");
  h = fnv_u32(h, o->amp != 0);
  h = fnv_u32(h, o->ema != 0);
  h = fnv_str(h, bp_optimizer_name(o->optimizer));
  const bp_variant_info *v0 = bp_plan_variant_count(plan) > 0 ? bp_plan_variant(plan, 0) : NULL;
  h = fnv_u64(h, v0 ? (uint64_t)v0->batch : 0);
  bp_span span[BP_CHECKPOINT_SECTIONS];
  for (int s = 0; s < BP_CHECKPOINT_SECTIONS; s++) {
    if (bp_plan_resolve(plan, bp_checkpoint_sections[s][0], bp_checkpoint_sections[s][1],
                        &span[s]) != BP_OK)
      span[s] = (bp_span){0, 0};
    h = fnv_u64(h, span[s].bytes);
  }
  const int32_t all = v0 ? bp_plan_tensor_count(plan) : 0;
  uint32_t count = 0;
  for (int32_t id = 0; id < all; id++)
    count += section_of(bp_plan_tensor(plan, 0, id)->region) >= 0;
  h = fnv_u32(h, count);
  for (int32_t id = 0; id < all; id++) {
    const bp_dtensor *t = bp_plan_tensor(plan, 0, id);
    const int s = section_of(t->region);
    if (s < 0) continue;
    const bp_region_info *ri = bp_region_get(t->region);
    h = fnv_str(h, t->name);
    h = fnv_str(h, ri ? ri->name : "?");
    h = fnv_str(h, bp_dtype_name(t->dtype));
    h = fnv_u64(h, (uint64_t)t->shape.n);
    h = fnv_u64(h, (uint64_t)t->shape.h);
    h = fnv_u64(h, (uint64_t)t->shape.w);
    h = fnv_u64(h, (uint64_t)t->shape.c);
    h = fnv_u64(h, (uint64_t)t->padded_c);
    h = fnv_u64(h, t->offset - span[s].offset);
    h = fnv_u64(h, t->slot_bytes);
  }
  return h;
}
