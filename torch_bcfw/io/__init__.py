"""Files: atomic saves and checked loads (:mod:`~torch_bcfw.io.serialization`), periodic checkpoints of a run
(:mod:`~torch_bcfw.io.checkpoint`), and a trained head exported as plain torch modules
(:mod:`~torch_bcfw.io.export`, which copies :mod:`~torch_bcfw.io.standalone_head` beside the weights)."""
