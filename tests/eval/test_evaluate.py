"""The OCR evaluation (methods -> plans -> rows -> reports) on generated pages: rows, budgets, reading, resume after interruption, reports."""
import json
from pathlib import Path

import matplotlib
import pytest
from PIL import Image, ImageDraw, ImageFont

from arr_coc.budget import Budget
from arr_coc.cli import main
from arr_coc.config import ARRConfig
from arr_coc.data.datasets import load_dataset
from arr_coc.engine.pipeline import ARR
from arr_coc.engine.query import HashingQueryEncoder
from arr_coc.eval.evaluate import evaluate
from arr_coc.eval.report import summarize, write_reports
from arr_coc.eval.settings import EvalSettings

FONT = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
FIELDS = [("Date:", "21/11/2026"), ("Total:", "42.00"), ("Name:", "Ada Lovelace")]


def make_pages(folder: Path, n_pages: int = 2) -> Path:
    """Forms of 560x840 px with three "key: value" lines; a JSONL of (question, answer, value box)."""
    font = ImageFont.truetype(str(FONT), 13)
    lines = []
    for p in range(n_pages):
        img = Image.new("L", (560, 840), 255)
        draw = ImageDraw.Draw(img)
        for i, (key, value) in enumerate(FIELDS):
            y = 100 + 250 * i + 40 * p
            draw.text((40, y), key, fill=0, font=font)
            x0, y0, x1, y1 = draw.textbbox((200, y), value, font=font)
            draw.text((200, y), value, fill=0, font=font)
            lines.append({"image": f"page{p}.png", "question": key, "answer": value, "boxes": [[x0, y0, x1, y1]],
                          "id": f"p{p}-{i}", "image_id": f"page{p}"})
        img.save(folder / f"page{p}.png")
    path = folder / "pages.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    return make_pages(tmp_path_factory.mktemp("pages"))


@pytest.fixture(scope="module")
def arr() -> ARR:
    return ARR(ARRConfig(), query_encoder=HashingQueryEncoder()).eval()


SETTINGS = EvalSettings(methods=("full", "uniform_image", "topk", "random"), budgets=("10%", "60%"))


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_record_method_and_budget_gets_one_row(pages, arr, tmp_path):
    records = load_dataset("jsonl", pages)
    rows = read_rows(evaluate(records, arr, tmp_path, SETTINGS, progress=False))
    assert len(rows) == len(records) * (1 + 2 * 3)
    full_tokens = 20 * 30  # 560 x 840 px at 28 px
    for r in rows:
        assert r["full_tokens"] == full_tokens
        if r["method"] in ("topk", "random"):  # gestalt + saccades exactly fill the budget
            assert r["tokens"] == Budget.parse(r["budget"]).total(full_tokens)
            assert 0 <= r["coverage"] <= 1 and r["hit"] == float(r["coverage"] >= 0.5)
        if r["method"] == "uniform_image":
            assert r["tokens"] <= Budget.parse(r["budget"]).total(full_tokens)
    full = [r for r in rows if r["method"] == "full"]
    assert all(r["reading"] >= 0.9 for r in full), [(r["answer"], r["prediction"]) for r in full]
    tiny = [r for r in rows if r["method"] == "uniform_image" and r["budget"] == "10%"]
    assert sum(r["reading"] for r in tiny) / len(tiny) < 0.5  # 60 tokens cannot show 13 px text


def test_rerun_skips_done_work_and_an_interrupted_line_is_redone(pages, arr, tmp_path):
    records = load_dataset("jsonl", pages)
    path = evaluate(records[:2], arr, tmp_path, SETTINGS, progress=False)
    text = path.read_text()
    path.write_text(text + text.splitlines()[0][:25])  # a row cut mid-write
    evaluate(records, arr, tmp_path, SETTINGS, progress=False)
    rows = read_rows(path)
    assert len(rows) == len(records) * 7
    assert len({(r["record_id"], r["method"], r["budget"]) for r in rows}) == len(rows)  # nothing twice
    before = path.read_text()
    evaluate(records, arr, tmp_path, SETTINGS, progress=False)
    assert path.read_text() == before  # all done: nothing recomputed


def test_reports_and_summary_values(pages, arr, tmp_path):
    records = load_dataset("jsonl", pages)[:2]
    path = evaluate(records, arr, tmp_path, SETTINGS, progress=False)
    csv_path, md_path, png_path = write_reports(path, made_by="arr-coc eval jsonl --limit 2")
    summary = summarize(read_rows(path))
    assert [(s["method"], s["budget"]) for s in summary[:3]] == [("full", "full"), ("uniform_image", "10%"),
                                                                  ("random", "10%")]
    top = next(s for s in summary if s["method"] == "topk" and s["budget"] == "60%")
    rows = [r for r in read_rows(path) if r["method"] == "topk" and r["budget"] == "60%"]
    assert top["n"] == 2 and top["coverage"] == pytest.approx(sum(r["coverage"] for r in rows) / 2)
    assert md_path.read_text().startswith("made by: arr-coc eval jsonl --limit 2\n\n| budget | method |")
    assert "| 60% | topk |" in md_path.read_text() and csv_path.read_text().startswith("dataset,kind,method,budget")
    assert Image.open(png_path).size[0] > 500


def test_cli_eval_on_jsonl(pages, tmp_path, capsys):
    assert main(["eval", "jsonl", "--data", str(pages), "--methods", "full", "stratified", "--tokens", "25%",
                 "--limit", "2", "--query-encoder", "hashing", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 25% | stratified |" in out and (tmp_path / "jsonl" / "summary.png").exists()
    made_by = (tmp_path / "jsonl" / "summary.md").read_text().splitlines()[0]
    assert made_by == (f"made by: arr-coc eval jsonl --data {pages} --methods full stratified --tokens 25% --limit 2 "
                       f"--query-encoder hashing --out {tmp_path}")


def test_budget_arithmetic():
    assert Budget.parse("5%").total(972) == 49 and Budget.parse("50%").total(972) == 486 and Budget.parse(5000).total(972) == 972
    assert Budget.parse(529).split([(48, 48)]) == ([(16, 16)], 273) and Budget.parse(10).split([(3, 3)]) == ([(2, 2)], 5)  # 10 > the 9 cells: full resolution's 9
    with pytest.raises(ValueError, match="must be a share"):
        Budget.parse("150%").total(100)
    with pytest.raises(ValueError, match="at least 2"):
        Budget.parse("1%").total(100)


def test_bad_settings_fail_before_any_work():
    with pytest.raises(ValueError, match="unknown methods \\['magic'\\]"):
        EvalSettings(methods=("full", "magic"))
    with pytest.raises(KeyError, match="unknown reader 'eyes'"):
        EvalSettings(reader="eyes")
    with pytest.raises(TypeError, match="methods and budgets are lists, e.g. methods=\\('topk',\\), budgets=\\('25%',\\)"):
        EvalSettings(budgets="25%")
    with pytest.raises(ValueError, match="name at least one method and one budget \\(--tokens, or --compression"):
        EvalSettings(budgets=())
    EvalSettings(methods=("full",), budgets=())  # full resolution has one plan: no budget needed
    with pytest.raises(ValueError, match="budgets \\['10x'\\] are compressions of a context's text; images take"):
        EvalSettings(budgets=("10x",)).resolve("image")
    with pytest.raises(ValueError, match="methods \\['coc'\\] do not send one image; choose from full, uniform_image"):
        EvalSettings(methods=("coc",)).resolve("image")


def test_budgets_are_parsed_once_and_keyed_as_asked():
    from arr_coc.budget import Budget

    settings = EvalSettings(budgets=(" 25% ", 529, "10.0x", Budget.parse("5%")))
    assert settings.budgets == ("25%", "529", "10x", "5%")  # rows' budget column: a compression normalised
    assert settings.parsed() == {"25%": Budget("share", 0.25), "529": Budget("tokens", 529),
                                 "10x": Budget("text", 10.0), "5%": Budget("share", 0.05)}
    with pytest.raises(ValueError, match="tokens '1' gives 1 tokens; at least 2"):
        EvalSettings(budgets=("1",))
    image = EvalSettings(methods=("full", "topk"), budgets=("25%",)).resolve("image")
    assert (image.margin_px, image.wanted()) == (8, [("full", "full"), ("topk", "25%")])
    assert image.keys("r") == {("r", "full", "full"), ("r", "topk", "25%")}
    context = EvalSettings().resolve("context")
    assert (context.margin_px, context.budgets, context.methods[:2]) == (4.0, ("10x", "20x"), ("full", "coc"))


def test_variable_size_allocators_fill_the_budget_and_report_what_they_saw(pages, arr, tmp_path):
    records = load_dataset("jsonl", pages)[:2]
    settings = EvalSettings(methods=("topk", "patches", "quadtree"), budgets=("25%",), reader=None)
    rows = read_rows(evaluate(records, arr, tmp_path, settings, progress=False))
    by = {(r["record_id"], r["method"]): r for r in rows}
    total = Budget.parse("25%").total(20 * 30)
    for rec in records:
        patches, quad, topk = (by[(rec.record_id, m)] for m in ("patches", "quadtree", "topk"))
        assert patches["tokens"] == topk["tokens"] == total  # exactly K tokens, whatever their sizes
        assert quad["tokens"] <= total and (total - quad["tokens"]) < 3  # a quadtree lands on start + 3m
        for r in (patches, quad):
            assert 0 <= r["coverage"] <= r["seen"] <= 1  # full resolution is a part of what is seen
    assert all(r["seen"] == 1.0 for r in rows if r["method"] == "quadtree")  # the leaves tile the page


def test_patches_with_a_steep_size_prior_are_exactly_top_k(pages, arr, tmp_path):
    """alpha > 2 makes every square score below its best cell, so only 1x1 cells are ever picked,
    in relevance order: the patch allocator then equals the top-K sampler row for row."""
    records = load_dataset("jsonl", pages)[:3]
    settings = EvalSettings(methods=("topk", "patches", "patches_edges"), budgets=("10%", "25%"), reader=None,
                            patch_options={"size_prior": 3.0})
    rows = read_rows(evaluate(records, arr, tmp_path, settings, progress=False))
    by = {(r["record_id"], r["method"], r["budget"]): r for r in rows}
    for rec in records:
        for b in ("10%", "25%"):
            topk, patches, edges = (by[(rec.record_id, m, b)] for m in ("topk", "patches", "patches_edges"))
            assert [patches[c] for c in ("tokens", "coverage", "hit", "iou")] == \
                   [topk[c] for c in ("tokens", "coverage", "hit", "iou")]
            assert patches["seen"] == patches["coverage"]  # nothing was seen shrunk
            assert edges["tokens"] == topk["tokens"]  # the query-blind edge map spends the same budget
    flat = EvalSettings(methods=("topk", "patches"), budgets=("25%",), reader=None, patch_options={"size_prior": 0.0})
    rows = read_rows(evaluate(records, arr, tmp_path / "flat", flat, progress=False))
    assert any(r["seen"] > r["coverage"] for r in rows if r["method"] == "patches")  # large squares, seen shrunk


def test_trained_selector_and_pruner_rows_are_top_k_of_their_own_maps(pages, arr, tmp_path):
    import torch

    from arr_coc.allocators.pruning import PatchSelector, TokenPruner, save_learned
    from arr_coc.engine.samplers import topk_cells
    from arr_coc.eval.metrics import allocation_metrics
    from arr_coc.eval.reading import scale_boxes
    from arr_coc.eval.run import learned_maps
    from arr_coc.weights import load_learned_methods

    dim = arr.see(load_dataset("jsonl", pages)[0].image).cell_texture.shape[1] + 2  # + the two question channels
    save_learned(tmp_path / "pruner.pt", "pruner", TokenPruner(dim, query_dim=arr.query_encoder.dim), arr.channels)
    save_learned(tmp_path / "selector.pt", "selector", PatchSelector(cell=28, seed=3), arr.channels)
    paths = {m: tmp_path / f"{m}.pt" for m in ("pruner", "selector")}
    records = load_dataset("jsonl", pages)[:2]
    settings = EvalSettings(methods=("topk", "selector", "pruner"), budgets=("25%",), reader=None, learned=paths)
    rows = read_rows(evaluate(records, arr, tmp_path / "eval", settings, progress=False))
    learned = load_learned_methods(arr, settings)
    with torch.no_grad():
        for rec in records:
            scene = arr.see(rec.image)
            rel, query = arr.score(scene, [rec.question], arr.gestalt(scene, 1).vector)
            maps = learned_maps(learned, arr, scene, rec.question, query)
            k = next(r for r in rows if r["method"] == "topk" and r["record_id"] == rec.record_id)["tokens"] - 64
            for m in ("selector", "pruner"):
                row = next(r for r in rows if r["method"] == m and r["record_id"] == rec.record_id)
                chosen = topk_cells(maps[m], k, scene.canvas.valid).mask(*scene.canvas.grid)[0]
                expect = allocation_metrics(chosen, 28, scale_boxes(rec.boxes_px, scene.canvas.scales[0]),
                                            scale_boxes(rec.others_px, scene.canvas.scales[0]))
                assert row["coverage"] == pytest.approx(expect.coverage) and row["tokens"] == k + 64
    missing = EvalSettings(methods=("pruner",), budgets=("25%",), reader=None, learned={"pruner": tmp_path / "no.pt"})
    with pytest.raises(ValueError, match=r"no\.pt: no such file; expected pruner weights \(train one with `arr-coc train --learner pruner`\)"):
        evaluate(records, arr, tmp_path / "missing", missing, progress=False)


def test_cli_eval_default_methods_leave_out_a_trained_allocator_that_does_not_fit(pages, tmp_path, capsys):
    # the packaged pruner reads MiniLM question embeddings; the hashing encoder makes others
    assert main(["eval", "jsonl", "--data", str(pages), "--tokens", "25%", "--limit", "1", "--reader", "none",
                 "--query-encoder", "hashing", "--size-prior", "3", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "leaving out method pruner:" in err and "embedded by MiniLMQueryEncoder, this ARR uses Hashing" in err
    rows = read_rows(tmp_path / "jsonl" / "records.jsonl")
    methods = {r["method"] for r in rows}
    assert "selector" in methods and "pruner" not in methods and "patches_edges" in methods
    by = {r["method"]: r for r in rows}
    assert by["patches"]["coverage"] == by["topk"]["coverage"]  # --size-prior 3 reached the patcher
    assert main(["eval", "jsonl", "--data", str(pages), "--methods", "pruner", "--limit", "1", "--reader", "none",
                 "--query-encoder", "hashing", "--out", str(tmp_path / "x")]) == 2  # asked for by name: an error
    assert "embedded by MiniLMQueryEncoder" in capsys.readouterr().err


def test_a_quadtree_below_its_starting_tiling_gives_no_row_by_type_not_message(pages, arr, tmp_path, monkeypatch):
    import torch

    from arr_coc.allocators import methods
    from arr_coc.allocators.patches import BudgetTooSmallError
    from arr_coc.allocators.patching import PATCHERS
    from arr_coc.registry import Registry

    with pytest.raises(BudgetTooSmallError) as small:
        PATCHERS.get("quadtree")(torch.rand(1, 30, 20), 1)  # the 560x840 page's 30x20 cells
    # its coarsest start: 16x16, four 4x4 beside it, then 8-, 4- and 2-cell squares below: 24 leaves
    assert small.value.k == 1 and small.value.minimum == 24
    assert Budget.parse(25).split([(30, 20)]) == ([(2, 2)], 21) and Budget.parse(40).split([(30, 20)]) == ([(4, 4)], 24)
    records = load_dataset("jsonl", pages)[:1]
    settings = EvalSettings(methods=("topk", "quadtree"), budgets=("25", "40"), reader=None)
    rows = read_rows(evaluate(records, arr, tmp_path / "a", settings, progress=False))
    assert sorted((r["method"], r["budget"]) for r in rows) == [("quadtree", "40"), ("topk", "25"), ("topk", "40")]
    assert next(r["tokens"] for r in rows if r["method"] == "quadtree") == 16 + 24

    def other_error(*args, **kwargs):  # a ValueError that only mentions the budget is still an error
        raise ValueError("budget K=1 is below the 4 starting squares")

    failing = Registry("patcher")
    failing.register("quadtree")(other_error)
    monkeypatch.setattr(methods, "PATCHERS", failing)
    with pytest.raises(ValueError, match="starting squares"):
        evaluate(records, arr, tmp_path / "b", settings, progress=False)


def test_every_method_is_a_typed_registry_entry():
    from arr_coc.allocators.methods import (
        LEARNED_METHODS,
        SCORER_FREE,
        LearnedMethod,
        SamplerMethod,
        SquaresMethod,
        methods_for,
    )
    from arr_coc.allocators.methods import METHODS as REGISTRY
    from arr_coc.engine.samplers import SAMPLERS
    from arr_coc.eval.settings import known_methods

    METHODS = known_methods("tesseract", "image")
    assert METHODS == methods_for("ocr") and METHODS[0] == "full" and set(METHODS) < set(REGISTRY.names())
    assert not {"vlm", "slice", "native_budget"} & set(METHODS)  # the OCR reader has no model to look or slice
    assert LEARNED_METHODS == ("selector", "pruner") and SCORER_FREE == ("full", "uniform_image", "native_budget")
    assert all(REGISTRY.get(m).sampler in SAMPLERS for m in METHODS
               if isinstance(REGISTRY.get(m), SamplerMethod) and m != "arr")
    assert REGISTRY.get("arr").sampler is None  # the ARR's own sampler
    assert {m: REGISTRY.get(m) for m in ("patches_edges", "quadtree")} == {
        "patches_edges": SquaresMethod("saliency", "edges"), "quadtree": SquaresMethod("quadtree")}
    assert [m for m in METHODS if not REGISTRY.get(m).uses_scorer] == ["full", "uniform_image", "random", "uniform",
                                                                       "topk_edges"]
    assert isinstance(REGISTRY.get("pruner"), LearnedMethod)
    assert REGISTRY.get("native_budget") == REGISTRY.get("uniform_image")  # one method, two names
    assert REGISTRY.get("vlm").source == "vlm" and REGISTRY.get("slice").encoding == "slice"
    # the whole-context methods are entries of the same registry, each declaring what it needs
    assert known_methods("tesseract", "context") == ("full", "coc", "equal_split", "uniform", "first_pages",
                                                     "bm25_pages", "retrieval_pages")
    assert known_methods("vlm", "context") == ("coc",)
    assert {m: REGISTRY.get(m).needs for m in ("coc", "equal_split", "first_pages", "bm25_pages", "retrieval_pages",
                                                "arr", "topk", "vlm", "full", "pruner", "topk_edges")} == {
        "coc": ("relevance", "text"), "equal_split": ("relevance", "text"), "first_pages": (), "bm25_pages": ("text",),
        "retrieval_pages": ("text",),
        "arr": ("relevance", "sampler"), "topk": ("relevance",), "vlm": ("vlm", "sampler"), "full": (),
        "pruner": ("weights",), "topk_edges": ()}
    assert not set(known_methods("tesseract", "context")) - {"uniform"} - set(REGISTRY.names())


def test_arr_method_picks_the_cells_that_allocate_sends_for_one_image(tmp_path):
    """`arr` at the default total (256 + 273 = 529 tokens) = ``allocate(ARR(), image, question, 529)``: the receipt's
    print stays legible in a gestalt of its aspect (budget.legible_gestalt), so K < 273, and its saccades go where its
    relevance plus its text lines' retrieval put them (contexts.allocate.image_placing), not where the relevance
    alone (``ARR()(image, question)``) puts them."""
    import torch

    from arr_coc.budget import Budget
    from arr_coc.config import DEFAULT_SACCADES, SamplerConfig, ScorerConfig
    from arr_coc.contexts import allocate
    from arr_coc.data.datasets import Record
    from arr_coc.engine.channels.text import text_heights

    receipt = Path(__file__).resolve().parents[2] / "examples" / "receipt.jpg"
    question = "What is the total?"
    arr = ARR().eval()  # no options: the default channels, trained scorer, sampler and retriever
    with torch.no_grad():
        scene = arr.see(str(receipt))
        (grid,), k = Budget.parse(256 + DEFAULT_SACCADES).split(scene.extents, text_height=text_heights(arr, scene)[0])
        sent = allocate(arr, str(receipt), question, 256 + DEFAULT_SACCADES).pages[0]
        expected = sent.plan.cells.tolist()
        relevance_alone = arr(str(receipt), question, saccades=k).positions[0].tolist()
    assert grid != (16, 16) and sent.plan.gestalt == grid and len(expected) == k == 529 - grid[0] * grid[1] < 273
    assert relevance_alone != expected  # control: the lines' retrieval moves saccades
    record = Record("jsonl", "receipt-total", receipt, "receipt", question, "", ((1000.0, 300.0, 1100.0, 700.0),))
    other = next(m for m in ("stratified", "topk") if m != SamplerConfig.name)
    settings = EvalSettings(methods=("arr", other), budgets=(256 + DEFAULT_SACCADES,), reader=None, keep_cells=True)
    rows = {r["method"]: r for r in read_rows(evaluate([record], arr, tmp_path / "default", settings, progress=False))}
    assert rows["arr"]["tokens"] == 529 and rows["arr"]["cells"] == expected
    # negative controls: another sampler, and the default sampler on the hand-set scorer, pick other cells
    assert rows[other]["cells"] != expected
    hand = ARR(ARRConfig(scorer=ScorerConfig(weights="none")), query_encoder=arr.query_encoder).eval()
    hand.cache = arr.cache  # the same OCR lines; only the scorer differs
    hand_rows = read_rows(evaluate([record], hand, tmp_path / "hand", settings, progress=False))
    assert next(r for r in hand_rows if r["method"] == "arr")["cells"] != expected


def test_eval_sampler_flag_sends_the_arr_method_through_that_sampler_with_its_trained_parameters(pages, tmp_path,
                                                                                                 capsys):
    """`eval --sampler log_polar --scorer-weights W`: the arr rows come from log-polar with the parameters W holds."""
    import torch

    from arr_coc.config import SamplerConfig, ScorerConfig, TextureConfig
    from arr_coc.train import TrainConfig, export_weights

    texture = TextureConfig(channels=("rgb", "edges"))
    trained = ARR(ARRConfig(texture=texture, sampler=SamplerConfig(name="log_polar")),
                  query_encoder=HashingQueryEncoder())
    initial = [p.detach().clone() for p in trained.sampler.parameters()]
    with torch.no_grad():  # "trained": parameters moved away from their initial values
        for p in trained.sampler.parameters():
            p.add_(torch.linspace(-2.0, 3.0, p.numel()).view_as(p))
    weights = export_weights(tmp_path / "w.pt", trained, TrainConfig(datasets=("funsd",)), {})

    common = ["eval", "jsonl", "--data", str(pages), "--reader", "none", "--tokens", "10%", "--methods", "arr",
              "--channels", "rgb", "edges", "--query-encoder", "hashing"]
    assert main(common + ["--out", str(tmp_path / "o"), "--sampler", "log_polar", "--scorer-weights", str(weights)]) == 0
    settings = json.loads((tmp_path / "o" / "jsonl" / "settings.json").read_text())
    assert settings["sampler"]["name"] == "log_polar"
    assert {r["method"] for r in read_rows(tmp_path / "o" / "jsonl" / "records.jsonl")} == {"arr"}
    assert main(common + ["--out", str(tmp_path / "bad"), "--sampler", "spiral"]) == 2
    assert "spiral" in capsys.readouterr().err

    # what that command built: the ARR loads the sampler's parameters with the scorer's
    def built(weights_spec: str, sampler: str = "log_polar") -> ARR:
        return ARR(ARRConfig(texture=texture, sampler=SamplerConfig(name=sampler),
                             scorer=ScorerConfig(weights=weights_spec)), query_encoder=HashingQueryEncoder()).eval()

    loaded, fresh = built(str(weights)), built("none")
    assert all(torch.equal(a, b) for a, b in zip(loaded.sampler.parameters(), trained.sampler.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(fresh.sampler.parameters(), initial))
    records = load_dataset("jsonl", pages)
    settings = EvalSettings(methods=("arr",), budgets=("10%",), reader=None, keep_cells=True)

    def cells(arr: ARR, name: str) -> list:
        rows = read_rows(evaluate(records, arr, tmp_path / name, settings, progress=False))
        return [r["cells"] for r in sorted(rows, key=lambda r: r["record_id"])]

    with_trained, untrained = cells(loaded, "trained"), cells(fresh, "fresh")
    assert with_trained != untrained  # negative control: the initial parameters pick other cells
    assert untrained != cells(built("none", "topk"), "topk")  # and the flag's sampler is not top-K
