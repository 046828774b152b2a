"""``python -m dflash2rt`` is the ``dflash2rt`` command."""

import sys

from .cli import main

sys.exit(main())
