/* runtime.cpp — the CUDA emulator's runtime and cuBLAS (see cuda_runtime.h here for what it models and what not):
 * GPU memory as guarded host pages, synchronous copies checked against their kind, streams and events as checked
 * handles, the GEMMs through OpenBLAS. */
#include <cblas.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include "core/memory/mem.h" /* mem_host_info: the host's memory (linked beside this file into the emulated build) */
}

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "cublas_v2.h"
#include "core/base/kernel_math.h"

namespace {
const uint32_t LIVE = 0x6c697665, DEAD = 0x64656164; /* a handle's magic before and after its destroy */

struct block {
    size_t bytes;  /* asked for */
    size_t mapped; /* whole pages (device blocks) */
    int device;    /* 1: cudaMalloc, 0: cudaMallocHost */
};
std::mutex memory_lock; /* blocks, open_count */
std::map<uintptr_t, block> blocks;
int open_count = 0; /* device_access_begin's not yet ended */
thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

size_t page_size() { return (size_t)sysconf(_SC_PAGESIZE); }

/* The block that holds [ptr, ptr + bytes) whole, or NULL. With memory_lock held. */
const block *find_locked(const void *ptr, size_t bytes, uintptr_t *start) {
    uintptr_t p = (uintptr_t)ptr;
    auto it = blocks.upper_bound(p);
    if (it == blocks.begin()) return NULL;
    --it;
    if (p - it->first > it->second.bytes || bytes > it->second.bytes - (p - it->first)) return NULL;
    if (start != NULL) *start = it->first;
    return &it->second;
}

/* Whether ptr is inside some cudaMalloc block (one byte: where a host pointer must not be). */
int in_device(const void *ptr) {
    std::lock_guard<std::mutex> guard(memory_lock);
    const block *b = find_locked(ptr, 1, NULL);
    return b != NULL && b->device;
}

void protect_all_locked(int prot) {
    for (auto &entry : blocks)
        if (entry.second.device && mprotect((void *)entry.first, entry.second.mapped, prot) != 0) {
            perror("cuda emulator: mprotect");
            abort();
        }
}

/* Host code touched GPU memory: say so with a backtrace (the faulting frame is the culprit), then die. */
void on_segv(int sig, siginfo_t *info, void *) {
    char message[160];
    int n = snprintf(message, sizeof message,
                     "cuda emulator: SIGSEGV at %p: host code read or wrote GPU memory (or a wild pointer); "
                     "backtrace:\n", info->si_addr);
    if (write(2, message, (size_t)n) < 0) _exit(128 + sig);
    void *frames[48];
    backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

void install_segv_handler_once() {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = on_segv;
        action.sa_flags = SA_SIGINFO | SA_RESETHAND;
        sigaction(SIGSEGV, &action, NULL);
    });
}

double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int devices() {
    const char *text = getenv("CUDA_EMULATOR_DEVICES");
    int n = text != NULL ? atoi(text) : 1;
    return n > 0 ? n : 1;
}
/* Host waits, counted (CUDA_EMULATOR_SYNC_LOG=path: at exit each process appends one line to the file): every call
 * that makes the host wait for a GPU (a stream's, an event's or the device's synchronize) is one, whether or not
 * the emulator had anything to wait for, so a run counts the waits a GPU would have. The line ends with the
 * process's kernel launches and cuBLAS calls (emulator_work_count), then its copies within the GPU's memory and fills
 * of it (cudaMemcpyAsync device to device, cudaMemsetAsync: work a GPU does between kernels, not counted as
 * launches) and their bytes, then its stops: the host's looks at the GPU's progress (the synchronizes above and every
 * cudaEventQuery: a host that polls an event until it completes waits as a synchronize does, which this synchronous
 * emulator cannot tell apart) made while work queued since its previous look was still to run; repeated looks with
 * nothing queued between them count once. A step whose host never stops until its end keeps the GPU's queue full.
 * Last, its GEMMs: the cuBLAS calls among the launches (PROFILE_KERNELS' table counts them apart). */
enum { SYNC_STREAM, SYNC_EVENT, SYNC_DEVICE, SYNC_KINDS };
std::atomic<long> sync_counts[SYNC_KINDS];
std::atomic<long> device_copies, host_stops, gemm_calls;
std::atomic<unsigned long long> device_copy_bytes;
void count_device_copy(size_t bytes) {
    device_copies++;
    device_copy_bytes += bytes;
}
} // namespace
extern "C" std::atomic<unsigned long long> emulator_works; /* below: emulator_work_count's */
namespace {
std::atomic<unsigned long long> queued_at_last_look{0};
/* A look at the GPU's progress: a stop when work (launches, copies within its memory) was queued since the last. */
void count_host_look() {
    unsigned long long queued = emulator_works.load() + (unsigned long long)device_copies.load();
    if (queued_at_last_look.exchange(queued) != queued) host_stops++;
}
struct sync_report {
    ~sync_report() {
        const char *path = getenv("CUDA_EMULATOR_SYNC_LOG");
        if (path == NULL || path[0] == '\0') return;
        FILE *file = fopen(path, "a");
        if (file == NULL) return;
        fprintf(file, "pid %d: cudaStreamSynchronize %ld cudaEventSynchronize %ld cudaDeviceSynchronize %ld "
                "launches %llu copies %ld bytes %llu stops %ld gemms %ld\n", (int)getpid(),
                sync_counts[SYNC_STREAM].load(), sync_counts[SYNC_EVENT].load(), sync_counts[SYNC_DEVICE].load(),
                emulator_works.load(), device_copies.load(), device_copy_bytes.load(), host_stops.load(),
                gemm_calls.load());
        fclose(file);
    }
} sync_reporter;
} // namespace

struct CUstream_st {
    uint32_t magic;
};
struct CUevent_st {
    uint32_t magic;
    int recorded;
    int no_timing;
    double time_ms;
};
struct cublasContext {
    uint32_t magic;
    cudaStream_t stream;
    cublasMath_t mode;
};

int emulator_stream_ok(cudaStream_t s) { return s == NULL || s->magic == LIVE; }
static int event_ok(cudaEvent_t e) { return e != NULL && e->magic == LIVE; }

extern "C" {

cudaError_t emulator_fail(cudaError_t err, const char *what) {
    last_error = err;
    if (getenv("CUDA_EMULATOR_VERBOSE") != NULL)
        fprintf(stderr, "cuda emulator: %s: %s\n", what, cudaGetErrorName(err));
    return err;
}

void emulator_device_access_begin(void) {
    std::lock_guard<std::mutex> guard(memory_lock);
    if (open_count++ == 0) protect_all_locked(PROT_READ | PROT_WRITE);
}

void emulator_device_access_end(void) {
    std::lock_guard<std::mutex> guard(memory_lock);
    if (--open_count == 0) protect_all_locked(PROT_NONE);
}

int emulator_is_device(const void *ptr, size_t bytes) {
    std::lock_guard<std::mutex> guard(memory_lock);
    const block *b = find_locked(ptr, bytes ? bytes : 1, NULL);
    return b != NULL && b->device;
}

const char *cudaGetErrorName(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (emulator: a pointer is not "
                                         "where the call's kind says, or its bytes pass its block's end)";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError(void) {
    cudaError_t error = last_error;
    last_error = cudaSuccess;
    return error;
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = devices();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= devices()) return emulator_fail(cudaErrorInvalidDevice, "cudaSetDevice");
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    sync_counts[SYNC_DEVICE]++;
    count_host_look();
    return cudaSuccess;
}


/* CUDA_EMULATOR_MEMORY: each emulated GPU's bytes (0: not set). */
static size_t emulated_memory(void) {
    const char *text = getenv("CUDA_EMULATOR_MEMORY");
    return text != NULL && *text != '\0' ? strtoull(text, NULL, 10) : 0;
}

/* The bytes of this process's live cudaMalloc blocks (whole pages). With memory_lock held. */
static size_t device_bytes_locked(void) {
    size_t used = 0;
    for (auto &entry : blocks)
        if (entry.second.device) used += entry.second.mapped;
    return used;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    size_t host = 0, host_total = 0, used;
    (void)mem_host_info(&host, &host_total);
    size_t total = emulated_memory() > 0 ? emulated_memory() : host_total;
    if (total == 0) return emulator_fail(cudaErrorInvalidValue, "cudaMemGetInfo (no MemTotal, CUDA_EMULATOR_MEMORY)");
    {
        std::lock_guard<std::mutex> guard(memory_lock);
        used = device_bytes_locked();
    }
    size_t free = used < total ? total - used : 0;
    *free_bytes = host < free ? host : free;
    *total_bytes = total;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    *ptr = NULL;
    if (bytes == 0) return cudaSuccess;
    install_segv_handler_once();
    size_t page = page_size(), mapped = (bytes + page - 1) / page * page, limit = emulated_memory();
    if (limit > 0) { /* a GPU of CUDA_EMULATOR_MEMORY bytes: refused beyond it, as a full GPU refuses */
        std::lock_guard<std::mutex> guard(memory_lock);
        if (device_bytes_locked() + mapped > limit)
            return emulator_fail(cudaErrorMemoryAllocation, "cudaMalloc (beyond CUDA_EMULATOR_MEMORY)");
    }
    void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return emulator_fail(cudaErrorMemoryAllocation, "cudaMalloc");
    memset(p, 0xff, mapped); /* fresh GPU memory holds garbage: here a NaN in every float */
    std::lock_guard<std::mutex> guard(memory_lock);
    blocks[(uintptr_t)p] = block{bytes, mapped, 1};
    if (open_count == 0 && mprotect(p, mapped, PROT_NONE) != 0) {
        perror("cuda emulator: mprotect");
        abort();
    }
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    if (ptr == NULL) return cudaSuccess;
    std::lock_guard<std::mutex> guard(memory_lock);
    auto it = blocks.find((uintptr_t)ptr);
    if (it == blocks.end() || !it->second.device) return emulator_fail(cudaErrorInvalidValue, "cudaFree");
    munmap(ptr, it->second.mapped);
    blocks.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes) {
    *ptr = malloc(bytes ? bytes : 1);
    if (*ptr == NULL) return emulator_fail(cudaErrorMemoryAllocation, "cudaMallocHost");
    std::lock_guard<std::mutex> guard(memory_lock);
    blocks[(uintptr_t)*ptr] = block{bytes, 0, 0};
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
    if (ptr == NULL) return cudaSuccess;
    std::lock_guard<std::mutex> guard(memory_lock);
    auto it = blocks.find((uintptr_t)ptr);
    if (it == blocks.end() || it->second.device) return emulator_fail(cudaErrorInvalidValue, "cudaFreeHost");
    blocks.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream) {
    if (!emulator_stream_ok(stream)) return emulator_fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync's stream");
    if (bytes == 0) return cudaSuccess;
    int dst_device = emulator_is_device(dst, bytes), src_device = emulator_is_device(src, bytes);
    int dst_host = !in_device(dst), src_host = !in_device(src);
    int ok = 0;
    switch (kind) {
    case cudaMemcpyHostToHost: ok = dst_host && src_host; break;
    case cudaMemcpyHostToDevice: ok = dst_device && src_host; break;
    case cudaMemcpyDeviceToHost: ok = dst_host && src_device; break;
    case cudaMemcpyDeviceToDevice: ok = dst_device && src_device; break;
    case cudaMemcpyDefault: ok = (dst_device || dst_host) && (src_device || src_host); break;
    }
    if (!ok) {
        fprintf(stderr, "cuda emulator: cudaMemcpyAsync kind %d of %zu bytes from %p (%s) to %p (%s)\n", (int)kind,
                bytes, src, src_device ? "GPU" : src_host ? "host" : "past a GPU block's end", dst,
                dst_device ? "GPU" : dst_host ? "host" : "past a GPU block's end");
        void *frames[24];
        backtrace_symbols_fd(frames, backtrace(frames, 24), 2);
        return emulator_fail(cudaErrorIllegalAddress, "cudaMemcpyAsync");
    }
    if (dst_device && src_device) count_device_copy(bytes);
    emulator_device_access_begin();
    memmove(dst, src, bytes);
    emulator_device_access_end();
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream) {
    if (!emulator_stream_ok(stream)) return emulator_fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync's stream");
    if (bytes == 0) return cudaSuccess;
    if (!emulator_is_device(ptr, bytes)) {
        fprintf(stderr, "cuda emulator: cudaMemsetAsync of %zu bytes at %p: not inside one GPU block\n", bytes, ptr);
        return emulator_fail(cudaErrorIllegalAddress, "cudaMemsetAsync");
    }
    count_device_copy(bytes);
    emulator_device_access_begin();
    memset(ptr, value, bytes);
    emulator_device_access_end();
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags) {
    (void)flags;
    *stream = (cudaStream_t)calloc(1, sizeof **stream);
    if (*stream == NULL) return emulator_fail(cudaErrorMemoryAllocation, "cudaStreamCreateWithFlags");
    (*stream)->magic = LIVE;
    return cudaSuccess;
}

/* A destroyed handle stays allocated (marked dead), so a later use is seen, not undefined. */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (stream == NULL || stream->magic != LIVE)
        return emulator_fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy");
    stream->magic = DEAD;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    sync_counts[SYNC_STREAM]++;
    count_host_look();
    return emulator_stream_ok(stream) ? cudaSuccess
                                      : emulator_fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize");
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
    (void)flags;
    if (!emulator_stream_ok(stream) || !event_ok(event))
        return emulator_fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent");
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    *event = (cudaEvent_t)calloc(1, sizeof **event);
    if (*event == NULL) return emulator_fail(cudaErrorMemoryAllocation, "cudaEventCreate");
    (*event)->magic = LIVE;
    return cudaSuccess;
}

/* cudaEventDisableTiming: such an event cannot be given to cudaEventElapsedTime (CUDA refuses it; so does this). */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags) {
    if (flags & ~(unsigned)cudaEventDisableTiming)
        return emulator_fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags");
    cudaError_t status = cudaEventCreate(event);
    if (status == cudaSuccess) (*event)->no_timing = (flags & cudaEventDisableTiming) != 0;
    return status;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (!event_ok(event)) return emulator_fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy");
    event->magic = DEAD;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event_ok(event) || !emulator_stream_ok(stream))
        return emulator_fail(cudaErrorInvalidResourceHandle, "cudaEventRecord");
    event->recorded = 1;
    event->time_ms = now_ms();
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    count_host_look();
    return event_ok(event) ? cudaSuccess : emulator_fail(cudaErrorInvalidResourceHandle, "cudaEventQuery");
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    sync_counts[SYNC_EVENT]++;
    count_host_look();
    return event_ok(event) ? cudaSuccess : emulator_fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize");
}

/* Both must have been recorded (CUDA: cudaErrorInvalidResourceHandle otherwise). */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!event_ok(start) || !event_ok(end) || !start->recorded || !end->recorded || start->no_timing ||
        end->no_timing)
        return emulator_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime");
    *ms = (float)(end->time_ms - start->time_ms);
    return cudaSuccess;
}

/* ---- cuBLAS ---- */

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    *handle = (cublasHandle_t)calloc(1, sizeof **handle);
    if (*handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    (*handle)->magic = LIVE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (handle == NULL || handle->magic != LIVE) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = DEAD;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    if (handle == NULL || handle->magic != LIVE) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!emulator_stream_ok(stream)) return CUBLAS_STATUS_INVALID_VALUE;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (handle == NULL || handle->magic != LIVE) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the handle is not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute (emulator: an operand is not in GPU "
                                                "memory, or passes its block's end)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported (emulator: GemmEx computes "
                                             "float32 operands under CUBLAS_COMPUTE_32F or _32F_FAST_16BF, bfloat16 "
                                             "ones under CUBLAS_COMPUTE_32F only)";
    }
    return "unknown status";
}

/* The elements a column-major (rows, cols) operand with leading dimension ld spans. */
static size_t operand_elements(int rows, int cols, int ld) {
    if (rows == 0 || cols == 0) return 0;
    return (size_t)ld * (size_t)(cols - 1) + (size_t)rows;
}

/* cuBLAS's checks of a GEMM's sizes: none negative, each leading dimension at least its operand's rows and 1. */
static int gemm_sizes_valid(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, int lda, int ldb,
                            int ldc) {
    return m >= 0 && n >= 0 && k >= 0 && lda >= (transa == CUBLAS_OP_N ? m : k) && lda >= 1 &&
           ldb >= (transb == CUBLAS_OP_N ? k : n) && ldb >= 1 && ldc >= m && ldc >= 1;
}

std::atomic<unsigned long long> emulator_works{0};

unsigned long long emulator_work_count(void) { return emulator_works.load(); }

unsigned long long emulator_host_stop_count(void) { return (unsigned long long)host_stops.load(); }

/* One column-major GEMM as cuBLAS means it, through cblas_sgemm; `call` names the cuBLAS function for messages. */
static cublasStatus_t gemm(const char *call, cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc) {
    if (handle == NULL || handle->magic != LIVE) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!gemm_sizes_valid(transa, transb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    size_t a = operand_elements(transa == CUBLAS_OP_N ? m : k, transa == CUBLAS_OP_N ? k : m, lda) * sizeof(float);
    size_t b = operand_elements(transb == CUBLAS_OP_N ? k : n, transb == CUBLAS_OP_N ? n : k, ldb) * sizeof(float);
    if ((a > 0 && !emulator_is_device(A, a)) || (b > 0 && !emulator_is_device(B, b)) ||
        !emulator_is_device(C, operand_elements(m, n, ldc) * sizeof(float))) {
        fprintf(stderr, "cuda emulator: %s (m %d, n %d, k %d): an operand is not inside one GPU block\n", call, m, n,
                k);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    emulator_device_access_begin();
    cblas_sgemm(CblasColMajor, transa == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                transb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
    emulator_device_access_end();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc) {
    emulator_works++, gemm_calls++;
    return gemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long strideA, const float *B, int ldb, long long strideB,
                                         const float *beta, float *C, int ldc, long long strideC, int batch) {
    emulator_works++, gemm_calls++;
    if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < batch; i++) {
        cublasStatus_t status = gemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha,
                                     A + i * strideA, lda, B + i * strideB, ldb, beta, C + i * strideC, ldc);
        if (status != CUBLAS_STATUS_SUCCESS) return status;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* CUBLAS_COMPUTE_32F_FAST_16BF's premise: every element of the column-major operand `name` (op(X) is the GEMM's
 * rows x depth or depth x columns; X itself (rows, cols) with leading dimension ld) the call reads is a bfloat16
 * value, its low 16 bits zero. Aborts with the call, the batch, the operand, the element and its value, and a
 * backtrace (the caller's frame names the table function). With the GPU memory open. */
static void require_bfloat16(const char *call, int batch_index, const char *name, const float *X, int rows, int cols,
                             int ld, int m, int n, int k) {
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) {
            float value = X[(size_t)c * ld + r];
            uint32_t bits;
            memcpy(&bits, &value, sizeof bits);
            if ((bits & 0xffffu) == 0) continue;
            fprintf(stderr,
                    "cuda emulator: %s (m %d, n %d, k %d, batch %d) under CUBLAS_COMPUTE_32F_FAST_16BF: operand %s's "
                    "element (row %d, column %d; index %zu from its start) is %.9g (bits 0x%08x), not a bfloat16 "
                    "value: a GPU would round it to bfloat16 first, so the caller must have rounded it; backtrace:\n",
                    call, m, n, k, batch_index, name, r, c, (size_t)c * ld + r, (double)value, bits);
            void *frames[24];
            backtrace_symbols_fd(frames, backtrace(frames, 24), 2);
            abort();
        }
}

/* One bfloat16-storage GEMM (A and B CUDA_R_16BF; C CUDA_R_16BF or CUDA_R_32F) under CUBLAS_COMPUTE_32F, as a GPU
 * computes it: the products of bfloat16 values (exact in float32) summed in float32, alpha and beta in float32, and a
 * bfloat16 C written rounded to nearest even. Here A, B and a bfloat16 C (beta reads it) are widened, exactly, into
 * float32 copies of the same layout, sgemm runs on those, and a bfloat16 C gets its result rounded with
 * kernel_math.h's km_bf16_from_float (the rounding of the project's kernels, c10::BFloat16's). */
static cublasStatus_t gemm_bf16(const char *call, cublasHandle_t handle, cublasOperation_t transa,
                                cublasOperation_t transb, int m, int n, int k, const float *alpha, const uint16_t *A,
                                int lda, const uint16_t *B, int ldb, const float *beta, void *C, cudaDataType Ctype,
                                int ldc) {
    if (!gemm_sizes_valid(transa, transb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    size_t a = operand_elements(transa == CUBLAS_OP_N ? m : k, transa == CUBLAS_OP_N ? k : m, lda);
    size_t b = operand_elements(transb == CUBLAS_OP_N ? k : n, transb == CUBLAS_OP_N ? n : k, ldb);
    size_t c = operand_elements(m, n, ldc), c_size = Ctype == CUDA_R_16BF ? 2 : 4;
    if ((a > 0 && !emulator_is_device(A, a * 2)) || (b > 0 && !emulator_is_device(B, b * 2)) ||
        !emulator_is_device(C, c * c_size)) {
        fprintf(stderr, "cuda emulator: %s (m %d, n %d, k %d, bfloat16 storage): an operand is not inside one GPU "
                        "block\n", call, m, n, k);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    std::vector<float> wide_a(a), wide_b(b), wide_c(c);
    emulator_device_access_begin();
    for (size_t i = 0; i < a; i++) wide_a[i] = km_bf16_to_float(A[i]);
    for (size_t i = 0; i < b; i++) wide_b[i] = km_bf16_to_float(B[i]);
    for (size_t i = 0; i < c; i++)
        wide_c[i] = Ctype == CUDA_R_16BF ? km_bf16_to_float(((const uint16_t *)C)[i]) : ((const float *)C)[i];
    cblas_sgemm(CblasColMajor, transa == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                transb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, m, n, k, *alpha, wide_a.data(), lda,
                wide_b.data(), ldb, *beta, wide_c.data(), ldc);
    /* only the m rows of each column: the elements between columns (ld > m) are not C's and stay as they are */
    for (int column = 0; column < n; column++)
        for (int row = 0; row < m; row++) {
            size_t at = (size_t)column * ldc + row;
            if (Ctype == CUDA_R_16BF) ((uint16_t *)C)[at] = km_bf16_from_float(wide_c[at]);
            else ((float *)C)[at] = wide_c[at];
        }
    emulator_device_access_end();
    return CUBLAS_STATUS_SUCCESS;
}

/* The Ex GEMMs: the types and the compute type checked (float32 storage under COMPUTE_32F or FAST_16BF, or bfloat16
 * storage under COMPUTE_32F), then per batch the bfloat16 premise (under FAST_16BF) and the float32 GEMM, or the
 * bfloat16-storage GEMM. */
static cublasStatus_t gemm_ex(const char *call, cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const void *alpha, const void *A,
                              cudaDataType Atype, int lda, long long strideA, const void *B, cudaDataType Btype,
                              int ldb, long long strideB, const void *beta, void *C, cudaDataType Ctype, int ldc,
                              long long strideC, int batch, cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    if (handle == NULL || handle->magic != LIVE) return CUBLAS_STATUS_NOT_INITIALIZED;
    int float32 = Atype == CUDA_R_32F && Btype == CUDA_R_32F && Ctype == CUDA_R_32F &&
                  (computeType == CUBLAS_COMPUTE_32F || computeType == CUBLAS_COMPUTE_32F_FAST_16BF);
    int bfloat16 = Atype == CUDA_R_16BF && Btype == CUDA_R_16BF && (Ctype == CUDA_R_16BF || Ctype == CUDA_R_32F) &&
                   computeType == CUBLAS_COMPUTE_32F;
    if (!(float32 || bfloat16) || algo != CUBLAS_GEMM_DEFAULT) {
        fprintf(stderr,
                "cuda emulator: %s: types A %d, B %d, C %d, compute type %d, algorithm %d: the emulator computes "
                "CUDA_R_32F operands under CUBLAS_COMPUTE_32F or CUBLAS_COMPUTE_32F_FAST_16BF, and CUDA_R_16BF A and B "
                "(C CUDA_R_16BF or CUDA_R_32F) under CUBLAS_COMPUTE_32F, with CUBLAS_GEMM_DEFAULT only\n",
                call, (int)Atype, (int)Btype, (int)Ctype, (int)computeType, (int)algo);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; bfloat16 && i < batch; i++) {
        size_t c_size = Ctype == CUDA_R_16BF ? 2 : 4;
        cublasStatus_t status = gemm_bf16(call, handle, transa, transb, m, n, k, (const float *)alpha,
                                          (const uint16_t *)A + i * strideA, lda, (const uint16_t *)B + i * strideB,
                                          ldb, (const float *)beta, (char *)C + (size_t)i * strideC * c_size, Ctype,
                                          ldc);
        if (status != CUBLAS_STATUS_SUCCESS) return status;
    }
    for (int i = 0; float32 && i < batch; i++) {
        const float *a = (const float *)A + i * strideA, *b = (const float *)B + i * strideB;
        if (computeType == CUBLAS_COMPUTE_32F_FAST_16BF && m > 0 && n > 0 && k > 0) {
            /* Check the bounds first (the same as gemm's), so the reads below stay inside GPU memory. */
            if (!gemm_sizes_valid(transa, transb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
            size_t a_bytes = sizeof(float) *
                             operand_elements(transa == CUBLAS_OP_N ? m : k, transa == CUBLAS_OP_N ? k : m, lda);
            size_t b_bytes = sizeof(float) *
                             operand_elements(transb == CUBLAS_OP_N ? k : n, transb == CUBLAS_OP_N ? n : k, ldb);
            if (!emulator_is_device(a, a_bytes) || !emulator_is_device(b, b_bytes)) {
                fprintf(stderr, "cuda emulator: %s (m %d, n %d, k %d, batch %d): an operand is not inside one GPU "
                                "block\n", call, m, n, k, i);
                return CUBLAS_STATUS_EXECUTION_FAILED;
            }
            emulator_device_access_begin();
            require_bfloat16(call, i, "A", a, transa == CUBLAS_OP_N ? m : k, transa == CUBLAS_OP_N ? k : m, lda, m,
                             n, k);
            require_bfloat16(call, i, "B", b, transb == CUBLAS_OP_N ? k : n, transb == CUBLAS_OP_N ? n : k, ldb, m,
                             n, k);
            emulator_device_access_end();
        }
        cublasStatus_t status = gemm(call, handle, transa, transb, m, n, k, (const float *)alpha, a, lda, b, ldb,
                                     (const float *)beta, (float *)C + i * strideC, ldc);
        if (status != CUBLAS_STATUS_SUCCESS) return status;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    emulator_works++, gemm_calls++;
    return gemm_ex("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta,
                   C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long strideB, const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
    emulator_works++, gemm_calls++;
    return gemm_ex("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
                   Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo);
}

} // extern "C"
