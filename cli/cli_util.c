/* Helpers shared by the subcommands; see cli_util.h. */
#include "cli_util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void bp_cli_report(const char *command, const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  for (char *p = msg; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
  fprintf(stderr, "blueprint %s: %s\n", command, msg);
}

int bp_cli_parse_int(const char *s, int64_t min, int64_t *out) {
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (*end != '\0' || errno == ERANGE || v < min) return -1;
  *out = (int64_t)v;
  return 0;
}
