# common/data/: gzip-compressed shards (Fashion-MNIST IDX files) are
# decompressed with zlib.
LDLIBS_EXTRA += -lz

# common/data/spm.cc: SentencePiece models through Debian's libsentencepiece
# (C++, the tree's one C++ file; spm.h is its C interface). Linked only into
# the binaries that use it (--as-needed).
CXX_FOR_CC := $(if $(findstring clang,$(CC)),clang++,g++)
# UBSan's vptr check needs the C++ runtime of the sanitizers, which the C
# link (gcc/clang, not g++/clang++) does not bring: left out for this file.
CXXFLAGS_BASE := -std=c++17 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -fno-strict-aliasing \
                 -pthread $(OPT) $(SANFLAGS) $(if $(SANFLAGS),-fno-sanitize=vptr) -MMD -MP
COMMON_EXTRA_OBJS += $(BUILD)/obj/common/data/spm.o
$(BUILD)/obj/common/data/spm.o: common/data/spm.cc
	@mkdir -p $(@D)
	$(if $(Q),@echo "  CXX   $<")
	$(Q)$(CXX_FOR_CC) $(CPPFLAGS) $(CXXFLAGS_BASE) $(filter-out -std=%,$(EXTRA_CFLAGS)) -c $< -o $@
LDLIBS_EXTRA += -Wl,--push-state,--as-needed -lsentencepiece -lstdc++ -Wl,--pop-state
