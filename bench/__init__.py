"""Benchmarks: kpng-py's control plane and datapath, side by side with
kube-proxy's iptables and nftables modes on the same state (docs/bench.md).

    scenario     the synthetic state (N services x E endpoints, probes)
    worker       one contender programming a state, timed from the inside
    contenders   ours (each built-in backend) and kube-proxy's modes (lab/kube_proxy/)
    controlplane full syncs and one-endpoint changes, in throwaway namespaces
    e2e_sync     the full sync through the built-in brain and the watch client
    datapath     real clients and servers in a cluster of namespaces
    loadgen      wrk, curl, iperf3 and dnsperf, and what they report
    results      figures (min/median/max), report: ratios, targets, table, plots
    run          the command line (`make bench`)
"""
