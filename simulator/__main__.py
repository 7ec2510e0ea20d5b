"""Run the simulator: `python -m simulator --help`."""

import sys

from simulator.cli import main

sys.exit(main())
