/* mpi_check.h — running a Check suite under mpirun.
 *
 * Every rank runs every test, in the same order, without forking (collectives and fork do not mix). An assertion
 * that fails on one rank alone would leave the others waiting in the next collective, so MPI tests assert on
 * agreed values: CK_ASSERT_ALL(ok, ...) fails on every rank when `ok` is false on any. */
#ifndef FSDPLAB_MPI_CHECK_H
#define FSDPLAB_MPI_CHECK_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/runtime/context.h"
#include "core/runtime/world.h"
#include "core/runtime/session.h"

#define CK_ASSERT_ALL(ctx, ok, ...) ck_assert_msg(world_all_true((ctx), (ok)), __VA_ARGS__)

/* Runs the suite on every rank; the exit status is 0 only when every rank passed every test. */
static inline int mpi_check_run(context *ctx, Suite *suite) {
    SRunner *runner = srunner_create(suite);
    srunner_set_fork_status(runner, CK_NOFORK);
    srunner_run_all(runner, ctx->rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    int all_passed = world_all_true(ctx, failed == 0);
    if (ctx->rank == 0) printf("world size %d: %s\n", ctx->world_size, all_passed ? "all ranks passed" : "FAILED");
    int status = session_close(ctx);
    return all_passed && status == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
