/* Module file pre-check (elf-check-impl.h): everything ld.so takes on trust
 * when it maps and relocates a shared object, checked against the file's
 * real size first. Reads through `src` (memory or pread), never mmap, so a
 * file truncated meanwhile cannot raise SIGBUS here either. */
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "elf-check-impl.h"

#if __SIZEOF_POINTER__ == 8
#define BP_ELF_CLASS ELFCLASS64
#define BP_R_SYM(i) ELF64_R_SYM(i)
#define BP_R_TYPE(i) ELF64_R_TYPE(i)
#else
#define BP_ELF_CLASS ELFCLASS32
#define BP_R_SYM(i) ELF32_R_SYM(i)
#define BP_R_TYPE(i) ELF32_R_TYPE(i)
#endif
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define BP_ELF_DATA ELFDATA2LSB
#else
#define BP_ELF_DATA ELFDATA2MSB
#endif
/* The machine this host runs, and its relative relocation (whose addend is
 * an address in the image); 0 where not known (then not checked). */
#if defined(__x86_64__)
#define BP_ELF_MACHINE EM_X86_64
#define BP_R_RELATIVE R_X86_64_RELATIVE
/* the dynamic relocation types a shared object holds; ld.so asserts on
 * others in places (its "Inconsistency detected" exit) */
#define BP_R_KNOWN(t)                                                                         \
  ((t) == R_X86_64_NONE || (t) == R_X86_64_64 || (t) == R_X86_64_PC32 ||                     \
   (t) == R_X86_64_COPY || (t) == R_X86_64_GLOB_DAT || (t) == R_X86_64_JUMP_SLOT ||           \
   (t) == R_X86_64_RELATIVE || (t) == R_X86_64_DTPMOD64 || (t) == R_X86_64_DTPOFF64 ||       \
   (t) == R_X86_64_TPOFF64 || (t) == R_X86_64_IRELATIVE)
#elif defined(__aarch64__)
#define BP_ELF_MACHINE EM_AARCH64
#define BP_R_RELATIVE R_AARCH64_RELATIVE
#elif defined(__i386__)
#define BP_ELF_MACHINE EM_386
#define BP_R_RELATIVE R_386_RELATIVE
#else
#define BP_ELF_MACHINE 0
#define BP_R_RELATIVE 0
#endif
#ifndef BP_R_KNOWN
#define BP_R_KNOWN(t) ((void)(t), 1)
#endif

/* No segment, table or image may claim more than this (1 TiB). */
#define SANE_BYTES ((uint64_t)1 << 40)
/* At most this many program headers (glibc's own limit is 65535). */
#define MAX_PHDRS 512

typedef struct src {
  const unsigned char *mem; /* the whole file, or NULL: read fd */
  int fd;
  uint64_t size;
  char *why;
  size_t why_size;
  ElfW(Phdr) *ph; /* all program headers */
  int phnum;
} src;

static int fail(src *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(src *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->why, s->why_size, fmt, ap);
  va_end(ap);
  return -1;
}

/* Reads `len` bytes at file offset `off`; 0, or -1 when outside the file. */
static int rd(const src *s, uint64_t off, void *dst, uint64_t len) {
  if (off > s->size || len > s->size - off) return -1;
  if (s->mem) {
    memcpy(dst, s->mem + off, (size_t)len);
    return 0;
  }
  unsigned char *p = dst;
  while (len > 0) {
    ssize_t n = pread(s->fd, p, (size_t)len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    off += (uint64_t)n;
    len -= (uint64_t)n;
  }
  return 0;
}

/* The PT_LOAD holding [vaddr, vaddr + len) in memory (file-backed part
 * only when `file`), or NULL. */
static const ElfW(Phdr) *load_of(const src *s, uint64_t vaddr, uint64_t len, int file) {
  for (int i = 0; i < s->phnum; i++) {
    const ElfW(Phdr) *p = &s->ph[i];
    if (p->p_type != PT_LOAD) continue;
    uint64_t end = file ? p->p_filesz : p->p_memsz;
    if (vaddr >= p->p_vaddr && vaddr - p->p_vaddr <= end && len <= end - (vaddr - p->p_vaddr))
      return p;
  }
  return NULL;
}

/* Copies [vaddr, vaddr + len) of a file-backed loaded range into a fresh
 * buffer; NULL (reason set) when it is not one. */
static unsigned char *table(src *s, const char *what, uint64_t vaddr, uint64_t len) {
  const ElfW(Phdr) *p = load_of(s, vaddr, len, 1);
  if (!p) {
    fail(s, "the %s (address 0x%llx, %llu bytes) is not inside a loaded segment of the file",
         what, (unsigned long long)vaddr, (unsigned long long)len);
    return NULL;
  }
  unsigned char *buf = malloc(len ? (size_t)len : 1);
  if (!buf) {
    fail(s, "out of memory reading the %s", what);
    return NULL;
  }
  if (rd(s, p->p_offset + (vaddr - p->p_vaddr), buf, len) != 0) {
    free(buf);
    fail(s, "cannot read the %s", what);
    return NULL;
  }
  return buf;
}

static int check_header(src *s, ElfW(Ehdr) *eh) {
  unsigned char ident[EI_NIDENT];
  if (rd(s, 0, ident, EI_NIDENT) != 0 || memcmp(ident, ELFMAG, SELFMAG) != 0)
    return fail(s, "not an ELF file (%llu bytes, no ELF magic)", (unsigned long long)s->size);
  if (ident[EI_CLASS] != BP_ELF_CLASS)
    return fail(s, "ELF class %u, this host loads %u-bit objects (class %u)", ident[EI_CLASS],
                __SIZEOF_POINTER__ * 8, BP_ELF_CLASS);
  if (ident[EI_DATA] != BP_ELF_DATA)
    return fail(s, "ELF byte order %u, this host's is %u", ident[EI_DATA], BP_ELF_DATA);
  if (ident[EI_VERSION] != EV_CURRENT)
    return fail(s, "ELF version %u, expected %u", ident[EI_VERSION], EV_CURRENT);
  if (rd(s, 0, eh, sizeof *eh) != 0)
    return fail(s, "truncated ELF header (%llu bytes, the header needs %zu)",
                (unsigned long long)s->size, sizeof *eh);
  if (eh->e_type != ET_DYN)
    return fail(s, "ELF type %u is not a shared object (ET_DYN)", eh->e_type);
  if (BP_ELF_MACHINE && eh->e_machine != BP_ELF_MACHINE)
    return fail(s, "ELF machine %u, this host is machine %u", eh->e_machine, BP_ELF_MACHINE);
  if (eh->e_ehsize != sizeof *eh)
    return fail(s, "ELF header size %u, expected %zu", eh->e_ehsize, sizeof *eh);
  if (eh->e_phentsize != sizeof(ElfW(Phdr)))
    return fail(s, "program header size %u, expected %zu", eh->e_phentsize, sizeof(ElfW(Phdr)));
  if (eh->e_phnum == 0 || eh->e_phnum > MAX_PHDRS)
    return fail(s, "%u program headers (1..%d allowed)", eh->e_phnum, MAX_PHDRS);
  uint64_t bytes = (uint64_t)eh->e_phnum * sizeof(ElfW(Phdr));
  if (eh->e_phoff > s->size || bytes > s->size - eh->e_phoff)
    return fail(s, "program headers (offset %llu, %llu bytes) end past the file's %llu bytes",
                (unsigned long long)eh->e_phoff, (unsigned long long)bytes,
                (unsigned long long)s->size);
  return 0;
}

static int check_segments(src *s) {
  int loads = 0, dynamic = 0;
  uint64_t prev_end = 0;
  for (int i = 0; i < s->phnum; i++) {
    const ElfW(Phdr) *p = &s->ph[i];
    if (p->p_type == PT_NULL || p->p_type == PT_GNU_STACK) continue;
    if (p->p_offset > s->size || p->p_filesz > s->size - p->p_offset)
      return fail(s, "segment %d (type 0x%x) ends at byte %llu, past the file's %llu bytes", i,
                  (unsigned)p->p_type, (unsigned long long)p->p_offset + p->p_filesz,
                  (unsigned long long)s->size);
    if (p->p_type != PT_LOAD) continue;
    if (p->p_filesz > p->p_memsz)
      return fail(s, "segment %d has %llu file bytes but only %llu in memory", i,
                  (unsigned long long)p->p_filesz, (unsigned long long)p->p_memsz);
    if (p->p_memsz > SANE_BYTES || p->p_vaddr > SANE_BYTES)
      return fail(s, "segment %d claims address 0x%llx, %llu bytes (over 1 TiB)", i,
                  (unsigned long long)p->p_vaddr, (unsigned long long)p->p_memsz);
    if (p->p_align > 1 && ((p->p_align & (p->p_align - 1)) != 0 ||
                           p->p_vaddr % p->p_align != p->p_offset % p->p_align))
      return fail(s, "segment %d has alignment %llu that its address and offset do not follow",
                  i, (unsigned long long)p->p_align);
    if (loads && p->p_vaddr < prev_end)
      return fail(s, "segment %d overlaps or precedes the one before it", i);
    prev_end = p->p_vaddr + p->p_memsz;
    loads++;
  }
  if (!loads) return fail(s, "no loadable segment");
  /* ld.so reads these from the mapped image: they must lie inside it */
  for (int i = 0; i < s->phnum; i++) {
    const ElfW(Phdr) *p = &s->ph[i];
    switch (p->p_type) {
    case PT_DYNAMIC: dynamic++; /* fall through */
    case PT_NOTE:
    case PT_TLS:
    case PT_GNU_EH_FRAME:
    case PT_GNU_RELRO:
    case PT_GNU_PROPERTY:
    case PT_PHDR:
    case PT_INTERP:
      if (p->p_memsz > SANE_BYTES || !load_of(s, p->p_vaddr, p->p_memsz, 0))
        return fail(s, "segment %d (type 0x%x) lies outside the loaded segments", i,
                    (unsigned)p->p_type);
      /* read at its address, checked at its offset: both must agree */
      if (p->p_filesz) {
        const ElfW(Phdr) *l = load_of(s, p->p_vaddr, p->p_filesz, 1);
        if (!l || l->p_offset + (p->p_vaddr - l->p_vaddr) != p->p_offset)
          return fail(s, "segment %d (type 0x%x): address 0x%llx and file offset %llu disagree",
                      i, (unsigned)p->p_type, (unsigned long long)p->p_vaddr,
                      (unsigned long long)p->p_offset);
      }
      break;
    default: break;
    }
  }
  if (dynamic != 1) return fail(s, "%d dynamic sections (a shared object has one)", dynamic);
  return 0;
}

/* What the dynamic section says, as far as the checks need it. */
typedef struct dyn {
  uint64_t strtab, strsz, symtab, syment, hash, gnu_hash;
  uint64_t rel[3], relsz[3], relent[3]; /* DT_RELA, DT_REL, DT_JMPREL */
  int rel_is_a[3];
  uint64_t arr[3], arrsz[3]; /* init, fini, preinit arrays */
  uint64_t verneed, verneednum, verdef, verdefnum, versym, relr, relrsz;
  uint64_t relative_count[2]; /* DT_RELACOUNT, DT_RELCOUNT: leading relative relocations */
  unsigned max_version;       /* the largest version index defined or needed */
  int has[8]; /* strtab, symtab, hash, gnu_hash, verneed, verdef, versym, relr */
  uint64_t names[64]; /* DT_NEEDED, DT_SONAME, DT_RUNPATH, DT_RPATH string offsets */
  int name_count;
} dyn;

static int read_dynamic(src *s, dyn *d) {
  const ElfW(Phdr) *p = NULL;
  for (int i = 0; i < s->phnum; i++)
    if (s->ph[i].p_type == PT_DYNAMIC) p = &s->ph[i];
  memset(d, 0, sizeof *d);
  d->syment = sizeof(ElfW(Sym));
  d->relent[0] = d->relent[2] = sizeof(ElfW(Rela));
  d->relent[1] = sizeof(ElfW(Rel));
  d->rel_is_a[0] = 1;
  d->rel_is_a[2] = 1;
  uint64_t n = p->p_filesz / sizeof(ElfW(Dyn));
  int ended = 0;
  for (uint64_t i = 0; i < n && !ended; i++) {
    ElfW(Dyn) e;
    if (rd(s, p->p_offset + i * sizeof e, &e, sizeof e) != 0)
      return fail(s, "cannot read dynamic entry %llu", (unsigned long long)i);
    uint64_t v = (uint64_t)e.d_un.d_val;
    switch (e.d_tag) {
    case DT_NULL: ended = 1; break;
    case DT_STRTAB: d->strtab = v; d->has[0] = 1; break;
    case DT_STRSZ: d->strsz = v; break;
    case DT_SYMTAB: d->symtab = v; d->has[1] = 1; break;
    case DT_SYMENT: d->syment = v; break;
    case DT_HASH: d->hash = v; d->has[2] = 1; break;
    case DT_GNU_HASH: d->gnu_hash = v; d->has[3] = 1; break;
    case DT_RELA: d->rel[0] = v; break;
    case DT_RELASZ: d->relsz[0] = v; break;
    case DT_RELAENT: d->relent[0] = v; break;
    case DT_REL: d->rel[1] = v; break;
    case DT_RELSZ: d->relsz[1] = v; break;
    case DT_RELENT: d->relent[1] = v; break;
    case DT_JMPREL: d->rel[2] = v; break;
    case DT_PLTRELSZ: d->relsz[2] = v; break;
    case DT_PLTREL:
      if (v != DT_RELA && v != DT_REL) return fail(s, "DT_PLTREL is %llu", (unsigned long long)v);
      d->rel_is_a[2] = v == DT_RELA;
      d->relent[2] = v == DT_RELA ? sizeof(ElfW(Rela)) : sizeof(ElfW(Rel));
      break;
    case DT_INIT_ARRAY: d->arr[0] = v; break;
    case DT_INIT_ARRAYSZ: d->arrsz[0] = v; break;
    case DT_FINI_ARRAY: d->arr[1] = v; break;
    case DT_FINI_ARRAYSZ: d->arrsz[1] = v; break;
    case DT_PREINIT_ARRAY: d->arr[2] = v; break;
    case DT_PREINIT_ARRAYSZ: d->arrsz[2] = v; break;
    case DT_VERNEED: d->verneed = v; d->has[4] = 1; break;
    case DT_VERNEEDNUM: d->verneednum = v; break;
    case DT_VERDEF: d->verdef = v; d->has[5] = 1; break;
    case DT_VERDEFNUM: d->verdefnum = v; break;
    case DT_VERSYM: d->versym = v; d->has[6] = 1; break;
    case DT_RELACOUNT: d->relative_count[0] = v; break;
    case DT_RELCOUNT: d->relative_count[1] = v; break;
#ifdef DT_RELR
    case DT_RELR: d->relr = v; d->has[7] = 1; break;
    case DT_RELRSZ: d->relrsz = v; break;
#endif
    case DT_INIT:
    case DT_FINI:
      if (!load_of(s, v, 1, 0))
        return fail(s, "DT_INIT/DT_FINI address 0x%llx is outside the loaded segments",
                    (unsigned long long)v);
      break;
    case DT_NEEDED:
    case DT_SONAME:
    case DT_RUNPATH:
    case DT_RPATH:
      if (d->name_count == (int)(sizeof d->names / sizeof d->names[0]))
        return fail(s, "more than %zu names in the dynamic section",
                    sizeof d->names / sizeof d->names[0]);
      d->names[d->name_count++] = v;
      break;
    default: break;
    }
  }
  if (!ended) return fail(s, "the dynamic section has no terminating DT_NULL entry");
  if (!d->has[0] || !d->has[1]) return fail(s, "the dynamic section lacks DT_STRTAB or DT_SYMTAB");
  if (d->syment != sizeof(ElfW(Sym)))
    return fail(s, "DT_SYMENT is %llu, expected %zu", (unsigned long long)d->syment,
                sizeof(ElfW(Sym)));
  return 0;
}

/* Symbols the image holds at most: up to the end of the symbol table's
 * segment (no section headers are trusted). */
static uint64_t symbol_bound(const src *s, const dyn *d) {
  const ElfW(Phdr) *p = load_of(s, d->symtab, 0, 1);
  if (!p) return 0;
  return (p->p_vaddr + p->p_filesz - d->symtab) / sizeof(ElfW(Sym));
}

static int check_symbols_hash(src *s, const dyn *d, uint64_t nsyms) {
  if (d->has[2]) {
    uint32_t head[2];
    unsigned char *h = table(s, "hash table", d->hash, sizeof head);
    if (!h) return -1;
    memcpy(head, h, sizeof head);
    free(h);
    uint64_t words = 2 + (uint64_t)head[0] + head[1];
    if (head[1] > nsyms) return fail(s, "the hash table counts %u symbols, over %llu", head[1],
                                     (unsigned long long)nsyms);
    uint32_t *w = (uint32_t *)table(s, "hash table", d->hash, words * 4);
    if (!w) return -1;
    for (uint64_t i = 2; i < words; i++)
      if (w[i] >= head[1]) {
        uint32_t bad = w[i];
        free(w);
        return fail(s, "the hash table names symbol %u of %u", bad, head[1]);
      }
    free(w);
  }
  if (d->has[3]) {
    uint32_t head[4]; /* nbuckets, symoffset, bloom_size, bloom_shift */
    unsigned char *h = table(s, "GNU hash table", d->gnu_hash, sizeof head);
    if (!h) return -1;
    memcpy(head, h, sizeof head);
    free(h);
    if (head[2] == 0 || (head[2] & (head[2] - 1)) != 0 || head[0] == 0)
      return fail(s, "the GNU hash table has %u buckets and a bloom of %u words", head[0],
                  head[2]);
    uint64_t bloom = (uint64_t)head[2] * sizeof(ElfW(Addr));
    uint64_t buckets_at = d->gnu_hash + 16 + bloom;
    uint32_t *b = (uint32_t *)table(s, "GNU hash buckets", buckets_at, (uint64_t)head[0] * 4);
    if (!b) return -1;
    const ElfW(Phdr) *seg = load_of(s, buckets_at, 0, 1);
    uint64_t chains_at = buckets_at + (uint64_t)head[0] * 4;
    for (uint32_t i = 0; i < head[0]; i++) {
      if (b[i] == 0) continue;
      if (b[i] < head[1] || b[i] >= nsyms) {
        uint32_t bad = b[i];
        free(b);
        return fail(s, "GNU hash bucket %u names symbol %u (symbols %u..%llu)", i, bad,
                    head[1], (unsigned long long)nsyms);
      }
      for (uint64_t k = b[i];; k++) { /* the chain ends at an odd hash */
        uint64_t at = chains_at + (k - head[1]) * 4;
        uint32_t hv;
        if (k >= nsyms || !seg || at + 4 > seg->p_vaddr + seg->p_filesz ||
            rd(s, seg->p_offset + (at - seg->p_vaddr), &hv, 4) != 0) {
          free(b);
          return fail(s, "a GNU hash chain runs past the symbol table");
        }
        if (hv & 1) break;
      }
    }
    free(b);
  }
  return 0;
}

/* A symbol a relocation names: its name inside the strings, its version
 * index one the object defines or needs (ld.so indexes a table by it). */
static int check_symbol(src *s, const dyn *d, uint64_t sym) {
  ElfW(Sym) e;
  unsigned char *b = table(s, "symbol table", d->symtab + sym * sizeof e, sizeof e);
  if (!b) return -1;
  memcpy(&e, b, sizeof e);
  free(b);
  if (e.st_name >= d->strsz) return -1;
  if (d->has[6]) {
    uint16_t v;
    unsigned char *vb = table(s, "symbol versions", d->versym + sym * 2, 2);
    if (!vb) return -1;
    memcpy(&v, vb, 2);
    free(vb);
    if ((v & 0x7fff) > (d->max_version > 1 ? d->max_version : 1)) return -1;
  }
  return 0;
}

static int check_relocs(src *s, const dyn *d, uint64_t nsyms, uint64_t lo, uint64_t hi) {
  static const char *const what[3] = {"DT_RELA table", "DT_REL table", "DT_JMPREL table"};
  for (int t = 0; t < 3; t++) {
    if (!d->relsz[t]) continue;
    uint64_t ent = d->relent[t];
    size_t want = d->rel_is_a[t] ? sizeof(ElfW(Rela)) : sizeof(ElfW(Rel));
    if (ent != want || d->relsz[t] % ent != 0 || d->relsz[t] > SANE_BYTES)
      return fail(s, "the %s has %llu bytes of %llu-byte entries", what[t],
                  (unsigned long long)d->relsz[t], (unsigned long long)ent);
    unsigned char *buf = table(s, what[t], d->rel[t], d->relsz[t]);
    if (!buf) return -1;
    for (uint64_t i = 0; i < d->relsz[t] / ent; i++) {
      ElfW(Rela) r = {0};
      memcpy(&r, buf + i * ent, ent);
      uint64_t sym = BP_R_SYM(r.r_info), type = BP_R_TYPE(r.r_info);
      int bad = !load_of(s, r.r_offset, sizeof(ElfW(Addr)), 0) || sym >= (sym ? nsyms : 1) ||
                !BP_R_KNOWN(type) ||
                (BP_R_RELATIVE != 0 && t < 2 && i < d->relative_count[t] && type != BP_R_RELATIVE);
      if (!bad && BP_R_RELATIVE != 0 && d->rel_is_a[t] && type == BP_R_RELATIVE)
        bad = (uint64_t)r.r_addend < lo || (uint64_t)r.r_addend > hi;
      if (!bad && sym) bad = check_symbol(s, d, sym) != 0;
      if (bad) {
        free(buf);
        return fail(s,
                    "relocation %llu of the %s is malformed (its target, type, symbol or "
                    "version lies outside the image)",
                    (unsigned long long)i, what[t]);
      }
    }
    free(buf);
  }
  return 0;
}

/* Version needs and definitions: chains of offsets ld.so follows; notes
 * the largest version index in d->max_version. */
static int check_versions(src *s, dyn *d) {
  uint64_t at = d->verneed;
  for (uint64_t i = 0; d->has[4] && i < d->verneednum; i++) {
    ElfW(Verneed) vn;
    unsigned char *b = table(s, "version needs", at, sizeof vn);
    if (!b) return -1;
    memcpy(&vn, b, sizeof vn);
    free(b);
    if (vn.vn_file >= d->strsz || vn.vn_cnt > 4096)
      return fail(s, "version need %llu is malformed", (unsigned long long)i);
    uint64_t aux = at + vn.vn_aux;
    for (unsigned k = 0; k < vn.vn_cnt; k++) {
      ElfW(Vernaux) va;
      unsigned char *a = table(s, "version need entries", aux, sizeof va);
      if (!a) return -1;
      memcpy(&va, a, sizeof va);
      free(a);
      if (va.vna_name >= d->strsz) return fail(s, "a version need names no string");
      if ((va.vna_other & 0x7fff) > d->max_version) d->max_version = va.vna_other & 0x7fff;
      aux += va.vna_next;
    }
    at += vn.vn_next;
  }
  at = d->verdef;
  for (uint64_t i = 0; d->has[5] && i < d->verdefnum; i++) {
    ElfW(Verdef) vd;
    unsigned char *b = table(s, "version definitions", at, sizeof vd);
    if (!b) return -1;
    memcpy(&vd, b, sizeof vd);
    free(b);
    if (vd.vd_cnt > 4096) return fail(s, "version definition %llu is malformed",
                                      (unsigned long long)i);
    if ((vd.vd_ndx & 0x7fff) > d->max_version) d->max_version = vd.vd_ndx & 0x7fff;
    uint64_t aux = at + vd.vd_aux;
    for (unsigned k = 0; k < vd.vd_cnt; k++) {
      ElfW(Verdaux) va;
      unsigned char *a = table(s, "version definition entries", aux, sizeof va);
      if (!a) return -1;
      memcpy(&va, a, sizeof va);
      free(a);
      if (va.vda_name >= d->strsz) return fail(s, "a version definition names no string");
      aux += va.vda_next;
    }
    at += vd.vd_next;
  }
  return 0;
}

static int check_dynamic(src *s, uint64_t lo, uint64_t hi) {
  dyn d;
  if (read_dynamic(s, &d) != 0) return -1;
  if (d.strsz == 0 || d.strsz > SANE_BYTES) return fail(s, "DT_STRSZ is %llu",
                                                       (unsigned long long)d.strsz);
  unsigned char *strs = table(s, "string table", d.strtab, d.strsz);
  if (!strs) return -1;
  int unterminated = strs[d.strsz - 1] != '\0';
  free(strs);
  if (unterminated) return fail(s, "the string table does not end with a NUL");
  for (int i = 0; i < d.name_count; i++)
    if (d.names[i] >= d.strsz) return fail(s, "a library or path name lies outside the strings");
  uint64_t nsyms = symbol_bound(s, &d);
  if (nsyms == 0) return fail(s, "the symbol table is not inside a loaded segment of the file");
  if (check_symbols_hash(s, &d, nsyms) != 0) return -1;
  if (d.has[6] && !load_of(s, d.versym, 2, 1))
    return fail(s, "the symbol version table lies outside the loaded segments");
  if (d.has[7] && d.relrsz && !load_of(s, d.relr, d.relrsz, 1))
    return fail(s, "the DT_RELR table lies outside the loaded segments");
  static const char *const arr[3] = {"init array", "fini array", "preinit array"};
  for (int i = 0; i < 3; i++)
    if (d.arrsz[i] && (d.arrsz[i] > SANE_BYTES || !load_of(s, d.arr[i], d.arrsz[i], 0)))
      return fail(s, "the %s lies outside the loaded segments", arr[i]);
  if (check_versions(s, &d) != 0) return -1;
  return check_relocs(s, &d, nsyms, lo, hi);
}

/* Section headers, when the file has them, are a second account of the
 * layout the link produced: every allocated section must sit in a segment
 * at the file offset the segment maps it from, code in an executable
 * segment and writable data in a writable one. A flipped address, offset,
 * size or flag in a program header shows up as a disagreement. */
static int check_sections(src *s, const ElfW(Ehdr) *eh) {
  if (eh->e_shnum == 0) return 0;
  if (eh->e_shentsize != sizeof(ElfW(Shdr)) || eh->e_shnum > 65280)
    return fail(s, "%u section headers of %u bytes", eh->e_shnum, eh->e_shentsize);
  uint64_t bytes = (uint64_t)eh->e_shnum * sizeof(ElfW(Shdr));
  if (eh->e_shoff > s->size || bytes > s->size - eh->e_shoff)
    return fail(s, "section headers (offset %llu, %llu bytes) end past the file's %llu bytes",
                (unsigned long long)eh->e_shoff, (unsigned long long)bytes,
                (unsigned long long)s->size);
  for (unsigned i = 0; i < eh->e_shnum; i++) {
    ElfW(Shdr) sh;
    if (rd(s, eh->e_shoff + (uint64_t)i * sizeof sh, &sh, sizeof sh) != 0)
      return fail(s, "cannot read section header %u", i);
    if (!(sh.sh_flags & SHF_ALLOC) || sh.sh_size == 0 || sh.sh_type == SHT_NOBITS ||
        (sh.sh_flags & SHF_TLS))
      continue;
    const ElfW(Phdr) *p = load_of(s, sh.sh_addr, sh.sh_size, 1);
    if (!p || p->p_offset + (sh.sh_addr - p->p_vaddr) != sh.sh_offset)
      return fail(s, "section %u (address 0x%llx, offset %llu) is not where the segments map it",
                  i, (unsigned long long)sh.sh_addr, (unsigned long long)sh.sh_offset);
    if (((sh.sh_flags & SHF_EXECINSTR) && !(p->p_flags & PF_X)) ||
        ((sh.sh_flags & SHF_WRITE) && !(p->p_flags & PF_W)) || !(p->p_flags & PF_R))
      return fail(s, "section %u lies in a segment without the access it needs (flags 0x%x)", i,
                  (unsigned)p->p_flags);
  }
  return 0;
}

static int check(src *s) {
  ElfW(Ehdr) eh;
  if (check_header(s, &eh) != 0) return -1;
  s->phnum = eh.e_phnum;
  s->ph = malloc((size_t)eh.e_phnum * sizeof *s->ph);
  if (!s->ph) return fail(s, "out of memory");
  int rc = -1;
  if (rd(s, eh.e_phoff, s->ph, (uint64_t)eh.e_phnum * sizeof *s->ph) != 0)
    fail(s, "cannot read the program headers");
  else if (check_segments(s) == 0 && check_sections(s, &eh) == 0) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < s->phnum; i++)
      if (s->ph[i].p_type == PT_LOAD) {
        if (s->ph[i].p_vaddr < lo) lo = s->ph[i].p_vaddr;
        if (s->ph[i].p_vaddr + s->ph[i].p_memsz > hi) hi = s->ph[i].p_vaddr + s->ph[i].p_memsz;
      }
    rc = check_dynamic(s, lo, hi);
  }
  free(s->ph);
  s->ph = NULL;
  return rc;
}

int bp_elf_check_mem(const void *data, size_t size, char *why, size_t why_size) {
  src s = {.mem = data ? data : (const void *)"", .fd = -1, .size = data ? size : 0,
           .why = why, .why_size = why_size};
  return check(&s);
}

int bp_elf_check_fd(int fd, uint64_t size, char *why, size_t why_size) {
  src s = {.mem = NULL, .fd = fd, .size = size, .why = why, .why_size = why_size};
  return check(&s);
}
