"""Hostile mixture files (the third hostile round): each is refused in one line naming the file and the key
or field, at once and in bounded memory; none blocks, none reaches numpy's allocator or a bare
``OverflowError``/``RecursionError``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from lerobot_shards.loader import Mixture, MixtureSource, load_mixture
from lerobot_shards.loader.mix.spec import MixtureFileError, source_counts
from waits import HANG_GUARD_S

MAX_SAMPLES_PER_EPOCH = 1 << 31  # mixture_spec.MAX_SAMPLES_PER_EPOCH


def _refused(path: Path, message: str) -> None:
    with pytest.raises(MixtureFileError, match=message) as caught:
        load_mixture(path)
    text = str(caught.value)
    assert "\n" not in text and len(text) < 400 and str(path) in text, text


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "mix.yaml",
            "sources:\n  - source: a\n    weight: 1\n    weight: 5\n",
            r"key 'weight' is given twice \(line 4\)",
        ),
        (
            "mix.yaml",
            "sources:\n  - source: a\n    weight: 1\nsources: []\n",
            r"key 'sources' is given twice \(line 4\)",
        ),
        ("mix.json", '{"sources": [{"source": "a", "weight": 1, "weight": 5}]}', r"key 'weight' is given twice"),
        (
            "mix.json",
            '{"sources": [{"source": "a", "weight": 1, "storage_options": {"anon": true, "anon": false}}]}',
            r"key 'anon' is given twice",
        ),
    ],
)
def test_a_key_given_twice_is_refused_naming_it(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    _refused(tmp_path / name, message)


def test_a_merge_key_may_still_be_overridden(tmp_path: Path) -> None:
    """YAML's ``<<: *defaults`` then a key of the mapping's own is an override, not a duplicate."""
    (tmp_path / "mix.yaml").write_text(
        "sources:\n  - &b {source: a, weight: 1, name: x}\n  - {<<: *b, source: c, name: y}\n"
    )
    assert [s.source.rsplit("/", 1)[-1] for s in load_mixture(tmp_path / "mix.yaml").sources] == ["a", "c"]


def test_a_fifo_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "mix.yaml"
    os.mkfifo(fifo)
    result: list[BaseException | None] = []

    def load() -> None:
        try:
            load_mixture(fifo)
            result.append(None)
        except BaseException as e:  # noqa: BLE001  (handed to the test's thread)
            result.append(e)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(HANG_GUARD_S)
    if reader.is_alive():  # blocked in open(): give it a writer, so that the thread ends, then fail
        with open(fifo, "w"):
            pass
        reader.join()
        pytest.fail("load_mixture blocked on a FIFO")
    assert isinstance(result[0], MixtureFileError) and "not a regular file" in str(result[0]), result


@pytest.mark.parametrize("name", ["mix.yaml", "mix.json"])
def test_deep_nesting_names_the_file(tmp_path: Path, name: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / name).write_text(f'{{"sources": [{{"source": "a", "weight": 1, "storage_options": {{"x": {deep}}}}}]}}')
    _refused(tmp_path / name, r"nested (too|more than \d+ levels) deep")


def test_nesting_under_the_parsers_limit_names_the_file_too(tmp_path: Path) -> None:
    deep = "[" * 100 + "]" * 100
    (tmp_path / "mix.json").write_text(
        f'{{"sources": [{{"source": "a", "weight": 1, "storage_options": {{"x": {deep}}}}}]}}'
    )
    _refused(tmp_path / "mix.json", r"nested more than 32 levels deep")


def test_a_yaml_alias_bomb_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]"
        for i in range(1, 10)
    ]
    bomb = "{" + ", ".join(lines) + "}"
    (tmp_path / "mix.yaml").write_text(f"sources:\n  - source: a\n    weight: 1\n    storage_options: {bomb}\n")
    _refused(tmp_path / "mix.yaml", r"holds more than 10000000 values \(YAML aliases expanded\)")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("repeat: 1.0e+300", r"sources\[0\]: mixture source 'a': repeat = 1e\+300 is more than 2147483648"),
        ("choose: 10000000000000", r"sources\[0\]: mixture source 'a': choose = 1e\+13 is more than 2147483648"),
        ("weight: 1\nsamples_per_epoch: 1000000000000000", r"samples_per_epoch = 1e\+15 is more than 2147483648"),
    ],
)
def test_oversized_counts_are_refused_naming_the_field(tmp_path: Path, entry: str, message: str) -> None:
    source, _, top = entry.partition("\n")
    (tmp_path / "mix.yaml").write_text(f"sources:\n  - source: a\n    {source}\n{top}\n")
    _refused(tmp_path / "mix.yaml", message)


def test_a_repeat_too_large_for_its_source_names_it() -> None:
    """``repeat: 1e9`` is a count only once the source's frames are known: refused then, naming it."""
    mixture = Mixture([MixtureSource("a", repeat=1e9), MixtureSource("b", weight=1)])
    with pytest.raises(ValueError, match=r"mixture source 'a': repeat = 1e\+09 x its 300 frames = 3e\+11 samples"):
        source_counts(mixture, [300, 10])
    with pytest.raises(ValueError, match=r"take 4294967296 samples per epoch together"):
        source_counts(
            Mixture(
                [MixtureSource("a", choose=MAX_SAMPLES_PER_EPOCH)] * 1
                + [MixtureSource("b", choose=MAX_SAMPLES_PER_EPOCH)]
            ),
            [1, 1],
        )
