# common/sched/: adaptive-averaging schedules; the linear program is solved
# with GLPK. The solve-time benchmark links the common library only.
LDLIBS_EXTRA += -lglpk

BENCH_SCHED := $(BUILD)/tests/bench/bench_sched
BENCHES += $(BENCH_SCHED)
$(BENCH_SCHED): $(BUILD)/obj/tests/bench/bench_sched.o $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_common.a $(LDLIBS)

# DeDLOC Table 1 (`make bench`): averaging rounds of our engine under
# per-peer bandwidth caps with all-reduce, a parameter server and the LP's plan.
BENCH_TABLE1 := $(BUILD)/tests/bench/bench_table1
$(call objs_of,tests/bench/bench_table1.c): | $(BUILD)/gen/ar/ar.pb-c.h
BENCHES += $(BENCH_TABLE1)
$(BENCH_TABLE1): $(BUILD)/obj/tests/bench/bench_table1.o $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_harness.a $(BUILD)/lib/libct_common.a $(LDLIBS)

# DT-FM's pipeline scheduler on the seed's five network scenarios (`make bench`).
BENCH_DTFM := $(BUILD)/tests/bench/bench_dtfm
BENCHES += $(BENCH_DTFM)
$(BENCH_DTFM): $(BUILD)/obj/tests/bench/bench_dtfm.o $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_common.a $(LDLIBS)
