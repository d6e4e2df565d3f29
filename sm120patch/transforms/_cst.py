"""libcst, loaded on first use.

Loading the recipe catalogue imports the transform registry to validate each edit's
params; that needs no parser, and importing libcst costs ~0.15-0.2 s that `recipes`,
`rollback` and a warm `preflight` would pay for nothing. The transform modules take
`cst` from here: a module that executes on its first attribute access and is then the
plain libcst module (importlib's LazyLoader), so nothing is slower once it is loaded.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def _lazy(name: str) -> ModuleType:
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:  # pragma: no cover - libcst is a dependency
        raise ImportError(f"No module named {name!r}")
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


cst = _lazy("libcst")
