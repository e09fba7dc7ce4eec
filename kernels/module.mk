# kernels/: the op interface with its CPU (OpenBLAS + OpenMP) and CUDA
# (cuBLAS + own kernels) backends, the models and the optimizers, in one
# library libct_kernels.a.
#
# CUDA=auto builds the CUDA backend when nvcc is found (/usr/local/cuda/bin
# or PATH), CUDA=1 requires it, CUDA=0 skips it. The CUDA code is built for
# the GPUs volunteers own, in one fat binary (docs/kernels.md, "Supported
# GPUs"): SASS for each of CUDA_ARCHS (V100 sm_70, T4 / RTX 20 sm_75, A100
# sm_80, RTX 30 / A10 sm_86, RTX 40 / L4 sm_89, H100 sm_90) that this nvcc can
# build, plus PTX for CUDA_PTX_ARCH so newer GPUs (Blackwell) JIT it. CUDA 13
# dropped sm_70: with nvcc 13 the build starts at sm_75 and says so.
KERNELS_LIB := $(BUILD)/lib/libct_kernels.a
LIBS += $(KERNELS_LIB)

KERNELS_SRCS := $(shell find kernels -name '*.c' 2>/dev/null)
KERNELS_CU_SRCS := $(shell find kernels -name '*.cu' 2>/dev/null)
KERNELS_OBJS := $(call objs_of,$(KERNELS_SRCS))

CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
ifeq ($(CUDA),0)
KERN_WITH_CUDA := 0
else ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but nvcc was not found (set CUDA_HOME or NVCC))
endif
KERN_WITH_CUDA := 1
else ifneq ($(NVCC),)
KERN_WITH_CUDA := 1
else
KERN_WITH_CUDA := 0
endif

# The sanitizer build leaves CUDA out: ASan's shadow memory and the CUDA
# driver do not mix, and the sanitizer run covers the CPU reference only.
ifneq ($(SANITIZER),)
KERN_WITH_CUDA := 0
endif

# The CPU backend: OpenBLAS (single-threaded inside our own worker threads,
# kernels/cpu/kern_pool.h).
LDLIBS_EXTRA += -lopenblas

ifeq ($(KERN_WITH_CUDA),1)
CUDA_ARCHS_WANTED := 70 75 80 86 89 90
# What this nvcc can build (sm_NN lines of --list-gpu-code); an nvcc too old
# to answer gets the whole list.
NVCC_SM := $(patsubst sm_%,%,$(filter sm_%,$(shell $(NVCC) --list-gpu-code 2>/dev/null)))
CUDA_ARCHS ?= $(if $(NVCC_SM),$(filter $(NVCC_SM),$(CUDA_ARCHS_WANTED)),$(CUDA_ARCHS_WANTED))
CUDA_PTX_ARCH ?= $(lastword $(CUDA_ARCHS))
ifeq ($(strip $(CUDA_ARCHS)),)
$(error CUDA_ARCHS is empty: $(NVCC) builds none of $(CUDA_ARCHS_WANTED))
endif
CUDA_ARCHS_SKIPPED := $(filter-out $(CUDA_ARCHS),$(CUDA_ARCHS_WANTED))
# The lists also go into the code (kern_cuda.cu reports them to the device
# check in kern_gpu.c), so what the check believes is what was built.
KERN_COMMA := ,
CUDA_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a)$(KERN_COMMA)code=sm_$(a)) \
                $(if $(CUDA_PTX_ARCH),-gencode arch=compute_$(CUDA_PTX_ARCH)$(KERN_COMMA)code=compute_$(CUDA_PTX_ARCH))
NVCCFLAGS := -O2 -std=c++17 $(CUDA_GENCODE) -DCT_CUDA_SASS='"$(CUDA_ARCHS)"' \
             -DCT_CUDA_PTX=$(if $(CUDA_PTX_ARCH),$(CUDA_PTX_ARCH),0) \
             -I. -Icommon -Ikernels -Xcompiler -Wall,-Werror,-fPIC -MMD -MP
KERNELS_OBJS += $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(KERNELS_CU_SRCS))
$(BUILD)/obj/kernels/kern_backend.o: override EXTRA_CPPFLAGS += -DCT_HAVE_CUDA=1
LDLIBS_EXTRA += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
KERN_BUILD_MSG := kernels: CPU backend + CUDA backend (nvcc $(NVCC), $(addprefix sm_,$(CUDA_ARCHS))$(if \
                  $(CUDA_PTX_ARCH), + compute_$(CUDA_PTX_ARCH) PTX)$(if $(CUDA_ARCHS_SKIPPED),; not \
                  $(addprefix sm_,$(CUDA_ARCHS_SKIPPED)): this nvcc cannot build it))
else
KERN_BUILD_MSG := kernels: CPU backend only (CUDA=$(CUDA), nvcc $(if $(NVCC),found but disabled,not found))
endif

$(BUILD)/obj/%.cu.o: %.cu $(BUILD)/kernels-cuda.flag
	@mkdir -p $(@D)
	$(if $(Q),@echo "  NVCC  $<")
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The backend flag is part of kern_backend.o and of the archive's member
# list: a file holding it is rewritten (new mtime) only when it flips, so a
# CUDA=0 build after a CUDA=1 build (or back) rebuilds both. It holds the
# architecture lists too, so changing them rebuilds the CUDA objects. Done at
# parse time because tests/module.mk's bare .SECONDARY would let a missing stamp
# target count as up to date.
KERN_CUDA_FLAG := $(BUILD)/kernels-cuda.flag
KERN_CUDA_FLAG_TEXT := $(KERN_WITH_CUDA)$(if $(filter 1,$(KERN_WITH_CUDA)), sm $(CUDA_ARCHS) ptx $(CUDA_PTX_ARCH))
$(shell mkdir -p $(BUILD) && { [ "$$(cat $(KERN_CUDA_FLAG) 2>/dev/null)" = "$(KERN_CUDA_FLAG_TEXT)" ] || echo "$(KERN_CUDA_FLAG_TEXT)" >$(KERN_CUDA_FLAG); })
$(BUILD)/obj/kernels/kern_backend.o: $(KERN_CUDA_FLAG)

$(KERNELS_LIB): $(KERNELS_OBJS)
	@mkdir -p $(@D)
	@echo "  AR    $@  ($(KERN_BUILD_MSG))"
	$(Q)rm -f $@ && ar rcs $@ $^

# ---- benchmarks (make bench) ----
KERN_BENCH_BINS := $(BUILD)/tests/bench/bench_kernels $(BUILD)/tests/bench/bench_train_step \
                   $(BUILD)/tests/bench/bench_gpu_train $(BUILD)/tests/bench/bench_textdocs
$(KERN_BENCH_BINS): $(BUILD)/tests/bench/%: $(BUILD)/obj/tests/bench/%.o $(KERNELS_LIB) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(KERNELS_LIB) $(COMMON_LIB) $(LDLIBS)
# bench_train.sh runs bench_train_step and PyTorch side by side.
tests/bench/bench_train.sh: $(BUILD)/tests/bench/bench_train_step
# bench_gpu.sh: the GPU step of both example recipes and PyTorch's GPT-2
# small step; on a machine without a GPU it prints SKIP and exits 0.
tests/bench/bench_gpu.sh: $(BUILD)/tests/bench/bench_gpu_train
tests/bench/bench_train_fmnist.sh: $(BUILD)/bin/crowdtrain-agent
tests/bench/bench_train_dmoe.sh: $(BUILD)/bin/crowdtrain-agent
BENCHES += $(BUILD)/tests/bench/bench_kernels tests/bench/bench_train.sh tests/bench/bench_train_fmnist.sh \
           tests/bench/bench_train_dmoe.sh tests/bench/bench_gpu.sh $(BUILD)/tests/bench/bench_textdocs

# ---- make test-gpu: every op and a few training steps, CUDA against CPU ----
# Builds with CUDA=1 (fails without nvcc) and requires a GPU: no silent skip.
# test_gpu_check must then accept the real GPU for a small model and refuse
# it for an impossible one; test_cuda_archs reads the agent's fatbin (and
# asks cuobjdump where it is installed).
# tests/integ/test_join_gpu then trains one CUDA and two CPU peers together
# (identical parameter hashes at every step).
GPU_TESTS := $(addprefix $(BUILD)/tests/unit/kernels/,test_backends test_gpu_check test_cuda_archs) \
             $(BUILD)/tests/integ/test_join_gpu
test-gpu:
	$(Q)$(MAKE) --no-print-directory CUDA=1 $(GPU_TESTS) $(BUILD)/bin/crowdtrain-agent $(BUILD)/bin/crowdtrain-coordinator
	$(Q)CT_TEST_DEVICE=cuda CT_TEST_REQUIRE_GPU=1 ./scripts/run-tests.sh --suite gpu $(GPU_TESTS)
