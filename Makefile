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

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
