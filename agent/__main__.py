"""``python -m agent``: the same entry point as the zipapp."""

import sys

from agent.cli import main

sys.exit(main())
