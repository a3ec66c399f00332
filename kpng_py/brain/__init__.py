"""The built-in brain: serves localv1 from a KPNG state file (`kpng-py file`).

reader: strict YAML with errors that say where; statefile: the file format;
view: one node's view of the state; source: the change sets of each stream;
watcher: follows the file; command: the `file` command's sinks (to-api, to-local);
settings: what its flags set and its errors, importable without the rest (the
CLI's parser of every run needs them); kube: the brain that follows a
Kubernetes API server instead of a file (`kpng-py kube`). See docs/brain.md.
"""
