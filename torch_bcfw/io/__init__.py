"""Files, with no knowledge of models: nested tensors and plain values in one safetensors file
(:mod:`~torch_bcfw.io.tree_file`), atomic writes (:mod:`~torch_bcfw.io.serialization`), pickles of ``torch.save`` read
once under checks for conversion (:mod:`~torch_bcfw.io.pickle_stream`), one run per output folder
(:mod:`~torch_bcfw.io.output_lock`), and the decoder copied beside an exported head
(:mod:`~torch_bcfw.io.standalone_head`)."""
