/* A module file's pre-check (elf_check.c): dlopen maps a file on the
 * word of its headers, so a truncated or corrupted module can kill the
 * process inside ld.so (SIGBUS when a segment lies past the end of the file,
 * SIGSEGV on a relocation outside the image). The loader runs this check
 * first and refuses what it does not pass. Not installed. */
#ifndef BLUEPRINT_ELF_CHECK_IMPL_H
#define BLUEPRINT_ELF_CHECK_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* Checks an ELF image held in memory (`size` bytes, the whole file): a
 * shared object for this machine (class, byte order, machine, ET_DYN),
 * program headers inside the file, every PT_LOAD segment inside the file
 * with sane sizes and alignment, the dynamic section and the tables it
 * names (strings, symbols, relocations, init/fini arrays) inside loaded
 * memory, and every relocation's target inside a loaded segment.
 * Returns 0 when it passes, else -1 with the reason in `why`. */
int bp_elf_check_mem(const void *data, size_t size, char *why, size_t why_size);

/* The same for an open file descriptor of a regular file of `size` bytes
 * (read with pread; the file offset is not moved). Returns 0 or -1. */
int bp_elf_check_fd(int fd, uint64_t size, char *why, size_t why_size);

#endif
