"""The `kpng-py` command line and the wiring of its commands: a source of
change sets (a brain stream, a state file, a recording), the state, a backend
(`runner`); the `file` command's sinks (`file`), `kpng-py version`."""
