# scripts/train.sh: the seed's interface, fsdplab beside PyTorch FSDP on the same init and data.
check "train.sh FSDP=both: fsdplab's losses equal PyTorch FSDP's (derived bound)" tests/check_train_parity.sh
check "train.sh FSDP=both on Qwen2's vocabulary and tokenizer: losses equal PyTorch FSDP's (derived bound)" \
  tests/check_train_parity.sh qwen2
check "train.sh FSDP=both MP=bf16: fsdplab's mixed precision vs torch's MixedPrecision (derived bound)" \
  tests/check_train_parity.sh bf16
check "train.sh FSDP=both FSDP_VERSION=2 with prefetch lists (set_modules_to_forward_prefetch, 2 each way): losses \
equal torch fully_shard's (derived bound)" tests/check_train_parity.sh fsdp2_prefetch
check "train.sh FSDP=both FSDP_VERSION=2 MP=fp32,reduce=bf16,output=bf16 (MixedPrecisionPolicy.output_dtype): \
losses equal torch fully_shard's (derived bfloat16 bound)" tests/check_train_parity.sh output_bf16_fsdp2
check "MP=fp32,output=bf16: output_dtype's roundings bring fsdplab's step-1 gradients closer to torch fully_shard's" \
  tests/check_output_dtype.sh
check "train.sh FSDP=torch FSDP_VERSION=2 (fully_shard) = FSDP_VERSION=1 on 2 ranks: losses, parameters bit for bit" \
  tests/check_torch_fsdp2.sh
check "torch_fully_shard_layout.py: FSDP2's row ranges [r c, min(d0, (r + 1) c)), empty shards, the shards' bytes" \
  tests/check_torch_fsdp2.sh layout
check_fails "train.sh FSDP_VERSION=3 is refused, naming the value" "FSDP_VERSION='3' is not allowed" \
  env FSDP_VERSION=3 scripts/train.sh
check_fails "train.sh FSDP=torch FSDP_VERSION=2 STRATEGY=NO_SHARD is refused, naming the value" \
  "STRATEGY='NO_SHARD' with FSDP_VERSION=2" env FSDP=torch FSDP_VERSION=2 STRATEGY=NO_SHARD scripts/train.sh
check_fails "train.sh MP=fp16 is refused, naming the value" "MP='fp16' is not allowed" env MP=fp16 scripts/train.sh
check "train.sh FSDP=edufsdp runs lab 05" \
  bash -c 'TRAIN_DIR=runs/check/train_edu FSDP=edufsdp STEPS=1 scripts/train.sh | grep -q "^1/1: Loss = "'
check_fails "train.sh FSDP=deepspeed is refused, naming the value" "FSDP='deepspeed' is not allowed" \
  env FSDP=deepspeed scripts/train.sh
check_fails "train.sh BACKEND=nccl without a GPU is refused, saying so" \
  "BACKEND=nccl needs an NVIDIA GPU and none is visible" \
  env BACKEND=nccl scripts/train.sh
check_fails "train.sh FSDP=torch BACKEND=nccl without a GPU is refused, saying so" "BACKEND=nccl needs an NVIDIA GPU" \
  env BACKEND=nccl FSDP=torch scripts/train.sh
# The seed's own command line says MODEL=qwen2: lab 05 must take it as Qwen2-0.5B (cut to one layer and a byte vocab
# by CONFIG, so the check takes a second, not minutes).
check "train.sh MODEL=qwen2 runs lab 05 on qwen2-0.5b" \
  bash -c 'TRAIN_DIR=runs/check/train_qwen2 FSDP=edufsdp MODEL=qwen2 \
  CONFIG=num_hidden_layers=1,vocab_size=260 SEQ=16 MBS=1 ACC=1 STEPS=1 scripts/train.sh | tee /dev/stderr |
  grep -q "^(model qwen2-0.5b + CONFIG, "'
check_fails "train.sh MODEL=gpt2 is refused, listing the models" "MODEL='gpt2' is not a model; choose one of: .*qwen2" \
  env MODEL=gpt2 scripts/train.sh
# scripts/gpu_lease.sh's dry run: the whole lease on the CPU and the emulated CUDA build - gpu_check.sh's steps 2-5 (the
# layers and the tiny model against the CPU, the tiny model beside torch on gloo) and gpu_bench.sh (tiny, both sides),
# every bench setting's table in the format the GPU run will print (tests/check_gpu_bench.py), every part passed; the
# copy back (GPU_LEASE_COPY_TO) holds the summaries and only small text files.
check "gpu_lease.sh GPU_LEASE_DRY_RUN=1: gpu_check.sh steps 2-5 pass, gpu_bench.sh's rows and time tables" \
  bash -c 'rm -rf runs/check/gpu_lease_dry runs/check/gpu_lease_copy && GPU_LEASE_DRY_RUN=1 \
    GPU_LEASE_COPY_TO=runs/check/gpu_lease_copy scripts/gpu_lease.sh runs/check/gpu_lease_dry \
    > runs/check/gpu_lease_dry.log 2>&1 && cmp runs/check/gpu_lease_dry/lease.txt runs/check/gpu_lease_copy/lease.txt &&
    test -f runs/check/gpu_lease_copy/bench/gpu_bench.txt && test -z "$(find runs/check/gpu_lease_copy -type f \
    \( -size +2M -o ! -name "*.txt" ! -name "*.log" \))" &&
    python3 tests/check_gpu_bench.py runs/check/gpu_lease_dry/bench/gpu_bench.txt &&
    summary=runs/check/gpu_lease_dry/lease.txt && grep -q "^gpu_lease: 0 failed" $summary &&
    test "$(grep -c "^== .*: exit 0," $summary)" = 4 && test "$(grep -c "^PASS " $summary)" = 8 &&
    test "$(grep -c " PASS$" $summary)" = 56 &&
    ! grep -q "^FAIL" $summary'
# Past its deadline (GPU_BENCH_DEADLINE, which gpu_lease.sh sets) gpu_bench.sh starts no setting and says so.
check "gpu_bench.sh past GPU_BENCH_DEADLINE: every setting SKIPPED and said so, nothing run" \
  bash -c 'rm -rf runs/check/gpu_bench_late && GPU_BENCH_DRY_RUN=1 GPU_BENCH_DEADLINE=$(date +%s) \
    scripts/gpu_bench.sh runs/check/gpu_bench_late && test "$(grep -c ": SKIPPED, " \
    runs/check/gpu_bench_late/gpu_bench.txt)" = 3 && ! ls runs/check/gpu_bench_late/seed_fp32 2>/dev/null'
