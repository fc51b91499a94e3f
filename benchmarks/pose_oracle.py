"""Oracle time of the pictorial-structures model (14-joint LSP tree, exact max-sum with distance transforms).

    python benchmarks/pose_oracle.py [--grids 16 24 32] [--batches 1 64 256] [--threads 1]

For every grid size ``G`` and batch size ``B`` it times :meth:`torch_bcfw.models.PoseTree.oracle`
(loss-augmented: unary scoring + loss unaries + tree max-sum + packing; what BCFW calls) on random
heatmap features, and reports milliseconds per image and images per second.  Methods: ``envelope`` (the
compiled linear-time lower envelope, CPU), ``dense`` (the O(G^3) broadcast transform, the CUDA path) on
CPU for reference, and ``dense`` on CUDA when a GPU is present.  Target (issue 7): <= 20 ms per image on
CPU at the grid size of the example (G = 32), 100x below the ~2 s of Osokin et al. (2016).
Writes ``benchmarks/results/pose_oracle.json``.
"""
from __future__ import annotations

import argparse

import torch

from common import print_table, timed, write_json
from torch_bcfw.models.pose import PoseTree
from torch_bcfw.data import PoseData


def _problem(G: int, B: int, device: str, gen: torch.Generator):
    unary = torch.randn(B, 14, 1, G, G, generator=gen).log_softmax(-1)
    positions = torch.randint(0, G, (B, 14, 2), generator=gen)
    data = PoseData(unary, positions, torso=torch.full((B,), G / 5.0, dtype=torch.float64)).to(device)
    mu = torch.randn(13, 2, generator=gen, dtype=torch.float64) * G / 8
    return data, mu


def _weights(model: PoseTree, device: str) -> torch.Tensor:
    w = torch.zeros(model.n_features, dtype=torch.float64)
    w[: model.n_joints] = 1.0
    w[model.quadratic_index()] = 0.05
    return w.to(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grids", type=int, nargs="+", default=[16, 24, 32])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    configs = [("cpu", "envelope"), ("cpu", "dense")]
    if torch.cuda.is_available():
        configs.append(("cuda", "dense"))
    rows = []
    for G in args.grids:
        for device, method in configs:
            for B in args.batches:
                if device == "cpu" and method == "dense" and B > 64:
                    continue  # O(G^3): slow on CPU, only shown as a reference
                data, mu = _problem(G, B, device, gen)
                model = PoseTree(G, mu, method=method)
                w = _weights(model, device)

                def run():
                    model.oracle(w, data, loss_augmented=True)
                    if device == "cuda":
                        torch.cuda.synchronize()

                t = timed(run, repeat=args.repeat, warmup=1)
                rows.append({"grid": G, "device": device, "method": method, "batch": B,
                             "ms_per_image": 1e3 * t["median"] / B, "images_per_s": B / t["median"],
                             "min_ms_per_image": 1e3 * t["min"] / B})
                print(rows[-1], flush=True)
    print()
    print_table(rows, ["grid", "device", "method", "batch", "ms_per_image", "min_ms_per_image", "images_per_s"])
    write_json("pose_oracle.json", {"threads": args.threads, "rows": rows,
                                    "note": "PoseTree.oracle, loss-augmented, 14 joints / 13 edges, K = 1"})


if __name__ == "__main__":
    main()
