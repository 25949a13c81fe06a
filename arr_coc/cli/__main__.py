"""``python -m arr_coc.cli``: the ``arr-coc`` command (torchrun ``-m arr_coc.cli`` too)."""
import sys

from arr_coc.cli import main

sys.exit(main())
