/* The table `blueprint train --profile` and `eval --profile` print after
 * the run (docs/profile.md explains how to read it). Private to the CLI. */
#ifndef BLUEPRINT_CLI_PROFILE_REPORT_H
#define BLUEPRINT_CLI_PROFILE_REPORT_H

#include <stdio.h>

#include "blueprint/profile.h"

/* The yardstick, then variant `main` ("train", "eval") by op and by node,
 * then one line per other variant with steps. */
void bp_cli_profile_report(FILE *f, const bp_profile *profile, const char *main);

#endif
