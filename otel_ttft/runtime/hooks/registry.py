"""Hooks as data: where to wrap (module:qualname), for which vLLM versions, and with what.

Targets are patched when vLLM imports their module (a post-import hook), so instrumenting costs
no import and names that vLLM imports elsewhere with ``from x import f`` see the wrapper. A target
that moved is skipped with one warning.

One failure rule for every hook, sync, async, async-generator or split (:func:`guard`): vLLM's
own exceptions pass through unchanged; the hook's first own exception is logged once, recorded as
``ttft.hook.error`` on the current span, and the hook is bypassed on every later call, hot paths
included. Hooks also stand aside while instrumentation is suppressed
(``opentelemetry.instrumentation.utils.suppress_instrumentation``).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import wrapt
from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_ttft.runtime.hooks.on_import import ImportWatch
from otel_ttft.semconv import ATTR_HOOK_ERROR

logger = logging.getLogger("otel_ttft")

WrapperFn = Callable[[Callable[..., Any], Any, tuple, dict], Any]


@dataclass(eq=False)
class Hook:
    """One wrapped vLLM call site.

    ``wrapper`` is a wrapt-style ``(call, instance, args, kwargs)`` function, ``async def`` for
    coroutine targets, or a :class:`Stream` subclass for async-generator targets; ``call`` runs
    vLLM's function (once). The registry applies the one failure rule to each kind alike. With
    ``state`` set, the wrapper takes that part of the process's state first:
    ``(part, call, instance, args, kwargs)``, and a stream ``open(part, instance, args, kwargs)``.
    """

    name: str  # stable id, used by OTEL_TTFT_DISABLED_HOOKS and doctor
    target: str  # "package.module:Class.method"
    wrapper: Any
    stage: str | None = None
    process: str = "any"  # where it fires: api_server | engine_core | worker | any
    # (an api_server hook is not installed in vLLM's spawned engine and worker processes)
    optional: bool = False  # absent on some builds (GPU-only modules): no warning when missing
    needs: str | None = None  # a ``config.Config`` flag that must be on for it to be applied
    state: str | None = None  # the state part (``runtime.state``) the wrapper is handed first
    failed: bool = field(default=False, compare=False)
    applied: bool = field(default=False, compare=False)

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":", 1)[1]


def report_failure(hook: Hook, exc: BaseException) -> None:
    """The failure rule: the hook's first own exception is logged once, marked on the current
    span (``ttft.hook.error``), and the hook stands aside from then on (``hook.failed``)."""
    if not hook.failed:
        hook.failed = True
        logger.warning("otel-ttft hook %s failed and is now disabled: %r", hook.name, exc,
                       exc_info=exc)
        span = trace.get_current_span()
        if span.is_recording():  # the trace shows where our numbers stop
            span.set_attribute(ATTR_HOOK_ERROR, f"{hook.name}: {exc!r}")


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


def _guard_sync(hook: Hook, fn: Callable[..., Any]) -> WrapperFn:

    def guarded(wrapped, instance, args, kwargs):
        if hook.failed or not is_instrumentation_enabled():
            return wrapped(*args, **kwargs)
        call = _Call(wrapped)
        try:
            return fn(call, instance, args, kwargs)
        except Exception as exc:
            if call.raised:
                raise  # vLLM's own error: propagate unchanged
            report_failure(hook, exc)
            return call.result if call.called else wrapped(*args, **kwargs)

    return guarded


def _guard_async(hook: Hook, fn: Callable[..., Any]) -> WrapperFn:

    async def guarded(wrapped, instance, args, kwargs):
        if hook.failed or not is_instrumentation_enabled():
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
            if call.called:  # ours failed while vLLM's coroutine ran: it was cancelled under us
                raise
            return await wrapped(*args, **kwargs)

    return guarded


FINISHED, ABORTED, FAILED = "finished", "aborted", "failed"


class Stream:
    """Observes one call of an async-generator function (``AsyncLLM.generate``) from the
    registry's one pass-through, which applies the failure rule around every method.

    ``open`` decides per call (``None``: vLLM's generator is returned untouched, no pass-through);
    ``enter``/``leave`` bracket the wait for the first item (to set a context variable the
    producer reads); ``first`` sees the first item before it is handed on, ``item`` every later
    one, but only while ``each_item`` is true (a streamed output is the hottest path there is);
    ``close`` gets how the stream ended: ``FINISHED`` (exhausted), ``ABORTED`` (closed or
    cancelled by the consumer) or ``FAILED`` (vLLM raised ``error``), and the last item handed
    on (``None`` if none was).
    """

    __slots__ = ()
    each_item = True

    @classmethod
    def open(cls, instance: Any, args: tuple, kwargs: dict) -> Stream | None:
        return cls()

    def enter(self) -> Any:
        return None

    def leave(self, token: Any) -> None:
        pass

    def first(self, item: Any) -> None:
        self.item(item)

    def item(self, item: Any) -> None:
        pass

    def close(self, outcome: str, error: BaseException | None, last: Any) -> None:
        pass


def _guard_stream(hook: Hook, open_: Callable[..., Stream | None]) -> WrapperFn:

    def guarded(wrapped, instance, args, kwargs):
        inner = wrapped(*args, **kwargs)
        if hook.failed or not is_instrumentation_enabled():
            return inner
        try:
            observer = open_(instance, args, kwargs)
        except Exception as exc:
            report_failure(hook, exc)
            return inner
        return inner if observer is None else _pass_through(hook, inner, observer)

    return guarded


async def _pass_through(hook: Hook, inner: Any, obs: Stream) -> AsyncIterator[Any]:
    """vLLM's generator, item for item; the observer's failure never reaches vLLM or the
    consumer, and turns every observer of this hook off."""
    outcome: str = FINISHED
    error: BaseException | None = None
    last = None
    try:
        token = None
        try:
            token = obs.enter()
        except Exception as exc:
            report_failure(hook, exc)
        try:
            item = await inner.__anext__()
        finally:
            if not hook.failed:
                try:
                    obs.leave(token)
                except Exception as exc:
                    report_failure(hook, exc)
        if not hook.failed:
            try:
                obs.first(item)
            except Exception as exc:
                report_failure(hook, exc)
        if obs.each_item:
            while True:
                last = item
                yield item
                item = await inner.__anext__()
                if not hook.failed:
                    try:
                        obs.item(item)
                    except Exception as exc:
                        report_failure(hook, exc)
        else:  # nothing per item but the hand-over itself
            while True:
                last = item
                yield item
                item = await inner.__anext__()
    except StopAsyncIteration:
        return
    except (GeneratorExit, asyncio.CancelledError) as exc:
        outcome, error = ABORTED, exc
        raise
    except BaseException as exc:
        outcome, error = FAILED, exc
        raise
    finally:
        try:
            await inner.aclose()
        finally:
            if not hook.failed:
                try:
                    obs.close(outcome, error, last)
                except Exception as exc:
                    report_failure(hook, exc)


def guard(hook: Hook, part: Any = None) -> WrapperFn:
    """The wrapt wrapper that applies the failure rule (and suppression) to ``hook``, with
    ``part`` (its state) bound first where the hook names one."""
    bind = (lambda fn: functools.partial(fn, part)) if hook.state is not None else (lambda fn: fn)
    if isinstance(hook.wrapper, type) and issubclass(hook.wrapper, Stream):
        return _guard_stream(hook, bind(hook.wrapper.open))
    if inspect.iscoroutinefunction(hook.wrapper):
        return _guard_async(hook, bind(hook.wrapper))
    return _guard_sync(hook, bind(hook.wrapper))


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


def spawned_child() -> bool:
    """This process was started by ``multiprocessing``'s spawn (vLLM's EngineCore and workers):
    it is not the API server. Read from the command line, which is set before any plugin runs
    (``multiprocessing`` names the process only later)."""
    import sys

    return "--multiprocessing-fork" in sys.argv


class HookSet:
    """Applies hooks as their modules are imported (``on_import.ImportWatch``), and undoes
    them on uninstrument: every wrapper taken off, the watch for modules never imported gone.

    ``state`` (a ``runtime.state.ProcessState``) gives each hook that names a part its part; a
    set made without one (tests, ``scripts/gpu_check_bare.py``) makes its own from the default
    config, and closes it on ``remove``."""

    def __init__(self, hooks: list[Hook], state: Any = None):
        self.hooks = hooks
        self.state = state
        self._own_state = False
        self._watch: ImportWatch | None = None
        self.active = False

    def _part(self, hook: Hook) -> Any:
        if hook.state is None:
            return None
        if self.state is None:
            from otel_ttft.runtime.config import Config
            from otel_ttft.runtime.hooks import all_parts
            from otel_ttft.runtime.state import ProcessState

            self.state, self._own_state = ProcessState(Config(), all_parts()), True
        return self.state.part(hook.state)

    def apply(self, disabled: set[str] = frozenset()) -> None:
        self.active = True
        child = spawned_child()
        by_module: dict[str, list[Callable[[Any], None]]] = {}
        for hook in self.hooks:
            if hook.name in disabled or (child and hook.process == "api_server"):
                continue
            by_module.setdefault(hook.module, []).append(self._patcher(hook))
        self._watch = ImportWatch(by_module)
        self._watch.install()

    def apply_to(self, module: Any) -> None:
        """Patch every hook into ``module`` now, whatever its name: a stand-in with vLLM's names
        where vLLM cannot run (``scripts/gpu_check_bare.py`` on a GPU image without vLLM), so the
        wrappers measured there are these, applied by this code."""
        self.active = True
        for hook in self.hooks:
            self._patcher(hook)(module)

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
            try:
                wrapt.wrap_function_wrapper(parent, attr, guard(hook, self._part(hook)))
                hook.applied = True
            except Exception as exc:  # noqa: BLE001
                report_failure(hook, exc)

        return patch

    def remove(self, module: Any = None) -> None:
        """Undo every wrapper (in ``module`` when given, as ``apply_to``); hooks for modules not
        imported yet are no longer waited for."""
        self.active = False
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
        import sys

        given = module
        for hook in self.hooks:
            if not hook.applied:
                continue
            module = given if given is not None else sys.modules.get(hook.module)
            parent, attr = module, hook.qualname
            if "." in attr:
                owner, attr = attr.rsplit(".", 1)
                for part in owner.split("."):
                    parent = getattr(parent, part, None)
            current = vars(parent).get(attr) if parent is not None else None
            if isinstance(current, wrapt.FunctionWrapper):  # the descriptor as it was, a
                setattr(parent, attr, current.__wrapped__)  # ``staticmethod`` included
            hook.applied = False
        if self._own_state and self.state is not None:
            self.state.close()
            self.state, self._own_state = None, False
