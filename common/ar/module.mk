# common/ar/: the averaging engine. Its wire schema (ar.proto) is compiled
# with protoc-c into $(BUILD)/gen/ar/ and joins libct_common, like p2p's.
AR_PROTO := common/ar/ar.proto
AR_GEN_C := $(BUILD)/gen/ar/ar.pb-c.c
AR_GEN_H := $(BUILD)/gen/ar/ar.pb-c.h
COMMON_GEN_SRCS += $(AR_GEN_C)

$(AR_GEN_C) $(AR_GEN_H) &: $(AR_PROTO)
	@mkdir -p $(BUILD)/gen
	$(if $(Q),@echo "  PROTOC $<")
	$(Q)protoc-c --proto_path=common --c_out=$(BUILD)/gen $<

$(call objs_of,$(wildcard common/ar/*.c tests/unit/ar/*.c tests/fuzz/fuzz_ar_*.c tests/bench/bench_ar*.c)): | $(AR_GEN_H)

# The averaging bandwidth benchmark (`make bench`). Prerequisites name the
# libraries by path: tests/module.mk and COMMON_LIB are defined after this.
BENCH_AR := $(BUILD)/tests/bench/bench_ar
$(BENCH_AR): $(BUILD)/obj/tests/bench/bench_ar.o $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a $(LDLIBS)
BENCHES += $(BENCH_AR)

# All-reduce against PyTorch's gloo (`make bench`): separate peer processes,
# next to tests/bench/bench_allreduce_gloo.py run by the binary itself.
BENCH_AR_GLOO := $(BUILD)/tests/bench/bench_allreduce_gloo
$(call objs_of,tests/bench/bench_allreduce_gloo.c): | $(AR_GEN_H)
$(BENCH_AR_GLOO): $(BUILD)/obj/tests/bench/bench_allreduce_gloo.o $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a $(LDLIBS)
BENCHES += $(BENCH_AR_GLOO)

# The aggregator's per-element loops (norm, weighted sum, average) are the
# engine's hot path: -O3 lets GCC vectorize them.
$(call objs_of,common/ar/ar_agg.c common/ar/ar_codec.c common/ar/ar_round.c): EXTRA_CFLAGS += -O3
