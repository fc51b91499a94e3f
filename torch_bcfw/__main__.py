"""``python -m torch_bcfw`` = the ``torch-bcfw`` command."""
import sys

from .cli import main

sys.exit(main())
