"""Decoding settings: a GenerationConfig through ask, the CLI's decoding flags, and their one-line refusals.

What decoding computes is specified over every adapter in test_vlm_contract.py (greedy equals a
cache-free reference, sampling, beams, stop strings, streaming) and test_vlm_first_look.py (the first
look's cache); this file covers the ways in and the errors.
"""
import json
import re

import pytest
import torch
from test_vlm_ask import fast_arr, small_image
from transformers import GenerationConfig

from arr_coc.cli import main
from arr_coc.config import DecodeConfig
from arr_coc.vlm import ask, assemble, generate, load_vlm
from arr_coc.vlm.generation import from_decode

FAST = ["--query-encoder", "hashing", "--channels", "mvp", "--saccades", "8"]


@pytest.fixture(scope="module")
def qwen():
    return load_vlm("tiny:qwen2_5_vl")


@pytest.mark.parametrize("config, error, message", [
    ("greedy", TypeError, "generation_config must be a transformers.GenerationConfig, got str"),
    (GenerationConfig(num_return_sequences=2, num_beams=2), ValueError, "num_return_sequences must be 1"),
    (GenerationConfig(use_cache=False), ValueError, "use_cache=False: the answer continues the prompt's KV cache"),
    (GenerationConfig(cache_implementation="static"), ValueError, "cache_implementation 'static'"),
    (GenerationConfig(temperature=0.5), ValueError, "generation_config: .*temperature"),
])
def test_ask_refuses_a_generation_config_it_cannot_honour_before_any_work(qwen, config, error, message):
    with pytest.raises(error, match=message) as err:
        # a missing image would fail later: the config is checked first
        ask(qwen, "no/such/image.png", "Q?", arr=fast_arr(qwen.cell), saccades=4, generation_config=config)
    assert "\n" not in str(err.value)


def test_ask_takes_a_generation_config_and_a_seed(qwen):
    img, arr = small_image(qwen), fast_arr(qwen.cell)
    sample = GenerationConfig(do_sample=True, temperature=3.0, top_k=0, max_new_tokens=6, min_new_tokens=6)
    a = ask(qwen, img, "Q?", arr=arr, saccades=4, relevance="arr", generation_config=sample, seed=3)
    b = ask(qwen, img, "Q?", arr=arr, saccades=4, relevance="arr", generation_config=sample, seed=3)
    greedy = ask(qwen, img, "Q?", arr=arr, saccades=4, relevance="arr", max_new_tokens=6)
    assert a.tokens == b.tokens and len(a.tokens) == 6 and a.tokens != greedy.tokens
    # the config's own length wins over max_new_tokens; the stage times stay split
    short = ask(qwen, img, "Q?", arr=arr, saccades=4, relevance="arr", max_new_tokens=6,
                generation_config=GenerationConfig(max_new_tokens=2, min_new_tokens=2))
    assert short.tokens == greedy.tokens[:2]
    assert short.timings_ms["prefill"] > 0 and short.timings_ms["decode"] > 0
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got -1"):
        ask(qwen, img, "Q?", arr=arr, saccades=4, seed=-1)


def test_a_prompt_must_end_in_text(qwen):
    vis = qwen.encode([small_image(qwen)], [torch.tensor([[0, 0]])], gestalt=[(2, 2)])
    pre, _ = qwen.prompt_ids("Q?")
    with pytest.raises(ValueError, match="every prompt must end in text"):
        generate(qwen, assemble(qwen.embed_tokens, [pre], vis, [[]], qwen.rope_rows))


def test_decode_config_is_the_greedy_default_unless_told_and_sets_every_sampling_value():
    assert from_decode(DecodeConfig(), 5).to_diff_dict() == from_decode(DecodeConfig(stop=()), 5).to_diff_dict()
    c = from_decode(DecodeConfig(), 5)
    assert (c.do_sample, c.num_beams, c.repetition_penalty, c.max_new_tokens, c.stop_strings) == (False, 1, 1.0, 5,
                                                                                                   None)
    c = from_decode(DecodeConfig(do_sample=True, temperature=0.7, top_p=0.9, num_beams=2, stop=("\n",), seed=1), 9)
    assert (c.do_sample, c.temperature, c.top_p, c.top_k, c.num_beams, c.stop_strings) == (True, 0.7, 0.9, 0, 2, ["\n"])


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "0.5"], "temperature and top_p shape sampling; add do_sample \\(--do-sample\\)"),
    (["--do-sample", "--top-p", "1.5"], "top_p must be a probability in \\(0, 1\\], got 1.5"),
    (["--do-sample", "--temperature", "0"], "temperature must be a finite number > 0, got 0"),
    (["--num-beams", "0"], "num_beams must be an integer >= 1, got 0"),
    (["--stop", ""], "stop strings must be non-empty text"),
    (["--seed", "-2"], "seed must be an integer >= 0, got -2"),
    (["--stream", "--num-beams", "2"], "--stream prints one sequence as text as it grows: not with --json"),
    (["--stream", "--json"], "--stream prints one sequence"),
])
def test_cli_decoding_flags_refuse_bad_values_in_one_line_before_loading(receipt, capsys, flags, message):
    # a model that does not exist: the flags are refused before it is looked for
    assert main(["ask", str(receipt), "Q?", "--model", "/no/such/model", *FAST, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("arr-coc: error:")
    assert re.search(message, err), err


def test_cli_ask_samples_reproducibly_beams_stops_and_streams(receipt, capsys):
    argv = ["ask", str(receipt), "What is the total?", "--model", "tiny:qwen2_5_vl", *FAST, "--max-new-tokens", "6"]

    def answer(*flags):
        assert main(argv + ["--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)["answer"]

    greedy = answer()
    sampled = answer("--do-sample", "--temperature", "3", "--seed", "1")
    assert sampled == answer("--do-sample", "--temperature", "3", "--seed", "1") != greedy
    assert isinstance(answer("--num-beams", "2"), str)
    # a one-character token of the answer after its first that no earlier token holds
    pieces = re.findall(r"<\|[^|]*\|>|.", greedy, re.S)
    at = next(i for i, p in enumerate(pieces) if i >= 1 and len(p) == 1 and p.strip() and p not in "".join(pieces[:i]))
    assert answer("--stop", pieces[at]) == "".join(pieces[:at + 1]) != greedy
    assert main(argv + ["--stream"]) == 0
    out = capsys.readouterr().out
    assert f"answer        {greedy}\n" in out  # streamed as text, not quoted
