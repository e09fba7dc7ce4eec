# coordinator/: crowdtrain-coordinator. Everything but main.c goes into a
# library for tests; SQL migrations and the OpenAPI document are compiled in.
COORD_SRCS := $(filter-out coordinator/main.c,$(wildcard coordinator/*.c))
COORD_GEN := $(BUILD)/gen/coord_migrations.c $(BUILD)/gen/coord_docs.c
COORD_LIB := $(BUILD)/lib/libct_coord.a
COORD_BIN := $(BUILD)/bin/crowdtrain-coordinator
LIBS += $(COORD_LIB)
BINS += $(COORD_BIN)

$(BUILD)/gen/coord_migrations.c: $(sort $(wildcard sql/*.sql)) scripts/embed.sh
	@mkdir -p $(@D)
	$(Q)./scripts/embed.sh $@ coord_migrations $(sort $(wildcard sql/*.sql))

$(BUILD)/gen/coord_docs.c: coordinator/openapi.json scripts/embed.sh
	@mkdir -p $(@D)
	$(Q)./scripts/embed.sh $@ coord_docs coordinator/openapi.json

$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# The agents' recipe parser and the models' checks (no backend): runs are
# refused at creation with a recipe no agent could load (api_runs.c).
COORD_RECIPE_SRCS := agent/train/train_config.c kernels/kern_config.c

$(COORD_LIB): $(call objs_of,$(COORD_SRCS) $(COORD_RECIPE_SRCS)) $(COORD_GEN:.c=.o)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  AR    $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(COORD_BIN): $(BUILD)/obj/coordinator/main.o $(COORD_LIB) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# The connection flood that bench_coordinator.sh runs beside honest traffic.
BENCH_FLOOD := $(BUILD)/tests/bench/bench_flood
$(BENCH_FLOOD): $(BUILD)/obj/tests/bench/bench_flood.o
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(LDLIBS)
# wrk replays pass requests signed beforehand by bench_passreq (each is accepted once).
BENCH_PASSREQ := $(BUILD)/tests/bench/bench_passreq
$(BENCH_PASSREQ): $(BUILD)/obj/tests/bench/bench_passreq.o $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $< -o $@ $(COMMON_LIB) $(LDLIBS)
tests/bench/bench_coordinator.sh: $(BENCH_FLOOD) $(BENCH_PASSREQ) $(COORD_BIN)
BENCHES += tests/bench/bench_coordinator.sh
