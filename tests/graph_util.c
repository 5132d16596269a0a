/* Building a test model's plan and graph (graph_util.h). */
#include "graph_util.h"

#include "blueprint/model_yaml.h"

#include <check.h>
#include <string.h>

void graph_util_build(const char *text, const char *name, int64_t batch, bp_model **model_out,
                      bp_plan **plan_out, bp_graph **graph_out) {
  ck_assert_msg(bp_model_parse(text, strlen(text), name, model_out) == BP_OK, "%s",
                bp_last_error());
  bp_compile_options co = bp_compile_options_from_model(*model_out);
  co.batch = co.eval_batch = co.train_size = batch;
  ck_assert_msg(bp_model_compile(*model_out, &co, plan_out) == BP_OK, "%s", bp_last_error());
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.global_batch = batch;
  go.train_size = batch;
  ck_assert_msg(bp_graph_build(*model_out, *plan_out, &go, graph_out) == BP_OK, "%s",
                bp_last_error());
}

void graph_util_free(bp_model *model, bp_plan *plan, bp_graph *graph) {
  bp_graph_destroy(graph);
  bp_plan_destroy(plan);
  bp_model_destroy(model);
}
