#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian 12 machine (root, python3 and Go
# 1.26 on PATH): Debian packages, kernel headers findable by BCC, bpffs, the
# .venv with pinned dependencies, the generated protobuf code, the kpng-py
# command, and (dev) the lab's Kubernetes control plane, built with Go.
# Safe to run again: every step checks before it acts.
#
#   hack/setup.sh           development and tests (what `make` runs)
#   hack/setup.sh runtime   what the container image needs (deploy/Dockerfile)
#   hack/setup.sh headers   only the kernel-header links (the image's entrypoint)
set -euo pipefail
MODE="${1:-dev}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"

log() { printf 'setup: %s\n' "$*" >&2; }

debian_packages() {
    local arch
    arch="$(dpkg --print-architecture)"
    # BCC (runtime compiler + Python bindings), headers it compiles against,
    # and inspection tools.
    echo python3-bpfcc libbpfcc "linux-headers-$arch" bpftool iproute2 procps kmod
    # libnftables' Python binding: the eBPF backend's table for packets from
    # outside the node (backends/ebpf/netfilter/table.py).
    echo python3-nftables
    if [[ $MODE == dev ]]; then
        # The real servers and clients of the tests, e2e suite and benchmarks;
        # gcc checks the BPF map layouts and the kernel numbers and structs
        # copied in backends/ebpf against lb_maps.h and the uapi headers
        # (linux-libc-dev: linux/bpf.h, inet_diag.h, capability.h).
        echo nginx-light dnsmasq-base socat dnsutils curl iperf3 wrk dnsperf time nftables iptables \
            openssl gcc libc6-dev linux-libc-dev
    fi
}

install_debian_packages() {
    local missing=()
    for pkg in $(debian_packages); do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        return
    fi
    if [[ $(id -u) != 0 ]]; then
        log "missing Debian packages: ${missing[*]}; run this script as root (or apt-get install them)"
        exit 1
    fi
    log "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # The Debian nginx package starts a server on :80 when installed; tests run
    # their own nginx inside namespaces, so keep the system one out of the way.
    if command -v systemctl >/dev/null && systemctl is-active -q nginx 2>/dev/null; then
        systemctl disable --now nginx >/dev/null 2>&1 || true
    fi
}

# BCC looks for headers at /lib/modules/$(uname -r)/{build,source}. The running
# kernel may have no headers package of its own; Debian's generic headers work
# for the BPF programs we compile (see docs/kernel-headers.md).
link_kernel_headers() {
    local moddir="/lib/modules/$(uname -r)"
    if [[ -e "$moddir/build/include/linux/kconfig.h" || -e "$moddir/source/include/linux/kconfig.h" ]]; then
        return
    fi
    local arch build common
    arch="$(dpkg --print-architecture)"
    build="$(ls -d /usr/src/linux-headers-*-"$arch" 2>/dev/null | sort -V | tail -1)"
    common="$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1)"
    if [[ -z "$build" || -z "$common" ]]; then
        log "no kernel headers under /usr/src; install linux-headers-$arch"
        exit 1
    fi
    log "linking $moddir/build -> $build and source -> $common for BCC"
    mkdir -p "$moddir"
    ln -sfn "$build" "$moddir/build"
    ln -sfn "$common" "$moddir/source"
}

mount_bpffs() {
    if [[ $(id -u) != 0 ]] || mountpoint -q /sys/fs/bpf; then
        return
    fi
    log "mounting bpffs at /sys/fs/bpf"
    mount -t bpf bpf /sys/fs/bpf
}

lock_files() {
    echo "$ROOT/requirements.lock"
    [[ $MODE == dev ]] && echo "$ROOT/requirements-dev.lock"
    return 0
}

make_venv() {
    local stamp="$VENV/.kpng-py-setup"
    local want lock
    want="$(cat $(lock_files) "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$VENV/bin/kpng-py" ]]; then
        return
    fi
    log "creating $VENV with pinned dependencies"
    [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
    for lock in $(lock_files); do
        "$VENV/bin/pip" install -q --disable-pip-version-check -r "$lock"
    done
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e "$ROOT"
    echo "$want" >"$stamp"
}

# Debian's BCC and nftables bindings are pure Python over libbcc.so and
# libnftables.so; expose them to the venv's interpreter without pulling in the
# rest of Debian's dist-packages.
link_debian_modules() {
    local site module
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    for module in bcc nftables; do
        if [[ ! -e "$site/$module" ]]; then
            ln -sfn "/usr/lib/python3/dist-packages/$module" "$site/$module"
        fi
    done
}

generate_proto() {
    local out="$ROOT/kpng_py/api"
    if [[ "$out/localv1_pb2.py" -nt "$ROOT/proto/localv1.proto" ]]; then
        return
    fi
    log "generating protobuf code from proto/localv1.proto"
    "$VENV/bin/python" -m grpc_tools.protoc -I"$ROOT/proto" \
        --python_out="$out" --pyi_out="$out" "$ROOT/proto/localv1.proto"
}

# The lab's Kubernetes control plane (lab/kube_control_plane.py), built with
# Go from the modules lab/components/*/go.mod pin: kube-apiserver and
# kube-controller-manager of k8s.io/kubernetes, etcd of go.etcd.io/etcd/server/v3,
# static and trimmed like their own release builds, into build/components.
# The first build takes minutes (docs/e2e.md); Go's build cache makes the next
# ones take about a second, and a stamp of the pins skips even that.
K8S_MAIN=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager)
build_components() {
    local components="$ROOT/build/components" stamp want version major minor flags="" pkg
    # The polyglot machines install Go at /usr/local/go; a non-login shell may
    # not have it on PATH.
    if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
        PATH="/usr/local/go/bin:$PATH"
    fi
    if ! command -v go >/dev/null; then
        log "no Go toolchain on PATH: the lab's control plane (lab/components) needs Go 1.26"
        exit 1
    fi
    stamp="$components/.built"
    want="$( (go version; cat "$ROOT"/lab/components/*/go.mod "$ROOT"/lab/components/*/go.sum) \
        | sha256sum | cut -d' ' -f1)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$components/etcd" \
        && -x "$components/kube-apiserver" && -x "$components/kube-controller-manager" ]]; then
        return
    fi
    log "building the lab's control plane with Go (lab/components; the first build takes minutes)"
    mkdir -p "$components"
    version="$(cd "$ROOT/lab/components/kubernetes" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
    major="${version#v}"; major="${major%%.*}"
    minor="${version#v*.}"; minor="${minor%%.*}"
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    (cd "$ROOT/lab/components/kubernetes" && CGO_ENABLED=0 go build -trimpath \
        -tags=selinux,notest,grpcnotrace -ldflags="all=$flags -s -w" -o "$components/" "${K8S_MAIN[@]}")
    (cd "$ROOT/lab/components/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" \
        -o "$components/etcd" go.etcd.io/etcd/server/v3)
    echo "$want" >"$stamp"
}

case "$MODE" in
dev)
    install_debian_packages
    link_kernel_headers
    mount_bpffs
    make_venv
    link_debian_modules
    generate_proto
    build_components
    ;;
runtime) # headers are linked when the container starts, on the real node
    install_debian_packages
    make_venv
    link_debian_modules
    generate_proto
    ;;
headers)
    link_kernel_headers
    ;;
*)
    log "unknown mode $MODE: use dev (default), runtime or headers"
    exit 2
    ;;
esac
