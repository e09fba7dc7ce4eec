# common/dht/: the DHT sources join libct_common through common/module.mk;
# this fragment adds the DHT benchmark to `make bench`. (Prerequisites name
# the harness library by path: tests/module.mk is read after this file.)
BENCH_DHT := $(BUILD)/tests/bench/bench_dht
$(BENCH_DHT): $(BUILD)/obj/tests/bench/bench_dht.o $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a $(LDLIBS)
BENCHES += $(BENCH_DHT)
