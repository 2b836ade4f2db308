# Unit suites (Check). MPI suites run at world sizes 1-4, including sizes that do not divide the buffers.
check "test_mem: tracked allocator" tests/bin/test_mem
