"""Between the state and a dataplane: the contract every backend keeps and
the applier that feeds it change sets (`backend`), the one list of backends
(`registry`), the counts of what a dataplane holds (`census`), and the
`to-print` backend."""
