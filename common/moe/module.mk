# common/moe/: the expert grid, DHT declarations and beam search join
# libct_common through common/module.mk; this fragment adds the beam search
# benchmark to `make bench`. (Prerequisites name the harness library by
# path: tests/module.mk is read after this file.)
BENCH_MOE_BEAM := $(BUILD)/tests/bench/bench_moe_beam
$(BENCH_MOE_BEAM): $(BUILD)/obj/tests/bench/bench_moe_beam.o $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a $(LDLIBS)
BENCHES += $(BENCH_MOE_BEAM)
