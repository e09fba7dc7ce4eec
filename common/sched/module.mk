# common/sched/: adaptive-averaging schedules; the linear program is solved
# with GLPK. The solve-time benchmark links the common library only.
LDLIBS_EXTRA += -lglpk

BENCH_SCHED := $(BUILD)/tests/bench/bench_sched
BENCHES += $(BENCH_SCHED)
$(BENCH_SCHED): $(BUILD)/obj/tests/bench/bench_sched.o $(BUILD)/lib/libct_common.a
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(BUILD)/lib/libct_common.a $(LDLIBS)
