/* Formatting shared by the plan printers: sizes, counts, shapes, options and
 * the summary of regions that hold no bytes. */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "plan_print.h"

const char *bp_fmt_bytes(uint64_t bytes, char buf[BP_FMT_MAX]) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(buf, BP_FMT_MAX, "%" PRIu64 " B", bytes);
    return buf;
  }
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    u++;
  }
  /* three significant digits; a value that rounds up to 1024 moves a unit */
  if (v >= 1023.5 && u < 6) {
    v /= 1024.0;
    u++;
  }
  const char *fmt = v < 9.995 ? "%.2f %s" : v < 99.95 ? "%.1f %s" : "%.0f %s";
  snprintf(buf, BP_FMT_MAX, fmt, v, units[u]);
  return buf;
}

const char *bp_fmt_count(uint64_t n, char buf[BP_FMT_MAX]) {
  char digits[24];
  int len = snprintf(digits, sizeof digits, "%" PRIu64, n);
  int o = 0;
  for (int i = 0; i < len; i++) {
    if (i > 0 && (len - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = digits[i];
  }
  buf[o] = '\0';
  return buf;
}

const char *bp_fmt_shape(bp_shape s, char *buf, size_t cap) {
  snprintf(buf, cap, "[%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "]", s.n, s.h, s.w, s.c);
  return buf;
}

const char *bp_fmt_options(const bp_plan *plan, const char *sep, char *buf, size_t cap) {
  const bp_plan_options *o = bp_plan_get_options(plan);
  snprintf(buf, cap, "optimizer %s%samp %s%sema %s", bp_optimizer_name(o->optimizer), sep,
           o->amp ? "on" : "off", sep, o->ema ? "on" : "off");
  return buf;
}

size_t bp_fmt_wrap(const char *s, size_t max_chars) {
  size_t len = strlen(s);
  if (len <= max_chars) return len;
  size_t cut = 0;
  for (size_t i = 1; i <= max_chars; i++)
    if (s[i] == ' ') cut = i;
  if (cut > 0) return cut;
  const char *blank = strchr(s, ' '); /* one long word: the whole word */
  return blank ? (size_t)(blank - s) : len;
}

/* Appends to a bounded, always-terminated buffer; silently truncates. */
typedef struct strbuf {
  char *p;
  size_t cap, len;
} strbuf;

static void sb_add(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(strbuf *b, const char *fmt, ...) {
  if (b->cap == 0 || b->len >= b->cap - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  if (n > 0) b->len += (size_t)n < b->cap - b->len ? (size_t)n : b->cap - 1 - b->len;
}

/* Why a region holds no bytes: the switch that is off, or "empty" when it
 * is enabled but this model puts nothing there. */
static const char *zero_reason(const bp_plan *plan, bp_region r, char *buf, size_t cap) {
  const bp_plan_options *o = bp_plan_get_options(plan);
  if (bp_region_enabled(o, r)) return "empty";
  switch (bp_region_get(r)->enabled_by) {
  case BP_FEATURE_AMP: return "disabled (amp off)";
  case BP_FEATURE_EMA: return "disabled (ema off)";
  default:
    snprintf(buf, cap, "disabled (optimizer %s)", bp_optimizer_name(o->optimizer));
    return buf;
  }
}

/* Length of the family prefix of a region name ("G16" of "G16_BN_BIAS"), 0
 * when the name has no family ("B", "R", "F32"). */
static size_t family_len(const char *name) {
  const char *u = strchr(name, '_');
  return u ? (size_t)(u - name) : 0;
}

static int is_zero(const bp_plan *plan, int r) {
  return bp_plan_region_span(plan, (bp_region)r).bytes == 0;
}

int bp_fmt_zero_regions(const bp_plan *plan, char *buf, size_t cap) {
  strbuf b = {buf, cap, 0};
  if (cap) buf[0] = '\0';
  char reasons[BP_REGION_COUNT][48];
  int count = 0;
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    char tmp[48];
    snprintf(reasons[r], sizeof reasons[r], "%s",
             is_zero(plan, r) ? zero_reason(plan, (bp_region)r, tmp, sizeof tmp) : "");
    count += is_zero(plan, r);
  }
  /* one group per distinct reason, in region order, "empty" last */
  int done[BP_REGION_COUNT] = {0};
  for (int pass = 0; pass < 2; pass++) {
    for (int r = 0; r < BP_REGION_COUNT; r++) {
      if (!is_zero(plan, r) || done[r]) continue;
      int empty = strcmp(reasons[r], "empty") == 0;
      if (empty != (pass == 1)) continue;
      sb_add(&b, "%s%s:", b.len ? "; " : "", reasons[r]);
      for (int q = r; q < BP_REGION_COUNT; q++) {
        if (done[q] || strcmp(reasons[q], reasons[r]) != 0) continue;
        const char *name = bp_region_get((bp_region)q)->name;
        size_t fl = family_len(name);
        /* a whole family with the same reason is written "E_*" */
        int whole = fl > 0;
        for (int k = 0; whole && k < BP_REGION_COUNT; k++) {
          const char *other = bp_region_get((bp_region)k)->name;
          if (family_len(other) == fl && strncmp(other, name, fl) == 0)
            whole = strcmp(reasons[k], reasons[q]) == 0;
        }
        if (whole) {
          sb_add(&b, " %.*s_*", (int)fl, name);
          for (int k = 0; k < BP_REGION_COUNT; k++) {
            const char *other = bp_region_get((bp_region)k)->name;
            if (family_len(other) == fl && strncmp(other, name, fl) == 0) done[k] = 1;
          }
        } else {
          sb_add(&b, " %s", name);
          done[q] = 1;
        }
      }
    }
  }
  return count;
}
