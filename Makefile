# fsdplab — build the runtime, the trace tool, the labs; run the checks.
#
#   make              build everything (installs missing dependencies first, via scripts/install_deps.sh)
#   make lab-01       one lab (01 ... 10) on NP=2 ranks through MPIRUN; settings from the environment or the command
#                     line: `make lab-01 NP=3`, `make lab-05 NP=4 STEPS=10`, `STEPS=10 MODEL=qwen2 make lab-05`
#   make run          lab 05 (the whole FSDP step): `make lab-05`
#   make check        every check; ends with "N passed, N failed"
#   make check-01     one lab's check (01 ... 10); check-unit, check-tokenizer, check-trace, check-model,
#                     check-train, check-resume, check-badinput, check-docs (every command README.md and docs/
#                     show), check-layout (the source tree's floors) for the other suites
#   make bench-model  fsdplab vs PyTorch forward+backward speed (scripts/bench_model.sh; prints ratios)
#   make bench-tokenizer  Qwen2's tokenizer, ours vs HF tokenizers, tokens/s on one thread (scripts/bench_tokenizer.sh)
#   make notebooks    execute notebooks/*.ipynb and render them to runs/notebooks/html/
#   make sanitize     the same build with ASan + UBSan (float-cast-overflow too; UB aborts) into build/sanitize/
#   make CUDA=1       the CUDA build into build/cuda/: the same programs with the CUDA device (DEVICE=cuda) and NCCL
#                     (BACKEND=nccl); core/cuda/*.cu through nvcc for sm_80 and sm_90. CUDA_HOME (default
#                     /usr/local/cuda), and NCCL_HOME, CUBLAS_HOME where NCCL and cuBLAS live elsewhere (pip's
#                     nvidia-* wheels: site-packages/nvidia/nccl, .../nvidia/cu13)
#   make exercise LAB=NN [DIR=...]   a copy of the tree (default runs/exercise/NN) with lab NN's solution regions
#                     replaced by stubs to write (docs/exercises.md, scripts/exercise.py, exercises/exercises.json)
#   make grade LAB=NN [QUICK=1] [DIR=...]   the lab's checks run in that copy, with a score; QUICK=1: a fast subset
#   make solution [LAB=NN] [DIR=...]   the solutions back into the copy
#   make check-exercises   the exercises' own check (tests/suites/exercises.sh)
#   make check-cuda-build   `make CUDA=1` links here, GPU or not (tests/suites/cuda_build.sh; skipped without nvcc)
#   make CUDA=emulated  the CUDA build on the CUDA emulator (tests/cuda_emulator/) into build/cuda_emulated/:
#                     DEVICE=cuda runs on the CPU, no toolkit or GPU needed; `make check-cuda-emulated` runs lab 05 on
#                     it against the CPU build (tests/suites/cuda_emulated.sh)
#   make check-sanitize   labs 01-05, the unit tests, fsdptrace and the parser fuzzer from that build
#                     (tests/suites/sanitize.sh)
#   make clean
#   make CFLAGS='-O1 -g -fsanitize=address' LDFLAGS=-fsanitize=address    your flags, added to the required ones
#
# MPIRUN is how `make lab-NN`, `make run` and the checks launch ranks; as root OpenMPI needs --allow-run-as-root, and
# 3-4 ranks on a 2-core machine need --oversubscribe. Users may also type `mpirun -np 2 lab/01_shard` themselves, with
# those two flags where they need them (or README.md's `export OMPI_...` setup for the shell).

SHELL := /bin/bash
.DEFAULT_GOAL := all

# Install what is missing before anything asks pkg-config for flags (a fresh machine has nothing).
HAVE_DEPS := $(shell command -v mpicc >/dev/null 2>&1 && \
  pkg-config --exists libcjson check openblas libpcre2-8 libutf8proc 2>/dev/null && echo yes)
ifneq ($(HAVE_DEPS),yes)
  $(info fsdplab: build dependencies missing; running scripts/install_deps.sh)
  INSTALL_STATUS := $(shell scripts/install_deps.sh 1>&2; echo $$?)
  ifneq ($(INSTALL_STATUS),0)
    $(error scripts/install_deps.sh failed (exit $(INSTALL_STATUS)); see its output above)
  endif
endif

# The CUDA build (make CUDA=1): every program again, in build/cuda/, with FSDPLAB_CUDA defined, core/cuda/*.c through
# mpicc and core/cuda/*.cu through nvcc, linked with the CUDA runtime, cuBLAS and NCCL. Each library is found by its
# file under <home>/lib64 or <home>/lib, the unversioned name or a versioned one (pip's wheels ship libnccl.so.2
# alone), linked by that path and found again at run time through an rpath, so no LD_LIBRARY_PATH is needed.
comma := ,
ifeq ($(CUDA),1)
  BUILD ?= build/cuda
  CUDA_HOME ?= /usr/local/cuda
  NCCL_HOME ?= $(CUDA_HOME)
  CUBLAS_HOME ?= $(CUDA_HOME)
  NVCC ?= $(CUDA_HOME)/bin/nvcc
  ifeq ($(wildcard $(NVCC)),)
    $(error make CUDA=1: no nvcc at $(NVCC); set CUDA_HOME to the CUDA toolkit (or NVCC to the compiler))
  endif
  cuda_library = $(firstword $(wildcard $(addprefix $(1)/,lib64/$(2).so lib/$(2).so lib64/$(2).so.* lib/$(2).so.*)))
  CUDART_LIBRARY := $(call cuda_library,$(CUDA_HOME),libcudart)
  CUBLAS_LIBRARY := $(call cuda_library,$(CUBLAS_HOME),libcublas)
  NCCL_LIBRARY := $(call cuda_library,$(NCCL_HOME),libnccl)
  ifeq ($(CUDART_LIBRARY),)
    $(error make CUDA=1: no libcudart.so under $(CUDA_HOME)/lib64 or $(CUDA_HOME)/lib; set CUDA_HOME)
  endif
  ifeq ($(CUBLAS_LIBRARY),)
    $(error make CUDA=1: no libcublas.so under $(CUBLAS_HOME)/lib64 or $(CUBLAS_HOME)/lib; set CUBLAS_HOME)
  endif
  ifeq ($(NCCL_LIBRARY),)
    $(error make CUDA=1: no libnccl.so under $(NCCL_HOME)/lib64 or $(NCCL_HOME)/lib; set NCCL_HOME)
  endif
  CUDA_LIBRARIES := $(CUDART_LIBRARY) $(CUBLAS_LIBRARY) $(NCCL_LIBRARY)
  # -isystem: warnings in CUDA's headers are not ours to fix under -Werror. The toolkit's headers first (its
  # cuda_runtime.h matches nvcc), then cuBLAS's and NCCL's homes. At run time the other way round: NCCL's and cuBLAS's
  # homes first, so a library you named is the one loaded even where the toolkit ships its own.
  CUDA_INCLUDES := $(addprefix -isystem ,$(CUDA_HOME)/include $(CUBLAS_HOME)/include $(NCCL_HOME)/include)
  REQUIRED_CFLAGS_CUDA := -DFSDPLAB_CUDA $(CUDA_INCLUDES)
  REQUIRED_LDLIBS_CUDA := $(CUDA_LIBRARIES) -lstdc++ $(addprefix -Wl$(comma)-rpath$(comma),$(patsubst %/,%,\
    $(dir $(NCCL_LIBRARY) $(CUBLAS_LIBRARY) $(CUDART_LIBRARY))))
  CUDA_ARCH_FLAGS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
  NVCCFLAGS ?= -O2 -g -lineinfo
  REQUIRED_NVCCFLAGS := -std=c++17 $(CUDA_ARCH_FLAGS) -DFSDPLAB_CUDA -I. $(CUDA_INCLUDES) \
    $(shell mpicc --showme:compile 2>/dev/null) -Xcompiler -Wall,-Wextra --Werror all-warnings
endif

# The CUDA emulator's build (make CUDA=emulated, into build/cuda_emulated/): the CUDA build's sources, FSDPLAB_CUDA
# defined, against tests/cuda_emulator/'s cuda_runtime.h and cublas_v2.h instead of the toolkit's, the .cu files
# through translate.py and g++; NCCL's calls over MPI (tests/cuda_emulator/nccl.c, for BACKEND=nccl). No CUDA
# toolkit or GPU needed: DEVICE=cuda runs on the CPU, every call synchronous (tests/cuda_emulator/cuda_runtime.h says
# what that does and does not show). tests/suites/cuda_emulated.sh runs it.
ifeq ($(CUDA),emulated)
  BUILD ?= build/cuda_emulated
  EMULATOR := tests/cuda_emulator
  REQUIRED_CFLAGS_CUDA := -DFSDPLAB_CUDA -I$(EMULATOR)
  REQUIRED_LDLIBS_CUDA := -lstdc++
  EMULATOR_CXX := g++ -std=c++17 -O2 -ffp-contract=off -Wall -Wextra -Werror -Wno-unused-parameter -I$(EMULATOR) \
    -I. -Icore/cuda $(shell pkg-config --cflags openblas) $(shell mpicc --showme:compile 2>/dev/null)
endif

CC := mpicc
# CFLAGS (default -O2 -g), CPPFLAGS, LDFLAGS and LDLIBS are the user's to set; what the build cannot do without is
# in REQUIRED_CFLAGS and REQUIRED_LDLIBS, which every compile and link line uses as well. The user's flags come after
# the required ones, so they can refine them (-O0, -Wno-error=...).
CFLAGS ?= -O2 -g
# Messages into fixed buffers may be cut short, on purpose: gcc's guesses about that are not errors here.
REQUIRED_CFLAGS := -std=c11 -Wall -Wextra -Werror -Wno-format-truncation -I. \
  $(shell pkg-config --cflags libcjson openblas libpcre2-8 libutf8proc) $(REQUIRED_CFLAGS_CUDA)
REQUIRED_LDLIBS := $(shell pkg-config --libs libcjson openblas libpcre2-8 libutf8proc) -lm $(REQUIRED_LDLIBS_CUDA)
COMPILE = $(CC) $(REQUIRED_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(KERNEL_CFLAGS)
LINK = $(COMPILE) $(LDFLAGS)
CHECK_CFLAGS := $(shell pkg-config --cflags check)
CHECK_LIBS := $(shell pkg-config --libs check)

ifeq ($(shell id -u),0)
  MPIRUN_ROOT := --allow-run-as-root
endif
MPIRUN ?= mpirun $(MPIRUN_ROOT) --oversubscribe
export MPIRUN

TRACE_SRC := trace/trace.c trace/chrome.c trace/run.c trace/segments.c trace/view_file.c trace/pickle.c \
  trace/snapshot.c trace/summary.c trace/memory_page.c trace/memory_page_assets.c trace/player.c \
  trace/player_assets.c trace/export.c
# core/ is one folder a floor, lowest first; a floor includes only the floors below it (tests/check_layers.py).
# core/cuda/ is the CUDA plug-in: the CUDA builds add it below, and it takes core/runtime/plugins_none.c's place.
CORE_FLOORS := base kernels memory device runtime data comm fsdp models io
CORE_SRC := $(filter-out core/runtime/plugins_none.c,$(foreach floor,$(CORE_FLOORS),$(wildcard core/$(floor)/*.c)))
ifeq ($(CUDA),)
  CORE_SRC += core/runtime/plugins_none.c
endif

# The CUDA build's sources: core/cuda/*.c (mpicc) and *.cu (nvcc), and the GPU test program.
ifeq ($(CUDA),1)
  CORE_SRC += $(filter-out core/cuda/kernels_stub.c,$(wildcard core/cuda/*.c)) \
    $(if $(wildcard core/cuda/kernels.cu),,core/cuda/kernels_stub.c)
  CUDA_SRC := $(wildcard core/cuda/*.cu)
  GPU_TESTS := $(if $(wildcard tests/gpu_layers.c),tests/bin/gpu_layers) tests/bin/gpu_gemm_bench
endif
ifeq ($(CUDA),emulated)
  CORE_SRC += core/cuda/cuda_check.c core/cuda/cuda_device.c core/cuda/cuda_stream.c core/cuda/kernel_profile.c \
    core/cuda/plugin.c core/cuda/nccl_comm.c $(EMULATOR)/nccl.c
  CUDA_SRC := $(wildcard core/cuda/*.cu)
  EMULATOR_OBJ := $(EMULATOR)/emulator.o $(EMULATOR)/runtime.o
  GPU_TESTS := tests/bin/gpu_layers tests/bin/gpu_gemm_bench tests/bin/emulator_self_test
endif
# BUILD (default build/) holds every object, library and binary, so the sources' folders hold sources only, and a
# second build with other flags lives in a tree of its own: `make sanitize` is `make BUILD=build/sanitize CFLAGS=...`.
# The default build's programs are also linked where users and the checks type them (LINKS: lab/05_full_step,
# trace/fsdptrace, tests/bin/, scripts/bench_model), so `mpirun -np 2 lab/05_full_step` works from the root.
BUILD ?= build
O := $(patsubst %/,%,$(BUILD))/
TRACE_OBJ := $(addprefix $(O),$(TRACE_SRC:.c=.o))
CORE_OBJ := $(addprefix $(O),$(CORE_SRC:.c=.o) $(CUDA_SRC:.cu=.o) $(EMULATOR_OBJ))
LABS := $(addprefix $(O),$(patsubst %.c,%,$(wildcard lab/[0-9][0-9]_*.c)))
UNIT_TESTS := $(addprefix $(O),$(patsubst tests/%.c,tests/bin/%,$(wildcard tests/test_*.c)))
TEST_TOOLS := $(addprefix $(O),tests/bin/qwen2_tool tests/bin/adamw_tool tests/bin/fuzz_parsers tests/bin/tokenize_tool)

LIBS := $(O)core/libfsdplab.a $(O)trace/libfsdptrace.a

.PHONY: all run check clean sanitize check-sanitize check-cuda-build check-cuda-emulated check-unit check-trace \
  check-model check-train check-badinput check-resume check-tokenizer check-layout check-docs bench-model \
  bench-tokenizer notebooks $(addprefix check-,01 02 03 04 05 06 07 08 09 10) exercise grade solution check-exercises

ifeq ($(O),build/)
LAB_LINKS := $(patsubst build/%,%,$(LABS))
LINKS := $(LAB_LINKS) trace/fsdptrace scripts/bench_model tests/bin
$(LAB_LINKS) trace/fsdptrace scripts/bench_model: %: build/%
	ln -sfn ../build/$* $@
# A directory of an older build in the way is removed first (ln would put the link inside it).
tests/bin: $(UNIT_TESTS) $(TEST_TOOLS)
	@if [ -d $@ ] && [ ! -L $@ ]; then rm -rf $@; fi
	ln -sfn ../build/tests/bin $@
endif

all: $(LIBS) $(O)trace/fsdptrace $(LABS) $(UNIT_TESTS) $(TEST_TOOLS) $(O)scripts/bench_model \
  $(addprefix $(O),$(GPU_TESTS)) $(LINKS)


# Every object depends on every header: the project is small, and a stale object is a worse bug than a rebuild.
HEADERS := $(wildcard core/*/*.h trace/*.h)
ifeq ($(CUDA),emulated)
  EMULATOR_HEADERS := $(wildcard $(EMULATOR)/*.h) core/cuda/kernels.cuh
  HEADERS += $(EMULATOR_HEADERS)
endif
$(O)%.o: %.c $(HEADERS)
	@mkdir -p $(@D)
	$(COMPILE) -c $< -o $@

ifeq ($(CUDA),emulated)
# The emulator's build: each .cu with its launches rewritten as C++ (translate.py), then g++; the emulator itself.
$(O)%.o: %.cu $(HEADERS) $(EMULATOR_HEADERS) $(EMULATOR)/translate.py
	@mkdir -p $(@D)
	python3 $(EMULATOR)/translate.py $< > $(@:.o=.cpp)
	$(EMULATOR_CXX) -c $(@:.o=.cpp) -o $@
$(O)%.o: %.cpp $(EMULATOR_HEADERS)
	@mkdir -p $(@D)
	$(EMULATOR_CXX) -c $< -o $@
# The emulator's own barriers checked (tests/cuda_emulator/self_test.cu; the unit suite runs it).
$(O)tests/bin/emulator_self_test: $(O)$(EMULATOR)/self_test.o $(LIBS)
	@mkdir -p $(@D)
	$(LINK) $< $(LIBS) $(REQUIRED_LDLIBS) $(LDLIBS) -o $@
else
# The CUDA build's kernels (CUDA=1): nvcc, C++17, for sm_80 (A100) and sm_90 (H100, H200).
$(O)%.o: %.cu $(HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(REQUIRED_NVCCFLAGS) $(NVCCFLAGS) -c $< -o $@
endif

# The layer kernels' element-wise loops (exp in softmax, SiLU, cross-entropy) vectorise only under fast-math, as
# llm.c builds with -Ofast. Only this file: the parity and finite-difference checks bound what it may change. After
# the user's CFLAGS, so `make CFLAGS=-O1` keeps the kernels fast; `make KERNEL_CFLAGS=` builds them with CFLAGS alone.
$(O)core/kernels/layers.o: KERNEL_CFLAGS := -O3 -ffast-math
# AdamW's element loop vectorises at -O3 once sqrtf needs no errno; fused multiply-adds stay exactly where the source
# writes fmaf (-ffp-contract=off), so the bits equal torch's op-by-op order on every CPU (core/kernels/adamw_kernel.c
# says why).
$(O)core/kernels/adamw_kernel.o: KERNEL_CFLAGS := -O3 -fno-math-errno -ffp-contract=off
# The bfloat16 layers round a product before the addition that follows it, as torch's ops do: no contraction either.
$(O)core/kernels/layers_bf16.o: KERNEL_CFLAGS := -O3 -fno-math-errno -ffp-contract=off

# Made afresh each time: `ar r` keeps members whose source left the build (a stand-in replaced by the real file), and
# the linker would take the first definition it finds.
$(O)trace/libfsdptrace.a: $(TRACE_OBJ)
	rm -f $@ && ar rcs $@ $^
$(O)core/libfsdplab.a: $(CORE_OBJ)
	rm -f $@ && ar rcs $@ $^

$(O)trace/fsdptrace: trace/fsdptrace.c $(O)trace/libfsdptrace.a
	@mkdir -p $(@D)
	$(LINK) $< $(O)trace/libfsdptrace.a $(REQUIRED_LDLIBS) $(LDLIBS) -o $@

# A lab also depends on the labs' shared headers (lab/trainer.h, lab/lesson_layer.h) and links the labs' trainer.
$(O)lab/%: lab/%.c $(O)lab/trainer.o $(LIBS) $(HEADERS) $(wildcard lab/*.h)
	@mkdir -p $(@D)
	$(LINK) $< $(O)lab/trainer.o $(LIBS) $(REQUIRED_LDLIBS) $(LDLIBS) -o $@
$(O)lab/trainer.o: $(wildcard lab/*.h)

$(O)scripts/bench_model: scripts/bench_model.c $(LIBS) $(HEADERS)
	@mkdir -p $(@D)
	$(LINK) $< $(LIBS) $(REQUIRED_LDLIBS) $(LDLIBS) -o $@

$(O)tests/bin/%: tests/%.c $(LIBS) $(HEADERS)
	@mkdir -p $(@D)
	$(LINK) $(CHECK_CFLAGS) $< $(LIBS) $(CHECK_LIBS) $(REQUIRED_LDLIBS) $(LDLIBS) -o $@

# The sanitizer build: ASan (LeakSanitizer included) and UBSan, float-to-int overflow too (GCC's -fsanitize=undefined
# leaves it out), every report fatal. A tree of its own, so the normal objects stay as they are. layers.o and
# optim.o keep their KERNEL_CFLAGS (-O3, fast-math): the sanitizers check the code that runs.
SANITIZE_DIR := build/sanitize
SANITIZE_FLAGS := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow \
  -fno-omit-frame-pointer
sanitize:
	@$(MAKE) --no-print-directory BUILD=$(SANITIZE_DIR) CFLAGS='-O1 -g $(SANITIZE_FLAGS)' \
	  LDFLAGS='$(SANITIZE_FLAGS)' all

# make lab-NN: lab NN (lab/NN_*.c) on NP ranks through MPIRUN, into its default run dir (runs/NN_name, unless OUT
# says otherwise), as root or not, on as many cores as you have: `make lab-01 NP=3`, `make lab-08 NP=4`. The lab
# reads its settings from the environment, and make passes it on, with any VAR=value given on make's command line, so
# `make lab-05 STEPS=10` and `STEPS=10 make lab-05` do the same. `make run` is lab 05, the main job.
NP ?= 2
.SECONDEXPANSION:
lab-%: $$(basename $$(wildcard lab/$$*_*.c))
	@test -n "$<" || { echo "make lab-$*: no lab/$*_*.c (the labs: $(LAB_NUMBERS))" >&2; exit 2; }
	$(MPIRUN) -np $(NP) $<
LAB_NUMBERS := $(sort $(foreach lab,$(wildcard lab/[0-9][0-9]_*.c),$(firstword $(subst _, ,$(notdir $(lab))))))
run: lab-05

# Suites are in tests/suites/<name>.sh; tests/run_checks.sh runs them and prints the closing summary line. `make check`
# runs two lanes side by side (much of a check is one process waiting on another, so two keep 2 cores busier than one);
# suites that share a build tree (unit and cuda_emulated: build/cuda_emulated) stay in one lane.
CHECK_LANE_1 := unit cuda_emulated lab05 lab08 lab09 badinput docs layout
CHECK_LANE_2 := tokenizer trace model lab01 lab02 lab03 lab04 lab06 lab07 lab10 train notebooks \
  cuda_build exercises resume
check: all
	@tests/run_checks.sh --lanes "$(CHECK_LANE_1)" "$(CHECK_LANE_2)"
# The sanitizer suite (tests/suites/sanitize.sh) runs the binaries of build/sanitize/.
check-sanitize: sanitize
	@SANITIZE_DIR=$(SANITIZE_DIR) tests/run_checks.sh sanitize
check-unit: all
	@tests/run_checks.sh unit
check-tokenizer: all
	@tests/run_checks.sh tokenizer
check-trace: all
	@tests/run_checks.sh trace
check-model: all
	@tests/run_checks.sh model
check-train: all
	@tests/run_checks.sh train
check-badinput: all
	@tests/run_checks.sh badinput
check-01: all
	@tests/run_checks.sh lab01
check-02: all
	@tests/run_checks.sh lab02
check-03: all
	@tests/run_checks.sh lab03
check-04: all
	@tests/run_checks.sh lab04
check-05: all
	@tests/run_checks.sh lab05
check-06: all
	@tests/run_checks.sh lab06
check-07: all
	@tests/run_checks.sh lab07
check-08: all
	@tests/run_checks.sh lab08
check-09: all
	@tests/run_checks.sh lab09
check-10: all
	@tests/run_checks.sh lab10
check-resume: all
	@tests/run_checks.sh resume
check-cuda-build: all
	@tests/run_checks.sh cuda_build
check-cuda-emulated: all
	@tests/run_checks.sh cuda_emulated
check-layout:
	@tests/run_checks.sh layout
check-docs: all
	@tests/run_checks.sh docs
check-exercises: all
	@tests/run_checks.sh exercises

# Exercises (docs/exercises.md): LAB=NN picks the lab, DIR the copy (default runs/exercise/NN).
exercise: all
	@test -n "$(LAB)" || { echo "make exercise: name the lab: make exercise LAB=03" >&2; exit 2; }
	@scripts/exercise.py make $(LAB) $(if $(DIR),--dir $(DIR))
grade:
	@test -n "$(LAB)" || { echo "make grade: name the lab: make grade LAB=03 [QUICK=1] [DIR=...]" >&2; exit 2; }
	@scripts/exercise.py grade $(LAB) $(if $(DIR),--dir $(DIR)) $(if $(QUICK),--quick)
solution:
	@scripts/exercise.py solution $(LAB) $(if $(DIR),--dir $(DIR))

# The notebooks executed, as HTML with their outputs, for reading.
notebooks: all
	python3 notebooks/run_notebooks.py --html runs/notebooks/html

bench-model: all
	scripts/bench_model.sh

bench-tokenizer: all
	scripts/bench_tokenizer.sh

clean:
	rm -f $(patsubst build/%,%,$(wildcard build/lab/[0-9][0-9]_*)) trace/fsdptrace scripts/bench_model tests/bin
	rm -rf runs/check build
