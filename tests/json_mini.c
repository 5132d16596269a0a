/* Strict minimal JSON reader for tests; see json_mini.h. Recursive descent
 * over RFC 8259's grammar, with a depth limit. */
#include "json_mini.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct reader {
  const unsigned char *s;
  size_t n, i;
  char *err;
  size_t err_size;
  int failed;
} reader;

static void fail(reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(reader *r, const char *fmt, ...) {
  if (r->failed) return;
  r->failed = 1;
  char what[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (r->err_size) snprintf(r->err, r->err_size, "byte %zu: %s", r->i, what);
}

static void skip_ws(reader *r) {
  while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' ||
                         r->s[r->i] == '\r'))
    r->i++;
}

static int literal(reader *r, const char *word) {
  size_t len = strlen(word);
  if (r->n - r->i < len || memcmp(r->s + r->i, word, len) != 0) return 0;
  r->i += len;
  return 1;
}

/* A growing byte buffer for decoded strings. */
typedef struct bytes {
  char *p;
  size_t len, cap;
} bytes;

static int put(bytes *b, const void *src, size_t len) {
  if (b->len + len + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 32;
    while (cap < b->len + len + 1) cap *= 2;
    char *grown = realloc(b->p, cap);
    if (!grown) return -1;
    b->p = grown;
    b->cap = cap;
  }
  memcpy(b->p + b->len, src, len);
  b->len += len;
  b->p[b->len] = '\0';
  return 0;
}

static int put_utf8(bytes *b, unsigned long cp) {
  unsigned char u[4];
  size_t len;
  if (cp < 0x80) u[0] = (unsigned char)cp, len = 1;
  else if (cp < 0x800) u[0] = (unsigned char)(0xC0 | (cp >> 6)), u[1] = (unsigned char)(0x80 | (cp & 0x3F)), len = 2;
  else if (cp < 0x10000)
    u[0] = (unsigned char)(0xE0 | (cp >> 12)), u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)),
    u[2] = (unsigned char)(0x80 | (cp & 0x3F)), len = 3;
  else
    u[0] = (unsigned char)(0xF0 | (cp >> 18)), u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F)),
    u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (unsigned char)(0x80 | (cp & 0x3F)),
    len = 4;
  return put(b, u, len);
}

static long hex4(reader *r) {
  if (r->n - r->i < 4) return -1;
  long v = 0;
  for (int k = 0; k < 4; k++) {
    unsigned char c = r->s[r->i + (size_t)k];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  r->i += 4;
  return v;
}

/* Length of a valid UTF-8 sequence at s[i], 0 if invalid. */
static size_t utf8_at(const reader *r) {
  const unsigned char *s = r->s + r->i;
  size_t left = r->n - r->i;
  unsigned char c = s[0], lo = 0x80, hi = 0xBF;
  size_t len;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
  else if (c == 0xED) len = 3, hi = 0x9F;
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) len = 4, hi = 0x8F;
  else return 0;
  if (len > left || s[1] < lo || s[1] > hi) return 0;
  for (size_t k = 2; k < len; k++)
    if (s[k] < 0x80 || s[k] > 0xBF) return 0;
  return len;
}

static char *parse_string(reader *r) {
  bytes b = {0};
  if (put(&b, "", 0)) return NULL;
  r->i++; /* the opening quote */
  for (;;) {
    if (r->i >= r->n) {
      fail(r, "unterminated string");
      break;
    }
    unsigned char c = r->s[r->i];
    if (c == '"') {
      r->i++;
      return b.p;
    }
    if (c < 0x20) {
      fail(r, "control character 0x%02x in a string", c);
      break;
    }
    if (c == '\\') {
      r->i++;
      if (r->i >= r->n) {
        fail(r, "unterminated escape");
        break;
      }
      char e = (char)r->s[r->i++], out = 0;
      switch (e) {
      case '"': out = '"'; break;
      case '\\': out = '\\'; break;
      case '/': out = '/'; break;
      case 'b': out = '\b'; break;
      case 'f': out = '\f'; break;
      case 'n': out = '\n'; break;
      case 'r': out = '\r'; break;
      case 't': out = '\t'; break;
      case 'u': {
        long cp = hex4(r);
        if (cp < 0) {
          fail(r, "bad \\u escape");
          break;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
          long lo = literal(r, "\\u") ? hex4(r) : -1;
          if (lo < 0xDC00 || lo > 0xDFFF) {
            fail(r, "unpaired surrogate");
            break;
          }
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          fail(r, "unpaired surrogate");
          break;
        }
        if (put_utf8(&b, (unsigned long)cp)) {
          fail(r, "out of memory");
          break;
        }
        continue;
      }
      default: fail(r, "bad escape '\\%c'", e);
      }
      if (r->failed) break;
      if (put(&b, &out, 1)) {
        fail(r, "out of memory");
        break;
      }
      continue;
    }
    size_t len = utf8_at(r);
    if (len == 0) {
      fail(r, "invalid UTF-8");
      break;
    }
    if (put(&b, r->s + r->i, len)) {
      fail(r, "out of memory");
      break;
    }
    r->i += len;
  }
  free(b.p);
  return NULL;
}

static int is_digit(reader *r) { return r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9'; }

static char *parse_number(reader *r) {
  size_t start = r->i;
  if (r->s[r->i] == '-') r->i++;
  if (!is_digit(r)) {
    fail(r, "bad number");
    return NULL;
  }
  if (r->s[r->i] == '0') r->i++;
  else
    while (is_digit(r)) r->i++;
  if (r->i < r->n && r->s[r->i] == '.') {
    r->i++;
    if (!is_digit(r)) {
      fail(r, "bad fraction");
      return NULL;
    }
    while (is_digit(r)) r->i++;
  }
  if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
    r->i++;
    if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
    if (!is_digit(r)) {
      fail(r, "bad exponent");
      return NULL;
    }
    while (is_digit(r)) r->i++;
  }
  char *text = strndup((const char *)r->s + start, r->i - start);
  if (!text) fail(r, "out of memory");
  return text;
}

static void free_members(jm_value *v) {
  for (size_t k = 0; k < v->count; k++) {
    free_members(&v->items[k]);
    if (v->keys) free(v->keys[k]);
  }
  free(v->items);
  free(v->keys);
  free(v->text);
}

static int parse_value(reader *r, jm_value *v, int depth);

/* Arrays and objects: members separated by commas, no trailing comma. */
static int parse_container(reader *r, jm_value *v, int depth) {
  int object = r->s[r->i] == '{';
  char close = object ? '}' : ']';
  v->kind = object ? JM_OBJECT : JM_ARRAY;
  r->i++;
  skip_ws(r);
  if (r->i < r->n && r->s[r->i] == close) {
    r->i++;
    return 0;
  }
  for (;;) {
    jm_value *items = realloc(v->items, (v->count + 1) * sizeof *items);
    if (!items) return fail(r, "out of memory"), -1;
    v->items = items;
    memset(&v->items[v->count], 0, sizeof *items);
    if (object) {
      char **keys = realloc(v->keys, (v->count + 1) * sizeof *keys);
      if (!keys) return fail(r, "out of memory"), -1;
      v->keys = keys;
      v->keys[v->count] = NULL;
      skip_ws(r);
      if (r->i >= r->n || r->s[r->i] != '"') return fail(r, "expected a key"), -1;
      v->keys[v->count] = parse_string(r);
      if (!v->keys[v->count]) {
        v->count++; /* so the member's slots are freed */
        return -1;
      }
      skip_ws(r);
      if (r->i >= r->n || r->s[r->i] != ':') {
        v->count++;
        return fail(r, "expected ':'"), -1;
      }
      r->i++;
    }
    int rc = parse_value(r, &v->items[v->count], depth + 1);
    v->count++;
    if (rc) return -1;
    skip_ws(r);
    if (r->i < r->n && r->s[r->i] == ',') {
      r->i++;
      continue;
    }
    if (r->i < r->n && r->s[r->i] == close) {
      r->i++;
      return 0;
    }
    return fail(r, "expected ',' or '%c'", close), -1;
  }
}

static int parse_value(reader *r, jm_value *v, int depth) {
  if (depth > MAX_DEPTH) return fail(r, "nested too deeply"), -1;
  skip_ws(r);
  if (r->i >= r->n) return fail(r, "unexpected end"), -1;
  unsigned char c = r->s[r->i];
  if (c == '{' || c == '[') return parse_container(r, v, depth);
  if (c == '"') {
    v->kind = JM_STRING;
    v->text = parse_string(r);
    return v->text ? 0 : -1;
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    v->kind = JM_NUMBER;
    v->text = parse_number(r);
    return v->text ? 0 : -1;
  }
  if (literal(r, "true")) return v->kind = JM_BOOL, v->boolean = 1, 0;
  if (literal(r, "false")) return v->kind = JM_BOOL, v->boolean = 0, 0;
  if (literal(r, "null")) return v->kind = JM_NULL, 0;
  return fail(r, "unexpected character '%c'", c), -1;
}

jm_value *jm_parse(const char *text, size_t length, char *err, size_t err_size) {
  reader r = {(const unsigned char *)text, length, 0, err, err_size, 0};
  if (err_size) err[0] = '\0';
  jm_value *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  if (parse_value(&r, v, 0) == 0) {
    skip_ws(&r);
    if (r.i == r.n) return v;
    fail(&r, "trailing characters");
  }
  jm_free(v);
  return NULL;
}

void jm_free(jm_value *v) {
  if (!v) return;
  free_members(v);
  free(v);
}

const jm_value *jm_get(const jm_value *o, const char *key) {
  if (!o || o->kind != JM_OBJECT) return NULL;
  for (size_t k = 0; k < o->count; k++)
    if (strcmp(o->keys[k], key) == 0) return &o->items[k];
  return NULL;
}

const jm_value *jm_at(const jm_value *a, size_t i) {
  return a && a->kind == JM_ARRAY && i < a->count ? &a->items[i] : NULL;
}

int jm_u64(const jm_value *v, uint64_t *out) {
  if (!v || v->kind != JM_NUMBER || v->text[0] < '0' || v->text[0] > '9') return -1;
  errno = 0;
  char *end;
  unsigned long long x = strtoull(v->text, &end, 10);
  if (*end || errno) return -1;
  *out = (uint64_t)x;
  return 0;
}
