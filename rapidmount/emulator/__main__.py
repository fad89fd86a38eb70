"""``python -m rapidmount.emulator``: the same as ``rapidmount-emulator``."""

import sys

from .cli import main

sys.exit(main())
