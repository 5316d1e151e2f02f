"""``python -m torchloom``: the ``torchloom`` command line."""

import sys

from torchloom.cli import main

sys.exit(main())
