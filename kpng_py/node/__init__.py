"""The node itself: its addresses as netlink reports them (which answer on
node ports, kube-proxy's --nodeport-addresses) and work in another network
namespace."""
