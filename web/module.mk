# web/: the dashboard the coordinator serves at / (see docs/dashboard.md).
# `npm ci` installs the pinned packages (uPlot; esbuild and playwright-core
# for the build and the browser tests) into web/node_modules whenever
# package.json or package-lock.json change; web/build.mjs bundles the app into
# $(BUILD)/web/dist, which build/bin/crowdtrain-coordinator finds on its own
# (../web/dist next to the binary). Built with the binaries when node and npm
# are installed (scripts/install-deps.sh installs them for `make test`).

WEB_NPM_STAMP := web/node_modules/.ct-npm-ci
WEB_SRCS := web/build.mjs web/index.html $(wildcard web/src/*.js web/src/*.css web/src/pages/*.js)
WEB_INDEX := $(BUILD)/web/dist/index.html
WEB_TOOLS := $(shell command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && echo yes)

$(WEB_NPM_STAMP): web/package.json web/package-lock.json
	$(if $(Q),@echo "  NPM   web (npm ci)")
	$(Q)cd web && npm ci --no-audit --no-fund --loglevel=error >/dev/null
	$(Q)touch $@

$(WEB_INDEX): $(WEB_NPM_STAMP) $(WEB_SRCS)
	$(if $(Q),@echo "  WEB   $(@D)")
	$(Q)node web/build.mjs $(@D) >/dev/null

.PHONY: web
ifeq ($(WEB_TOOLS),yes)
BINS += $(WEB_INDEX)
web: $(WEB_INDEX)
else
web:
	@echo "make web: node and npm are needed (scripts/install-deps.sh installs them)" >&2; exit 1
endif
