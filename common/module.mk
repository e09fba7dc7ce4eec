# common/: code both the coordinator and the agent use. Sources in common/
# and its subdirectories are picked up automatically; a subdirectory with
# special build needs (generated code) adds a module.mk of its own.
COMMON_SRCS := $(shell find common -name '*.c' 2>/dev/null)
COMMON_GEN_SRCS :=
COMMON_EXTRA_OBJS :=
include $(wildcard common/*/module.mk)
COMMON_LIB := $(BUILD)/lib/libct_common.a
LIBS += $(COMMON_LIB)

$(COMMON_LIB): $(call objs_of,$(COMMON_SRCS)) $(COMMON_GEN_SRCS:%.c=%.o) $(COMMON_EXTRA_OBJS)
	@mkdir -p $(@D)
	$(if $(Q),@echo "  AR    $@")
	$(Q)rm -f $@ && ar rcs $@ $^
