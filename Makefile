# Two commands from a fresh clone:  make demo  |  make test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench tables serve clean

setup: $(STAMP)

# torch is pinned to the local CPU wheel first, so nothing below pulls a CUDA build.
$(STAMP): pyproject.toml
	command -v tesseract >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq tesseract-ocr tesseract-ocr-eng >/dev/null; }
	# poppler's pdftotext: the independent word boxes the PDF geometry is checked against (tests, benchmarks/pdf_boxes.py)
	command -v pdftotext >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq poppler-utils >/dev/null; }
	# headless Chromium and its driver for the microscope's browser test (selenium is told their paths)
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }
	# real LaTeX manuals with a text layer: the offline document corpus (arr_coc.documents.corpus)
	test -f /var/lib/dpkg/info/texlive-latex-base-doc.list -a -f /var/lib/dpkg/info/texlive-latex-recommended-doc.list \
		|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq texlive-latex-base-doc texlive-latex-recommended-doc >/dev/null; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	# lmms-eval without its declared tree (torchvision, wandb, opencv, yt-dlp, ...): the test extra holds what
	# its evaluation path imports (docs/lmms_eval.md)
	$(BIN)/python -m pip install -q --no-deps lmms-eval==0.7.3
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: setup
	mkdir -p out
	$(BIN)/arr-coc look examples/receipt.jpg "What is the total?" --out out/receipt_arr.png

test: setup
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check arr_coc tests benchmarks examples docs
	$(BIN)/python -m pytest

serve: setup
	$(BIN)/arr-coc serve

bench: setup
	$(BIN)/python benchmarks/bench_core.py

# every evaluation table of README.md and docs/ and the `look` example, from the current code and weights
# (TABLES_FLAGS="--skip bench" leaves out the hour-long 3B timing)
tables: setup
	$(BIN)/python benchmarks/make_tables.py $(TABLES_FLAGS)

# Not part of `make test` or CI: every test file that compares floats through tests/tolerances.py, once per kernel
# variant this CPU can be forced into (torch at 1 and 2 threads, ATen's portable kernels, AVX2 ATen with SSE4.1
# oneDNN and MKL's conditional-numerical-reproducibility path), then per file the worst difference / tolerance
# under each variant (docs/reliability.md, "Tolerances that hold on any machine of this kind").
.PHONY: test-kernels
KERNEL_VARIANTS := threads-1:OMP_NUM_THREADS=1 threads-2:OMP_NUM_THREADS=2 aten-default:ATEN_CPU_CAPABILITY=default \
	alt-blas:ATEN_CPU_CAPABILITY=avx2,ONEDNN_MAX_CPU_ISA=SSE41,MKL_CBWR=COMPATIBLE
KERNEL_TESTS = $$(grep -rlE "^from (tolerances import|conftest import .*check_batch)" tests --include="test_*.py")
test-kernels: setup
	rm -rf out/kernels && mkdir -p out/kernels
	set -e; for v in $(KERNEL_VARIANTS); do name=$${v%%:*}; vars=$$(echo $${v#*:} | tr , ' '); \
		echo "== $$name: $$vars"; env $$vars $(BIN)/python tests/tolerances.py --probe; \
		env $$vars ARR_TOL_LOG=out/kernels/$$name.jsonl $(BIN)/python -m pytest -q $(KERNEL_TESTS); done
	$(BIN)/python tests/tolerances.py $$(for v in $(KERNEL_VARIANTS); do echo out/kernels/$${v%%:*}.jsonl; done)

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
