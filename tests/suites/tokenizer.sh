# Qwen2's tokenizer (core/data/tokenizer.c) against HF tokenizers built from the same qwen.tiktoken: ids on a fixed
# corpus through each loader and on 2,000 random strings, decode(encode(x)) == NFC(x). Without data/qwen2/qwen.tiktoken
# ($QWEN2_TOKENIZER; scripts/get_qwen2_tokenizer.sh fetches it) or the tokenizers package, the check says skipped.
# The unit test (tests/test_tokenizer.c, in the unit suite) needs no vocabulary.
check "tokenizer parity: ids equal HF tokenizers (fixed corpus x 3 loaders, 2000 random strings), decode round trip" \
  python3 tests/check_tokenizer_parity.py
check_fails "tokenize_tool: \$QWEN2_TOKENIZER naming no file is refused by name" \
  "/nonexistent/qwen.tiktoken: No such file" \
  env QWEN2_TOKENIZER=/nonexistent/qwen.tiktoken tests/bin/tokenize_tool encode /dev/null

# TinyStories text as the seed's pipeline sees it (the dataset's loader: each story stripped, <|endoftext|> between
# stories), on a generated sample in the dataset's format with edge cases (tests/check_stories.py): story by story,
# edges included, the token file prepare_tinystories.sh writes and the stream lab 05's loader reads from the text
# must equal HF tokenizers' ids (Qwen2's vocabulary), and the stories' bytes with DATA_EOT between (TOKENIZER=bytes).
S=runs/check/tokenizer_stories
check "tokenizer: TinyStories text, bytes: each story's ids (edges too) are the seed's, in token file and loader" \
  python3 tests/check_stories.py --dir $S --tokenizer bytes
check "tokenizer: TinyStories text, Qwen2: each story's ids (edges too) are HF tokenizers', in token file and loader" \
  python3 tests/check_stories.py --dir $S --tokenizer qwen2

# Lab 05 on Qwen2's ids: qwen2-0.5b cut to one small layer by CONFIG (its 151,936-row embedding kept), on that
# TinyStories-format sample read as text and as the token file scripts/prepare_tinystories.sh makes of it. Both must
# hold exactly the ids of the loader's stream (which check_stories.py compared with HF) and train to the same
# losses, bit for bit; EVAL decodes through the same tokenizer.
QWEN2_SMALL=(MODEL=qwen2-0.5b
             CONFIG=hidden_size=64,num_hidden_layers=1,intermediate_size=128,num_attention_heads=2,num_key_value_heads=1
             SEQ=64 MBS=2 ACC=1 STEPS=2)
T=runs/check/tokenizer
if [ -f "${QWEN2_TOKENIZER:-data/qwen2/qwen.tiktoken}" ] && [ -f $S/sample.txt ]; then
  rm -rf $T && mkdir -p $T
  cp $S/sample.txt $T/stories.txt
  OUT=$T/load_text tests/bin/tokenize_tool load-text $T/stories.txt $T/stories.ids >/dev/null
  expected=$(wc -w <$T/stories.ids)
  run_lab "tokenizer: lab 05 on qwen2-0.5b's vocabulary, DATA=TinyStories-format text, EVAL=2" 2 $T/text 05_full_step \
    "${QWEN2_SMALL[@]}" DATA=$T/stories.txt EVAL=2
  text_log=$(log_of "tokenizer: lab 05 on qwen2-0.5b's vocabulary, DATA=TinyStories-format text, EVAL=2")
  check "tokenizer: lab 05 read the text as Qwen2 ids: $expected tokens, the loader's stream (load-text)" \
    grep -q "text through Qwen2's tokenizer (.*): $expected tokens)" "$text_log"
  check "tokenizer: EVAL printed a story decoded by Qwen2's tokenizer" grep -q "^    --- Once upon a time" "$text_log"
  check "tokenizer: prepare_tinystories.sh writes the same ids as a token file" bash -c "
    scripts/prepare_tinystories.sh $T/stories.txt $T/stories.bin |
    grep -q '$T/stories.bin: $expected tokens of 4 bytes'"
  # The same ids when write-tokens encodes the text ~2 KB at a time (16 MB by default: its progress lines)
  check "tokenizer: write-tokens ~2 KB at a time writes the whole text's token file, byte for byte" bash -c "
    tests/bin/tokenize_tool write-tokens $T/stories.txt $T/pieces.bin 2000 && cmp $T/stories.bin $T/pieces.bin"
  run_lab "tokenizer: lab 05 on the prepared token file" 2 $T/bin 05_full_step "${QWEN2_SMALL[@]}" DATA=$T/stories.bin
  check "tokenizer: the token file trains to the text's losses, bit for bit" python3 tests/check_resume.py exact \
    $T/text $T/bin
  check "tokenizer: TOKENIZER=auto without the vocabulary says so and reads bytes" bash -c "
    OUT=$T/auto_bytes QWEN2_TOKENIZER=/nonexistent/qwen.tiktoken ${QWEN2_SMALL[*]} STEPS=1 \
      $MPIRUN -np 2 lab/05_full_step |
    grep -q 'text as byte ids: TOKENIZER=auto found no Qwen2 vocabulary at /nonexistent/qwen.tiktoken'"
  check_fails "tokenizer: TOKENIZER=qwen2 on the tiny model is refused (its vocabulary is too small)" \
    "TOKENIZER='qwen2': rank 0: .*has ids up to 151645, beyond this model's vocab_size 260" \
    env OUT=$T/refused TOKENIZER=qwen2 STEPS=1 $MPIRUN -np 2 lab/05_full_step
else
  tokenizer_missing="skipped: no Qwen2 vocabulary at ${QWEN2_TOKENIZER:-data/qwen2/qwen.tiktoken}"
  check "tokenizer: lab 05 on Qwen2's ids" bash -c \
    "echo '$tokenizer_missing (scripts/get_qwen2_tokenizer.sh)'; exit 77"
fi
check_fails "tokenizer: TOKENIZER naming no file is refused by name" \
  "TOKENIZER='/nonexistent/vocab.json': rank 0: /nonexistent/vocab.json" \
  env OUT=$T/refused2 MODEL=qwen2-0.5b \
  CONFIG=hidden_size=64,num_hidden_layers=1,intermediate_size=128,num_attention_heads=2,num_key_value_heads=1 \
  TOKENIZER=/nonexistent/vocab.json STEPS=1 SEQ=16 $MPIRUN -np 2 lab/05_full_step
