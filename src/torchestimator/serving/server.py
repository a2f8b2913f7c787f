"""Starting a server: which models (flags or a model config file), polling, blocking or in a thread.

    serve("digits", "export/digits")                       # blocking, like tensorflow_model_server
    with start("digits", "export/digits", port=0) as server:
        Client(server.url, "digits").predict(...)          # embedded: a background thread
    serve("digits", "export/digits", grpc_port=8500)       # TF Serving's gRPC API too (grpc_server.py)

Both poll every model's base path for new versions (file_system_poll_wait_seconds)
and, with ``model_config_file_poll_wait_seconds`` > 0, re-read the model config
file: models added are loaded, models removed are no longer served, policies and
labels of the others change in place. The REST handling is app.py's, the gRPC API grpc_server.py's (started
on the same event loop, over the same request core, and stopped before it); ServerSettings is settings.py's
(importable without aiohttp).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from torchestimator._extras import import_extra
from torchestimator._io.filesystems import is_url
from torchestimator.export.versions import list_versions

import_extra("aiohttp.web", extra="serving", feature="the model server")  # one line if it is missing
from aiohttp import web

from torchestimator.serving.app import make_app, managers_of, request_core_of
from torchestimator.serving.config import ModelConfig, read_model_config_file
from torchestimator.serving.errors import ServingError
from torchestimator.serving.event_loop import loop_factory, loop_name
from torchestimator.serving.heap import FrozenHeap
from torchestimator.serving.manager import ModelManager
from torchestimator.serving.protocol import ServingRunner
from torchestimator.serving.settings import (  # the latter re-exported: it lived here
    DEFAULT_MAX_BODY_BYTES,
    ServerSettings,
)

__all__ = ["RunningServer", "ServerSettings", "build_app", "grpc_port_of", "serve", "start"]

logger = logging.getLogger(__name__)

# Set only by serve(): the process is the server's, so its heap may be frozen (heap.py).
_HEAP = web.AppKey("frozen_heap", FrozenHeap)
_MAX_MESSAGE = web.AppKey("grpc_max_message_bytes", int)


@dataclasses.dataclass
class _GrpcSlot:
    """Hung on the app before it starts (aiohttp warns when a started app's keys change); filled by _start_grpc."""

    port: int | None = None


_GRPC = web.AppKey("grpc", _GrpcSlot)


def grpc_port_of(app: web.Application) -> int | None:
    """The port the app's gRPC API listens on (the one bound when asked for 0), or None when it has none."""
    slot = app.get(_GRPC)
    return None if slot is None else slot.port


def build_app(settings: ServerSettings, *, refuse_missing_base_paths: bool = False) -> web.Application:
    """The application with its models polled once, labels applied, and polling tasks attached.

    Every base path is checked before any model loads (``_check_base_path``): a model_dir (or a folder of export
    bases) with no version folder of its own is refused, naming the exports in it; a missing one too with ``refuse_missing_base_paths`` (serve()'s
    choice), else it is waited for, as an existing empty one always is (TF Serving's polling).
    """
    configs = _model_configs(settings)
    for config in configs:
        _check_base_path(config.name, config.base_path, refuse_missing=refuse_missing_base_paths)
    managers = [_start_model(config, settings) for config in configs]
    app = make_app(
        managers,
        max_body_bytes=settings.max_body_bytes,
        num_threads=settings.num_threads,
        batching=settings.batching,
        metrics_path=settings.metrics_path,
        timeout_seconds=settings.timeout_seconds,
        inline_forward_micros=settings.inline_forward_micros,
    )
    app.cleanup_ctx.append(_background_polling(settings))
    app[_MAX_MESSAGE] = settings.max_body_bytes
    app[_GRPC] = _GrpcSlot()
    return app


def serve(
    model_name: str | None = None,
    model_base_path: str | os.PathLike[str] | None = None,
    host: str = "127.0.0.1",
    port: int = 8501,
    *,
    on_listening: Callable[[web.Application, int], None] | None = None,
    grpc_port: int | None = None,
    **settings: Any,
) -> None:
    """Serves until interrupted (blocking). Keywords are ServerSettings' fields.

    ``grpc_port`` also serves TF Serving's gRPC API on ``host`` (0: a free port, see ``grpc_port_of``; None: none).

    ``on_listening(app, port)`` is called once the port accepts connections, with the models loaded (build_app
    polls every model first), so whatever it announces (the CLI's "serving ..." line) is true when said;
    ``port`` is the one bound (``port=0`` asks the system for a free one).

    A base path that does not exist is a ConfigError here, before anything listens: a script waiting for the
    port (``until curl ...``) would otherwise wait on a typo for good. start() waits for it to appear.
    """
    make_loop = loop_factory()  # a bad TORCHESTIMATOR_SERVING_LOOP is refused before any model loads
    app = build_app(
        ServerSettings(model_name=model_name, model_base_path=model_base_path, **settings),
        refuse_missing_base_paths=True,
    )
    app[_HEAP] = FrozenHeap()
    _settle_heap(app)  # the first models loaded: frozen before the first request
    try:
        _run(_serve_forever(app, host, port, on_listening, grpc_port), make_loop)  # uvloop if installed
    except KeyboardInterrupt:  # a Ctrl-C before the loop's own handler was installed
        pass
    logger.info("Stopped serving")


def _run(main: Coroutine[Any, Any, None], make_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    """``main`` to its end on a loop from ``make_loop``, then the loop's leftovers cancelled and the loop closed:
    asyncio.Runner's job, which Python 3.10 (still supported) lacks."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=make_loop) as runner:
            runner.run(main)
    else:
        _run_on_own_loop(main, make_loop)


def _run_on_own_loop(main: Coroutine[Any, Any, None], make_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    """What asyncio.Runner does, for Python 3.10."""
    loop = make_loop()
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


async def _serve_forever(
    app: web.Application,
    host: str,
    port: int,
    on_listening: Callable[[web.Application, int], None] | None,
    grpc_port: int | None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serves until SIGTERM/SIGINT (or ``stop`` is set), then shuts down in order: calls in flight are answered.

    Why not aiohttp's handle_signals: its handler raises GracefulExit out of the loop, and asyncio.Runner then
    cancels every task at once, so gRPC calls and REST requests still running (a batch waiting out its
    timeout) were cancelled instead of answered, and grpcio logged each as an unhandled CancelledError.
    """
    stop = asyncio.Event() if stop is None else stop
    _stop_on_signals(stop)
    # web.run_app's steps, with the runner that answers protocol errors in JSON (protocol.py).
    runner = ServingRunner(app, handle_signals=False, access_log=None)  # as TF: no line per request
    await runner.setup()
    grpc_server = None
    try:
        # gRPC first: once the REST port answers (what scripts wait for), both APIs do.
        grpc_server = await _start_grpc(app, host, grpc_port)
        await web.TCPSite(runner, host, port).start()
        port = bound_port(runner)
        logger.info(
            "Serving %s at http://%s:%d/v1/models/ (event loop: %s)", sorted(managers_of(app)), host, port, loop_name()
        )
        if on_listening is not None:
            on_listening(app, port)
        await stop.wait()
    finally:
        if grpc_server is not None:  # before the core's threads stop: calls in flight finish first
            await grpc_server.stop()
        await runner.cleanup()


def _stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop``, where the loop can take signals (the main thread, not Windows)."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # no signals here: stop is set by its owner
            return


async def _start_grpc(app: web.Application, host: str, grpc_port: int | None) -> Any:
    if grpc_port is None:
        return None
    from torchestimator.serving.grpc_server import GrpcServer  # grpcio is imported only when asked for

    grpc_server = GrpcServer(
        request_core_of(app), host, grpc_port, max_message_bytes=app.get(_MAX_MESSAGE, DEFAULT_MAX_BODY_BYTES)
    )
    app[_GRPC].port = await grpc_server.start()
    return grpc_server


class RunningServer:
    """A server in a background thread; ``url`` is where it answers. ``stop()`` (or leaving ``with``) ends it."""

    def __init__(self, app: web.Application, host: str, port: int, *, grpc_port: int | None = None) -> None:
        self._app = app
        self._grpc_port = grpc_port
        if _GRPC not in app:  # an app of make_app's: the slot goes on before it starts
            app[_GRPC] = _GrpcSlot()
        self._grpc_server: Any = None
        self._loop = loop_factory()()
        self._runner = ServingRunner(app, handle_signals=False, access_log=None)
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(host, port), name="torchestimator-server", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error
        self.host, self.port = host, bound_port(self._runner)

    @property
    def grpc_port(self) -> int | None:
        """Where the gRPC API listens, or None without one."""
        return grpc_port_of(self._app)

    @property
    def grpc_target(self) -> str | None:
        """``host:port`` for ``grpc.insecure_channel``, or None without a gRPC API."""
        port = self.grpc_port
        return None if port is None else f"{self.host}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def managers(self) -> dict[str, ModelManager]:
        return managers_of(self._app)

    def stop(self) -> None:
        if self._thread.is_alive():
            if self._grpc_server is not None:
                asyncio.run_coroutine_threadsafe(self._grpc_server.stop(), self._loop).result(timeout=30)
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _run(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._runner.setup())
            self._grpc_server = self._loop.run_until_complete(_start_grpc(self._app, host, self._grpc_port))
            self._loop.run_until_complete(web.TCPSite(self._runner, host, port).start())
        except BaseException as error:  # e.g. the port is taken: raised in the caller's thread
            self._error = error
            if self._grpc_server is not None:  # gRPC listened, REST's port was refused: let it go
                self._loop.run_until_complete(self._grpc_server.stop(0))
            try:  # what setup made is let go
                self._loop.run_until_complete(self._runner.cleanup())
            except Exception:  # nothing was set up: nothing to let go
                pass
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.close()


def bound_port(runner: web.BaseRunner) -> int:
    """The port a started runner listens on (the one the system chose when asked for port 0)."""
    for site in runner.sites:
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            return server.sockets[0].getsockname()[1]
    raise RuntimeError("The server started but has no listening socket.")


def start(
    model_name: str | None = None,
    model_base_path: str | os.PathLike[str] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    grpc_port: int | None = None,
    **settings: Any,
) -> RunningServer:
    """Starts serving in a background thread and returns once it listens (port 0: any free port).

    ``grpc_port`` also serves TF Serving's gRPC API (0: a free port, ``server.grpc_target``; None: none). A base
    path that does not exist yet is waited for (the caller may export there next); a model_dir is refused.
    """
    loop_factory()  # a bad TORCHESTIMATOR_SERVING_LOOP is refused before any model loads
    app = build_app(ServerSettings(model_name=model_name, model_base_path=model_base_path, **settings))
    return RunningServer(app, host, port, grpc_port=grpc_port)


def _model_configs(settings: ServerSettings) -> list[ModelConfig]:
    if settings.model_config_file is not None:
        return read_model_config_file(settings.model_config_file)
    assert settings.model_name is not None and settings.model_base_path is not None
    return [ModelConfig(name=settings.model_name, base_path=os.fspath(settings.model_base_path))]


def _start_model(config: ModelConfig, settings: ServerSettings) -> ModelManager:
    """A manager for one model, polled once; its labels are applied after that poll, as TF applies them."""
    manager = ModelManager(
        config.name, config.base_path, version_policy=config.version_policy, model_warmup=settings.enable_model_warmup
    )
    manager.poll()
    if not manager.served_versions:
        _say_why_nothing_serves(manager, settings.file_system_poll_wait_seconds)
    if config.version_labels:
        manager.set_version_labels(
            config.version_labels, allow_unavailable=settings.allow_version_labels_for_unavailable_models
        )
    return manager


def _say_why_nothing_serves(manager: ModelManager, poll_seconds: float) -> None:
    """The start-up log line of a model with no version served: no folder, no version folder, or the loads that
    failed; and whether polling will find one later."""
    name, base_path = manager.name, manager.base_path
    try:
        tried = [f"{status.version}: {status.error_message or status.state}" for status in manager.statuses()]
    except ServingError:  # no version folder at all yet
        tried = []
    if tried:
        why = f"no version could be loaded from {base_path} yet (versions tried: {tried})"
    elif not is_url(base_path) and not os.path.isdir(base_path):
        why = f"base path {base_path} does not exist yet"
    else:
        why = f"{base_path} holds no integer version folders yet (an export writes {base_path}/<version>/)"
    if poll_seconds > 0:
        logger.warning("%s: %s; waiting for a version, looking every %g s", name, why, poll_seconds)
    else:
        logger.warning(
            "%s: %s, and file_system_poll_wait_seconds is 0 (look only at start): it serves nothing", name, why
        )


def _check_base_path(name: str, base_path: str, *, refuse_missing: bool = False) -> None:
    """Refuses (ConfigError) a base path no export could be meant by, naming what to serve instead.

    A folder without integer version folders is refused when it is a model_dir (ckpt-* folders, its checkpoint
    manifest or an export/ folder), naming the export folders in it, or when folders in it hold versions (an
    export/ given for export/<name>); a missing path, with ``refuse_missing``. Any other existing folder without
    versions is left to polling, as TF Serving waits for its first version. Object-store URLs are not checked: a
    prefix exists once something is uploaded under it.
    """
    from torchestimator.errors import ConfigError

    if is_url(base_path):
        return
    if not os.path.exists(base_path):
        if refuse_missing:
            raise ConfigError(
                f"model {name!r}: base path {base_path} does not exist (relative to {os.getcwd()}). Give the "
                "folder of integer version folders an export writes (<model_dir>/export/<exporter name> after "
                "train-and-evaluate, or export's --export_dir), or create the folder to serve what is exported "
                "there later.",
                field="model_base_path",
                value=base_path,
            )
        return
    if list_versions(base_path):
        return
    if _is_model_dir(base_path):
        what = "a model_dir (checkpoints), not an export base"
        exports = _holding_versions(os.path.join(base_path, "export"))
    else:
        what = "a folder of export bases"
        exports = _holding_versions(base_path)
        if not exports:
            return  # an export base before its first export: polled, as TF Serving does
    if exports:
        listed = ", ".join(
            f"{path} (version{'s' if len(versions) > 1 else ''} {', '.join(map(str, versions))})"
            for path, versions in exports
        )
        instead = f"Serve one of the export folders in it: {listed}."
    else:
        export = os.path.join(base_path, "export")
        instead = (
            f"It has no export yet: export it (torchestimator export FILE.py --model_dir {base_path} --export_dir "
            f"{os.path.join(export, '<name>')}; an exporter of train-and-evaluate writes "
            f"{os.path.join(export, '<exporter name>')}) and serve that folder."
        )
    raise ConfigError(
        f"model {name!r}: base path {base_path} is {what}: it holds no integer version folder to serve. {instead}",
        field="model_base_path",
        value=base_path,
    )


def _is_model_dir(path: str) -> bool:
    """ckpt-<step> folders, the checkpoint manifest or an export/ folder: what a model_dir holds."""
    from torchestimator.checkpoint.storage import MANIFEST_NAME

    try:
        entries = os.listdir(path)
    except OSError:  # not a folder, or unreadable: the manager's poll says what it finds
        return False
    return any(
        entry in (MANIFEST_NAME, "export") or (entry.startswith("ckpt-") and entry[5:].isdigit()) for entry in entries
    )


def _holding_versions(folder: str) -> list[tuple[str, list[int]]]:
    """(path, its versions) for ``folder`` and each folder in it, those that hold integer version folders."""
    try:
        inside = [os.path.join(folder, entry) for entry in sorted(os.listdir(folder))]
    except OSError:  # missing, or not a folder
        return []
    found = [(path, list_versions(path)) for path in [folder, *inside] if os.path.isdir(path)]
    return [(path, versions) for path, versions in found if versions]


def _background_polling(settings: ServerSettings) -> Any:
    async def polling(app: web.Application) -> AsyncIterator[None]:
        tasks = []
        if settings.file_system_poll_wait_seconds > 0:
            tasks.append(asyncio.create_task(_poll_versions(app, settings.file_system_poll_wait_seconds)))
        if settings.model_config_file is not None and settings.model_config_file_poll_wait_seconds > 0:
            tasks.append(asyncio.create_task(_poll_model_config(app, settings.model_config_file, settings)))
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    return polling


async def _poll_versions(app: web.Application, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(seconds)
        for manager in list(managers_of(app).values()):
            try:
                await loop.run_in_executor(None, manager.poll)
            except Exception:  # a broken file system must not stop polling for good
                logger.exception("%s: polling %s failed", manager.name, manager.base_path)
        await loop.run_in_executor(None, _settle_heap, app)


async def _poll_model_config(
    app: web.Application, config_file: str | os.PathLike[str], settings: ServerSettings
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(settings.model_config_file_poll_wait_seconds)
        try:
            configs = await loop.run_in_executor(None, read_model_config_file, config_file)
        except (OSError, ValueError) as error:  # keep serving the last good configuration
            logger.error("Keeping the current models: the model config file could not be read: %s", error)
            continue
        await loop.run_in_executor(None, _apply_model_configs, managers_of(app), configs, settings)
        await loop.run_in_executor(None, _settle_heap, app)


def _settle_heap(app: web.Application) -> None:
    """Freezes newly loaded models and collects unloaded ones, when this process's heap is ours (serve())."""
    heap = app.get(_HEAP)
    if heap is not None:
        heap.settle(
            (manager.name, model) for manager in list(managers_of(app).values()) for model in manager.served_models()
        )


def _apply_model_configs(
    managers: dict[str, ModelManager], configs: list[ModelConfig], settings: ServerSettings
) -> None:
    """Adds, removes and updates models in place; a model that fails to update keeps its current versions."""
    wanted = {config.name: config for config in configs}
    for name in [name for name in managers if name not in wanted]:
        logger.info("%s: no longer in the model config file; unloaded", name)
        managers.pop(name)
    for name, config in wanted.items():
        try:
            if name in managers:
                managers[name].apply_config(
                    config, allow_unavailable_labels=settings.allow_version_labels_for_unavailable_models
                )
            else:
                _check_base_path(name, config.base_path)  # a model_dir named by the edit: logged, not served
                managers[name] = _start_model(config, settings)
                logger.info("%s: added from the model config file", name)
        except (OSError, ValueError) as error:
            logger.error("%s: the new configuration was not applied: %s", name, error)
