# Unit suites (Check). The MPI suites run at world sizes 1-4: buffers of 1, 7, 1001, 4099 ... floats and random
# shape lists make sizes that do and do not divide by the world size.
check "test_mem: tracked allocator" tests/bin/test_mem
check "test_safetensors: round trip, HF-written file, refusals" tests/bin/test_safetensors
for ranks in 1 2 3 4; do
  check "test_comm -np $ranks: collectives vs Send/Recv reference" \
    env OUT=runs/check/test_comm_np$ranks $MPIRUN -np $ranks tests/bin/test_comm
done
for ranks in 1 2 3 4; do
  check "test_flat_param -np $ranks: reassembly, views, gradient mean" \
    env OUT=runs/check/test_flat_param_np$ranks $MPIRUN -np $ranks tests/bin/test_flat_param
done
for ranks in 1 2 4; do
  check "test_data -np $ranks: tokenizer, stories, loaders, world-size independent batches" \
    env OUT=runs/check/test_data_np$ranks $MPIRUN -np $ranks tests/bin/test_data
done
for ranks in 1 2 3 4; do
  check "test_optim -np $ranks: AdamW vs reference, state on the shard, padding, clip" \
    env OUT=runs/check/test_optim_np$ranks $MPIRUN -np $ranks tests/bin/test_optim
done
