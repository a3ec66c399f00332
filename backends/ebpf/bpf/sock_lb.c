/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kpng-py socket load balancer: services translated at the socket layer,
 * before any packet exists (cgroup v2 sock_addr hooks). A frontend is a
 * ClusterIP, ExternalIP or load-balancer IP at its port (an exact key), or a
 * node port at every node address (a wildcard key, see find_master).
 *
 *   connect4/6   TCP and connected UDP: VIP -> endpoint
 *   sendmsg4/6   unconnected UDP (sendto): VIP -> endpoint
 *   recvmsg4/6   unconnected UDP replies: endpoint -> VIP (recvfrom)
 *   getpeername4/6  endpoint -> VIP for the application
 *
 * The v6 hooks see IPv4 traffic of dual-stack AF_INET6 sockets as
 * ::ffff:a.b.c.d; maps store IPv4 v4-mapped, so both families share entries.
 * Design and update order: docs/ebpf.md. Map layouts: lb_maps.h.
 *
 * Compiled by BCC at run time (backends/ebpf/datapath/loader.py) with:
 *   KPNG_PIN_DIR        bpffs directory holding the pinned maps
 *   KPNG_MAPS_HEADER    the absolute path of lb_maps.h, as a string
 *   KPNG_SERVICES_MAX, KPNG_ENDPOINTS_MAX, KPNG_REVNAT_MAX, KPNG_AFFINITY_MAX,
 *   KPNG_NODE_ADDRESSES_MAX, KPNG_COUNTERS_MAX, KPNG_SERVICE_NAMES_MAX,
 *   KPNG_TRACE_CONFIG_MAX, KPNG_EVENTS_MAX (bytes)
 *   KPNG_ENDPOINT_COUNTERS   count per endpoint too (--endpoint-counters)
 *   KPNG_REJECT_WITH_EPERM  older kernels: no bpf_set_retval (before 5.18), and
 *                           trace events without the client's pid and command
 */
#include <uapi/linux/bpf.h>
#include <uapi/asm-generic/errno.h>

/* in.h's one constant here, by its value: in.h brings the socket headers,
 * which cost the build about 16 MiB of clang's memory. */
#define IPPROTO_UDP 17

/* By absolute path: BCC searches the working directory before any -I, so a
 * "lb_maps.h" there would be compiled instead, and in a bpffs directory the
 * lookup itself fails (bpffs refuses names with a dot). */
#ifndef KPNG_MAPS_HEADER
#error "KPNG_MAPS_HEADER must name lb_maps.h by its absolute path"
#endif
#include KPNG_MAPS_HEADER

#ifndef KPNG_PIN_DIR
#error "KPNG_PIN_DIR must name the bpffs directory of the pinned maps"
#endif

/* Control-plane owned, updated while programs read them: no prealloc, so an
 * updated element is freed after an RCU grace period and a program never reads
 * a recycled element. */
BPF_TABLE_PINNED("hash", struct lb_service_key, struct lb_service_value, kpng_services,
		 KPNG_SERVICES_MAX, KPNG_PIN_DIR "/services", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("hash", __u32, struct lb_endpoint, kpng_endpoints,
		 KPNG_ENDPOINTS_MAX, KPNG_PIN_DIR "/backends", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("hash", struct lb_node_address_key, struct lb_node_address_value,
		 kpng_node_addresses, KPNG_NODE_ADDRESSES_MAX, KPNG_PIN_DIR "/node_addresses",
		 BPF_F_NO_PREALLOC);
/* Declared always, so that the pins do not depend on the flag; only
 * counted into with KPNG_ENDPOINT_COUNTERS. */
BPF_TABLE_PINNED("percpu_hash", __u32, struct lb_endpoint_counters, kpng_endpoint_counters,
		 KPNG_ENDPOINT_COUNTERS_MAX, KPNG_PIN_DIR "/backend_counters", BPF_F_NO_PREALLOC);
/* Read by `ebpf trace` and `ebpf dump` only. */
BPF_TABLE_PINNED("hash", __u32, struct lb_service_name, kpng_service_names,
		 KPNG_SERVICE_NAMES_MAX, KPNG_PIN_DIR "/service_names", BPF_F_NO_PREALLOC);
/* Written by `ebpf trace` as it attaches and leaves. */
BPF_TABLE_PINNED("array", __u32, struct lb_trace_config, kpng_trace_config,
		 KPNG_TRACE_CONFIG_MAX, KPNG_PIN_DIR "/trace_config");

/* BCC pins tables but has no pinned ring buffer: this is BPF_RINGBUF_OUTPUT's
 * table with the pin in its section, as BPF_TABLE_PINNED writes it. */
#define KPNG_RINGBUF_PINNED(_name, _bytes, _pinned)				\
	struct _name##_table_t {						\
		int key;							\
		u32 leaf;							\
		int (*ringbuf_output)(void *, u64, u64);			\
		void *(*ringbuf_reserve)(u64);					\
		void (*ringbuf_discard)(void *, u64);				\
		void (*ringbuf_submit)(void *, u64);				\
		u32 max_entries;						\
	};									\
	__attribute__((section("maps/ringbuf:" _pinned)))			\
	struct _name##_table_t _name = { .max_entries = (_bytes) }
KPNG_RINGBUF_PINNED(kpng_events, KPNG_EVENTS_MAX, KPNG_PIN_DIR "/events");

/* Datapath owned, deleted by the control plane with their frontend; no
 * prealloc: per-CPU memory only for the services clients use. */
BPF_TABLE_PINNED("percpu_hash", __u32, struct lb_counters, kpng_counters,
		 KPNG_COUNTERS_MAX, KPNG_PIN_DIR "/counters", BPF_F_NO_PREALLOC);
/* Datapath owned and bounded by LRU eviction; readers re-validate entries. */
BPF_TABLE_PINNED("lru_hash", struct lb_revnat_key, struct lb_revnat_value, kpng_revnat,
		 KPNG_REVNAT_MAX, KPNG_PIN_DIR "/reverse_nat");
BPF_TABLE_PINNED("lru_hash", struct lb_affinity_key, struct lb_affinity_value, kpng_affinity,
		 KPNG_AFFINITY_MAX, KPNG_PIN_DIR "/affinity");

/* sock_addr return codes. */
#define SYSCALL_ALLOW 1
#define SYSCALL_DENY 0

#define LB_NSEC_PER_SEC 1000000000ULL

enum lb_verdict {
	LB_NOT_A_SERVICE,	/* leave the address alone */
	LB_TRANSLATED,		/* the address now names an endpoint */
	LB_NO_ENDPOINT,		/* a service without usable endpoints: reject */
};

static __always_inline __u32 v4_mapped_prefix(void)
{
	/* ::ffff:0:0/96, third word in network byte order */
	return __builtin_bswap32(0x0000ffff);
}

static __always_inline bool l4addr_is_v4(const struct lb_l4addr *a)
{
	return a->addr[0] == 0 && a->addr[1] == 0 && a->addr[2] == v4_mapped_prefix();
}

/* 0.0.0.0 (v4-mapped) or ::, the address of node-port keys. */
static __always_inline bool l4addr_is_wildcard(const struct lb_l4addr *a)
{
	return a->addr[3] == 0 && a->addr[0] == 0 && a->addr[1] == 0 &&
	       (a->addr[2] == 0 || a->addr[2] == v4_mapped_prefix());
}

static __always_inline bool l4addr_equal(const struct lb_l4addr *a, const struct lb_l4addr *b)
{
	return a->addr[0] == b->addr[0] && a->addr[1] == b->addr[1] &&
	       a->addr[2] == b->addr[2] && a->addr[3] == b->addr[3] && a->port == b->port;
}

/* This CPU's counters of a frontend, made at its first translation here or
 * anywhere (a full map leaves the frontend uncounted, never untranslated). */
static __always_inline struct lb_counters *counters_of(__u32 frontend_id)
{
	struct lb_counters *counters = kpng_counters.lookup(&frontend_id);
	struct lb_counters zero = {};

	if (counters)
		return counters;
	/* Another CPU may create it first: then ours fails, the lookup finds it. */
	kpng_counters.insert(&frontend_id, &zero);
	return kpng_counters.lookup(&frontend_id);
}

static __always_inline void count_translated(__u32 frontend_id)
{
	struct lb_counters *counters = counters_of(frontend_id);

	if (counters)
		counters->translated++;
}

static __always_inline void count_endpoint(__u32 endpoint_id)
{
#ifdef KPNG_ENDPOINT_COUNTERS
	struct lb_endpoint_counters *counters = kpng_endpoint_counters.lookup(&endpoint_id);
	struct lb_endpoint_counters zero = {};

	if (!counters) {
		kpng_endpoint_counters.insert(&endpoint_id, &zero);
		counters = kpng_endpoint_counters.lookup(&endpoint_id);
		if (!counters)
			return;
	}
	counters->translated++;
#endif
}

static __always_inline void count_rejected(__u32 frontend_id)
{
	struct lb_counters *counters = counters_of(frontend_id);

	if (counters)
		counters->rejected++;
}

/* While a trace is attached, the translation as an event; an event the
 * ring buffer has no room for is lost and counted (the tracer is behind),
 * never the connect. `endpoint` is NULL when refused. */
static __always_inline void trace_translation(__u8 hook, __u8 proto, __u8 verdict,
					      const struct lb_l4addr *vip, __u32 frontend_id,
					      const struct lb_endpoint *endpoint, __u32 endpoint_id)
{
	__u32 first = 0;
	struct lb_trace_config *config = kpng_trace_config.lookup(&first);
	struct lb_trace_event *event;

	if (!config || !config->tracer_pid)
		return;
	event = kpng_events.ringbuf_reserve(sizeof(*event));
	if (!event) {
		__sync_fetch_and_add(&config->lost, 1);
		return;
	}
	/* Reserved memory is not zeroed: every byte is written. */
	__builtin_memset(event, 0, sizeof(*event));
	event->ktime_ns = bpf_ktime_get_ns();
	event->cgroup_id = bpf_get_current_cgroup_id();
#ifndef KPNG_REJECT_WITH_EPERM
	event->pid = bpf_get_current_pid_tgid() >> 32;
	bpf_get_current_comm(event->comm, sizeof(event->comm));
#endif
	event->frontend_id = frontend_id;
	event->hook = hook;
	event->proto = proto;
	event->verdict = verdict;
	event->vip = *vip;
	if (endpoint) {
		event->endpoint_id = endpoint_id;
		event->endpoint = endpoint->addr;
	}
	/* No wakeup per event (it cost the connect several microseconds): the
	 * tracer reads the ring buffer on a timer. */
	kpng_events.ringbuf_submit(event, BPF_RB_NO_WAKEUP);
}

/* A connect() or sendto() to a service without endpoints fails at once, as
 * kube-proxy's REJECT does; the VIP never reaches the network. */
static __always_inline int reject(void)
{
#ifndef KPNG_REJECT_WITH_EPERM
	bpf_set_retval(-ECONNREFUSED);
#endif
	return SYSCALL_DENY;
}

/* An endpoint serves the frontend's affinity group: its own, or one of a sibling
 * frontend of the same service port and family (same endpoints). */
static __always_inline bool in_affinity_group(const struct lb_endpoint *endpoint,
					      const struct lb_service_value *svc)
{
	return endpoint->frontend_id == svc->id ||
	       (svc->affinity_group != 0 && endpoint->affinity_group == svc->affinity_group);
}

/* sessionAffinity: the endpoint this client used last, if it is recent enough
 * and still one of the affinity group's endpoints. */
static __always_inline const struct lb_endpoint *
affinity_endpoint(const struct lb_affinity_key *key, const struct lb_service_value *svc, __u64 now,
		  __u32 *endpoint_id_out)
{
	struct lb_affinity_value *seen = kpng_affinity.lookup((struct lb_affinity_key *)key);
	if (!seen)
		return NULL;
	if (now - seen->last_used_ns > (__u64)svc->affinity_timeout * LB_NSEC_PER_SEC)
		return NULL;
	__u32 endpoint_id = seen->endpoint_id;
	const struct lb_endpoint *endpoint = kpng_endpoints.lookup(&endpoint_id);
	/* Endpoint ids are per frontend: one that is gone or now belongs to
	 * another service port ends the affinity. */
	if (!endpoint || !in_affinity_group(endpoint, svc))
		return NULL;
	seen->last_used_ns = now;
	*endpoint_id_out = endpoint_id;
	return endpoint;
}

static __always_inline void remember_affinity(struct lb_affinity_key *key, __u32 endpoint_id,
					      __u64 now)
{
	struct lb_affinity_value value = { .last_used_ns = now, .endpoint_id = endpoint_id };
	kpng_affinity.update(key, &value);
}

/* Socket cookies count up per CPU, so a client that opens another socket
 * between two UDP sockets gets only every other cookie, and `cookie % count`
 * would send all its UDP sockets to half the endpoints. A multiplicative
 * (Fibonacci) hash spreads every bit of the cookie into the top 32. */
static __always_inline __u32 cookie_seed(__u64 cookie)
{
	return (__u32)((cookie * 0x9E3779B97F4A7C15ULL) >> 32);
}

/* The endpoint id in a random slot. UDP seeds with the socket cookie so that
 * an unconnected socket keeps talking to one endpoint; TCP draws per connect. */
static __always_inline bool slot_endpoint_id(struct lb_service_key *key, __u32 count, __u64 cookie,
					     __u32 *endpoint_id)
{
	__u32 seed = key->proto == IPPROTO_UDP ? cookie_seed(cookie) : bpf_get_prandom_u32();
	struct lb_service_value *slot;

	key->slot = (__u16)(seed % count) + 1;
	slot = kpng_services.lookup(key);
	if (!slot) {
		/* The service shrank between our reads of its master and of the
		 * slot; slot 1 exists whenever the service has an endpoint. */
		key->slot = 1;
		slot = kpng_services.lookup(key);
		if (!slot)
			return false;
	}
	*endpoint_id = slot->id;
	return true;
}

/*
 * The master entry of the frontend at key->vip (slot 0): the exact key, or,
 * when there is none and the address is a node address, the node-port key of
 * its family, which key->vip then holds (the slots are looked up with it).
 * Nobody dials the wildcard itself: a connect() to 0.0.0.0 or :: reaches the
 * host's own loopback, which is not a node-port address unless listed.
 */
static __always_inline struct lb_service_value *find_master(struct lb_service_key *key)
{
	struct lb_node_address_key node = {};
	struct lb_service_value *master;

	if (l4addr_is_wildcard(&key->vip))
		return NULL;
	master = kpng_services.lookup(key);
	if (master)
		return master;
#pragma unroll
	for (int i = 0; i < 4; i++)
		node.addr[i] = key->vip.addr[i];
	if (!kpng_node_addresses.lookup(&node))
		return NULL;
	if (!l4addr_is_v4(&key->vip)) {
		key->vip.addr[0] = 0;
		key->vip.addr[1] = 0;
		key->vip.addr[2] = 0;
	}
	key->vip.addr[3] = 0;
	return kpng_services.lookup(key);
}

/* Write the reverse-NAT entry only when it changed: sendmsg runs per
 * datagram. A new entry is a new socket at this endpoint: what is counted as
 * translated, so a UDP socket counts once per endpoint, not per datagram. */
static __always_inline bool remember_vip(__u64 cookie, const struct lb_l4addr *endpoint,
					 const struct lb_l4addr *vip, __u32 frontend_id)
{
	struct lb_revnat_key key = { .cookie = cookie, .endpoint = *endpoint };
	struct lb_revnat_value *known = kpng_revnat.lookup(&key);

	if (known && known->frontend_id == frontend_id && l4addr_equal(&known->vip, vip))
		return false;
	struct lb_revnat_value value = { .vip = *vip, .frontend_id = frontend_id };
	kpng_revnat.update(&key, &value);
	return true;
}

/* Forward direction: if dst is a service, replace it by one of its endpoints.
 * The reverse-NAT entry keeps dst as dialled (a node address, not the
 * wildcard), which is what recvmsg and getpeername give back. */
static __always_inline enum lb_verdict lb_translate(void *ctx, struct lb_l4addr *dst, __u32 proto,
						     __u8 hook)
{
	struct lb_service_key key = { .vip = *dst, .proto = (__u8)proto, .slot = 0 };
	struct lb_service_value *master = find_master(&key);
	struct lb_affinity_key affinity = {};
	const struct lb_endpoint *endpoint = NULL;
	struct lb_service_value svc;
	__u8 verdict = LB_TRACE_TRANSLATED;
	__u64 cookie, now = 0;
	__u32 endpoint_id = 0;

	if (!master)
		return LB_NOT_A_SERVICE;
	svc = *master;
	if (svc.count == 0) {
		count_rejected(svc.id);
		trace_translation(hook, proto, LB_TRACE_REFUSED, dst, svc.id, NULL, 0);
		return LB_NO_ENDPOINT;
	}
	cookie = bpf_get_socket_cookie(ctx);
	if (svc.flags & LB_SVC_F_AFFINITY) {
		affinity.netns_cookie = bpf_get_netns_cookie(ctx);
		affinity.affinity_group = svc.affinity_group ? svc.affinity_group : svc.id;
		now = bpf_ktime_get_ns();
		endpoint = affinity_endpoint(&affinity, &svc, now, &endpoint_id);
		verdict = LB_TRACE_AFFINITY;
	}
	if (!endpoint) {
		if (!slot_endpoint_id(&key, svc.count, cookie, &endpoint_id) ||
		    !(endpoint = kpng_endpoints.lookup(&endpoint_id))) {
			count_rejected(svc.id);
			trace_translation(hook, proto, LB_TRACE_REFUSED, dst, svc.id, NULL, 0);
			return LB_NO_ENDPOINT;
		}
		verdict = LB_TRACE_TRANSLATED;
		if (svc.flags & LB_SVC_F_AFFINITY)
			remember_affinity(&affinity, endpoint_id, now);
	}
	if (remember_vip(cookie, &endpoint->addr, dst, svc.id)) {
		count_translated(svc.id);
		count_endpoint(endpoint_id);
	}
	trace_translation(hook, proto, verdict, dst, svc.id, endpoint, endpoint_id);
	*dst = endpoint->addr;
	return LB_TRANSLATED;
}

/* Reverse direction: if this socket reached peer through a VIP that still
 * means the same service, show the VIP instead. For a node port the VIP is
 * the node address dialled, which must still be one (find_master). */
static __always_inline bool lb_reverse(void *ctx, struct lb_l4addr *peer, __u32 proto)
{
	struct lb_revnat_key key = { .cookie = bpf_get_socket_cookie(ctx), .endpoint = *peer };
	struct lb_revnat_value *rev = kpng_revnat.lookup(&key);
	struct lb_service_key master_key = {};
	struct lb_service_value *master;

	if (!rev)
		return false;
	master_key.vip = rev->vip;
	master_key.proto = (__u8)proto;
	master = find_master(&master_key);
	if (!master || master->id != rev->frontend_id) {
		kpng_revnat.delete(&key);
		return false;
	}
	*peer = rev->vip;
	return true;
}

/* -- the hooks ------------------------------------------------------------ */

/*
 * The address of a hook's context as an lb_l4addr: user_ip4 in the v4 hooks,
 * user_ip6 (possibly ::ffff:a.b.c.d) in the v6 ones. `v6` is a constant in
 * every hook, so each program only touches its own family's fields, which is
 * all the verifier allows.
 */
static __always_inline void load_user_addr(struct bpf_sock_addr *ctx, bool v6,
					   struct lb_l4addr *a)
{
	if (v6) {
#pragma unroll
		for (int i = 0; i < 4; i++)
			a->addr[i] = ctx->user_ip6[i];
	} else {
		a->addr[0] = 0;
		a->addr[1] = 0;
		a->addr[2] = v4_mapped_prefix();
		a->addr[3] = ctx->user_ip4;
	}
	a->port = (__u16)ctx->user_port;
	a->pad = 0;
}

static __always_inline void store_user_addr(struct bpf_sock_addr *ctx, bool v6,
					    const struct lb_l4addr *a)
{
	if (v6) {
#pragma unroll
		for (int i = 0; i < 4; i++)
			ctx->user_ip6[i] = a->addr[i];
	} else {
		ctx->user_ip4 = a->addr[3];
	}
	ctx->user_port = a->port;
}

/* connect and sendmsg: a VIP becomes one of its endpoints, or is refused. */
static __always_inline int forward(struct bpf_sock_addr *ctx, bool v6, __u8 hook)
{
	struct lb_l4addr dst;

	load_user_addr(ctx, v6, &dst);
	switch (lb_translate(ctx, &dst, ctx->protocol, hook)) {
	case LB_TRANSLATED:
		/* A v4 VIP only ever has v4 endpoints; anything else is a
		 * corrupt map, and must not reach the network as the VIP. */
		if (!v6 && !l4addr_is_v4(&dst))
			return reject();
		store_user_addr(ctx, v6, &dst);
		return SYSCALL_ALLOW;
	case LB_NO_ENDPOINT:
		return reject();
	default:
		return SYSCALL_ALLOW;
	}
}

/* recvmsg and getpeername: an endpoint the socket reached through a VIP is
 * shown as the VIP. */
static __always_inline int reverse(struct bpf_sock_addr *ctx, bool v6)
{
	struct lb_l4addr peer;

	load_user_addr(ctx, v6, &peer);
	if (lb_reverse(ctx, &peer, ctx->protocol))
		store_user_addr(ctx, v6, &peer);
	return SYSCALL_ALLOW;
}

int kpng_connect4(struct bpf_sock_addr *ctx) { return forward(ctx, false, LB_HOOK_CONNECT4); }
int kpng_connect6(struct bpf_sock_addr *ctx) { return forward(ctx, true, LB_HOOK_CONNECT6); }
int kpng_sendmsg4(struct bpf_sock_addr *ctx) { return forward(ctx, false, LB_HOOK_SENDMSG4); }
int kpng_sendmsg6(struct bpf_sock_addr *ctx) { return forward(ctx, true, LB_HOOK_SENDMSG6); }
int kpng_recvmsg4(struct bpf_sock_addr *ctx) { return reverse(ctx, false); }
int kpng_recvmsg6(struct bpf_sock_addr *ctx) { return reverse(ctx, true); }
int kpng_getpeer4(struct bpf_sock_addr *ctx) { return reverse(ctx, false); }
int kpng_getpeer6(struct bpf_sock_addr *ctx) { return reverse(ctx, true); }
