"""`python tests/cli.py ARGS` runs `python evalharness.py ARGS` by importing the module: its bytecode is then cached
(__pycache__) and reused by every later process, where a script given by path is compiled anew each time (about
0.3 s of CPU a process, and a suite starts hundreds). sys.argv[0] stays evalharness.py's path, the program's own
idea of where it is (slurm submit's default --program, messages that name it)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.argv[0] = os.path.join(ROOT, "evalharness.py")
import evalharness  # noqa: E402

sys.exit(evalharness.main())
