"""``python -m agent.gateway``: see agent/gateway/cli.py."""

import sys

from agent.gateway.cli import main

sys.exit(main())
