/* check_main.h — running a Check suite in a plain (one-process, no MPI) test program: each test forks, as Check
 * does by default, so a crash or abort fails that test alone. The MPI suites use mpi_check.h instead. */
#ifndef FSDPLAB_CHECK_MAIN_H
#define FSDPLAB_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

/* Runs the suite; the exit status is 0 only when every test passed. */
static inline int check_run(Suite *suite) {
    SRunner *runner = srunner_create(suite);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
