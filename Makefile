# Two commands on a fresh machine:  make demo   (set up, decode with the shipped UA-GEC model:
#                                                beam 5 vs greedy vs IAD, checks, speedups)
#                                   make test   (set up, run the test suite)
# make demo-train: the training path (train a small model on the bundled sample, then the same)
# make demo-mt: translation, the shipped en-de student: greedy vs its drafters vs CTranslate2
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
WORK   ?= work
# make demo LOAD=N: its benchmark runs beside N CPU-bound processes (a machine doing other work)
LOAD   ?= 0

.PHONY: setup demo demo-train demo-mt serve test test-fast test-e2e test-soak test-arm ende-cpu clean

# torch is pinned to the local CPU build: an unpinned torch pulls a multi-GB CUDA build
$(BIN)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip setuptools wheel
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e ".[data,bench,test,ct2,serve,hf]"
	# fairseq-fixed pulls in a torchaudio built for another torch, which cannot load (only fairseq's speech
	# examples import it); without it transformers imports cleanly
	$(BIN)/pip uninstall -y torchaudio
	touch $@

setup: $(BIN)/.installed

demo: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/demo.py --work $(WORK) --load $(LOAD)

demo-train: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/demo.py --train --work $(WORK)

demo-mt: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/demo_mt.py --work $(WORK) --load $(LOAD)

# make serve: the HTTP server on the shipped GEC model (docs/serving.md); MODEL=DIR PORT=N SERVE_ARGS="--workers 2 ..."
MODEL  ?= models/uagec-9x3
PORT   ?= 8080
serve: setup
	$(BIN)/python -m fairseq_aggressive.serving.cli $(MODEL) --port $(PORT) $(SERVE_ARGS)

# GAD and blockwise heads at CPU scale on the Debian en-de corpus: scripts/experiments/pipeline.py with the
# cpu scale of configs/translation/wmt14_ende.yaml (about 3 h on 2 cores; resumable; see docs/reproducing-papers.md)
ende-cpu: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/experiments/pipeline.py configs/translation/wmt14_ende.yaml \
	    --scale cpu --work $(WORK)/ende-cpu

test: setup
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=15 -m "not soak and not e2e" tests

# the library's tests in process: not those that train models, run whole pipelines or start commands (3 minutes)
test-fast: setup
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=10 -m "not slow and not soak and not e2e" tests

# whole runs end to end: the GEC and translation pipelines at their ci scale, the two demos,
# distributed training on CPU processes (tests marked e2e: several minutes)
test-e2e: setup
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=8 -m e2e tests

# the server soaked for a minute by 32 hostile clients (tests/test_serving_soak.py; FA_SOAK_SECONDS=N)
test-soak: setup
	$(BIN)/python -m pytest -q -m soak tests/test_serving_soak.py

# the engine's aarch64 targets (neon, generic) against x86's, bit for bit, under qemu-user
# (installs the cross compiler and qemu-user from the distribution's packages first)
test-arm: setup
	bash scripts/arm/install_tools.sh
	$(BIN)/python scripts/arm/check_bits.py

clean:
	rm -rf $(WORK)
