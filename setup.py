"""Build hook: generate liftbridge_provider/_proto from proto/ before packaging, and compile the decoder.

Generation runs before ``setup()`` so that package discovery sees the
generated package in a clean checkout. The one compiled module, the Subscribe stream's
decoder into Arrow buffers (``liftbridge_provider/client/_wire_columns.c``,
plain C against Python's own headers), is built into every wheel and by
editable installs; it is optional: where no C compiler is found the package
installs without it and reads with its pure-Python twin
(``liftbridge_provider/client/columns.py`` chooses at import time).
Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

import runpy
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent

gen_proto = runpy.run_path(str(ROOT / "tools" / "gen_proto.py"))
gen_proto["generate"](gen_proto["DEFAULT_OUT"])

DECODER = Extension(
    "liftbridge_provider.client._wire_columns",
    sources=["liftbridge_provider/client/_wire_columns.c"],
    extra_compile_args=["-O2", "-std=c99"],
    optional=True,
)

setup(ext_modules=[DECODER])
