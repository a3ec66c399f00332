"""The main-job demo (`make demo`): a small cluster in namespaces, the
built-in brain on a state file, the eBPF backend, and a client pod reaching
ClusterIPs, then the backend's maps. Tears everything down at the end, or
with --keep when interrupted (Ctrl-C, SIGTERM), leaving time to look around.

    python -m e2e.demo [-i ipv4|ipv6|dual] [--keep]
    python -m e2e.demo --down    # leftovers of a demo that was killed hard
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import time
from typing import Sequence

from e2e.checks import HTTP, base_state
from e2e.proxy import BACKENDS, FileControlPlane
from e2e.statefile import ServiceSpec
from lab import clients, procs, teardown
from lab.cluster import Cluster, IPAddress, Pod, families_of_mode
from lab.names import RunNames
from lab.pods import build_cluster


def say(text: str) -> None:
    print(text, flush=True)


def _stop(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def demo(ip_mode: str, keep: bool) -> int:
    if "ebpf" not in BACKENDS:
        say("demo: this kpng-py has no to-ebpf backend")
        return 1
    names = RunNames.for_this_process()
    kind = BACKENDS["ebpf"]
    control: FileControlPlane | None = None
    began = time.monotonic()
    # Ctrl-C is the way out of a kept demo, also when it was started where
    # SIGINT is ignored (a background job of a non-interactive shell, as CI
    # runs the suite): Python then leaves it ignored, and the demo would wait
    # forever.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop)
    try:
        teardown.remove_stale_runs(kind.dataplane_cleanup)
        cluster = Cluster(names, families_of_mode(ip_mode), names.make_workdir())
        say(f"== a node ({cluster.node_netns}: a bridge, no uplink) and four pods, "
            f"each with its own network namespace, all in cgroup {names.cgroup}")
        servers, client = build_cluster(cluster)
        for pod in (*servers, client):
            role = "client" if pod is client else "nginx, dnsmasq, socat"
            say(f"   {pod.name:7} {', '.join(map(str, pod.ips)):28} {role}")
        control = FileControlPlane(cluster, kind, base_state(cluster.families, servers))
        say(f"== the brain serves {control.state_path.name} on {control.socket.name}; the eBPF "
            f"backend (kpng-py local ... to-ebpf) attaches to the pods' cgroup")
        control.start()
        say(f"   first sync applied {time.monotonic() - began:.1f} s after the start")
        web, dns = (s for s in control.state.services if s.name in ("web", "dns"))
        for family in cluster.families:
            _curl(client, web.cluster_ip(family))
            dns_vip = dns.cluster_ip(family)
            say(f"== client pod: dig @{dns_vip} whoami.e2e TXT")
            answers = clients.dns(client, dns_vip, attempts=3)
            say("   " + (", ".join(f"{pod} x{n}" for pod, n in answers.pods.items())
                         or "no answer: " + "; ".join(answers.errors)))
        empty = ServiceSpec("empty", 5, (HTTP,))
        say(f"== edit {control.state_path.name}: web loses {servers[2].name}, a service "
            f"without endpoints appears; the brain publishes, the backend applies")
        edited = time.monotonic()
        control.apply(control.state.with_service(web.with_endpoints(*servers[:2]))
                      .with_service(empty))
        say(f"   sync applied {time.monotonic() - edited:.1f} s after the save")
        family = cluster.families[0]
        _curl(client, web.cluster_ip(family))
        vip = empty.cluster_ip(family)
        answer = clients.probe(client, "connect", str(vip), str(HTTP.port))
        outcome = ("connected?!" if answer["ok"] else
                   f"{answer['errno']} after {answer['seconds'] * 1000:.1f} ms")
        say(f"== client pod: connect() to {clients.host_literal(vip)}:{HTTP.port} (no "
            f"endpoints): {outcome}")
        say(f"== kpng-py ebpf dump --bpffs-dir {names.bpffs_dir}")
        dump = procs.run(kind.inspect(names), check=False)
        say("   " + (dump.stdout + dump.stderr).strip().replace("\n", "\n   "))
        if keep:
            _keep_until_interrupted(client, control)
        return 0
    except KeyboardInterrupt:
        if keep and control is not None and control.syncs:
            return 0  # the end a kept demo waits for
        say("demo: interrupted")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say("== tearing down: processes, namespaces, cgroup, BPF programs and pinned maps")
        problems = control.stop() if control else []
        problems += teardown.remove_run(names, kind.dataplane_cleanup)
        for problem in problems:
            say(f"   {problem}")
        say(f"   done in {time.monotonic() - began:.1f} s in all")


def _keep_until_interrupted(client: Pod, control: FileControlPlane) -> None:
    """Wait, with the cluster up, until Ctrl-C or SIGTERM."""
    say("== kept up. In another terminal, a shell in the client pod (its network "
        "namespace and cgroup, where ClusterIPs are translated):")
    say(f"   {shlex.join(client.command(['bash']))}")
    say(f"   the state file the brain follows (edit it, watch the backend apply): "
        f"{control.state_path}")
    say(f"   tear down: Ctrl-C here, or kill {os.getpid()}; after a kill -9, "
        "`hack/demo.sh --down` (or the next `make demo`) removes what is left")
    while True:
        # Not signal.pause(): a signal that came between Python's check for
        # one and the pause() call would leave it waiting for another.
        time.sleep(1.0)


def _down() -> int:
    kind = BACKENDS["ebpf"]
    for line in teardown.remove_stale_runs(kind.dataplane_cleanup) or ["nothing left to remove"]:
        say(line)
    return 0


def _curl(client: Pod, vip: IPAddress) -> None:
    say(f"== client pod: curl http://{clients.host_literal(vip)}/ (6 new connections)")
    sample = clients.http(client, vip, 80, attempts=6, parallel=False)
    for answer in sample.answers:
        say(f"   {answer.pod} answered (port {answer.port}, address {answer.server_ip})")
    for error in sample.errors:
        say(f"   error: {error}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/demo.sh", description=__doc__)
    parser.add_argument("-i", "--ip", choices=("ipv4", "ipv6", "dual"), default="dual")
    parser.add_argument("--keep", action="store_true", default=os.environ.get("KEEP") == "1",
                        help="keep the cluster up until interrupted (also: KEEP=1)")
    parser.add_argument("--down", action="store_true",
                        help="only remove what demos that were killed hard left behind")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="demo: %(message)s", stream=sys.stderr)
    return _down() if args.down else demo(args.ip, args.keep)


if __name__ == "__main__":
    sys.exit(main())
