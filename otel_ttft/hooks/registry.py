"""Hooks as data: where to wrap (module:qualname), for which vLLM versions, and with what.

Targets are patched when vLLM imports their module (a post-import hook), so instrumenting costs
no import and names that vLLM imports elsewhere with ``from x import f`` see the wrapper. A target
that moved is skipped with one warning; a wrapper that fails is logged once and then stands aside
so vLLM runs unchanged.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import wrapt
from opentelemetry import trace
from opentelemetry.instrumentation.utils import unwrap

from otel_ttft.semconv import ATTR_HOOK_ERROR

logger = logging.getLogger("otel_ttft")

WrapperFn = Callable[[Callable[..., Any], Any, tuple, dict], Any]


@dataclass(eq=False)
class Hook:
    """One wrapped vLLM call site."""

    name: str  # stable id, used by OTEL_TTFT_DISABLED_HOOKS and doctor
    target: str  # "package.module:Class.method"
    wrapper: WrapperFn
    stage: str | None = None
    process: str = "any"  # where it fires: api_server | engine_core | worker | any
    guarded: bool = True  # False for hot-path wrappers that guard themselves cheaply
    optional: bool = False  # absent on some builds (GPU-only modules): no warning when missing
    failed: bool = field(default=False, compare=False)
    applied: bool = field(default=False, compare=False)

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":", 1)[1]


class _Call:
    """Calls the wrapped function once and remembers whether it ran or raised."""

    __slots__ = ("wrapped", "called", "raised", "result")

    def __init__(self, wrapped: Callable[..., Any]):
        self.wrapped, self.called, self.raised, self.result = wrapped, False, False, None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.called = True
        try:
            self.result = self.wrapped(*args, **kwargs)
        except BaseException:
            self.raised = True
            raise
        return self.result


def report_failure(hook: Hook, exc: BaseException) -> None:
    """Log a hook's own failure once and switch the hook off."""
    if not hook.failed:
        hook.failed = True
        logger.warning("otel-ttft hook %s failed and is now disabled: %r", hook.name, exc,
                       exc_info=exc)
        span = trace.get_current_span()
        if span.is_recording():  # the trace shows where our numbers stop
            span.set_attribute(ATTR_HOOK_ERROR, f"{hook.name}: {exc!r}")


def _guard(hook: Hook) -> WrapperFn:
    def guarded(wrapped, instance, args, kwargs):
        if hook.failed:
            return wrapped(*args, **kwargs)
        call = _Call(wrapped)
        try:
            return hook.wrapper(call, instance, args, kwargs)
        except Exception as exc:
            if call.raised:
                raise  # vLLM's own error: propagate unchanged
            report_failure(hook, exc)
            return call.result if call.called else wrapped(*args, **kwargs)

    return guarded


class _AsyncCall(_Call):
    __slots__ = ("done",)

    def __init__(self, wrapped: Callable[..., Any]):
        super().__init__(wrapped)
        self.done = False

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.called = True
        try:
            self.result = await self.wrapped(*args, **kwargs)
        except BaseException:
            self.raised = True
            raise
        self.done = True
        return self.result


def guard_async(hook_name: str) -> Callable[[WrapperFn], WrapperFn]:
    """The same promise for coroutine functions: our failure never becomes vLLM's."""

    def decorate(fn):
        hook = Hook(hook_name, ":", fn)

        async def wrapper(wrapped, instance, args, kwargs):
            if hook.failed:
                return await wrapped(*args, **kwargs)
            call = _AsyncCall(wrapped)
            try:
                return await fn(call, instance, args, kwargs)
            except Exception as exc:
                if call.raised:
                    raise
                report_failure(hook, exc)
                if call.done:
                    return call.result
                return await wrapped(*args, **kwargs)

        return wrapper

    return decorate


def resolve(hook: Hook) -> tuple[bool, str]:
    """Import the target and say whether it is there (for doctor; imports the module)."""
    try:
        obj: Any = importlib.import_module(hook.module)
    except Exception as exc:  # noqa: BLE001 - any import failure means "not here"
        return False, f"module {hook.module} not importable: {exc.__class__.__name__}: {exc}"
    *owners, attr = hook.qualname.split(".")
    for part in owners:
        obj = getattr(obj, part, None)
        if obj is None:
            return False, f"{hook.module} has no {'.'.join(owners)}"
    if attr not in getattr(obj, "__dict__", {}):
        return False, f"{hook.module} defines no {hook.qualname} (moved or inherited)"
    obj = getattr(obj, attr)
    if not callable(obj):
        return False, f"{hook.target} is not callable"
    return True, "ok"


class HookSet:
    """Applies hooks lazily on import, and undoes them on uninstrument."""

    def __init__(self, hooks: list[Hook]):
        self.hooks = hooks
        self.active = False

    def apply(self, disabled: set[str] = frozenset()) -> None:
        self.active = True
        for hook in self.hooks:
            if hook.name in disabled:
                continue
            wrapt.register_post_import_hook(self._patcher(hook), hook.module)

    def _patcher(self, hook: Hook) -> Callable[[Any], None]:
        def patch(module: Any) -> None:
            if not self.active or hook.applied:
                return
            parent, attr = module, hook.qualname
            if "." in attr:
                owner, attr = attr.rsplit(".", 1)
                for part in owner.split("."):
                    parent = getattr(parent, part, None)
            if parent is None or attr not in getattr(parent, "__dict__", {}):
                if not hook.optional:
                    logger.warning("otel-ttft: %s not found in this vLLM; hook %s skipped",
                                   hook.target, hook.name)
                return
            wrapper = _guard(hook) if hook.guarded else hook.wrapper
            try:
                wrapt.wrap_function_wrapper(parent, attr, wrapper)
                hook.applied = True
            except Exception as exc:  # noqa: BLE001
                report_failure(hook, exc)

        return patch

    def remove(self) -> None:
        """Undo every wrapper; hooks for modules not imported yet become no-ops."""
        self.active = False
        import sys

        for hook in self.hooks:
            if not hook.applied:
                continue
            module = sys.modules.get(hook.module)
            parent, attr = module, hook.qualname
            if "." in attr:
                owner, attr = attr.rsplit(".", 1)
                for part in owner.split("."):
                    parent = getattr(parent, part, None)
            if parent is not None:
                unwrap(parent, attr)
            hook.applied = False
