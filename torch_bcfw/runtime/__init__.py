"""What a run needs from its process: signal handling (:mod:`~torch_bcfw.runtime.signals`), thread counts
(:mod:`~torch_bcfw.runtime.threads`), numba's kernel cache and the one-off compilation
(:mod:`~torch_bcfw.runtime.kernel_cache`, :mod:`~torch_bcfw.runtime.compilation`) and the progress bar of feature
building (:mod:`~torch_bcfw.runtime.progress`)."""
