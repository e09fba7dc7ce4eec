# common/moe/: decentralized mixture-of-experts (seed 002). Sources join
# libct_common through common/module.mk.

# ---- expert server throughput benchmark (moe-proto: moe_msg, moe_batch,
# agent/moe/moe_server). Links the agent library (the server lives there);
# prerequisites name the libraries by path: agent/module.mk and
# tests/module.mk are read after this file.
BENCH_MOE_SERVER := $(BUILD)/tests/bench/bench_moe_server
$(BENCH_MOE_SERVER): $(BUILD)/obj/tests/bench/bench_moe_server.o $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_agent.a $(BUILD)/lib/libct_kernels.a $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_agent.a $(BUILD)/lib/libct_kernels.a $(BUILD)/lib/libct_common.a $(LDLIBS)
BENCHES += $(BENCH_MOE_SERVER)
# ---- end of the expert server benchmark
