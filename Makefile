# GPUFlex: every target sets up what it needs from scratch (a fresh machine has only python3).
# torch is installed first and pinned, so that nothing later pulls a multi-gigabyte CUDA build.

VENV     ?= .venv
PY       := $(VENV)/bin/python
TORCH    := torch==2.13.0
PYTEST_ARGS ?=

.PHONY: help venv dev demo sim-demo test lint format bench clean contracts gas system-deps package runtime-pack screenshots web-screenshots

help:
	@echo "make demo            - marketplace, worker and five agents train and pay a job here"
	@echo "make sim-demo        - the network simulator: FedAvg and the three-way comparison"
	@echo "make test            - lint (ruff) and the whole test suite"
	@echo "make bench           - benchmarks; JSON and a Markdown table under bench/results/"
	@echo "make web-screenshots - laptop and phone screenshots of the web pages into docs/"
	@echo "make screenshots     - the contributor app's windows (this machine, measured) into docs/"

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH)

# One stamp per extras set, redone whenever pyproject.toml changes.
$(VENV)/.dev-installed: pyproject.toml contracts/package-lock.json | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH) -e ".[dev]"
	if command -v npm >/dev/null; then npm ci --prefix contracts --no-audit --no-fund --silent; \
	else echo "npm not found: the contracts recompile and JSON-RPC node tests will be skipped"; fi
	touch $@

# Debian packages the tests use: installed when running as root and missing.
# APPIMAGE_PACKAGES build our AppImage runtime (installers/linux/runtime) and the squashfs
# image: `make package` needs them, and tests/desktop/test_appimage.py builds a tiny AppImage.
APPIMAGE_PACKAGES := gcc libsquashfuse-dev libfuse3-dev zlib1g-dev libzstd-dev liblzma-dev liblz4-dev squashfs-tools
DEB_PACKAGES := bubblewrap chromium nginx-light desktop-file-utils $(APPIMAGE_PACKAGES)
system-deps:
	scripts/ensure-debian-packages.sh $(DEB_PACKAGES)

venv: $(PY)
dev: $(VENV)/.dev-installed

# The whole system on this machine: marketplace, worker, five agents, a buyer's job (README).
demo: dev
	scripts/ensure-debian-packages.sh bubblewrap
	$(VENV)/bin/gpuflex demo

# The network simulator alone: FedAvg on 8 simulated wan nodes, then the three-way comparison.
sim-demo: dev
	$(VENV)/bin/gpuflex-sim run examples/digits-mlp.yaml --nodes 8 --network wan
	$(VENV)/bin/gpuflex-sim compare examples/digits-mlp.yaml --nodes 8 --network wan --target 0.95

lint: dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint system-deps
	$(PY) -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

# The desktop bundle (tray app and gpuflex-node) for this platform; on Debian also the .deb,
# the AppImage's AppDir and the AppImage (installers/README.md). Then the tests that need
# what it built.
PACKAGE_TESTS := tests/desktop/test_installers.py tests/desktop/test_deb.py tests/desktop/test_appdir.py tests/desktop/test_appimage.py tests/desktop/test_deb_runtime.py
package: dev
	$(PY) -m pip install -q --disable-pip-version-check "pyinstaller==6.22.3"
	$(VENV)/bin/pyinstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller installers/gpuflex.spec
	dist/gpuflex/gpuflex-node --version
	if command -v dpkg-deb >/dev/null; then \
	  scripts/ensure-debian-packages.sh desktop-file-utils $(APPIMAGE_PACKAGES) && \
	  $(PY) installers/linux/build_deb.py --bundle dist/gpuflex --out dist && \
	  $(PY) installers/linux/build_appdir.py --bundle dist/gpuflex --out dist; fi
	$(PY) installers/bundle_sizes.py dist/gpuflex
	$(MAKE) runtime-pack
	$(PY) -m pytest -p no:cacheprovider -q $(PACKAGE_TESTS)

# The `cpu` training-runtime pack the lean bundle fetches (docs/runtime-packs.md), into
# dist/runtime/; an older one there is replaced (packs are content-addressed, so each build
# has a new name).
runtime-pack: dev
	rm -f dist/runtime/cpu-*.tar.gz dist/runtime/cpu-*.json
	PYTHON=$(PY) scripts/build-runtime-pack.sh cpu --out dist/runtime

screenshots: dev
	QT_QPA_PLATFORM=offscreen $(PY) -m desktop.gui.screenshots docs/screenshots

contracts: dev
	node contracts/compile.js

gas: dev
	$(PY) -m contracts.gas_report --out bench/results/contracts-gas.json --check

bench: dev
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache contracts/node_modules build dist

# Laptop and phone screenshots of the web marketplace's main pages, taken by its browser test
# (Debian's chromium, a live server and two real agents) into docs/screenshots/web/.
web-screenshots: dev
	GPUFLEX_WEB_SCREENSHOTS=docs/screenshots/web $(PY) -m pytest -p no:xdist -q tests/web/test_browser.py
