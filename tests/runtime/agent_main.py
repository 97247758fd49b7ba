"""TEST ONLY: ``python tests/runtime/agent_main.py ARGS`` is ``agent ARGS`` with the test handlers
of tests/runtime/agent_test_handlers.py registered first, so that `agent run` and `agent exec`
serve real kind names with them (the handler table prefers classes registered before it is
made). This entry point lives in tests/ alone: the product (and its zipapp, which build/zipapp.py
checks) has no way to load code named by its environment or its arguments.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE)]

import agent_test_handlers  # noqa: E402,F401  (registers the test handlers)

from agent.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
