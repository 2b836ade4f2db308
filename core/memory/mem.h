/* mem.h — the tracked allocator: every byte the runtime allocates, by category and owner.
 *
 * FSDP is a story about memory, so nothing in the core calls malloc directly: each block is allocated with a
 * category (what it is for, docs/architecture.md §6) and an owner (who holds it, e.g. "layers.3.flat_param"). The
 * tracker keeps live and peak bytes per category and in total, and writes an `alloc` / `free` event for each, so that
 * sum(alloc) - sum(free) in the trace is exactly the live bytes it reports.
 *
 * The bytes themselves come from the caching allocator (core/memory/allocator.h): `live` (allocated) bytes are what
 * callers asked for, `reserved` bytes the segments the allocator holds from the backend, cached blocks included. Both
 * have peaks; reserved - allocated is the cache plus fragmentation, the gap PyTorch's memory stats show.
 *
 * Two pools (CPU offload, lab 09): a tracker is one *device*'s memory. `ctx->mem` is the "device" pool, where
 * everything lives unless offloaded (on the CUDA build: cudaMalloc'd GPU memory); the "host" pool
 * (core/runtime/offload.h, on CUDA: pinned host memory) holds what CPUOffload(offload_params=True) moves off the
 * device: parameter shards, gradient shards, optimizer state. Each is its own caching allocator with its own live /
 * peak / reserved figures, and every event names its pool (`device`). A pool may have a budget (DEVICE_MEMORY_MB for
 * the device pool): a segment that would take reserved bytes past it fails like a cudaMalloc out of memory.
 *
 * Misuse aborts with a message that names the rank and the owner: freeing twice, freeing a pointer the tracker
 * never gave out. Blocks still live at mem_shutdown are listed as leaks. (The tracker's own bookkeeping table is
 * not counted: it is the ruler, not the thing measured.)
 */
#ifndef FSDPLAB_MEM_H
#define FSDPLAB_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "trace/trace.h"
#include "core/memory/allocator.h"
#include "core/base/dtype.h"

typedef enum mem_category {
    MEM_PARAM_SHARD,
    MEM_PARAM_UNSHARDED,
    MEM_GRAD_UNSHARDED,
    MEM_GRAD_SHARD,
    MEM_OPTIM_STATE,
    MEM_ACTIVATION,
    MEM_CHECKPOINT_INPUT,
    MEM_WORKSPACE,
    MEM_COMM_BUFFER,
    MEM_DATA,
    MEM_KV_CACHE,                 /* generation's keys and values of the positions so far (qwen2_kv_cache) */
    MEM_PARAM_SHARD_LOW_PRECISION, /* mixed precision: the local shard cast to param_dtype for the all-gather
                                      (torch's _mp_shard), from pre_unshard until the all-gather is done */
    MEM_CATEGORY_COUNT
} mem_category;

#define MEM_OWNER_MAX 96
#define MEM_RECENT_FREES 1024

typedef struct mem_block {
    void *ptr;
    size_t bytes;
    mem_category category;
    dtype dtype;                             /* what its elements are (the `alloc` event's dtype) */
    uint64_t id;
    allocator_block *block;                  /* the allocator's block that holds it */
    char owner[MEM_OWNER_MAX];
} mem_block;

#define MEM_DEVICE "device"           /* the pools' names in events (EVENTS.md `device`) */
#define MEM_HOST "host"

typedef struct mem_tracker {
    int rank;
    const char *device;                      /* MEM_DEVICE or MEM_HOST: which pool this tracker is */
    size_t budget;                           /* reserved bytes the pool may hold; 0: no limit */
    allocator_backend segments;              /* where segments come from: host memory, cudaMalloc, pinned memory */
    allocator_backend budget_backend;        /* `segments` behind the budget (segment_alloc checks it) */
    trace_sink *trace;                       /* may be NULL: no events */
    mem_block *live_blocks;                  /* unordered table of live blocks */
    size_t live_count, live_capacity;
    mem_block recent_frees[MEM_RECENT_FREES]; /* ring of the last frees, to tell a double free from a wild pointer */
    size_t recent_next;
    uint64_t next_id;
    size_t live_bytes, peak_bytes;
    size_t category_live_bytes[MEM_CATEGORY_COUNT];
    size_t category_peak_bytes[MEM_CATEGORY_COUNT];
    size_t reserved_bytes, peak_reserved_bytes; /* the allocator's segments */
    allocator allocator;
    const char *request_owner;               /* the request being served, for the segment events it causes */
    mem_category request_category;
    char error[512];                         /* the last misuse, for mem_try_free callers and tests */
} mem_tracker;

const char *mem_category_name(mem_category category);
/* Returns the category whose name is `name`, or -1. */
int mem_category_from_name(const char *name);

/* settings NULL: PyTorch's defaults (caching on, no max_split_size). Writes an `allocator` event with them. */
void mem_init(mem_tracker *tracker, int rank, trace_sink *trace, const allocator_settings *settings);
/* The same for a named pool (MEM_DEVICE, MEM_HOST) with a budget in bytes (0: none). mem_init is the device pool
 * without a budget. Exceeding the budget aborts as an out of memory does, naming the budget. */
void mem_init_pool(mem_tracker *tracker, int rank, trace_sink *trace, const allocator_settings *settings,
                   const char *device, size_t budget);
/* The same over another backend's segments (core/device/device.h: the CUDA device's cudaMalloc, pinned host memory). */
void mem_init_pool_on(mem_tracker *tracker, int rank, trace_sink *trace, const allocator_settings *settings,
                      const char *device, size_t budget, const allocator_backend *segments);
/* Zeroed block of `bytes` bytes. Aborts naming rank, owner and size when the system has no memory. */
void *mem_alloc(mem_tracker *tracker, size_t bytes, mem_category category, const char *owner);
/* Like mem_alloc but the contents are undefined: for buffers the caller overwrites completely (forward
 * activations), where zeroing would only cost time. */
void *mem_alloc_uninitialized(mem_tracker *tracker, size_t bytes, mem_category category, const char *owner);
/* The same with the elements' type named (the `alloc` event's dtype). mem_alloc's blocks are float32, except in
 * category data (int32: token ids). */
void *mem_alloc_typed(mem_tracker *tracker, size_t bytes, mem_category category, dtype type, const char *owner);
void *mem_alloc_uninitialized_typed(mem_tracker *tracker, size_t bytes, mem_category category, dtype type,
                                    const char *owner);
/* Frees a block from mem_alloc. NULL is a no-op (like free). Aborts on a double free or an unknown pointer. */
void mem_free(mem_tracker *tracker, void *ptr);
/* Like mem_free but returns -1 and fills tracker->error instead of aborting (tests use it). */
int mem_try_free(mem_tracker *tracker, void *ptr);
/* The block record of a live pointer, or NULL. */
const mem_block *mem_find(const mem_tracker *tracker, const void *ptr);
/* Starts a new peak window (e.g. a step): peaks restart from the bytes live (and reserved) now. */
void mem_reset_peak(mem_tracker *tracker);
/* The allocated peaks of the window so far (total and per category), to put back after work the window must not
 * count: lab 05's GRADS, a diagnostic outside FSDP that gathers every unit's gradient at once to write them. The
 * reserved peak is left as it is: the segments that work took stay in the cache, as torch's would. */
typedef struct mem_peaks {
    size_t peak_bytes;
    size_t category_peak_bytes[MEM_CATEGORY_COUNT];
} mem_peaks;
mem_peaks mem_peaks_now(const mem_tracker *tracker);
/* Puts saved peaks back; each stays at least the bytes live now. */
void mem_peaks_restore(mem_tracker *tracker, const mem_peaks *saved);
/* Gives every cached, unused segment back to the backend (torch.cuda.empty_cache). Returns the bytes released. */
size_t mem_empty_cache(mem_tracker *tracker);
/* Lists every live block on stderr as a leak (rank, owner, category, bytes), frees them, releases every segment
 * and returns the count of leaked blocks. */
size_t mem_shutdown(mem_tracker *tracker);

/* "12.3 MB", "4.0 KB", "17 B": binary-free SI-ish units, as the seed's log prints (1 MB = 1e6 bytes). */
const char *mem_format_bytes(size_t bytes, char *buffer, size_t buffer_size);

/* The host's memory: *available = MemAvailable (what the kernel can hand out without swapping), *total = MemTotal,
 * from /proc/meminfo, or the free and all physical pages where there is no /proc. Returns -1 (both 0) when neither
 * says. The CPU device's memory_info, and the memory model's check of the host pool beside a GPU's. */
int mem_host_info(size_t *available, size_t *total);

#endif
