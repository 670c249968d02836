"""One moebatchd per GPU node of a Ray cluster, started from Ray, for `moebatch shard`.

    moebatch ray-daemons start -- --model /models/qwen3-30b-a3b-q4_k_m.gguf   # prints HOST:PORT,...
    moebatch shard prompts.jsonl --servers ray -o results.jsonl            # uses them
    moebatch ray-daemons list
    moebatch ray-daemons stop

start() reserves one bundle of `gpus` GPUs on each Ray node that has them, in a placement group
spread over distinct nodes (STRICT_SPREAD), and runs in each bundle a DaemonHost actor: it starts
`moebatchd ARGS --listen NODE_IP:PORT --data-dir DIR` on that node (Ray's CUDA_VISIBLE_DEVICES
passed on, so the daemon sees its bundle's GPU), waits until it serves jobs, and restarts it when
it exits (as systemd's Restart=on-failure would: with the same data dir, so the daemon resumes its
jobs and `moebatch shard` adopts them). The placement group and the actors are detached and named
in the Ray namespace "moebatch": they outlive the command that started them, a second start()
finds them, and `moebatch shard --servers ray` reads their addresses. stop() stops the daemons
(SIGTERM, then SIGKILL after `grace` seconds) and removes the actors and the placement group.

The daemon's job store lives in `data_dir` on each node ("{node}" in it is replaced by the first
12 hex digits of the Ray node id, so several Ray nodes on one machine keep apart), by default
~/.moebatch/ray-daemons/{node}. PORT 0 picks a free port on each node.

Threading: the functions here are for one thread of a Ray driver; DaemonHost is a threaded actor
(its monitor thread restarts the daemon). Errors: ValueError for bad arguments, DaemonGroupError
when the cluster cannot host the group (too few GPU nodes, a daemon that does not come up, a group
started with other arguments), ImportError without Ray.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

NAMESPACE = "moebatch"
GROUP = "moebatchd"                     # the actors' names: GROUP-0, GROUP-1, ...
DEFAULT_DATA_DIR = "~/.moebatch/ray-daemons/{node}"
DEFAULT_PORT = 50051
RESTART_DELAY = 2.0                     # seconds before a daemon that exited is started again
LOG_TAIL = 2000                         # characters of the daemon's log in error messages


class DaemonGroupError(RuntimeError):
    """The Ray cluster cannot host the daemon group as asked; the message says why."""


@dataclass
class DaemonInfo:
    """One daemon of the group, as its actor reports it."""
    name: str              # the actor's name, GROUP-<i>
    address: str           # HOST:PORT of its gRPC service
    node_id: str           # the Ray node it runs on
    pid: int               # moebatchd's process id on that node (0 while it is down)
    restarts: int          # times the actor started it again after it exited
    command: list[str] = field(default_factory=list)  # moebatchd and its arguments


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn for the daemon's process: SIGTERM to it when the actor's process dies
    (prctl PR_SET_PDEATHSIG, Linux); None elsewhere. libc's prctl is looked up here, in the
    parent, so that the child between fork and exec only calls it."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class DaemonHost:
    """The Ray actor that keeps one moebatchd running on its node (see the module docstring).
    command: moebatchd and its arguments, without --listen and --data-dir. ready_timeout:
    seconds the daemon may take to load its model and serve."""

    def __init__(self, command: Sequence[str], data_dir: str, port: int, ready_timeout: float):
        import ray

        self.command = list(command)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.host = ray.util.get_node_ip_address()
        self.port = port or _free_port(self.host)
        self.data_dir = Path(os.path.expanduser(data_dir.replace("{node}", self.node_id[:12])))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = self.data_dir / "moebatchd.log"
        self.ready_timeout = ready_timeout
        self.restarts = 0
        self.stopping = False
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.served = False             # it served once: restart it when it exits
        self.failure = ""               # why it is down for good (it never served)
        self.preexec = _parent_death_signal()
        # The monitor thread starts the daemon and every restart: the parent-death signal follows
        # the thread that forked, and this one lives as long as the actor.
        self.spawned = threading.Event()
        threading.Thread(target=self._monitor, daemon=True).start()
        self.spawned.wait()

    def _spawn(self) -> None:
        """Starts moebatchd (lock held); on failure, self.failure says why."""
        try:
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    [*self.command, "--listen", _host_port(self.host, self.port),
                     "--data-dir", str(self.data_dir)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=self.preexec)
        except OSError as e:
            self.proc = None
            self.failure = f"cannot start {self.command[0]}: {e.strerror or e}"

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-LOG_TAIL:]
        except OSError as e:
            return f"(no log: {e})"

    def _monitor(self) -> None:
        with self.lock:
            try:
                self._spawn()
            finally:
                self.spawned.set()
        while True:
            time.sleep(0.5)
            with self.lock:
                if self.stopping:
                    return
                if self.proc is None or self.proc.poll() is None:
                    continue
                code = self.proc.returncode
                self.proc = None
                if not self.served:  # a bad model or flag: starting it again would not help
                    self.failure = f"moebatchd exited with {code} before it served"
                    return
                with open(self.log, "ab") as log:
                    log.write(f"moebatch ray-daemons: moebatchd exited ({code}); starting it "
                              f"again in {RESTART_DELAY:g} s\n".encode())
                restart_at = time.monotonic() + RESTART_DELAY
            while time.monotonic() < restart_at:
                time.sleep(0.1)
            with self.lock:
                if self.stopping:
                    return
                self.restarts += 1
                self._spawn()
                if self.proc is None:
                    return

    def wait_ready(self) -> str:
        """Blocks until the daemon serves jobs; returns its address. Raises DaemonGroupError
        with the tail of its log if it exits or does not serve within ready_timeout."""
        from .client import Client
        from .errors import ClientError

        address = _host_port(self.host, self.port)
        deadline = time.monotonic() + self.ready_timeout
        with Client(address, timeout=5) as client:
            while True:
                with self.lock:
                    failure = self.failure
                if failure:
                    raise DaemonGroupError(f"{address}: {failure}:\n{self._log_tail()}")
                try:
                    client.wait_ready(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
                    with self.lock:
                        self.served = True
                    return address
                except ClientError:
                    if time.monotonic() >= deadline:
                        raise DaemonGroupError(
                            f"moebatchd on {address} does not serve after {self.ready_timeout:g}"
                            f" s:\n{self._log_tail()}") from None

    def info(self) -> dict[str, Any]:
        with self.lock:
            pid = self.proc.pid if self.proc is not None and self.proc.poll() is None else 0
        return {"address": _host_port(self.host, self.port), "node_id": self.node_id, "pid": pid,
                "restarts": self.restarts, "command": self.command}

    def placement_group(self) -> Any:
        """The placement group whose bundle holds this actor."""
        import ray

        return ray.util.get_current_placement_group()

    def stop(self, grace: float) -> None:
        """SIGTERM to the daemon (it finishes its writes and keeps its jobs), SIGKILL after
        `grace` seconds; no restart after."""
        with self.lock:
            self.stopping = True
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _gpu_nodes(gpus: float) -> list[dict]:
    import ray

    return [n for n in ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= gpus]


def _group_actors() -> list[tuple[str, Any]]:
    """(name, handle) of the group's actors, by index."""
    import ray

    names = [a["name"] if isinstance(a, dict) else a
             for a in ray.util.list_named_actors(all_namespaces=True)
             if not isinstance(a, dict) or a.get("namespace") == NAMESPACE]
    mine = sorted((n for n in names if n.startswith(GROUP + "-") and n[len(GROUP) + 1:].isdigit()),
                  key=lambda n: int(n[len(GROUP) + 1:]))
    out = []
    for name in mine:
        try:
            out.append((name, ray.get_actor(name, namespace=NAMESPACE)))
        except ValueError:  # gone between the listing and the lookup
            continue
    return out


def list_daemons(timeout: float = 30.0) -> list[DaemonInfo]:
    """The group's daemons (empty when none was started). Call with Ray initialized."""
    import ray

    out = []
    for name, actor in _group_actors():
        try:
            info = ray.get(actor.info.remote(), timeout=timeout)
        except Exception:  # an actor whose node is gone; Ray restarts or drops it
            continue
        out.append(DaemonInfo(name=name, **info))
    return out


def addresses(timeout: float = 30.0) -> list[str]:
    """HOST:PORT of the group's daemons, for moebatch.ray_driver.run(servers=...)."""
    return [d.address for d in list_daemons(timeout)]


def start(args: Sequence[str], *, moebatchd: str = "moebatchd", gpus: float = 1.0,
          port: int = DEFAULT_PORT, data_dir: str = DEFAULT_DATA_DIR, min_nodes: int = 1,
          wait: float = 600.0, ready_timeout: float = 600.0) -> list[DaemonInfo]:
    """Starts one moebatchd per Ray node with at least `gpus` GPUs (all such nodes alive when at
    least `min_nodes` of them are, waiting up to `wait` seconds for them), each with `args` (its
    model and options, without --listen and --data-dir), and returns them once every one serves.
    A group already running with the same command is returned as it is; with another command,
    DaemonGroupError (stop it first). Call with Ray initialized."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not gpus > 0:
        raise ValueError(f"gpus: must be positive, got {gpus!r}")
    if not 0 <= port < 65536:
        raise ValueError(f"port: must be in [0, 65535], got {port!r}")
    if min_nodes < 1:
        raise ValueError(f"min_nodes: must be at least 1, got {min_nodes!r}")
    for flag in ("--listen", "--data-dir", "--data_dir"):
        if any(a == flag or a.startswith(flag + "=") for a in args):
            raise ValueError(f"moebatchd arguments: {flag} is set by ray-daemons (use --port / "
                             "--data-dir of `moebatch ray-daemons start`)")
    command = [moebatchd, *args]
    running = list_daemons()
    if running:
        if any(d.command != command for d in running):
            raise DaemonGroupError(
                f"a daemon group runs with `{shlex.join(running[0].command)}`; stop it first "
                "(moebatch ray-daemons stop)")
        return running
    deadline = time.monotonic() + wait
    while len(nodes := _gpu_nodes(gpus)) < min_nodes:
        if time.monotonic() >= deadline:
            raise DaemonGroupError(f"{len(nodes)} Ray nodes with {gpus:g} GPUs alive after "
                                   f"{wait:g} s, fewer than the {min_nodes} asked for")
        time.sleep(1.0)
    pg = placement_group([{"GPU": gpus}] * len(nodes), strategy="STRICT_SPREAD",
                         lifetime="detached")
    if not pg.wait(max(1.0, deadline - time.monotonic())):
        ray.util.remove_placement_group(pg)
        raise DaemonGroupError(f"cannot reserve {gpus:g} GPUs on each of {len(nodes)} nodes "
                               "(busy with other work?)")
    actor_class = ray.remote(max_concurrency=4)(DaemonHost)
    actors = [actor_class.options(
        name=f"{GROUP}-{i}", namespace=NAMESPACE, lifetime="detached", num_cpus=0, num_gpus=gpus,
        max_restarts=-1, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i)).remote(
        command, data_dir, port, ready_timeout) for i in range(len(nodes))]
    try:
        ray.get([a.wait_ready.remote() for a in actors])
    except Exception as e:
        stop(_placement_groups=[pg])
        cause = getattr(e, "cause", None) or e
        raise DaemonGroupError(f"the daemons did not come up: {cause}") from None
    return list_daemons()


def stop(grace: float = 60.0, _placement_groups: Sequence[Any] = ()) -> list[str]:
    """Stops the group's daemons (SIGTERM, SIGKILL after `grace` seconds), removes its actors and
    their placement group (found through them; plus `_placement_groups`); returns the addresses
    stopped. Call with Ray initialized."""
    import ray

    stopped = []
    groups = list(_placement_groups)
    for name, actor in _group_actors():
        try:
            stopped.append(ray.get(actor.info.remote(), timeout=30)["address"])
            groups.append(ray.get(actor.placement_group.remote(), timeout=30))
            ray.get(actor.stop.remote(grace), timeout=grace + 30)
        except Exception:
            pass
        ray.kill(actor, no_restart=True)
    for pg in {g.id: g for g in groups}.values():
        ray.util.remove_placement_group(pg)
    return stopped
