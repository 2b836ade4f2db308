/* test_mem.c — the tracked allocator: accounting per category, peaks, misuse reported with the owner's name,
 * leaks listed at shutdown, and alloc/free events whose running sums equal the live bytes. No MPI needed. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <signal.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/memory/mem.h"
#include "check_main.h"

START_TEST(test_live_and_peak_by_category) {
    mem_tracker tracker;
    mem_init(&tracker, 0, NULL, NULL);
    char *shard = mem_alloc(&tracker, 100, MEM_PARAM_SHARD, "unit.shard");
    char *full = mem_alloc(&tracker, 400, MEM_PARAM_UNSHARDED, "unit.full");
    ck_assert_uint_eq(tracker.live_bytes, 500);
    ck_assert_uint_eq(tracker.category_live_bytes[MEM_PARAM_SHARD], 100);
    ck_assert_uint_eq(tracker.category_live_bytes[MEM_PARAM_UNSHARDED], 400);
    for (int i = 0; i < 400; i++) ck_assert_int_eq(full[i], 0); /* zeroed */
    mem_free(&tracker, full);
    ck_assert_uint_eq(tracker.live_bytes, 100);
    ck_assert_uint_eq(tracker.peak_bytes, 500);
    ck_assert_uint_eq(tracker.category_peak_bytes[MEM_PARAM_UNSHARDED], 400);
    ck_assert_uint_eq(tracker.category_live_bytes[MEM_PARAM_UNSHARDED], 0);
    mem_reset_peak(&tracker);
    ck_assert_uint_eq(tracker.peak_bytes, 100);
    ck_assert_uint_eq(tracker.category_peak_bytes[MEM_PARAM_UNSHARDED], 0);
    ck_assert_ptr_nonnull(mem_find(&tracker, shard));
    ck_assert_str_eq(mem_find(&tracker, shard)->owner, "unit.shard");
    mem_free(&tracker, shard);
    ck_assert_uint_eq(mem_shutdown(&tracker), 0);
}
END_TEST

/* GRADS' dump: peaks saved before work the window must not count, put back after it; a block still live then keeps
 * its bytes in the peaks */
START_TEST(test_peaks_restored_around_uncounted_work) {
    mem_tracker tracker;
    mem_init(&tracker, 0, NULL, NULL);
    void *activation = mem_alloc(&tracker, 300, MEM_ACTIVATION, "layer.saved");
    mem_free(&tracker, activation);
    void *shard = mem_alloc(&tracker, 100, MEM_PARAM_SHARD, "unit.shard");
    mem_peaks before = mem_peaks_now(&tracker);
    ck_assert_uint_eq(before.peak_bytes, 300);
    void *dump = mem_alloc(&tracker, 1000, MEM_GRAD_UNSHARDED, "unit.full_grad_padded");
    ck_assert_uint_eq(tracker.peak_bytes, 1100);
    mem_free(&tracker, dump);
    mem_peaks_restore(&tracker, &before);
    ck_assert_uint_eq(tracker.peak_bytes, 300);
    ck_assert_uint_eq(tracker.category_peak_bytes[MEM_GRAD_UNSHARDED], 0);
    ck_assert_uint_eq(tracker.category_peak_bytes[MEM_ACTIVATION], 300);
    ck_assert_uint_eq(tracker.category_peak_bytes[MEM_PARAM_SHARD], 100);
    /* a block allocated in between and still live: the restored peaks hold it */
    before = mem_peaks_now(&tracker);
    void *kept = mem_alloc(&tracker, 500, MEM_GRAD_SHARD, "unit.grad_shard");
    mem_peaks_restore(&tracker, &before);
    ck_assert_uint_eq(tracker.peak_bytes, 600);
    ck_assert_uint_eq(tracker.category_peak_bytes[MEM_GRAD_SHARD], 500);
    mem_free(&tracker, kept);
    mem_free(&tracker, shard);
    ck_assert_uint_eq(mem_shutdown(&tracker), 0);
}
END_TEST

START_TEST(test_double_free_names_the_owner) {
    mem_tracker tracker;
    mem_init(&tracker, 3, NULL, NULL);
    void *block = mem_alloc(&tracker, 64, MEM_GRAD_SHARD, "layers.3.grad_shard");
    ck_assert_int_eq(mem_try_free(&tracker, block), 0);
    ck_assert_int_eq(mem_try_free(&tracker, block), -1);
    ck_assert_msg(strstr(tracker.error, "double free") != NULL, "%s", tracker.error);
    ck_assert_msg(strstr(tracker.error, "layers.3.grad_shard") != NULL, "%s", tracker.error);
    ck_assert_msg(strstr(tracker.error, "rank 3") != NULL, "%s", tracker.error);
    ck_assert_uint_eq(tracker.live_bytes, 0); /* the failed free changed nothing */
    ck_assert_uint_eq(mem_shutdown(&tracker), 0);
}
END_TEST

START_TEST(test_unknown_pointer_is_refused) {
    mem_tracker tracker;
    mem_init(&tracker, 1, NULL, NULL);
    int on_stack = 0;
    ck_assert_int_eq(mem_try_free(&tracker, &on_stack), -1);
    ck_assert_msg(strstr(tracker.error, "did not hand out") != NULL, "%s", tracker.error);
    ck_assert_int_eq(mem_try_free(&tracker, NULL), 0); /* like free(NULL) */
    mem_shutdown(&tracker);
}
END_TEST

START_TEST(test_mem_free_aborts_on_double_free) {
    mem_tracker tracker;
    mem_init(&tracker, 0, NULL, NULL);
    void *block = mem_alloc(&tracker, 8, MEM_DATA, "batch");
    mem_free(&tracker, block);
    mem_free(&tracker, block); /* must abort: SIGABRT */
}
END_TEST

START_TEST(test_shutdown_counts_leaks) {
    mem_tracker tracker;
    mem_init(&tracker, 0, NULL, NULL);
    mem_alloc(&tracker, 10, MEM_ACTIVATION, "layers.0.attention_scores");
    mem_alloc(&tracker, 20, MEM_OPTIM_STATE, "layers.0.exp_avg");
    void *freed = mem_alloc(&tracker, 30, MEM_WORKSPACE, "scratch");
    mem_free(&tracker, freed);
    ck_assert_uint_eq(mem_shutdown(&tracker), 2);
    ck_assert_uint_eq(tracker.live_bytes, 0);
}
END_TEST

START_TEST(test_reused_address_is_not_a_double_free) {
    mem_tracker tracker;
    mem_init(&tracker, 0, NULL, NULL);
    /* malloc often hands the same address back; the tracker must forget it was freed. */
    for (int i = 0; i < 100; i++) {
        void *block = mem_alloc(&tracker, 256, MEM_WORKSPACE, "loop");
        ck_assert_int_eq(mem_try_free(&tracker, block), 0);
    }
    ck_assert_uint_eq(mem_shutdown(&tracker), 0);
}
END_TEST

START_TEST(test_a_reused_block_is_zeroed_again) {
    mem_tracker tracker;
    mem_init(&tracker, 0, NULL, NULL);
    unsigned char *dirty = mem_alloc_uninitialized(&tracker, 4096, MEM_WORKSPACE, "dirty");
    memset(dirty, 0xab, 4096);
    mem_free(&tracker, dirty);
    unsigned char *clean = mem_alloc(&tracker, 4096, MEM_WORKSPACE, "clean");
    ck_assert_ptr_eq(clean, dirty); /* the cached block, handed out again */
    for (int i = 0; i < 4096; i++) ck_assert_int_eq(clean[i], 0);
    mem_free(&tracker, clean);
    ck_assert_uint_eq(mem_shutdown(&tracker), 0);
}
END_TEST

START_TEST(test_reserved_bytes_follow_the_segments) {
    mem_tracker tracker;
    mem_init(&tracker, 0, NULL, NULL);
    void *small = mem_alloc(&tracker, 100, MEM_WORKSPACE, "small");
    ck_assert_uint_eq(tracker.live_bytes, 100);
    ck_assert_uint_eq(tracker.reserved_bytes, 2u << 20);  /* one small segment */
    void *large = mem_alloc(&tracker, 3u << 20, MEM_ACTIVATION, "large");
    ck_assert_uint_eq(tracker.reserved_bytes, 22u << 20); /* + a 20 MiB large segment */
    mem_free(&tracker, large);
    mem_free(&tracker, small);
    ck_assert_uint_eq(tracker.live_bytes, 0);
    ck_assert_uint_eq(tracker.reserved_bytes, 22u << 20); /* cached */
    ck_assert_uint_eq(tracker.peak_reserved_bytes, 22u << 20);
    ck_assert_uint_eq(mem_empty_cache(&tracker), 22u << 20);
    ck_assert_uint_eq(tracker.reserved_bytes, 0);
    ck_assert_uint_eq(mem_shutdown(&tracker), 0);

    allocator_settings no_caching = {.caching = 0};
    mem_init(&tracker, 0, NULL, &no_caching);
    small = mem_alloc(&tracker, 100, MEM_WORKSPACE, "small");
    ck_assert_uint_eq(tracker.reserved_bytes, 512);       /* its own segment: the 512-byte block */
    mem_free(&tracker, small);
    ck_assert_uint_eq(tracker.reserved_bytes, 0);         /* released at once */
    ck_assert_uint_eq(tracker.peak_reserved_bytes, 512);
    ck_assert_uint_eq(mem_shutdown(&tracker), 0);
}
END_TEST

START_TEST(test_events_sum_to_live_bytes) {
    char dir[] = "/tmp/fsdplab_test_mem_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    trace_sink sink;
    ck_assert_int_eq(trace_open(&sink, dir, 0, 1), 0);
    mem_tracker tracker;
    mem_init(&tracker, 0, &sink, NULL);
    void *blocks[6];
    for (int i = 0; i < 6; i++) blocks[i] = mem_alloc(&tracker, (size_t)(i + 1) * 1000, (mem_category)i, "b");
    mem_free(&tracker, blocks[2]);
    mem_free(&tracker, blocks[0]);
    size_t live_now = tracker.live_bytes;
    for (int i = 0; i < 6; i++)
        if (i != 0 && i != 2) mem_free(&tracker, blocks[i]);
    mem_empty_cache(&tracker); /* the segment goes back: its segment_free reports reserved after it, 0 */
    trace_close(&sink);

    char path[256];
    snprintf(path, sizeof path, "%s/rank0.jsonl", dir);
    FILE *file = fopen(path, "r");
    ck_assert_ptr_nonnull(file);
    char line[1024];
    long running = 0, reserved = 0;
    int memory_events = 0, checked_live_now = 0, segments = 0, segment_frees = 0;
    double segment_address[16];
    while (fgets(line, sizeof line, file)) {
        cJSON *event = cJSON_Parse(line);
        ck_assert_ptr_nonnull(event);
        const char *kind = cJSON_GetObjectItem(event, "kind")->valuestring;
        if (strcmp(kind, "segment_alloc") == 0) {
            ck_assert_int_lt(segments, 16);
            segment_address[segments++] = cJSON_GetObjectItem(event, "addr")->valuedouble;
            reserved += (long)cJSON_GetObjectItem(event, "bytes")->valuedouble;
            ck_assert_int_eq(reserved, (long)cJSON_GetObjectItem(event, "reserved")->valuedouble);
        }
        if (strcmp(kind, "segment_free") == 0) {
            segment_frees++;
            reserved -= (long)cJSON_GetObjectItem(event, "bytes")->valuedouble;
            ck_assert_int_eq(reserved, (long)cJSON_GetObjectItem(event, "reserved")->valuedouble);
        }
        if (strcmp(kind, "alloc") == 0) { /* its segment was announced before it, and holds it */
            double segment = cJSON_GetObjectItem(event, "segment")->valuedouble;
            int known = 0;
            for (int i = 0; i < segments; i++) known |= segment_address[i] == segment;
            ck_assert(known);
            ck_assert(cJSON_GetObjectItem(event, "addr")->valuedouble >= segment);
            ck_assert_int_eq(reserved, (long)cJSON_GetObjectItem(event, "reserved")->valuedouble);
        }
        if (strcmp(kind, "alloc") == 0 || strcmp(kind, "free") == 0) {
            long bytes = (long)cJSON_GetObjectItem(event, "bytes")->valuedouble;
            running += strcmp(kind, "alloc") == 0 ? bytes : -bytes;
            ck_assert_int_eq(running, (long)cJSON_GetObjectItem(event, "live")->valuedouble);
            if (++memory_events == 8) {
                ck_assert_int_eq(running, (long)live_now);
                checked_live_now = 1;
            }
        }
        cJSON_Delete(event);
    }
    fclose(file);
    ck_assert_int_eq(memory_events, 12);
    ck_assert_int_eq(segments, 1); /* 1000..6000 bytes: all six carved from one 2 MiB small segment */
    ck_assert(checked_live_now);
    ck_assert_int_eq(running, 0);
    ck_assert_int_eq(segment_frees, 1);
    ck_assert_int_eq(reserved, 0);
    unlink(path);
    rmdir(dir);
    mem_shutdown(&tracker);
}
END_TEST

START_TEST(test_category_names_round_trip) {
    for (int category = 0; category < MEM_CATEGORY_COUNT; category++)
        ck_assert_int_eq(mem_category_from_name(mem_category_name((mem_category)category)), category);
    ck_assert_int_eq(mem_category_from_name("params"), -1);
    ck_assert_str_eq(mem_category_name(MEM_CHECKPOINT_INPUT), "checkpoint_input");
}
END_TEST

START_TEST(test_format_bytes) {
    char text[32];
    ck_assert_str_eq(mem_format_bytes(17, text, sizeof text), "17 B");
    ck_assert_str_eq(mem_format_bytes(4000, text, sizeof text), "4.0 KB");
    ck_assert_str_eq(mem_format_bytes(12300000, text, sizeof text), "12.3 MB");
    ck_assert_str_eq(mem_format_bytes(2500000000u, text, sizeof text), "2.50 GB");
}
END_TEST

int main(void) {
    Suite *suite = suite_create("mem");
    TCase *tc = tcase_create("tracked allocator");
    tcase_add_test(tc, test_live_and_peak_by_category);
    tcase_add_test(tc, test_peaks_restored_around_uncounted_work);
    tcase_add_test(tc, test_double_free_names_the_owner);
    tcase_add_test(tc, test_unknown_pointer_is_refused);
    tcase_add_test_raise_signal(tc, test_mem_free_aborts_on_double_free, SIGABRT);
    tcase_add_test(tc, test_shutdown_counts_leaks);
    tcase_add_test(tc, test_reused_address_is_not_a_double_free);
    tcase_add_test(tc, test_a_reused_block_is_zeroed_again);
    tcase_add_test(tc, test_reserved_bytes_follow_the_segments);
    tcase_add_test(tc, test_events_sum_to_live_bytes);
    tcase_add_test(tc, test_category_names_round_trip);
    tcase_add_test(tc, test_format_bytes);
    suite_add_tcase(suite, tc);
    return check_run(suite);
}
