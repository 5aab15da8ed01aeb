"""``python -m durapipe`` is the ``durapipe`` command."""

import sys

from durapipe.cli import main

sys.exit(main())
