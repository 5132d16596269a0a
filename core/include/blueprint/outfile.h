/* Files blueprint writes (checkpoints, plan SVGs, metrics, the autotune
 * cache): what may be replaced, and temporary files that outlive a killed
 * writer. docs/reliability.md has the rules. */
#ifndef BLUEPRINT_OUTFILE_H
#define BLUEPRINT_OUTFILE_H

#include "blueprint/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BP_OK when `path` does not exist or is a regular file (or a symlink to
 * one); else BP_ERR_IO with one line naming `what` ("checkpoint"), the path
 * and what the path is (a FIFO, a character device, a directory, ...).
 * Nothing is opened, so a FIFO is never waited on and a device is left as
 * it was. */
bp_status bp_output_check(const char *path, const char *what);

/* Removes "<path>.tmp.<pid>" files (the temporaries of writers that rename
 * over `path`) whose process no longer runs on this machine, so kill -9
 * during a write leaves no pile-up. Only regular files are removed; errors
 * are ignored. Returns how many were removed. */
int bp_output_sweep_temps(const char *path);

/* bp_output_check, then bp_output_sweep_temps: what a writer that renames
 * a temporary over `path` calls first. */
bp_status bp_output_prepare(const char *path, const char *what);

/* Opens `path` for writing (created 0644 when missing; truncated unless
 * `append`) without blocking on a FIFO and without touching anything that
 * is not a regular file: returns the descriptor (blocking mode, close on
 * exec), or -1 with the failure recorded (bp_last_error). */
int bp_output_open(const char *path, const char *what, int append);

/* The directory that holds `path`: "." without a slash, "/" for "/x".
 * malloc'ed; NULL when out of memory. */
char *bp_output_dir(const char *path);

/* The file a write to `path` replaces: when `path` is a symbolic link,
 * the link's final target (followed as open(2) would, a dangling link's
 * target included), so a writer that renames a temporary over it replaces
 * the target and keeps the link; else `path` itself. malloc'ed; NULL when
 * out of memory. A loop of links returns `path` (bp_output_check refuses
 * it). */
char *bp_output_target(const char *path);

#ifdef __cplusplus
}
#endif

#endif
