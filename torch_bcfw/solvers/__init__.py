"""The solvers of the SSVM: the BCFW family (BCFW, MP-BCFW), batch Frank-Wolfe, stochastic subgradient, the 1-slack
cutting plane, online exponentiated gradient and dual extragradient (one table:
:data:`~torch_bcfw.solvers.run.ALGORITHMS`)."""
