/* Files blueprint reads (model files, data files, checkpoints, the
 * autotune cache): one checked open. docs/reliability.md, "Files read". */
#ifndef BLUEPRINT_INFILE_H
#define BLUEPRINT_INFILE_H

#include <stddef.h>
#include <stdint.h>

#include "blueprint/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens `path` for reading without blocking on a FIFO and without reading
 * anything that is not a regular file (or a symlink to one): returns the
 * descriptor (blocking mode, close on exec) and the file's size in
 * *size_out (optional), or -1 with the reason in `why` (optional):
 * strerror of the open ("No such file or directory": errno is left as
 * open set it, ENOENT for a missing file), "not a regular file (a FIFO)"
 * (a directory, a device, a socket: errno EISDIR for a directory, else
 * EINVAL), or, with max_bytes > 0, "larger than N bytes" (EFBIG) for a
 * file over that bound. Callers put the reason into their own line,
 * which names the file and its kind. Records no error itself. */
int bp_input_open(const char *path, uint64_t max_bytes, uint64_t *size_out, char *why,
                  size_t why_size);

/* bp_input_open, then the whole file into a malloc'ed buffer with a NUL
 * after its bytes (*text_out, caller frees; *size_out its bytes). On
 * failure one line is recorded, "<what> '<path>': <reason>"; a missing
 * file is BP_ERR_IO with errno ENOENT. */
bp_status bp_input_read_all(const char *path, const char *what, uint64_t max_bytes,
                            char **text_out, size_t *size_out);

#ifdef __cplusplus
}
#endif

#endif
