# common/moe/: decentralized mixture-of-experts (seed 002): the expert grid,
# DHT declarations, beam search, wire messages and the batching queue join
# libct_common through common/module.mk; this fragment adds their
# benchmarks to `make bench`. Prerequisites name the libraries by path:
# agent/module.mk and tests/module.mk are read after this file.

# Beam search over in-process DHT swarms with WAN round trips.
BENCH_MOE_BEAM := $(BUILD)/tests/bench/bench_moe_beam
$(BENCH_MOE_BEAM): $(BUILD)/obj/tests/bench/bench_moe_beam.o $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a $(LDLIBS)
BENCHES += $(BENCH_MOE_BEAM)

# Expert server throughput, batched against one request per batch (the
# server lives in the agent library).
BENCH_MOE_SERVER := $(BUILD)/tests/bench/bench_moe_server
$(BENCH_MOE_SERVER): $(BUILD)/obj/tests/bench/bench_moe_server.o $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_agent.a $(BUILD)/lib/libct_kernels.a $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_agent.a $(BUILD)/lib/libct_kernels.a $(BUILD)/lib/libct_common.a $(LDLIBS)
BENCHES += $(BENCH_MOE_SERVER)
