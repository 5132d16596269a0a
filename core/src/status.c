/* Status strings and the thread-local last-error message. */
#include "blueprint/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *bp_status_str(bp_status status) {
  switch (status) {
  case BP_OK: return "ok";
  case BP_ERR_INVALID: return "invalid argument";
  case BP_ERR_PARSE: return "parse error";
  case BP_ERR_SHAPE: return "shape mismatch";
  case BP_ERR_OVERFLOW: return "size overflow";
  case BP_ERR_NOMEM: return "out of memory";
  case BP_ERR_IO: return "i/o error";
  case BP_ERR_UNSUPPORTED: return "unsupported";
  case BP_ERR_STATE: return "wrong state";
  case BP_ERR_DEVICE: return "device error";
  case BP_ERR_DIVERGED: return "diverged";
  }
  return "unknown status";
}

const char *bp_last_error(void) { return last_error; }

void bp_clear_error(void) { last_error[0] = '\0'; }

/* Cuts the middle of the longest word of s (len bytes; a word is what lies
 * between spaces, usually a path) to "...", by `excess` bytes or as far as
 * a word can go (16 bytes of each end are kept). Returns the new length. */
static size_t elide_longest(char *s, size_t len, size_t excess) {
  size_t best = 0, best_len = 0;
  for (size_t i = 0; i < len;) {
    size_t j = i;
    while (j < len && s[j] != ' ') j++;
    if (j - i > best_len) best = i, best_len = j - i;
    i = j + 1;
  }
  if (best_len < 40) return len;
  size_t cut = excess + 3; /* the bytes that go, "..." taking 3 of them back */
  if (cut > best_len - 32) cut = best_len - 32;
  size_t from = best + (best_len - cut) / 2;
  memcpy(s + from, "...", 3);
  memmove(s + from + 3, s + from + cut, len - (from + cut) + 1);
  return len - cut + 3;
}

bp_status bp_fail(bp_status status, const char *fmt, ...) {
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  /* too long (a path of kilobytes): shorten the longest words, keep the reason */
  char *full = n >= (int)sizeof last_error ? malloc((size_t)n + 1) : NULL;
  if (full) {
    vsnprintf(full, (size_t)n + 1, fmt, again);
    size_t len = (size_t)n, prev = 0;
    while (len >= sizeof last_error && len != prev) {
      prev = len;
      len = elide_longest(full, len, len - (sizeof last_error - 1));
    }
    snprintf(last_error, sizeof last_error, "%s", full);
    free(full);
  }
  va_end(again);
  return status;
}
