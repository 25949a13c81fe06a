#!/usr/bin/env bash
# bench_vlm's GPU table (benchmarks/results/bench_vlm_cuda.md) in one command, on a GPU machine that reaches no
# package registry and has torch (with CUDA) but maybe not transformers.
#
#   benchmarks/gpu_table.sh pack            here, with registry access: the wheels transformers needs, for the GPU
#                                           machine's Python (GPU_PYTHON, default 3.12), into .gpu_wheels/ (git-ignored,
#                                           ~45 MiB: under the 64 MiB a run carries; refused above 60 MiB)
#   benchmarks/gpu_table.sh run [ARGS...]   there, with .gpu_wheels/ carried: installs from it only the modules that are
#                                           missing (into /tmp/gpu_site, never into the system), then runs
#                                           bench_vlm.py --device cuda --batch 1 8 32 and writes the table to $OUT
#                                           (or benchmarks/results); ARGS are passed on to bench_vlm.py
#
# What cannot travel: MiniLM (91 MB) and the learned_saliency model (97 MB): the run uses the hashing query encoder
# and ARR's other default channels, their OCR run by torch on the GPU (--ocr-backend auto: RapidOCR's shipped ONNX
# graphs read by onnx, carried if missing; rapidocr, onnxruntime and cv2 must be on the GPU machine for its pre- and
# post-processing; the run stops and names what is missing otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.gpu_wheels
# transformers and the packages it imports, as module:package (pure Python, or binary for GPU_PYTHON); the run
# installs only those whose module the GPU machine lacks
MODULES=(transformers:transformers==5.24.0 "tokenizers:tokenizers>=0.23.1,<0.24" "huggingface_hub:huggingface-hub>=1.31,<3"
         "safetensors:safetensors>=0.8" regex:regex typer:typer click:click shellingham:shellingham hf_xet:hf-xet
         httpx:httpx httpcore:httpcore h11:h11 anyio:anyio certifi:certifi idna:idna sniffio:sniffio
         typing_extensions:typing-extensions filelock:filelock fsspec:fsspec yaml:pyyaml packaging:packaging tqdm:tqdm
         numpy:numpy onnx:onnx==1.23.2)
# channels: arr-coc's defaults less learned_saliency (its model does not fit what a run carries)
CHANNELS=(rgb y x eccentricity edges edges_inv highpass lowpass motion saliency distance text_match key_value)

case "${1:-}" in
  pack)
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
      --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --implementation cp -d "$WHEELS" "${MODULES[@]#*:}"
    mib=$(du -sm "$WHEELS" | cut -f1)
    ls -l "$WHEELS"
    if [ "$mib" -gt 60 ]; then echo "gpu_table.sh pack: $WHEELS is $mib MiB, over the 60 MiB left to carry" >&2; exit 1; fi
    echo "gpu_table.sh pack: $WHEELS is $mib MiB; carry it: run(carry=[\"$WHEELS\"], command=\"benchmarks/gpu_table.sh run\")"
    ;;
  run)
    shift
    python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_table.sh run: torch sees no CUDA device')"
    SITE=/tmp/gpu_site
    missing=()
    for pair in "${MODULES[@]}"; do
      python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('${pair%%:*}') is None)" || missing+=("${pair#*:}")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
      [ -d "$WHEELS" ] || { echo "gpu_table.sh run: missing ${missing[*]} and no $WHEELS/ (run 'pack' where a registry is reachable, carry $WHEELS)" >&2; exit 1; }
      echo "installing from $WHEELS into $SITE: ${missing[*]}"
      python3 -m pip install --quiet --no-index --no-deps --find-links "$WHEELS" --target "$SITE" "${missing[@]}"
    fi
    export PYTHONPATH="$PWD${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c "
import importlib.util as u, sys
gone = [m for m in ('numpy', 'PIL', 'tqdm', 'matplotlib', 'cv2', 'kornia', 'onnxruntime', 'rapidocr', 'onnx', 'transformers')
        if u.find_spec(m) is None]
sys.exit(f'gpu_table.sh run: not on this machine: {gone}; carry their wheels in $WHEELS' if gone else 0)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
    python3 benchmarks/bench_vlm.py --device cuda --batch 1 8 32 --warmup 1 --query-encoder hashing \
      --channels "${CHANNELS[@]}" --out "${OUT:-benchmarks/results}" "$@"
    ;;
  *)
    echo "usage: benchmarks/gpu_table.sh pack | run [bench_vlm.py args...]" >&2
    exit 2
    ;;
esac
