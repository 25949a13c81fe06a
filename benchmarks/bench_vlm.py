"""End-to-end time of Qwen2.5-VL-3B on pages, batch 1 and batch B: full resolution vs gestalt + saccades.

The real-size Qwen2.5-VL-3B-Instruct architecture (its public config.json, in ``qwen_3b.py``) with
random weights: timing needs the shapes, not trained values. Pages of ``--size`` px (the bundled
receipt resized; 1344 px = 48 x 48 cells of 28 px = 2304 visual tokens; page b of a batch is it shifted by
b * 7 px, so no two pages of a batch share a cache entry), a fixed ~30-token chat prompt around each page.
Each ``--batch`` size B is one batch of B pages through every stage. Four methods, interleaved in every repeat
(same process, same load), each timed as allocation + vision + prefill through the public stages of
:mod:`arr_coc.vlm.stages` (``allocate``, ``encode``, ``prefill``, ``decode`` of one token):

* full resolution -- a ``full`` plan: every cell through the tower, 2304 tokens per page to the LLM;
* ``native_budget`` -- the model's own processor downscales each page to at most gestalt + K tokens
  (529 = 23 x 23 cells; choose K so that gestalt + K is a square, or the processor sends fewer), then one tower
  call encodes the batch (``adapter.encode_processed``): the equal-tokens baseline, the same tower and LLM work as
  the ``arr`` row without an allocation (the table checks 10 %); its vision includes the processor's CPU resize,
  timed apart as ``processor``;
* sparse, ``arr`` allocation -- ARR as ``arr-coc ask`` runs it (default channels: OCR, texture,
  learned saliency; MiniLM), on the model's device, all B pages in one ARR pass; then one tower call
  encodes every page's gestalt and K cells, and one batched prefill reads prefix, gestalt, saccades, question;
* sparse, ``vlm`` relevance -- the tower encodes the gestalts; the LLM prefills prefix + gestalt and
  reads the question over it (the first look, :mod:`arr_coc.vlm.first_look`, stopping at the last layer it
  reads); ARR's sampler picks K cells on that attention map; the tower encodes them and the LLM continues
  its cache with saccades + question. Its allocation is only the extra work.

Time to first token = allocation + vision + prefill of the batch (every prompt's first token comes out of the
one prefill); throughput = B / that time. Min / median / max of ``--repeats`` (default 5) under
``torch.inference_mode()`` at torch's default thread count, beside the FLOP estimate of
:func:`arr_coc.vlm.cost.prefill_flops`. Writes a markdown table and a PNG under ``--out``.

    python benchmarks/bench_vlm.py [--batch 1 8] [--size 1344] [--saccades 273] [--repeats 5] [--depth N]
                                   [--dtype auto|float32|bfloat16] [--tiny] [--channels ...] [--device cuda]

``--device cuda``: the VLM and ARR on the GPU (the OCR too: ``--ocr-backend auto`` runs the torch OCR there), every
timed stage synchronised with it; the table and plot are then ``bench_vlm_cuda.md`` / ``.png``.
``benchmarks/gpu_table.sh`` runs it on a GPU machine.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

# the model, its weights, inputs and report sit beside this script (running it puts the folder on sys.path)
from bench_vlm_flops import flop_table
from bench_vlm_report import METHODS, ROW_COLUMNS, result_stem, summarise, write_report
from qwen_3b import ROOT, build_model, choose_dtype, device_note, page, prompt_ids, qwen25_vl_3b_config
from tqdm import tqdm

from arr_coc.config import resolve_device
from arr_coc.engine.plan import Plan
from arr_coc.vlm import VLMAdapter, allocate, decode, encode, prefill
from arr_coc.vlm.generation import synchronize, timed
from arr_coc.vlm.qwen import Qwen25VLAdapter

__all__ = ["COLUMNS", "METHODS", "Qwen25VLAdapter", "build_model", "choose_dtype", "device_note", "main", "page",
           "pages", "qwen25_vl_3b_config", "result_stem"]
COLUMNS = ROW_COLUMNS
OCR_BACKENDS = ("auto", "onnxruntime", "torch")  # the text channels' ``ocr`` option (engine/channels/text.py)
SHIFT_PX = 7  # page b of a batch is the page shifted by b * 7 px: distinct content, the same work


def pages(size: int, batch: int) -> list[torch.Tensor]:
    """``batch`` distinct pages of ``size`` px: the receipt, shifted by b * SHIFT_PX px (wrapping) for page b."""
    base = page(size)
    return [torch.roll(base, shifts=b * SHIFT_PX, dims=2) for b in range(batch)]


def arr_allocator(cell: int, size: int, channels: Sequence[str] | None, query_encoder: str,
                  device: torch.device = torch.device("cpu"), ocr: str = "auto") -> Any:
    """ARR as ``arr-coc ask`` builds it (the default channels, OCR included, unless ``channels`` is given), on
    ``device`` (the model's: its texture, scorer, sampler and extraction run there); its text channels' OCR
    where ``ocr`` says (``auto``: ONNX Runtime for pages on the CPU, the torch OCR on the ARR's device otherwise)."""
    from arr_coc.config import ARRConfig, CanvasConfig, TextureConfig
    from arr_coc.engine.pipeline import ARR
    from arr_coc.engine.query import HashingQueryEncoder, MiniLMQueryEncoder

    encoder = HashingQueryEncoder() if query_encoder == "hashing" else MiniLMQueryEncoder().load()
    config = ARRConfig(canvas=CanvasConfig(cell=cell, max_pixels=max(size * size, CanvasConfig.max_pixels)),
                       texture=TextureConfig(channels=tuple(channels) if channels else None,
                                             options={c: {"ocr": ocr} for c in ("text_match", "key_value")}))
    return ARR(config, query_encoder=encoder).eval().to(device)


def as_pil(image: torch.Tensor) -> Any:
    """A [3, H, W] page in [0, 1] as the PIL image the model's processor reads (as ``encode`` makes it for a native
    plan)."""
    from PIL import Image

    return Image.fromarray((image.float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy())


def processor_ms(adapter: Any, image: torch.Tensor, tokens: int) -> float:
    """Milliseconds of the model's processor alone (tensor -> PIL -> resize, normalise, patchify on the CPU) on
    one page at a cap of ``tokens``: the CPU part inside ``native_budget``'s vision, which no other row has."""
    ip, cap = adapter.image_processor(), tokens * adapter.cell ** 2
    smallest = min(getattr(ip.size, "shortest_edge", None) or 4 * adapter.cell ** 2, cap)
    start = time.perf_counter()
    ip(images=[as_pil(image)], size={"shortest_edge": smallest, "longest_edge": cap}, return_tensors="pt")
    return (time.perf_counter() - start) * 1e3


def make_runs(adapter: VLMAdapter, arr: Any, images: Sequence[torch.Tensor], question: str, pre: list[int],
              suf: list[int], saccades: int, layers: Sequence[int] | None) -> dict[str, Callable[[], tuple]]:
    """Per method, a call that answers the batch ``images`` up to the prefill -> (stage ms, detail ms, page 0's
    visual tokens, its prompt length, first logits [B, 1, V], first-look work or None), through the public stages.

    Stages (:func:`arr_coc.vlm.generation.stage_ms`): ``allocation`` (choosing the saccades), ``vision``
    (tower calls), ``prefill`` (LLM forwards that a single pass makes too, the first token's logits
    included). ``detail`` holds the allocation's own stages (and ``native_budget``'s processor time).
    """
    from arr_coc.engine.cache import ImageCache
    from arr_coc.vlm.generation import stage_ms

    n = len(images)
    grid = (images[0].shape[1] // adapter.cell, images[0].shape[2] // adapter.cell)
    prompts = [(pre, suf)] * n

    def answer_prefill(t: dict[str, float], visual: list, prompt_ids: list, first_look: Any = None) -> tuple:
        prompt = prefill(adapter, visual, prompt_ids, first_look=first_look)
        _, logits = decode(adapter, prompt, max_new_tokens=1, timings=t)
        # one token: generate runs the prompt's last token and its logits, which a single pass's prefill does
        t["prefill"] = t.get("prefill", 0.0) + t.pop("decode", 0.0)
        return prompt, logits

    def full() -> tuple:
        t: dict[str, float] = {}
        with timed(t, "vision", adapter.device):
            vis = encode(adapter, [Plan("full", "full", grid)] * n, list(images))  # one tower call
        prompt, logits = answer_prefill(t, vis, prompts)
        return stage_ms(t), {}, vis[0], prompt.prefill.inputs_embeds.shape[1], logits, None

    def sparse(relevance: str) -> Callable[[], tuple]:
        def run() -> tuple:
            arr.cache = ImageCache()  # the OCR and every other image-only channel run again, as on new pages
            t: dict[str, float] = {}
            synchronize(adapter.device)
            begin = time.perf_counter()
            planned = allocate(adapter, list(images), [question] * n, saccades=saccades, arr=arr, relevance=relevance,
                               first_look_layers=layers, prompts=prompts, timings=t)  # one ARR pass for the batch
            synchronize(adapter.device)  # ARR's stages on a GPU run asynchronously: time the whole call
            wall = (time.perf_counter() - begin) * 1e3
            with timed(t, "vision", adapter.device):
                vis = encode(adapter, planned.plans, planned.images, encoded=planned.gestalt_tokens)
            prompt, logits = answer_prefill(t, vis, planned.prompts, planned.first_look)
            detail = {k.split("/", 1)[1]: v for k, v in t.items() if k.startswith("allocation/")}
            cached = 0 if planned.first_look is None else planned.first_look.attention_mask.shape[1]
            look = prompt.first_look_work(0, vis[0]) if planned.first_look is not None else None
            stages = stage_ms(t)
            # the allocation is the call's wall time less the first look's gestalt encode and prefill inside it
            # (timed as vision and prefill: a single pass does that work too)
            stages["allocation"] = wall - sum(v for k, v in t.items() if k.startswith(("vision/", "prefill/")))
            return stages, detail, vis[0], cached + prompt.prefill.inputs_embeds.shape[1], logits, look
        return run

    def native() -> tuple:  # the model's own downscale at the sparse paths' token count: nothing to allocate
        t: dict[str, float] = {}
        gestalt = arr.config.gestalt.grid_for(saccades, grid)
        tokens = gestalt[0] * gestalt[1] + saccades
        with timed(t, "vision", adapter.device):  # the processor resizes each page, then one tower call for the batch
            vis = adapter.encode_processed([as_pil(img) for img in images], tokens)
        prompt, logits = answer_prefill(t, vis, prompts)
        detail = {"processor": sum(processor_ms(adapter, img, tokens) for img in images)}  # outside the timed stages
        return stage_ms(t), detail, vis[0], prompt.prefill.inputs_embeds.shape[1], logits, None

    return {METHODS[0]: full, METHODS[1]: native, METHODS[2]: sparse("arr"), METHODS[3]: sparse("vlm")}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1], metavar="B",
                    help="batch sizes: B distinct pages through every stage at once (e.g. 1 8 32)")
    ap.add_argument("--size", type=int, default=1344, help="page side in px, a multiple of the 28 px cell")
    ap.add_argument("--saccades", type=int, default=273, help="saccades K (the gestalt follows arr-coc's rule)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats (min / median / max over them)")
    ap.add_argument("--warmup", type=int, default=0,
                    help="untimed passes of every method and batch (after one at batch 1 on a small page)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    ap.add_argument("--tiny", action="store_true", help="arr_coc's tiny config instead of the 3B one (smoke test)")
    ap.add_argument("--depth", type=int, default=None, metavar="N",
                    help="the 3B widths with N layers in each tower: the real shapes, minutes faster (harness checks)")
    ap.add_argument("--channels", nargs="+", default=None, metavar="NAME",
                    help="ARR's texture channels for the arr allocation (default: arr-coc's, OCR included)")
    ap.add_argument("--query-encoder", choices=("minilm", "hashing"), default="minilm")
    ap.add_argument("--ocr-backend", choices=OCR_BACKENDS, default="auto",
                    help="where the OCR channels run: auto (default: ONNX Runtime on the CPU, the torch OCR on the "
                         "ARR's device otherwise), onnxruntime (the CPU), torch (the ARR's device)")
    ap.add_argument("--question", default="What is the total?", help="the question ARR allocates for")
    ap.add_argument("--layers", type=int, nargs="+", default=None,
                    help="decoder layers the first look reads (default: the middle half)")
    ap.add_argument("--flops-only", action="store_true",
                    help="no timing: the model is built on the meta device (no memory) and only the FLOP table "
                         "(allocation included) and ARR's allocation time on the page are reported")
    ap.add_argument("--device", default="cpu", help="where the VLM and ARR run (cpu, cuda, cuda:1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if any(b < 1 for b in args.batch):
        raise SystemExit(f"--batch sizes must be at least 1, got {args.batch}")
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.flops_only:
        return flop_table(args, arr_allocator)
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    try:
        device = resolve_device(args.device)
    except ValueError as err:
        raise SystemExit(f"--device: {err}") from None
    dtype, dtype_note = choose_dtype(args.dtype, device)
    print(f"dtype: {dtype_note}")

    t = time.perf_counter()
    config = qwen25_vl_3b_config(tiny=args.tiny, layers=args.depth)
    small = qwen25_vl_3b_config(tiny=args.tiny, layers=1, vocab=None if args.tiny else 64)
    model = build_model(config, dtype, small_config=small, seed=args.seed).to(device)
    adapter = Qwen25VLAdapter(model)
    build_s = time.perf_counter() - t
    n_vit = sum(p.numel() for p in adapter.visual.parameters())
    n_all = sum(p.numel() for p in model.parameters())
    name = ("tiny Qwen2.5-VL (2 layers, width 32)" if args.tiny else "Qwen2.5-VL-3B-Instruct architecture"
            + (f" cut to {args.depth} layers per tower" if args.depth else ""))
    print(f"built {name}: {n_all / 1e9:.3f} B parameters ({n_vit / 1e6:.0f} M vision) in {build_s:.1f} s")

    cell = adapter.cell
    if args.size % cell:
        raise SystemExit(f"--size must be a multiple of the {cell} px cell, got {args.size}")
    grid = (args.size // cell, args.size // cell)
    if args.saccades > grid[0] * grid[1]:
        raise SystemExit(f"--saccades {args.saccades} exceeds the {grid[0] * grid[1]} cells of the page")
    arr = arr_allocator(cell, args.size, args.channels, args.query_encoder, device, args.ocr_backend)
    pre, suf = prompt_ids(config, args.seed)
    batches = sorted(set(args.batch))
    runs = {b: make_runs(adapter, arr, pages(args.size, b), args.question, pre, suf, args.saccades, args.layers)
            for b in batches}
    # a first untimed pass on a small page (8x8 cells) loads the channels' models and wakes up kernels cheaply
    side = min(grid[0], 8)
    warm = make_runs(adapter, arr, pages(side * cell, 1), args.question, pre, suf, side * side // 4, args.layers)
    keys = [(b, m) for b in batches for m in METHODS]
    times: dict[tuple, dict[str, list[float]]] = {k: {} for k in keys}
    details: dict[tuple, dict[str, list[float]]] = {k: {} for k in keys}
    seen: dict[tuple, tuple] = {}
    finite = True
    with torch.inference_mode():
        for method in METHODS:
            warm[method]()
    passes = args.warmup + args.repeats
    with torch.inference_mode(), tqdm(total=passes * len(keys), desc="bench_vlm") as bar:
        for rep in range(passes):
            order = keys[rep % len(keys):] + keys[:rep % len(keys)]  # no method or batch always runs first
            for key in order:
                bar.set_postfix_str(f"{'warm-up' if rep < args.warmup else f'repeat {rep - args.warmup + 1}'}: "
                                    f"batch {key[0]}, {key[1]}")
                stages, detail, vis, prompt, logits, look = runs[key[0]][key[1]]()
                synchronize(device)
                bar.update()
                finite &= bool(torch.isfinite(logits).all()) and logits.shape[0] == key[0]
                seen[key] = (len(vis), prompt, vis.vision_segments, look)
                if rep >= args.warmup:
                    for k in ("allocation", "vision", "prefill"):
                        times[key].setdefault(k, []).append(stages.get(k, 0.0))
                    for k, v in detail.items():
                        details[key].setdefault(k, []).append(v)
                del logits
    rows = summarise(adapter, keys, times, details, seen)
    write_report(args, argv, rows, device, dict(name=name, n_all=n_all, n_vit=n_vit, grid=grid, cell=cell,
                                                gestalt=arr.config.gestalt.grid_for(args.saccades, grid),
                                                text_tokens=len(pre) + len(suf), channels=list(arr.channels),
                                                dtype=dtype, dtype_note=dtype_note + device_note(device),
                                                build_s=build_s, run_s=time.perf_counter() - start, finite=finite))
    return rows


if __name__ == "__main__":
    main()
