/* bp_plan_hash: a 64-bit FNV-1a hash over a canonical serialization of what
 * a checkpoint depends on. No pointer, no padding byte and no host byte order
 * reaches the hash, so equal plans hash equally on every run and machine.
 *
 * The serialization (every integer little-endian, every string as a u32
 * length then its bytes, no NUL):
 *   string  "bp-plan-hash-v1"          (bumped if this list ever changes)
 *   u32     amp (0 or 1), u32 ema (0 or 1)
 *   string  optimizer name ("sgd", "adamw", "lars")
 *   u64     total bytes of the plan
 *   u32     tensor count
 *   then for every tensor of variant 0, in id order:
 *     string name, string region name ("W_FC_WEIGHT"), string dtype name
 *     ("fp32"), i64 n, h, w, c, i64 padded_c, u64 offset, u64 slot_bytes
 * Names rather than enum values keep the hash independent of how the enums
 * are numbered. Init rules and the other variants' shapes are left out: a
 * checkpoint's data does not depend on them (the slots already hold the max
 * over variants). */
#include <string.h>

#include "blueprint/checkpoint.h"

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

uint64_t bp_plan_hash(const bp_plan *plan) {
  if (!plan) return 0;
  const bp_plan_options *o = bp_plan_get_options(plan);
  uint64_t h = FNV64_OFFSET;
  h = fnv_str(h, "bp-plan-hash-v1");
  h = fnv_u32(h, o->amp != 0);
  h = fnv_u32(h, o->ema != 0);
  h = fnv_str(h, bp_optimizer_name(o->optimizer));
  h = fnv_u64(h, bp_plan_total_bytes(plan));
  int32_t count = bp_plan_variant_count(plan) > 0 ? bp_plan_tensor_count(plan) : 0;
  h = fnv_u32(h, (uint32_t)count);
  for (int32_t id = 0; id < count; id++) {
    const bp_dtensor *t = bp_plan_tensor(plan, 0, id);
    const bp_region_info *ri = bp_region_get(t->region);
    h = fnv_str(h, t->name);
    h = fnv_str(h, ri ? ri->name : "?");
    h = fnv_str(h, bp_dtype_name(t->dtype));
    h = fnv_u64(h, (uint64_t)t->shape.n);
    h = fnv_u64(h, (uint64_t)t->shape.h);
    h = fnv_u64(h, (uint64_t)t->shape.w);
    h = fnv_u64(h, (uint64_t)t->shape.c);
    h = fnv_u64(h, (uint64_t)t->padded_c);
    h = fnv_u64(h, t->offset);
    h = fnv_u64(h, t->slot_bytes);
  }
  return h;
}
