"""Run a callback when a module is imported, and stop doing so on request.

wrapt's post-import hooks cannot be taken back (a callback registered for a module that never
imports stays for the life of the process, one more per ``instrument()``). This finder does the
same job and can be removed: it sits first on ``sys.meta_path`` while some watched module is yet
to be imported, lets the other finders find it, and runs the callbacks right after the module's
code has run. The module keeps its own loader; nothing of ours stays attached to it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


class ImportWatch(importlib.abc.MetaPathFinder):
    """Calls each module's callbacks once it is imported (at once if it already is)."""

    def __init__(self, callbacks: Mapping[str, Sequence[Callback]]):
        self._waiting = {name: list(cbs) for name, cbs in callbacks.items() if cbs}
        self._lock = threading.Lock()
        self._finding = threading.local()  # names this thread is finding through the others

    def install(self) -> None:
        """Callbacks for modules already imported run now; the finder waits for the rest."""
        for name in list(self._waiting):
            module = sys.modules.get(name)
            if module is not None:
                self._loaded(name, module)
        with self._lock:
            if self._waiting and self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def remove(self) -> None:
        """No callback runs from now on; the finder leaves ``sys.meta_path``."""
        with self._lock:
            self._waiting.clear()
            if self in sys.meta_path:
                sys.meta_path.remove(self)

    @property
    def waiting(self) -> frozenset[str]:
        return frozenset(self._waiting)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self._waiting:
            return None
        finding = self._finding.__dict__.setdefault("names", set())
        if fullname in finding:
            return None
        finding.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            finding.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenNotify(spec.loader, self)
        return spec

    def _loaded(self, name: str, module: ModuleType) -> None:
        with self._lock:
            callbacks = self._waiting.pop(name, ())
            if not self._waiting and self in sys.meta_path:
                sys.meta_path.remove(self)
        for callback in callbacks:
            callback(module)


class _ThenNotify(importlib.abc.Loader):
    """The module's own loader, then the watch's callbacks; the module is given its own loader
    back before they run."""

    def __init__(self, loader: Any, watch: ImportWatch):
        self._loader, self._watch = loader, watch

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        self._watch._loaded(module.__name__, module)

    def __getattr__(self, name: str) -> Any:  # get_code, is_package, resource readers...
        return getattr(self._loader, name)
