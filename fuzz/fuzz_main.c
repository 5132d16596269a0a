/* One libFuzzer target: BP_FUZZ_ENTRY names its entry function
 * (entries.h). Built only with BP_FUZZ (clang, -fsanitize=fuzzer). */
#include <stddef.h>
#include <stdint.h>

#include "entries.h"

/* The CLI parser reports refusals on stderr, thousands of lines a second:
 * ci/fuzz.sh passes -close_fd_mask=3 (libFuzzer's own reports still show). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return BP_FUZZ_ENTRY(data, size); }
