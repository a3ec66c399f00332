"""kpng-py's own nftables table for packets from outside the node (node
ports, ExternalIPs, LoadBalancer IPs): its plan as values (`plan`), the
expressions (`expr`) and transactions (`txn`) it is written in, the table
itself (`table`), and the UDP conntrack entries flushed after a sync
(`conntrack`)."""
