/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Keys and values of every map the socket load balancer uses: the one place
 * their layout is defined. backends/ebpf/maps/layout.py mirrors each struct with
 * ctypes, and tests/ebpf/maps/test_layout.py compiles this header with the host's
 * gcc and compares sizes and offsets with the mirrors.
 *
 * Names: a frontend is what a client dials (VIP, port, protocol), with its
 * frontend id; an endpoint entry is one endpoint of one frontend, with its
 * endpoint id. The pins keep their historical names: `services` (whose
 * lb_service_* structs are named after it) holds the frontends, `backends`
 * the endpoint entries, `backend_counters` their counters (docs/ebpf.md,
 * "Names").
 *
 * Conventions:
 * - Addresses are 16 bytes, always. IPv4 is stored v4-mapped
 *   (::ffff:a.b.c.d), which is exactly what the v6 hooks see for IPv4 traffic
 *   on dual-stack AF_INET6 sockets, so both hook families look up the same
 *   entries. The words are in network byte order, as in bpf_sock_addr.
 * - Ports are in network byte order, as in bpf_sock_addr.user_port.
 * - Padding is explicit and always zero, because hash map keys are compared
 *   byte by byte.
 */
#ifndef KPNG_LB_MAPS_H
#define KPNG_LB_MAPS_H

#include <linux/types.h>

/* An address and port: a VIP, or an endpoint. 20 bytes. */
struct lb_l4addr {
	__u32 addr[4];		/* 0: network order, IPv4 v4-mapped */
	__u16 port;		/* 16: network order */
	__u16 pad;		/* 18 */
};
_Static_assert(sizeof(struct lb_l4addr) == 20, "lb_l4addr layout");

/*
 * services: one entry per frontend (VIP, port, protocol) and slot. Slot 0 is
 * the master entry of the frontend; slots 1..count name its endpoints.
 * Key: 24 bytes.
 */
struct lb_service_key {
	struct lb_l4addr vip;	/* 0 */
	__u8 proto;		/* 20: IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;		/* 21 */
	__u16 slot;		/* 22: host order; 0 = master */
};
_Static_assert(sizeof(struct lb_service_key) == 24, "lb_service_key layout");

/* Master entry flags. */
#define LB_SVC_F_AFFINITY 0x1	/* sessionAffinity ClientIP */
/*
 * The kind of frontend, at most one bit; none is a ClusterIP. The programs
 * never read them (every kind translates alike): they let `ebpf dump` tell an
 * ExternalIP or load-balancer IP from a ClusterIP, which the key cannot.
 */
#define LB_SVC_F_EXTERNAL_IP 0x2
#define LB_SVC_F_LOAD_BALANCER_IP 0x4
#define LB_SVC_F_NODE_PORT 0x8	/* key address ::ffff:0.0.0.0 or ::, see below */

/*
 * Value of both kinds of services entries. Value: 20 bytes.
 * master (slot 0): id = frontend id, count = endpoint slots (0: reject),
 *                  affinity timeout, flags and affinity group;
 * slot 1..count:   id = endpoint id, the rest zero.
 *
 * sessionAffinity belongs to the service port, not to one frontend: a client
 * sent to an endpoint through the ClusterIP stays with it through the node
 * port or an LB IP of the same port, as kube-proxy keeps it. The frontends
 * of one family of a port with affinity share a group, the frontend id of
 * the first of them; the affinity entry is keyed by the group, and an endpoint
 * of any frontend of the group may serve it (they have the same endpoints).
 */
struct lb_service_value {
	__u32 id;		/* 0 */
	__u32 count;		/* 4 */
	__u32 affinity_timeout;	/* 8: seconds; used with LB_SVC_F_AFFINITY */
	__u32 flags;		/* 12: LB_SVC_F_* */
	__u32 affinity_group;	/* 16: with LB_SVC_F_AFFINITY; 0 otherwise */
};
_Static_assert(sizeof(struct lb_service_value) == 20, "lb_service_value layout");

/*
 * A node port is programmed once per family, as the frontend (wildcard, node
 * port, protocol), the wildcard being ::ffff:0.0.0.0 for IPv4 and :: for
 * IPv6. A program whose exact lookup misses looks the wildcard up when the
 * dialled address is in node_addresses.
 *
 * node_addresses: the node addresses that answer on node ports
 * (--nodeport-addresses applied to the node's local addresses), written by
 * the control plane as they change. Key: 16 bytes, the address as in
 * lb_l4addr. Value: 4 bytes.
 */
struct lb_node_address_key {
	__u32 addr[4];		/* 0: network order, IPv4 v4-mapped */
};
_Static_assert(sizeof(struct lb_node_address_key) == 16, "lb_node_address_key layout");

struct lb_node_address_value {
	__u32 flags;		/* 0: none defined yet; written as 0 */
};
_Static_assert(sizeof(struct lb_node_address_value) == 4, "lb_node_address_value layout");

/*
 * backends (pinned under its historical name): endpoint id -> address. Every
 * (frontend, endpoint) pair has its own endpoint id, so two frontends sharing
 * an endpoint never share an entry, and a program can check that an endpoint
 * id still belongs to a frontend, or to the affinity group of one. Key: __u32
 * endpoint id. Value: 28 bytes.
 */
struct lb_endpoint {
	struct lb_l4addr addr;	/* 0 */
	__u32 frontend_id;	/* 20: the frontend whose slots name this endpoint */
	__u32 affinity_group;	/* 24: that frontend's, as in its master */
};
_Static_assert(sizeof(struct lb_endpoint) == 28, "lb_endpoint layout");

/*
 * reverse_nat (LRU): which VIP a socket meant when it reached an endpoint. Keyed
 * by socket cookie and endpoint, written at connect and sendmsg; read by
 * recvmsg (source of UDP replies) and getpeername. Key: 32 bytes.
 */
struct lb_revnat_key {
	__u64 cookie;		/* 0: bpf_get_socket_cookie() */
	struct lb_l4addr endpoint; /* 8 */
	__u32 pad;		/* 28 */
};
_Static_assert(sizeof(struct lb_revnat_key) == 32, "lb_revnat_key layout");

/* Value: 24 bytes. frontend_id lets readers check the VIP still means the same
 * frontend (a deleted and re-created frontend gets a new id). */
struct lb_revnat_value {
	struct lb_l4addr vip;	/* 0 */
	__u32 frontend_id;	/* 20 */
};
_Static_assert(sizeof(struct lb_revnat_value) == 24, "lb_revnat_value layout");

/*
 * affinity (LRU): sessionAffinity ClientIP. The client is identified by its
 * network namespace cookie: a sock_addr program runs before the socket has a
 * source address, and a pod is a network namespace. Key: 16 bytes.
 */
struct lb_affinity_key {
	__u64 netns_cookie;	/* 0: bpf_get_netns_cookie() */
	__u32 affinity_group;	/* 8: the master's */
	__u32 pad;		/* 12 */
};
_Static_assert(sizeof(struct lb_affinity_key) == 16, "lb_affinity_key layout");

/* Value: 16 bytes. */
struct lb_affinity_value {
	__u64 last_used_ns;	/* 0: bpf_ktime_get_ns() */
	__u32 endpoint_id;	/* 8 */
	__u32 pad;		/* 12 */
};
_Static_assert(sizeof(struct lb_affinity_value) == 16, "lb_affinity_value layout");

/*
 * counters (per-CPU hash): what each frontend's translations did, by frontend
 * id, for metrics and `ebpf dump`. A program creates its frontend's entry at
 * the first translation, so a node pays only for the frontends its clients
 * use; the control plane deletes it with the frontend. Per CPU, so a busy
 * frontend never bounces one cache line between CPUs; readers add the CPUs.
 * Key: __u32 frontend id. Value: 16 bytes per CPU.
 */
struct lb_counters {
	__u64 translated;	/* 0: sockets sent to an endpoint (TCP connects, UDP socket-endpoint pairs) */
	__u64 rejected;		/* 8: connects and sends refused: no endpoints */
};
_Static_assert(sizeof(struct lb_counters) == 16, "lb_counters layout");

/*
 * backend_counters (pinned under its historical name; per-CPU hash, only
 * with --endpoint-counters): sockets
 * sent to each endpoint, as `counters` does per frontend. Its cardinality is
 * the node's endpoints, so it is off unless asked for. Key: __u32 endpoint
 * id. Value: 8 bytes per CPU.
 */
struct lb_endpoint_counters {
	__u64 translated;	/* 0 */
};
_Static_assert(sizeof(struct lb_endpoint_counters) == 8, "lb_endpoint_counters layout");

/*
 * service_names: the service port each frontend id belongs to, as
 * kube-proxy names it ("namespace/name:port", NUL-terminated), written by the
 * control plane with the frontend for `ebpf trace` and `ebpf dump`; the
 * programs never read it. Key: __u32 frontend id. Value: 160 bytes (a
 * namespace and a name are at most 63 bytes, a port name 15).
 */
struct lb_service_name {
	char name[160];		/* 0 */
};
_Static_assert(sizeof(struct lb_service_name) == 160, "lb_service_name layout");

/*
 * trace_config (array of one): whether a `kpng-py ebpf trace` is attached.
 * Events cost a ring buffer reservation each, so the programs emit none
 * while nobody reads them; those the ring buffer has no room for (the
 * tracer fell behind) are counted, so that the tracer can say so. Value:
 * 8 bytes.
 */
struct lb_trace_config {
	__u32 tracer_pid;	/* 0: the tracing process; 0 = no trace, no events */
	__u32 lost;		/* 4: events not emitted for want of room, since then */
};
_Static_assert(sizeof(struct lb_trace_config) == 8, "lb_trace_config layout");

/* The hook of an event. */
#define LB_HOOK_CONNECT4 1
#define LB_HOOK_CONNECT6 2
#define LB_HOOK_SENDMSG4 3
#define LB_HOOK_SENDMSG6 4

/* What a translation did. */
#define LB_TRACE_TRANSLATED 1	/* to an endpoint drawn from the slots */
#define LB_TRACE_AFFINITY 2	/* to the client's sessionAffinity endpoint */
#define LB_TRACE_REFUSED 3	/* no endpoints: the connect or send failed */

/* events (ring buffer): one per translation while a trace is attached, in
 * the order the CPUs reserved them. 88 bytes. */
struct lb_trace_event {
	__u64 ktime_ns;		/* 0: bpf_ktime_get_ns() */
	__u64 cgroup_id;	/* 8: the client's cgroup v2 id */
	__u32 pid;		/* 16: the client process (thread group id) */
	__u32 frontend_id;	/* 20 */
	__u32 endpoint_id;	/* 24: 0 when refused */
	__u8 hook;		/* 28: LB_HOOK_* */
	__u8 proto;		/* 29: IPPROTO_TCP or IPPROTO_UDP */
	__u8 verdict;		/* 30: LB_TRACE_* */
	__u8 pad;		/* 31 */
	struct lb_l4addr vip;	/* 32: as dialled (for a node port, the node address) */
	struct lb_l4addr endpoint; /* 52: zero when refused */
	char comm[16];		/* 72: the client's command name */
};
_Static_assert(sizeof(struct lb_trace_event) == 88, "lb_trace_event layout");

#endif /* KPNG_LB_MAPS_H */
