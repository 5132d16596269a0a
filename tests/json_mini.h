/* A strict, minimal JSON reader for tests (RFC 8259 syntax, UTF-8 input):
 * enough to validate the `--json` outputs and walk them by key, without a
 * dependency. Numbers keep their text so 64-bit integers stay exact. */
#ifndef BP_TESTS_JSON_MINI_H
#define BP_TESTS_JSON_MINI_H

#include <stddef.h>
#include <stdint.h>

typedef enum jm_kind { JM_NULL, JM_BOOL, JM_NUMBER, JM_STRING, JM_ARRAY, JM_OBJECT } jm_kind;

typedef struct jm_value {
  jm_kind kind;
  int boolean;
  char *text;              /* JM_NUMBER: as written; JM_STRING: decoded UTF-8 */
  size_t count;            /* JM_ARRAY / JM_OBJECT: members */
  struct jm_value *items;  /* [count] */
  char **keys;             /* JM_OBJECT: [count], in document order */
} jm_value;

/* Parses all of `text` (`length` bytes). NULL on any error, with a message
 * naming the byte offset in `err`. Free the result with jm_free. */
jm_value *jm_parse(const char *text, size_t length, char *err, size_t err_size);
void jm_free(jm_value *value); /* NULL is a no-op */

/* Member `key` of an object; NULL when absent or not an object. */
const jm_value *jm_get(const jm_value *object, const char *key);
/* Element `i` of an array; NULL when out of range or not an array. */
const jm_value *jm_at(const jm_value *array, size_t i);
/* A non-negative integer number; 0 on success. */
int jm_u64(const jm_value *number, uint64_t *out);

#endif
