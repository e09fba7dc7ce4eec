# Crowdtrain: one top-level Makefile. Each source directory contributes a
# module.mk fragment that appends its sources, libraries and tests; this file
# holds the toolchain, the switches and the generic rules.
#
#   make                 build everything (CPU; CUDA too when nvcc is found)
#   make test            install missing Debian packages, build, run unit and
#                        integration tests, then both again under ASan+UBSan
#   make demo            throwaway PostgreSQL + coordinator + agent(s)
#   make bench           benchmarks, each printing a ratio against a reference
#   make fuzz            build the libFuzzer targets (clang) and run each briefly
#   make test-gpu        CUDA tests (needs a GPU)
#   make install         binaries, dashboard, systemd units, example configs
#                        (PREFIX=/usr/local, DESTDIR=, SYSCONFDIR=/etc, UNITDIR=)
#   make deb             Debian packages crowdtrain-agent, crowdtrain-coordinator
#                        into build/deb/ (CPU build in build-deb/)
#   make test-packages   the packages installed in a fresh Debian 12 root
#                        (mmdebstrap): units verified, services run, a run trained
#   make test-containers the images (docker/) built with podman on an mmdebstrap
#                        base; PostgreSQL + coordinator + agent train a run
#
# Switches: SANITIZER=address,undefined   DEBUG=1   CUDA=auto|0|1   V=1

SANITIZER ?=
DEBUG     ?= 0
CUDA      ?= auto
V         ?= 0

ifeq ($(SANITIZER),)
BUILD ?= build
else
BUILD ?= build-san
endif

Q := $(if $(filter 1,$(V)),,@)

CC      ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif

PKG_DEPS := libmicrohttpd jansson libcurl openssl libpq libargon2 libuv libprotobuf-c
PKG_CFLAGS := $(shell pkg-config --cflags $(PKG_DEPS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKG_DEPS) 2>/dev/null)

OPT := $(if $(filter 1,$(DEBUG)),-O0 -g3 -DCT_DEBUG=1,-O2 -g)
SANFLAGS := $(if $(SANITIZER),-fsanitize=$(SANITIZER) -fno-omit-frame-pointer -fno-sanitize-recover=all,)

CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wno-missing-field-initializers \
               -fno-strict-aliasing -pthread $(OPT) $(SANFLAGS) -MMD -MP
CPPFLAGS_BASE := -I. -Icommon -Ikernels -Itests/harness -I$(BUILD)/gen $(PKG_CFLAGS)
CFLAGS  = $(CFLAGS_BASE) $(EXTRA_CFLAGS)
CPPFLAGS = $(CPPFLAGS_BASE) $(EXTRA_CPPFLAGS)
LDFLAGS = -pthread $(SANFLAGS) $(EXTRA_LDFLAGS)
# Every binary links the same external libraries; modules add theirs to LDLIBS_EXTRA.
LDLIBS  = $(PKG_LIBS) $(LDLIBS_EXTRA) -lm

# Filled by the module fragments.
BINS :=
LIBS :=
UNIT_TESTS :=
INTEG_TESTS :=
BENCHES :=
FUZZERS :=
LDLIBS_EXTRA :=
CLEAN_EXTRA :=

.PHONY: all deps test unit integ unit-san integ-san demo bench fuzz test-gpu clean help \
        install deb test-packages test-containers
all: bins tests

help:
	@sed -n '1,22p' Makefile | sed 's/^# \{0,1\}//'

# Object rule shared by every module.
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(if $(Q),@echo "  CC    $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# objs_of(dir-or-files): object paths for a list of .c files.
objs_of = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

include $(wildcard common/module.mk) $(wildcard kernels/module.mk) \
        $(wildcard coordinator/module.mk) $(wildcard agent/module.mk) \
        $(wildcard web/module.mk) $(wildcard tests/module.mk)

.PHONY: bins tests
bins: $(BINS)
tests: $(UNIT_TESTS) $(INTEG_TESTS)

deps:
	$(Q)./scripts/install-deps.sh

# `make test` installs packages first, then re-enters make so pkg-config sees them.
# Builds run on every core (CI has 2); the unit tests two at a time (each uses
# one core or waits on its own deadlines; those that measure time say
# ct-serial and run alone), the integration tests one at a time (they start
# several agents each and check rounds' members and timings).
NPROC := $(shell nproc 2>/dev/null || echo 2)
UNIT_JOBS ?= 2
test: deps
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) all
	$(Q)rc=0; \
	  ./scripts/run-tests.sh --suite unit --jobs $(UNIT_JOBS) $(UNIT_TESTS) || rc=1; \
	  ./scripts/run-tests.sh --suite integration $(INTEG_TESTS) || rc=1; \
	  $(MAKE) --no-print-directory unit-san || rc=1; \
	  $(MAKE) --no-print-directory integ-san || rc=1; \
	  if [ $$rc -ne 0 ]; then echo "make test: FAILED"; else echo "make test: all suites passed"; fi; exit $$rc

unit: $(UNIT_TESTS)
	$(Q)./scripts/run-tests.sh --suite unit --jobs $(UNIT_JOBS) $(UNIT_TESTS)

integ: bins $(INTEG_TESTS)
	$(Q)./scripts/run-tests.sh --suite integration $(INTEG_TESTS)

unit-san:
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) SANITIZER=address,undefined all
	$(Q)$(MAKE) --no-print-directory SANITIZER=address,undefined unit

# The integration tests again, driving binaries built with ASan + UBSan.
integ-san:
	$(Q)$(MAKE) --no-print-directory -j$(NPROC) SANITIZER=address,undefined all
	$(Q)$(MAKE) --no-print-directory SANITIZER=address,undefined integ

demo: deps
	$(Q)$(MAKE) --no-print-directory bins
	$(Q)./scripts/demo.sh

bench: deps
	$(Q)$(MAKE) --no-print-directory all $(BENCHES)
	$(Q)./scripts/bench.sh $(BENCHES)

# Installing (scripts/install.sh says where each file goes). As root without
# DESTDIR it also creates the system user crowdtrain and /var/lib/crowdtrain.
PREFIX ?= /usr/local
DESTDIR ?=
SYSCONFDIR ?= /etc
UNITDIR ?= $(PREFIX)/lib/systemd/system
install: bins
	$(Q)./scripts/install.sh --build $(BUILD) --prefix $(PREFIX) --sysconfdir $(SYSCONFDIR) \
	    --unitdir $(UNITDIR) $(if $(DESTDIR),--destdir $(DESTDIR),$$([ "$$(id -u)" -eq 0 ] && echo --setup-system))

# The packages are built without CUDA: no Debian 12 package provides the CUDA
# runtime a CUDA build links (scripts/make-deb.sh).
deb:
	$(Q)$(MAKE) --no-print-directory BUILD=build-deb CUDA=0 bins
	$(Q)./scripts/make-deb.sh build-deb build/deb

test-packages: deb
	$(Q)./scripts/test-packages.sh build/deb

test-containers: deb
	$(Q)./scripts/test-containers.sh build/deb

clean:
	rm -rf build build-san build-fuzz build-deb $(CLEAN_EXTRA)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
