/* Trains the MLP of models/mlp.yaml on Fashion-MNIST through the public C
 * API (blueprint/train.h) and prints one line per epoch.
 *
 *   train_mlp [MODEL [TRAIN_IMAGES [EPOCHS]]]
 *
 * MODEL defaults to models/mlp.yaml; TRAIN_IMAGES (0: all 60000) and
 * EPOCHS (0: the model's) keep a demonstration short. */
#include <stdio.h>
#include <stdlib.h>

#include <blueprint/train.h>

static void print_epoch(void *user, const bp_epoch_report *r) {
  (void)user;
  printf("epoch %lld/%lld: train loss %.4f, test accuracy %.2f%%, %.0f images/s\n",
         (long long)r->epoch, (long long)r->epochs, r->train_loss, 100.0 * r->test_accuracy,
         r->images_per_second);
}

int main(int argc, char **argv) {
  const char *model = argc > 1 ? argv[1] : "models/mlp.yaml";
  bp_train_options options;
  bp_train_options_init(&options); /* SGD as the model file says, seed 1, cpu */
  options.train_limit = argc > 2 ? atoll(argv[2]) : 0;
  options.epochs = argc > 3 ? atoll(argv[3]) : 0;

  bp_trainer *trainer = NULL;
  if (bp_trainer_create_from_file(model, &options, &trainer) != BP_OK ||
      bp_trainer_train(trainer, print_epoch, NULL) != BP_OK) {
    fprintf(stderr, "train_mlp: %s\n", bp_last_error());
    bp_trainer_destroy(trainer);
    return 1;
  }
  bp_eval_report test;
  if (bp_trainer_evaluate(trainer, &test) == BP_OK)
    printf("test accuracy %.2f%% on %lld images\n", 100.0 * test.accuracy, (long long)test.samples);
  bp_trainer_destroy(trainer);
  return 0;
}
