"""The datapath's life: the BCC build in a child (`build`), pinning,
adopting and attaching it to the cgroup (`loader`), the one owner of a
datapath (`ownership`) and the capabilities it needs (`privileges`)."""
