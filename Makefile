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
# the oldest supported triton (vit_fast.base.versions.MIN_TRITON) beside the CPU torch: the kernel interpreter
# suite runs there too. numpy < 2.4: triton 3.6's interpreter fails on runtime loop bounds with numpy >= 2.4
OLDEST_VENV ?= .venv-oldest
OLDEST_BIN := $(OLDEST_VENV)/bin
OLDEST_SPEC ?= triton==3.6.0 numpy<2.4
OLDEST_TESTS ?= tests/kernels/test_kernel_*.py tests/kernels/test_cards.py tests/kernels/test_versions.py tests/kernels/test_triton_seam.py

# timm's own tests/test_models.py (the released file of the installed timm, from its sdist on the package registry)
# against apply_vit_fast: the tiny test_vit* models, the test_naflexvit_* tests (NaFlexVit; tiny models they build
# themselves) and test_eva_reset_classifier_* (an Eva: Perception Encoder's vit_pe_core_tiny_patch16_384 at 64 px,
# RoPE in our attention kernel) with backend triton (our kernels in Triton's interpreter on a CPU, their launches
# counted per model, a test without a model parameter under the models it patched: a patched suite that launched
# none fails; in CI), and one model per ViT feature at full size with backend auto (timm's forwards on a CPU; the
# kernels on a CUDA card; test-peers-timm-full, not in CI). docs/peers.md says what these runs prove and what not
PEERS ?= .peers
TIMM_PEER_TRITON ?= test_vit test_naflexvit test_eva_reset_classifier
TIMM_PEER_AUTO ?= vit_base_patch32_clip_quickgelu_224 vit_base_patch32_siglip_256 deit_tiny_distilled_patch16_224 \
	vit_small_patch16_18x2_224 vit_base_patch16_rpn_224 vit_tiny_r_s16_p8_224 vit_base_patch16_radio_v3 \
	vit_pwee_patch16_reg1_gap_256 vit_base_patch16_rope_224 vit_small_patch16_dinov3 aimv2_large_patch14_224

.PHONY: setup demo test test-serve test-oldest peers-hf test-peers-timm test-peers-timm-full lint wheel wheel-check clean perf-analyzer serve-bench serve-bench-images

$(BIN)/activate:
	@echo "setup: creating the virtual environment $(VENV) and updating its pip"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# each install step says what it is doing first: on a fresh machine the set-up takes minutes, pip is quiet
$(VENV)/.installed: pyproject.toml Makefile | $(BIN)/activate
	@echo "setup 1/3: $(TORCH_SPEC) into $(VENV) (the CPU build is a download of about 190 MB)"
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	@echo "setup 2/3: vit-fast from this checkout (editable) with the extras $(EXTRAS)"
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	@echo "setup 3/3: $(TIMM_SPEC) without its dependencies"
	# timm without its dependencies: its torchvision dependency would pull CUDA torch on a CPU machine, and
	# PyPI's torchvision (0.28.0 for torch 2.13.0) is built against CUDA torch: next to the CPU torch its import
	# fails ("operator torchvision::nms does not exist"). vit-fast imports timm's model code through its own
	# torchvision stand-in where torchvision does not import (vit_fast/interop/timm_import.py): timm:NAME, the bench's
	# timm peer and the tests work; `import timm` in your own code needs the torchvision build of your torch
	$(BIN)/python -m pip install --quiet --no-deps "$(TIMM_SPEC)"
	@touch $@
	@echo "setup: $(VENV) is ready"

setup: $(VENV)/.installed  ## create .venv and install vit-fast with its extras

demo: setup  ## the main job: vit-fast demo on the embedded default model
	$(BIN)/vit-fast demo

# both suites always run: a failure in the first still lets the serve suite run and report; the target fails if
# either did. tests/progress.py prints done / total and an estimate of the time left every PROGRESS_S seconds
PROGRESS_S ?= 60
PYTEST_PROGRESS := -p tests.progress --progress-every $(PROGRESS_S)
test: setup $(SERVE_VENV)/.installed  ## the whole CPU test suite (kernels in Triton's interpreter), then the serve suite
	@echo "make test 1/2: the suite in $(VENV)"; \
	main=0; $(BIN)/python -m pytest -q $(PYTEST_PROGRESS) || main=$$?; \
	echo "make test 2/2: the serve suite in $(SERVE_VENV)"; \
	serve=0; $(SERVE_BIN)/python -m pytest -q $(PYTEST_PROGRESS) tests/serve || serve=$$?; \
	echo "make test: the suite exited $$main, the serve suite $$serve (0: passed)"; \
	[ $$main -eq 0 ] && [ $$serve -eq 0 ]

$(SERVE_VENV)/.installed: pyproject.toml Makefile
	@echo "serve setup 1/3: creating the virtual environment $(SERVE_VENV) and updating its pip"
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_BIN)/python -m pip install --quiet --upgrade pip
	@echo "serve setup 2/3: $(TORCH_SPEC) into $(SERVE_VENV)"
	$(SERVE_BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	@echo "serve setup 3/3: vit-fast from this checkout (editable) with the extras serve,test (PyTriton bundles a Triton server)"
	$(SERVE_BIN)/python -m pip install --quiet -e ".[serve,test]"
	@touch $@
	@echo "serve setup: $(SERVE_VENV) is ready"

test-serve: $(SERVE_VENV)/.installed  ## vit-fast serve and Triton model repositories against a real Triton server (CPU, loopback)
	$(SERVE_BIN)/python -m pytest -q tests/serve

perf-analyzer: $(SERVE_VENV)/.installed  ## NVIDIA's perf_analyzer as .tools/perf_analyzer/perf_analyzer (glibc < 2.38: through Debian 13's libc)
	PYTHON=$(SERVE_BIN)/python benchmarks/get_perf_analyzer.sh .tools/perf_analyzer

serve-bench: perf-analyzer  ## perf_analyzer against vit-fast serve and a plain PyTriton script, side by side (benchmarks/README.md)
	$(SERVE_BIN)/python benchmarks/serve_perf.py --perf-analyzer .tools/perf_analyzer/perf_analyzer

serve-bench-images:  ## perf_analyzer sending image files (IMAGES=files or folders) to vit-fast serve --encoded (docs/deploy.md)
	@test -n "$(IMAGES)" || { echo "serve-bench-images: name the images to send: make serve-bench-images IMAGES=photos/"; exit 2; }
	$(MAKE) perf-analyzer
	$(SERVE_BIN)/python benchmarks/serve_perf.py --perf-analyzer .tools/perf_analyzer/perf_analyzer --images $(IMAGES)

$(OLDEST_VENV)/.installed: pyproject.toml Makefile
	@echo "oldest setup 1/3: creating the virtual environment $(OLDEST_VENV) and updating its pip"
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_BIN)/python -m pip install --quiet --upgrade pip
	@echo "oldest setup 2/3: $(TORCH_SPEC) with $(OLDEST_SPEC) and pytest into $(OLDEST_VENV)"
	$(OLDEST_BIN)/python -m pip install --quiet "$(TORCH_SPEC)" $(foreach s,$(OLDEST_SPEC),"$(s)") "pytest>=8"
	@echo "oldest setup 3/3: vit-fast from this checkout (editable), no extras"
	$(OLDEST_BIN)/python -m pip install --quiet -e .
	@touch $@
	@echo "oldest setup: $(OLDEST_VENV) is ready"

test-oldest: $(OLDEST_VENV)/.installed  ## the kernel interpreter tests on the oldest supported triton (3.6.0)
	$(OLDEST_BIN)/python -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
	$(OLDEST_BIN)/python -m pytest -q -p no:cacheprovider $(OLDEST_TESTS)

# transformers' released test harness for the installed version, fetched from PyPI (the sdist carries
# tests/test_modeling_common.py but not tests/models/*: the per-model testers are ours, tools/peers/).
# With transformers' own per-model files at hand (a folder laid out like its tests/: models/vit/test_modeling_vit.py,
# ..., plus utils/test_configuration_utils.py and utils/tiny_model_summary.json, which the sdist lacks):
#   make peers-hf PEERS_ARGS="--model-tests DIR"   runs those instead of ours, each unpatched / apply / optimize
# (add -k EXPR to select within each file; their CLIP and SigLIP files also import requests: pip install it first);
#   make peers-hf PEERS_ARGS="-k Siglip2"   runs some of our testers (their class names) in every mode
# Our testers run unpatched, then with apply_vit_fast and optimize, each with backend triton (our kernels in Triton's
# interpreter) and auto (transformers' forwards on a CPU); our kernels' launches are counted per tester class.
peers-hf: setup  ## transformers' ModelTesterMixin on ViT/DeiT/DINOv2/DINOv3/CLIP/SigLIP/SigLIP 2, patched vs not: no test lost, kernels launched
	@echo "peers-hf: installing parameterized into $(VENV) (transformers' test harness imports it)"
	$(BIN)/python -m pip install --quiet parameterized
	$(BIN)/python tools/peers/run_hf_peers.py $(PEERS) $(PEERS_ARGS)

$(PEERS)/timm/VERSION: $(VENV)/.installed
	rm -rf $(PEERS)/timm && mkdir -p $(PEERS)/timm/sdist
	v=$$($(BIN)/python -c "import importlib.metadata as m; print(m.version('timm'))") && \
	$(BIN)/python -m pip download --quiet --no-deps --no-binary :all: "timm==$$v" -d $(PEERS)/timm/sdist && \
	tar xzf $(PEERS)/timm/sdist/timm-$$v.tar.gz -C $(PEERS)/timm --strip-components=1 timm-$$v/tests && \
	echo $$v > $@

test-peers-timm: $(PEERS)/timm/VERSION  ## timm's tests/test_models.py (test_vit*, NaFlexVit, an Eva) unpatched and with apply_vit_fast (triton): no test lost, kernels launched
	$(BIN)/python tools/peer_timm.py --tests $(PEERS)/timm/tests/test_models.py --backend triton $(TIMM_PEER_TRITON)

# not in CI: full-size models on a CPU (timm's own forwards there), for a machine with time or a GPU
test-peers-timm-full: $(PEERS)/timm/VERSION  ## timm's tests/test_models.py on one full-size model per ViT feature
	$(BIN)/python tools/peer_timm.py --tests $(PEERS)/timm/tests/test_models.py --backend auto $(TIMM_PEER_AUTO)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# the wheel for the environment you already have: built by $(PYTHON) (yours, no venv made here; pip fetches the
# setuptools it builds with), then `pip install "$(ls dist/vit_fast-*.whl)[onnx]"` there keeps your torch
wheel:  ## build vit-fast's wheel into dist/ (replacing an older one there)
	rm -f dist/vit_fast-*.whl
	$(PYTHON) -m pip wheel --quiet --no-deps --wheel-dir dist .
	@echo "built $$(ls dist/vit_fast-*.whl); install it with its extras: pip install \"$$(ls dist/vit_fast-*.whl)[onnx]\""

# .ci/check_wheel.sh pins the fresh venv's torch pair itself (BESIDE_TORCH, BESIDE_TRITON there; TORCH_SPEC does
# not reach it): never an unpinned torch
wheel-check: setup  ## build a wheel; install it into a fresh venv (import check), then beside a pinned torch (vit-fast info)
	VENV=$(VENV) bash .ci/check_wheel.sh

clean:
	rm -rf $(VENV) $(SERVE_VENV) $(OLDEST_VENV) $(PEERS) build dist wheelhouse *.egg-info .pytest_cache
