"""The map programmer: ServicePort changes -> writes to `services` and
`backends` in an order that leaves no gap (`service_programmer`), with what
each frontend is to hold (`frontends`), the id pools (`ids`), the slot
assignment (`slots`) and one change set's planned writes (`writes`)."""
