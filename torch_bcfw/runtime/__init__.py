"""What a run needs from its process: signal handling (:mod:`~torch_bcfw.runtime.signals`, and
:mod:`~torch_bcfw.runtime.launch` while the command loads), thread counts (:mod:`~torch_bcfw.runtime.threads`),
numba's kernel cache (:mod:`~torch_bcfw.runtime.kernel_cache`) and the progress bar of feature building
(:mod:`~torch_bcfw.runtime.progress`)."""
