"""The microscope's page (Gradio Blocks): controls on the left, the views of one allocation on the right.

Requests go through Gradio's queue one at a time (the CPU is the bottleneck; parallel requests
would only slow each other down). Bad input shows its message in the status line and leaves the
previous views in place; the server goes on serving.
"""
from __future__ import annotations

import itertools
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from arr_coc import examples as bundled
from arr_coc.app.context_tab import ContextView, context_request, release_memory
from arr_coc.app.service import (
    PARTS,
    PRESETS,
    SCORER_WEIGHTS,
    Microscope,
    Settings,
    error_line,
    methods,
    read_upload,
    render,
)
from arr_coc.config import DEFAULT_SACCADES, PIPELINE_CHANNELS, SamplerConfig
from arr_coc.documents.pdf import DEFAULT_DPI, MAX_DPI
from arr_coc.engine.channel_registry import CHANNELS

EXAMPLE_QUESTIONS = {"receipt.jpg": "What is the total?", "form.jpg": "What is the date of the request?",
                     "photo.jpg": "Where is the cat?"}
MAX_FILE_SIZE = "25mb"  # a phone photo or a scanned page; larger uploads are refused before they reach Python
MAX_SACCADES = 4096  # the canvas holds at most 4096 cells at 28 px (CanvasConfig.max_pixels)
QUEUE_SIZE = 32  # waiting requests beyond this are turned away with a "queue full" message
# B's sampler at first: the one that keeps a token in every region, next to the default's plain ranking
COMPARE_WITH = "stratified" if SamplerConfig.name != "stratified" else "topk"
KEEP_DOWNLOADS = 16  # requests whose JSON and PNG stay on disk (Gradio serves its own copy once sent)
STATE_TTL_S = 3600  # a browser session's last context view (a few MB of PNG) goes an hour after it was made
# channels a user can switch on; clip needs a model path (`arr-coc look --clip-model`), so it is not offered here
CHOOSABLE = tuple(n for n in CHANNELS.names() if n != "clip")


def _settings(saccades: Any, method: str, channels: list[str], weights: str, checkpoint: str | None,
              p0: float, p1: float, p2: float, cell: int) -> Settings:
    # the field is a float (precision=None): a whole-number field would round 2.5 to 2 before this check
    whole = isinstance(saccades, (int, float)) and not isinstance(saccades, bool) and float(saccades).is_integer()
    if not whole or not 1 <= saccades <= MAX_SACCADES:
        raise ValueError(f"the saccades K must be a whole number of tokens from 1 to {MAX_SACCADES}, got {saccades}")
    if not channels:
        raise ValueError("choose at least one texture channel")
    if weights == "checkpoint":
        if not checkpoint:
            raise ValueError("upload scorer weights (model.safetensors from `arr-coc train` or `save_pretrained`, or "
                             "an older .pt file) or choose shipped or hand-set")
        spec = checkpoint
    else:
        spec = SCORER_WEIGHTS[weights]
    # the pipeline's order first, so the default set matches the shipped weights whatever the clicks; then the rest
    ordered = tuple(n for n in (*PIPELINE_CHANNELS, *CHANNELS.names()) if n in channels)
    ordered = tuple(dict.fromkeys(ordered))
    return Settings(saccades=int(saccades), method=method, channels=ordered, weights=spec,
                    part_scale=(float(p0), float(p1), float(p2)), cell=cell)


def answered(n: int, skips: int, work: Callable[[], list[Any]]) -> list[Any]:
    """``work()``'s outputs, or request ``n``'s error as one line in the status and ``skips`` views left as they were.

    Bad input shows its own message; anything else is a bug: its traceback goes to the server's log and the page
    says so in one line, so no request ends in an empty error. Whatever the request held is freed either way.
    """
    try:
        return work()
    except Exception as err:  # noqa: BLE001 - the server goes on; a bug's traceback is logged just below
        line = error_line(err)
        if line is None:
            traceback.print_exc()
            line = f"internal error ({type(err).__name__}); the server log has the traceback"
        return [f"**Error** (request {n}): {line}"] + [gr.skip()] * skips
    finally:
        release_memory()


def context_answer(scope: Microscope, n: int, paths: list[str] | None, question: str, tokens: Any,
                   pages: str | None, dpi: Any = DEFAULT_DPI) -> list[Any]:
    """Request ``n`` of the context tab: [status, summary, strip, page number opened, that page, the session's view].

    The view (:class:`~arr_coc.app.context_tab.ContextView`) is all that stays; an error leaves the views as they were.
    """
    start = time.perf_counter()

    def work() -> list[Any]:
        v = context_request(scope, paths or [], question, tokens, (pages or "").strip() or None, dpi)
        return [f"Done: request {n} in {time.perf_counter() - start:.2f} s.", v.summary, v.strip, v.first,
                v.page(v.first), v]

    return answered(n, 5, work)


def open_answer(view: ContextView | None, number: Any) -> list[Any]:
    """"open page" in the context tab: [status, the page], from the session's view alone."""
    if view is None:
        return ["Allocate over a context first.", gr.skip()]
    try:
        return [f"Page {int(number)}.", view.page(int(number))]
    except (ValueError, TypeError) as err:
        return [f"**Error**: {err}", gr.skip()]


def build(scope: Microscope, workdir: str | Path | None = None) -> gr.Blocks:
    """The page, wired to ``scope``; the downloads go in ``workdir`` (default: a temporary folder of its own)."""
    examples = [[str(bundled.path(n)), q] for n, q in EXAMPLE_QUESTIONS.items()]
    requests = itertools.count(1)  # numbers each request in the status line, so every answer reads differently
    own = tempfile.TemporaryDirectory(prefix="arr-coc-downloads-") if workdir is None else None
    root = Path(own.name if own else workdir) / "downloads"
    root.mkdir(parents=True, exist_ok=True)

    def out_dir(n: int) -> Path:
        """A fresh folder for request ``n``'s downloads; folders of older requests than the last few go."""
        _owner = own  # referenced, so the closure keeps the folder's owner (and the folder) as long as the page
        for old in root.iterdir():
            if int(old.name) <= n - KEEP_DOWNLOADS:
                shutil.rmtree(old)
        (root / str(n)).mkdir()
        return root / str(n)

    def controls(suffix: str, method: str = SamplerConfig.name) -> list[gr.components.Component]:
        with gr.Group():
            m = gr.Dropdown(list(methods()), value=method, label=f"sampler or allocator {suffix}",
                            info="samplers place one-cell saccades; patches / quadtree place variable squares")
            ch = gr.CheckboxGroup(list(CHOOSABLE), value=list(PIPELINE_CHANNELS), label=f"texture channels {suffix}")
            wt = gr.Radio(["shipped", "hand-set", "checkpoint"], value="shipped", label=f"scorer weights {suffix}",
                          info="shipped: trained, when it fits the channels; checkpoint: a file from `arr-coc train`")
            ck = gr.File(label=f"scorer weights {suffix} (model.safetensors or .pt)",
                         file_types=[".safetensors", ".pt"], type="filepath", height=80)
            preset = gr.Radio(list(PRESETS), value="all on", label=f"preset {suffix}")
            sliders = [gr.Slider(0, 2, value=1, step=0.05, label=f"{p} {suffix}", info="1 = as trained, 0 = off")
                       for p in PARTS]

            def apply(name: str) -> list[Any]:
                p = PRESETS[name]
                return [p.get("sampler", method), *p["part_scale"]]

            preset.change(apply, preset, [m, *sliders])
        return [m, ch, wt, ck, *sliders]

    with gr.Blocks(title="arr-coc microscope", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        gr.Markdown("## arr-coc microscope: where do the saccades go?\n"
                    "Upload an image, ask a question, and see which full-resolution cells (saccades) "
                    "arr-coc sends a VLM next to a low-resolution gestalt of the whole image.")
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                upload = gr.File(label="image", file_types=["image"], type="filepath", elem_id="image-file", height=100)
                question = gr.Textbox(label="question", value="What is the total?", elem_id="question")
                gr.Examples(examples, [upload, question], label="bundled examples")
                saccades = gr.Number(value=DEFAULT_SACCADES, label="saccades K (full-resolution tokens)",
                                     precision=None, step=1, minimum=1, maximum=MAX_SACCADES, elem_id="saccades")
                ctl_a = controls("")
                run = gr.Button("Run", variant="primary", elem_id="run")
            with gr.Column(scale=2):
                status = gr.Markdown("Ready.", elem_id="status")
                with gr.Tabs():
                    with gr.Tab("Saccades"):
                        answer = gr.Textbox(label="VLM answer (from gestalt + saccades)", interactive=False,
                                            visible=scope.vlm is not None, elem_id="answer")
                        summary = gr.Markdown(elem_id="summary")
                        sacc = gr.Image(label="saccades (bright, outlined, numbered by rank) vs not sent (dimmed)",
                                        format="png", elem_id="saccades", interactive=False)
                    with gr.Tab("Relevance"):
                        heat = gr.Image(label="relevance (mixed)", format="jpeg", interactive=False)
                        parts = gr.Gallery(label="the three parts (each standardised) with their context weights",
                                           columns=3, format="jpeg")
                    with gr.Tab("Texture"):
                        channels = gr.Image(label="texture channels per token cell (false colour)", format="png",
                                            interactive=False)
                    with gr.Tab("What the VLM sees"):
                        with gr.Row():
                            gestalt = gr.Image(label="gestalt only", format="jpeg", interactive=False)
                            foveated = gr.Image(label="gestalt + saccades (foveated)", format="jpeg",
                                                interactive=False)
                    with gr.Tab("Tokens and timings"):
                        tokens = gr.Image(label="tokens per region", format="jpeg", interactive=False)
                        timings = gr.Markdown()
                    with gr.Tab("Compare"):
                        gr.Markdown("A second configuration on the same image, question and K.")
                        with gr.Row():
                            with gr.Column():
                                ctl_b = controls("(B)", method=COMPARE_WITH)
                                compare = gr.Button("Compare A and B", elem_id="compare")
                            with gr.Column():
                                sum_a, img_a = gr.Markdown(elem_id="summary-a"), gr.Image(label="A", interactive=False)
                            with gr.Column():
                                sum_b, img_b = gr.Markdown(elem_id="summary-b"), gr.Image(label="B", interactive=False)
                    with gr.Tab("Context (PDF or pages)"):
                        gr.Markdown("One token budget over a whole context: every page a small gestalt, the "
                                    "saccades ranked over all pages (the question above).")
                        with gr.Row():
                            ctx_files = gr.File(label="a PDF, or several images", file_count="multiple",
                                                file_types=[".pdf", "image"], type="filepath", elem_id="context-files")
                            with gr.Column():
                                ctx_tokens = gr.Number(value=1024, label="tokens T over all pages", precision=None,
                                                       minimum=2, elem_id="context-tokens")
                                ctx_pages = gr.Textbox(label="PDF pages (1-based, e.g. 1-20)", value="",
                                                       elem_id="context-pages")
                                ctx_dpi = gr.Number(value=DEFAULT_DPI, label="PDF dpi (lower takes more pages)",
                                                    precision=None, minimum=1, maximum=MAX_DPI, elem_id="context-dpi")
                                ctx_run = gr.Button("Allocate over the context", elem_id="context-run")
                        ctx_summary = gr.Markdown(elem_id="context-summary")
                        ctx_strip = gr.Image(label="the pages, saccades outlined", format="png", interactive=False,
                                             elem_id="context-strip")
                        ctx_open = gr.Number(value=1, label="open page", precision=0, minimum=1,
                                             elem_id="context-open")
                        ctx_page = gr.Image(label="the opened page and its saccades", format="png",
                                            interactive=False, elem_id="context-page")
                        ctx_state = gr.State(None, time_to_live=STATE_TTL_S)
                with gr.Row():
                    get_json = gr.DownloadButton("allocation JSON (look --json schema)", elem_id="download-json")
                    get_png = gr.DownloadButton("picture PNG", elem_id="download-png")

        def analyse(path: str | None, q: str, k: Any, *controls_a: Any) -> list[Any]:
            n, start = next(requests), time.perf_counter()

            def work() -> list[Any]:
                if not path:
                    raise ValueError("upload an image first (or click a bundled example)")
                settings = _settings(k, *controls_a, cell=scope.cell)
                v = render(scope.run(read_upload(path), q, settings), out_dir(n))
                return [f"Done: request {n} in {time.perf_counter() - start:.2f} s.", v.answer or "", v.summary,
                        v.saccades, v.relevance, v.parts, v.channels, v.gestalt, v.foveated, v.tokens, v.timings,
                        str(v.json_path), str(v.png_path)]

            return answered(n, 12, work)

        def both(path: str | None, q: str, k: Any, *controls_ab: Any) -> list[Any]:
            n, start = next(requests), time.perf_counter()

            def work() -> list[Any]:
                if not path:
                    raise ValueError("upload an image first (or click a bundled example)")
                image = read_upload(path)
                out = []
                for ctl in (controls_ab[:7], controls_ab[7:]):
                    v = render(scope.run(image, q, _settings(k, *ctl, cell=scope.cell)), out_dir(next(requests)))
                    out += [v.summary, v.saccades]
                return [f"Done: request {n} (A and B) in {time.perf_counter() - start:.2f} s.", *out]

            return answered(n, 4, work)

        def context(paths: list[str] | None, q: str, t: Any, pages: str, dpi: Any) -> list[Any]:
            return context_answer(scope, next(requests), paths, q, t, pages, dpi)

        ctx_run.click(context, [ctx_files, question, ctx_tokens, ctx_pages, ctx_dpi],
                      [status, ctx_summary, ctx_strip, ctx_open, ctx_page, ctx_state], api_name="context")
        ctx_open.submit(open_answer, [ctx_state, ctx_open], [status, ctx_page])

        outputs = [status, answer, summary, sacc, heat, parts, channels, gestalt, foveated, tokens, timings,
                   get_json, get_png]
        run.click(analyse, [upload, question, saccades, *ctl_a], outputs, api_name="analyse")
        question.submit(analyse, [upload, question, saccades, *ctl_a], outputs)
        compare.click(both, [upload, question, saccades, *ctl_a, *ctl_b], [status, sum_a, img_a, sum_b, img_b],
                      api_name="compare")
    return demo


def serve(scope: Microscope, host: str = "127.0.0.1", port: int = 7860, *, block: bool = True,
          workdir: str | Path | None = None) -> gr.Blocks:
    """Start the page on ``host:port`` (local only unless told otherwise); with ``block=False`` return at once.

    ``workdir``: where the downloads go (see :func:`build`); ``arr-coc serve`` passes a folder it removes on exit.
    """
    demo = build(scope, workdir)
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
    demo.launch(server_name=host, server_port=port, max_file_size=MAX_FILE_SIZE, prevent_thread_lock=not block,
                show_error=True, quiet=not block, footer_links=[], ssr_mode=False)
    return demo
