"""Sub-cell refinement of decoded cells: known sub-cell peaks, symmetric maps, the grid border, shapes and errors."""
from __future__ import annotations

import pytest
import torch

from torch_bcfw.datasets.lsp import grid_to_joints, joints_to_grid
from torch_bcfw.inference.subcell import SUBCELL_RULES, argmax_positions, refine_cells

G = 20


def _log_gaussian(centres: list[tuple[float, float]], sigma: float = 1.5, dtype=torch.float64) -> torch.Tensor:
    """Log-softmax maps [1, J, G, G] of Gaussians sampled on the grid at ``centres`` (y, x)."""
    g = torch.arange(G, dtype=torch.float64)
    maps = [-((g[:, None] - cy) ** 2 + (g[None, :] - cx) ** 2) / (2 * sigma ** 2) for cy, cx in centres]
    m = torch.stack(maps)[None]
    return torch.log_softmax(m.reshape(1, len(centres), -1), -1).reshape(1, len(centres), G, G).to(dtype)


def test_a_sub_cell_peak_is_approached_by_both_rules_and_found_by_the_parabola() -> None:
    centres = [(10.3, 7.8), (4.6, 12.45), (15.0, 3.2)]
    heat = _log_gaussian(centres)
    cells = argmax_positions(heat)
    assert cells.tolist() == [[[10, 8], [5, 12], [15, 3]]]
    truth = torch.tensor(centres, dtype=torch.float64)[None]
    quarter = refine_cells(cells, heat, "quarter")
    parabola = refine_cells(cells, heat, "parabola")
    # the quarter rule moves a quarter cell towards the peak (none where the peak is on the cell: y = 15.0)
    expected = cells.double() + 0.25 * torch.sign(truth - cells.double())
    torch.testing.assert_close(quarter, expected)
    # the log of a Gaussian is a parabola: its vertex through three samples is the centre
    torch.testing.assert_close(parabola, truth, rtol=0, atol=1e-9)
    # both are closer to the truth than the cell centre, for every joint whose peak is off its cell
    err = lambda p: (p - truth).norm(dim=-1)
    assert bool((err(quarter) < err(cells.double())).all()) and bool((err(parabola) < err(quarter)).all())


@pytest.mark.parametrize("rule", SUBCELL_RULES)
def test_integer_peaks_of_symmetric_maps_stay(rule: str) -> None:
    heat = _log_gaussian([(10.0, 7.0), (3.0, 3.0)])
    cells = argmax_positions(heat)
    torch.testing.assert_close(refine_cells(cells, heat, rule), cells.double())
    flat = torch.zeros(2, 3, G, G)  # constant maps: no neighbour is higher
    cells = torch.randint(0, G, (2, 3, 2))
    torch.testing.assert_close(refine_cells(cells, flat, rule), cells.float())


@pytest.mark.parametrize("rule", SUBCELL_RULES)
def test_shifts_follow_the_higher_neighbour_within_bounds_on_random_maps(rule: str) -> None:
    gen = torch.Generator().manual_seed(0)
    heat = torch.randn(5, 4, 6, 6, generator=gen, dtype=torch.float64)
    cells = torch.randint(0, 6, (5, 4, 2), generator=gen)
    out = refine_cells(cells, heat, rule)
    shift = out - cells.double()
    for n in range(5):
        for j in range(4):
            for axis in range(2):
                c = cells[n, j].tolist()
                if c[axis] in (0, 5):  # the border: no neighbour on one side, no shift along this axis
                    assert shift[n, j, axis] == 0
                    continue
                lo, hi = list(c), list(c)
                lo[axis] -= 1
                hi[axis] += 1
                s_lo, s_0, s_hi = heat[n, j, lo[0], lo[1]], heat[n, j, c[0], c[1]], heat[n, j, hi[0], hi[1]]
                if rule == "quarter":
                    assert float(shift[n, j, axis]) == 0.25 * float(torch.sign(s_hi - s_lo))
                else:
                    curve = float(s_lo - 2 * s_0 + s_hi)
                    want = 0.0 if curve >= 0 else min(0.5, max(-0.5, 0.5 * float(s_lo - s_hi) / curve))
                    assert float(shift[n, j, axis]) == pytest.approx(want, abs=1e-12)
                    assert want == 0 or (want > 0) == bool(s_hi > s_lo)


def test_dtypes_and_frame_coordinates() -> None:
    heat = _log_gaussian([(10.3, 7.8)], dtype=torch.float16)
    cells = argmax_positions(heat)
    out = refine_cells(cells, heat, "parabola")
    assert out.dtype == torch.float32 and out.shape == (1, 1, 2)
    assert refine_cells(cells, heat.double(), "quarter").dtype == torch.float64
    # sub-cell grid positions map to frame pixels and back (grid_to_joints takes float positions)
    frame = grid_to_joints(out, 80, G)
    torch.testing.assert_close(joints_to_grid(frame, 80, G), out)
    torch.testing.assert_close(grid_to_joints(cells, 80, G), grid_to_joints(cells.float(), 80, G))


def test_argmax_positions_by_brute_force() -> None:
    heat = torch.randn(3, 2, 5, 5, generator=torch.Generator().manual_seed(1))
    cells = argmax_positions(heat)
    for n in range(3):
        for j in range(2):
            y, x = cells[n, j].tolist()
            assert heat[n, j, y, x] == heat[n, j].max()


def test_bad_inputs_are_refused_clearly() -> None:
    heat = torch.zeros(2, 3, 4, 4)
    cells = torch.zeros(2, 3, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"cells must be an integer tensor \[N, J, 2\]"):
        refine_cells(cells[:, :2], heat)
    with pytest.raises(ValueError, match="integer grid cells"):
        refine_cells(cells.float(), heat)
    with pytest.raises(ValueError, match="on the 4 x 4 grid"):
        refine_cells(cells + 4, heat)
    with pytest.raises(ValueError, match="rule must be one of"):
        refine_cells(cells, heat, "cubic")
    with pytest.raises(ValueError, match=r"scores must be a float tensor \[N, J, G, G\]"):
        refine_cells(cells, heat[..., :3])
    with pytest.raises(ValueError, match=r"scores must be a float tensor"):
        refine_cells(cells, heat[0])
    with pytest.raises(ValueError, match=r"heatmaps must be a float tensor"):
        argmax_positions(heat.long())
