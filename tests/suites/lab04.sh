# lab 04 — activation checkpointing. The lab asserts that peak activation memory drops and gradients are identical.
for ranks in 2 3; do
  run_lab "04_checkpoint -np $ranks: less activation memory, identical gradients" $ranks runs/check/04_np$ranks 04_checkpoint
done
check_fails "04_checkpoint MODEL=gpt2 is refused, naming the value" "MODEL='gpt2' is not allowed; choose one of: tiny, qwen2-0.5b" \
  env OUT=runs/check/04_bad MODEL=gpt2 $MPIRUN -np 2 lab/04_checkpoint
