/* Test-only hooks of the executor. Not installed and not for programs:
 * tests include it from core/src. */
#ifndef BLUEPRINT_EXEC_TEST_H
#define BLUEPRINT_EXEC_TEST_H

/* Leaves out the `wait`-th wait (from 0, in program order) of every stream
 * program built from now on that has one (bp_exec_program_get, exec.h), so
 * a test can show a missing edge is caught; -1 (the default) leaves out
 * none. Process-wide, since the trainer builds its executors itself. */
void bp_exec_test_drop_wait(long wait);

#endif
