# tests/: one binary per test file, discovered from the tree, so adding a
# test is adding a file. tests/unit/<area>/test_*.c links the libraries of
# <area>; tests/integ/test_*.c links the harness and drives the real
# binaries. scripts/run-tests.sh runs each binary in its own process with a
# timeout and prints "N passed, N failed, N skipped".

HARNESS_SRCS := $(wildcard tests/harness/*.c)
HARNESS_LIB := $(BUILD)/lib/libct_harness.a
$(HARNESS_LIB): $(call objs_of,$(HARNESS_SRCS))
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

# Libraries each unit-test area links, most dependent first.
TEST_LIBS_common      = $(COMMON_LIB)
TEST_LIBS_kernels     = $(AGENT_LIB) $(KERNELS_LIB) $(COMMON_LIB)
TEST_LIBS_coordinator = $(COORD_LIB) $(COMMON_LIB)
TEST_LIBS_agent       = $(AGENT_LIB) $(KERNELS_LIB) $(COMMON_LIB)
TEST_LIBS_p2p         = $(COMMON_LIB)
TEST_LIBS_dht         = $(COMMON_LIB)
TEST_LIBS_moe         = $(AGENT_LIB) $(KERNELS_LIB) $(COMMON_LIB)

UNIT_AREAS := $(notdir $(wildcard tests/unit/*))

# Areas without an entry above link the common library only.
define unit_area_rules
TEST_LIBS_$(1) ?= $$(COMMON_LIB)
UNIT_SRCS_$(1) := $$(wildcard tests/unit/$(1)/test_*.c)
UNIT_BINS_$(1) := $$(patsubst %.c,$(BUILD)/%,$$(UNIT_SRCS_$(1)))
UNIT_TESTS += $$(UNIT_BINS_$(1))
$(BUILD)/tests/unit/$(1)/%: $(BUILD)/obj/tests/unit/$(1)/%.o $$(TEST_LIBS_$(1)) $(HARNESS_LIB)
	@mkdir -p $$(@D)
	$$(if $$(Q),@echo "  LD    $$@")
	$$(Q)$$(CC) $$(LDFLAGS) $$< -o $$@ $(HARNESS_LIB) $$(TEST_LIBS_$(1)) $$(LDLIBS) -lcmocka
endef
$(foreach a,$(UNIT_AREAS),$(eval $(call unit_area_rules,$(a))))

INTEG_SRCS := $(wildcard tests/integ/test_*.c)
INTEG_TESTS += $(patsubst %.c,$(BUILD)/%,$(INTEG_SRCS))
$(BUILD)/tests/integ/%: $(BUILD)/obj/tests/integ/%.o $(HARNESS_LIB) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(HARNESS_LIB) $(INTEG_LIBS_$*) $(COMMON_LIB) $(LDLIBS) -lcmocka

# Contribution accounting: the test and the bench sign reports with the
# agent's encoder (agent/peer/report.c), so they link the agent library.
INTEG_LIBS_test_contrib = $(AGENT_LIB)
$(BUILD)/tests/integ/test_contrib: $(AGENT_LIB)
INTEG_LIBS_test_expert_credit = $(AGENT_LIB)
$(BUILD)/tests/integ/test_expert_credit: $(AGENT_LIB)
INTEG_LIBS_test_peer_runtime = $(AGENT_LIB)
$(BUILD)/tests/integ/test_experts_serve: $(AGENT_LIB) $(KERNELS_LIB)
INTEG_LIBS_test_experts_serve = $(AGENT_LIB) $(KERNELS_LIB)
$(BUILD)/tests/integ/test_experts_takeover: $(AGENT_LIB) $(KERNELS_LIB)
INTEG_LIBS_test_experts_takeover = $(AGENT_LIB) $(KERNELS_LIB)
$(BUILD)/tests/integ/test_peer_runtime: $(AGENT_LIB)
# The expert tests' helpers (tests/harness/ct_moe.c) use the agent's peer
# runtime and expert client.
$(BUILD)/tests/integ/test_expert_ckpt: $(AGENT_LIB) $(KERNELS_LIB)
INTEG_LIBS_test_expert_ckpt = $(AGENT_LIB) $(KERNELS_LIB)
BENCH_REPORTS := $(BUILD)/tests/bench/bench_reports
$(BENCH_REPORTS): $(BUILD)/obj/tests/bench/bench_reports.o $(AGENT_LIB) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(AGENT_LIB) $(COMMON_LIB) $(LDLIBS)
tests/bench/bench_reports.sh: $(BENCH_REPORTS) $(COORD_BIN)
BENCHES += tests/bench/bench_reports.sh

# Keep test objects around (make treats them as intermediate otherwise).
.SECONDARY:

# Fuzz targets: tests/fuzz/fuzz_<name>.c defines LLVMFuzzerTestOneInput over
# one pure parser; seed corpus in tests/fuzz/corpus/<name>/, optional
# dictionary tests/fuzz/<name>.dict. `make fuzz` builds them with clang,
# libFuzzer, ASan and UBSan in build-fuzz/ and runs each for FUZZ_SECONDS.
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZERS := $(patsubst %.c,$(BUILD)/%,$(FUZZ_SRCS))
FUZZ_LIBS = $(COORD_LIB) $(AGENT_LIB) $(KERNELS_LIB) $(COMMON_LIB)
$(BUILD)/tests/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(FUZZ_LIBS)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) -fsanitize=fuzzer $< -o $@ $(FUZZ_LIBS) $(LDLIBS)

.PHONY: fuzz-build
fuzz-build: $(FUZZERS)

FUZZ_SECONDS ?= 30
fuzz: deps
	$(Q)$(MAKE) --no-print-directory BUILD=build-fuzz CC=clang SANITIZER=address,undefined \
	    EXTRA_CFLAGS=-fsanitize=fuzzer-no-link fuzz-build
	$(Q)./scripts/run-fuzz.sh $(FUZZ_SECONDS) $(patsubst %.c,build-fuzz/%,$(FUZZ_SRCS))

# Volunteers on separate hosts (network namespaces; root): reachability
# time and the NAT run's seconds per step against the all-public run's.
BENCH_HOSTS := $(BUILD)/tests/bench/bench_hosts
$(BENCH_HOSTS): $(BUILD)/obj/tests/bench/bench_hosts.o $(HARNESS_LIB) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(HARNESS_LIB) $(COMMON_LIB) $(LDLIBS)
BENCHES += $(BENCH_HOSTS)

# Circuit relays in namespaces (root): a NAT'ed peer's throughput through a
# relay whose link is capped, against the same stream straight to the relay.
BENCH_RELAY := $(BUILD)/tests/bench/bench_relay
$(BENCH_RELAY): $(BUILD)/obj/tests/bench/bench_relay.o $(HARNESS_LIB) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(HARNESS_LIB) $(COMMON_LIB) $(LDLIBS)
BENCHES += $(BENCH_RELAY)

# Pipeline stages on 8 hosts of two speeds (network namespaces; root): the
# cost model's seconds per step against the measured ones, DT-FM's schedule
# against a random assignment.
BENCH_PIPE_HOSTS := $(BUILD)/tests/bench/bench_pipeline_hosts
$(BENCH_PIPE_HOSTS): $(BUILD)/obj/tests/bench/bench_pipeline_hosts.o $(HARNESS_LIB) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(HARNESS_LIB) $(COMMON_LIB) $(LDLIBS)
BENCHES += $(BENCH_PIPE_HOSTS)

# Asynchronous DMoE trainers under emulated expert latency (seed 002 §4.1,
# Figure 4): samples/s at 0, 50, 100, 200 ms, each against 0 ms.
BENCH_EXPERTS_LATENCY := $(BUILD)/tests/bench/bench_experts_latency
$(BENCH_EXPERTS_LATENCY): $(BUILD)/obj/tests/bench/bench_experts_latency.o $(HARNESS_LIB) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(HARNESS_LIB) $(COMMON_LIB) $(LDLIBS)
BENCHES += $(BENCH_EXPERTS_LATENCY)

# DMoE convergence (2 trainers x 4 expert servers against train --local) and
# failures (calls failing with p = 0.1, a server killed, its experts taken
# over): the issue's accuracy goals. Long (10-20 min per run).
BENCH_EXPERTS_CONVERGE := $(BUILD)/tests/bench/bench_experts_converge
$(BENCH_EXPERTS_CONVERGE): $(BUILD)/obj/tests/bench/bench_experts_converge.o $(HARNESS_LIB) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(HARNESS_LIB) $(COMMON_LIB) $(LDLIBS)
BENCHES += $(BENCH_EXPERTS_CONVERGE)
