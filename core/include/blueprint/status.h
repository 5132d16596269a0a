/* Status codes and the per-thread error message every fallible call leaves. */
#ifndef BLUEPRINT_STATUS_H
#define BLUEPRINT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Values are only ever appended. */
typedef enum bp_status {
  BP_OK = 0,
  BP_ERR_INVALID = 1,     /* a caller's argument or a model field is wrong */
  BP_ERR_PARSE = 2,       /* a file could not be parsed (syntax) */
  BP_ERR_SHAPE = 3,       /* shapes or channels do not fit together */
  BP_ERR_OVERFLOW = 4,    /* a size does not fit in 64 bits / the address space */
  BP_ERR_NOMEM = 5,       /* an allocation failed */
  BP_ERR_IO = 6,          /* a file could not be opened, read or written */
  BP_ERR_UNSUPPORTED = 7, /* valid, but not implemented (e.g. a reserved dtype) */
  BP_ERR_STATE = 8,       /* a call made in the wrong life-cycle state */
  BP_ERR_DEVICE = 9,      /* a device or its runtime failed (a kernel's BP_ABI_ERR_DEVICE) */
  BP_ERR_DIVERGED = 10,   /* training produced a NaN or an infinity (train.h) */
} bp_status;

/* Short constant name of a status ("invalid argument", ...). */
const char *bp_status_str(bp_status status);

/* The message of the last failure on this thread ("" if none). Borrowed:
 * valid until the next failing call on the same thread. */
const char *bp_last_error(void);

/* Records a message for the calling thread and returns `status`, so a
 * failing path reads `return bp_fail(BP_ERR_INVALID, "...", ...);`. */
bp_status bp_fail(bp_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clears the calling thread's message. */
void bp_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
