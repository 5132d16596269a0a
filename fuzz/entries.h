/* The entry functions the fuzz targets (fuzz_main.c, built with BP_FUZZ)
 * and the corpus replay test (tests/test_fuzz_corpus.c, the normal build)
 * share: each takes one input as bytes and must return, whatever the bytes,
 * without a crash, a hang, a leak or undefined behaviour. */
#ifndef BP_FUZZ_ENTRIES_H
#define BP_FUZZ_ENTRIES_H

#include <stddef.h>
#include <stdint.h>

/* A model file: parse, and compile when it parses. */
int bp_fuzz_model(const uint8_t *data, size_t size);
/* An IDX pair: the first 2 bytes (little-endian) split the rest into the
 * image file and the label file; each is plain or gzip by its bytes. */
int bp_fuzz_idx(const uint8_t *data, size_t size);
/* A module file for the pre-check before dlopen (never dlopen'ed). */
int bp_fuzz_elf(const uint8_t *data, size_t size);
/* A command line of `blueprint train` (first byte even) or `eval` (odd):
 * the rest split at NUL bytes into arguments. */
int bp_fuzz_cli(const uint8_t *data, size_t size);
/* A checkpoint file for bp_checkpoint_read_info (header and body checks). */
int bp_fuzz_checkpoint(const uint8_t *data, size_t size);
/* An ONNX file: parse (the ONNX front end), and compile when it parses. */
int bp_fuzz_onnx(const uint8_t *data, size_t size);

typedef struct bp_fuzz_target {
  const char *name; /* the corpus directory fuzz/corpus/<name> */
  int (*run)(const uint8_t *data, size_t size);
} bp_fuzz_target;

/* Every target, ending with {NULL, NULL}. */
extern const bp_fuzz_target bp_fuzz_targets[];

#endif
