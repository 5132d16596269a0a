/* `blueprint plan --svg FILE`: the arena as a picture.
 *
 * From top to bottom: a title with the model, the total and the variants;
 * the arena to scale as one bar (a few feature regions usually take nearly
 * all of it, so the parameter regions are slivers); connectors fanning out
 * to a second bar where every region that holds bytes gets a readable width
 * (not to scale) and a label; brackets naming each letter series; a legend
 * table with exact numbers; the regions that hold nothing; for a packed
 * plan, the feature slots over the step's nodes (those in one band at
 * different times share bytes). Colors follow the series letter,
 * alternating two shades inside a series so neighbours stay apart. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/json_out.h"
#include "blueprint/outfile.h"
#include "plan_print.h"

#define MARGIN 40.0
#define MIN_BAND 34.0   /* width of a region in the readable bar, at least */
#define BAR1_H 46.0     /* the to-scale bar */
#define FAN_H 84.0      /* room for the connectors between the bars */
#define BAR2_H 150.0    /* the readable bar */
#define ROW_H 20.0      /* legend rows */
#define FONT "DejaVu Sans, Helvetica, Arial, sans-serif"

/* A color per series letter (hues far apart for the series that sit next to
 * each other in the arena). */
static unsigned series_rgb(char series) {
  switch (series) {
  case 'B': return 0x8c6bb1; /* running BN statistics: purple */
  case 'W': return 0x2b7bba; /* master weights: blue */
  case 'E': return 0x35a7b5; /* EMA copies: teal */
  case 'A': return 0x6fbf8f; /* FP16 working copies: mint */
  case 'G': return 0xe6671e; /* gradients: orange */
  case 'R': return 0xc62f3a; /* results: red */
  case 'M': return 0xb5a825; /* first moments: olive */
  case 'V': return 0xd8c86b; /* second moments: sand */
  case 'N': return 0x7e57c2; /* LARS norms: violet */
  case 'I': return 0x8d5b4c; /* inputs: brown */
  case 'F': return 0x2e9e5b; /* features: green */
  case 'S': return 0xd56fb0; /* scalars and masks: pink */
  case 'T': return 0x7f8c8d; /* temporaries: gray */
  default: return 0x999999;
  }
}

static const char *series_title(char series) {
  switch (series) {
  case 'B': return "BN statistics";
  case 'W': return "weights";
  case 'E': return "EMA";
  case 'A': return "FP16 weights";
  case 'G': return "gradients";
  case 'R': return "results";
  case 'M': return "moment 1";
  case 'V': return "moment 2";
  case 'N': return "norms";
  case 'I': return "inputs";
  case 'F': return "features";
  case 'S': return "scalars, masks";
  case 'T': return "temporaries";
  default: return "";
  }
}

/* `rgb` mixed with white by `t` in [0, 1]. */
static unsigned lighten(unsigned rgb, double t) {
  unsigned out = 0;
  for (int shift = 16; shift >= 0; shift -= 8) {
    double c = (double)((rgb >> shift) & 0xff);
    out |= (unsigned)lround(c + (255.0 - c) * t) << shift;
  }
  return out;
}

/* Dark text on light fills, white text on dark ones. */
static const char *ink_on(unsigned rgb) {
  double r = (rgb >> 16) & 0xff, g = (rgb >> 8) & 0xff, b = rgb & 0xff;
  return (0.299 * r + 0.587 * g + 0.114 * b) / 255.0 > 0.62 ? "#1d1d1f" : "#ffffff";
}

/* Text as XML character data: markup characters escaped, control
 * characters and bytes that are not UTF-8 shown as '?'. */
static void xml_text(FILE *out, const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  size_t n = strlen(str);
  for (size_t i = 0; i < n;) {
    unsigned char c = s[i];
    int len = bp_utf8_len(s + i, n - i);
    if (c == '&') fputs("&amp;", out);
    else if (c == '<') fputs("&lt;", out);
    else if (c == '>') fputs("&gt;", out);
    else if (c == '"') fputs("&quot;", out);
    else if (c < 0x20 || c == 0x7f || len == 0) fputc('?', out);
    else fwrite(s + i, 1, (size_t)len, out);
    i += len > 0 ? (size_t)len : 1;
  }
}

/* Width of a string in pixels, estimated (no font metrics in C): DejaVu
 * Sans averages about 0.6 em per character, bold a little more. */
static double text_w(const char *s, double size, int bold) {
  return (double)strlen(s) * size * (bold ? 0.66 : 0.6);
}

typedef struct band {
  int region;
  uint64_t offset, bytes;
  unsigned rgb;
  double x1, w1; /* to scale */
  double x2, w2; /* readable */
} band;

typedef struct layout {
  double width, y_bar1, y_bar2, y_brackets, y_legend, height;
  band *bands;
  int n;
} layout;

static int layout_make(const bp_plan *plan, layout *L) {
  memset(L, 0, sizeof *L);
  L->bands = calloc(BP_REGION_COUNT, sizeof *L->bands);
  if (!L->bands) return -1;
  char prev_series = 0;
  int shade = 0;
  double sum_sqrt = 0;
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    bp_span s = bp_plan_region_span(plan, (bp_region)r);
    if (s.bytes == 0) continue;
    char series = bp_region_get((bp_region)r)->series;
    shade = series == prev_series ? !shade : 0;
    prev_series = series;
    band *b = &L->bands[L->n++];
    b->region = r;
    b->offset = s.offset;
    b->bytes = s.bytes;
    b->rgb = shade ? lighten(series_rgb(series), 0.3) : series_rgb(series);
    sum_sqrt += sqrt((double)s.bytes);
  }
  L->width = fmax(1040.0, 2 * MARGIN + L->n * (MIN_BAND + 6));
  double inner = L->width - 2 * MARGIN;
  double total = fmax(1.0, (double)bp_plan_total_bytes(plan)); /* an empty plan draws empty */
  /* the readable bar: a minimum each, the rest shared by sqrt(bytes) so
   * big regions still look big without starving the small ones */
  double spare = inner - L->n * MIN_BAND, x2 = MARGIN;
  for (int i = 0; i < L->n; i++) {
    band *b = &L->bands[i];
    b->x1 = MARGIN + inner * ((double)b->offset / total);
    b->w1 = inner * ((double)b->bytes / total);
    b->x2 = x2;
    b->w2 = MIN_BAND + (sum_sqrt > 0 ? spare * sqrt((double)b->bytes) / sum_sqrt : 0);
    x2 += b->w2;
  }
  return 0;
}

/* Title, totals, options and the variants, wrapped to the width. Returns
 * the y below it. */
static double draw_header(FILE *out, const bp_plan *plan, const bp_plan_print_info *info,
                          double width) {
  char a[BP_FMT_MAX], b[BP_FMT_MAX], opts[128];
  const char *name = info && info->model_name && *info->model_name ? info->model_name : "model";
  uint64_t total = bp_plan_total_bytes(plan);
  fprintf(out, "<text x=\"%.1f\" y=\"46\" font-size=\"24\" font-weight=\"bold\" fill=\"#1d1d1f\">",
          MARGIN);
  xml_text(out, name);
  fputs("<tspan font-weight=\"normal\" fill=\"#6e6e73\"> · memory plan</tspan></text>\n", out);
  fprintf(out,
          "<text x=\"%.1f\" y=\"46\" font-size=\"24\" font-weight=\"bold\" text-anchor=\"end\" "
          "fill=\"#1d1d1f\">%s<tspan font-size=\"15\" font-weight=\"normal\" fill=\"#6e6e73\"> "
          "per rank</tspan></text>\n",
          width - MARGIN, bp_fmt_bytes(total, a));
  fprintf(out,
          "<text x=\"%.1f\" y=\"68\" font-size=\"13\" text-anchor=\"end\" fill=\"#6e6e73\">%s "
          "bytes, one arena on every rank</text>\n",
          width - MARGIN, bp_fmt_count(total, b));
  fprintf(out, "<text x=\"%.1f\" y=\"68\" font-size=\"13\" fill=\"#3a3a3c\">", MARGIN);
  if (info && info->model_path && *info->model_path) {
    xml_text(out, info->model_path);
    fputs(" · ", out);
  }
  fprintf(out, "%s · %" PRId32 " tensors</text>\n", bp_fmt_options(plan, " · ", opts, sizeof opts),
          bp_plan_tensor_count(plan));
  /* variants: "train 128 × 28×28", wrapped at the width */
  double y = 90, x = MARGIN, room = width - 2 * MARGIN;
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" fill=\"#3a3a3c\">", MARGIN, y);
  fputs("<tspan font-weight=\"bold\">variants</tspan>", out);
  x += text_w("variants ", 13, 1);
  for (int v = 0; v < bp_plan_variant_count(plan); v++) {
    const bp_variant_info *vi = bp_plan_variant(plan, v);
    char item[BP_NAME_MAX + 96];
    snprintf(item, sizeof item, "%s batch %" PRId64 " at %" PRId64 "×%" PRId64, vi->name, vi->batch,
             vi->height, vi->width);
    double w = text_w(item, 13, 0) + 24;
    if (x + w > MARGIN + room && v > 0) {
      y += 18;
      x = MARGIN;
      fprintf(out, "<tspan x=\"%.1f\" y=\"%.1f\"></tspan>", MARGIN, y);
    }
    /* a separator between items, none at the start of a wrapped line */
    fputs(v == 0 ? " " : x > MARGIN ? "<tspan fill=\"#aeaeb2\">  ·  </tspan>" : "", out);
    fputs("<tspan font-weight=\"bold\">", out);
    xml_text(out, vi->name);
    fprintf(out, "</tspan> batch %" PRId64 " at %" PRId64 "×%" PRId64, vi->batch, vi->height,
            vi->width);
    x += w;
  }
  fputs("</text>\n", out);
  return y + 20;
}

/* Ticks at the quarters of the arena above the to-scale bar. */
static void draw_scale(FILE *out, const layout *L, uint64_t total, double y) {
  char a[BP_FMT_MAX];
  double inner = L->width - 2 * MARGIN;
  fprintf(out,
          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\" fill=\"#3a3a3c\">"
          "the arena, to scale</text>\n",
          MARGIN, y - 22);
  for (int k = 0; k <= 4; k++) {
    double x = MARGIN + inner * k / 4.0;
    uint64_t at = (uint64_t)((double)total * k / 4.0);
    fprintf(out,
            "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#8e8e93\"/>"
            "<text x=\"%.2f\" y=\"%.1f\" font-size=\"11\" fill=\"#6e6e73\" text-anchor=\"%s\">%s"
            "</text>\n",
            x, y - 5, x, y, x, y - 8, k == 0 ? "start" : k == 4 ? "end" : "middle",
            k == 0 ? "0" : bp_fmt_bytes(at, a));
  }
}

/* A label centered in a band: name, and the size under it when it fits. */
static void band_label(FILE *out, const band *b, double x, double w, double y, double h) {
  char a[BP_FMT_MAX];
  const char *name = bp_region_get((bp_region)b->region)->name;
  bp_fmt_bytes(b->bytes, a);
  int two = w >= fmax(text_w(name, 12, 1), text_w(a, 11, 0)) + 10 && h >= 34;
  int one = w >= text_w(name, 12, 1) + 8;
  if (!one) return;
  double cx = x + w / 2, cy = y + h / 2;
  fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"12\" font-weight=\"bold\" "
               "text-anchor=\"middle\" fill=\"%s\">%s</text>\n",
          cx, two ? cy - 3 : cy + 4, ink_on(b->rgb), name);
  if (two)
    fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"11\" text-anchor=\"middle\" "
                 "fill=\"%s\">%s</text>\n",
            cx, cy + 12, ink_on(b->rgb), a);
}

static void draw_bar1(FILE *out, const layout *L, double y) {
  for (int i = 0; i < L->n; i++) {
    const band *b = &L->bands[i];
    /* a sliver stays visible: at least 0.75 px */
    fprintf(out, "<rect x=\"%.3f\" y=\"%.1f\" width=\"%.3f\" height=\"%.1f\" fill=\"#%06x\"/>\n",
            b->x1, y, fmax(b->w1, 0.75), BAR1_H, b->rgb);
  }
  /* separators only between bands wide enough to keep their color */
  for (int i = 1; i < L->n; i++)
    if (L->bands[i].w1 > 3 && L->bands[i - 1].w1 > 3)
      fprintf(out, "<line x1=\"%.3f\" y1=\"%.1f\" x2=\"%.3f\" y2=\"%.1f\" stroke=\"#ffffff\" "
                   "stroke-width=\"1.5\"/>\n",
              L->bands[i].x1, y, L->bands[i].x1, y + BAR1_H);
  for (int i = 0; i < L->n; i++) band_label(out, &L->bands[i], L->bands[i].x1, L->bands[i].w1, y, BAR1_H);
  fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
               "stroke=\"#3a3a3c\" stroke-width=\"0.8\"/>\n",
          MARGIN, y, L->width - 2 * MARGIN, BAR1_H);
}

/* From each band of the to-scale bar to its band in the readable bar. */
static void draw_fan(FILE *out, const layout *L, double y_top, double y_bottom) {
  double mid = (y_top + y_bottom) / 2;
  for (int i = 0; i < L->n; i++) {
    const band *b = &L->bands[i];
    double a0 = b->x1, a1 = b->x1 + fmax(b->w1, 0.75), c0 = b->x2 + 1, c1 = b->x2 + b->w2 - 1;
    fprintf(out,
            "<path d=\"M%.2f %.1f C%.2f %.1f %.2f %.1f %.2f %.1f L%.2f %.1f C%.2f %.1f %.2f %.1f "
            "%.2f %.1f Z\" fill=\"#%06x\" fill-opacity=\"0.22\" stroke=\"#%06x\" "
            "stroke-opacity=\"0.45\" stroke-width=\"0.6\"/>\n",
            a0, y_top, a0, mid, c0, mid, c0, y_bottom, c1, y_bottom, c1, mid, a1, mid, a1, y_top,
            b->rgb, b->rgb);
  }
}

/* Every region with a label: horizontal when it fits, else turned upright. */
static void draw_bar2(FILE *out, const layout *L, double y) {
  char a[BP_FMT_MAX];
  for (int i = 0; i < L->n; i++) {
    const band *b = &L->bands[i];
    const char *name = bp_region_get((bp_region)b->region)->name;
    const char *ink = ink_on(b->rgb);
    fprintf(out, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" rx=\"3\" "
                 "fill=\"#%06x\"/>\n",
            b->x2 + 1, y, b->w2 - 2, BAR2_H, b->rgb);
    bp_fmt_bytes(b->bytes, a);
    if (b->w2 >= fmax(text_w(name, 13, 1), text_w(a, 12, 0)) + 14) {
      band_label(out, b, b->x2, b->w2, y, BAR2_H);
    } else {
      double cx = b->x2 + b->w2 / 2, base = y + BAR2_H - 10;
      fprintf(out, "<text transform=\"translate(%.2f %.1f) rotate(-90)\" font-size=\"12\" "
                   "font-weight=\"bold\" fill=\"%s\">%s</text>\n",
              cx - 1, base, ink, name);
      fprintf(out, "<text transform=\"translate(%.2f %.1f) rotate(-90)\" font-size=\"10.5\" "
                   "fill=\"%s\">%s</text>\n",
              cx + 11, base, ink, a);
    }
  }
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#6e6e73\">every region that "
               "holds bytes, in arena order, widened to be readable (not to scale)</text>\n",
          MARGIN, y + BAR2_H + 54);
}

/* A bracket under each run of one series letter, with its name and size. */
static void draw_brackets(FILE *out, const layout *L, double y) {
  char a[BP_FMT_MAX], label[96];
  for (int i = 0; i < L->n;) {
    char series = bp_region_get((bp_region)L->bands[i].region)->series;
    int j = i;
    uint64_t bytes = 0;
    while (j < L->n && bp_region_get((bp_region)L->bands[j].region)->series == series)
      bytes += L->bands[j++].bytes;
    double x0 = L->bands[i].x2 + 2, x1 = L->bands[j - 1].x2 + L->bands[j - 1].w2 - 2;
    unsigned rgb = series_rgb(series);
    fprintf(out, "<path d=\"M%.2f %.1f v6 H%.2f v-6\" fill=\"none\" stroke=\"#%06x\" "
                 "stroke-width=\"1.5\"/>\n",
            x0, y, x1, rgb);
    bp_fmt_bytes(bytes, a);
    snprintf(label, sizeof label, "%c %s, %s", series, series_title(series), a);
    if (text_w(label, 11, 0) > x1 - x0) snprintf(label, sizeof label, "%c %s", series, a);
    if (text_w(label, 11, 0) > x1 - x0) snprintf(label, sizeof label, "%c", series);
    fprintf(out, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" "
                 "fill=\"#3a3a3c\"><tspan font-weight=\"bold\" fill=\"#%06x\">%c</tspan>%s</text>\n",
            (x0 + x1) / 2, y + 20, rgb, series, label + 1);
    i = j;
  }
}

/* The exact numbers, one row per region that holds bytes. */
static double draw_legend(FILE *out, const bp_plan *plan, const layout *L, double y) {
  static const struct {
    const char *title;
    double x;
    int right;
  } col[] = {{"region", 22, 0}, {"series", 150, 0},  {"role", 200, 0},   {"base", 580, 1},
             {"size", 660, 1},  {"bytes", 770, 1},   {"share", 830, 1},  {"tensors", 890, 1}};
  char a[BP_FMT_MAX];
  double x0 = MARGIN, total = fmax(1.0, (double)bp_plan_total_bytes(plan));
  fprintf(out, "<g font-size=\"12\" fill=\"#1d1d1f\">\n");
  for (size_t c = 0; c < sizeof col / sizeof col[0]; c++)
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\" fill=\"#6e6e73\"%s>%s</text>\n",
            x0 + col[c].x, y, col[c].right ? " text-anchor=\"end\"" : "", col[c].title);
  fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c7c7cc\"/>\n", x0,
          y + 6, x0 + 890, y + 6);
  y += 6;
  for (int i = 0; i < L->n; i++) {
    const band *b = &L->bands[i];
    const bp_region_info *ri = bp_region_get((bp_region)b->region);
    if (i % 2)
      fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"896\" height=\"%.1f\" fill=\"#f4f4f6\"/>\n",
              x0 - 3, y, ROW_H);
    double base = y + 14.5;
    fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"13\" height=\"13\" rx=\"2\" fill=\"#%06x\"/>\n",
            x0, y + 3.5, b->rgb);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">%s</text>", x0 + col[0].x, base,
            ri->name);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\">%c</text>", x0 + col[1].x, base, ri->series);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#3a3a3c\">", x0 + col[2].x, base);
    xml_text(out, ri->role);
    fputs("</text>", out);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", x0 + col[3].x, base,
            bp_fmt_count(b->offset, a));
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", x0 + col[4].x, base,
            bp_fmt_bytes(b->bytes, a));
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", x0 + col[5].x, base,
            bp_fmt_count(b->bytes, a));
    double share = 100.0 * (double)b->bytes / total;
    fprintf(out, share < 0.1 ? "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">&lt;0.1%%</text>"
                             : "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.1f%%</text>",
            x0 + col[6].x, base, share);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%d</text>\n", x0 + col[7].x, base,
            (int)bp_plan_region_tensor_count(plan, (bp_region)b->region));
    y += ROW_H;
  }
  fputs("</g>\n", out);
  return y;
}

/* Whether tensor `id` shares a byte with another tensor of its region. */
static int shares_bytes(const bp_plan *plan, int32_t id) {
  const bp_dtensor *t = bp_plan_tensor(plan, 0, id);
  for (int32_t j = 0; j < bp_plan_tensor_count(plan); j++) {
    const bp_dtensor *u = bp_plan_tensor(plan, 0, j);
    if (j != id && u->region == t->region && u->offset < t->offset + t->slot_bytes &&
        t->offset < u->offset + u->slot_bytes)
      return 1;
  }
  return 0;
}

/* Liveness packing: for each packed region, its slots over the nodes of
 * the first variant's step (x) at their offsets (y). Slots in one vertical
 * band at different times share bytes; those are outlined dark. */
static double draw_liveness(FILE *out, const bp_plan *plan, double y, double width) {
  if (!bp_plan_is_packed(plan)) return y;
  char a[BP_FMT_MAX], b[BP_FMT_MAX];
  const double chart_h = 240.0, x0 = MARGIN + 70, inner = width - MARGIN - x0;
  const int32_t n = bp_plan_tensor_count(plan);
  static const unsigned palette[] = {0x2e9e5b, 0x5cb85c, 0x1b7a44, 0x7fc97f, 0x3f8f6a, 0x9bd3a8};
  y += 36;
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\" "
               "fill=\"#3a3a3c\">liveness reuse: %s per rank, %s without</text>\n",
          MARGIN, y, bp_fmt_bytes(bp_plan_total_bytes(plan), a),
          bp_fmt_bytes(bp_plan_unpacked_bytes(plan), b));
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#6e6e73\">each feature or "
               "gradient slot from its first to its last node in variant '",
          MARGIN, y + 16);
  xml_text(out, bp_plan_variant(plan, 0)->name);
  fputs("' (x) at its bytes (y); slots in one band at different times share bytes "
        "(dark outline)</text>\n", out);
  y += 30;
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    const bp_span s = bp_plan_region_span(plan, (bp_region)r);
    if (!bp_region_is_packed((bp_region)r) || s.bytes == 0) continue;
    int32_t nodes = 1;
    for (int32_t id = 0; id < n; id++) {
      const bp_live_range lr = bp_plan_live_range(plan, 0, id);
      if (lr.first >= 0 && lr.last != BP_LIVE_END && lr.last + 1 > nodes) nodes = lr.last + 1;
      if (lr.first >= nodes) nodes = lr.first + 1;
    }
    const double dx = inner / (double)nodes;
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" font-weight=\"bold\" "
                 "fill=\"#1d1d1f\">%s</text>\n",
            MARGIN, y + 14, bp_region_get((bp_region)r)->name);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#6e6e73\">%s</text>\n",
            MARGIN, y + 30, bp_fmt_bytes(s.bytes, a));
    fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f4f4f6\" "
                 "stroke=\"#c7c7cc\"/>\n",
            x0, y, inner, chart_h);
    int shade = 0;
    for (int32_t id = 0; id < n; id++) {
      const bp_dtensor *t = bp_plan_tensor(plan, 0, id);
      const bp_live_range lr = bp_plan_live_range(plan, 0, id);
      if ((int)t->region != r || lr.first < 0) continue;
      const int32_t last = lr.last == BP_LIVE_END ? nodes - 1 : lr.last;
      const double rx = x0 + dx * lr.first, rw = dx * (last - lr.first + 1);
      const double ry = y + chart_h * (double)(t->offset - s.offset) / (double)s.bytes;
      const double rh = fmax(chart_h * (double)t->slot_bytes / (double)s.bytes, 1.0);
      const unsigned rgb = palette[shade++ % (int)(sizeof palette / sizeof palette[0])];
      const int shared = shares_bytes(plan, id);
      fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#%06x\" "
                   "stroke=\"%s\" stroke-width=\"%s\"><title>",
              rx, ry, rw, rh, rgb, shared ? "#1d1d1f" : "#ffffff", shared ? "1.2" : "0.6");
      xml_text(out, t->name);
      fprintf(out, ": %s at +%s, nodes %d..%d%s</title></rect>\n", bp_fmt_bytes(t->slot_bytes, a),
              bp_fmt_count(t->offset - s.offset, b), (int)lr.first, (int)last,
              shared ? ", shares bytes" : "");
      if (rw >= text_w(t->name, 10, 0) + 6 && rh >= 13) {
        fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"10\" fill=\"%s\">", rx + 3,
                ry + fmin(rh / 2 + 4, 14), ink_on(rgb));
        xml_text(out, t->name);
        fputs("</text>\n", out);
      }
    }
    y += chart_h + 24;
  }
  return y;
}

/* The regions without bytes, one reason per line. */
static double draw_zero_regions(FILE *out, const bp_plan *plan, double y, double width) {
  char zero[2048];
  int n = bp_fmt_zero_regions(plan, zero, sizeof zero);
  if (n == 0) return y;
  y += 26;
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" font-weight=\"bold\" "
               "fill=\"#6e6e73\">%d regions hold 0 bytes</text>\n",
          MARGIN, y, n);
  for (char *line = zero; line && *line;) {
    char *next = strstr(line, "; ");
    if (next) *next = '\0';
    /* wrapped to the picture, continuation lines indented */
    double x = MARGIN + 22;
    for (const char *rest = line; *rest; x = MARGIN + 44) {
      size_t chars = (size_t)fmax(16.0, (width - MARGIN - x) / (12 * 0.6));
      size_t cut = bp_fmt_wrap(rest, chars);
      char piece[2048];
      snprintf(piece, sizeof piece, "%.*s", (int)cut, rest);
      y += 17;
      fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#6e6e73\">", x, y);
      xml_text(out, piece);
      fputs("</text>\n", out);
      rest += cut;
      while (*rest == ' ') rest++;
    }
    line = next ? next + 2 : NULL;
  }
  return y;
}

void bp_plan_print_svg(FILE *out, const bp_plan *plan, const bp_plan_print_info *info) {
  layout L;
  if (layout_make(plan, &L) != 0) {
    /* out of memory for ~50 bands: leave a valid, empty picture */
    fputs("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\"/>\n", out);
    return;
  }
  /* the height depends on the header's wrapping: draw the body into a
   * temporary stream first, then the frame around it */
  char *body = NULL;
  size_t body_len = 0;
  FILE *mem = open_memstream(&body, &body_len);
  if (!mem) {
    free(L.bands);
    fputs("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\"/>\n", out);
    return;
  }
  double y = draw_header(mem, plan, info, L.width) + 40;
  draw_scale(mem, &L, bp_plan_total_bytes(plan), y);
  L.y_bar1 = y;
  draw_fan(mem, &L, y + BAR1_H, y + BAR1_H + FAN_H);
  draw_bar1(mem, &L, y);
  L.y_bar2 = y + BAR1_H + FAN_H;
  draw_bar2(mem, &L, L.y_bar2);
  L.y_brackets = L.y_bar2 + BAR2_H + 6;
  draw_brackets(mem, &L, L.y_brackets);
  L.y_legend = L.y_brackets + 80;
  y = draw_legend(mem, plan, &L, L.y_legend);
  y = draw_zero_regions(mem, plan, y, L.width);
  y = draw_liveness(mem, plan, y, L.width);
  L.height = y + MARGIN;
  fclose(mem);

  const char *name = info && info->model_name && *info->model_name ? info->model_name : "model";
  fprintf(out,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\" font-family=\"%s\" xml:space=\"preserve\">\n<title>",
          L.width, L.height, L.width, L.height, FONT);
  xml_text(out, name);
  fputs(": memory plan</title>\n", out);
  fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
  if (body) fwrite(body, 1, body_len, out);
  fputs("</svg>\n", out);
  free(body);
  free(L.bands);
}

bp_status bp_plan_write_svg(const char *path, const bp_plan *plan,
                            const bp_plan_print_info *info) {
  bp_status checked = bp_output_check(path, "SVG");
  if (checked != BP_OK) return checked;
  char *target = bp_output_target(path); /* a symlink's target is replaced, not the link */
  size_t len = target ? strlen(target) : 0;
  char *tmp = target ? malloc(len + 5) : NULL;
  if (!tmp) {
    free(target);
    return bp_fail(BP_ERR_NOMEM, "out of memory writing '%s'", path);
  }
  memcpy(tmp, target, len);
  memcpy(tmp + len, ".tmp", 5);
  FILE *f = fopen(tmp, "w");
  if (!f) {
    bp_status st = bp_fail(BP_ERR_IO, "cannot write SVG '%s': %s", path, strerror(errno));
    free(tmp);
    free(target);
    return st;
  }
  errno = 0;
  bp_plan_print_svg(f, plan, info);
  int failed = ferror(f);
  int err = failed ? (errno ? errno : EIO) : 0;
  if (fclose(f) != 0 && !failed) {
    failed = 1;
    err = errno;
  }
  if (!failed && rename(tmp, target) != 0) {
    failed = 1;
    err = errno;
  }
  free(target);
  if (failed) {
    remove(tmp);
    free(tmp);
    return bp_fail(BP_ERR_IO, "cannot write SVG '%s': %s", path, strerror(err));
  }
  free(tmp);
  return BP_OK;
}
