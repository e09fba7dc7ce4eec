# common/p2p/: the wire schema is compiled with protoc-c at build time into
# $(BUILD)/gen/p2p/, and the generated C joins libct_common. Every object of
# the p2p and dht modules (and their tests) waits for the generated header.
P2P_PROTO := common/p2p/p2p.proto
P2P_GEN_C := $(BUILD)/gen/p2p/p2p.pb-c.c
P2P_GEN_H := $(BUILD)/gen/p2p/p2p.pb-c.h
COMMON_GEN_SRCS += $(P2P_GEN_C)

$(P2P_GEN_C) $(P2P_GEN_H) &: $(P2P_PROTO)
	@mkdir -p $(BUILD)/gen
	$(if $(Q),@echo "  PROTOC $<")
	$(Q)protoc-c --proto_path=common --c_out=$(BUILD)/gen $<

$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	$(if $(Q),@echo "  CC    $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(call objs_of,$(wildcard common/p2p/*.c common/dht/*.c)): | $(P2P_GEN_H)
