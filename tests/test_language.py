"""LeRobot 0.6.1's language annotation columns (``language_persistent``, ``language_events``): each
sample holds its frame's rows exactly as written (``synth.language_rows``), from raw and converted
datasets, through DataLoader workers and slabs, across a resume; batches drop them as LeRobot's
``lerobot_collate_fn`` does, or keep them as lists; untrusted rows are bounded, each failure one line
naming the episode and column. (tests/lerobot/test_language.py: parity on a dataset LeRobot wrote.)"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from lerobot_shards import language
from lerobot_shards.convert.inspect import inspect_path
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.language import LANGUAGE_COLUMNS, LANGUAGE_EVENTS, LANGUAGE_PERSISTENT
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.transport import slab_loader
from lerobot_shards.synth import language_rows

FPS = 30
CAM = "observation.images.front"


@pytest.fixture(scope="module")
def annotated(synth_factory: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    raw = synth_factory(
        num_episodes=4, cameras=(CAM,), height=32, width=48, length_range=(9, 14), fps=FPS, language=True
    )
    shards = tmp_path_factory.mktemp("language") / "shards"
    convert_dataset(raw, shards, progress=False)
    return {"raw": raw, "shards": shards}


def _want(sample: dict, lengths: dict[int, int]) -> dict[str, list]:
    e, f = int(sample["episode_index"]), int(sample["frame_index"])
    return language_rows(e, f, lengths[e], FPS)


def _episode_lengths(root: Path) -> dict[int, int]:
    table = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet", columns=["episode_index", "length"])
    return dict(zip(table.column("episode_index").to_pylist(), table.column("length").to_pylist()))


@pytest.mark.parametrize("source", ["raw", "shards"])
def test_every_sample_holds_its_frames_rows(annotated: dict[str, Path], source: str) -> None:
    lengths = _episode_lengths(annotated["raw"])
    ds = EpisodePoolDataset(str(annotated[source]), cameras=[])
    assert ds.meta.has_language_columns and ds.meta.features[LANGUAGE_PERSISTENT]["dtype"] == "language"
    seen = set()
    for sample in ds:
        want = _want(sample, lengths)
        for key in LANGUAGE_COLUMNS:
            assert sample[key] == want[key] and type(sample[key]) is list
            assert all(type(r) is dict and list(r) == list(language.ROW_FIELDS[key]) for r in sample[key])
        seen.add((int(sample["episode_index"]), int(sample["frame_index"])))
    assert len(seen) == sum(lengths.values())
    assert any(s for e in lengths for s in [language_rows(e, 2, lengths[e], FPS)[LANGUAGE_EVENTS]])  # events exist


def test_each_sample_gets_its_own_objects(annotated: dict[str, Path]) -> None:
    ds = EpisodePoolDataset(str(annotated["raw"]), cameras=[], episodes=[0])
    a, b = list(ds)[:2]
    assert a[LANGUAGE_PERSISTENT] == b[LANGUAGE_PERSISTENT]
    a[LANGUAGE_PERSISTENT][0]["content"] = "changed"
    assert b[LANGUAGE_PERSISTENT][0]["content"] != "changed"


def test_batches_drop_them_as_lerobot_collate_fn_or_keep_them_as_lists(annotated: dict[str, Path]) -> None:
    lengths = _episode_lengths(annotated["raw"])
    for kw in ({"drop": LANGUAGE_COLUMNS}, {"lists": LANGUAGE_COLUMNS}):
        loader = slab_loader(
            EpisodePoolDataset(str(annotated["shards"]), cameras=[], seed=1), batch_size=4, num_workers=2, **kw
        )
        frames = 0
        for batch in loader:
            samples = [{k: batch[k][i] for k in ("episode_index", "frame_index")} for i in range(len(batch["index"]))]
            if "drop" in kw:
                assert not set(LANGUAGE_COLUMNS) & set(batch)
            else:
                for key in LANGUAGE_COLUMNS:
                    assert batch[key] == [_want(s, lengths)[key] for s in samples]
            frames += len(samples)
        assert frames == sum(lengths.values())


def test_without_workers_the_batch_is_default_collate_without_them(annotated: dict[str, Path]) -> None:
    ds = EpisodePoolDataset(str(annotated["raw"]), cameras=[CAM], seed=3)
    ds.set_epoch(0)
    samples = list(ds)[:5]
    ds.set_epoch(0)  # the same pass again
    batch = next(iter(slab_loader(ds, batch_size=5, num_workers=0, drop=LANGUAGE_COLUMNS)))
    want = default_collate([{k: v for k, v in s.items() if k not in LANGUAGE_COLUMNS} for s in samples])
    assert sorted(batch) == sorted(want)
    for key, value in want.items():
        assert torch.equal(batch[key], value) if isinstance(value, torch.Tensor) else batch[key] == value


def test_a_resumed_epoch_holds_the_rest_with_the_same_rows(annotated: dict[str, Path]) -> None:
    lengths = _episode_lengths(annotated["raw"])

    def batches(ds: EpisodePoolDataset) -> list[list[tuple[int, int, str]]]:
        out = []
        for batch in DataLoader(ds, batch_size=3, num_workers=2, collate_fn=list):
            for s in batch:
                assert {k: s[k] for k in LANGUAGE_COLUMNS} == _want(s, lengths)
            out.append([(int(s["episode_index"]), int(s["frame_index"]), repr(s[LANGUAGE_EVENTS])) for s in batch])
        return out

    def dataset() -> EpisodePoolDataset:
        return EpisodePoolDataset(str(annotated["shards"]), cameras=[], seed=5, episode_pool_size=2)

    full = batches(dataset())
    cut = len(full) // 2
    resumed = dataset()
    resumed.load_state_dict(dataset().state_dict(batches_consumed=cut, batch_size=3))
    assert batches(resumed) == full[cut:]


def test_verify_and_inspect_know_them(annotated: dict[str, Path]) -> None:
    verify_dataset(annotated["shards"], progress=False)
    for root in annotated.values():
        assert "language annotations: language_persistent, language_events" in inspect_path(root)


def test_a_window_of_a_language_column_is_refused(annotated: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="a language column is not windowed"):
        EpisodePoolDataset(str(annotated["raw"]), delta_timestamps={LANGUAGE_EVENTS: [-1 / FPS, 0.0]})


def _rewritten(annotated: dict[str, Path], tmp_path: Path, column: str, rows: Callable[[int], list]) -> Path:
    """The raw dataset with episode 0's ``column`` replaced by ``rows(frame)`` (its file's other episode: none)."""
    root = tmp_path / "ds"
    shutil.copytree(annotated["raw"], root)
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    for i, ep in enumerate(table.column("episode_index").to_pylist()):
        values[i] = rows(table.column("frame_index")[i].as_py()) if ep == 0 else []
    at = table.column_names.index(column)
    table = table.set_column(at, column, pa.array(values))
    pq.write_table(table, path)
    return root


BIG = "x" * (language.MAX_TEXT_BYTES + 1)
HUGE_LIST = [{"role": "user", "content": "a", "style": "interjection"}] * (language.MAX_ROWS_PER_FRAME + 1)


@pytest.mark.parametrize(
    ("column", "rows", "says"),
    [
        (
            LANGUAGE_PERSISTENT,
            lambda f: [{"role": "user", "content": BIG, "style": "plan", "timestamp": 0.0}],
            f"field 'content' holds a string of {len(BIG)} bytes",
        ),
        (LANGUAGE_EVENTS, lambda f: HUGE_LIST if f == 3 else [], f"frame 3 has {len(HUGE_LIST)} rows"),
        (LANGUAGE_EVENTS, lambda f: [{"role": "user", "mood": "x"}], "field(s) ['mood'] that LeRobot's language rows"),
        (LANGUAGE_EVENTS, lambda f: [{"role": 3}], "field 'role' is int64, not text"),
        (LANGUAGE_PERSISTENT, lambda f: ["a sentence"], "not structs of role, content"),
        (LANGUAGE_EVENTS, lambda f: [{"role": "user", "tool_calls": ["{not json"]}], "which is not JSON"),
        (LANGUAGE_EVENTS, lambda f: [{"role": "user", "tool_calls": ["[" * 200_000]}], "which is not JSON"),
        (
            LANGUAGE_EVENTS,
            lambda f: [{"role": "user", "tool_calls": ['{"x": 1.5, "n": 99999999999999999999999}']}],
            "which is not JSON a sample decodes (Value is too big!",
        ),
    ],
)
def test_untrusted_rows_are_refused_naming_episode_and_column(
    annotated: dict[str, Path], tmp_path: Path, column: str, rows: Callable[[int], list], says: str
) -> None:
    root = _rewritten(annotated, tmp_path, column, rows)
    for attempt in (
        lambda: list(EpisodePoolDataset(str(root), cameras=[], episodes=[0])),
        lambda: convert_dataset(root, tmp_path / "out", progress=False),
    ):
        with pytest.raises(Exception) as raised:
            attempt()
        message = str(raised.value)
        assert "\n" not in message and "episode 0" in message and f"column {column!r}" in message, message
        assert says in message, message
    assert not (tmp_path / "out/manifest.json").exists()


def test_a_mixture_gives_no_rows_where_a_source_has_none(
    annotated: dict[str, Path], synth_factory: Callable[..., Path]
) -> None:
    from lerobot_shards.loader import MixtureDataset
    from lerobot_shards.loader.mix.spec import Mixture, MixtureSource

    lengths = _episode_lengths(annotated["raw"])
    plain = synth_factory(num_episodes=2, cameras=(CAM,), height=32, width=48, length_range=(9, 14), fps=FPS)
    mix = Mixture(
        [
            MixtureSource(str(annotated["shards"]), name="annotated", repeat=1),
            MixtureSource(str(plain), name="plain", repeat=1),
        ]
    )
    seen = set()
    for sample in MixtureDataset(mix, cameras=[]):
        d = int(sample["dataset_index"])
        assert bool(sample[f"{LANGUAGE_EVENTS}_is_missing"]) == (d == 1)
        want = _want(sample, lengths) if d == 0 else {k: [] for k in LANGUAGE_COLUMNS}
        assert {k: sample[k] for k in LANGUAGE_COLUMNS} == want
        seen.add(d)
    assert seen == {0, 1}
