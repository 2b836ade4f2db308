# Bad input: every setting, file and argument a user can get wrong is refused with a non-zero exit and a message
# that names the setting (or file) and the offending value; nothing crashes, hangs or trains on it. Each case runs
# under a short timeout, so a hang fails fast instead of holding the suite for CHECK_TIMEOUT's default.
saved_timeout_badinput=$CHECK_TIMEOUT
CHECK_TIMEOUT=60
BAD=runs/check/badinput
rm -rf $BAD && mkdir -p $BAD

# bad05 NAME PATTERN ENV=VALUE...: lab 05 on 2 ranks with the given settings must be refused with PATTERN.
bad05() {
  local name=$1 pattern=$2
  shift 2
  check_fails "05_full_step $name" "$pattern" env OUT=$BAD/05 STEPS=1 "$@" $MPIRUN -np 2 lab/05_full_step
}
# Numbers: not a number, negative, beyond the type, a fraction or infinity for an integer, NaN and infinities.
bad05 "MBS=abc" "MBS='abc' is not an integer in 1\.\.4096" MBS=abc
bad05 "MBS=-1" "MBS='-1' is not an integer in 1\.\.4096" MBS=-1
bad05 "MBS=99999999999999999999 (overflows long)" "MBS='99999999999999999999' is not an integer" \
  MBS=99999999999999999999
bad05 "MBS=2.5" "MBS='2\.5' is not an integer" MBS=2.5
bad05 "ACC=inf" "ACC='inf' is not an integer" ACC=inf
bad05 "ACC=0" "ACC='0' is not an integer in 1\.\.4096" ACC=0
bad05 "STEPS=nan" "STEPS='nan' is not an integer" STEPS=nan
bad05 "STEPS=-3" "STEPS='-3' is not an integer" STEPS=-3
bad05 "SEQ=1e3 (a float for an integer)" "SEQ='1e3' is not an integer" SEQ=1e3
bad05 "SEQ=4096 beyond tiny's max_position_embeddings" \
  "SEQ=4096 is longer than MODEL=tiny's max_position_embeddings 1024" SEQ=4096
bad05 "LR=abc" "LR='abc' is not a number" LR=abc
bad05 "LR=nan" "LR='nan' is not a number" LR=nan
bad05 "LR=-inf" "LR='-inf' is not a number" LR=-inf
bad05 "LR=-0.001" "LR='-0\.001' is not a number in 0\.\.10" LR=-0.001
bad05 "CLIP=nan" "CLIP='nan' is not a number" CLIP=nan
bad05 "CLIP=-1" "CLIP='-1' is not a number" CLIP=-1
bad05 "SEED=-1" "SEED='-1' is not an integer in 0\.\.2147483647" SEED=-1
bad05 "SEED=2147483648" "SEED='2147483648' is not an integer in 0\.\.2147483647" SEED=2147483648
bad05 "SEED=0x10" "SEED='0x10' is not an integer" SEED=0x10
bad05 "EVAL=-5" "EVAL='-5' is not an integer" EVAL=-5
bad05 "EVAL=1.5" "EVAL='1\.5' is not an integer" EVAL=1.5
bad05 "THREADS=0" "THREADS='0' is not an integer in 1\.\.1024" THREADS=0
bad05 "THREADS=four" "THREADS='four' is not an integer" THREADS=four
bad05 "TIMEOUT=nan" "TIMEOUT='nan' is not a number" TIMEOUT=nan
bad05 "TIMEOUT=-1" "TIMEOUT='-1' is not a number" TIMEOUT=-1
bad05 "TIMEOUT=inf" "TIMEOUT='inf' is not a number" TIMEOUT=inf
bad05 "CKPT=2" "CKPT='2' is not an integer in 0\.\.1" CKPT=2
bad05 "NO_SYNC=yes" "NO_SYNC='yes' is not an integer" NO_SYNC=yes
# Names: every choice lists what is allowed.
bad05 "STRATEGY=full_shard (case matters)" "STRATEGY='full_shard' is not allowed; choose one of: FULL_SHARD" \
  STRATEGY=full_shard
bad05 "MODEL=llama" "MODEL='llama' is not a model; choose one of: qwen2-0\.5b \(or qwen2\), tiny" MODEL=llama
bad05 "WRAP=blocks" "WRAP='blocks' is not a wrap policy" WRAP=blocks
bad05 "WRAP=size:0" "WRAP='size:0' is not a wrap policy" WRAP=size:0
bad05 "WRAP=size:-5" "WRAP='size:-5' is not a wrap policy" WRAP=size:-5
bad05 "WRAP=size:99999999999999999999999" "WRAP='size:99999999999999999999999' is not a wrap policy" \
  WRAP=size:99999999999999999999999
bad05 "PEAK=vms" "PEAK='vms' is not allowed; choose one of: tracked, rss" PEAK=vms
bad05 "ALLOC=Caching" "ALLOC='Caching' is not allowed; choose one of: caching, malloc" ALLOC=Caching
# CPU offload and the device budget (lab 09)
bad05 "OFFLOAD=2" "OFFLOAD='2' is not an integer in 0\.\.1" OFFLOAD=2
bad05 "OFFLOAD=1 STRATEGY=NO_SHARD" \
  "CPU offload of a replicated \(NO_SHARD\) unit is not supported; use FULL_SHARD or SHARD_GRAD_OP" \
  OFFLOAD=1 STRATEGY=NO_SHARD
bad05 "DEVICE_MEMORY_MB=-5" "DEVICE_MEMORY_MB='-5' is not an integer in 0\.\." DEVICE_MEMORY_MB=-5
check_fails "09_offload_and_init INIT_MODELS=gpt2 names the presets" "INIT_MODELS='gpt2': MODEL='gpt2' is not a model" \
  env OUT=$BAD/09 INIT_MODELS=gpt2 STEPS=1 $MPIRUN -np 2 lab/09_offload_and_init
bad05 "BACKWARD_PREFETCH=PRE" \
  "BACKWARD_PREFETCH='PRE' is not allowed; choose one of: NONE, BACKWARD_PRE, BACKWARD_POST" BACKWARD_PREFETCH=PRE
# Mixed precision (MP): every part checked, the message names MP, the part and what is allowed.
bad05 "MP=bf8" "MP='bf8': 'bf8' is not a param_dtype; allowed: fp32 \(off\), bf16" MP=bf8
bad05 "MP=bf16,reduce=fp16" "MP='bf16,reduce=fp16': 'fp16' is not a dtype; allowed:" MP=bf16,reduce=fp16
bad05 "MP=bf16,reduce" "MP='bf16,reduce': 'reduce' is not name=value" MP=bf16,reduce
bad05 "MP=bf16,gather=fp32" \
  "MP='bf16,gather=fp32': 'gather' is not a setting \(reduce, buffer, keep_low_precision_grads, output\)" \
  MP=bf16,gather=fp32
bad05 "MP=bf16,keep_low_precision_grads=yes" "MP='bf16,keep_low_precision_grads=yes': 'yes' is not 0 or 1" \
  MP=bf16,keep_low_precision_grads=yes
bad05 "MP=bf16,buffer=bf16" "MP='bf16,buffer=bf16': 'bf16' is not supported as buffer dtype" MP=bf16,buffer=bf16
# MP runs under every strategy and with OFFLOAD=1 (check-07 compares each with its float32-reduce twin); what offload
# refuses without it, it refuses with it, naming the strategy.
bad05 "MP=bf16 with OFFLOAD=1 STRATEGY=NO_SHARD" \
  "CPU offload of a replicated \(NO_SHARD\) unit is not supported; use FULL_SHARD or SHARD_GRAD_OP" \
  MP=bf16 OFFLOAD=1 STRATEGY=NO_SHARD
bad05 "FORWARD_PREFETCH=on" "FORWARD_PREFETCH='on' is not an integer in 0\.\.1" FORWARD_PREFETCH=on
# SHARD_GROUP (HYBRID_SHARD's shard group size): an integer that divides the world size, checked whatever the strategy.
bad05 "SHARD_GROUP=two" "SHARD_GROUP='two' is not an integer" SHARD_GROUP=two
bad05 "SHARD_GROUP=-1" "SHARD_GROUP='-1' is not an integer in 0\.\." SHARD_GROUP=-1
bad05 "SHARD_GROUP=3 on 2 ranks" "SHARD_GROUP='3' does not divide the world size 2: .*choose one of 1, 2" \
  STRATEGY=HYBRID_SHARD SHARD_GROUP=3
bad05 "STRATEGY=hybrid_shard (case matters)" "STRATEGY='hybrid_shard' is not allowed; choose one of: .*HYBRID_SHARD" \
  STRATEGY=hybrid_shard

# CONFIG: fields by HF name; each value must be one the field can hold and the whole config consistent.
bad05 "CONFIG unknown field" "'hidden_sizes' is not a Qwen2 config field" CONFIG=hidden_sizes=64
bad05 "CONFIG not field=value" "config override 'hidden_size' is not field=value" CONFIG=hidden_size
bad05 "CONFIG non-numeric" "hidden_size=abc is not an integer" CONFIG=hidden_size=abc
bad05 "CONFIG float for an integer" "num_hidden_layers=2\.5 is not an integer" CONFIG=num_hidden_layers=2.5
bad05 "CONFIG rope_theta=inf" "rope_theta=inf is not a finite number" CONFIG=rope_theta=inf
bad05 "CONFIG rms_norm_eps=nan" "rms_norm_eps=nan is not a finite number" CONFIG=rms_norm_eps=nan
bad05 "CONFIG initializer_range=-0.02" "initializer_range=-0\.02 must be a finite number >= 0" \
  CONFIG=initializer_range=-0.02
bad05 "CONFIG initializer_range=inf" "initializer_range=inf is not a finite number" CONFIG=initializer_range=inf
bad05 "CONFIG negative layers" "num_hidden_layers=-2 must be 0 or more" CONFIG=num_hidden_layers=-2
bad05 "CONFIG zero vocabulary" "vocab_size=0 must be positive" CONFIG=vocab_size=0
bad05 "CONFIG vocab_size beyond int" "vocab_size=9999999999 is not an integer" CONFIG=vocab_size=9999999999
bad05 "CONFIG hidden_size not divisible by heads" "hidden_size 100 is not divisible by num_attention_heads 3" \
  CONFIG=hidden_size=100,num_attention_heads=3
bad05 "CONFIG kv heads not dividing heads" "num_attention_heads 4 is not divisible by num_key_value_heads 3" \
  CONFIG=num_key_value_heads=3
bad05 "CONFIG sizes whose product overflows" \
  "vocab_size 2000000000 x hidden_size 2000000 = 4e\+15 parameters in the embedding, beyond the limit" \
  CONFIG=vocab_size=2000000000,hidden_size=2000000,num_attention_heads=2,num_key_value_heads=2
bad05 "CONFIG layers whose parameters pass 2^40" "num_hidden_layers 2000000000 x .* parameters per layer" \
  CONFIG=num_hidden_layers=2000000000

# DATA: the file must exist, be a file, hold tokens, and every token must be in the vocabulary.
printf '' > $BAD/empty.txt
printf 'abc' > $BAD/odd.bin
python3 -c "import struct; open('$BAD/big_ids.bin','wb').write(struct.pack('<4H', 1, 2, 300, 4) * 2048)"
bad05 "DATA missing file" "DATA: rank 0: $BAD/no_such_file\.txt: cannot open: No such file" DATA=$BAD/no_such_file.txt
bad05 "DATA a directory" "DATA: rank 0: $BAD: not a regular file" DATA=$BAD
bad05 "DATA an empty file" "$BAD/empty\.txt: 0 tokens, fewer than seq_len \+ 1 = 129" DATA=$BAD/empty.txt
bad05 "DATA an odd-byte .bin" "$BAD/odd\.bin: 3 bytes, not a whole number of uint16 tokens" DATA=$BAD/odd.bin
bad05 "DATA a token id beyond the vocabulary" \
  "$BAD/big_ids\.bin: token id 300 at position 2 is outside the vocabulary \(vocab_size 260\)" DATA=$BAD/big_ids.bin

# SAVE and GRADS: a directory that cannot be written is refused before training starts, not after the last step.
printf 'x' > $BAD/a_file
# save_refused_early SETTING=VALUE: lab 05's output; exit 0 (so the check fails) when a step line was printed.
save_refused_early=(bash -c 'env OUT=$0/05 STEPS=2 "$2" $1 -np 2 lab/05_full_step >$0/save.log 2>&1; status=$?
  cat $0/save.log
  if grep -qE "^[0-9]+/[0-9]+: Loss" $0/save.log; then echo "a training step ran before the refusal"; exit 0; fi
  exit $status' $BAD "$MPIRUN")
check_fails "05_full_step SAVE under a regular file is refused before the first step" \
  "SAVE='$BAD/a_file/ckpt': cannot create directory.*Not a directory" "${save_refused_early[@]}" SAVE=$BAD/a_file/ckpt
check_fails "05_full_step SAVE under /proc is refused before the first step" \
  "SAVE='/proc/fsdplab_ckpt': cannot create directory" "${save_refused_early[@]}" SAVE=/proc/fsdplab_ckpt
check_fails "05_full_step GRADS under a regular file is refused before the first step" \
  "GRADS='$BAD/a_file/grads': cannot create directory" "${save_refused_early[@]}" GRADS=$BAD/a_file/grads

# Settings that differ between ranks (an MPMD launch) stop every rank before any work, naming both values.
check_fails "05_full_step MBS differing between ranks (MPMD)" \
  "MBS differs between ranks: rank 0 has '2', rank 1 has '4'" \
  env OUT=$BAD/05 $MPIRUN -np 1 -x MBS=2 lab/05_full_step : -np 1 -x MBS=4 lab/05_full_step
check_fails "05_full_step CONFIG differing between ranks (MPMD)" "CONFIG differs between ranks: rank 0 has unset" \
  env OUT=$BAD/05 $MPIRUN -np 1 lab/05_full_step : -np 1 -x CONFIG=num_hidden_layers=2 lab/05_full_step

# Memory: a run that cannot fit is refused before the model is allocated, naming predicted and available bytes.
check_fails "05_full_step qwen2-0.5b MBS=4096 SEQ=32768 is refused: it cannot fit in memory" \
  "predicted peak [0-9]+\.[0-9]{2} GB per rank.*[0-9]+\.[0-9]{2} GB available.*lower MBS or SEQ" \
  env OUT=$BAD/05 MODEL=qwen2-0.5b MBS=4096 SEQ=32768 timeout 20 $MPIRUN -np 2 lab/05_full_step
check_fails "05_full_step MEMORY_CHECK=maybe" "MEMORY_CHECK='maybe' is not an integer in 0\.\.1" \
  env OUT=$BAD/05 MEMORY_CHECK=maybe $MPIRUN -np 2 lab/05_full_step
check_fails "06_prefetch MBS=4096 SEQ=1024 is refused: it cannot fit in memory" \
  "predicted peak [0-9]+\.[0-9]{2} GB per rank.*[0-9]+\.[0-9]{2} GB available" \
  env OUT=$BAD/06 MBS=4096 SEQ=1024 timeout 20 $MPIRUN -np 2 lab/06_prefetch

# The other labs read the same checked settings.
check_fails "01_shard SEED=abc" "SEED='abc' is not an integer" env OUT=$BAD/01 SEED=abc $MPIRUN -np 2 lab/01_shard
check_fails "02_gather SEED=-5" "SEED='-5' is not an integer" env OUT=$BAD/02 SEED=-5 $MPIRUN -np 2 lab/02_gather
check_fails "03_reduce_scatter REPEAT=0" "REPEAT='0' is not an integer in 1\.\.64" \
  env OUT=$BAD/03 REPEAT=0 $MPIRUN -np 2 lab/03_reduce_scatter
check_fails "03_reduce_scatter BW_MB=fast" "BW_MB='fast' is not an integer" \
  env OUT=$BAD/03 BW_MB=fast $MPIRUN -np 2 lab/03_reduce_scatter
check_fails "04_checkpoint SEQ=1" "SEQ='1' is not an integer in 2\.\.32768" \
  env OUT=$BAD/04 SEQ=1 $MPIRUN -np 2 lab/04_checkpoint
check_fails "04_checkpoint DATA missing" "$BAD/nothing\.bin.*No such file" \
  env OUT=$BAD/04 DATA=$BAD/nothing.bin $MPIRUN -np 2 lab/04_checkpoint
check_fails "06_prefetch MODES=fastest" "MODES='fastest': no mode 'fastest'" \
  env OUT=$BAD/06 MODES=fastest $MPIRUN -np 2 lab/06_prefetch
check_fails "06_prefetch STEPS=1" "STEPS='1' is not an integer in 2\.\.100000" \
  env OUT=$BAD/06 STEPS=1 $MPIRUN -np 2 lab/06_prefetch
check_fails "06_prefetch MBS=nan" "MBS='nan' is not an integer" env OUT=$BAD/06 MBS=nan $MPIRUN -np 2 lab/06_prefetch

# scripts/train.sh checks its own settings before it builds or launches anything.
check_fails "train.sh PROCESSES=0" "PROCESSES='0' is not a positive integer" \
  env PROCESSES=0 TRAIN_DIR=$BAD/train scripts/train.sh
check_fails "train.sh PROCESSES=two" "PROCESSES='two' is not a positive integer" \
  env PROCESSES=two TRAIN_DIR=$BAD/train scripts/train.sh
check_fails "train.sh MODEL=gpt2" "MODEL='gpt2' is not a model" env MODEL=gpt2 TRAIN_DIR=$BAD/train scripts/train.sh
check_fails "train.sh FSDP=deepspeed" "FSDP='deepspeed' is not allowed" \
  env FSDP=deepspeed TRAIN_DIR=$BAD/train scripts/train.sh
check_fails "train.sh BACKEND=tcp" "BACKEND='tcp' is not allowed" env BACKEND=tcp TRAIN_DIR=$BAD/train scripts/train.sh
check_fails "train.sh MBS=abc reaches lab 05's check" "MBS='abc' is not an integer" \
  env MBS=abc TRAIN_DIR=$BAD/train scripts/train.sh

# fsdptrace: a run directory it cannot read is refused naming the directory, file and line.
mkdir -p $BAD/trace_empty
rm -rf $BAD/trace_src && env OUT=$BAD/trace_src $MPIRUN -np 2 lab/01_shard >/dev/null 2>&1
rm -rf $BAD/trace_corrupt $BAD/trace_v99 && cp -r $BAD/trace_src $BAD/trace_corrupt &&
  cp -r $BAD/trace_src $BAD/trace_v99
sed -i '3s/.*/{"kind":"mark","ts":1.0,"rank":0,"text"/' $BAD/trace_corrupt/rank0.jsonl
sed -i '1s/"version":[0-9]*/"version":99/' $BAD/trace_v99/rank1.jsonl
check_fails "fsdptrace summary on a missing directory" \
  "cannot open $BAD/no_such_run/rank0\.jsonl: no run directory $BAD/no_such_run \(No such file" \
  trace/fsdptrace summary $BAD/no_such_run
check_fails "fsdptrace all on an empty directory" "$BAD/trace_empty has no rank0\.jsonl: not a run directory" \
  trace/fsdptrace all $BAD/trace_empty
check_fails "fsdptrace chrome on a corrupt JSONL line" "trace_corrupt/rank0\.jsonl line 3: not a JSON object" \
  trace/fsdptrace chrome $BAD/trace_corrupt
check_fails "fsdptrace summary on schema version 99" \
  "trace_v99/rank1\.jsonl line 1: schema version 99, this tool reads versions" trace/fsdptrace summary $BAD/trace_v99
check_fails "fsdptrace with an unknown subcommand" "unknown subcommand flame" trace/fsdptrace flame $BAD/trace_src

# qwen2_tool: checkpoints that are missing, corrupt, truncated or of the wrong shapes.
tool=(env OUT=$BAD/tool tests/bin/qwen2_tool)
"${tool[@]}" init tiny 1234 $BAD/ckpt num_hidden_layers=1 >/dev/null 2>&1
make_ckpt() { rm -rf "$BAD/$1" && cp -r $BAD/ckpt "$BAD/$1"; }
make_ckpt ckpt_json && printf '{"vocab_size": 260, ' > $BAD/ckpt_json/config.json
# set_config DIR FIELD=JSON...: a copy of the checkpoint whose config.json has those fields replaced (1.5, 1e999, -1)
set_config() {
  make_ckpt "$1" && python3 -c '
import sys
path, edits = sys.argv[1], sys.argv[2:]
lines = open(path).read().splitlines()
for field, value in (edit.split("=", 1) for edit in edits):
    lines = [f"\t\"{field}\": {value}," if line.strip().startswith(f"\"{field}\"") else line for line in lines]
open(path, "w").write("\n".join(lines) + "\n")' "$BAD/$1/config.json" "${@:2}"
}
set_config ckpt_layers num_hidden_layers=1.5
set_config ckpt_theta rope_theta=1e999
set_config ckpt_heads num_attention_heads=3
set_config ckpt_hidden hidden_size=-128
set_config ckpt_std initializer_range=-1
make_ckpt ckpt_truncated && truncate -s 100000 $BAD/ckpt_truncated/model.safetensors
make_ckpt ckpt_lm_head && python3 -c '
import json, struct, sys
path = sys.argv[1]
data = open(path, "rb").read()
size = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + size])
end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
header["lm_head.weight"] = {"dtype": "F32", "shape": [100, 128], "data_offsets": [end, end + 100 * 128 * 4]}
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + size:] + bytes(100 * 128 * 4))' \
  $BAD/ckpt_lm_head/model.safetensors
# generate DIR loads DIR/config.json, then DIR/model.safetensors
check_fails "qwen2_tool compare on a missing checkpoint" \
  "compare: cannot read $BAD/no_ckpt/config\.json: No such file" "${tool[@]}" compare $BAD/no_ckpt $BAD/ckpt 1
check_fails "qwen2_tool generate on a missing checkpoint" "cannot open $BAD/no_ckpt/config\.json: No such file" \
  "${tool[@]}" generate $BAD/no_ckpt 1 1.0 4 1 2
check_fails "qwen2_tool on a config.json that is not JSON" "$BAD/ckpt_json/config\.json is not a JSON object" \
  "${tool[@]}" compare $BAD/ckpt_json $BAD/ckpt 1
check_fails "qwen2_tool on config.json num_hidden_layers 1.5" \
  "ckpt_layers/config\.json: num_hidden_layers=1\.5 is not an integer" \
  "${tool[@]}" generate $BAD/ckpt_layers 1 1.0 4 1 2
check_fails "qwen2_tool on config.json rope_theta 1e999" \
  "ckpt_theta/config\.json: rope_theta=inf is not a finite number" "${tool[@]}" generate $BAD/ckpt_theta 1 1.0 4 1 2
check_fails "qwen2_tool on config.json with 3 heads for hidden_size 128" \
  "hidden_size 128 is not divisible by num_attention_heads 3" "${tool[@]}" generate $BAD/ckpt_heads 1 1.0 4 1 2
check_fails "qwen2_tool on config.json hidden_size -128" "hidden_size=-128 must be positive" \
  "${tool[@]}" generate $BAD/ckpt_hidden 1 1.0 4 1 2
check_fails "qwen2_tool on config.json initializer_range -1" "initializer_range=-1 must be a finite number >= 0" \
  "${tool[@]}" init $BAD/ckpt_std/config.json 1 $BAD/ckpt_std_out
truncated_safetensors="$BAD/ckpt_truncated/model\.safetensors: tensor 'model\.embed_tokens\.weight' ends at data byte"
truncated_safetensors+=" [0-9]+ but the file has only [0-9]+ data bytes"
check_fails "qwen2_tool on a truncated model.safetensors" "$truncated_safetensors" \
  "${tool[@]}" generate $BAD/ckpt_truncated 1 1.0 4 1 2
wrong_lm_head="tensor 'lm_head\.weight' has shape \[100, 128\] \(2 dims\), the model needs \[260, 128\]"
wrong_lm_head+=" \(tied: the shape of model\.embed_tokens\.weight\)"
check_fails "qwen2_tool on a tied lm_head.weight of the wrong shape" "$wrong_lm_head" \
  "${tool[@]}" generate $BAD/ckpt_lm_head 1 1.0 4 1 2
check_fails "qwen2_tool generate with a token beyond the vocabulary" \
  "generate: token '999' is not an integer in 0\.\.259" "${tool[@]}" generate $BAD/ckpt 1 1.0 4 1 999
check_fails "qwen2_tool init with seed 'abc'" "init: seed 'abc' is not an integer" \
  "${tool[@]}" init tiny abc $BAD/ckpt_seed
check_fails "qwen2_tool batches with global batch 'x'" "batches: global_batch 'x' is not an integer" \
  "${tool[@]}" batches 1 x 16 1 $BAD/b.bin

CHECK_TIMEOUT=$saved_timeout_badinput
