/* Status strings and the thread-local last-error message. */
#include "blueprint/status.h"

#include <stdarg.h>
#include <stdio.h>

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
  }
  return "unknown status";
}

const char *bp_last_error(void) { return last_error; }

void bp_clear_error(void) { last_error[0] = '\0'; }

bp_status bp_fail(bp_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}
