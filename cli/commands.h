/* Subcommands of the blueprint executable; each lives in cmd_<name>.c. */
#ifndef BLUEPRINT_CLI_COMMANDS_H
#define BLUEPRINT_CLI_COMMANDS_H

/* Each returns the process exit status; argv[0] is the subcommand name.
 * Errors go to stderr as one line "blueprint <cmd>: <what is wrong>". */
int bp_cmd_plan(int argc, char **argv);
int bp_cmd_plugins(int argc, char **argv);
int bp_cmd_train(int argc, char **argv);
int bp_cmd_eval(int argc, char **argv);
int bp_cmd_validate(int argc, char **argv);
int bp_cmd_predict(int argc, char **argv);
int bp_cmd_export(int argc, char **argv);

#endif
