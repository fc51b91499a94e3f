"""What augmentation through the whole backbone costs the pose example, per training step and per epoch.

    python benchmarks/pose_augment_cost.py [--threads 1] [--batches 8]

``examples/pose_lsp.py`` caches EfficientNet-Lite0's blocks 0-4 once per frame (and mirror) and trains blocks
5-15 and the decoder on the cached maps, so flips are its only augmentation.  Scale, rotation and crop
augmentation changes the frame at every step, so the frozen blocks must run at every step.  This times, on
batches of 256-pixel frames (batch 16, the example's), (a) the cached step: the trained part's forward and
backward from cached maps (plus the AdamW step), and (b) the augmented step: a random similarity warp of the
frames and their 14 joints (:func:`torch_bcfw.vision.random_similarity`, the example's: scale 0.75-1.25, rotation
+-30 degrees, translation +-10%), the frozen blocks' forward without gradient
(:func:`torch_bcfw.vision.frozen_part`), then the same trained step.  Prints a table (ms per step, seconds per epoch of
1200 images, the ratio) and writes ``benchmarks/results/pose_augment_cost.json``.
"""
from __future__ import annotations

import argparse
import time

import torch
from common import print_table, write_json

from torch_bcfw.vision import (
    PretrainedTrunk,
    efficientnet_lite0,
    frozen_part,
    random_similarity,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", type=int, default=8, help="timed steps per arm (after one warm-up step)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--train-from", type=int, default=5)
    ap.add_argument("--images", type=int, default=1200, help="training images per epoch")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    backbone = efficientnet_lite0().eval()
    G = args.size // 4
    trunk = PretrainedTrunk(backbone, 14 + 429, args.train_from, 128)
    optim = torch.optim.AdamW([p for p in trunk.parameters() if p.requires_grad], lr=1e-4)
    images = torch.rand(args.batch_size, 3, args.size, args.size, generator=gen)
    target = torch.randn(args.batch_size, 14 + 429, G, G, generator=gen)

    def trained_step(cached: list[torch.Tensor]) -> None:
        trunk.train()
        loss = (trunk(cached, (G, G)) - target).square().mean()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()

    def frozen(x: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            return [m.half().float() for m in frozen_part(backbone, x, args.train_from)]

    joints = torch.rand(args.batch_size, 14, 2, generator=gen) * args.size
    visible = torch.ones(args.batch_size, 14, dtype=torch.bool)

    def warp(x: torch.Tensor) -> torch.Tensor:
        return random_similarity(x, joints, visible, gen)[0]

    cached = frozen(images)
    arms = {"cached (flips only)": lambda: trained_step(cached),
            "augmented (warp + frozen blocks every step)": lambda: trained_step(frozen(warp(images)))}
    rows, parts = [], {}
    for name, step in arms.items():
        step()  # warm-up
        t = time.perf_counter()
        for _ in range(args.batches):
            step()
        ms = (time.perf_counter() - t) / args.batches * 1000
        rows.append({"arm": name, "ms_per_step": ms, "s_per_epoch": ms / 1000 * args.images / args.batch_size})
    t = time.perf_counter()
    for _ in range(args.batches):
        frozen(warp(images))
    parts["warp_and_frozen_blocks_ms"] = (time.perf_counter() - t) / args.batches * 1000
    for r in rows:
        r["ratio_to_cached"] = r["ms_per_step"] / rows[0]["ms_per_step"]
    print_table(rows, list(rows[0]))
    print(f"warp + frozen blocks alone: {parts['warp_and_frozen_blocks_ms']:.0f} ms per step")
    write_json("pose_augment_cost.json", {"options": vars(args), "rows": rows, **parts})


if __name__ == "__main__":
    main()
