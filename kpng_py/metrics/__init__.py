"""Prometheus metrics of a kpng-py process (kube-proxy's names where one
exists) and the per-service-port connection counters every backend exports."""
