"""`kpng-py kube`: a brain that follows a Kubernetes API server (docs/brain.md).

access: where the API server is and the credentials (kubeconfig, flags, the
pod's service account); client: its list and watch calls; reflector: one
resource listed and watched into a store; cluster: the stores' ClusterState,
mapped as `file convert` maps the objects; watcher: the reflectors and the
publishing of each new state. The `kube` command's sinks are kpng_py/cmd/kube.py.
"""
