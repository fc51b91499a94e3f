"""Online exponentiated gradient on the SSVM dual (Collins, Globerson, Koo, Carreras & Bartlett 2008), as the
BCFW paper configured it for its baseline (Lacoste-Julien et al. 2013, App. F).

Each block's dual variable is a Gibbs distribution ``alpha_i(y) ~ exp(theta_i(y))``, ``theta_i`` in the model's
parts (a chain: node potentials ``[L_i, K]``, transitions ``[K, K]``).  A step on block ``i`` is ``theta_i <- theta_i
+ eta_i H_i(.; w)``, ``H_i(y; w) = L_i(y) - <w, psi_i(y)>`` (``n`` times the dual's gradient: their ``C`` is ``1/(lam
n)``); the marginals come from forward-backward, one oracle call each.  Per-example steps start at ``eg_step0``, are
halved until the dual increases (at most ``eg_max_halvings_first`` times in the first pass, ``eg_max_halvings``
after; no move when it never does) and grow by ``eg_step_growth`` after each line search.  The start is ``theta =
0``.  Every iterate is a feasible dual point, so the certificate is exact; no averaged iterate.  ``max_passes``
counts block updates; the history's ``passes`` counts oracle calls.  Needs a chain (Gibbs parts, marginal state).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..checks import saved_int, saved_tensor
from ..inference.forward_backward import chain_marginals_one
from ..runtime.threads import single_thread
from .algorithm import Algorithm
from .options import OptionGroup, check_int, check_real
from .sampling import make_sampler

__all__ = ["OnlineEG", "OnlineEGOptions"]


@dataclass
class OnlineEGOptions(OptionGroup):
    """The options of ``solver="online-eg"`` (Collins et al. 2008), given as ``eg_step0``, ...

    Attributes:
        step0: initial step size of every example (default 0.5).
        max_halvings_first: most step halvings per line search in the first pass (default 2).
        max_halvings: most halvings afterwards (default 5).
        step_growth: factor on an example's step after each line search (default 1.05).
    """

    prefix: ClassVar[str] = "eg"
    step0: float = 0.5
    max_halvings_first: int = 2
    max_halvings: int = 5
    step_growth: float = 1.05

    def __post_init__(self) -> None:
        self.step0 = float(check_real("eg_step0", self.step0, positive=True, finite=True))
        self.max_halvings_first = check_int("eg_max_halvings_first", self.max_halvings_first, 0)
        self.max_halvings = check_int("eg_max_halvings", self.max_halvings, 0)
        self.step_growth = float(check_real("eg_step_growth", self.step_growth, positive=True, finite=True))


class OnlineEG(Algorithm):
    """``solver="online-eg"`` (see the module docstring)."""

    name = "online-eg"
    Options = OnlineEGOptions

    def __init__(self, model, data, lam, options, state=None, bounds=None):
        super().__init__(model, data, lam, options)
        self.refuse_bcfw_extras(bounds)
        self.state = state if state is not None else model.dual_state(data, lam)
        if not (hasattr(model, "gibbs_parts") and hasattr(self.state, "set_block_marginals")):
            raise ValueError(f"online-eg needs the expectation (marginal) oracle, which {type(model).__name__} does not "
                             "have; it is available for chain models")
        K, dev = model.n_labels, data.device
        self.theta_node = torch.zeros(data.n_tokens, K, dtype=torch.float64)  # CPU: the per-block steps
        self.theta_trans = torch.zeros(self.n, K, K, dtype=torch.float64)
        self.eta = np.full(self.n, self.options.own.step0)
        self.steps = 0
        self.sampler = make_sampler(options.sampling, self.n, options.seed)
        self._offsets = data.offsets.cpu()
        # the uniform start: every block at the marginals of theta = 0
        lengths = data.lengths.to(torch.float64)
        mu = torch.full((data.n_tokens, K), 1.0 / K, dtype=torch.float64, device=dev)
        T = ((lengths - 1.0) / K**2)[:, None, None].expand(self.n, K, K).clone().to(dev)
        self.state.mu, self.state.T = mu, T
        self.state.block_ell = model.expected_loss(data, mu) / self.n
        self.state.refresh()

    @property
    def work(self) -> int:
        return self.steps

    def _marginals(self, i: int, node: np.ndarray, trans: np.ndarray):
        if self.data.device.type == "cpu":
            _, mu, T = chain_marginals_one(node, trans)
            return torch.from_numpy(mu), torch.from_numpy(T)
        from ..inference.forward_backward import chain_marginals

        L = node.shape[0]
        _, mu, T = chain_marginals(torch.from_numpy(node).to(self.data.device),
                                   torch.from_numpy(trans).to(self.data.device)[None],
                                   torch.tensor([0, L], device=self.data.device))
        return mu, T[0]

    def _step(self, i: int) -> None:
        st, model = self.state, self.model
        blk = st.block_data(i)
        s, e = int(self._offsets[i]), int(self._offsets[i + 1])
        U, trans = model.gibbs_parts(st.w, blk, loss_augmented=True)
        U, trans = U.cpu().numpy(), trans.cpu().numpy()
        th_node, th_trans = self.theta_node[s:e].numpy(), self.theta_trans[i].numpy()
        w0, ell0 = st.w, float(st.block_ell[i])
        sq0 = float(w0 @ w0)
        eg = self.options.own
        halvings = eg.max_halvings_first if self.steps < self.n else eg.max_halvings
        eta = float(self.eta[i])
        for trial in range(halvings + 1):
            node, tr = th_node + eta * U, th_trans + eta * trans
            mu, T = self._marginals(i, node, tr)
            self.oracle_calls += 1
            mu, T = mu.to(w0.device), T.to(w0.device)
            dv = model.features_from_marginals(blk, st.mu[s:e] - mu, st.T[i] - T) / (self.lam * self.n)
            ell = float(model.expected_loss(blk, mu)[0]) / self.n
            w1 = w0 + dv
            gain = (ell - ell0) - 0.5 * self.lam * (float(w1 @ w1) - sq0)
            if gain > 0:
                st.set_block_marginals(i, mu, T, ell)
                self.theta_node[s:e] = torch.from_numpy(node)
                self.theta_trans[i] = torch.from_numpy(tr)
                break
            if trial < halvings:
                eta *= 0.5
        self.eta[i] = eta * self.options.own.step_growth
        self.steps += 1

    def advance(self, m: int) -> None:
        with single_thread(self.data.device):  # one OCR-small pass: 5.0 s with 2 threads, 0.7 s with one
            for i in self.sampler.draw(m):
                self._step(int(i))

    def iterate(self):
        return self.state.w, self.state.dual_ell()

    def on_scheduled_check(self) -> None:
        self.state.refresh()

    def state_dict(self) -> dict:
        return {"state": self.state.state_dict(), "theta_node": self.theta_node.clone(),
                "theta_trans": self.theta_trans.clone(), "eta": torch.from_numpy(self.eta.copy()),
                "steps": self.steps, "oracle_calls": self.oracle_calls, "sampler": self.sampler.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        for key in ("theta_node", "theta_trans"):
            old = getattr(self, key)
            setattr(self, key, saved_tensor(sd.get(key), f"online-eg {key}", tuple(old.shape)).to(old.device))
        # every block's marginals are those of its Gibbs distribution exp(theta_i): feasible by construction
        off, node, trans = self._offsets.tolist(), self.theta_node.numpy(), self.theta_trans.numpy()
        parts = [self._marginals(i, node[off[i]:off[i + 1]], trans[i]) for i in range(self.n)]
        self.state.known_marginals = (torch.cat([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
        try:
            self.state.load_state_dict(sd["state"])
        finally:
            self.state.known_marginals = None
        self.eta = saved_tensor(sd.get("eta"), "online-eg eta", tuple(self.eta.shape), lo=0.0).numpy().copy()
        self.steps = saved_int(sd["steps"], "steps", 0)
        self.oracle_calls = saved_int(sd["oracle_calls"], "oracle_calls", 0)
        self.sampler.load_state_dict(sd["sampler"])
