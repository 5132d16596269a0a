/* Kernel pins (registry.h): where they come from, what they mean, and the
 * checks that keep a pin from being silently ignored. Selection (select.c)
 * asks bp_pins_find which pin applies to one node. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry-impl.h"

/* Most entries one pin list holds. */
#define PINS_MAX 32

typedef struct pin {
  char glob[BP_PIN_MAX];
  char impl[64];
  char text[BP_PIN_MAX]; /* the entry as written, trimmed */
} pin;

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
  return s;
}

/* Parses "glob=impl,..." into out[cap]. Returns the count, or -1 with a
 * message in err when an entry is malformed or there are too many. */
static int parse(const char *pins, pin *out, int cap, char *err, size_t err_size) {
  int n = 0;
  const char *p = pins;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char entry[BP_PIN_MAX];
    if (len >= sizeof entry) {
      snprintf(err, err_size, "pin '%.40s...' is longer than %d bytes", p, BP_PIN_MAX - 1);
      return -1;
    }
    memcpy(entry, p, len);
    entry[len] = '\0';
    p += len + (end ? 1 : 0);
    char *e = trim(entry);
    if (!e[0]) continue; /* "a=b,,c=d" and a trailing comma are fine */
    char shown[BP_PIN_MAX];
    snprintf(shown, sizeof shown, "%s", e);
    char *eq = strchr(e, '=');
    if (!eq) {
      snprintf(err, err_size, "pin '%s' is not OP_GLOB=IMPL", shown);
      return -1;
    }
    *eq = '\0';
    char *glob = trim(e), *name = trim(eq + 1);
    if (!glob[0] || !bp_registry_name_valid(name)) {
      snprintf(err, err_size, "pin '%s' is not OP_GLOB=IMPL (IMPL: 1..63 of [A-Za-z0-9_.+-])",
               shown);
      return -1;
    }
    if (n == cap) {
      snprintf(err, err_size, "more than %d pins", cap);
      return -1;
    }
    snprintf(out[n].glob, sizeof out[n].glob, "%s", glob);
    snprintf(out[n].impl, sizeof out[n].impl, "%s", name);
    snprintf(out[n].text, sizeof out[n].text, "%s", shown);
    n++;
  }
  return n;
}

/* 1 when pin p applies to `op` on `device`: its glob matches the op name,
 * or "op@device" when the glob holds '@'. */
static int applies(const pin *p, const char *op, const char *device) {
  if (!strchr(p->glob, '@')) return fnmatch(p->glob, op, 0) == 0;
  char subject[160];
  snprintf(subject, sizeof subject, "%s@%s", op, device);
  return fnmatch(p->glob, subject, 0) == 0;
}

int bp_pins_find(const char *pins, const char *op, const char *device, char *impl, char *text,
                 char *err, size_t err_size) {
  pin list[PINS_MAX];
  const int n = parse(pins, list, PINS_MAX, err, err_size);
  if (n < 0) return -1;
  for (int i = 0; i < n; i++)
    if (applies(&list[i], op, device)) {
      snprintf(impl, 64, "%s", list[i].impl);
      snprintf(text, BP_PIN_MAX, "%s", list[i].text);
      return 1;
    }
  return 0;
}

/* ---- precedence ------------------------------------------------------------ */

const char *bp_registry_resolve_pins(const bp_registry *r, const char *option,
                                     const char *model, bp_pin_source *source_out) {
  bp_pin_source source = BP_PINS_NONE;
  const char *pins = NULL;
  const char *env = r ? r->pins : NULL; /* the caller's default pins, e.g. BP_KERNELS */
  if (option) {
    pins = option, source = BP_PINS_OPTION;
  } else if (env) {
    pins = env, source = BP_PINS_ENV;
  } else if (model && model[0]) {
    pins = model, source = BP_PINS_MODEL;
  }
  if (source_out) *source_out = source;
  return pins ? pins : "";
}

const char *bp_pins_resolve(const char *option, const char *model, bp_pin_source *source_out) {
  return bp_registry_resolve_pins(NULL, option, model, source_out);
}

const char *bp_pin_source_name(bp_pin_source source) {
  switch (source) {
  case BP_PINS_NONE: return "none";
  case BP_PINS_OPTION: return "option";
  case BP_PINS_ENV: return "BP_KERNELS";
  case BP_PINS_MODEL: return "model file";
  }
  return "?";
}

/* ---- checks ------------------------------------------------------------------ */

/* "a, b, c": the distinct impls of the kernels pin p applies to. */
static void impls_of(const bp_registry *r, const pin *p, char *buf, size_t size) {
  buf[0] = '\0';
  for (int i = 0; i < r->kernels.count; i++) {
    const bp_registered_kernel *k = r->kernels.items[i];
    if (!applies(p, k->kernel.op, k->kernel.device)) continue;
    int seen = 0;
    for (int j = 0; j < i && !seen; j++) {
      const bp_registered_kernel *o = r->kernels.items[j];
      seen = strcmp(o->kernel.impl, k->kernel.impl) == 0 && applies(p, o->kernel.op, o->kernel.device);
    }
    if (!seen) bp_strcatf(buf, size, "%s%s", buf[0] ? ", " : "", k->kernel.impl);
  }
}

bp_status bp_registry_check_pins(const bp_registry *r, const char *pins, const char *source,
                                 char *warnings, size_t warnings_size) {
  if (warnings && warnings_size) warnings[0] = '\0';
  if (!r || !pins) return bp_fail(BP_ERR_INVALID, "bp_registry_check_pins: NULL argument");
  if (!source) source = "pins";
  pin *list = malloc(PINS_MAX * sizeof *list);
  if (!list) return bp_fail(BP_ERR_NOMEM, "out of memory checking pins");
  char err[BP_REASON_MAX];
  const int n = parse(pins, list, PINS_MAX, err, sizeof err);
  bp_status st = BP_OK;
  if (n < 0) st = bp_fail(BP_ERR_INVALID, "%s: %s", source, err);
  for (int i = 0; st == BP_OK && i < n; i++) {
    const pin *p = &list[i];
    int matched = 0, has_impl = 0, shadowed = 1;
    const pin *first_other = NULL; /* an earlier pin with another impl over one of p's kernels */
    for (int j = 0; j < r->kernels.count; j++) {
      const bp_registered_kernel *k = r->kernels.items[j];
      if (!applies(p, k->kernel.op, k->kernel.device)) continue;
      matched = 1;
      has_impl |= strcmp(k->kernel.impl, p->impl) == 0;
      int covered = 0;
      for (int q = 0; q < i && !covered; q++) {
        if (!applies(&list[q], k->kernel.op, k->kernel.device)) continue;
        covered = 1;
        if (!first_other && strcmp(list[q].impl, p->impl) != 0) first_other = &list[q];
      }
      if (!covered) shadowed = 0;
    }
    if (!matched) {
      st = bp_fail(BP_ERR_INVALID,
                   "pin '%s' (%s) matches no op that has a kernel (`blueprint plugins` lists "
                   "them)",
                   p->text, source);
    } else if (!has_impl) {
      char names[512];
      impls_of(r, p, names, sizeof names);
      st = bp_fail(BP_ERR_UNSUPPORTED,
                   "pin '%s' (%s) names no registered kernel '%s' for the ops it matches "
                   "(there are: %s)",
                   p->text, source, p->impl, names);
    } else if (shadowed && first_other && warnings && warnings_size) {
      bp_strcatf(warnings, warnings_size,
                 "pin '%s' (%s) never applies: every op it matches is pinned first by '%s' "
                 "(the first matching pin wins)\n",
                 p->text, source, first_other->text);
    }
  }
  free(list);
  return st;
}
