"""The node state: what the brain sent, decoded and checked once
(`decode`), who owns each frontend (`owners`), the bounds on its work
(`limits`), counted skips of bad input (`skips`), and the tracker that turns
each change set into `ServicePortChanges` (`tracker`). Never imports the
transport that brought the ops (`watch`, `serve`) nor a dataplane."""
