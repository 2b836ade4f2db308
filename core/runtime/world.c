/* world.c — errors, exits, agreement and polls of the ranks together. See world.h. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include "core/runtime/world.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base/error.h"

void world_check_mpi(context *ctx, int rc, const char *call, const char *file, int line) {
    if (rc == MPI_SUCCESS) return;
    char reason[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, reason, &length);
    fprintf(stderr, "rank %d: %s:%d: %s failed: %s\n", ctx->rank, file, line, call, reason);
    trace_flush(&ctx->trace); /* the buffered events say what led here */
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* not reached */
}

int world_mpi_error(context *ctx, int rc, const char *what) {
    if (rc == MPI_SUCCESS) return 0;
    char reason[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, reason, &length);
    return error_set(ctx->error, sizeof ctx->error, "rank %d: %s failed: %s", ctx->rank, what, reason);
}

void world_fatal(context *ctx, const char *format, ...) {
    char message[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    fprintf(stderr, "rank %d: %s: %s\n", ctx->rank, ctx->program, message);
    fflush(stderr);
    trace_flush(&ctx->trace);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* not reached */
}

void world_exit_all(context *ctx, int status, const char *format, ...) {
    if (ctx->rank == 0) {
        va_list args;
        va_start(args, format);
        fprintf(stderr, "%s: error: ", ctx->program);
        vfprintf(stderr, format, args);
        fprintf(stderr, "\n");
        va_end(args);
        fflush(stderr);
    }
    trace_close(&ctx->trace);
    MPI_Finalize();
    exit(status);
}

void world_require_size(context *ctx, int min_ranks, int max_ranks) {
    if (ctx->world_size >= min_ranks && ctx->world_size <= max_ranks) return;
    /* ctx->program is the lab's name, NN_name: the Makefile's target is lab-NN. */
    world_exit_all(ctx, 2, "this lab needs %d to %d ranks, got %d; run it as: make lab-%.2s NP=%d (or by hand: "
                   "mpirun -np %d lab/%s)", min_ranks, max_ranks, ctx->world_size, ctx->program, min_ranks,
                   min_ranks, ctx->program);
}

int world_all_true(context *ctx, int ok) {
    int first_failed = ok ? ctx->world_size : ctx->rank;
    world_allreduce(ctx, &first_failed, 1, MPI_INT, MPI_MIN, "world_all_true");
    if (first_failed == ctx->world_size) return 1;
    /* A rank that did not fail takes the message of the lowest rank that did: rank 0 prints for all (world_exit_all),
     * so it must name the real cause; a rank that failed keeps its own. */
    char first_error[sizeof ctx->error];
    if (ctx->rank == first_failed) memcpy(first_error, ctx->error, sizeof first_error);
    WORLD_MPI(ctx, MPI_Bcast(first_error, (int)sizeof first_error, MPI_CHAR, first_failed, ctx->comm));
    if (ok) memcpy(ctx->error, first_error, sizeof first_error);
    return 0;
}

void world_print_ordered(context *ctx, const char *text) {
    int length = (int)strlen(text);
    int *lengths = NULL, *offsets = NULL;
    char *all = NULL;
    if (ctx->rank == 0) {
        lengths = calloc((size_t)ctx->world_size, sizeof *lengths);
        offsets = calloc((size_t)ctx->world_size, sizeof *offsets);
        if (lengths == NULL || offsets == NULL) world_fatal(ctx, "out of memory gathering text to print");
    }
    WORLD_MPI(ctx, MPI_Gather(&length, 1, MPI_INT, lengths, 1, MPI_INT, 0, ctx->comm));
    int total = 0;
    if (ctx->rank == 0) {
        for (int rank = 0; rank < ctx->world_size; rank++) {
            offsets[rank] = total;
            total += lengths[rank];
        }
        all = malloc((size_t)total + 1);
        if (all == NULL) world_fatal(ctx, "out of memory gathering %d bytes of text to print", total);
    }
    WORLD_MPI(ctx, MPI_Gatherv(text, length, MPI_CHAR, all, lengths, offsets, MPI_CHAR, 0, ctx->comm));
    if (ctx->rank == 0) {
        all[total] = '\0';
        fputs(all, stdout);
        fflush(stdout);
    }
    free(all);
    free(lengths);
    free(offsets);
}

void world_allreduce(context *ctx, void *buffer, int count, MPI_Datatype type, MPI_Op op, const char *what) {
    MPI_Request request;
    WORLD_MPI(ctx, MPI_Iallreduce(MPI_IN_PLACE, buffer, count, type, op, ctx->comm, &request));
    int rc = world_poll(ctx, NULL, 1, &request);
    if (rc == WORLD_TIMED_OUT)
        world_fatal(ctx, "%s (all-reduce) timed out: not complete after %g s (TIMEOUT); a rank has stopped, died or "
                  "fallen behind by more than that", what, ctx->timeout_seconds);
    WORLD_MPI(ctx, rc);
}

/* Polls at full speed while the host waits for this stream (an event_synchronize on it: the compute stream is
 * blocked, its core is free) and for WORLD_POLL_SPIN_US after the collective started: Open MPI moves a shared-memory
 * message only while some thread polls, so then it completes as fast as a blocking call would. Otherwise the
 * collective runs under compute, and the thread sleeps between bursts of WORLD_POLL_BURST polls, from 1 us doubling
 * to WORLD_POLL_MAX_US: each poll moves what has arrived, and the compute threads keep their cores. Measured on
 * qwen2-0.5b, 2 ranks on 2 cores (SEQ=128): polling flat out (yielding between polls) made a step about 30% slower
 * than blocking collectives (progress threads and compute fighting for the cores, a 30 MB all-gather stalling when
 * either rank's thread was descheduled); this policy is as fast as blocking there, within the runs' noise. */
int world_poll(context *ctx, atomic_int *hurry, int count, MPI_Request *requests) {
    double now = MPI_Wtime(), spin_until = now + WORLD_POLL_SPIN_US * 1e-6;
    double deadline = ctx->timeout_seconds > 0 ? now + ctx->timeout_seconds : INFINITY;
    int host = hurry == NULL;
    long sleep_ns = 0;
    for (;;) {
        for (int poll = 0; poll < WORLD_POLL_BURST; poll++) {
            int done = 0;
            int rc = MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS || done) return rc;
            if (!host) sched_yield();
        }
        now = MPI_Wtime();
        if (now > deadline) return WORLD_TIMED_OUT;
        if (host || now < spin_until || atomic_load(hurry) > 0) {
            sleep_ns = 0;
            continue;
        }
        sleep_ns = sleep_ns == 0 ? 1000 : sleep_ns * 2;
        if (sleep_ns > WORLD_POLL_MAX_US * 1000L) sleep_ns = WORLD_POLL_MAX_US * 1000L;
        struct timespec pause = {0, sleep_ns};
        nanosleep(&pause, NULL);
    }
}
