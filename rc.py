#!/usr/bin/env python3
"""Run rc from a checkout: `python rc.py worker ...` does what `python rc.pyz worker ...` does.

A launcher, never imported (its name would shadow the package otherwise).
"""

import os
import sys

if __name__ != "__main__":
    raise ImportError("rc.py is a launcher; import the rc package instead")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rc.__main__ import main

sys.exit(main())
