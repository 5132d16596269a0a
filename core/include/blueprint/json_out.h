/* Writing JSON text: the one string escaper every JSON writer of the
 * library and the CLI uses (metrics, profile, plan, plugins, validate). */
#ifndef BLUEPRINT_JSON_OUT_H
#define BLUEPRINT_JSON_OUT_H

#include <stddef.h>
#include <stdio.h>

/* The length (1-4) of the valid UTF-8 sequence at s (n bytes readable),
 * or 0 when it is not one: overlongs, surrogates and code points above
 * U+10FFFF are invalid. */
int bp_utf8_len(const unsigned char *s, size_t n);

/* Writes s (NULL: "") as a JSON string literal: quotes and backslashes
 * escaped, control bytes as \n, \t, ... or \u00XX, DEL as \u007f, and
 * bytes that are not UTF-8 as U+FFFD, so the document is always valid. */
void bp_json_string(FILE *out, const char *s);

#endif
