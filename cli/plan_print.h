/* Printers of a finalized plan for `blueprint plan`: a table for people
 * (plan_table.c), JSON for programs (plan_json.c, schema in
 * docs/plan-json.md), an SVG picture of the arena (plan_svg.c), and the
 * formatting helpers they share (plan_format.c). Private to the CLI. */
#ifndef BLUEPRINT_CLI_PLAN_PRINT_H
#define BLUEPRINT_CLI_PLAN_PRINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "blueprint/plan.h"

/* What the printers say about the run besides the plan itself. */
typedef struct bp_plan_print_info {
  const char *model_name; /* "cnn"; borrowed; NULL or "" when unknown */
  const char *model_path; /* file the model came from; borrowed; NULL or "" */
} bp_plan_print_info;

/* ---- shared formatting (plan_format.c) ----------------------------------- */

/* Enough for any formatted uint64 (26 with separators) or size ("1023 EiB"). */
#define BP_FMT_MAX 32

/* "512 B", "2.50 KiB", "15.3 MiB", "153 MiB": three significant digits,
 * binary units. Returns `buf`. */
const char *bp_fmt_bytes(uint64_t bytes, char buf[BP_FMT_MAX]);

/* "1,605,888". Returns `buf`. */
const char *bp_fmt_count(uint64_t n, char buf[BP_FMT_MAX]);

/* "[128,28,28,32]" into `buf` of `cap` bytes (truncated, always terminated). */
const char *bp_fmt_shape(bp_shape shape, char *buf, size_t cap);

/* One line naming the regions that hold no bytes, grouped by reason:
 * "disabled (ema off): E_*; disabled (amp off): A_* G16_* F16; empty: T".
 * A whole family ("E_*") is abbreviated. "" when every region holds bytes.
 * Truncated to `cap`, always terminated. Returns the number of such regions. */
int bp_fmt_zero_regions(const bp_plan *plan, char *buf, size_t cap);

/* Length of the first line of `s` when lines hold at most `max_chars`
 * characters: up to the last blank that keeps it within the limit (a word
 * longer than the limit gets a line of its own). strlen(s) when it fits.
 * Leading blanks of the rest are the caller's to skip. */
size_t bp_fmt_wrap(const char *s, size_t max_chars);

/* "optimizer sgd, amp off, ema off" (`sep` between the items). */
const char *bp_fmt_options(const bp_plan *plan, const char *sep, char *buf, size_t cap);

/* ---- printers --------------------------------------------------------------
 * `plan` is finalized and borrowed. Stream write errors are left in the
 * stream's error flag for the caller to check (ferror). */

/* The readable table: variants, regions, tensors (variant 0, plus the
 * shapes that differ in the other variants), and the total per rank. */
void bp_plan_print_table(FILE *out, const bp_plan *plan, const bp_plan_print_info *info);

/* The stable JSON document of docs/plan-json.md. */
void bp_plan_print_json(FILE *out, const bp_plan *plan);

/* The SVG picture of the arena into a stream. */
void bp_plan_print_svg(FILE *out, const bp_plan *plan, const bp_plan_print_info *info);

/* The SVG picture into `path`: written to "<path>.tmp", then renamed over
 * `path`, so a reader never sees half a file. BP_ERR_IO naming the path and
 * the system's reason when it cannot be written; nothing is left behind. */
bp_status bp_plan_write_svg(const char *path, const bp_plan *plan,
                            const bp_plan_print_info *info);

#endif
