"""``lerobot-shards train``: LeRobot 0.6.1's own trainer (ACT, Diffusion) from converted shards in the
local S3-protocol server; two Accelerate processes read disjoint samples; a run SIGKILLed after its
step-10 checkpoint and resumed with ``--resume=true`` ends with the uninterrupted run's weights."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from pathlib import Path

import pytest
from procs import CLI, TINY_ACT, env, run, started, wait_for

TIMEOUT = 400  # seconds per training process (20 tiny CPU steps take ~30-60 s on a loaded 2-core machine)

ACT = [*TINY_ACT, "--policy.vision_backbone=resnet18"]
DIFFUSION = [
    "--policy.type=diffusion",
    "--policy.n_obs_steps=2",
    "--policy.horizon=16",
    "--policy.n_action_steps=8",
    "--policy.down_dims=[32,64]",
    "--policy.diffusion_step_embed_dim=32",
    "--policy.spatial_softmax_num_keypoints=8",
    "--policy.crop_shape=[40,56]",
    "--policy.use_group_norm=true",
    "--policy.pretrained_backbone_weights=null",
]


def _args(dataset: str, out: Path, policy: list[str], steps: int = 20, save_freq: int = 10) -> list[str]:
    return [
        "--dataset.repo_id=local/so101",
        f"--dataset.root={dataset}",
        *policy,
        "--policy.device=cpu",
        "--policy.push_to_hub=false",
        "--batch_size=2",
        f"--steps={steps}",
        f"--save_freq={save_freq}",
        "--log_freq=5",
        "--seed=7",
        "--wandb.enable=false",
        f"--output_dir={out}",
    ]


def _bucket_env(s3_server, **extra: str) -> dict[str, str]:
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    return env(**s3_server.env, LEROBOT_SHARDS_STORAGE_OPTIONS=json.dumps(options), **extra)


def _weights_hash(step_dir: Path) -> str:
    """sha256 over every saved parameter (name, dtype, shape, bytes), in name order."""
    from safetensors.torch import load_file

    tensors = load_file(step_dir / "pretrained_model/model.safetensors")
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def act_run(train_shards: str, s3_server, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """ACT, 20 uninterrupted steps from the bucket, checkpoints at 10 and 20 (shared by two tests)."""
    out = tmp_path_factory.mktemp("act") / "run"
    manifest = train_shards.removeprefix("s3://") + "/manifest.json"
    before = s3_server.requests("GET", manifest)
    environ = _bucket_env(s3_server, TMPDIR=str(out.parent))  # where the decoded-frame cache goes by itself
    log = run([*CLI, "train", *_args(train_shards, out, ACT)], out.parent / "log.txt", environ, TIMEOUT)
    return out, log, s3_server.requests("GET", manifest) - before


def test_act_trains_20_steps_from_a_bucket(act_run: tuple[Path, str, int]) -> None:
    out, log, manifest_reads = act_run
    assert "lerobot-shards train: s3://train-shards/so101: 4 episodes, 1492 frames, rank 0/1" in log
    assert manifest_reads == 1  # the dataset is opened once: its windows are set after reading its meta
    assert "num_workers=0, decode_threads=" in log  # the layout it chose, reported
    frames = out.parent / f"lerobot-shards-frames-{os.geteuid()}"  # the user's own
    assert f"decoded-frame cache on in {frames}, at most " in log  # the disk had room: on by itself
    assert "partition=node (each node's caches hit from the second epoch), 1 node" in log
    assert list(frames.rglob("*")), "the frame cache holds no entry"
    assert "step:20 " in log and "End of training" in log
    state = json.loads((out / "checkpoints/000020/training_state/lerobot_shards_data.json").read_text())
    assert (state["epoch"], state["batches_consumed"], state["batch_size"]) == (0, 20, 2)
    assert json.loads((out / "checkpoints/000020/training_state/training_step.json").read_text())["step"] == 20


def test_diffusion_trains_20_steps_from_a_bucket(written_bucket: str, s3_server, tmp_path: Path) -> None:
    """On the LeRobot-written dataset's shards (one camera: with 2 obs steps, as many images per step as ACT);
    as LeRobot's sampler, never on an episode's last 7 frames (Diffusion's drop_n_last_frames)."""
    out = tmp_path / "run"
    samples = tmp_path / "samples"
    samples.mkdir()
    cmd = [*CLI, "train", *_args(written_bucket, out, DIFFUSION)]
    log = run(cmd, tmp_path / "log.txt", _bucket_env(s3_server, LEROBOT_SHARDS_SAMPLE_LOG=str(samples)), TIMEOUT)
    assert "lerobot-shards train: s3://written-shards/shards: 3 episodes, 141 frames" in log
    assert "step:20 " in log and "End of training" in log
    assert (out / "checkpoints/000020/pretrained_model/model.safetensors").is_file()
    state = json.loads((out / "checkpoints/000020/training_state/lerobot_shards_data.json").read_text())
    assert state["drop_n_last_frames"] == 7
    ends = [40, 40 + 47, 40 + 47 + 54]  # the episodes' global index ends (40, 47, 54 frames)
    dropped = {i for end in ends for i in range(end - 7, end)}
    trained = [int(i) for line in (samples / "rank0.txt").read_text().splitlines() for i in line.split()[2:]]
    assert len(trained) == 40 and not dropped & set(trained)


def test_killed_after_step_10_and_resumed_ends_with_the_same_weights(
    act_run: tuple[Path, str, int], train_shards: str, s3_server, tmp_path: Path
) -> None:
    reference, _, _ = act_run
    out = tmp_path / "run"
    environ = _bucket_env(s3_server)
    last = out / "checkpoints/last"
    log = tmp_path / "first.txt"
    with started([*CLI, "train", *_args(train_shards, out, ACT)], log, environ) as proc:
        wait_for(
            "the step-10 checkpoint", lambda: last.is_symlink() and last.resolve().name == "000010", proc, log, TIMEOUT
        )
        proc.kill()  # SIGKILL (the group goes too when the context exits)
        proc.wait(timeout=30)
    assert not (out / "checkpoints/000020").exists()
    resumed = run(
        [*CLI, "train", "--resume=true", f"--config_path={last}/pretrained_model/train_config.json"],
        tmp_path / "resumed.txt",
        environ,
        TIMEOUT,
    )
    assert "step:20 " in resumed and "step:5 " not in resumed
    assert _weights_hash(out / "checkpoints/000010") == _weights_hash(reference / "checkpoints/000010")
    assert _weights_hash(out / "checkpoints/000020") == _weights_hash(reference / "checkpoints/000020")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_accelerate_processes_read_disjoint_samples(train_shards: str, s3_server, tmp_path: Path) -> None:
    samples = tmp_path / "samples"
    samples.mkdir()
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",  # torchrun-style processes; each Accelerator runs on CPU (--policy.device=cpu): gloo
        "--num_processes=2",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        f"--main_process_port={_free_port()}",
        "-m",
        "lerobot_shards.cli",
        "train",
        *_args(train_shards, tmp_path / "run", ACT, steps=2, save_freq=2),
    ]
    environ = _bucket_env(s3_server, LEROBOT_SHARDS_SAMPLE_LOG=str(samples), OMP_NUM_THREADS="1")
    log = run(launch, tmp_path / "log.txt", environ, TIMEOUT)
    assert "rank 0/2" in log and "rank 1/2" in log
    per_rank = {}
    for rank in (0, 1):
        lines = (samples / f"rank{rank}.txt").read_text().split("\n")
        per_rank[rank] = [int(i) for line in lines if line for i in line.split()[2:]]
        assert len(per_rank[rank]) == 2 * 2  # 2 steps of batch 2, read by this rank itself
    assert not set(per_rank[0]) & set(per_rank[1])  # disjoint shares, nothing dispatched from rank 0
    state = json.loads((tmp_path / "run/checkpoints/000002/training_state/lerobot_shards_data.json").read_text())
    assert state["world_size"] == 2 and state["batches_consumed"] == 2
    assert os.path.isdir(tmp_path / "run/checkpoints/000002/pretrained_model")
    config = tmp_path / "run/checkpoints/000002/pretrained_model/train_config.json"
    assert json.loads(config.read_text())["dataset"]["streaming"] is False  # as given, not the trainer's true
    # Resumed on one process: the checkpoint's equal counts per rank kept, the epoch finished elastically
    # (the loader's default flipped with the world size and the resume was refused).
    resumed = run(
        [*CLI, "train", "--resume=true", f"--config_path={config}", "--steps=3"],
        tmp_path / "r.txt",
        _bucket_env(s3_server, OMP_NUM_THREADS="1"),
        TIMEOUT,
    )
    assert "rank 0/1" in resumed
    state = json.loads((tmp_path / "run/checkpoints/000003/training_state/lerobot_shards_data.json").read_text())
    assert (state["world_size"], state["elastic_world_size"], state["equal_samples_per_rank"]) == (1, 2, True)


def test_repo_id_alone_trains_from_the_hub(written, hub, tmp_path: Path) -> None:
    """--dataset.repo_id without --dataset.root: our loader streams the Hub repo at the commit of its
    v3.0 tag (the loopback Hub server, LeRobot's huggingface_hub 1.x client), never LeRobot's download."""
    sha = hub.add_dataset("me/written", written.raw)
    hub.add_dataset("me/written", written.shards, branches=("main",), tags=())  # main: not what v3.0 names
    args = [a for a in _args("", tmp_path / "run", ACT, steps=2, save_freq=2) if not a.startswith("--dataset.")]
    log = run(
        [*CLI, "train", "--dataset.repo_id=me/written", *args], tmp_path / "log.txt", env(HF_HUB_OFFLINE="0"), TIMEOUT
    )
    assert f"lerobot-shards train: hf://datasets/me/written@{sha}: " in log
    assert hub.requests("GET", "/resolve/") and not hub.requests("GET", "/resolve/main")
    assert (tmp_path / "run/checkpoints/000002/pretrained_model/model.safetensors").is_file()


def test_a_storage_bucket_trains_through_our_loader(written, hub, tmp_path: Path) -> None:
    """--dataset.repo_type=bucket without --dataset.root: our loader streams hf://buckets/<repo_id> (the URL
    LeRobot's streaming dataset reads) as it streams a repo; resumed after its step-2 checkpoint, the run
    ends with the uninterrupted run's weights."""
    import shutil

    hub.add_bucket("me/bucket", written.raw)
    args = [a for a in _args("", tmp_path / "a", ACT, steps=4, save_freq=2) if not a.startswith("--dataset.")]
    args = ["--dataset.repo_id=me/bucket", "--dataset.repo_type=bucket", "--dataset.streaming=true", *args]
    log = run([*CLI, "train", *args], tmp_path / "a.txt", env(HF_HUB_OFFLINE="0"), TIMEOUT)
    assert "lerobot-shards train: hf://buckets/me/bucket: " in log
    assert hub.requests("GET", "/buckets/me/bucket/resolve/") and not hub.requests("GET", "/api/datasets/")
    b = tmp_path / "b"  # the same run as it stood after its step-2 checkpoint
    shutil.copytree(tmp_path / "a", b, symlinks=True)
    shutil.rmtree(b / "checkpoints/000004")
    (b / "checkpoints/last").unlink()
    (b / "checkpoints/last").symlink_to("000002")
    config = b / "checkpoints/000002/pretrained_model/train_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "output_dir": str(b)}))
    resumed = run(
        [*CLI, "train", "--resume=true", f"--config_path={config}"],
        tmp_path / "b.txt",
        env(HF_HUB_OFFLINE="0"),
        TIMEOUT,
    )
    assert "lerobot-shards train: hf://buckets/me/bucket: " in resumed
    assert _weights_hash(b / "checkpoints/000004") == _weights_hash(tmp_path / "a/checkpoints/000004")


def test_metadata_from_the_hub_and_data_files_from_a_root(written, hub, tmp_path: Path) -> None:
    """--dataset.repo_id with a repo holding meta/ only and --shards.data_files_root naming a folder
    with data/ and videos/: our loader trains on them, and the checkpoint records the root."""
    import shutil

    shutil.copytree(written.raw / "meta", tmp_path / "meta_only/meta")
    hub.add_dataset("me/meta_only", tmp_path / "meta_only")
    args = [a for a in _args("", tmp_path / "run", ACT, steps=2, save_freq=2) if not a.startswith("--dataset.")]
    command = [*CLI, "train", "--dataset.repo_id=me/meta_only", f"--shards.data_files_root={written.raw}", *args]
    log = run(command, tmp_path / "log.txt", env(HF_HUB_OFFLINE="0"), TIMEOUT)
    assert "lerobot-shards train: hf://datasets/me/meta_only@" in log
    state = json.loads((tmp_path / "run/checkpoints/000002/training_state/lerobot_shards_data.json").read_text())
    assert state["settings"]["data_files_root"] == str(written.raw)
    assert not hub.requests("GET", "/data/") and not hub.requests("GET", "/videos/")


def test_resume_with_workers_across_an_epoch_end(written, tmp_path: Path) -> None:
    """Raw source, 2 DataLoader workers, batch 8 (18 batches an epoch): resumed at step 12, the run crosses
    into epoch 1 as the uninterrupted one did and ends with the same weights. The workers' batches
    travel in shared-memory slabs (the trainer's DataLoader rebuilt with SlabCollate)."""
    import shutil

    args = [*_args(str(written.raw), tmp_path / "a", ACT, steps=24, save_freq=12), "--batch_size=8", "--num_workers=2"]
    log = run([*CLI, "train", *args], tmp_path / "a.txt", env(), TIMEOUT)
    assert "2 workers hand batches over in reused shared-memory slabs (SlabCollate)" in log
    assert "leaked semaphore" not in log  # the DataLoader's queues, still held by the loop at exit
    b = tmp_path / "b"  # the same run as it stood after its step-12 checkpoint
    shutil.copytree(tmp_path / "a", b, symlinks=True)
    shutil.rmtree(b / "checkpoints/000024")
    (b / "checkpoints/last").unlink()
    (b / "checkpoints/last").symlink_to("000012")
    config = b / "checkpoints/000012/pretrained_model/train_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "output_dir": str(b)}))
    run([*CLI, "train", "--resume=true", f"--config_path={config}"], tmp_path / "b.txt", env(), TIMEOUT)
    state = json.loads((b / "checkpoints/000024/training_state/lerobot_shards_data.json").read_text())
    assert (state["epoch"], state["batches_consumed"], state["num_workers"]) == (1, 6, 2)
    assert _weights_hash(b / "checkpoints/000024") == _weights_hash(tmp_path / "a/checkpoints/000024")


def test_act_trains_on_a_mixture_file(written, tmp_path: Path) -> None:
    """``--dataset.root mix.yaml``: a converted source and a raw one, weighted; the data state records the mixture."""
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        f"samples_per_epoch: 40\nsources:\n"
        f"  - {{source: {written.shards}, name: shards, weight: 3}}\n"
        f"  - {{source: {written.raw}, name: raw, weight: 1, episodes: [0, 2]}}\n"
    )
    out = tmp_path / "run"
    log = run([*CLI, "train", *_args(str(mix), out, ACT, steps=4, save_freq=4)], tmp_path / "log.txt", env(), TIMEOUT)
    assert f"lerobot-shards train: {mix}: 5 episodes," in log
    assert "End of training" in log
    state = json.loads((out / "checkpoints/000004/training_state/lerobot_shards_data.json").read_text())
    assert (state["epoch"], state["batches_consumed"]) == (0, 4)
    assert state["mixture_counts"] == {"shards": 30, "raw": 10} and len(state["mixture_digest"]) == 16


def test_our_settings_are_arguments_recorded_in_the_checkpoint_and_restored(
    written_bucket: str, s3_server, tmp_path: Path
) -> None:
    """``--shards.*`` arguments (pool, cache, storage options with the endpoint) go into the checkpoint,
    the storage secret never; a resume from a shell whose environment says otherwise (another pool,
    which the data order would refuse, no endpoint, no cache) runs on the checkpoint's."""
    secret = "never-stored-7d1e"
    options = {"key": "testing", "secret": secret, "client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    shell = {k: v for k, v in s3_server.env.items() if k != "AWS_ENDPOINT_URL"}
    out, cache = tmp_path / "run", tmp_path / "cache"
    args = [
        *_args(written_bucket, out, ACT, steps=2, save_freq=2),
        f"--shards.storage_options={json.dumps(options)}",
        f"--shards.cache_dir={cache}",
        "--shards.episode_pool_size=4",
        "--shards.frame_cache=off",
    ]
    first = run([*CLI, "train", *args], tmp_path / "a.txt", env(**shell), TIMEOUT)
    assert "decoded-frame cache off (turned off;" in first
    checkpoint = out / "checkpoints/000002"
    state = json.loads((checkpoint / "training_state/lerobot_shards_data.json").read_text())
    assert state["episode_pool_size"] == 4
    assert state["settings"]["episode_pool_size"] == 4 and state["settings"]["cache_dir"] == str(cache)
    assert state["settings"]["frame_cache"] == "off" and state["nodes"] == 1
    assert state["settings"]["storage_options"] == {"client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    assert not [p for p in out.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    cached = {p.name for p in cache.rglob("*.tar")}
    assert cached
    for p in cache.rglob("*.tar"):
        p.unlink()
    other = env(**shell, LEROBOT_SHARDS_EPISODE_POOL_SIZE="2", LEROBOT_SHARDS_CACHE_DIR=str(tmp_path / "elsewhere"))
    config = checkpoint / "pretrained_model/train_config.json"
    resumed = run(
        [*CLI, "train", "--resume=true", f"--config_path={config}", "--steps=4"], tmp_path / "b.txt", other, TIMEOUT
    )
    assert "lerobot-shards train: s3://written-shards" in resumed and (out / "checkpoints/000004").is_dir()
    assert {p.name for p in cache.rglob("*.tar")}  # read through the checkpoint's cache again
    assert not (tmp_path / "elsewhere").exists()
