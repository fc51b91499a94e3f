"""One rank of the Lightning DDP tests (tests/test_distributed_fit.py runs it with torchrun, 2 CPU processes, gloo):
``BCFWCallback`` under ``strategy="ddp"``.

``python lightning_ddp_worker.py OUT_DIR STRATEGY``; ``STRATEGY``: the callback's ``strategy`` (``shard``,
``split-oracle``, or ``auto`` which picks ``replicate`` on this tiny problem).  Writes ``OUT_DIR/ddp_rank<r>.json`` with, for the uninterrupted run
(3 epochs) and for the run resumed from the checkpoint ``OUT_DIR/mid.ckpt`` written after 2 epochs: the head, the
backbone, the last record, the logged gap, the strategy, the calibration counters, the gathered training features
of the last solve, and for a sharded run every rank's dual state (the callback's ``shards``).
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402

from conftest import random_multiclass_problem  # noqa: E402
from test_lightning import Toy, _features  # noqa: E402
from torch_bcfw.lightning import BCFWCallback  # noqa: E402

LAM = 0.05
CALLBACKS = {"shard": {"lam": LAM, "passes_per_call": 25, "batch_size": 4, "seed": 5, "strategy": "shard"},
             "auto": {"lam": LAM, "passes_per_call": 25, "seed": 5},
             "split-oracle": {"lam": LAM, "passes_per_call": 25, "batch_size": 3, "seed": 5,
                              "strategy": "split-oracle"}}


def trainer(root: Path, cb, epochs: int) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=epochs, callbacks=[cb], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      use_distributed_sampler=False, default_root_dir=root)


def record(module, cb, raw) -> dict:
    feats = _features(module, raw)
    out = {"head": module.head.w.tolist(), "backbone": module.backbone.weight.flatten().tolist(),
           "backbone_bias": module.backbone.bias.tolist(),
           "last": cb.last_record.to_dict(), "logged_gap": float(module.trainer.callback_metrics["ssvm/gap"]),
           "x": feats.x.tolist(), "y": feats.y.tolist(), "gathered_x": cb.last_data.x.tolist(),
           "gathered_y": cb.last_data.y.tolist(), "strategy": cb.strategy,
           "calibration": sorted(k for k in cb.counters if k.startswith("calibration_"))}
    if cb.shards is not None:
        out.update(shard_ell=[float(s[0]["block_ell"].sum()) for s in cb.shards],
                   shard_n=[int(s[0]["n"]) for s in cb.shards], shard_w=[s[0]["w"].tolist() for s in cb.shards])
    return out


def main() -> None:
    out = Path(sys.argv[1])
    CALLBACK = CALLBACKS[sys.argv[2]]
    torch.set_num_threads(1)
    _, raw = random_multiclass_problem(n=14, F=4, K=3, seed=4)
    full_cb = BCFWCallback(**CALLBACK)
    full = Toy(raw, F=3, K=3)
    trainer(out / "a", full_cb, 3).fit(full)
    result = {"full": record(full, full_cb, raw), "rank": full.trainer.global_rank,
              "world_size": full.trainer.world_size}
    first_cb = BCFWCallback(**CALLBACK)
    first = Toy(raw, F=3, K=3)
    t1 = trainer(out / "b", first_cb, 2)
    t1.fit(first)
    ckpt = out / "mid.ckpt"
    t1.save_checkpoint(ckpt)
    second_cb = BCFWCallback(**CALLBACK)
    second = Toy(raw, F=3, K=3, seed=123)  # other initial weights: everything must come from the checkpoint
    trainer(out / "c", second_cb, 3).fit(second, ckpt_path=ckpt, weights_only=True)  # nothing in it runs code
    result["resumed"] = record(second, second_cb, raw)
    (out / f"ddp_rank{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
