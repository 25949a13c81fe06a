"""Split groups: one company's receipts and one form template on one side of a split (real data when present)."""
from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from arr_coc.data.datasets import SPLITS, Record, default_root, load_dataset, split_of
from arr_coc.data.groups import company_groups, company_key, form_labels, linked_groups, template_groups


def test_linked_groups_are_components_named_by_their_smallest_member_in_any_order() -> None:
    keys = {"e": 50, "b": 2, "a": 1, "c": 3, "z": 4}  # a-b-c-z a chain: linked though a and z are 3 apart
    alike = lambda x, y: abs(x - y) <= 1  # noqa: E731
    want = {"a": "a", "b": "a", "c": "a", "z": "a", "e": "e"}
    assert linked_groups(keys, alike) == want
    assert linked_groups(dict(reversed(list(keys.items()))), alike) == want
    assert linked_groups(keys, lambda x, y: False) == {k: k for k in keys}  # negative control: nothing linked


def test_company_names_join_across_branches_legal_forms_and_typos_but_not_other_shops() -> None:
    names = {"1": "MR. D.I.Y. (KUCHAI) SDN BHD", "2": "MR.D.I.Y(M)SDN BHD", "3": "RESTORAN WAN SHENG",
             "4": "RSTORAN WAN SHENG", "5": "HON HWA HARDWARE TRADING", "6": "YONG TAT HARDWARE TRADING"}
    assert company_key(names["2"]) == "MRDIY"
    assert company_groups(names) == {"1": "company:1", "2": "company:1", "3": "company:3", "4": "company:3",
                                     "5": "company:5", "6": "company:6"}


def test_forms_join_when_most_printed_labels_agree() -> None:
    a = form_labels(["DATE:", "NAME / PHONE EXT. :", "BRAND:", ":", "NO"])  # ":" and "NO" say nothing
    assert a == {"DATE", "NAMEPHONEEXT", "BRAND"}
    half = a | {"FAX", "TO"}  # 3 of 5 shared: 0.6
    less = {"DATE", "FROM", "SUBJECT", "PAGES"}  # only DATE shared
    assert template_groups({"a": a, "b": frozenset(half), "c": frozenset(less), "d": frozenset()}) == {
        "a": "template:a", "b": "template:a", "c": "template:c", "d": "template:d"}


def test_split_hashes_the_group_so_a_group_never_crosses_splits(tmp_path: Path) -> None:
    r = Record("jsonl", "1", tmp_path / "a.png", "a", "q?", "", ())
    assert r.split_group == "a" and replace(r, group="company:7").split_group == "company:7"
    ids = [f"img{i}" for i in range(60)]
    assert len({split_of(i, "sroie") for i in ids}) == 3  # alone, the images of a group would spread...
    assert {split_of(replace(r, image_id=i, group="company:7").split_group, "sroie") for i in ids} == {
        split_of("company:7", "sroie")}  # ...in one group they share its split


# ---------------------------------------------------------------------------------------- real data
def real(name: str) -> Path:
    root = default_root(name)
    if not root.is_dir():
        pytest.skip(f"{name} data not found at {root} (set ARR_COC_DATA to the folder holding {root.name}/)")
    return root


def image_splits(name: str) -> dict[str, set[str]]:
    """Images of each split as ``load_dataset(split=...)`` gives them."""
    return {s: {r.image_id for r in load_dataset(name, real(name), split=s)} for s in SPLITS}


@pytest.mark.slow
def test_real_sroie_keeps_each_company_on_one_side() -> None:
    root = real("sroie")
    splits = image_splits("sroie")
    assert {s: len(v) for s, v in splits.items()} == {"train": 69, "val": 28, "test": 53}
    side = {i: s for s, ids in splits.items() for i in ids}
    # checked with the plainest key (upper-case alphanumerics of the whole name), not the loader's own
    by_name: dict[str, set[str]] = defaultdict(set)
    for key in (root / "key").glob("*.json"):
        name = re.sub(r"[^0-9A-Z]", "", json.loads(key.read_text())["company"].upper())
        if key.stem in side:
            by_name[name].add(side[key.stem])
    crossing = {n: s for n, s in by_name.items() if len(s) > 1}
    assert not crossing, crossing
    diy = {side[k.stem] for k in (root / "key").glob("*.json") if "D.I.Y" in json.loads(k.read_text())["company"]}
    assert len(diy) == 1  # MR D.I.Y.'s branches and spellings: one company
    # negative control: the image hash the splits used to be puts one company's receipts on both sides
    gin_kee = [k.stem for k in (root / "key").glob("*.json") if "GIN KEE" in json.loads(k.read_text())["company"]]
    assert len(gin_kee) == 22 and len({split_of(i, "sroie") for i in gin_kee}) == 3


@pytest.mark.slow
def test_real_funsd_keeps_near_identical_forms_on_one_side() -> None:
    root = real("funsd")
    splits = image_splits("funsd")
    assert {s: len(v) for s, v in splits.items()} == {"train": 95, "val": 20, "test": 32}
    side = {i: s for s, ids in splits.items() for i in ids}
    labels = {}
    for ann in (root / "training_data" / "annotations").glob("*.json"):
        form = json.loads(ann.read_text())["form"]
        labels[ann.stem] = form_labels([e["text"] for e in form if e["label"] in ("question", "header")])
    same_template = [(a, b) for a, b in itertools.combinations(sorted(side), 2)
                     if labels[a] and len(labels[a] & labels[b]) / len(labels[a] | labels[b]) >= 0.5]
    assert len(same_template) > 30  # there are near-identical forms to keep together...
    assert all(side[a] == side[b] for a, b in same_template)  # ...and every pair shares a side
    assert side["91361993"] == side["93329540"]  # the same 11 printed labels


@pytest.mark.slow
def test_real_coco_splits_by_image() -> None:
    splits = image_splits("coco")
    assert {s: len(v) for s, v in splits.items()} == {"train": 74, "val": 18, "test": 34}
    assert all(r.group == "" for r in load_dataset("coco", real("coco"), limit=20))
