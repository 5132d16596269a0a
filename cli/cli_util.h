/* Helpers every subcommand of the blueprint executable shares: the one-line
 * error report and strict integer parsing. Private to the CLI. */
#ifndef BLUEPRINT_CLI_UTIL_H
#define BLUEPRINT_CLI_UTIL_H

#include <stdint.h>

/* One line on stderr: "blueprint <command>: <message>", control characters
 * (a value typed on the command line, a name from a file) replaced by '?'
 * so it stays one line. */
void bp_cli_report(const char *command, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A decimal integer >= min that fits in int64: digits only, no sign, no
 * spaces. Returns 0 and writes *out, or -1. */
int bp_cli_parse_int(const char *s, int64_t min, int64_t *out);

#endif
