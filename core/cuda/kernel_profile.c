/* kernel_profile.c — PROFILE_KERNELS=1's event pairs and their totals (kernel_profile.h). */
#include "core/cuda/kernel_profile.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda_check.h"

/* One call of the current step: its label and sizes, and its pair of events (made on first use, kept). */
typedef struct profile_call {
    const char *label;
    int m, n, k;
    cudaEvent_t start, end;
} profile_call;

/* One kind of work: its name (the label up to '(', without "_launch") and sizes, and what its calls took. */
typedef struct profile_total {
    char name[64];
    int m, n, k;
    unsigned long long calls;
    double ms;
} profile_total;

struct cuda_kernel_profile {
    int rank;
    pthread_t owner;              /* the thread that records (the one that made the device) */
    profile_call *calls;          /* this step's, calls[0 .. call_count); events kept up to call_capacity */
    size_t call_count, call_capacity;
    profile_total *totals;
    size_t total_count, total_capacity;
    int collections;              /* step ends seen: the steps counted are all but the first */
};

/* Out of host memory: says for what, then ends the run as a failed CUDA call does (naming the rank). */
static void profile_fatal(int rank, const char *what) {
    fprintf(stderr, "rank %d: PROFILE_KERNELS: %s: out of host memory\n", rank, what);
    CUDA_CHECK(rank, cudaErrorMemoryAllocation);
}

cuda_kernel_profile *cuda_profile_create(int rank) {
    cuda_kernel_profile *profile = calloc(1, sizeof *profile);
    if (profile == NULL) profile_fatal(rank, "its state");
    profile->rank = rank;
    profile->owner = pthread_self();
    return profile;
}

void cuda_profile_destroy(cuda_kernel_profile *profile) {
    if (profile == NULL) return;
    for (size_t i = 0; i < profile->call_capacity; i++) {
        if (profile->calls[i].start != NULL) CUDA_CHECK(profile->rank, cudaEventDestroy(profile->calls[i].start));
        if (profile->calls[i].end != NULL) CUDA_CHECK(profile->rank, cudaEventDestroy(profile->calls[i].end));
    }
    free(profile->calls);
    free(profile->totals);
    free(profile);
}

int cuda_profile_begin(cuda_kernel_profile *profile, cudaStream_t stream) {
    if (profile == NULL || !pthread_equal(profile->owner, pthread_self())) return -1;
    if (profile->call_count == profile->call_capacity) {
        size_t capacity = profile->call_capacity ? 2 * profile->call_capacity : 1024;
        profile_call *grown = realloc(profile->calls, capacity * sizeof *grown);
        if (grown == NULL) profile_fatal(profile->rank, "its event pairs");
        memset(grown + profile->call_capacity, 0, (capacity - profile->call_capacity) * sizeof *grown);
        profile->calls = grown;
        profile->call_capacity = capacity;
    }
    profile_call *call = &profile->calls[profile->call_count];
    if (call->start == NULL) CUDA_CHECK(profile->rank, cudaEventCreate(&call->start));
    if (call->end == NULL) CUDA_CHECK(profile->rank, cudaEventCreate(&call->end));
    CUDA_CHECK(profile->rank, cudaEventRecord(call->start, stream));
    call->label = NULL; /* until its end */
    return (int)profile->call_count++;
}

void cuda_profile_end(cuda_kernel_profile *profile, int mark, cudaStream_t stream, const char *label, int m, int n,
                      int k) {
    if (mark < 0) return;
    profile_call *call = &profile->calls[mark];
    CUDA_CHECK(profile->rank, cudaEventRecord(call->end, stream));
    call->label = label, call->m = m, call->n = n, call->k = k;
}

/* "round_to_bf16_launch(out, n, s->compute)" -> "round_to_bf16"; a label without '(' is its own name. */
static void call_name(const char *label, char *name, size_t size) {
    size_t length = strcspn(label, "(");
    static const char suffix[] = "_launch";
    size_t suffix_length = sizeof suffix - 1;
    if (length > suffix_length && strncmp(label + length - suffix_length, suffix, suffix_length) == 0)
        length -= suffix_length;
    if (length >= size) length = size - 1;
    memcpy(name, label, length);
    name[length] = '\0';
}

static profile_total *total_for(cuda_kernel_profile *profile, const profile_call *call) {
    char name[64];
    call_name(call->label, name, sizeof name);
    for (size_t i = 0; i < profile->total_count; i++) {
        profile_total *total = &profile->totals[i];
        if (total->m == call->m && total->n == call->n && total->k == call->k && strcmp(total->name, name) == 0)
            return total;
    }
    if (profile->total_count == profile->total_capacity) {
        size_t capacity = profile->total_capacity ? 2 * profile->total_capacity : 64;
        profile_total *grown = realloc(profile->totals, capacity * sizeof *grown);
        if (grown == NULL) profile_fatal(profile->rank, "its totals");
        profile->totals = grown;
        profile->total_capacity = capacity;
    }
    profile_total *total = &profile->totals[profile->total_count++];
    *total = (profile_total){.m = call->m, .n = call->n, .k = call->k};
    memcpy(total->name, name, sizeof total->name);
    return total;
}

cudaEvent_t cuda_profile_last_event(const cuda_kernel_profile *profile) {
    return profile->call_count > 0 ? profile->calls[profile->call_count - 1].end : NULL;
}

void cuda_profile_collect(cuda_kernel_profile *profile) {
    if (profile->collections++ > 0) { /* not the first step's */
        for (size_t i = 0; i < profile->call_count; i++) {
            const profile_call *call = &profile->calls[i];
            if (call->label == NULL) continue; /* begun, not ended: none, unless a call aborted */
            float ms = 0.0f;
            CUDA_CHECK(profile->rank, cudaEventElapsedTime(&ms, call->start, call->end));
            profile_total *total = total_for(profile, call);
            total->calls++;
            total->ms += ms;
        }
    }
    profile->call_count = 0;
}

static int by_time(const void *a, const void *b) {
    double x = ((const profile_total *)a)->ms, y = ((const profile_total *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

int cuda_profile_write(const cuda_kernel_profile *profile, const char *path, const char *title, char *error,
                       size_t error_size) {
    FILE *file = fopen(path, "w");
    if (file == NULL) {
        snprintf(error, error_size, "rank %d: PROFILE_KERNELS: cannot write %s: %s", profile->rank, path,
                 strerror(errno));
        return -1;
    }
    size_t count = profile->total_count;
    profile_total *sorted = malloc((count ? count : 1) * sizeof *sorted);
    if (sorted == NULL) profile_fatal(profile->rank, "its table");
    if (count > 0) memcpy(sorted, profile->totals, count * sizeof *sorted);
    qsort(sorted, count, sizeof *sorted, by_time);
    int counted = profile->collections > 0 ? profile->collections - 1 : 0;
    double steps = counted > 0 ? (double)counted : 1.0, all_ms = 0.0, all_calls = 0.0;
    for (size_t i = 0; i < count; i++) all_ms += sorted[i].ms, all_calls += (double)sorted[i].calls;
    fprintf(file, "# %s\n# %d steps (the first left out); per step: calls, GPU milliseconds, share of the total\n",
            title, counted);
    fprintf(file, "%-48s %10s %12s %7s\n", "work (m x n x k for a GEMM)", "calls", "ms", "share");
    for (size_t i = 0; i < count; i++) {
        char label[96];
        if (sorted[i].m || sorted[i].n || sorted[i].k)
            snprintf(label, sizeof label, "%s %dx%dx%d", sorted[i].name, sorted[i].m, sorted[i].n, sorted[i].k);
        else
            snprintf(label, sizeof label, "%s", sorted[i].name);
        fprintf(file, "%-48s %10.6g %12.4f %6.1f%%\n", label, (double)sorted[i].calls / steps, sorted[i].ms / steps,
                all_ms > 0.0 ? 100.0 * sorted[i].ms / all_ms : 0.0);
    }
    fprintf(file, "%-48s %10.6g %12.4f %6.1f%%\n", "total", all_calls / steps, all_ms / steps, 100.0);
    free(sorted);
    if (fclose(file) != 0) {
        snprintf(error, error_size, "rank %d: PROFILE_KERNELS: cannot write %s: %s", profile->rank, path,
                 strerror(errno));
        return -1;
    }
    return 0;
}
