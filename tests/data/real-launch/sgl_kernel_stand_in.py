"""A stand-in for sgl_kernel (1.2 GB, not carried): no kernels. Every name is a function that
raises when called, and every submodule is one such module, so SGLang's imports pass and any
use of a kernel fails loudly. Only for walking the launch as far as argument handling."""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.4.5"


def _missing(name):
    def f(*a, **k):
        raise RuntimeError(f"sgl_kernel stand-in: {name} is not available")

    f.__name__ = name
    return f


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)


class _Mod(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "sgl_kernel.scalar_type":  # SGLang has its own fallback for this one
            return None
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Mod(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
