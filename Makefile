# One-command set-up on a fresh Linux machine. On a CPU-only machine torch is pinned to the CPU build
# (an unpinned torch pulls multi-GB CUDA packages); on a GPU machine set TORCH_SPEC=torch.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= onnx,test,bench,demo,dev
TIMM_SPEC ?= timm>=1.0,<2
BIN := $(VENV)/bin
# the serve extra pins numpy < 2 (PyTriton), so its tests run in a virtual environment of their own
SERVE_VENV ?= .venv-serve
SERVE_BIN := $(SERVE_VENV)/bin

.PHONY: setup demo test test-serve lint wheel-check clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml Makefile | $(BIN)/activate
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	# timm without its dependencies: its torchvision dependency would pull CUDA torch on a CPU machine;
	# the tests import timm's model code through a torchvision stand-in (tests/_torchvision_standin.py)
	$(BIN)/python -m pip install --quiet --no-deps "$(TIMM_SPEC)"
	touch $@

setup: $(VENV)/.installed  ## create .venv and install vit-fast with its extras

demo: setup  ## the main job: vit-fast demo on the embedded default model
	$(BIN)/vit-fast demo

test: setup $(SERVE_VENV)/.installed  ## the whole CPU test suite (kernels in Triton's interpreter), then the serve suite
	$(BIN)/python -m pytest -q
	$(SERVE_BIN)/python -m pytest -q tests/serve

$(SERVE_VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_BIN)/python -m pip install --quiet --upgrade pip
	$(SERVE_BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(SERVE_BIN)/python -m pip install --quiet -e ".[serve,test]"
	touch $@

test-serve: $(SERVE_VENV)/.installed  ## vit-fast serve and Triton model repositories against a real Triton server (CPU, loopback)
	$(SERVE_BIN)/python -m pytest -q tests/serve

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

wheel-check: setup  ## build a wheel, install it into a fresh venv, import vit_fast.kernels and vit_fast.export
	VENV=$(VENV) bash .ci/check_wheel.sh

clean:
	rm -rf $(VENV) $(SERVE_VENV) build dist wheelhouse *.egg-info .pytest_cache
