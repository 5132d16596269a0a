/* Small string and list helpers the registry, the loader, discovery,
 * selection and autotuning share (strutil.c). They depend on nothing else
 * in blueprint, so including this header pulls in no other part of the
 * registry. Not installed. */
#ifndef BLUEPRINT_STRUTIL_IMPL_H
#define BLUEPRINT_STRUTIL_IMPL_H

#include <stddef.h>

/* A growable array of pointers; the owner frees the items. {0} is empty. */
typedef struct bp_ptr_list {
  void **items;
  int count, cap;
} bp_ptr_list;
/* Makes room for `extra` more items; 0 on success, -1 out of memory. */
int bp_ptr_list_reserve(bp_ptr_list *list, int extra);
/* Appends; 0 on success, -1 out of memory (list unchanged). */
int bp_ptr_list_push(bp_ptr_list *list, void *item);

/* strdup that returns NULL for NULL. */
char *bp_strdup(const char *s);
/* Appends printf text to buf (size) after what it holds; truncates. */
void bp_strcatf(char *buf, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
