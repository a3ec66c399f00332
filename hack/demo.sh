#!/usr/bin/env bash
# The main job, on this machine: a brain (`kpng-py replay` of a recorded
# state, hack/demo_state.py) feeds `kpng-py local ... to-ebpf`, which programs
# ClusterIP services for a client in a throwaway network namespace and cgroup.
# Real servers answer from a "pods" namespace: nginx (TCP) and dnsmasq (UDP).
# The client namespace has no route out: a ClusterIP that escaped translation
# would go nowhere. Everything is removed on exit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KPNG_PY="$ROOT/.venv/bin/kpng-py"
ID="$$"
CLIENT="kpd-client-$ID"
PODS="kpd-pods-$ID"
CGROUP_ROOT="$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)"
CGROUP="$CGROUP_ROOT/kpng-py-demo-$ID"
BPFFS="/sys/fs/bpf/kpng-py-demo-$ID"
WORK="$(mktemp -d)"
PIDS=()

say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    "$KPNG_PY" ebpf cleanup --bpffs-dir "$BPFFS" --cgroup "$CGROUP" >/dev/null 2>&1 || true
    ip netns del "$CLIENT" 2>/dev/null || true
    ip netns del "$PODS" 2>/dev/null || true
    rmdir "$CGROUP" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

[[ $(id -u) == 0 ]] || { echo "demo: needs root (BPF, namespaces, cgroups)" >&2; exit 1; }

# -- a node with two pods ----------------------------------------------------
ip netns add "$CLIENT"
ip netns add "$PODS"
ip -n "$CLIENT" link set lo up
ip -n "$PODS" link set lo up
ip link add "kpdc$ID" netns "$CLIENT" type veth peer name "kpdp$ID" netns "$PODS"
ip -n "$CLIENT" addr add 10.244.0.1/24 dev "kpdc$ID"
ip -n "$CLIENT" addr add fd00:244::1/64 dev "kpdc$ID" nodad
for pod in 2 3; do
    ip -n "$PODS" addr add "10.244.0.$pod/24" dev "kpdp$ID"
    ip -n "$PODS" addr add "fd00:244::$pod/64" dev "kpdp$ID" nodad
done
ip -n "$CLIENT" link set "kpdc$ID" up
ip -n "$PODS" link set "kpdp$ID" up
mkdir "$CGROUP"

cat >"$WORK/nginx.conf" <<CONF
pid $WORK/nginx.pid;
error_log stderr;
events {}
http {
    access_log off;
    client_body_temp_path $WORK;
    server { listen 10.244.0.2:8080; listen [fd00:244::2]:8080; return 200 "served by pod-1\n"; }
    server { listen 10.244.0.3:8080; listen [fd00:244::3]:8080; return 200 "served by pod-2\n"; }
}
CONF
ip netns exec "$PODS" nginx -c "$WORK/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
for pod in 2 3; do
    ip netns exec "$PODS" dnsmasq --keep-in-foreground --no-resolv --no-hosts --user=root \
        --bind-interfaces --listen-address="10.244.0.$pod" --port=5353 \
        --pid-file="$WORK/dnsmasq-$pod.pid" --txt-record="whoami.demo,pod-$((pod - 1))" &
    PIDS+=($!)
done

# -- the brain and kpng-py ----------------------------------------------------
"$ROOT/.venv/bin/python" "$ROOT/hack/demo_state.py" >"$WORK/state.jsonl"
"$KPNG_PY" replay -i "$WORK/state.jsonl" to-api --listen "unix://$WORK/brain.sock" \
    2>"$WORK/replay.log" &
PIDS+=($!)
for _ in $(seq 50); do [[ -S "$WORK/brain.sock" ]] && break; sleep 0.1; done
say "kpng-py local --api unix://$WORK/brain.sock to-ebpf --cgroup $CGROUP --bpffs-dir $BPFFS"
"$KPNG_PY" local --api "unix://$WORK/brain.sock" to-ebpf --cgroup "$CGROUP" \
    --bpffs-dir "$BPFFS" 2>"$WORK/kpng-py.log" &
PIDS+=($!)
for _ in $(seq 100); do [[ -e "$BPFFS/links/getpeername6" ]] && break; sleep 0.1; done
[[ -e "$BPFFS/links/getpeername6" ]] || { cat "$WORK/kpng-py.log" >&2; exit 1; }

# A client: joins the demo cgroup, then runs in the client namespace.
client() {
    sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CGROUP" \
        ip netns exec "$CLIENT" "$@"
}

say "curl http://10.96.0.10/ (ClusterIP, TCP): spread over both pods"
for _ in 1 2 3 4; do client curl -sS --max-time 2 http://10.96.0.10/; done
say "curl http://[fd00:96::10]/ (the same service, IPv6 ClusterIP)"
client curl -sS --max-time 2 -g 'http://[fd00:96::10]/'
say "dig TXT whoami.demo @10.96.0.53 (ClusterIP, UDP): the reply comes from the VIP"
for _ in 1 2 3; do client dig +short +tries=1 +time=2 TXT whoami.demo @10.96.0.53; done
say "curl http://10.96.0.99/ (a service without endpoints): refused at once"
client curl -sS --max-time 2 http://10.96.0.99/ || true
say "kpng-py ebpf dump --bpffs-dir $BPFFS (the maps: the only place the VIPs are)"
"$KPNG_PY" ebpf dump --bpffs-dir "$BPFFS"
