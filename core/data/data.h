/* data.h — what the model reads: a byte tokenizer, built-in stories, and a loader that hands each rank its share of
 * every global batch.
 *
 *   text ──► data_encode (bytes → ids 0..255, "<|endoftext|>" → 256) ──► token stream (held whole, category data)
 *        ──► data_next_batch: window k of global micro-batch g, rank r takes its micro_batch windows
 *
 * The default data is generated here (data_generate_stories), so every lab runs with no download. A path ending in
 * .bin is a token file (below); any other path is UTF-8 text in TinyStories' format (stories separated by
 * "<|endoftext|>"), read story by story as the dataset gives them (data_story_next) and tokenized with <|endoftext|>
 * between stories (data_encode_stories). The generated stories are tokenized as their text stands.
 *
 * Token files (.bin), like llm.c's: a 24-byte header, then the ids little-endian, `width` bytes each:
 *
 *   offset 0   8 bytes   magic "FSDPTOKS"
 *          8   uint32    version, 1
 *         12   uint32    width: 2 (uint16 ids) or 4 (uint32 ids: Qwen2's ids go to 151,645)
 *         16   uint64    count: the number of ids; the file is exactly 24 + count * width bytes
 *         24   ids
 *
 * (all little-endian). A file that does not start with the magic is the old headerless format: raw little-endian
 * uint16 ids (an old file whose first ids spell "FSDPTOKS", 0x5346 0x5044 0x4f54 0x534b, would be read as a header and
 * refused by its version or size: no vocabulary that old files can hold makes that likely, and none is accepted as
 * something it is not). In memory the loader keeps ids in the narrowest width that holds the vocabulary
 * (data_token_width), whatever the file's width, so a tiny run's data costs 2 bytes a token either way.
 *
 * Sampling is PyTorch's DistributedSampler, made world-size independent: a global micro-batch is world_size *
 * micro_batch windows of seq_len + 1 tokens (inputs plus the next token as target), laid back to back with a stride
 * of seq_len and wrapping at the end of the stream; rank r takes windows [r * micro_batch, (r + 1) * micro_batch).
 * So 2 ranks with micro_batch 4 see exactly what 1 rank with micro_batch 8 sees, split in halves, and a loss curve
 * can be compared across world sizes.
 */
#ifndef FSDPLAB_DATA_H
#define FSDPLAB_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "core/runtime/context.h"
#include "core/data/tokenizer.h"

#define DATA_BYTE_TOKENS 256          /* ids 0..255 are the bytes themselves */
#define DATA_EOT 256                  /* <|endoftext|>: the tiny preset's bos and eos */
#define DATA_EOT_TEXT "<|endoftext|>"
/* Stories in the default data: 4500 stories of ~450 bytes, about 2.0 MB of text and 2.0 M tokens: ~970 global
 * micro-batches of 8 x 256 tokens before the stream wraps, so a 50-step lab never sees a window twice. */
#define DATA_DEFAULT_STORIES 4500

/* ---- Tokenizer ---- */

/* Bytes to ids; the literal text "<|endoftext|>" becomes DATA_EOT. `tokens` must hold `length` ids (never more
 * tokens than bytes). Returns the number of tokens. */
size_t data_encode(const char *text, size_t length, int *tokens);
/* Ids back to text, snprintf-like: writes at most out_size - 1 bytes and a NUL, returns the full length. DATA_EOT
 * becomes "<|endoftext|>"; an id that is not a byte or DATA_EOT (the tiny preset's reserved 257..259, or anything a
 * sampler should not have produced) becomes "<|token N|>" so that nothing is dropped silently. */
size_t data_decode(const int *tokens, size_t count, char *out, size_t out_size);

/* ---- Built-in stories ---- */

/* `count` short children's stories from templates (characters, places, objects, feelings, one of several plots),
 * each followed by "\n<|endoftext|>\n". Only printable ASCII and newlines. Story i depends only on (seed, i), so the
 * text depends only on seed and count, and fewer stories are a prefix of more. snprintf-like: writes at most
 * out_size - 1 bytes and a NUL, returns the full length (call with NULL, 0 to size the buffer). */
size_t data_generate_stories(uint64_t seed, int count, char *out, size_t out_size);

/* ---- TinyStories text: the stories as the dataset gives them ---- */

/* A TinyStories text file (TinyStoriesV2-GPT4-*.txt: stories between "<|endoftext|>" lines) read as the dataset's
 * loader and the seed's pipeline read it, in Python: the file's text (universal newlines, as Python's text mode reads
 * it: "\r\n" and a lone "\r" become "\n"), split at every "<|endoftext|>", each piece stripped of the whitespace
 * Python's str.strip() removes (ASCII's, U+001C..U+001F, U+0085, U+00A0 and Unicode's spaces and separators), empty
 * pieces dropped. A story keeps its inner newlines and blank lines. data_story_next hands them out one by one. */
typedef struct data_story_reader {
    const char *text;
    size_t length;
    size_t at;                    /* where the next piece starts */
    size_t stories;               /* stories handed out so far */
    size_t piece_at;              /* where the last story's piece (from the separator before it) starts */
    char *scratch;                /* a story that held '\r', its newlines translated (malloc'd, grown as needed) */
    size_t scratch_size;
    int out_of_memory;            /* set when the scratch could not grow: data_story_next returned NULL early */
} data_story_reader;

/* A reader of text[0 .. length); nothing allocated until a story holds '\r'. data_story_reader_free releases it. */
data_story_reader data_story_reader_of(const char *text, size_t length);
/* The next story (not NUL-terminated: its bytes and *story_length), or NULL after the last (or when out_of_memory).
 * The story points into the text, or into the scratch when its newlines were translated (valid until the next
 * call). */
const char *data_story_next(data_story_reader *reader, size_t *story_length);
void data_story_reader_free(data_story_reader *reader);

/* Stories to ids, as the seed's pipeline makes them: each story tokenized alone (`tokenizer`, Qwen2's BPE; NULL:
 * bytes, as data_encode), <|endoftext|> between two stories (the tokenizer's special id, 151643 for Qwen2; DATA_EOT
 * for bytes), none before the first or after the last. Appends to `ids` the stories `reader` hands out until at
 * least `budget` bytes of text were read (SIZE_MAX: all), so a caller can report progress. Returns 1 when stories
 * may remain, 0 after the last, -1 with `error` naming the story and the tokenizer's reason ("story 12 (its piece at
 * byte 3456 of the text): invalid UTF-8 at byte 7"), out of memory, or a tokenizer without <|endoftext|>. */
int data_encode_stories(data_story_reader *reader, tok_tokenizer *tokenizer, size_t budget, tok_ids *ids,
                        char *error, size_t error_size);

/* ---- Token files ---- */

#define DATA_TOKENS_MAGIC "FSDPTOKS"  /* 8 bytes, no terminator in the file */
#define DATA_TOKENS_VERSION 1
#define DATA_TOKENS_HEADER_BYTES 24

/* The width in bytes ids of a vocabulary take in memory: 2 (uint16) when every id < vocab_size fits 16 bits
 * (vocab_size <= 65536), else 4 (uint32). */
int data_token_width(int vocab_size);

/* Writes `count` ids as a token file of the given width (2 or 4): header, then the ids little-endian, through
 * <path>.tmp flushed to disk and renamed (core/base/file.h's file_commit), so a full disk or a kill leaves no partial
 * file under `path`. Returns -1 with `error` naming the path and the values: a width that is not 2 or 4, an id that
 * does not fit it (negative, or >= 65536 at width 2: "id 70000 at position 3 does not fit in 2 bytes"), a failed write
 * (the .tmp is removed). Not collective: one rank writes. */
int data_write_tokens(const char *path, const int *ids, size_t count, int width, char *error, size_t error_size);

/* ---- Loader ---- */

typedef struct data_loader {
    context *ctx;
    char source[600];             /* the path, or "generated stories (seed S)", for messages */
    void *tokens;                 /* the whole stream, category data, owner "data.tokens": uint16_t or uint32_t ids
                                     (token_width); read them with data_token */
    int token_width;              /* 2 or 4: data_token_width(vocab_size) */
    size_t token_count;
    size_t token_bytes;           /* token_count * token_width: the stream's data memory (the memory model's) */
    int vocab_size;
    int micro_batch, seq_len;     /* this rank's batch: micro_batch sequences of seq_len tokens */
    int rank, world_size;
    uint64_t seed;
    int shuffle;                  /* windows reordered within each pass (see data_window_start) */
    size_t window_starts;         /* token_count - seq_len: the positions a window of seq_len + 1 tokens can start */
    uint64_t windows_per_pass;    /* window_starts / seq_len (at least 1): the windows one pass over the stream has */
    uint64_t next_global_micro;   /* the global micro-batch the next data_next_batch reads; set it to resume */
    tok_tokenizer *tokenizer;     /* text through Qwen2's BPE; NULL: bytes (not owned) */
} data_loader;

/* Loads the stream whole: path NULL or "" is DATA_DEFAULT_STORIES generated stories from `seed` (their text tokenized
 * whole, separator lines and all); "*.bin" a token file (headered, or old headerless uint16); anything else a
 * TinyStories text file, its stories as data_encode_stories makes them. Every id must be < vocab_size, and the stream
 * must hold at least seq_len + 1 tokens. shuffle != 0 reorders the windows by `seed` (world-size independent all the
 * same). Collective: every rank loads its own copy, and every rank returns -1 if any failed, with ctx->error naming the
 * path and the values ("rank 0: /x/a.bin: 7 bytes, not a whole number of uint16 tokens"; "... header says 100 ids of 4
 * bytes (400 bytes) but 396 bytes follow it"; "... token file version 7, this build reads version 1"; "... id width 3
 * in the header; token files hold 2 or 4"; "... token id 300 at position 2 is outside the vocabulary (vocab_size
 * 260)"). Nothing stays allocated on failure. */
int data_loader_open(data_loader *loader, context *ctx, const char *path, int vocab_size, int micro_batch,
                     int seq_len, uint64_t seed, int shuffle);
/* The same, with text (a text file, or the generated stories) tokenized by `tokenizer` (Qwen2's BPE,
 * core/data/tokenizer.h; NULL: bytes, as data_encode). Token files are read as they are. */
int data_loader_open_tokenized(data_loader *loader, context *ctx, const char *path, tok_tokenizer *tokenizer,
                               int vocab_size, int micro_batch, int seq_len, uint64_t seed, int shuffle);

/* TOKENIZER, read (collectively) from the environment: how text becomes ids for a model of `vocab_size`.
 *   bytes    byte ids (data_encode), the tiny model's vocabulary
 *   qwen2    Qwen2's BPE from tok_default_path() ($QWEN2_TOKENIZER or data/qwen2/qwen.tiktoken); refused when the
 *            file is missing (naming it and scripts/get_qwen2_tokenizer.sh) or the model's vocabulary is smaller
 *   auto     (the default) qwen2 when the model's vocabulary holds Qwen2's ids and the file is there, else bytes
 *   <path>   Qwen2-style BPE from that file or directory (qwen.tiktoken, tokenizer.json, vocab.json + merges.txt)
 * Returns the loaded tokenizer (the caller frees it with tok_free, then free), or NULL for bytes; `note` says what
 * was chosen and why, for rank 0 to print. Collective: every rank loads its own copy; a failure on any rank exits
 * every rank with the message (world_exit_all). */
tok_tokenizer *data_tokenizer_from_env(context *ctx, int vocab_size, char *note, size_t note_size);

/* Id i of the stream. */
static inline uint32_t data_token(const data_loader *loader, size_t i) {
    return loader->token_width == 2 ? ((const uint16_t *)loader->tokens)[i] : ((const uint32_t *)loader->tokens)[i];
}

/* Where window `global_window` starts in the stream: window k of global micro-batch g is global window
 * g * world_size * micro_batch + k. Unshuffled it starts at (global_window * seq_len) mod window_starts; shuffled,
 * the windows of each pass (windows_per_pass of them) are visited in a permuted order, the permutation a
 * counter-based function of (seed, pass), so the order depends on the global index alone, never on the world size. */
size_t data_window_start(const data_loader *loader, uint64_t global_window);

/* Fills this rank's share of the next global micro-batch: tokens and targets, each (micro_batch, seq_len), targets
 * the next token of each position. Then advances next_global_micro. */
void data_next_batch(data_loader *loader, int *tokens, int *targets);

void data_loader_close(data_loader *loader);

#endif
