/* JSON text output (json_out.h). */
#include "blueprint/json_out.h"

#include <string.h>

/* Decodes only enough to validate: lead byte, then the allowed range of the
 * second byte (which excludes overlongs and surrogates), then continuations. */
int bp_utf8_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  int len;
  unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
  else if (c == 0xED) len = 3, hi = 0x9F; /* no UTF-16 surrogates */
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) len = 4, hi = 0x8F;
  else return 0;
  if ((size_t)len > n || s[1] < lo || s[1] > hi) return 0;
  for (int i = 2; i < len; i++)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return len;
}

void bp_json_string(FILE *out, const char *str) {
  const unsigned char *s = (const unsigned char *)(str ? str : "");
  const size_t n = strlen((const char *)s);
  fputc('"', out);
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c == '"' || c == '\\') {
      fputc('\\', out);
      fputc(c, out);
      i++;
    } else if (c < 0x20 || c == 0x7f) {
      switch (c) {
      case '\n': fputs("\\n", out); break;
      case '\r': fputs("\\r", out); break;
      case '\t': fputs("\\t", out); break;
      case '\b': fputs("\\b", out); break;
      case '\f': fputs("\\f", out); break;
      default: fprintf(out, "\\u%04x", c);
      }
      i++;
    } else {
      const int len = bp_utf8_len(s + i, n - i);
      if (len == 0) {
        fputs("\\ufffd", out);
        i++;
      } else {
        fwrite(s + i, 1, (size_t)len, out);
        i += (size_t)len;
      }
    }
  }
  fputc('"', out);
}
