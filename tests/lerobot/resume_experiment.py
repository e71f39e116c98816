"""Why LeRobot 0.6.1's own resume is not bit-identical: ACT on CPU, 8 uninterrupted steps against a run
resumed from the step-4 checkpoint, printing both runs' losses and whether the final weights match.

    env.sh run REPO DATA WORK -- tests/lerobot/resume_experiment.py MODE REPO DATASET_ROOT WORK

MODE: ``lerobot`` (lerobot-train, its own dataset: differs from step 5), ``lerobot-fork`` (the same
with every DataLoader iterator created under torch.random.fork_rng: identical), ``ours``
(lerobot-shards train: identical). Measured 2026-12-02 (README, "Training a LeRobot policy").
A manual experiment, not a test (about a minute per mode on 2 cores).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys

mode, wt, root, work = sys.argv[1:5]
base = f"{work}/exp-{mode}"
shutil.rmtree(base, ignore_errors=True)
os.makedirs(base)
src = f"{wt}/src"
ACT = "--policy.type=act --policy.dim_model=32 --policy.n_heads=2 --policy.dim_feedforward=64 --policy.n_encoder_layers=1 --policy.n_decoder_layers=1 --policy.latent_dim=8 --policy.chunk_size=10 --policy.n_action_steps=10 --policy.pretrained_backbone_weights=null --policy.device=cpu --policy.push_to_hub=false --batch_size=2 --steps=8 --save_freq=4 --log_freq=1 --seed=7 --wandb.enable=false --num_workers=0".split()
runner = {
    "ours": "import sys; sys.argv=['lerobot-shards','train']+sys.argv[1:]; from lerobot_shards.cli import run; run()",
    "lerobot": "import sys; sys.argv=['lerobot-train']+sys.argv[1:]; from lerobot.scripts.lerobot_train import main; main()",
    "lerobot-fork": """import sys, torch, torch.utils.data as d
orig = d.DataLoader.__iter__
def it(self):
    with torch.random.fork_rng(devices=[]):
        return orig(self)
d.DataLoader.__iter__ = it
sys.argv=['lerobot-train']+sys.argv[1:]; from lerobot.scripts.lerobot_train import main; main()""",
}[mode]
env = {**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1"}


def go(args: list[str], log: str) -> list[str]:
    with open(log, "w") as f:
        subprocess.run(
            [sys.executable, "-c", runner, *args], stdout=f, stderr=subprocess.STDOUT, env=env, timeout=500, check=True
        )
    with open(log) as f:
        return [line.split("loss:")[1].split()[0] for line in f if " step:" in line and "loss:" in line]


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


ds = ["--dataset.repo_id=local/experiment", f"--dataset.root={root}"]
a = go([*ds, *ACT, f"--output_dir={base}/a"], f"{base}/a.log")
shutil.copytree(f"{base}/a", f"{base}/b", symlinks=True)  # b: a as it was after its step-4 checkpoint
shutil.rmtree(f"{base}/b/checkpoints/000008")
os.remove(f"{base}/b/checkpoints/last")
os.symlink("000004", f"{base}/b/checkpoints/last")
config = f"{base}/b/checkpoints/000004/pretrained_model/train_config.json"
with open(config) as f:
    c = json.load(f)
c["output_dir"] = f"{base}/b"
with open(config, "w") as f:
    json.dump(c, f)
b = go(["--resume=true", f"--config_path={config}"], f"{base}/b.log")
weights = "checkpoints/000008/pretrained_model/model.safetensors"
print(mode, "uninterrupted losses", a)
print(mode, "resumed losses (steps 5-8)", b)
print(mode, "final weights equal:", digest(f"{base}/a/{weights}") == digest(f"{base}/b/{weights}"))
