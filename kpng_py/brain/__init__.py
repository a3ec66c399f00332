"""The built-in brain: serves localv1 from a KPNG state file (`kpng-py file`).

reader: strict YAML with errors that say where; statefile: the file format;
view: one node's view of the state; source: the change sets of each stream;
watcher: follows the file; command: the `file` command's sinks (to-api, to-local).
See docs/brain.md.
"""
