# agent/: crowdtrain-agent. Everything except main.c goes into a library so
# unit tests can link it; sources in subdirectories are picked up too.
AGENT_SRCS := $(filter-out agent/main.c,$(shell find agent -name '*.c' 2>/dev/null))
AGENT_LIB := $(BUILD)/lib/libct_agent.a
AGENT_BIN := $(BUILD)/bin/crowdtrain-agent
LIBS += $(AGENT_LIB)
BINS += $(AGENT_BIN)

$(AGENT_LIB): $(call objs_of,$(AGENT_SRCS))
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(AGENT_BIN): $(BUILD)/obj/agent/main.o $(AGENT_LIB) $(KERNELS_LIB) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  LD    $@")
	$(Q)$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
