"""Per-joint argmax cells of score maps, and their refinement to sub-cell positions.

A heatmap decoder (the per-joint argmax, or the tree of :func:`~torch_bcfw.inference.tree.tree_max_sum`) returns
integer grid cells; a cell is 4 pixels wide in the pose examples, coarse next to a PCK@0.2 radius of a few pixels.
:func:`refine_cells` moves every cell by less than half a cell towards where the joint's score map rises, from the
scores of the cell's two neighbours along each axis:

* ``"quarter"``: a quarter of a cell towards the higher neighbour in ``x`` and in ``y`` (Newell et al. 2016, the
  stacked hourglass networks), no shift when both neighbours score the same;
* ``"parabola"``: the vertex of the parabola through the three scores ``s[-1], s[0], s[+1]``,
  ``(s[-1] - s[+1]) / (2 (s[-1] - 2 s[0] + s[+1]))``, clipped to ``[-0.5, +0.5]``, and no shift where the parabola
  is not concave (``s[-1] - 2 s[0] + s[+1] >= 0``).  On the log of a sampled Gaussian (a log-softmax heatmap of a
  Gaussian bump) the vertex is the Gaussian's centre exactly.

A cell on the border of the grid, which lacks a neighbour along an axis, is not moved along that axis.  Positions
are ``(y, x)`` in grid units, as everywhere in the pose code (cell ``g``'s centre at ``g``).
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["SUBCELL_RULES", "SubcellRule", "argmax_positions", "refine_cells"]

SubcellRule = Literal["quarter", "parabola"]
#: the refinement rules of :func:`refine_cells`
SUBCELL_RULES: tuple[str, ...] = ("quarter", "parabola")


def _check_maps(scores: Tensor, name: str = "scores") -> None:
    if not isinstance(scores, Tensor) or scores.dim() != 4 or scores.shape[-1] != scores.shape[-2] \
            or not scores.is_floating_point():
        shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"{name} must be a float tensor [N, J, G, G] (one square map per joint), got {shape}")


def argmax_positions(heatmaps: Tensor) -> Tensor:
    """Per-joint argmax cells ``LongTensor[N, J, 2]`` ``(y, x)`` of score maps ``[N, J, G, G]`` (ties: the first
    cell in row-major order)."""
    _check_maps(heatmaps, "heatmaps")
    N, J, G, _ = heatmaps.shape
    flat = heatmaps.reshape(N, J, G * G).argmax(-1)
    return torch.stack((torch.div(flat, G, rounding_mode="floor"), flat % G), dim=-1)


def refine_cells(cells: Tensor, scores: Tensor, rule: SubcellRule = "quarter") -> Tensor:
    """Refine integer cells into sub-cell positions from the scores around them (module docstring).

    Args:
        cells: integer ``[N, J, 2]`` ``(y, x)`` in ``[0, G)``: the decoded cell of every joint (the argmax of its
            map or any other decoder's).
        scores: float ``[N, J, G, G]``: joint ``j``'s score map (e.g. its log-softmax heatmap); finite around the
            cells.
        rule: ``"quarter"`` or ``"parabola"``.

    Returns float ``[N, J, 2]`` ``(y, x)`` (the dtype of ``scores``, float32 for half precision), each within half
    a cell of its cell.

    Raises ``ValueError`` on shapes that do not match, non-integer or off-grid cells, or an unknown rule.
    """
    _check_maps(scores)
    N, J, G, _ = scores.shape
    if not isinstance(cells, Tensor) or tuple(cells.shape) != (N, J, 2):
        shape = tuple(cells.shape) if isinstance(cells, Tensor) else type(cells).__name__
        raise ValueError(f"cells must be an integer tensor [N, J, 2] = [{N}, {J}, 2] (y, x) matching the scores "
                         f"{tuple(scores.shape)}, got {shape}")
    if cells.is_floating_point() or cells.is_complex() or cells.dtype == torch.bool:
        raise ValueError(f"cells must be integer grid cells, got {cells.dtype}")
    if rule not in SUBCELL_RULES:
        raise ValueError(f"rule must be one of {SUBCELL_RULES}, got {rule!r}")
    cells = cells.to(scores.device, torch.long)
    if cells.numel() and (int(cells.min()) < 0 or int(cells.max()) >= G):
        raise ValueError(f"cells must lie on the {G} x {G} grid ([0, {G - 1}]), got range "
                         f"[{int(cells.min())}, {int(cells.max())}]")
    dtype = scores.dtype if scores.dtype in (torch.float32, torch.float64) else torch.float32
    flat = scores.reshape(N, J, G * G).to(dtype)
    y, x = cells[..., 0], cells[..., 1]

    def at(yy: Tensor, xx: Tensor) -> Tensor:  # scores at (yy, xx), clamped onto the grid: [N, J]
        return flat.gather(2, (yy.clamp(0, G - 1) * G + xx.clamp(0, G - 1))[..., None]).squeeze(2)

    centre = at(y, x)
    shifts = []
    for lo, hi, inside in ((at(y - 1, x), at(y + 1, x), (y > 0) & (y < G - 1)),
                           (at(y, x - 1), at(y, x + 1), (x > 0) & (x < G - 1))):
        if rule == "quarter":
            step = 0.25 * torch.sign(hi - lo)
        else:
            curve = lo - 2 * centre + hi
            vertex = 0.5 * (lo - hi) / torch.where(curve < 0, curve, -torch.ones_like(curve))
            step = torch.where(curve < 0, vertex.clamp(-0.5, 0.5), torch.zeros_like(curve))
        shifts.append(torch.where(inside, torch.nan_to_num(step), torch.zeros_like(step)))
    return cells.to(dtype) + torch.stack(shifts, dim=-1)
