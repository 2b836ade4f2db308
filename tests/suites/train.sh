# scripts/train.sh: the seed's interface, fsdplab beside PyTorch FSDP on the same init and data.
check "train.sh FSDP=both: fsdplab's losses equal PyTorch FSDP's (derived bound)" tests/check_train_parity.sh
check "train.sh FSDP=edufsdp runs lab 05" bash -c 'TRAIN_DIR=runs/check/train_edu FSDP=edufsdp STEPS=1 scripts/train.sh | grep -q "^1/1: Loss = "'
check_fails "train.sh FSDP=deepspeed is refused, naming the value" "FSDP='deepspeed' is not allowed" \
  env FSDP=deepspeed scripts/train.sh
check_fails "train.sh BACKEND=nccl is refused on this build" "BACKEND=nccl needs the GPU build" \
  env BACKEND=nccl scripts/train.sh
