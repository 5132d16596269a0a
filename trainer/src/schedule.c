/* Learning-rate schedules (train.h): a pure function of the step of the
 * run, so a resumed run sees the same rates as an uninterrupted one. The
 * schedules' names are the model's (core/src/model.c). */
#include <math.h>
#include <stdint.h>

#include "blueprint/train.h"

double bp_schedule_lr(const bp_schedule *s, int64_t t) {
  const int64_t spe = s->steps_per_epoch > 0 ? s->steps_per_epoch : 1;
  int64_t total;
  if (__builtin_mul_overflow(spe, s->epochs > 0 ? s->epochs : 1, &total))
    total = INT64_MAX; /* saturate: no overflow whatever the caller passes */
  /* in double first: llround of a value past int64 is undefined */
  const double warm_d = s->warmup_epochs * (double)spe;
  int64_t warm = !(warm_d > 0.0) ? 0 : warm_d >= (double)total ? total : (int64_t)llround(warm_d);
  if (warm > total) warm = total;
  if (t < 0) t = 0;
  if (t < warm) return s->lr * (double)(t + 1) / (double)warm;
  switch (s->kind) {
  case BP_LR_STEP: {
    const int64_t every = s->step_epochs > 0 ? s->step_epochs : 1;
    return s->lr * pow(s->gamma, (double)((t / spe) / every));
  }
  case BP_LR_COSINE: {
    const int64_t span = total - warm;
    if (span <= 0) return s->lr;
    const double progress = (double)(t - warm) / (double)span;
    return 0.5 * s->lr * (1.0 + cos(M_PI * (progress < 1.0 ? progress : 1.0)));
  }
  case BP_LR_CONSTANT:
  default: return s->lr;
  }
}
