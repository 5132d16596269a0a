/* Buffers of validation runs: slots that end at a guard page, poison and
 * padding patterns, logical elements to and from double, and the values a
 * case's fill rules give (validate-impl.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bp_abi_sdk.h"
#include "validate-impl.h"

/* ---- memory of a check: released at once when a guarded check is cut short ---- */

#define LIVE_MAX 512
static struct {
  void *p;
  size_t map_bytes; /* 0: malloc'ed */
} live[LIVE_MAX];

static void live_add(void *p, size_t map_bytes) {
  for (int i = 0; p && i < LIVE_MAX; i++)
    if (!live[i].p) {
      live[i].p = p;
      live[i].map_bytes = map_bytes;
      return;
    }
}

static void live_remove(void *p) {
  for (int i = 0; p && i < LIVE_MAX; i++)
    if (live[i].p == p) {
      live[i].p = NULL;
      return;
    }
}

void *vc_mem_calloc(size_t count, size_t size) {
  void *p = calloc(count ? count : 1, size ? size : 1);
  live_add(p, 0);
  return p;
}

void vc_mem_free(void *p) {
  live_remove(p);
  free(p);
}

void vc_mem_release_all(void) {
  for (int i = 0; i < LIVE_MAX; i++) {
    if (!live[i].p) continue;
    if (live[i].map_bytes) munmap(live[i].p, live[i].map_bytes);
    else free(live[i].p);
    live[i].p = NULL;
  }
}

/* ---- guarded buffers --------------------------------------------------------- */

int vbuf_alloc(vbuf *b, uint64_t bytes, int guard) {
  memset(b, 0, sizeof *b);
  b->bytes = bytes;
  if (bytes > ((uint64_t)1 << 40)) return -1;
  if (!guard) {
    void *p = NULL;
    if (posix_memalign(&p, 256, (size_t)(bytes ? bytes : 256)) != 0) return -1;
    b->map = b->ptr = p;
    live_add(p, 0);
    return 0;
  }
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t data = ((size_t)bytes + 256 + page - 1) / page * page;
  void *m = mmap(NULL, data + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return -1;
  if (mprotect((char *)m + data, page, PROT_NONE) != 0) {
    munmap(m, data + page);
    return -1;
  }
  b->map = m;
  b->map_bytes = data + page;
  live_add(m, b->map_bytes);
  b->guard = (unsigned char *)m + data;
  /* the slot ends at the guard; its start keeps 256-byte alignment */
  b->ptr = (unsigned char *)(((uintptr_t)b->guard - (uintptr_t)bytes) & ~(uintptr_t)255);
  return 0;
}

void vbuf_free(vbuf *b) {
  if (!b->map) return;
  live_remove(b->map);
  if (b->map_bytes) munmap(b->map, b->map_bytes);
  else free(b->map);
  memset(b, 0, sizeof *b);
}

#define GUARD_MAX 32
static struct {
  const unsigned char *guard;
  char what[48];
} guards[GUARD_MAX];
static int guard_count;

void vbuf_guard_register(const vbuf *b, const char *what) {
  if (!b->guard || guard_count == GUARD_MAX) return;
  guards[guard_count].guard = b->guard;
  snprintf(guards[guard_count].what, sizeof guards[guard_count].what, "%s", what);
  guard_count++;
}

void vbuf_guard_clear(void) { guard_count = 0; }

const char *vbuf_guard_owner(const void *addr) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const unsigned char *a = addr;
  for (int i = 0; i < guard_count; i++)
    if (a >= guards[i].guard && a < guards[i].guard + page) return guards[i].what;
  return NULL;
}

/* ---- elements ------------------------------------------------------------------ */

size_t vt_elem_size(int32_t dtype) { return bp_sdk_dtype_size(dtype); }

int64_t vt_count(const bp_abi_tensor *t) {
  return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

uint64_t vt_offset(const bp_abi_tensor *t, int64_t i) {
  const int64_t c = i % t->shape[3], w = i / t->shape[3] % t->shape[2];
  const int64_t h = i / (t->shape[3] * t->shape[2]) % t->shape[1];
  const int64_t n = i / (t->shape[3] * t->shape[2] * t->shape[1]);
  return (uint64_t)(n * t->stride[0] + h * t->stride[1] + w * t->stride[2] + c * t->stride[3]) *
         vt_elem_size(t->dtype);
}

static void put(int32_t dtype, unsigned char *at, double v) {
  switch (dtype) {
    case BP_ABI_DTYPE_FP32: {
      const float f = (float)v;
      memcpy(at, &f, 4);
      break;
    }
    case BP_ABI_DTYPE_FP16: {
      const uint16_t h = bp_sdk_fp32_to_fp16((float)v);
      memcpy(at, &h, 2);
      break;
    }
    case BP_ABI_DTYPE_BF16: {
      const uint16_t h = bp_sdk_fp32_to_bf16((float)v);
      memcpy(at, &h, 2);
      break;
    }
    case BP_ABI_DTYPE_INT8: {
      const int8_t i = (int8_t)lrint(v);
      memcpy(at, &i, 1);
      break;
    }
    case BP_ABI_DTYPE_INT32: {
      const int32_t i = (int32_t)lrint(v);
      memcpy(at, &i, 4);
      break;
    }
    default: break;
  }
}

static double get(int32_t dtype, const unsigned char *at) {
  switch (dtype) {
    case BP_ABI_DTYPE_FP32: {
      float f;
      memcpy(&f, at, 4);
      return f;
    }
    case BP_ABI_DTYPE_FP16: {
      uint16_t h;
      memcpy(&h, at, 2);
      return bp_sdk_fp16_to_fp32(h);
    }
    case BP_ABI_DTYPE_BF16: {
      uint16_t h;
      memcpy(&h, at, 2);
      return bp_sdk_bf16_to_fp32(h);
    }
    case BP_ABI_DTYPE_INT8: {
      int8_t i;
      memcpy(&i, at, 1);
      return i;
    }
    case BP_ABI_DTYPE_INT32: {
      int32_t i;
      memcpy(&i, at, 4);
      return i;
    }
    default: return 0;
  }
}

/* Byte offsets of the logical elements in compact NHWC order, without a
 * division per element (vt_offset's): *off is element i's; step to the
 * next with vt_next. The loops of validate walk millions of elements per
 * run of a model's node. */
typedef struct vt_walk {
  const bp_abi_tensor *t;
  int64_t h, w, c; /* element i's coordinates (n is implied by off) */
  uint64_t off;    /* in elements */
} vt_walk;

static vt_walk vt_start(const bp_abi_tensor *t) { return (vt_walk){t, 0, 0, 0, 0}; }

static void vt_next(vt_walk *k) {
  const bp_abi_tensor *t = k->t;
  k->off += (uint64_t)t->stride[3];
  if (++k->c < t->shape[3]) return;
  k->off += (uint64_t)(t->stride[2] - t->shape[3] * t->stride[3]);
  k->c = 0;
  if (++k->w < t->shape[2]) return;
  k->off += (uint64_t)(t->stride[1] - t->shape[2] * t->stride[2]);
  k->w = 0;
  if (++k->h < t->shape[1]) return;
  k->off += (uint64_t)(t->stride[0] - t->shape[1] * t->stride[1]);
  k->h = 0;
}

void vt_write(const bp_abi_tensor *t, void *p, const double *values) {
  const int64_t n = vt_count(t);
  const size_t es = vt_elem_size(t->dtype);
  vt_walk k = vt_start(t);
  for (int64_t i = 0; i < n; i++, vt_next(&k))
    put(t->dtype, (unsigned char *)p + k.off * es, values[i]);
}

void vt_read(const bp_abi_tensor *t, const void *p, double *values) {
  const int64_t n = vt_count(t);
  const size_t es = vt_elem_size(t->dtype);
  vt_walk k = vt_start(t);
  for (int64_t i = 0; i < n; i++, vt_next(&k))
    values[i] = get(t->dtype, (const unsigned char *)p + k.off * es);
}

void vt_round(int32_t dtype, double *values, int64_t count) {
  unsigned char tmp[8];
  for (int64_t i = 0; i < count; i++) {
    if (isnan(values[i])) continue;
    put(dtype, tmp, values[i]);
    values[i] = get(dtype, tmp);
  }
}

/* Bytes of the padded elements (channels included), capped at the slot. */
static uint64_t padded_bytes(const bp_abi_tensor *t) {
  const uint64_t b = (uint64_t)(t->shape[0] * t->stride[0]) * vt_elem_size(t->dtype);
  return b < t->slot_bytes ? b : t->slot_bytes;
}

/* Poison: a NaN payload no arithmetic produces (a signalling NaN for the
 * float types), 0xa5 bytes for integers. */
static void poison_bytes(int32_t dtype, unsigned char *at) {
  switch (dtype) {
    case BP_ABI_DTYPE_FP32: {
      const uint32_t b = 0x7fa5a5a5u;
      memcpy(at, &b, 4);
      break;
    }
    case BP_ABI_DTYPE_FP16:
    case BP_ABI_DTYPE_BF16: {
      const uint16_t b = dtype == BP_ABI_DTYPE_FP16 ? 0x7da5u : 0x7fa5u;
      memcpy(at, &b, 2);
      break;
    }
    default: memset(at, 0xa5, vt_elem_size(dtype)); break;
  }
}

void vt_fill_input_padding(const bp_abi_tensor *t, void *p) {
  unsigned char *b = p;
  const size_t es = vt_elem_size(t->dtype);
  memset(b, 0xa5, (size_t)t->slot_bytes);
  const uint64_t pb = padded_bytes(t);
  for (uint64_t off = 0; es && off + es <= pb; off += es) {
    switch (t->dtype) {
      case BP_ABI_DTYPE_FP32: {
        const float f = NAN;
        memcpy(b + off, &f, 4);
        break;
      }
      case BP_ABI_DTYPE_FP16: {
        const uint16_t h = 0x7e5a;
        memcpy(b + off, &h, 2);
        break;
      }
      case BP_ABI_DTYPE_BF16: {
        const uint16_t h = 0x7fc0;
        memcpy(b + off, &h, 2);
        break;
      }
      default: memset(b + off, 0x5a, es); break;
    }
  }
}

void vt_fill_output(const bp_abi_tensor *t, void *p, int poison) {
  memset(p, 0xa5, (size_t)t->slot_bytes);
  if (!poison) return;
  const int64_t n = vt_count(t);
  const size_t es = vt_elem_size(t->dtype);
  vt_walk k = vt_start(t);
  for (int64_t i = 0; i < n; i++, vt_next(&k))
    poison_bytes(t->dtype, (unsigned char *)p + k.off * es);
}

int vt_is_poison(const bp_abi_tensor *t, const void *p, int64_t i) {
  unsigned char want[8];
  poison_bytes(t->dtype, want);
  return memcmp((const unsigned char *)p + vt_offset(t, i), want, vt_elem_size(t->dtype)) == 0;
}

int64_t vt_find_poison(const bp_abi_tensor *t, const void *p) {
  unsigned char want[8];
  poison_bytes(t->dtype, want);
  const int64_t n = vt_count(t);
  const size_t es = vt_elem_size(t->dtype);
  vt_walk k = vt_start(t);
  for (int64_t i = 0; i < n; i++, vt_next(&k))
    if (memcmp((const unsigned char *)p + k.off * es, want, es) == 0) return i;
  return -1;
}

unsigned char *vt_logical_mask(const bp_abi_tensor *t) {
  unsigned char *m = vc_mem_calloc(1, (size_t)(t->slot_bytes ? t->slot_bytes : 1));
  if (!m) return NULL;
  const int64_t n = vt_count(t);
  const size_t es = vt_elem_size(t->dtype);
  vt_walk k = vt_start(t);
  for (int64_t i = 0; i < n; i++, vt_next(&k)) {
    const uint64_t off = k.off * es;
    if (off + es <= t->slot_bytes) memset(m + off, 1, es);
  }
  return m;
}

/* ---- random values ------------------------------------------------------------- */

uint64_t vc_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double vc_rand_unit(uint64_t *s) { return (double)(vc_rand(s) >> 11) * 0x1.0p-53; }

/* maxpool.bwd's mask: for each element of dy, a window index ky*kw+kx
 * whose input pixel is inside dx (padding never wins a max). */
static void pool_mask(const vc_case *c, const vc_tensor *t, uint64_t *rng, double *v) {
  bp_pool_attrs a;
  memset(&a, 0, sizeof a);
  memcpy(&a, c->attrs, c->attr_size < sizeof a ? c->attr_size : sizeof a);
  const int64_t H = c->num_outputs ? c->out[0].d.shape[1] : 1;
  const int64_t W = c->num_outputs ? c->out[0].d.shape[2] : 1;
  const int64_t oh = t->d.shape[1], ow = t->d.shape[2], ch = t->d.shape[3];
  int64_t i = 0;
  for (int64_t n = 0; n < t->d.shape[0]; n++)
    for (int64_t y = 0; y < oh; y++)
      for (int64_t x = 0; x < ow; x++)
        for (int64_t k = 0; k < ch; k++, i++) {
          int choices[256], m = 0;
          for (int ky = 0; ky < a.kernel_h && ky < 16; ky++)
            for (int kx = 0; kx < a.kernel_w && kx < 16; kx++) {
              const int64_t ih = y * a.stride_h - a.pad_h + ky, iw = x * a.stride_w - a.pad_w + kx;
              if (ih >= 0 && ih < H && iw >= 0 && iw < W) choices[m++] = ky * a.kernel_w + kx;
            }
          v[i] = m ? choices[vc_rand(rng) % (uint64_t)m] : 0;
        }
}

void vc_fill_values(const vc_case *c, const vc_tensor *t, uint64_t *rng, double *v) {
  const int64_t n = vt_count(&t->d);
  switch (t->fill) {
    case VC_FILL_POOL_MASK: pool_mask(c, t, rng, v); return;
    case VC_FILL_SEGMENTS: {
      /* S+1 offsets over the elements of the span of input 0 */
      const int64_t e = c->num_inputs ? vt_count(&c->in[0].d) : n, s = n - 1;
      for (int64_t k = 0; k < n; k++) v[k] = s > 0 ? (double)(k * e / s) : 0;
      return;
    }
    case VC_FILL_CONST:
      for (int64_t i = 0; i < n; i++) v[i] = t->lo;
      return;
    case VC_FILL_INT:
      for (int64_t i = 0; i < n; i++)
        v[i] = t->lo + (double)(vc_rand(rng) % (uint64_t)(t->hi - t->lo + 1));
      return;
    case VC_FILL_AWAY:
      for (int64_t i = 0; i < n; i++) {
        const double m = t->lo + (t->hi - t->lo) * vc_rand_unit(rng);
        v[i] = (vc_rand(rng) & 1) ? m : -m;
      }
      break;
    default:
      for (int64_t i = 0; i < n; i++) v[i] = t->lo + (t->hi - t->lo) * vc_rand_unit(rng);
      break;
  }
  if (t->fill == VC_FILL_RELU_Y)
    for (int64_t i = 0; i < n; i++) v[i] = v[i] > 0 ? v[i] : 0;
  if (t->fill == VC_FILL_NAN_LAST && n > 0) v[n - 1] = NAN;
  vt_round(t->d.dtype, v, n);
}
