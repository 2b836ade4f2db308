# lab 04 — activation checkpointing. The lab asserts that peak activation memory drops and gradients are identical.
for ranks in 2 3; do
  run_lab "04_checkpoint -np $ranks: less activation memory, identical gradients" $ranks runs/check/04_np$ranks \
    04_checkpoint
done
check_fails "04_checkpoint MODEL=gpt2 is refused, listing the models" \
  "MODEL='gpt2' is not a model; choose one of: qwen2-0.5b \(or qwen2\), tiny" \
  env OUT=runs/check/04_bad MODEL=gpt2 $MPIRUN -np 2 lab/04_checkpoint
