/* stream.c — streams as the host thread or a progress thread each; events as flags. See stream.h. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include "core/comm/stream.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/runtime/world.h"

static void event_complete(stream *s, stream_event *event) {
    pthread_mutex_lock(&s->mutex);
    event->complete_us = trace_now_us(&s->ctx->trace);
    atomic_store_explicit(&event->complete, 1, memory_order_release);
    pthread_cond_broadcast(&s->done);
    pthread_mutex_unlock(&s->mutex);
}

int event_query(const stream_event *event) {
    if (event->recorded_on == NULL) return 1;
    if (event->device_event != NULL) return event->recorded_on->ctx->stream_ops->event_query(event);
    return atomic_load_explicit(&event->complete, memory_order_acquire);
}

double event_synchronize(stream_event *event) {
    if (event_query(event)) return 0.0;
    stream *s = event->recorded_on;
    double start = trace_now_us(&s->ctx->trace);
    if (event->device_event != NULL) {
        s->ctx->stream_ops->event_synchronize(event);
        return trace_now_us(&s->ctx->trace) - start;
    }
    atomic_fetch_add(&s->host_waiting, 1); /* the stream's polls go full speed while the host waits */
    pthread_mutex_lock(&s->mutex);
    while (!atomic_load_explicit(&event->complete, memory_order_acquire)) pthread_cond_wait(&s->done, &s->mutex);
    pthread_mutex_unlock(&s->mutex);
    atomic_fetch_sub(&s->host_waiting, 1);
    return trace_now_us(&s->ctx->trace) - start;
}

/* ---- the worker thread ---- */

static void *worker_main(void *arg) {
    stream *s = arg;
    if (s->device_side != NULL) s->ctx->stream_ops->thread_start(s); /* a thread's CUDA calls: its current device */
    for (;;) {
        pthread_mutex_lock(&s->mutex);
        while (s->count == 0 && !s->stop) pthread_cond_wait(&s->work, &s->mutex);
        if (s->count == 0 && s->stop) {
            pthread_mutex_unlock(&s->mutex);
            return NULL;
        }
        stream_task task = s->tasks[s->head]; /* stays queued while it runs: stream_synchronize sees it */
        pthread_mutex_unlock(&s->mutex);
        switch (task.kind) {
        case TASK_RUN: task.fn(task.arg); break;
        case TASK_RECORD: event_complete(s, task.event); break;
        case TASK_WAIT: event_synchronize(task.event); break;
        }
        pthread_mutex_lock(&s->mutex);
        s->head = (s->head + 1) % s->capacity;
        s->count--;
        pthread_cond_broadcast(&s->done);
        pthread_mutex_unlock(&s->mutex);
    }
}

static void enqueue(stream *s, stream_task task) {
    pthread_mutex_lock(&s->mutex);
    if (s->count == s->capacity) { /* grow the ring, unrolling it */
        size_t capacity = s->capacity ? 2 * s->capacity : 64;
        stream_task *tasks = malloc(capacity * sizeof *tasks);
        if (tasks == NULL) world_fatal(s->ctx, "stream '%s': out of memory for %zu tasks", s->name, capacity);
        for (size_t i = 0; i < s->count; i++) tasks[i] = s->tasks[(s->head + i) % s->capacity];
        free(s->tasks);
        s->tasks = tasks, s->capacity = capacity, s->head = 0;
    }
    s->tasks[(s->head + s->count) % s->capacity] = task;
    s->count++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mutex);
}

int stream_init(stream *s, context *ctx, const char *name, stream_kind kind) {
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->kind = kind;
    s->comm = ctx->comm;
    snprintf(s->name, sizeof s->name, "%s", name);
    pthread_mutex_init(&s->mutex, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->done, NULL);
    if (ctx->stream_ops != NULL) {
        if (ctx->stream_ops->init(s) != 0) return -1;
        if (s->device_ordered) return 0; /* a cudaStream: no thread, and the context's communicator for agreements */
    }
    if (kind == STREAM_HOST) return 0;
    if (!ctx->thread_multiple) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: stream '%s' needs MPI_THREAD_MULTIPLE, which this MPI does "
                 "not provide: comm streams are threads calling MPI beside the host", ctx->rank, name);
        return -1;
    }
    int rc = MPI_Comm_dup(ctx->comm, &s->comm);
    if (rc != MPI_SUCCESS) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: stream '%s': MPI_Comm_dup failed (code %d)", ctx->rank, name,
                 rc);
        return -1;
    }
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    rc = pthread_create(&s->thread, NULL, worker_main, s);
    if (rc != 0) {
        snprintf(ctx->error, sizeof ctx->error, "rank %d: stream '%s': pthread_create failed: %s", ctx->rank, name,
                 strerror(rc));
        return -1;
    }
    s->started = 1;
    return 0;
}

void stream_destroy(stream *s) {
    if (s->ctx == NULL) return;
    if (s->started) {
        pthread_mutex_lock(&s->mutex);
        s->stop = 1;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mutex);
        pthread_join(s->thread, NULL);
    }
    int own_communicators = s->kind == STREAM_WORKER && !s->device_ordered; /* the duplicates a thread made */
    if (own_communicators && s->comm != MPI_COMM_NULL && s->comm != s->ctx->comm) MPI_Comm_free(&s->comm);
    for (int i = 0; i < s->group_count; i++)
        if (own_communicators && s->group_comms[i] != MPI_COMM_NULL) MPI_Comm_free(&s->group_comms[i]);
    if (s->device_side != NULL) s->ctx->stream_ops->destroy(s);
    pthread_mutex_destroy(&s->mutex);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
    free(s->tasks);
    memset(s, 0, sizeof *s);
}

int stream_add_group(stream *s, const comm_group *group) {
    context *ctx = s->ctx;
    if (s->group_count == STREAM_GROUPS_MAX)
        return error_set(ctx->error, sizeof ctx->error, "rank %d: stream '%s': more than %d process groups", ctx->rank,
                         s->name, STREAM_GROUPS_MAX);
    MPI_Comm comm = group->comm;
    if (s->device_ordered && ctx->stream_ops->add_group(s, group, s->group_count) != 0) return -1;
    if (s->kind == STREAM_WORKER && !s->device_ordered) {
        int rc = MPI_Comm_dup(group->comm, &comm);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
        if (rc != MPI_SUCCESS)
            return error_set(ctx->error, sizeof ctx->error, "rank %d: stream '%s': MPI_Comm_dup of group '%s' failed "
                             "(code %d)", ctx->rank, s->name, group->name, rc);
    }
    s->groups[s->group_count] = group;
    s->group_comms[s->group_count++] = comm;
    return 0;
}

MPI_Comm stream_comm(const stream *s, const comm_group *group) {
    if (group == NULL) return s->comm;
    for (int i = 0; i < s->group_count; i++)
        if (s->groups[i] == group) return s->group_comms[i];
    world_fatal(s->ctx, "stream '%s' has no communicator of group '%s' (stream_add_group)", s->name, group->name);
}

void stream_launch(stream *s, stream_fn fn, void *arg) {
    if (s->kind == STREAM_HOST || s->device_ordered) fn(arg); /* a device stream's fn queues the device's work */
    else enqueue(s, (stream_task){.kind = TASK_RUN, .fn = fn, .arg = arg});
}

void event_record(stream_event *event, stream *s) {
    event->recorded_on = s;
    event->device_event = NULL;
    atomic_store_explicit(&event->complete, 0, memory_order_release);
    if (s->device_ordered) {
        s->ctx->stream_ops->event_record(event, s);
        return;
    }
    if (s->kind == STREAM_HOST) event_complete(s, event);
    else enqueue(s, (stream_task){.kind = TASK_RECORD, .event = event});
}

double stream_wait(stream *s, stream_event *event) {
    if (s->device_ordered) {
        /* A cudaEvent: the device orders it, the host goes on. A host flag (a BACKEND=mpi comm stream's): the host
         * waits for it, so whatever it queues on s afterwards comes after. */
        if (event->device_event == NULL || event->recorded_on == NULL) return event_synchronize(event);
        s->ctx->stream_ops->wait_event(s, event);
        return 0.0;
    }
    if (s->kind == STREAM_HOST) return event_synchronize(event);
    if (!event_query(event)) enqueue(s, (stream_task){.kind = TASK_WAIT, .event = event});
    return 0.0;
}

void stream_synchronize(stream *s) {
    if (s->device_ordered) {
        s->ctx->stream_ops->synchronize(s);
        return;
    }
    if (s->kind == STREAM_HOST) return;
    pthread_mutex_lock(&s->mutex);
    while (s->count > 0) pthread_cond_wait(&s->done, &s->mutex);
    pthread_mutex_unlock(&s->mutex);
}

int stream_progress(context *ctx, stream *s, int count, MPI_Request *requests) {
    return world_poll(ctx, s == NULL || s->kind == STREAM_HOST ? NULL : &s->host_waiting, count, requests);
}
