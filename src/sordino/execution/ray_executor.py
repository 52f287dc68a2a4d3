"""The Ray executor: model instances as Ray actors across the nodes of a Ray cluster.

``executor.kind: ray`` (``sordino start --executor ray --ray-address auto``). The
server keeps the protocol, admission, scheduling and batching; an assembled batch goes
to an actor (``execution/ray_instance.py``) as one object in Ray's object store. This
is :class:`~sordino.execution.chain.ChainExecutor` with Ray actors for instances, so
what the chain does for worker processes it does here: a batch whose actor is lost
(its process or its node died, it hung, it overran ``workers.execution_timeout``) is
retried at once on another actor; the lost actor is replaced with backoff, Ray
placing the new one on a live node; device chains and breakers, chaos faults, the
guardian's ``scale`` (more actors on the cluster) and the statistics, with each
instance's node, work unchanged. The server's shared-memory arena is not used:
batches travel through the object store. With ``executor.node_pool`` (the default)
each node that runs an actor gets its own pool, managed like the arena
(``execution/ray_pool.py``): the memory strategy, per-node tenant quotas and
overflow waits apply there, and its figures are reported per node
(:meth:`RayExecutor.node_memory`).

A model's ``ray:`` options (``config/executor.py``) set each actor's resources and
placement; ``placement: pack`` reserves a placement group of one bundle per instance
with Ray's PACK strategy (Ray moves its bundles to live nodes when a node dies).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sordino.clock import Clock
from sordino.config import ModelConfig, RuntimeConfig
from sordino.config.executor import RayModelOptions
from sordino.errors import ModelLoadError
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.execution.devices import Device
from sordino.execution.placement import Instance, Signal
from sordino.execution.ray_actor import import_ray
from sordino.execution.ray_instance import RayInstance
from sordino.execution.ray_pool import NodePools
from sordino.inference import ModelKey, ModelMetadata
from sordino.memory.owner import ArenaOwner
from sordino.records import ArenaStatistics, NodeMemoryStatistics

__all__ = ["RayExecutor"]

log = logging.getLogger("sordino.execution")


class RayExecutor(ChainExecutor):
    """Runs batches on Ray actors; connects to (or starts) the cluster on first load."""

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        clock: Clock,
        events: EventSink,
        arena: ArenaOwner | None = None,
    ) -> None:
        self._ray = import_ray()  # fails here, at start-up, naming the extra to install
        super().__init__(config, clock=clock, events=events, arena=arena)
        self._connected_here = False
        # By ModelKey.slot: a version being reloaded has two loads up at once.
        self._groups: dict[tuple[ModelKey, int], Any] = {}
        self._asks: dict[tuple[ModelKey, int], dict[str, float]] = {}
        """What each actor of a loaded model asks Ray for (see :meth:`_check_fits`)."""
        settings = config.executor
        self.pools = (
            NodePools(config.memory, config.workers.shared_memory) if settings.node_pool else None
        )
        """Each node's memory pool (None with ``executor.node_pool: false``)."""
        self._pool_watchers: list[Callable[[str, Callable[[], ArenaStatistics | None]], None]] = []
        self._watched: set[str] = set()
        if self.pools is not None:
            self.pools.made.append(lambda pool: self._watch_new_pools())

    def _connect(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        settings = self._config.executor
        # Ray's core worker installs its own SIGTERM/SIGINT handlers (which end the
        # process at once); the server's graceful stop must keep answering them.
        kept = _signal_handlers()
        try:
            ray.init(
                # No address: a private local instance, never a cluster that another
                # process on this machine started (ray.init() alone would join it).
                address=settings.address or "local",
                namespace=settings.namespace,
                log_to_driver=False,
                include_dashboard=False if settings.address is None else None,
            )
        except Exception as exc:
            where = settings.address or "a new local cluster"
            raise ModelLoadError(
                f"cannot connect to the Ray cluster at {where} (executor.address): {exc}; "
                "start one with `ray start --head` or fix --ray-address"
            ) from None
        finally:
            _restore_signal_handlers(kept)
        self._connected_here = True
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        log.info("connected to Ray: %d live nodes", len(nodes))
        self._events.emit(
            "ray_connected",
            "executor",
            f"{len(nodes)} live nodes",
            address=settings.address or "local",
            namespace=settings.namespace,
        )

    async def load(self, key: ModelKey, path: Path, config: ModelConfig) -> ModelMetadata:
        """Start ``config.instance_count`` actors of ``key`` per device, placed by Ray."""
        self._connect()
        options = config.ray or RayModelOptions()
        self._check_fits(key, config, options)
        if options.placement == "pack":
            self._groups[key.slot] = await self._placement_group(key, config, options)
        try:
            metadata = await super().load(key, path, config)
        except BaseException:
            self._asks.pop(key.slot, None)
            self._remove_group(key)
            raise
        self._pool.models[key.slot].isolation = "ray"
        if metadata.decoupled:
            # Its responses would need a channel from the actor back to the server.
            await self.unload(key)
            raise ModelLoadError(
                f"model {key} is decoupled (model_transaction_policy {{ decoupled: true }}); "
                "decoupled models do not run on Ray actors (executor.kind: ray) yet: serve "
                "it with the default executor"
            )
        return metadata

    def _check_fits(self, key: ModelKey, config: ModelConfig, options: RayModelOptions) -> None:
        """Raise :class:`ModelLoadError` at once if the cluster cannot hold ``key``'s actors.

        What the actors of the loaded models ask for, plus what ``key``'s would, is
        compared with the cluster's total resources (``ray.cluster_resources()``): an
        actor Ray cannot place would otherwise be waited for ``workers.start_timeout``.
        Other users' actors are not counted, so passing is no promise of room.
        """
        count = config.instance_count * sum(
            1
            for tier, _ in self._placement.tiers(config)
            for device in tier.devices
            if self._placement.available(device.name)
        )
        ask = _actor_ask(options)
        total, held = self._resources()
        short = []
        for name, amount in ask.items():
            need = amount * count
            have = total.get(name, 0.0) - held.get(name, 0.0)
            if need > have + 1e-9:
                setting = _SETTING.get(name, f"models[].ray.resources.{name}")
                short.append(
                    f"{name} {need:g} ({count} actors x {amount:g}, {setting}) but the cluster "
                    f"has {total.get(name, 0.0):g}"
                    + (f", {held[name]:g} held by the models loaded before" if name in held else "")
                )
        if short:
            raise ModelLoadError(
                f"model {key}: the Ray cluster cannot hold its actors: it needs "
                + "; ".join(short)
                + f". Lower the model's ray options or instance_count ({config.instance_count}), "
                "or add nodes to the cluster"
            )
        self._asks[key.slot] = ask

    def _resources(self) -> tuple[dict[str, float], dict[str, float]]:
        """The cluster's total resources, and what the loaded models' actors ask for."""
        held: dict[str, float] = {}
        for slot, entry in self._pool.models.items():
            for name, amount in self._asks.get(slot, {}).items():
                held[name] = held.get(name, 0.0) + amount * len(entry.instances())
        total = {str(k): float(v) for k, v in self._ray.cluster_resources().items()}
        return total, held

    async def scale(
        self, key: ModelKey, delta: int, *, minimum: int, maximum: int
    ) -> list[Instance]:
        """:meth:`ChainExecutor.scale`, adding no more actors than the cluster can hold."""
        ask = self._asks.get(key.slot, {})
        if delta > 0 and ask:
            total, held = self._resources()
            room = min(
                math.floor((total.get(name, 0.0) - held.get(name, 0.0)) / amount + 1e-9)
                for name, amount in ask.items()
            )
            if room < delta:
                log.warning(
                    "model %s: the Ray cluster holds %d more actors, not %d (each asks for %s)",
                    key,
                    max(0, room),
                    delta,
                    ", ".join(f"{name} {amount:g}" for name, amount in ask.items()),
                )
                delta = max(0, room)
                if delta == 0:
                    return []
        return await super().scale(key, delta, minimum=minimum, maximum=maximum)

    async def _placement_group(
        self, key: ModelKey, config: ModelConfig, options: RayModelOptions
    ) -> Any:
        from ray.util.placement_group import placement_group

        bundle: dict[str, float] = {"CPU": options.num_cpus, **options.resources}
        if options.num_gpus:
            bundle["GPU"] = options.num_gpus
        bundle = {name: amount for name, amount in bundle.items() if amount}
        group = placement_group([bundle] * config.instance_count, strategy="PACK")
        try:
            await asyncio.wait_for(group.ready(), self._settings.start_timeout)
        except Exception as exc:
            self._ray.util.remove_placement_group(group)
            raise ModelLoadError(
                f"model {key}: the placement group of {config.instance_count} x {bundle} "
                f"(placement: pack) could not be reserved: {exc or 'timed out'}"
            ) from None
        return group

    def _remove_group(self, key: ModelKey) -> None:
        group = self._groups.pop(key.slot, None)
        if group is not None:
            try:
                self._ray.util.remove_placement_group(group)
            except Exception as exc:  # the cluster is gone already
                log.debug("removing a placement group: %s", exc)

    def _instance(
        self,
        key: ModelKey,
        index: int,
        tier: str,
        device: Device,
        path: Path,
        config: ModelConfig,
        model_signal: Signal,
    ) -> Instance:
        group = self._groups.get(key.slot)
        # Instances past the group's bundles (scaled up) go where Ray's scheduler says.
        bundle = index if group is not None and index < config.instance_count else -1
        return RayInstance(
            key,
            index,
            tier,
            device,
            path,
            config,
            settings=self._settings,
            clock=self._clock,
            events=self._events,
            notify=model_signal.fire,
            placement_group=group if bundle >= 0 else None,
            bundle=bundle,
            pools=self.pools,
        )

    async def unload(self, key: ModelKey) -> None:
        await super().unload(key)
        self._asks.pop(key.slot, None)
        self._remove_group(key)

    async def aclose(self) -> None:
        await super().aclose()
        if self.pools is not None and self._ray.is_initialized():
            self.pools.close()
        if self._connected_here and self._ray.is_initialized():
            self._ray.shutdown()

    def node_memory(self) -> tuple[NodeMemoryStatistics, ...]:
        """Each node pool's figures (the memory manager's ``nodes``); none without pools."""
        if self.pools is None:
            return ()
        self._watch_new_pools()
        return self.pools.statistics()

    def watch_node_pools(
        self, add_pool: Callable[[str, Callable[[], ArenaStatistics | None]], None]
    ) -> None:
        """Call ``add_pool(name, statistics)`` for each node pool, now and as they appear
        (the telemetry's memory pools: ``ray_node:<node id>``)."""
        self._pool_watchers.append(add_pool)
        self._watch_new_pools()

    def _watch_new_pools(self) -> None:
        pools = self.pools
        if pools is None or not self._pool_watchers:
            return
        for node, _ in pools.nodes():
            if node in self._watched:
                continue
            self._watched.add(node)
            for add in self._pool_watchers:
                add(f"ray_node:{node}", functools.partial(pools.arena_statistics, node))

    async def restart_instance(self, key: ModelKey, index: int, *, cause: str) -> bool:
        """Replace actor ``index`` of ``key`` (killed, then replaced as after a failure)."""
        instance = self.instance(key, index)
        if not isinstance(instance, RayInstance) or not instance.serving:
            return False
        self.faults.clear_instance(key.name, index, cause="ray actor replaced: " + cause)
        instance.kill(cause)
        return True


_SETTING = {"CPU": "models[].ray.num_cpus", "GPU": "models[].ray.num_gpus"}
"""The model setting behind each of Ray's own resources an actor asks for."""


def _actor_ask(options: RayModelOptions) -> dict[str, float]:
    """What one actor with ``options`` asks Ray for (the resources it names, nonzero)."""
    ask = {"CPU": options.num_cpus, "GPU": options.num_gpus, **options.resources}
    return {name: float(amount) for name, amount in ask.items() if amount}


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _signal_handlers() -> dict[signal.Signals, Any]:
    """The Python handlers of the stop signals, when this is the main thread (else none)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}


def _restore_signal_handlers(kept: dict[signal.Signals, Any]) -> None:
    for sig, handler in kept.items():
        if handler is not None:
            signal.signal(sig, handler)
