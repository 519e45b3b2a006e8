"""Build hook: generate liftbridge_provider/_proto from proto/ before packaging.

Generation runs before setup() so that package discovery sees the generated
package in a clean checkout. Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

import runpy
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent

gen_proto = runpy.run_path(str(ROOT / "tools" / "gen_proto.py"))
gen_proto["generate"](gen_proto["DEFAULT_OUT"])

setup()
