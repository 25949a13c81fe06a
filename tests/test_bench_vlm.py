"""benchmarks/bench_vlm.py on the tiny config: the table's shape and exact token counts."""
from unittest import mock

import pytest
import torch
from conftest import load_benchmark

from arr_coc.engine.pipeline import ARR


def load_bench():
    return load_benchmark("bench_vlm")  # as `python benchmarks/bench_vlm.py` has it: qwen_3b beside it


def table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header row starts with ``header``, header included."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return [rows[0]] + rows[2:]  # drop the |---| separator


def test_tiny_run_writes_the_table_with_exact_token_counts(tmp_path, capsys):
    bench = load_bench()
    size, k = 448, 40  # 16 x 16 cells of 28 px; arr-coc's gestalt for K = 40 is 6 x 6
    argv = ["--tiny", "--batch", "1", "2", "--repeats", "2", "--size", str(size), "--saccades", str(k), "--dtype",
            "float32", "--channels", "rgb", "edges", "--query-encoder", "hashing", "--out", str(tmp_path)]
    with mock.patch.object(ARR, "see", autospec=True, side_effect=ARR.see) as see:
        rows = bench.main(argv)
    md = (tmp_path / "bench_vlm.md").read_text()
    made_by, table_text = md.split("\n\n", 1)
    assert made_by == "made by: `python benchmarks/bench_vlm.py " + " ".join(argv) + "`"
    assert table_text.strip() in capsys.readouterr().out  # the table is printed as written
    assert (tmp_path / "bench_vlm.png").stat().st_size > 0
    # one ARR pass per arr allocation, whatever the batch: the batch of 2 pages is seen in one call
    arr_passes = [len(c.args[1]) for c in see.call_args_list]
    assert sorted(set(arr_passes)) == [1, 2] and arr_passes.count(2) == 2  # 2 repeats of the batch-2 arr row

    table = table_rows(md, "| method | batch |")
    assert table[0] == list(bench.COLUMNS)
    assert [(r[0], r[1]) for r in table[1:]] == [(m, b) for b in ("1", "2") for m in bench.METHODS]
    cells, gestalt = (size // 28) ** 2, 6 * 6
    for full, native, arr, vlm in (table[1:5], table[5:9]):
        assert int(full[2]) == cells == 256
        assert int(arr[2]) == int(vlm[2]) == gestalt + k == 76
        assert int(native[2]) <= 76  # the processor's downscale at most gestalt + K tokens
        assert full[3] == native[3] == "0" and full[8] == "0.0%" and full[9].endswith("(median 1.00x)")
        assert float(arr[3]) > 0 and float(vlm[3]) > 0
    for r in table[1:]:
        low, median, high = (float(x) for x in r[6].split(" / "))  # min / median / max over the repeats
        assert low <= median <= high and float(r[4]) > 0 and float(r[5]) > 0
        fastest, slowest = (float(x.rstrip("x")) for x in r[9].split(" (")[0].split("–"))
        assert fastest <= slowest and r[10].endswith("x")

    by = {(r["batch"], r["method"]): r for r in rows}
    for r in rows:  # throughput: pages per second of each repeat's time to first token, median
        assert len(r["totals_ms"]) == 2 and r["pages_per_s"] == pytest.approx(
            sum(1e3 * r["batch"] / x for x in r["totals_ms"]) / 2)
    # the tower saw every patch at full resolution, the gestalt and the K saccades in both sparse paths
    for b in (1, 2):
        assert by[(b, bench.METHODS[0])]["vision_segments"] == (cells * 4,)
        assert by[(b, bench.METHODS[2])]["vision_segments"] == by[(b, bench.METHODS[3])]["vision_segments"] == (
            gestalt * 4, k * 4)
        text = by[(b, bench.METHODS[0])]["prompt_tokens"] - cells
        assert by[(b, bench.METHODS[2])]["prompt_tokens"] == by[(b, bench.METHODS[3])]["prompt_tokens"] == text + 76
        f_full, f_native, f_arr, f_vlm = (by[(b, m)]["flops"] for m in bench.METHODS)
        assert f_arr["allocation"] == f_native["allocation"] == 0 and f_vlm["allocation"] > 0
        assert f_vlm["total"] == f_arr["total"] + f_vlm["allocation"] < f_full["total"]
        assert set(by[(b, bench.METHODS[3])]["detail"]) == {"canvas", "first look", "relevance", "selection"}
        assert "channel/edges" in by[(b, bench.METHODS[2])]["detail"]
        assert by[(b, bench.METHODS[1])]["detail"]["processor"] > 0  # native_budget's CPU resize, timed apart

    stages = table_rows(md, "| method | batch | prompt tokens |")
    assert [r[0] for r in stages[1:5]] == list(bench.METHODS)
    assert stages[1][3] == str(cells * 4) and stages[3][3] == f"{gestalt * 4} + {k * 4}"
    assert "Same work, same time? batch 1: `native_budget` and `arr`" in md and "batch 2: `native_budget`" in md
    assert "Goals: allocation share of the sparse path (goal <= 10 %): batch 1: `arr` " in md


def test_batch_pages_are_distinct_and_the_ocr_backend_reaches_the_text_channels(tmp_path):
    bench = load_bench()
    two = bench.pages(56, 2)
    assert torch.equal(two[0], bench.page(56)) and torch.equal(two[1], torch.roll(two[0], 7, dims=2))
    assert not torch.equal(two[0], two[1])  # distinct content: the image cache cannot share their OCR
    for ocr in ("auto", "torch"):
        arr = bench.arr_allocator(28, 56, None, "hashing", ocr=ocr)
        assert arr.config.texture.options == {"text_match": {"ocr": ocr}, "key_value": {"ocr": ocr}}
    with pytest.raises(SystemExit, match=r"^--batch sizes must be at least 1, got \[1, 0\]$"):
        bench.main(["--tiny", "--batch", "1", "0", "--out", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []


def test_the_3b_config_builds_exactly_the_published_qwen25_vl_3b_instruct():
    """An independent reference: the parameter count of the published checkpoint.

    Qwen/Qwen2.5-VL-3B-Instruct's model.safetensors.index.json states a total_size of
    7,509,245,952 bytes of bfloat16, i.e. 3,754,622,976 parameters (tied embeddings counted once);
    a model built from the benchmark's config on the meta device must have exactly that many.
    """
    from transformers import Qwen2_5_VLForConditionalGeneration

    bench = load_bench()
    cfg = bench.qwen25_vl_3b_config()
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    assert sum(p.numel() for p in model.parameters()) == 7_509_245_952 // 2
    # negative control: one layer fewer in the language model is visibly another model
    with torch.device("meta"):
        short = Qwen2_5_VLForConditionalGeneration(bench.qwen25_vl_3b_config(layers=35))
    assert sum(p.numel() for p in short.parameters()) != 7_509_245_952 // 2
    # what the count cannot see: the rotary and window layout of the towers
    t, v = cfg.text_config, cfg.vision_config
    assert t.rope_parameters["mrope_section"] == [16, 24, 24] and t.rope_parameters["rope_theta"] == 1e6
    assert (v.window_size, list(v.fullatt_block_indexes), v.patch_size) == (112, [7, 15, 23, 31], 14)
    assert (v.spatial_merge_size, v.temporal_patch_size) == (2, 2)


def test_meta_built_model_equals_a_normally_built_one_with_its_weights():
    from transformers import Qwen2_5_VLForConditionalGeneration

    bench = load_bench()
    cfg, small = bench.qwen25_vl_3b_config(tiny=True), bench.qwen25_vl_3b_config(tiny=True, layers=1)
    fast = bench.build_model(cfg, torch.float32, small_config=small)
    ref = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    ref.load_state_dict(fast.state_dict())
    for (name, a), (_, b) in zip(fast.named_buffers(), ref.named_buffers()):  # the rotary tables
        assert torch.equal(a, b), name
    image = bench.page(5 * 28)[:, :, :4 * 28]  # 5 x 4 cells
    a, b = (bench.Qwen25VLAdapter(m).encode_native([image])[0].embeds for m in (fast, ref))
    assert torch.isfinite(a).all() and torch.equal(a, b)


def test_flops_only_counts_the_first_look_and_windows_without_running_the_model(tmp_path):
    bench = load_bench()
    rows = bench.main(["--flops-only", "--tiny", "--repeats", "1", "--size", "448", "--saccades", "40",
                       "--channels", "rgb", "edges", "--query-encoder", "hashing", "--out", str(tmp_path)])
    full, arr, vlm = (r["flops"] for r in rows)
    assert arr["allocation"] == 0 < vlm["allocation"]
    assert vlm["total"] == arr["total"] + vlm["allocation"] and arr["llm"] == vlm["llm"]
    assert full["total"] > vlm["total"]
    md = (tmp_path / "bench_vlm_flops.md").read_text()
    assert "| sparse, vlm relevance | 106 | 144 + 160 |" in md and "ARR's allocation on this page, measured" in md


def test_device_option_names_its_results_and_refuses_a_device_that_holds_no_data(tmp_path):

    bench = load_bench()
    assert bench.result_stem(torch.device("cpu")) == "bench_vlm"  # the CPU table keeps its name
    assert bench.result_stem(torch.device("cuda", 1)) == "bench_vlm_cuda"
    # auto on a GPU is bfloat16 without timing this CPU; an explicit dtype wins there too
    assert bench.choose_dtype("auto", torch.device("cuda")) == (torch.bfloat16, "bfloat16 (auto on cuda)")
    assert bench.choose_dtype("float32", torch.device("cuda"))[0] == torch.float32
    assert bench.device_note(torch.device("cpu")) == ""
    with pytest.raises(SystemExit, match=r"^--device: device 'meta' holds no data; use cpu or a GPU$"):
        bench.main(["--tiny", "--device", "meta", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"^--device: unknown device 'gpu0'; e.g. cpu, cuda, cuda:1, mps$"):
        bench.main(["--tiny", "--device", "gpu0", "--out", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []  # refused before any model is built or file written
