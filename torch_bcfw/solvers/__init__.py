"""Solvers of the SSVM dual: the BCFW family, batch Frank-Wolfe and stochastic subgradient."""
