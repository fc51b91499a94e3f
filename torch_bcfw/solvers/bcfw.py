"""Block-Coordinate Frank-Wolfe (Lacoste-Julien et al. 2013, Alg. 4) on a model's dual state."""
from __future__ import annotations

from ..stepsize import FIXED, LINE_SEARCH
from .algorithm import DualAlgorithm
from .sampling import make_sampler

__all__ = ["BCFW"]


class BCFW(DualAlgorithm):
    """BCFW with line search or the fixed step ``2n/(k+2n)``, uniform or permutation sampling.

    The per-block state (``w_i``, ``l_i``) lives in ``model.dual_state(data, lam)``; a pass is
    ``n`` sampled block steps, each with one exact loss-augmented oracle call.
    """

    name = "bcfw"

    def __init__(self, model, data, lam, options, state=None):
        super().__init__(model, data, lam, options, state)
        self.sampler = make_sampler(options.sampling, self.n, options.seed)
        self.step_code = LINE_SEARCH if options.step == "line_search" else FIXED
        self.last_block_gaps = None

    def advance(self, m: int) -> None:
        order = self.sampler.draw(m)
        self.last_block_gaps = self.state.run_steps(order, self.step_code, self.options.averaging)
        self.oracle_calls += m

    def state_dict(self) -> dict:
        return {"state": self.state.state_dict(), "sampler": self.sampler.state_dict(), "oracle_calls": self.oracle_calls}

    def load_state_dict(self, sd: dict) -> None:
        self.state.load_state_dict(sd["state"])
        self.sampler.load_state_dict(sd["sampler"])
        self.oracle_calls = int(sd["oracle_calls"])
