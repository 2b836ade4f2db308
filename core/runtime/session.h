/* session.h — a program's life as one run: session_open ... session_close.
 *
 * session_open: MPI up (MPI_THREAD_MULTIPLE for the comm streams), THREADS and TIMEOUT read, the output directory
 * made fresh (OUT, else the program's default), every rank's event file opened, the device chosen (DEVICE, BACKEND,
 * ALLOW_TF32: the CPU, or a plug-in's device, core/runtime/plugin.h), the device pool made (ALLOC,
 * MAX_SPLIT_SIZE_MB, DEVICE_MEMORY_MB), then a barrier and t0, so every rank's timestamps start together.
 * session_close: every rank's leaks checked, the trace closed, rank 0 writes trace.json and the other views, MPI down.
 */
#ifndef FSDPLAB_SESSION_H
#define FSDPLAB_SESSION_H

#include "core/runtime/context.h"

/* Starts MPI and the run. OUT (environment) overrides default_outdir. Aborts with a message on failure. */
void session_open(context *ctx, int *argc, char ***argv, const char *program, const char *default_outdir);
/* Checks every rank's leaks, closes the trace and (rank 0) writes <outdir>/trace.json, then finalises MPI.
 * Returns the process exit status: 0, or 1 when memory leaked or the export failed. */
int session_close(context *ctx);
/* For a program that reads its tensors on the host to teach from them (`reads`: what it reads, for the message): any
 * DEVICE but cpu is refused, every rank exiting with status 2 and a message naming the device, what is read and the
 * labs that do run on a GPU. Called right after session_open. */
void session_require_cpu(context *ctx, const char *reads);

#endif
